//! The node's disk: the one seam every write the node makes goes through.
//!
//! A block version's bytes, its syncs and truncations, the creation of
//! its file and the blocks directory's syncs, and every RocksDB batch
//! (commits, undos, queue changes, recovery) are calls on a [`Disk`].
//! Production uses [`RealDisk`], the system calls themselves. Tests put a
//! [`FaultyDisk`] in [`crate::NodeConfig::disk`]: it fails the k-th of
//! those calls with EIO or ENOSPC, or tears it (a prefix of a write
//! lands; a batch lands but its answer is lost), and can then play a dead
//! disk and a power cut (the bytes written since their file's last sync
//! are lost), as redb's and RocksDB's fault-injecting file systems do.
//!
//! Outside the seam: reads (a failing read is answered as an error and
//! changes nothing), the removal of version files (one that fails leaves
//! a file the next open sweeps), RocksDB's own background work (flushes
//! and compactions: RocksDB checks and retries those itself), the payload
//! a local client splices into a version's file (covered by the header
//! written after it and by the sync), and backups, which write elsewhere.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use rocksdb::{WriteBatch, WriteOptions, DB};
use store_client::StoreError;

mod faulty;
pub use faulty::{After, FaultKind, FaultyDisk, Op};

/// What the node asks of its disk. Each method is the call it names,
/// with its errors; an implementation may fail any of them.
pub trait Disk: Send + Sync + fmt::Debug {
    /// Writes all of `bytes` at `offset`.
    fn write_at(&self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: the file's data (and its length) are durable.
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// `fsync` of a directory: its entries are durable.
    fn sync_dir(&self, dir: &File) -> io::Result<()>;
    /// Cuts or extends the file to `len` bytes.
    fn set_len(&self, file: &File, len: u64) -> io::Result<()>;
    /// Creates a file that must not exist, open for reading and writing.
    fn create_new(&self, path: &Path) -> io::Result<File>;
    /// Writes a RocksDB batch, synced to the disk if `sync`.
    fn write_batch(&self, db: &DB, batch: WriteBatch, sync: bool) -> Result<(), StoreError>;
}

/// The disk itself: each method is its system call (or RocksDB's write).
#[derive(Debug, Default)]
pub struct RealDisk;

impl Disk for RealDisk {
    fn write_at(&self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_dir(&self, dir: &File) -> io::Result<()> {
        dir.sync_all()
    }

    fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    fn create_new(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).create_new(true).open(path)
    }

    fn write_batch(&self, db: &DB, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        let mut options = WriteOptions::default();
        options.set_sync(sync);
        db.write_opt(batch, &options).map_err(crate::db::storage_error)
    }
}
