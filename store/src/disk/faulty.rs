//! A [`Disk`] that fails on cue, for tests: the k-th call (of one kind,
//! or of any) fails, and the disk may then stay dead; a power cut then
//! loses what was not synced.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rocksdb::{WriteBatch, DB};
use store_client::StoreError;

use super::{Disk, RealDisk};

/// The calls of the seam, as a fault names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Write,
    Sync,
    SyncDir,
    SetLen,
    Create,
    /// A RocksDB batch written without a sync.
    Batch,
    /// A RocksDB batch written and synced.
    SyncedBatch,
}

/// How a call fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// Nothing happens; the call answers EIO.
    Eio,
    /// Nothing happens; the call answers ENOSPC.
    Enospc,
    /// Part of it happens and the call answers EIO: a write's first half
    /// lands; any other call (a batch, a sync, a create) happens whole,
    /// and only its answer is lost.
    Torn,
}

/// What the disk does after its fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Every later call works.
    Recovers,
    /// Every later call fails with EIO, until [`FaultyDisk::power_cut`].
    Dies,
}

#[derive(Debug)]
struct Plan {
    /// The kind of call counted, or every kind.
    op: Option<Op>,
    /// Calls of that kind still to go before the failing one.
    left: u64,
    kind: FaultKind,
    after: After,
}

#[derive(Debug, Default)]
struct State {
    calls: u64,
    plans: Vec<Plan>,
    dead: bool,
    injected: Vec<(Op, FaultKind)>,
    /// Byte ranges written since their file's last sync.
    unsynced: HashMap<PathBuf, Vec<(u64, u64)>>,
    /// Files created since their directory's last sync.
    created: BTreeSet<PathBuf>,
}

/// The fault-injecting disk (see the module's documentation).
#[derive(Debug, Default)]
pub struct FaultyDisk {
    real: RealDisk,
    state: Mutex<State>,
}

/// What a call is to do.
enum Verdict {
    Go,
    Fail(FaultKind),
}

impl FaultyDisk {
    pub fn new() -> FaultyDisk {
        FaultyDisk::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `k`-th call from now (1 is the next) of kind `op` (`None`: of
    /// any kind) fails as `kind`; the disk then does as `after` says.
    /// Faults planned together count their calls each on its own.
    pub fn fail(&self, op: Option<Op>, k: u64, kind: FaultKind, after: After) {
        assert!(k >= 1, "calls are counted from 1");
        self.state().plans.push(Plan { op, left: k - 1, kind, after });
    }

    /// Calls made so far (failed ones included).
    pub fn calls(&self) -> u64 {
        self.state().calls
    }

    /// Every fault injected so far: the call and how it failed.
    pub fn injected(&self) -> Vec<(Op, FaultKind)> {
        self.state().injected.clone()
    }

    /// Whether a planned fault has not been reached yet.
    pub fn armed(&self) -> bool {
        !self.state().plans.is_empty()
    }

    /// Whether the disk died ([`After::Dies`]) and has not been cut off since.
    pub fn is_dead(&self) -> bool {
        self.state().dead
    }

    /// The power goes, and comes back: every byte range written since its
    /// file's last sync is garbled, every file created since the blocks
    /// directory's last sync is gone, and the disk works again (no fault
    /// planned). For a node that is no longer running.
    pub fn power_cut(&self) {
        let mut state = self.state();
        for (path, ranges) in state.unsynced.drain() {
            let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else { continue };
            for (offset, len) in ranges {
                let _ = std::os::unix::fs::FileExt::write_all_at(&file, &vec![0xa5; len as usize], offset);
            }
            let _ = file.sync_data();
        }
        for path in std::mem::take(&mut state.created) {
            let _ = std::fs::remove_file(path);
        }
        state.dead = false;
        state.plans.clear();
    }

    /// Counts a call of kind `op` and says whether it fails.
    fn verdict(&self, op: Op) -> Verdict {
        let mut state = self.state();
        state.calls += 1;
        if state.dead {
            return Verdict::Fail(FaultKind::Eio);
        }
        let mut due = None;
        for (at, plan) in state.plans.iter_mut().enumerate() {
            if plan.op.is_some_and(|o| o != op) {
                continue;
            }
            match plan.left {
                0 if due.is_none() => due = Some(at),
                0 => {}
                _ => plan.left -= 1,
            }
        }
        let Some(at) = due else { return Verdict::Go };
        let Plan { kind, after, .. } = state.plans.remove(at);
        state.dead = after == After::Dies;
        state.injected.push((op, kind));
        Verdict::Fail(kind)
    }

    fn wrote(&self, file: &File, offset: u64, len: u64) {
        if let Some(path) = path_of(file) {
            self.state().unsynced.entry(path).or_default().push((offset, len));
        }
    }

    fn synced(&self, file: &File) {
        if let Some(path) = path_of(file) {
            self.state().unsynced.remove(&path);
        }
    }
}

/// The path a descriptor was opened at, as the kernel knows it.
fn path_of(file: &File) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

fn error(kind: FaultKind) -> io::Error {
    match kind {
        FaultKind::Enospc => io::Error::from_raw_os_error(libc::ENOSPC),
        FaultKind::Eio | FaultKind::Torn => io::Error::from_raw_os_error(libc::EIO),
    }
}

impl Disk for FaultyDisk {
    fn write_at(&self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
        let landed = match self.verdict(Op::Write) {
            Verdict::Go => bytes.len(),
            Verdict::Fail(FaultKind::Torn) => bytes.len() / 2,
            Verdict::Fail(kind) => return Err(error(kind)),
        };
        self.wrote(file, offset, landed as u64);
        self.real.write_at(file, &bytes[..landed], offset)?;
        if landed < bytes.len() {
            return Err(error(FaultKind::Torn));
        }
        Ok(())
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        let verdict = self.verdict(Op::Sync);
        if let Verdict::Fail(kind @ (FaultKind::Eio | FaultKind::Enospc)) = verdict {
            return Err(error(kind));
        }
        self.real.sync_data(file)?;
        self.synced(file);
        match verdict {
            Verdict::Go => Ok(()),
            Verdict::Fail(kind) => Err(error(kind)),
        }
    }

    fn sync_dir(&self, dir: &File) -> io::Result<()> {
        let verdict = self.verdict(Op::SyncDir);
        if let Verdict::Fail(kind @ (FaultKind::Eio | FaultKind::Enospc)) = verdict {
            return Err(error(kind));
        }
        self.real.sync_dir(dir)?;
        if let Some(dir) = path_of(dir) {
            self.state().created.retain(|p| p.parent() != Some(&dir));
        }
        match verdict {
            Verdict::Go => Ok(()),
            Verdict::Fail(kind) => Err(error(kind)),
        }
    }

    fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
        let verdict = self.verdict(Op::SetLen);
        if let Verdict::Fail(kind @ (FaultKind::Eio | FaultKind::Enospc)) = verdict {
            return Err(error(kind));
        }
        self.real.set_len(file, len)?;
        match verdict {
            Verdict::Go => Ok(()),
            Verdict::Fail(kind) => Err(error(kind)),
        }
    }

    fn create_new(&self, path: &Path) -> io::Result<File> {
        let verdict = self.verdict(Op::Create);
        if let Verdict::Fail(kind @ (FaultKind::Eio | FaultKind::Enospc)) = verdict {
            return Err(error(kind));
        }
        let file = self.real.create_new(path)?;
        self.state().created.insert(path.to_owned());
        match verdict {
            Verdict::Go => Ok(file),
            Verdict::Fail(kind) => Err(error(kind)),
        }
    }

    fn write_batch(&self, db: &DB, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        let verdict = self.verdict(if sync { Op::SyncedBatch } else { Op::Batch });
        let failed = |kind| crate::files::io_error(error(kind), || "injected fault: writing a RocksDB batch".into());
        if let Verdict::Fail(kind @ (FaultKind::Eio | FaultKind::Enospc)) = verdict {
            return Err(failed(kind));
        }
        self.real.write_batch(db, batch, sync)?;
        match verdict {
            Verdict::Go => Ok(()),
            Verdict::Fail(kind) => Err(failed(kind)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kth_call_of_a_kind_fails_and_a_dead_disk_fails_every_call_until_a_power_cut() {
        let dir = tempfile::tempdir().unwrap();
        let disk = FaultyDisk::new();
        disk.fail(Some(Op::Sync), 2, FaultKind::Eio, After::Dies);
        let f = disk.create_new(&dir.path().join("a")).unwrap();
        disk.write_at(&f, b"abcd", 0).unwrap();
        disk.sync_data(&f).unwrap();
        disk.write_at(&f, b"efgh", 4).unwrap();
        assert_eq!(disk.sync_data(&f).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(disk.is_dead());
        assert!(disk.write_at(&f, b"x", 0).is_err(), "a dead disk takes no write");
        assert_eq!(disk.injected(), vec![(Op::Sync, FaultKind::Eio)]);
        disk.power_cut();
        assert!(!disk.is_dead());
        // The file was created since the directory's last sync: gone.
        assert!(!dir.path().join("a").exists());
    }

    #[test]
    fn a_torn_write_lands_its_first_half_and_a_power_cut_garbles_unsynced_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let disk = FaultyDisk::new();
        let path = dir.path().join("b");
        let f = disk.create_new(&path).unwrap();
        disk.sync_dir(&File::open(dir.path()).unwrap()).unwrap();
        disk.write_at(&f, b"12345678", 0).unwrap();
        disk.sync_data(&f).unwrap();
        disk.fail(Some(Op::Write), 1, FaultKind::Torn, After::Recovers);
        assert!(disk.write_at(&f, b"abcdefgh", 0).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"abcd5678");
        disk.write_at(&f, b"WXYZ", 4).unwrap();
        disk.power_cut();
        let after = std::fs::read(&path).unwrap();
        assert_eq!(&after[..4], &[0xa5; 4], "the torn, unsynced prefix is lost");
        assert_eq!(&after[4..], &[0xa5; 4], "so is the later unsynced write");
    }
}
