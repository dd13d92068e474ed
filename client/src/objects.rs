//! Block versions held as objects of an object store (Ceph RADOS, through
//! the `ftbag-rados` crate), which the node and its slaves reach
//! themselves.
//!
//! The store node keeps everything transactional (locks, the queue, the
//! pointer from each block to its current version); a version's bytes are
//! one immutable object named by the version's id. A slave reads and
//! writes those objects directly, so block payloads stop crossing the
//! node's link: it asks the node for the version its lock lets it see
//! ([`crate::dataplane::wire::Op::ObjectGet`]), reads the object and
//! checks its checksum; it writes a new version under a fresh id and then
//! hands the node the id ([`crate::dataplane::wire::Op::ObjectPut`]),
//! which the node checks and makes the action's tentative state.
//!
//! This crate knows no librados: the node and the slaves are given an
//! [`ObjectsConnector`] by their binaries.

use std::fmt;
use std::sync::Arc;

use uuid::Uuid;

use crate::StoreError;

/// One store's block versions in a pool of an object store, under a prefix
/// of that store's own.
pub trait BlockObjects: Send + Sync + fmt::Debug {
    /// The pool, as the node names it to its clients.
    fn pool(&self) -> &str;

    /// Writes a version (the stored form: header, then payload) as one new
    /// object. Durable when it returns.
    fn put(&self, version: Uuid, header: &[u8], payload: &[u8]) -> Result<(), StoreError>;

    /// Fills `buf` from the version's object at `offset`.
    fn read_into(&self, version: Uuid, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// The version's object's size; `None` if there is none.
    fn size(&self, version: Uuid) -> Result<Option<u64>, StoreError>;

    /// Deletes versions' objects (those that exist).
    fn remove(&self, versions: &[Uuid]) -> Result<(), StoreError>;

    /// Every version that has an object under the prefix.
    fn versions(&self) -> Result<Vec<Uuid>, StoreError>;
}

/// Opens the versions of `(pool, prefix)`: how a node reaches its own and
/// a client the node's, as the node names them.
#[derive(Clone)]
pub struct ObjectsConnector(pub Arc<OpenObjects>);

/// What an [`ObjectsConnector`] calls with the pool and the prefix.
pub type OpenObjects = dyn Fn(&str, &str) -> Result<Arc<dyn BlockObjects>, StoreError> + Send + Sync;

impl ObjectsConnector {
    pub fn open(&self, pool: &str, prefix: &str) -> Result<Arc<dyn BlockObjects>, StoreError> {
        (self.0)(pool, prefix)
    }
}

impl fmt::Debug for ObjectsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ObjectsConnector")
    }
}

/// Reads a version's stored form whole, checked: the header's shape must
/// be `rows`×`cols` when given, and the payload must match its checksum.
/// The payload is read straight into the returned values.
pub fn read_block(
    objects: &dyn BlockObjects,
    version: Uuid,
    shape: Option<(u32, u32)>,
    what: &dyn Fn() -> String,
) -> Result<crate::BlockData, StoreError> {
    use crate::block::{self, HEADER_LEN};
    let mut head = [0u8; HEADER_LEN];
    objects.read_into(version, 0, &mut head)?;
    let header = block::decode_header(&head)
        .ok_or_else(|| StoreError::Corrupt { what: format!("{}: object of version {version}: {}", what(), block::bad_header(&head)) })?;
    if shape.is_some_and(|s| s != (header.rows, header.cols)) {
        let (rows, cols) = shape.unwrap_or_default();
        return Err(StoreError::Corrupt {
            what: format!("{}: object of version {version} holds {}x{}, the block is {rows}x{cols}", what(), header.rows, header.cols),
        });
    }
    let mut data = vec![0f64; header.rows as usize * header.cols as usize];
    objects.read_into(version, HEADER_LEN as u64, bytemuck::cast_slice_mut(&mut data))?;
    if !block::checksum_matches(&header, bytemuck::cast_slice(&data)) {
        return Err(StoreError::Corrupt { what: format!("{}: object of version {version}: payload does not match its checksum", what()) });
    }
    Ok(crate::BlockData { rows: header.rows as usize, cols: header.cols as usize, data })
}
