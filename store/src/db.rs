//! RocksDB: the key layout, the durable commit batch and recovery at open.
//!
//! Column family `default` (small values):
//! ```text
//! "!boot"                         u64 LE, bumped at every open
//! "M" matrix(16)                  MatrixInfo (protobuf)
//! "N" name                        matrix id (16)
//! "B" matrix(16) i(u32 BE) j(BE)  current version (16) of the block
//! "S" version(16)                 staged marker: version written, not committed
//! "O" key                         small object
//! "Q" bag 0x00 seq(u64 BE)        queue element: attempts (u32 LE) ++ payload
//! ```
//! Column family `blocks` (BlobDB, values in blob files so compaction never
//! rewrites multi-MiB blocks): version(16) -> block header ++ payload.
//!
//! A block write stages a new version and its marker without sync; the
//! top-level commit switches the pointer, deletes the marker and the old
//! version in one synced batch. A crash leaves staged versions whose
//! markers [`Db::open`] finds and deletes: never a torn block.
//!
//! Top-level commits go through one committer thread (group commit): it
//! takes every commit that queued while the previous group was syncing,
//! writes them as one synced batch and answers each. Concurrent commits
//! hold disjoint write locks and take distinct queue elements, so one batch
//! for several of them is the same as their batches one after another; a
//! commit is answered only after the sync that covers it returned. One
//! thread instead of RocksDB's own write group of blocking-pool threads
//! saves a thread hand-off and the writers' spin-waits per commit (about
//! 15% less CPU per task in `bench queue` on 2 cores).

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use store_client::StoreError;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::keys::{BlockKey, ObjKey, Tentative};

const BLOCKS: &str = "blocks";

pub(crate) struct Db {
    db: Arc<DB>,
    /// Queue of the group committer; `None` once dropped.
    commits: Option<mpsc::Sender<CommitJob>>,
    committer: Option<JoinHandle<()>>,
}

/// One top-level commit waiting for the group committer.
struct CommitJob {
    writes: Vec<(ObjKey, Tentative)>,
    queue: Vec<queue::Mutation>,
    done: oneshot::Sender<Result<(), StoreError>>,
}

impl Drop for Db {
    /// Stops the committer (it finishes the commits already queued) and
    /// waits for it, so RocksDB is closed when this returns and the
    /// directory can be opened again at once.
    fn drop(&mut self) {
        self.commits = None;
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

/// What [`Db::open`] found.
pub(crate) struct Recovered {
    pub(crate) boot: u64,
    pub(crate) queue: Vec<(String, u64, Vec<u8>, u32)>,
    pub(crate) n_garbage_versions: usize,
}

pub(crate) fn storage_error(e: rocksdb::Error) -> StoreError {
    let what = e.clone().into_string();
    match e.kind() {
        rocksdb::ErrorKind::Corruption => StoreError::Corrupt { what },
        _ if what.contains("No space left") || what.contains("ENOSPC") => StoreError::StorageFull { what },
        _ => StoreError::Storage { what },
    }
}

fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

impl Db {
    pub(crate) fn open(path: &Path, cache_mib: usize) -> Result<(Arc<Db>, Recovered), rocksdb::Error> {
        let cache = Cache::new_lru_cache(cache_mib.max(8) << 20)?;
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);

        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_block_based_table_factory(&table);
        // Commits from many clients queue behind one fsync; pipelining lets
        // the next group fill the memtable while the WAL syncs.
        db_opts.set_enable_pipelined_write(true);

        let mut blocks = Options::default();
        blocks.set_block_based_table_factory(&table);
        blocks.set_enable_blob_files(true);
        blocks.set_min_blob_size(0);
        blocks.set_blob_file_size(256 << 20);
        blocks.set_enable_blob_gc(true);
        blocks.set_blob_compression_type(rocksdb::DBCompressionType::None);
        blocks.set_write_buffer_size(128 << 20);

        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, Options::default()),
            ColumnFamilyDescriptor::new(BLOCKS, blocks),
        ];
        let raw = Arc::new(DB::open_cf_descriptors(&db_opts, path, cfs)?);
        let (tx, rx) = mpsc::channel();
        let for_committer = raw.clone();
        let committer = std::thread::Builder::new()
            .name("store-commit".into())
            .spawn(move || run_committer(&for_committer, rx))
            // Fails only when the process cannot make threads at all (as
            // `std::thread::spawn` would panic); the node could not run.
            .expect("cannot start the store's commit thread");
        let db = Arc::new(Db { db: raw, commits: Some(tx), committer: Some(committer) });
        let recovered = db.recover()?;
        Ok((db, recovered))
    }

    fn blocks(&self) -> &rocksdb::ColumnFamily {
        blocks_cf(&self.db)
    }

    fn recover(&self) -> Result<Recovered, rocksdb::Error> {
        let boot = self.db.get(b"!boot")?.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8]))) + 1;
        let mut batch = WriteBatch::default();
        batch.put(b"!boot", boot.to_le_bytes());
        let mut n_garbage_versions = 0;
        for item in self.db.prefix_iterator(b"S") {
            let (k, _) = item?;
            if !k.starts_with(b"S") {
                break;
            }
            batch.delete_cf(self.blocks(), &k[1..]);
            batch.delete(&k);
            n_garbage_versions += 1;
        }
        let mut queue = Vec::new();
        for item in self.db.prefix_iterator(b"Q") {
            let (k, v) = item?;
            if !k.starts_with(b"Q") {
                break;
            }
            if let (Some((bag, seq)), Some((attempts, payload))) = (parse_queue_key(&k), split_element(&v)) {
                queue.push((bag, seq, payload.to_vec(), attempts));
            }
        }
        self.db.write_opt(batch, &synced())?;
        Ok(Recovered { boot, queue, n_garbage_versions })
    }

    pub(crate) fn get_small(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(small_key(key)).map_err(storage_error)
    }

    pub(crate) fn scan_small(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let start = small_key(prefix);
        let mut out = Vec::new();
        for item in self.db.iterator(IteratorMode::From(&start, rocksdb::Direction::Forward)) {
            let (k, v) = item.map_err(storage_error)?;
            if !k.starts_with(&start) || out.len() >= limit {
                break;
            }
            out.push((String::from_utf8_lossy(&k[1..]).into_owned(), v.to_vec()));
        }
        Ok(out)
    }

    pub(crate) fn put_matrix(&self, id: Uuid, name: &str, record: &[u8]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        batch.put(matrix_key(id), record);
        batch.put(name_key(name), id.as_bytes());
        self.db.write_opt(batch, &synced()).map_err(storage_error)
    }

    pub(crate) fn matrix_records(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.prefix_iterator(b"M") {
            let (k, v) = item.map_err(storage_error)?;
            if !k.starts_with(b"M") {
                break;
            }
            out.push(v.to_vec());
        }
        Ok(out)
    }

    /// Deletes a matrix's record, name and every committed block version.
    pub(crate) fn delete_matrix(&self, id: Uuid, name: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        let prefix = [&b"B"[..], id.as_bytes()].concat();
        for item in self.db.prefix_iterator(&prefix) {
            let (k, v) = item.map_err(storage_error)?;
            if !k.starts_with(&prefix) {
                break;
            }
            batch.delete_cf(self.blocks(), &v);
            batch.delete(&k);
        }
        batch.delete(matrix_key(id));
        batch.delete(name_key(name));
        self.db.write_opt(batch, &synced()).map_err(storage_error)
    }

    /// The committed version of a block, if it was ever written.
    pub(crate) fn block_version(&self, key: &BlockKey) -> Result<Option<Uuid>, StoreError> {
        block_version(&self.db, key)
    }

    pub(crate) fn read_version(&self, version: Uuid) -> Result<Option<Vec<u8>>, StoreError> {
        // Every block carries its own crc32c, checked here on each get and
        // by the client after transfer: RocksDB's blob checksum would be a
        // third pass over 32 MiB, and a slow one (a tenth of the node's CPU
        // under a multiply).
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_verify_checksums(false);
        self.db.get_cf_opt(self.blocks(), version.as_bytes(), &opts).map_err(storage_error)
    }

    /// Writes a new block version and its staged marker, without sync: the
    /// commit's synced batch makes both durable (the WAL is one log).
    pub(crate) fn stage_version(&self, key: &BlockKey, version: Uuid, value: &[u8]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.blocks(), version.as_bytes(), value);
        batch.put(staged_key(version), key.pointer());
        self.db.write(batch).map_err(storage_error)
    }

    /// Drops staged versions of aborted or superseded writes.
    pub(crate) fn drop_staged(&self, versions: &[Uuid]) -> Result<(), StoreError> {
        if versions.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for v in versions {
            batch.delete_cf(self.blocks(), v.as_bytes());
            batch.delete(staged_key(*v));
        }
        self.db.write(batch).map_err(storage_error)
    }

    /// The top-level commit: every write of the action and every queue
    /// change, written with a synced batch by the group committer. When
    /// this returns Ok, it is on disk.
    pub(crate) async fn commit(&self, writes: Vec<(ObjKey, Tentative)>, queue: Vec<queue::Mutation>) -> Result<(), StoreError> {
        let stopped = || StoreError::ShuttingDown;
        let (done, answer) = oneshot::channel();
        let commits = self.commits.as_ref().ok_or_else(stopped)?;
        commits.send(CommitJob { writes, queue, done }).map_err(|_| stopped())?;
        answer.await.map_err(|_| StoreError::Storage { what: "the commit thread ended before this commit was written".into() })?
    }

    /// Persists queue changes made outside a commit (attempt counts and
    /// dead-letter moves of orphaned actions).
    pub(crate) fn apply_queue(&self, queue: &[queue::Mutation]) -> Result<(), StoreError> {
        if queue.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        queue_batch(&mut batch, queue);
        self.db.write_opt(batch, &synced()).map_err(storage_error)
    }

    /// Flushes memtables to SST and blob files, so a restart replays no WAL.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(storage_error)?;
        self.db.flush_cf(self.blocks()).map_err(storage_error)
    }

    /// Test hook: flips one payload byte of a block's committed version.
    pub(crate) fn corrupt_block(&self, key: &BlockKey) -> Result<(), StoreError> {
        let version = self.block_version(key)?.ok_or_else(|| StoreError::NotFound { what: format!("{key:?}") })?;
        let mut value = self.read_version(version)?.ok_or_else(|| StoreError::NotFound { what: format!("{key:?}") })?;
        let at = value.len() / 2 + store_client::block::HEADER_LEN / 2;
        value[at] ^= 0x5a;
        self.db.put_cf_opt(self.blocks(), version.as_bytes(), &value, &synced()).map_err(storage_error)
    }
}

fn blocks_cf(db: &DB) -> &rocksdb::ColumnFamily {
    db.cf_handle(BLOCKS).expect("opened with the blocks family")
}

fn block_version(db: &DB, key: &BlockKey) -> Result<Option<Uuid>, StoreError> {
    let v = db.get(key.pointer()).map_err(storage_error)?;
    v.map(|v| Uuid::from_slice(&v).map_err(|_| StoreError::Corrupt { what: format!("{key:?}: bad version pointer") }))
        .transpose()
}

/// The group committer: each round takes every queued commit, writes them
/// as one synced batch and answers each. Ends when [`Db`] is dropped.
fn run_committer(db: &DB, jobs: mpsc::Receiver<CommitJob>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        // Whatever queued while the last group synced goes in this one.
        group.extend(jobs.try_iter());
        let mut batch = WriteBatch::default();
        let mut waiting = Vec::with_capacity(group.len());
        for job in group {
            // A commit whose old block versions cannot be read fails alone,
            // before any of it is in the batch.
            match add_commit(db, &mut batch, &job.writes, &job.queue) {
                Ok(()) => waiting.push(job.done),
                Err(e) => {
                    let _ = job.done.send(Err(e));
                }
            }
        }
        if waiting.is_empty() {
            continue;
        }
        let result = db.write_opt(batch, &synced()).map_err(storage_error);
        for done in waiting {
            let _ = done.send(result.clone());
        }
    }
}

/// Adds one action's commit to `batch`: its writes (switching block
/// pointers, dropping the old versions and the staged markers) and its
/// queue changes. Reads everything it needs first, so on error nothing of
/// it was added.
fn add_commit(db: &DB, batch: &mut WriteBatch, writes: &[(ObjKey, Tentative)], queue: &[queue::Mutation]) -> Result<(), StoreError> {
    let mut old_versions = Vec::new();
    for (key, _) in writes {
        if let ObjKey::Block(b) = key {
            old_versions.push(block_version(db, b)?);
        }
    }
    let mut old_versions = old_versions.into_iter();
    for (key, t) in writes {
        match (key, t) {
            (ObjKey::Small(k), Tentative::Small(v)) => batch.put(small_key(k), v),
            (ObjKey::Small(k), Tentative::Deleted) => batch.delete(small_key(k)),
            (ObjKey::Block(b), Tentative::Block(version)) => {
                if let Some(old) = old_versions.next().flatten() {
                    batch.delete_cf(blocks_cf(db), old.as_bytes());
                }
                batch.put(b.pointer(), version.as_bytes());
                batch.delete(staged_key(*version));
            }
            (k, t) => unreachable!("tentative {t:?} recorded for {k:?}"),
        }
    }
    queue_batch(batch, queue);
    Ok(())
}

fn queue_batch(batch: &mut WriteBatch, queue: &[queue::Mutation]) {
    for m in queue {
        match m {
            queue::Mutation::Put { bag, seq, payload, attempts } => {
                let mut v = attempts.to_le_bytes().to_vec();
                v.extend_from_slice(payload);
                batch.put(queue_key(bag, *seq), v);
            }
            queue::Mutation::Delete { bag, seq } => batch.delete(queue_key(bag, *seq)),
        }
    }
}

fn small_key(key: &str) -> Vec<u8> {
    [&b"O"[..], key.as_bytes()].concat()
}

fn matrix_key(id: Uuid) -> Vec<u8> {
    [&b"M"[..], id.as_bytes()].concat()
}

fn name_key(name: &str) -> Vec<u8> {
    [&b"N"[..], name.as_bytes()].concat()
}

fn staged_key(version: Uuid) -> Vec<u8> {
    [&b"S"[..], version.as_bytes()].concat()
}

fn queue_key(bag: &str, seq: u64) -> Vec<u8> {
    [&b"Q"[..], bag.as_bytes(), &[0], &seq.to_be_bytes()].concat()
}

fn parse_queue_key(k: &[u8]) -> Option<(String, u64)> {
    let rest = &k[1..];
    let zero = rest.iter().position(|&b| b == 0)?;
    let seq = u64::from_be_bytes(rest.get(zero + 1..)?.try_into().ok()?);
    Some((String::from_utf8(rest[..zero].to_vec()).ok()?, seq))
}

fn split_element(v: &[u8]) -> Option<(u32, &[u8])> {
    Some((u32::from_le_bytes(v.get(..4)?.try_into().ok()?), &v[4..]))
}
