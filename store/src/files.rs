//! Block versions as files: `<data>/blocks/<version>` holds one version's
//! stored form (header, then payload), written once and never changed.
//!
//! Why not RocksDB values (BlobDB, as before): a block put there is written
//! twice (WAL, then the blob file at flush) and copied three times (WAL,
//! memtable, flush), and a get copies it out of RocksDB's buffers again.
//! A file per version is written once, synced once, and read with one
//! `read`. RocksDB keeps what needs its atomic batches: the pointer
//! `"B" matrix i j → version` that a commit switches.
//!
//! Durability: [`BlockFiles::write`] syncs the file's data before the put
//! is answered, and the committer syncs this directory before a commit
//! batch that points at new files ([`BlockFiles::sync_dir`]), so a
//! committed pointer never names a file that a crash could lose. Files no
//! committed pointer names (staged by actions that never committed, or
//! replaced versions whose unlink a crash interrupted) are removed at open
//! ([`BlockFiles::sweep`]).

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use store_client::block::{self, BlockHeader, HEADER_LEN};
use store_client::StoreError;
use uuid::Uuid;

pub(crate) struct BlockFiles {
    dir: PathBuf,
}

/// An I/O error as the store's typed error: a full disk is `StorageFull`.
pub(crate) fn io_error(e: std::io::Error, what: impl FnOnce() -> String) -> StoreError {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    match e.raw_os_error() {
        Some(ENOSPC | EDQUOT) => StoreError::StorageFull { what: format!("{}: {e}", what()) },
        _ => StoreError::Storage { what: format!("{}: {e}", what()) },
    }
}

impl BlockFiles {
    pub(crate) fn open(data: &Path) -> std::io::Result<BlockFiles> {
        let dir = data.join("blocks");
        std::fs::create_dir_all(&dir)?;
        Ok(BlockFiles { dir })
    }

    fn path(&self, version: Uuid) -> PathBuf {
        self.dir.join(version.simple().to_string())
    }

    /// Writes a new version and syncs its data. A failed write leaves no
    /// file behind.
    pub(crate) fn write(&self, version: Uuid, value: &[u8]) -> Result<(), StoreError> {
        let path = self.path(version);
        let what = || format!("writing block version {version}");
        // Never over another version's file (ids are fresh; this is a guard).
        let mut f = File::create_new(&path).map_err(|e| io_error(e, what))?;
        f.write_all(value).and_then(|()| f.sync_data()).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            io_error(e, what)
        })
    }

    /// Reads a version's stored form; `None` if there is no such file.
    pub(crate) fn read(&self, version: Uuid) -> Result<Option<Vec<u8>>, StoreError> {
        let what = || format!("reading block version {version}");
        let mut f = match File::open(self.path(version)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(e, what)),
        };
        let len = f.metadata().map_err(|e| io_error(e, what))?.len() as usize;
        // One allocation of the exact size, not zeroed: read_to_end fills
        // spare capacity.
        let mut value = Vec::with_capacity(len);
        f.read_to_end(&mut value).map_err(|e| io_error(e, what))?;
        Ok(Some(value))
    }

    /// Opens a version for reading by someone else (its descriptor is
    /// passed on); checks its header and that the file is as long as the
    /// header says. `None` if there is no such file.
    pub(crate) fn open_version(&self, version: Uuid, what: &dyn Fn() -> String) -> Result<Option<(BlockHeader, File)>, StoreError> {
        use std::os::unix::fs::FileExt;
        let f = match File::open(self.path(version)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(e, what)),
        };
        let corrupt = |why: &str| StoreError::Corrupt { what: format!("{}: {why}", what()) };
        let mut head = [0u8; HEADER_LEN];
        f.read_exact_at(&mut head, 0).map_err(|_| corrupt("bad block header"))?;
        let header = block::decode_header(&head).ok_or_else(|| corrupt("bad block header"))?;
        let len = f.metadata().map_err(|e| io_error(e, what))?.len();
        if len != (HEADER_LEN + header.payload_len()) as u64 {
            return Err(corrupt("payload length does not match the header"));
        }
        Ok(Some((header, f)))
    }

    /// Removes versions (aborted, replaced or deleted); missing ones are
    /// fine (a sweep or an earlier removal got them).
    pub(crate) fn remove(&self, versions: &[Uuid]) {
        for v in versions {
            if let Err(e) = std::fs::remove_file(self.path(*v)) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove block version {v}: {e} (the next open sweeps it)");
                }
            }
        }
    }

    /// Makes the directory entries of files written so far durable.
    pub(crate) fn sync_dir(&self) -> Result<(), StoreError> {
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| io_error(e, || "syncing the blocks directory".into()))
    }

    /// Removes every file whose version is not in `keep`; returns how many.
    pub(crate) fn sweep(&self, keep: &HashSet<Uuid>) -> std::io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let kept = name.to_str().and_then(|n| Uuid::try_parse(n).ok()).is_some_and(|v| keep.contains(&v));
            if !kept {
                std::fs::remove_file(entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Test hook: flips one payload byte of a version in place.
    pub(crate) fn corrupt(&self, version: Uuid, at: usize) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        let what = || format!("corrupting block version {version}");
        let f = std::fs::OpenOptions::new().read(true).write(true).open(self.path(version)).map_err(|e| io_error(e, what))?;
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, at as u64).map_err(|e| io_error(e, what))?;
        byte[0] ^= 0x5a;
        f.write_all_at(&byte, at as u64).and_then(|_| f.sync_data()).map_err(|e| io_error(e, what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_versions_read_back_and_a_sweep_keeps_only_the_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = BlockFiles::open(dir.path()).unwrap();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        files.write(a, b"alpha").unwrap();
        files.write(b, b"beta").unwrap();
        assert!(matches!(files.write(a, b"again"), Err(StoreError::Storage { .. })), "a version is written once");
        files.sync_dir().unwrap();
        assert_eq!(files.read(a).unwrap().as_deref(), Some(&b"alpha"[..]));
        std::fs::write(files.dir.join("stray"), b"x").unwrap();
        assert_eq!(files.sweep(&HashSet::from([a])).unwrap(), 2);
        assert_eq!(files.read(b).unwrap(), None);
        assert_eq!(files.read(a).unwrap().as_deref(), Some(&b"alpha"[..]));
        files.corrupt(a, 1).unwrap();
        assert_eq!(files.read(a).unwrap().as_deref(), Some(&b"a\x36pha"[..]));
        files.remove(&[a, b]);
        assert_eq!(files.read(a).unwrap(), None);
    }
}
