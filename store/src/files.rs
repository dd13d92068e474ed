//! Block versions as files: `<data>/blocks/<version>` holds one version's
//! stored form (header, then payload), written once and never changed.
//!
//! Why not RocksDB values: a block put there is written twice (WAL, then
//! the blob file at flush) and copied three times, and a get copies it out
//! of RocksDB's buffers again. A file per version is written once, synced
//! once, and read with one `read`. RocksDB keeps what needs its atomic
//! batches: the pointer `"B" matrix i j → version` that a commit switches.
//!
//! - **Durability.** A version's data is synced before the commit naming
//!   it is answered ([`BlockFiles::write`] before the put is answered; a
//!   streamed put's [`BlockFiles::sync_later`] by its commit,
//!   [`BlockFiles::sync_staged`], beside the commit's batch, whose undo
//!   record (`undo.rs`) undoes it at the next open should the version not
//!   have reached the disk), and its directory entry is durable before
//!   that batch: an acknowledged pointer never names a file a crash could
//!   lose. Files no committed pointer names are removed at open
//!   ([`BlockFiles::sweep`]).
//! - **Spares.** Creating a file and syncing the directory are two
//!   metadata round trips to the disk, a large part of a small put. Empty
//!   files are made ahead, [`SPARES`] at a time with one directory sync
//!   ([`BlockFiles::refill`], on a thread of its own so that no commit
//!   waits for it), and a put writes into one: its version id is the
//!   spare's name. Only a version made when no spare was left needs the
//!   directory synced before its commit ([`BlockFiles::sync_dir_if_needed`]).
//!   Spares are not pre-written ("warm"): zero-filling them cost more in
//!   host page faults than it saved (`PERFORMANCE.md`).
//! - **Recycling.** A version that a durable commit replaced (or that an
//!   action staged and dropped) is kept, up to [`RECYCLED_FILES`] files and
//!   [`RECYCLED_BYTES`], and the next put overwrites it in place under its
//!   old name, as RocksDB recycles its WAL files: overwriting a file of the
//!   same length allocates no pages and no extents, and its `fdatasync`
//!   has no metadata to journal. It is safe because nobody can still read
//!   a replaced version under a lock: the replacing commit held the block's
//!   exclusive lock, and a version is recycled only once that commit is
//!   durable, so no committed pointer names it, now or after a crash. A
//!   lock-free read of the committed state may race with the overwrite:
//!   the node reads again if the pointer no longer names the version once
//!   it read it (or its header, for a client that reads the payload
//!   itself: `blocks::Recheck`), since the file may then hold another
//!   whole block; an overwrite after that fails the reader's checksum, and
//!   `Client::read_block_committed` reads again.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use store_client::block::{self, BlockHeader, HEADER_LEN};

use crate::disk::Disk;
use crate::open_files::OpenFiles;
use staging::new_stamp;
pub(crate) use staging::Staging;
use store_client::StoreError;
use uuid::Uuid;

/// Spares made at a time; a refill starts when fewer than half are left.
pub(crate) const SPARES: usize = 64;

/// At most this many replaced versions are kept for reuse...
pub(crate) const RECYCLED_FILES: usize = 64;
/// ...holding at most this many bytes of disk (32 versions of b = 1024,
/// 8 of b = 2048); beyond either, a replaced version is unlinked.
pub(crate) const RECYCLED_BYTES: u64 = 256 << 20;

/// Free space a block put must leave on the disk, for RocksDB: its WAL and
/// the memtable flushes behind it. (Debian's RocksDB 7.8.3 aborts the whole
/// node on an assertion when a synced WAL write fails for want of space:
/// `WritableFileWriter::AssertFalseAndGetStatusForPrevError`, found by
/// `store/tests/full_disk.rs`. So the node refuses a put, with
/// `StorageFull`, before the disk gets that full.)
pub(crate) const RESERVE_FOR_PUTS: u64 = 16 << 20;
/// Free space a synced RocksDB batch needs, else it is refused with
/// `StorageFull` rather than written: other files may have taken the space
/// the puts left.
pub(crate) const RESERVE_FOR_BATCHES: u64 = 1 << 20;

/// Replaced versions whose files the next puts overwrite.
#[derive(Default)]
struct Recycled {
    /// Each file's version id (its name) and length.
    files: Vec<(Uuid, u64)>,
    bytes: u64,
}

impl Recycled {
    /// A file for a value of `len` bytes: one of that length if there is
    /// one (its overwrite changes no metadata), else the newest.
    fn take(&mut self, len: u64) -> Option<(Uuid, u64)> {
        let at = self.files.iter().rposition(|&(_, l)| l == len).or(self.files.len().checked_sub(1))?;
        let taken = self.files.swap_remove(at);
        self.bytes -= taken.1;
        Some(taken)
    }

    fn keep(&mut self, version: Uuid, len: u64) -> bool {
        let fits = self.files.len() < RECYCLED_FILES && self.bytes + len <= RECYCLED_BYTES;
        if fits {
            self.files.push((version, len));
            self.bytes += len;
        }
        fits
    }
}

pub(crate) struct BlockFiles {
    /// Every write, sync and create goes through it (`disk.rs`).
    disk: Arc<dyn Disk>,
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
    /// Replaced versions kept for the next puts to overwrite.
    recycled: Mutex<Recycled>,
    /// Versions' files kept open for reads; every removal goes through it.
    open: OpenFiles,
    /// Versions written and answered but not synced yet
    /// ([`BlockFiles::sync_later`]): their commits sync them.
    syncing: Mutex<HashMap<Uuid, Staging>>,
    /// Backups in progress, and the versions retired or removed meanwhile
    /// ([`BlockFiles::pin`]).
    pins: Mutex<Pins>,
}

/// While a backup runs, no version file is removed or recycled: the
/// versions its checkpoint names must still hold their blocks when it
/// links or copies them, whatever commits replace them meanwhile.
#[derive(Default)]
struct Pins {
    n: usize,
    deferred: Vec<Uuid>,
}

/// Held by a backup ([`BlockFiles::pin`]); its drop retires what was
/// deferred.
pub(crate) struct Pin<'a> {
    files: &'a BlockFiles,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let deferred = {
            let mut pins = self.files.pins.lock().unwrap_or_else(|e| e.into_inner());
            pins.n -= 1;
            if pins.n > 0 {
                return;
            }
            std::mem::take(&mut pins.deferred)
        };
        self.files.retire(&deferred);
    }
}

/// Starts reading a version's file into the page cache (a hint: failure
/// changes nothing). For the files of a batch found not cached
/// ([`cached_version_header`]), so that a cold batch's reads are all in
/// flight at once. Not for a single get: its reader's own `pread` starts
/// the same read, and on a cached file the hint costs a walk of its pages
/// (b = 1024 warm gets: 0.55-0.61 of raw with it, 0.65-0.67 without).
pub(crate) fn will_need(f: &File) {
    // SAFETY: a plain syscall on a descriptor this function borrows.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
}

/// Whether an opened version's first page is in the page cache: a read of
/// its first byte that may not wait (`RWF_NOWAIT`) gets it. The payload's
/// first folio holds that page (see [`cached_version_header`]), so this
/// tells a cached block from one still on disk. False also on a
/// filesystem without the flag: the caller then gives a read hint it did
/// not need.
pub(crate) fn first_page_cached(f: &File) -> bool {
    read_start_if_cached(f, &mut [0u8; 1])
}

/// Fills `buf` from the file's start with a read that may not wait
/// (`RWF_NOWAIT`): false if those bytes are not all in the page cache (or
/// the filesystem does not know the flag, or the file is shorter).
fn read_start_if_cached(f: &File, buf: &mut [u8]) -> bool {
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: `iov` points at `buf`, writable and outliving the call.
    let got = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    got == buf.len() as isize
}

/// An opened version's header, checked as [`version_header`] checks it,
/// if its first page is in the page cache: a read that may not wait
/// (`RWF_NOWAIT`) gets it. The payload's first folio holds the header's
/// page (a spliced put writes the header after its payload, a streamed
/// one with its first piece, `spliced.rs`), so a cached header means a
/// cached block, and the batch's read hint is skipped for it. One read
/// where a probe of the file's last byte and then the header's read made
/// two. `None` (not cached, a filesystem without the flag, or a header
/// that fails its checks) leaves the caller to give the hint and read the
/// header with [`version_header`], which says what is wrong.
pub(crate) fn cached_version_header(f: &File) -> Option<BlockHeader> {
    let mut head = [0u8; HEADER_LEN];
    if !read_start_if_cached(f, &mut head) {
        return None;
    }
    checked_header(f, &head, &String::new).ok()
}

/// Reads an opened version's header and checks that the file is as long
/// as the header says.
pub(crate) fn version_header(f: &File, what: &dyn Fn() -> String) -> Result<BlockHeader, StoreError> {
    use std::os::unix::fs::FileExt;
    let corrupt = |why: &str| StoreError::Corrupt { what: format!("{}: {why}", what()) };
    let mut head = [0u8; HEADER_LEN];
    f.read_exact_at(&mut head, 0).map_err(|_| corrupt("bad block header"))?;
    checked_header(f, &head, what)
}

/// The write stamp in an opened version's header (0 for none, as in a
/// header of a value written whole), or `None` if its first bytes cannot be
/// read or are no block header.
pub(crate) fn version_stamp(f: &File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; HEADER_LEN];
    f.read_exact_at(&mut head, 0).ok()?;
    block::stamp(&head)
}

/// The header in a version's first bytes `head`, checked against the
/// length of its file `f`.
fn checked_header(f: &File, head: &[u8; HEADER_LEN], what: &dyn Fn() -> String) -> Result<BlockHeader, StoreError> {
    let corrupt = |why: &str| StoreError::Corrupt { what: format!("{}: {why}", what()) };
    let header = block::decode_header(head).ok_or_else(|| corrupt(block::bad_header(head)))?;
    let len = f.metadata().map_err(|e| io_error(e, what))?.len();
    if len != (HEADER_LEN + header.payload_len()) as u64 {
        return Err(corrupt("payload length does not match the header"));
    }
    Ok(header)
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
    pub(crate) fn open(data: &Path, disk: Arc<dyn Disk>) -> std::io::Result<BlockFiles> {
        let dir = data.join("blocks");
        std::fs::create_dir_all(&dir)?;
        let dir_file = File::open(&dir)?;
        Ok(BlockFiles {
            disk,
            dir,
            dir_file,
            spares: Mutex::new(Vec::new()),
            unsynced: AtomicBool::new(false),
            refills: Mutex::new(None),
            recycled: Mutex::default(),
            open: OpenFiles::new(),
            syncing: Mutex::default(),
            pins: Mutex::default(),
        })
    }

    /// Stops every removal and recycling of version files until the pin
    /// is dropped: a backup's versions stay as its checkpoint names them.
    pub(crate) fn pin(&self) -> Pin<'_> {
        self.pins.lock().unwrap_or_else(|e| e.into_inner()).n += 1;
        Pin { files: self }
    }

    /// Defers `versions`' removal if a backup holds a pin; true if so.
    fn deferred(&self, versions: &[Uuid]) -> bool {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        if pins.n == 0 {
            return false;
        }
        pins.deferred.extend_from_slice(versions);
        true
    }

    /// A version's file in this store's `blocks/`.
    pub(crate) fn path(&self, version: Uuid) -> PathBuf {
        self.dir.join(version.simple().to_string())
    }

    /// Refuses a blocks directory of an earlier block format, judged by
    /// the first version file that holds a header: a node that opened one
    /// would answer every get `Corrupt`. (All of a store's blocks share a
    /// format: no build converts them.)
    pub(crate) fn check_format(&self) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        let what = || format!("reading {}", self.dir.display());
        for entry in std::fs::read_dir(&self.dir).map_err(|e| io_error(e, what))? {
            let path = entry.map_err(|e| io_error(e, what))?.path();
            let Ok(f) = File::open(&path) else { continue };
            let mut head = [0u8; HEADER_LEN];
            if f.read_exact_at(&mut head, 0).is_err() {
                // Empty: a spare, or a put cut short.
                continue;
            }
            if block::is_earlier_format(&head) {
                return Err(StoreError::Storage {
                    what: format!(
                        "{}: {}; export its matrices with the build that wrote them and import them again",
                        self.dir.display(),
                        block::bad_header(&head)
                    ),
                });
            }
            return Ok(());
        }
        Ok(())
    }

    /// Writes a new version and syncs its data; returns its id. A failed
    /// write leaves no file behind. Overwrites a recycled version if there
    /// is one; a full disk first gives the recycled versions' space back.
    pub(crate) fn write(&self, value: &[u8]) -> Result<Uuid, StoreError> {
        let once = || {
            let staging = self.stage(value.len() as u64)?;
            match staging.write_last_at(value, 0) {
                Ok(()) => Ok(staging.version),
                Err(e) => Err(self.failed(staging, e)),
            }
        };
        match once() {
            // `failed` gave the recycled versions' space back.
            Err(StoreError::StorageFull { .. }) => once(),
            written => written,
        }
    }

    /// The file a new version of `len` bytes is written into: a recycled
    /// version's (one of that length if there is one: its overwrite
    /// changes no metadata), else a spare, else a new file. `StorageFull`
    /// if the bytes it adds would leave less than [`RESERVE_FOR_PUTS`] free.
    pub(crate) fn stage(&self, len: u64) -> Result<Staging, StoreError> {
        let recycled = self.recycled.lock().unwrap_or_else(|e| e.into_inner()).take(len);
        // A recycled version's data holds its disk space already.
        let adds = len.saturating_sub(recycled.map_or(0, |(_, was)| was));
        if adds > 0 {
            if let Err(e) = self.ensure_free(adds + RESERVE_FOR_PUTS, &format!("a block version of {len} bytes")) {
                if let Some((version, _)) = recycled {
                    self.retire(&[version]);
                }
                return Err(e);
            }
        }
        if let Some((version, was)) = recycled {
            let path = self.path(version);
            return match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(file) => Ok(Staging { version, file, len, was, stamp: new_stamp(), check: None, disk: self.disk.clone() }),
                Err(e) => {
                    let _ = self.open.unlink(version, &path);
                    Err(io_error(e, || format!("opening recycled block version {version}")))
                }
            };
        }
        let (spare, left) = {
            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            (spares.pop(), spares.len())
        };
        // Low on spares: the spares thread makes more.
        if left < SPARES / 2 {
            if let Some(wake) = &*self.refills.lock().unwrap_or_else(|e| e.into_inner()) {
                // Full: a wake-up is already pending.
                let _ = wake.try_send(());
            }
        }
        let version = spare.unwrap_or_else(Uuid::new_v4);
        let path = self.path(version);
        let opened = match spare {
            // A spare is handed out once (popped under the lock).
            Some(_) => OpenOptions::new().read(true).write(true).open(&path),
            // Never over another version's file (ids are fresh; this is a
            // guard, and a refused create removes nothing).
            None => self.disk.create_new(&path).inspect(|_| self.unsynced.store(true, Ordering::SeqCst)),
        };
        let file = opened.map_err(|e| io_error(e, || format!("creating block version {version}")))?;
        Ok(Staging { version, file, len, was: 0, stamp: new_stamp(), check: None, disk: self.disk.clone() })
    }

    /// Bytes free for this process on the blocks' filesystem.
    pub(crate) fn free_bytes(&self) -> std::io::Result<u64> {
        self.disk_space().map(|(free, _)| free)
    }

    /// Files kept open for reads now (`open_files.rs`).
    pub(crate) fn n_open(&self) -> usize {
        self.open.len()
    }

    /// The blocks' filesystem: bytes free for this process, and its size.
    pub(crate) fn disk_space(&self) -> std::io::Result<(u64, u64)> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        // SAFETY: `path` is a valid C string and `stat` a properly sized
        // out-parameter for the call's duration.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((stat.f_bavail as u64 * stat.f_frsize as u64, stat.f_blocks as u64 * stat.f_frsize as u64))
    }

    /// `StorageFull` unless [`RESERVE_FOR_BATCHES`] bytes are free: checked
    /// before every synced RocksDB batch (see [`RESERVE_FOR_PUTS`]).
    pub(crate) fn room_for_batch(&self) -> Result<(), StoreError> {
        self.ensure_free(RESERVE_FOR_BATCHES, "a synced batch")
    }

    /// `StorageFull` unless `bytes` are free (`what` needs them): a new
    /// matrix whose blocks the disk cannot hold is refused before any is
    /// written. Without the puts' reserve: each put checks for it.
    pub(crate) fn room_for(&self, bytes: u64, what: &str) -> Result<(), StoreError> {
        let short = |files: &Self| files.free_bytes().ok().filter(|&free| free < bytes);
        let Some(free) = short(self) else { return Ok(()) };
        if self.release_recycled() > 0 && short(self).is_none() {
            return Ok(());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        Err(StoreError::StorageFull { what: format!("{what} does not fit: the store's disk has {:.2} GiB free ({free} bytes)", gib(free)) })
    }

    /// `StorageFull` unless `bytes` are free, once the recycled versions'
    /// space is given back if that is short. A filesystem that cannot say
    /// how much is free passes: the write finds out.
    fn ensure_free(&self, bytes: u64, what: &str) -> Result<(), StoreError> {
        let short = |files: &Self| files.free_bytes().ok().filter(|&free| free < bytes);
        let Some(free) = short(self) else { return Ok(()) };
        if self.release_recycled() > 0 && short(self).is_none() {
            return Ok(());
        }
        Err(StoreError::StorageFull {
            what: format!("{what} needs {} MiB free (with the store's log reserve), {free} bytes are", bytes.div_ceil(1 << 20)),
        })
    }

    /// Starts `staging`'s writeback and keeps its file unsynced while the
    /// put is answered; the commit that makes the version current syncs it
    /// ([`BlockFiles::sync_staged`], beside its batch, which carries an undo
    /// record for the case a crash comes between the two). The disk
    /// writes the version while the put's answer and the client's next
    /// requests (its record, its commit) travel.
    pub(crate) fn sync_later(&self, staging: Staging) -> Result<Uuid, StoreError> {
        let version = staging.version;
        if let Err(e) = staging.cut() {
            return Err(self.failed(staging, e));
        }
        staging.start_writeback(0, 0);
        self.syncing.lock().unwrap_or_else(|e| e.into_inner()).insert(version, staging);
        Ok(version)
    }

    /// The header stamp of a version that waits for its sync
    /// ([`BlockFiles::sync_later`]); `None` for any other.
    pub(crate) fn unsynced_stamp(&self, version: Uuid) -> Option<u64> {
        self.syncing.lock().unwrap_or_else(|e| e.into_inner()).get(&version).map(Staging::stamp)
    }

    /// Whether any of these versions waits for its sync
    /// ([`BlockFiles::sync_later`]).
    pub(crate) fn has_unsynced(&self, versions: &[Uuid]) -> bool {
        let syncing = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        !syncing.is_empty() && versions.iter().any(|v| syncing.contains_key(v))
    }

    /// The versions waiting for their sync.
    #[cfg(test)]
    pub(crate) fn unsynced_versions(&self) -> Vec<Uuid> {
        self.syncing.lock().unwrap().keys().copied().collect()
    }

    /// Syncs the files of these versions that [`BlockFiles::sync_later`]
    /// left unsynced (the others were synced before their puts were
    /// answered); the first that fails fails the call.
    pub(crate) fn sync_staged(&self, versions: &[Uuid]) -> Result<(), StoreError> {
        let pending: Vec<Staging> = {
            let mut syncing = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
            if syncing.is_empty() {
                return Ok(());
            }
            versions.iter().filter_map(|v| syncing.remove(v)).collect()
        };
        for staging in pending {
            let version = staging.version;
            match staging.passes_check() {
                Ok(true) => {}
                Ok(false) => {
                    return Err(StoreError::Corrupt { what: format!("block version {version} as sent: checksum mismatch") });
                }
                Err(e) => return Err(self.io_failure(e, || format!("reading block version {version} back for its checksum"))),
            }
            if let Err(e) = staging.sync() {
                return Err(self.io_failure(e, || format!("syncing block version {version}")));
            }
        }
        Ok(())
    }

    /// Forgets the unsynced versions no commit will make current.
    fn forget_syncs(&self, versions: &[Uuid]) {
        let mut syncing = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        if !syncing.is_empty() {
            for v in versions {
                syncing.remove(v);
            }
        }
    }

    /// Gives back a staged file that will not be a version (its put was
    /// refused or cut off): kept for the next puts like a retired version.
    pub(crate) fn abandon(&self, staging: Staging) {
        self.retire(&[staging.version]);
    }

    /// Removes the file of a staged version whose write failed; returns
    /// the typed error. A full disk also gives the recycled versions'
    /// space back, so that the next put can succeed.
    pub(crate) fn failed(&self, staging: Staging, e: std::io::Error) -> StoreError {
        let version = staging.version;
        drop(staging);
        let _ = self.open.unlink(version, &self.path(version));
        self.io_failure(e, || format!("writing block version {version}"))
    }

    /// A failed write or sync of a version as the store's typed error; a
    /// full disk also gives the recycled versions' space back, so that the
    /// next put can succeed.
    fn io_failure(&self, e: std::io::Error, what: impl FnOnce() -> String) -> StoreError {
        let error = io_error(e, what);
        if matches!(error, StoreError::StorageFull { .. }) {
            self.release_recycled();
        }
        error
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
            match self.disk.create_new(&self.path(v)) {
                Ok(_) => made.push(v),
                Err(e) => {
                    result = Err(io_error(e, || "making spare block files".into()));
                    break;
                }
            }
        }
        if let Err(e) = self.disk.sync_dir(&self.dir_file) {
            self.remove(&made);
            return Err(io_error(e, || "syncing the blocks directory".into()));
        }
        self.spares.lock().unwrap_or_else(|e| e.into_inner()).extend(made);
        result
    }

    /// Reads a version's stored form; `None` if there is no such file.
    pub(crate) fn read(&self, version: Uuid) -> Result<Option<Vec<u8>>, StoreError> {
        use std::os::unix::fs::FileExt;
        let what = || format!("reading block version {version}");
        let Some(f) = self.open.get(version, &self.path(version)).map_err(|e| io_error(e, what))? else { return Ok(None) };
        let len = f.metadata().map_err(|e| io_error(e, what))?.len() as usize;
        let mut value = vec![0u8; len];
        f.read_exact_at(&mut value, 0).map_err(|e| io_error(e, what))?;
        Ok(Some(value))
    }

    /// Opens a version for reading by someone else (its descriptor is
    /// passed on); `None` if there is no such file. [`version_header`]
    /// checks it.
    pub(crate) fn open_version(&self, version: Uuid, what: &dyn Fn() -> String) -> Result<Option<Arc<File>>, StoreError> {
        self.open.get(version, &self.path(version)).map_err(|e| io_error(e, what))
    }

    /// Retires versions no committed pointer names any more (replaced by
    /// a durable commit, or staged and dropped): keeps them for the next
    /// puts to overwrite, as far as [`RECYCLED_FILES`] and
    /// [`RECYCLED_BYTES`] allow, and removes the rest.
    pub(crate) fn retire(&self, versions: &[Uuid]) {
        use std::os::unix::fs::MetadataExt;
        self.forget_syncs(versions);
        if self.deferred(versions) {
            return;
        }
        let mut unkept = Vec::new();
        for &v in versions {
            // A missing file (a sweep got it) is not kept, nor one a
            // backup links to (overwritten, the backup's block would change).
            let kept = std::fs::metadata(self.path(v))
                .is_ok_and(|m| m.nlink() == 1 && self.recycled.lock().unwrap_or_else(|e| e.into_inner()).keep(v, m.len()));
            if !kept {
                unkept.push(v);
            }
        }
        self.remove(&unkept);
    }

    /// Removes every recycled version; returns how many there were.
    fn release_recycled(&self) -> usize {
        let gone = std::mem::take(&mut *self.recycled.lock().unwrap_or_else(|e| e.into_inner()));
        let versions: Vec<Uuid> = gone.files.iter().map(|&(v, _)| v).collect();
        self.remove(&versions);
        versions.len()
    }

    /// Removes versions (aborted, replaced or deleted); missing ones are
    /// fine (a sweep or an earlier removal got them).
    pub(crate) fn remove(&self, versions: &[Uuid]) {
        self.forget_syncs(versions);
        if self.deferred(versions) {
            return;
        }
        for v in versions {
            if let Err(e) = self.open.unlink(*v, &self.path(*v)) {
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
            // Spares are made ahead of need: the thread yields the CPU to
            // the node's requests and to slaves on the same machine.
            // SAFETY: plain syscalls on this thread's own id.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, 19);
            }
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
        self.disk.sync_dir(&self.dir_file).map_err(|e| {
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
            let version = name.to_str().and_then(|n| Uuid::try_parse(n).ok());
            if !version.is_some_and(|v| keep.contains(&v)) {
                match version {
                    Some(v) => self.open.unlink(v, &entry.path())?,
                    None => std::fs::remove_file(entry.path())?,
                }
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Test hook: writes `value` over a version's file and syncs it, as a
    /// power cut that lost a put to a recycled file leaves it (the older
    /// block it held).
    #[cfg(test)]
    pub(crate) fn put_back(&self, version: Uuid, value: &[u8]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(self.path(version)).unwrap();
        f.write_all_at(value, 0).unwrap();
        f.sync_data().unwrap();
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

mod staging;
#[cfg(test)]
mod tests;
