//! Online backup: a consistent copy of a serving node's data directory,
//! taken while commits go on, that `master serve --data` opens as it
//! opens any data directory after a crash.
//!
//! A backup is a RocksDB checkpoint (its tables hard-linked, its log
//! copied: one point in the commit order) plus the block versions that
//! checkpoint names, under the same layout (`<dir>/blocks/<version>`).
//! The versions are named by its pointers and by its undo records' old
//! values (a commit whose versions were still syncing when the checkpoint
//! was cut: the open of the backup checks them and may roll it back, so
//! the versions it would roll back to must be there too).
//!
//! Why it is consistent: the block files are pinned ([`BlockFiles::pin`])
//! before the checkpoint is cut and until every version it names is
//! linked or copied, so no commit after the cut can remove or recycle
//! (overwrite) a version the checkpoint still names; and a committed
//! version's file is never written again except by recycling. A hard
//! link shares the file with the node for good, so recycling skips files
//! with more than one link (`BlockFiles::retire`): a linked version is
//! unlinked when replaced, never overwritten.
//!
//! Links where the backup is on the store's filesystem (no block bytes
//! written), copies otherwise (`copy_file_range`, then synced). What a
//! restore loses is every commit after the cut; tasks those commits ended
//! are back in their bags and are done again.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};
use store_client::StoreError;
use uuid::Uuid;

use crate::db::storage_error;
use crate::files::{io_error, BlockFiles};
use crate::undo::{self, Undo};

/// What a backup wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackupReport {
    /// Block version files in it.
    pub n_versions: u64,
    /// Of their bytes: hard-linked (none written) and copied.
    pub bytes_linked: u64,
    pub bytes_copied: u64,
    /// RocksDB's checkpoint (tables linked or copied, log and manifest).
    pub db_bytes: u64,
    /// The whole backup, checkpoint to last sync.
    pub seconds: f64,
}

/// Writes a backup of the store whose RocksDB is `db` and whose block
/// files are `files` into `dir`, which must not exist (its parent must).
pub(crate) fn backup(db: &DB, files: &BlockFiles, dir: &Path) -> Result<BackupReport, StoreError> {
    let started = Instant::now();
    if dir.exists() {
        return Err(StoreError::AlreadyExists { what: format!("backup directory {}", dir.display()) });
    }
    let _pin = files.pin();
    rocksdb::checkpoint::Checkpoint::new(db).and_then(|c| c.create_checkpoint(dir)).map_err(storage_error)?;
    let versions = named_versions(dir)?;
    let blocks = dir.join("blocks");
    std::fs::create_dir(&blocks).map_err(|e| io_error(e, || format!("creating {}", blocks.display())))?;
    let mut report = BackupReport { n_versions: versions.len() as u64, ..Default::default() };
    for v in versions {
        let (from, to) = (files.path(v), blocks.join(v.simple().to_string()));
        let what = || format!("backing up block version {v} to {}", to.display());
        match std::fs::hard_link(&from, &to) {
            Ok(()) => report.bytes_linked += std::fs::metadata(&to).map_err(|e| io_error(e, what))?.len(),
            // Another filesystem (EXDEV) or one without links: a copy.
            Err(_) => {
                report.bytes_copied += std::fs::copy(&from, &to).map_err(|e| io_error(e, what))?;
                std::fs::File::open(&to).and_then(|f| f.sync_data()).map_err(|e| io_error(e, what))?;
            }
        }
    }
    for d in [&blocks, dir] {
        std::fs::File::open(d).and_then(|f| f.sync_all()).map_err(|e| io_error(e, || format!("syncing {}", d.display())))?;
    }
    report.db_bytes = dir_bytes(dir)?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Every block version the checkpoint at `dir` names: its pointers'
/// versions and those its undo records would put back.
fn named_versions(dir: &Path) -> Result<BTreeSet<Uuid>, StoreError> {
    let cfs = [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, crate::db::BLOCKS].map(|n| ColumnFamilyDescriptor::new(n, Options::default()));
    let checkpoint = DB::open_cf_descriptors_read_only(&Options::default(), dir, cfs, false).map_err(storage_error)?;
    let mut versions = BTreeSet::new();
    let mut name = |v: &[u8]| {
        if let Ok(v) = Uuid::from_slice(v) {
            versions.insert(v);
        }
    };
    for item in checkpoint.prefix_iterator(b"B") {
        let (k, v) = item.map_err(storage_error)?;
        if !k.starts_with(b"B") {
            break;
        }
        name(&v);
    }
    for item in checkpoint.prefix_iterator(undo::PREFIX) {
        let (k, v) = item.map_err(storage_error)?;
        if !k.starts_with(undo::PREFIX) {
            break;
        }
        let record = Undo::decode(&v).ok_or_else(|| StoreError::Corrupt { what: format!("undo record {k:?} in the checkpoint") })?;
        for (k, before) in &record.before {
            if let (true, Some(v)) = (k.starts_with(b"B"), before) {
                name(v);
            }
        }
    }
    Ok(versions)
}

/// Bytes of the files directly in `dir` (the checkpoint's, not `blocks/`).
fn dir_bytes(dir: &Path) -> Result<u64, StoreError> {
    let what = || format!("reading {}", dir.display());
    let mut n = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(e, what))? {
        let meta = entry.and_then(|e| e.metadata()).map_err(|e| io_error(e, what))?;
        if meta.is_file() {
            n += meta.len();
        }
    }
    Ok(n)
}
