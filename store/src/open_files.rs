//! Block version files kept open for reading, as RocksDB keeps its table
//! files open: a get then costs no path lookup, and a version whose pages
//! left the cache needs only its data read from the disk, not also its
//! directory entry and inode (`bench blocks`, b = 256 after
//! `drop_caches`: each get opened its file with two small synchronous
//! reads before the block's own).
//!
//! A version's file keeps its inode for life (a recycled version is
//! overwritten in place under its name), so an open descriptor reads
//! whatever a fresh `open` would. Removal goes through [`OpenFiles::unlink`],
//! which drops the descriptor with the name, so a removed version's space
//! is given back at once.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// Most descriptors kept, whatever the process may open.
const MOST: usize = 4096;

pub(crate) struct OpenFiles {
    cap: usize,
    open: Mutex<Kept>,
}

/// The open files and the order they were opened in (the oldest is
/// closed first when the cache is full).
#[derive(Default)]
struct Kept {
    files: HashMap<Uuid, Arc<File>>,
    order: VecDeque<Uuid>,
}

impl OpenFiles {
    /// A cache of at most a quarter of the descriptors the process may
    /// open (the rest are for connections and RocksDB), at most [`MOST`].
    pub(crate) fn new() -> OpenFiles {
        OpenFiles::with_cap((raise_descriptor_limit() / 4).min(MOST as u64) as usize)
    }

    /// Files kept open now.
    pub(crate) fn len(&self) -> usize {
        self.lock().files.len()
    }

    pub(crate) fn with_cap(cap: usize) -> OpenFiles {
        OpenFiles { cap, open: Mutex::default() }
    }

    /// The version's open file; `None` if it has no file.
    pub(crate) fn get(&self, version: Uuid, path: &Path) -> std::io::Result<Option<Arc<File>>> {
        if let Some(f) = self.lock().files.get(&version) {
            return Ok(Some(f.clone()));
        }
        // Opened outside the lock: on a cold cache the open reads the disk.
        let f = match File::open(path) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if self.cap == 0 {
            return Ok(Some(f));
        }
        let mut open = self.lock();
        // Unlinked between the open and now (`unlink` holds the lock): not
        // kept, or it would hold the removed file's space.
        if f.metadata()?.nlink() == 0 {
            return Ok(Some(f));
        }
        if open.files.insert(version, f.clone()).is_none() {
            open.order.push_back(version);
            while open.files.len() > self.cap {
                let Some(oldest) = open.order.pop_front() else { break };
                open.files.remove(&oldest);
            }
        }
        Ok(Some(f))
    }

    /// Removes a version's file and closes its kept descriptor.
    pub(crate) fn unlink(&self, version: Uuid, path: &Path) -> std::io::Result<()> {
        let mut open = self.lock();
        if open.files.remove(&version).is_some() {
            open.order.retain(|v| *v != version);
        }
        std::fs::remove_file(path)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Raises the soft limit on open descriptors to the hard limit (Debian's
/// default soft limit is 1024); returns the limit now in force.
fn raise_descriptor_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a struct this function owns.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_kept_file_reads_what_is_written_in_place_and_unlink_closes_it() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::with_cap(2);
        let v: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        let path = |k: usize| dir.path().join(v[k].to_string());
        for k in 0..3 {
            std::fs::File::create(path(k)).unwrap().write_all(format!("v{k}").as_bytes()).unwrap();
        }
        let f0 = files.get(v[0], &path(0)).unwrap().unwrap();
        // Overwritten in place (a recycled version): the kept file sees it.
        std::fs::OpenOptions::new().write(true).open(path(0)).unwrap().write_all_at(b"w0", 0).unwrap();
        let again = files.get(v[0], &path(0)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&f0, &again), "the second get is the kept file");
        let mut buf = [0u8; 2];
        again.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"w0");
        // At most `cap` kept: the oldest goes.
        files.get(v[1], &path(1)).unwrap().unwrap();
        files.get(v[2], &path(2)).unwrap().unwrap();
        assert_eq!(files.len(), 2);
        assert!(!Arc::ptr_eq(&f0, &files.get(v[0], &path(0)).unwrap().unwrap()), "v0 was closed and opened anew");
        // Unlinked: gone from the cache and the directory.
        files.unlink(v[0], &path(0)).unwrap();
        assert!(files.get(v[0], &path(0)).unwrap().is_none());
        assert!(!path(0).exists());
        assert_eq!(files.len(), 1);
    }
}
