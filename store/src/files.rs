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
//! is answered, and a version's directory entry is durable before a commit
//! batch points at it, so a committed pointer never names a file that a
//! crash could lose. Files no committed pointer names (staged by actions
//! that never committed, replaced versions whose unlink a crash
//! interrupted, spares) are removed at open ([`BlockFiles::sweep`]).
//!
//! Spares: creating a file and syncing the directory cost a put and its
//! commit about 0.3 ms of a 2 ms put of a 512 KiB block (two metadata
//! round trips to the disk; `perf trace` of `bench blocks`). So empty
//! files are made ahead, [`SPARES`] at a time with one directory sync
//! ([`BlockFiles::refill`], on a thread of its own: a create costs 0.2 ms
//! here, and a refill on the committer held up the next commit), and a
//! put writes into one of them: its version id is the spare's name. Only a
//! version made when no spare was left needs the directory synced before
//! its commit ([`BlockFiles::sync_dir_if_needed`]).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use store_client::block::{self, BlockHeader, HEADER_LEN};
use store_client::StoreError;
use uuid::Uuid;

/// Spares made at a time; a refill starts when fewer than half are left.
pub(crate) const SPARES: usize = 64;

pub(crate) struct BlockFiles {
    dir: PathBuf,
    /// The directory itself, kept open for its syncs.
    dir_file: File,
    /// Empty files whose directory entries are durable, named by fresh
    /// version ids; each is handed to one put.
    spares: Mutex<Vec<Uuid>>,
    /// A version file was created outside the spares since the last
    /// directory sync by [`BlockFiles::sync_dir_if_needed`].
    unsynced: AtomicBool,
    /// Wakes the spares thread; `None` when there is none.
    refills: Mutex<Option<mpsc::SyncSender<()>>>,
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
    /// Opens (or creates) the directory; no spares yet: [`BlockFiles::sweep`]
    /// would remove them, [`BlockFiles::refill`] after it makes them.
    pub(crate) fn open(data: &Path) -> std::io::Result<BlockFiles> {
        let dir = data.join("blocks");
        std::fs::create_dir_all(&dir)?;
        let dir_file = File::open(&dir)?;
        Ok(BlockFiles { dir, dir_file, spares: Mutex::new(Vec::new()), unsynced: AtomicBool::new(false), refills: Mutex::new(None) })
    }

    fn path(&self, version: Uuid) -> PathBuf {
        self.dir.join(version.simple().to_string())
    }

    /// Writes a new version and syncs its data; returns its id. A failed
    /// write leaves no file behind.
    pub(crate) fn write(&self, value: &[u8]) -> Result<Uuid, StoreError> {
        let (spare, left) = {
            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            (spares.pop(), spares.len())
        };
        if left < SPARES / 2 {
            if let Some(wake) = &*self.refills.lock().unwrap_or_else(|e| e.into_inner()) {
                // Full: a wake-up is already pending.
                let _ = wake.try_send(());
            }
        }
        let version = spare.unwrap_or_else(Uuid::new_v4);
        let path = self.path(version);
        let what = || format!("writing block version {version}");
        let opened = match spare {
            // A spare is handed out once (popped under the lock) and is empty.
            Some(_) => OpenOptions::new().write(true).open(&path),
            // Never over another version's file (ids are fresh; this is a
            // guard, and a refused create removes nothing).
            None => File::create_new(&path).inspect(|_| self.unsynced.store(true, Ordering::SeqCst)),
        };
        let mut f = opened.map_err(|e| io_error(e, what))?;
        f.write_all(value).and_then(|()| f.sync_data()).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            io_error(e, what)
        })?;
        Ok(version)
    }

    /// Makes spares when fewer than half of [`SPARES`] are left: creates
    /// them, syncs the directory, and only then hands them out.
    pub(crate) fn refill(&self) -> Result<(), StoreError> {
        let have = self.spares.lock().unwrap_or_else(|e| e.into_inner()).len();
        if have >= SPARES / 2 {
            return Ok(());
        }
        let mut made = Vec::with_capacity(SPARES - have);
        let mut result = Ok(());
        for _ in have..SPARES {
            let v = Uuid::new_v4();
            match File::create_new(self.path(v)) {
                Ok(_) => made.push(v),
                Err(e) => {
                    result = Err(io_error(e, || "making spare block files".into()));
                    break;
                }
            }
        }
        if let Err(e) = self.dir_file.sync_all() {
            self.remove(&made);
            return Err(io_error(e, || "syncing the blocks directory".into()));
        }
        self.spares.lock().unwrap_or_else(|e| e.into_inner()).extend(made);
        result
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

    /// Starts the thread that refills the spares when a put finds them
    /// low; it runs until [`BlockFiles::stop_spares`].
    pub(crate) fn start_spares(self: &Arc<Self>) -> std::io::Result<JoinHandle<()>> {
        let (wake, woken) = mpsc::sync_channel(1);
        let files = self.clone();
        let thread = std::thread::Builder::new().name("store-spares".into()).spawn(move || {
            while woken.recv().is_ok() {
                if let Err(e) = files.refill() {
                    tracing::warn!("cannot make spare block files: {e}");
                }
            }
        })?;
        *self.refills.lock().unwrap_or_else(|e| e.into_inner()) = Some(wake);
        Ok(thread)
    }

    /// Ends the spares thread (after its refill in progress, if any).
    pub(crate) fn stop_spares(&self) {
        self.refills.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Makes the directory entries of versions written so far durable:
    /// syncs the directory if one of them was not a spare. (A put sets the
    /// flag after its create and before it is answered, so the commit that
    /// names its version finds the flag set, or after a sync that covered it.)
    pub(crate) fn sync_dir_if_needed(&self) -> Result<(), StoreError> {
        if !self.unsynced.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        self.dir_file.sync_all().map_err(|e| {
            self.unsynced.store(true, Ordering::SeqCst);
            io_error(e, || "syncing the blocks directory".into())
        })
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
        let a = files.write(b"alpha").unwrap();
        let b = files.write(b"beta").unwrap();
        assert_ne!(a, b);
        files.sync_dir_if_needed().unwrap();
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

    #[test]
    fn puts_take_spares_once_and_only_creates_need_a_directory_sync() {
        let dir = tempfile::tempdir().unwrap();
        let files = BlockFiles::open(dir.path()).unwrap();
        let created = files.write(b"made on the spot").unwrap();
        assert!(files.unsynced.load(Ordering::SeqCst), "a created version needs the directory synced");
        files.sync_dir_if_needed().unwrap();
        assert!(!files.unsynced.load(Ordering::SeqCst));

        files.refill().unwrap();
        let spares: HashSet<Uuid> = files.spares.lock().unwrap().iter().copied().collect();
        assert_eq!(spares.len(), SPARES);
        let mut taken = HashSet::new();
        for k in 0..SPARES {
            let v = files.write(format!("version {k}").as_bytes()).unwrap();
            assert!(spares.contains(&v) && taken.insert(v), "each spare is handed out once");
            assert_eq!(files.read(v).unwrap(), Some(format!("version {k}").into_bytes()));
        }
        assert!(!files.unsynced.load(Ordering::SeqCst), "spares need no directory sync");
        // Spares left over are garbage to the next open's sweep.
        files.refill().unwrap();
        let keep: HashSet<Uuid> = taken.iter().copied().chain([created]).collect();
        assert_eq!(files.sweep(&keep).unwrap(), SPARES);
        assert_eq!(files.read(created).unwrap().as_deref(), Some(&b"made on the spot"[..]));
    }
}
