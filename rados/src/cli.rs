//! The flags with which a binary reaches a Ceph cluster; they parse in
//! every build, and a build without the `rados` feature says so when they
//! are used.

use std::path::PathBuf;

use store_client::objects::ObjectsConnector;
use store_client::StoreError;

#[derive(clap::Args, Clone, Debug)]
pub struct CephArgs {
    /// ceph.conf of the Ceph cluster that holds the blocks (it names the
    /// monitors and, usually, the keyring).
    #[arg(long, env = "CEPH_CONF", value_name = "FILE")]
    pub ceph_conf: Option<PathBuf>,
    /// The Ceph client's name, without `client.`.
    #[arg(long, default_value = "admin", value_name = "NAME")]
    pub ceph_user: String,
    /// A keyring to use instead of the one ceph.conf names.
    #[arg(long, value_name = "FILE")]
    pub ceph_keyring: Option<PathBuf>,
    /// Seconds to wait for the cluster to connect and for each of its
    /// operations before failing (librados would wait for ever).
    #[arg(long, default_value_t = 20, value_name = "SECONDS")]
    pub ceph_timeout_s: u64,
}

impl CephArgs {
    /// What opens pools of the cluster, or `None` without `--ceph-conf`.
    pub fn connector(&self) -> Result<Option<ObjectsConnector>, StoreError> {
        let Some(conf) = &self.ceph_conf else { return Ok(None) };
        self.connect(conf)
    }

    #[cfg(feature = "rados")]
    fn connect(&self, conf: &std::path::Path) -> Result<Option<ObjectsConnector>, StoreError> {
        let mut options = crate::ClusterOptions::new(conf);
        options.user = self.ceph_user.clone();
        options.keyring = self.ceph_keyring.clone();
        options.timeout = std::time::Duration::from_secs(self.ceph_timeout_s.max(1));
        Ok(Some(crate::connector(options)))
    }

    #[cfg(not(feature = "rados"))]
    fn connect(&self, conf: &std::path::Path) -> Result<Option<ObjectsConnector>, StoreError> {
        Err(StoreError::InvalidArgument {
            what: format!(
                "--ceph-conf {}: this build has no Ceph support; build it with `--features rados` (scripts/setup.sh installs librados-dev)",
                conf.display()
            ),
        })
    }
}
