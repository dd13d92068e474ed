//! Block versions as RADOS objects: the store node's `files.rs` for a pool.
//!
//! A version is written once, whole, under a name no pointer holds yet
//! (`<prefix><version id>`), and never changed while a pointer names it;
//! a commit flips the pointer in the node's RocksDB. What makes this crash
//! safe is the same as for version files: an object that no pointer (and
//! no undo record) names is garbage, whenever it was written, so the node
//! sweeps the pool's objects under its prefix against its pointers at open
//! ([`VersionObjects::sweep`]) and deletes a replaced or aborted version's
//! object once its commit or abort is durable.

use std::collections::HashSet;

use store_client::block;
use uuid::Uuid;

use crate::cluster::Pool;
use crate::error::RadosError;

/// What a sweep found among the objects under the prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Named by the store: left.
    pub kept: usize,
    /// Named by nothing: removed.
    pub removed: usize,
}

/// One store's block versions in a pool, under a prefix of their own (a
/// pool may be shared: objects outside the prefix are never touched).
#[derive(Debug)]
pub struct VersionObjects {
    pool: Pool,
    prefix: String,
}

impl VersionObjects {
    pub fn new(pool: Pool, prefix: impl Into<String>) -> VersionObjects {
        VersionObjects { pool, prefix: prefix.into() }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn object_name(&self, version: Uuid) -> String {
        format!("{}{}", self.prefix, version.as_hyphenated())
    }

    fn corrupt(&self, version: Uuid, why: String) -> RadosError {
        RadosError::Corrupt { pool: self.pool.name().into(), object: self.object_name(version), why }
    }

    /// Checks a stored block (header, length, checksum) as every reader
    /// does: checksums stay end to end whichever backend holds the bytes.
    fn check(&self, version: Uuid, value: &[u8]) -> Result<(), RadosError> {
        let header = block::decode_header(value).ok_or_else(|| self.corrupt(version, block::bad_header(value).into()))?;
        let payload = &value[block::HEADER_LEN..];
        if payload.len() != header.payload_len() {
            return Err(self.corrupt(
                version,
                format!("payload of {} bytes, {}×{} needs {}", payload.len(), header.rows, header.cols, header.payload_len()),
            ));
        }
        if !block::checksum_matches(&header, payload) {
            return Err(self.corrupt(version, "payload does not match its checksum".into()));
        }
        Ok(())
    }

    /// Writes a version (header and payload, the block format), after
    /// checking it: a damaged block is refused before it is stored.
    pub fn put(&self, version: Uuid, value: &[u8]) -> Result<(), RadosError> {
        self.check(version, value)?;
        self.pool.write_full(&self.object_name(version), value)
    }

    /// Writes a version given as its header and its payload, after checking
    /// them as [`VersionObjects::put`] does, without joining them in memory.
    pub fn put_parts(&self, version: Uuid, header: &[u8], payload: &[u8]) -> Result<(), RadosError> {
        let parsed = block::decode_header(header).ok_or_else(|| self.corrupt(version, block::bad_header(header).into()))?;
        if header.len() != block::HEADER_LEN || payload.len() != parsed.payload_len() {
            return Err(
                self.corrupt(version, format!("{} + {} bytes for a {}×{} block", header.len(), payload.len(), parsed.rows, parsed.cols))
            );
        }
        if !block::checksum_matches(&parsed, payload) {
            return Err(self.corrupt(version, "payload does not match its checksum".into()));
        }
        self.pool.write_parts(&self.object_name(version), &[header, payload])
    }

    /// Reads a version whole and checks it.
    pub fn get(&self, version: Uuid) -> Result<Vec<u8>, RadosError> {
        let value = self.pool.read(&self.object_name(version))?;
        self.check(version, &value)?;
        Ok(value)
    }

    /// Deletes versions' objects; returns how many existed.
    pub fn delete(&self, versions: &[Uuid]) -> Result<usize, RadosError> {
        let mut n = 0;
        for &v in versions {
            n += usize::from(self.pool.remove(&self.object_name(v))?);
        }
        Ok(n)
    }

    /// The versions stored under the prefix.
    pub fn versions(&self) -> Result<Vec<Uuid>, RadosError> {
        Ok(self.pool.list()?.iter().filter_map(|name| name.strip_prefix(&self.prefix)).filter_map(|id| Uuid::parse_str(id).ok()).collect())
    }

    /// Removes every version under the prefix that `keep` does not name:
    /// what a crash between a version's write and its commit (or between a
    /// commit and the delete of what it replaced) left behind.
    pub fn sweep(&self, keep: &HashSet<Uuid>) -> Result<Swept, RadosError> {
        let mut swept = Swept::default();
        for v in self.versions()? {
            if keep.contains(&v) {
                swept.kept += 1;
            } else {
                swept.removed += usize::from(self.pool.remove(&self.object_name(v))?);
            }
        }
        Ok(swept)
    }
}
