//! The store's [`BlockObjects`] on a pool: what `master serve --blocks
//! rados` gives its node and `slave --ceph-conf` its client.

use std::sync::{Arc, Mutex};

use store_client::objects::{BlockObjects, ObjectsConnector};
use store_client::StoreError;
use uuid::Uuid;

use crate::cluster::{Cluster, ClusterOptions};
use crate::error::RadosError;
use crate::versions::VersionObjects;

/// The store's error for the cluster's: what a user does about it decides
/// the kind (a full cluster is `StorageFull`, a refused key
/// `Unauthenticated`). Unreachable OSDs or monitors are `Storage`, not a
/// retryable outage: a job whose blocks cannot be read must fail visibly
/// rather than retry for ever.
pub fn store_error(e: RadosError) -> StoreError {
    let what = e.to_string();
    match e {
        RadosError::NotFound { .. } => StoreError::NotFound { what },
        RadosError::Full { .. } => StoreError::StorageFull { what },
        RadosError::Corrupt { .. } => StoreError::Corrupt { what },
        RadosError::Auth { .. } => StoreError::Unauthenticated { what },
        RadosError::Config { .. } | RadosError::Option { .. } | RadosError::NoPool { .. } | RadosError::Name(_) => {
            StoreError::InvalidArgument { what }
        }
        RadosError::Unreachable { .. } | RadosError::Timeout { .. } | RadosError::Connect { .. } | RadosError::Io { .. } => {
            StoreError::Storage { what }
        }
    }
}

impl BlockObjects for VersionObjects {
    fn pool(&self) -> &str {
        VersionObjects::pool(self).name()
    }

    fn put(&self, version: Uuid, header: &[u8], payload: &[u8]) -> Result<(), StoreError> {
        self.put_parts(version, header, payload).map_err(store_error)
    }

    fn read_into(&self, version: Uuid, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        VersionObjects::pool(self).read_at(&self.object_name(version), offset, buf).map_err(store_error)
    }

    fn size(&self, version: Uuid) -> Result<Option<u64>, StoreError> {
        VersionObjects::pool(self).size(&self.object_name(version)).map_err(store_error)
    }

    fn remove(&self, versions: &[Uuid]) -> Result<(), StoreError> {
        self.delete(versions).map(|_| ()).map_err(store_error)
    }

    fn versions(&self) -> Result<Vec<Uuid>, StoreError> {
        VersionObjects::versions(self).map_err(store_error)
    }
}

/// Opens pools of the cluster `options` names, connecting once, at the
/// first pool asked for.
pub fn connector(options: ClusterOptions) -> ObjectsConnector {
    let cluster: Mutex<Option<Arc<Cluster>>> = Mutex::new(None);
    ObjectsConnector(Arc::new(move |pool: &str, prefix: &str| {
        let mut held = cluster.lock().unwrap_or_else(|e| e.into_inner());
        let c = match &*held {
            Some(c) => c.clone(),
            None => {
                let c = Cluster::connect(options.clone()).map_err(store_error)?;
                *held = Some(c.clone());
                c
            }
        };
        let pool = c.pool(pool).map_err(store_error)?;
        Ok(Arc::new(VersionObjects::new(pool, prefix)) as Arc<dyn BlockObjects>)
    }))
}
