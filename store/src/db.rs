//! RocksDB: the key layout, the durable commit batch and recovery at open.
//!
//! Column family `default` (small values):
//! ```text
//! "!boot"                         u64 LE, bumped at every open
//! "M" matrix(16)                  MatrixInfo (protobuf)
//! "N" name                        matrix id (16)
//! "B" matrix(16) i(u32 BE) j(BE)  current version (16) of the block
//! "O" key                         small object
//! "Q" bag 0x00 seq(u64 BE)        queue element: attempts (u32 LE) ++ payload
//! "S" bag                         u64 LE: the bag's next element number,
//!                                 merged as the largest ever written
//! "U" seq(u64 BE)                 undo record of a commit whose versions
//!                                 were still syncing (`undo.rs`)
//! ```
//! Block versions are files, not values (see `files.rs` for why): a block
//! write stages a new version file; the top-level commit switches the
//! pointer in one synced batch (after syncing the files' directory), its
//! version synced before it or, for a put answered unsynced, beside it
//! under an undo record ([`Db::commit_beside`]), then recycles or removes
//! the replaced version's file. [`Db::open`] removes every
//! file no pointer names: staged versions of actions a crash cut off, and
//! replaced versions whose removal it interrupted. Never a torn block.
//! (The `blocks` column family held versions in BlobDB before; it stays
//! declared so such a directory still opens.)
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
//!
//! A lone commit still goes through the thread, though writing it on its
//! own task's thread (`block_in_place`) would save two wake-ups: that took
//! `bench queue` from 3744–4067 to 4173–4520 tasks/s with one client, but
//! from 20118–22220 to 15866–16994 with eight (a lent worker hands its
//! core to another thread, which a busy machine pays for in CPU).

use std::borrow::Cow;
use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, IteratorMode, Options, WriteBatch, DB};
use store_client::StoreError;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::disk::Disk;
use crate::files::BlockFiles;
use crate::keys::{BlockKey, ObjKey, Tentative};
use crate::objects::{ObjectsConfig, VersionObjects};
use crate::undo::{self, Undo};

pub(crate) const BLOCKS: &str = "blocks";

pub(crate) struct Db {
    db: Arc<DB>,
    /// RocksDB's block cache, kept to report its use.
    cache: Cache,
    cache_capacity: u64,
    files: Arc<BlockFiles>,
    /// Queue of the group committer; `None` once dropped.
    commits: Option<mpsc::Sender<CommitJob>>,
    committer: Option<JoinHandle<()>>,
    /// Refills the spare block files (see `files.rs`).
    spares: Option<JoinHandle<()>>,
    /// Undo records whose commits' versions are synced: deleted by the
    /// committer with its next batch, or on its own after [`SETTLE_AFTER`].
    settled: Arc<Mutex<Vec<u64>>>,
    /// Writes the node's batches, and stops its writes when one fails.
    writer: Writer,
    /// Where block versions are when they are objects of a pool
    /// (`objects.rs`) rather than `files`; and the collection's thread,
    /// stopped by dropping its sender.
    objects: Option<Arc<VersionObjects>>,
    collector: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

/// Writes batches through the disk. A synced batch that fails stops every
/// later write of the node until it restarts: its batch may be on the
/// disk or not (a failed WAL write or sync says nothing about what
/// landed), while the node's memory took it as failed, so the action
/// aborted and its elements went back to their bags. Another commit built
/// on that memory (the element done twice, a counter counted twice) could
/// not be undone. So the node fails stop, as databases do after a failed
/// fsync, and its restart settles the batch from the disk.
#[derive(Clone)]
struct Writer {
    db: Arc<DB>,
    files: Arc<BlockFiles>,
    disk: Arc<dyn Disk>,
    /// Why this node writes nothing more until it restarts; a watch, so
    /// that `master serve` can exit and be restarted.
    stopped: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl Writer {
    /// Writes `batch` synced, unless the disk is too full for RocksDB's
    /// log to take it safely ([`BlockFiles::room_for_batch`]: refused,
    /// and the node goes on); every synced write of the node goes through
    /// here.
    fn write_synced(&self, batch: WriteBatch, what: &str) -> Result<(), StoreError> {
        self.still_writing()?;
        self.files.room_for_batch()?;
        self.disk.write_batch(&self.db, batch, true).inspect_err(|e| self.stop(format!("{what} failed to write ({e})")))
    }

    /// Stops every later write until a restart.
    fn stop(&self, why: String) {
        tracing::error!("{why}: this node writes nothing more until it is restarted");
        self.stopped.send_if_modified(|stopped| {
            let first = stopped.is_none();
            stopped.get_or_insert(why);
            first
        });
    }

    /// `Err` once a failed write stopped this node's writes.
    fn still_writing(&self) -> Result<(), StoreError> {
        match &*self.stopped.borrow() {
            None => Ok(()),
            Some(why) => Err(StoreError::Storage { what: format!("this store node writes nothing more until it is restarted: {why}") }),
        }
    }
}

/// Longest an idle committer leaves settled undo records undeleted.
pub(crate) const SETTLE_AFTER: Duration = Duration::from_millis(200);

/// One top-level commit waiting for the group committer.
struct CommitJob {
    writes: Vec<(ObjKey, Tentative)>,
    queue: Vec<queue::Mutation>,
    /// Whether the batch must carry an undo record: the versions it
    /// names are being synced beside it ([`Db::commit_beside`]). If so,
    /// their write stamps, read before their syncs can start (a synced
    /// version's stamp is gone).
    undo: Option<Vec<(Uuid, u64)>>,
    done: oneshot::Sender<Result<Committed, StoreError>>,
}

/// A commit's batch, durable.
struct Committed {
    /// The block versions it replaced: recycled once its versions are
    /// durable too.
    replaced: Vec<Uuid>,
    /// Its undo record and the record's number, if it has one.
    undo: Option<(u64, Undo)>,
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
        if let Some((stop, t)) = self.collector.take() {
            drop(stop);
            let _ = t.join();
        }
        if let Some(objects) = &self.objects {
            objects.close();
        }
        self.files.stop_spares();
        if let Some(t) = self.spares.take() {
            let _ = t.join();
        }
    }
}

/// What [`Db::open`] found.
pub(crate) struct Recovered {
    pub(crate) boot: u64,
    /// Commits a crash cut off between their batch and their versions'
    /// syncs, and whose versions did not survive: undone.
    pub(crate) n_commits_undone: usize,
    pub(crate) queue: Vec<(String, u64, Vec<u8>, u32)>,
    /// Each bag's next element number (`queue::Mutation::NextSeq`).
    pub(crate) next_seqs: Vec<(String, u64)>,
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

impl Db {
    #[cfg(test)]
    pub(crate) fn open(path: &Path, cache_mib: usize, disk: Arc<dyn Disk>) -> Result<(Arc<Db>, Recovered), StoreError> {
        Db::open_with(path, cache_mib, disk, None)
    }

    /// Opens the store, its block versions in `objects` or, `None`, in
    /// its own files; a store is always reopened with its blocks where
    /// they were.
    pub(crate) fn open_with(
        path: &Path,
        cache_mib: usize,
        disk: Arc<dyn Disk>,
        objects: Option<&ObjectsConfig>,
    ) -> Result<(Arc<Db>, Recovered), StoreError> {
        let cache = Cache::new_lru_cache(cache_mib.max(8) << 20).map_err(storage_error)?;
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        // Small-object reads are mostly of keys that do not exist (a job's
        // failure flag, a task's done record): a bloom filter answers them
        // without reading a data block.
        table.set_bloom_filter(10.0, false);
        // Each column family takes its own options: without these, both
        // used RocksDB's default 8 MiB cache, not `--cache-mib`.
        let mut cf_opts = Options::default();
        cf_opts.set_block_based_table_factory(&table);
        cf_opts.set_merge_operator_associative("ftbag-largest-u64", largest_u64);

        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_block_based_table_factory(&table);
        // Commits from many clients queue behind one fsync; pipelining lets
        // the next group fill the memtable while the WAL syncs.
        db_opts.set_enable_pipelined_write(true);

        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, cf_opts.clone()),
            ColumnFamilyDescriptor::new(BLOCKS, cf_opts),
        ];
        let raw = Arc::new(DB::open_cf_descriptors(&db_opts, path, cfs).map_err(storage_error)?);
        let version_objects = match objects {
            Some(config) => Some(VersionObjects::open(config, objects_prefix(&raw, &disk)?)?),
            None => None,
        };
        check_backend(&raw, &disk, objects)?;
        let files = Arc::new(
            BlockFiles::open(path, disk.clone()).map_err(|e| crate::files::io_error(e, || "opening the blocks directory".into()))?,
        );
        files.check_format()?;
        let (tx, rx) = mpsc::channel();
        let settled = Arc::new(Mutex::new(Vec::new()));
        let writer = Writer { db: raw.clone(), files: files.clone(), disk, stopped: Arc::new(tokio::sync::watch::Sender::new(None)) };
        let (for_committer, settled_for_committer) = (writer.clone(), settled.clone());
        let committer = std::thread::Builder::new()
            .name("store-commit".into())
            .spawn(move || run_committer(&for_committer, &settled_for_committer, rx))
            // Fails only when the process cannot make threads at all (as
            // `std::thread::spawn` would panic); the node could not run.
            .expect("cannot start the store's commit thread");
        let mut db = Db {
            db: raw,
            cache,
            cache_capacity: (cache_mib.max(8) << 20) as u64,
            files,
            commits: Some(tx),
            committer: Some(committer),
            spares: None,
            settled,
            writer,
            objects: version_objects,
            collector: None,
        };
        let recovered = db.recover()?;
        if let (Some(objects), Some(config)) = (&db.objects, objects) {
            let (stop, stopped) = mpsc::channel();
            let for_collector = db.db.clone();
            let t =
                crate::objects::start_collector(objects.clone(), config.collect_every, move || committed_versions(&for_collector), stopped)
                    .map_err(|e| StoreError::Storage { what: format!("starting the object collection's thread: {e}") })?;
            db.collector = Some((stop, t));
        }
        let spares = db.files.start_spares().map_err(|e| crate::files::io_error(e, || "starting the spare block files' thread".into()))?;
        db.spares = Some(spares);
        Ok((Arc::new(db), recovered))
    }

    fn blocks(&self) -> &rocksdb::ColumnFamily {
        blocks_cf(&self.db)
    }

    fn recover(&self) -> Result<Recovered, StoreError> {
        let boot = self.db.get(b"!boot").map_err(storage_error)?.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8]))) + 1;
        let mut batch = WriteBatch::default();
        batch.put(b"!boot", boot.to_le_bytes());
        // Before the pointers and queues are read: an undone commit names
        // its old versions again and gives its elements back. Each record
        // goes with its own deletion, in one synced batch.
        let undone = undo::resolve(&self.db, &self.files, &mut batch)?;
        if undone.rolled_back > 0 {
            self.writer.write_synced(std::mem::take(&mut batch), "the recovery's undo")?;
            batch.put(b"!boot", boot.to_le_bytes());
        }
        // Staged markers of the BlobDB layout: those versions never committed.
        for item in self.db.prefix_iterator(b"S") {
            let (k, _) = item.map_err(storage_error)?;
            if !k.starts_with(b"S") {
                break;
            }
            batch.delete_cf(self.blocks(), &k[1..]);
            batch.delete(&k);
        }
        let committed = committed_versions(&self.db)?;
        let mut n_garbage_versions =
            self.files.sweep(&committed).map_err(|e| crate::files::io_error(e, || "sweeping uncommitted block versions".into()))?;
        if let Some(objects) = &self.objects {
            n_garbage_versions += objects.sweep(&committed)?;
        }
        self.files.refill()?;
        let mut queue = Vec::new();
        for item in self.db.prefix_iterator(b"Q") {
            let (k, v) = item.map_err(storage_error)?;
            if !k.starts_with(b"Q") {
                break;
            }
            if let (Some((bag, seq)), Some((attempts, payload))) = (parse_queue_key(&k), split_element(&v)) {
                queue.push((bag, seq, payload.to_vec(), attempts));
            }
        }
        let mut next_seqs = Vec::new();
        for item in self.db.prefix_iterator(b"S") {
            let (k, v) = item.map_err(storage_error)?;
            if !k.starts_with(b"S") {
                break;
            }
            if let (Ok(bag), Some(next)) = (std::str::from_utf8(&k[1..]), read_u64(&v)) {
                next_seqs.push((bag.to_owned(), next));
            }
        }
        self.writer.write_synced(batch, "the recovery's batch")?;
        Ok(Recovered { boot, n_commits_undone: undone.rolled_back, queue, next_seqs, n_garbage_versions })
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
        self.writer.write_synced(batch, "a matrix's record")
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
        self.writer.still_writing()?;
        let mut batch = WriteBatch::default();
        let mut versions = Vec::new();
        let prefix = [&b"B"[..], id.as_bytes()].concat();
        for item in self.db.prefix_iterator(&prefix) {
            let (k, v) = item.map_err(storage_error)?;
            if !k.starts_with(&prefix) {
                break;
            }
            versions.extend(Uuid::from_slice(&v).ok());
            batch.delete(&k);
        }
        batch.delete(matrix_key(id));
        batch.delete(name_key(name));
        self.writer.write_synced(batch, "a matrix's deletion")?;
        match &self.objects {
            Some(objects) => objects.drop_later(&versions),
            None => self.files.remove(&versions),
        }
        Ok(())
    }

    /// The committed version of a block, if it was ever written.
    pub(crate) fn block_version(&self, key: &BlockKey) -> Result<Option<Uuid>, StoreError> {
        block_version(&self.db, key)
    }

    /// Whether `version` is still `key`'s committed one.
    pub(crate) fn is_current(&self, key: &BlockKey, version: Uuid) -> Result<bool, StoreError> {
        Ok(block_version(&self.db, key)? == Some(version))
    }

    /// A version's stored form (checked by the caller: every block carries
    /// its own checksum); `None` if it is gone.
    pub(crate) fn read_version(&self, version: Uuid) -> Result<Option<Vec<u8>>, StoreError> {
        match &self.objects {
            Some(objects) => objects.read(version),
            None => self.files.read(version),
        }
    }

    /// Opens a version's file (its header unchecked); `None` if it is gone.
    pub(crate) fn open_version(&self, version: Uuid, what: &dyn Fn() -> String) -> Result<Option<Arc<std::fs::File>>, StoreError> {
        if let Some(objects) = &self.objects {
            return Err(objects_not_files(objects, &what()));
        }
        self.files.open_version(version, what)
    }

    /// Where versions are when they are objects.
    pub(crate) fn objects(&self) -> Option<&Arc<VersionObjects>> {
        self.objects.as_ref()
    }

    /// Whether `bytes` more of blocks fit: on the node's disk, or, for
    /// objects, left to the cluster to refuse when full.
    pub(crate) fn room_for(&self, bytes: u64, what: &str) -> Result<(), StoreError> {
        match &self.objects {
            Some(_) => Ok(()),
            None => self.files.room_for(bytes, what),
        }
    }

    /// Writes a new block version, synced; returns its id. A commit makes
    /// it current.
    pub(crate) fn stage_version(&self, value: &[u8]) -> Result<Uuid, StoreError> {
        match &self.objects {
            Some(objects) => objects.put(value),
            None => self.files.write(value),
        }
    }

    /// The version files, for a put that writes its version in pieces as
    /// they arrive ([`BlockFiles::stage`]).
    /// RocksDB's block cache: bytes in use and its capacity.
    pub(crate) fn cache_use(&self) -> (u64, u64) {
        (self.cache.get_usage() as u64, self.cache_capacity)
    }

    /// Bytes of RocksDB's table files, all column families.
    pub(crate) fn sst_bytes(&self) -> u64 {
        let cf = |name: &str| {
            self.db.cf_handle(name).and_then(|cf| self.db.property_int_value_cf(&cf, "rocksdb.total-sst-files-size").ok().flatten())
        };
        cf(rocksdb::DEFAULT_COLUMN_FAMILY_NAME).unwrap_or(0) + cf(BLOCKS).unwrap_or(0)
    }

    pub(crate) fn files(&self) -> &Arc<BlockFiles> {
        &self.files
    }

    #[cfg(test)]
    pub(crate) fn raw(&self) -> &DB {
        &self.db
    }

    /// Drops staged versions of aborted or superseded writes (recycled).
    pub(crate) fn drop_staged(&self, versions: &[Uuid]) {
        match &self.objects {
            Some(objects) => objects.drop_later(versions),
            None => self.files.retire(versions),
        }
    }

    /// After a durable commit: what it named is no longer staged, what it
    /// replaced goes.
    fn after_commit(&self, staged: &[Uuid], replaced: &[Uuid]) {
        match &self.objects {
            Some(objects) => {
                objects.forget(staged);
                objects.drop_later(replaced);
            }
            None => self.files.retire(replaced),
        }
    }

    /// The top-level commit: every write of the action and every queue
    /// change, written with a synced batch by the group committer. Every
    /// version it names must be synced. When this returns Ok, it is on disk.
    pub(crate) async fn commit(&self, writes: Vec<(ObjKey, Tentative)>, queue: Vec<queue::Mutation>) -> Result<(), StoreError> {
        let staged: Vec<Uuid> = writes.iter().filter_map(|(_, t)| t.staged_version()).collect();
        let committed = self.queue_commit(writes, queue, false)?.await?;
        self.after_commit(&staged, &committed.replaced);
        Ok(())
    }

    /// The top-level commit of an action whose versions are not all
    /// synced yet: its batch (with an undo record, see `undo.rs`) is
    /// written while `sync_versions` syncs them. Ok once both are
    /// durable. If the syncs fail, the batch is undone before this
    /// returns their error.
    pub(crate) async fn commit_beside(
        &self,
        writes: Vec<(ObjKey, Tentative)>,
        queue: Vec<queue::Mutation>,
        sync_versions: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        // Queued before the sync starts, so that the two flushes overlap.
        let staged: Vec<Uuid> = writes.iter().filter_map(|(_, t)| t.staged_version()).collect();
        let batch = self.queue_commit(writes, queue, true)?;
        let (committed, synced) = tokio::join!(batch, sync_versions);
        let committed = committed?;
        let (seq, undo) = committed.undo.expect("a commit queued with an undo record has one");
        if let Err(e) = synced {
            let mut batch = WriteBatch::default();
            undo.roll_back(seq, &mut batch);
            // Should the undo fail too, the writer stops the node's
            // writes; the record stays, and the next open checks the
            // versions and undoes the commit if one did not reach the disk,
            // or keeps it.
            let _ = self.writer.write_synced(batch, &format!("the undo of a commit whose block versions failed to sync ({e})"));
            return Err(e);
        }
        self.after_commit(&staged, &committed.replaced);
        // Deleted by the committer, off this commit's path: a write of its
        // own here would queue, with two writers, behind the other's synced
        // batch in RocksDB's write thread (one fdatasync, about 0.16 ms
        // here). One writer saw no difference either way (b = 256
        // overwrites, 946-955 MiB/s against 923-991).
        self.settled.lock().unwrap_or_else(|e| e.into_inner()).push(seq);
        Ok(())
    }

    /// Changes to `Some(why)` when a failed write stops this node's
    /// writes ([`Writer`]).
    pub(crate) fn writes_stopped(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.writer.stopped.subscribe()
    }

    /// Hands a commit to the committer; the future answers when its batch
    /// is durable.
    fn queue_commit(
        &self,
        writes: Vec<(ObjKey, Tentative)>,
        queue: Vec<queue::Mutation>,
        undo: bool,
    ) -> Result<impl Future<Output = Result<Committed, StoreError>>, StoreError> {
        self.writer.still_writing()?;
        let stopped = || StoreError::ShuttingDown;
        let (done, answer) = oneshot::channel();
        let commits = self.commits.as_ref().ok_or_else(stopped)?;
        let undo = undo.then(|| {
            let versions = writes.iter().filter_map(|(_, t)| t.staged_version());
            versions.map(|v| (v, self.files.unsynced_stamp(v).unwrap_or(0))).collect()
        });
        commits.send(CommitJob { writes, queue, undo, done }).map_err(|_| stopped())?;
        Ok(async {
            answer.await.map_err(|_| StoreError::Storage { what: "the commit thread ended before this commit was written".into() })?
        })
    }

    /// Persists queue changes made outside a commit (attempt counts and
    /// dead-letter moves of orphaned actions).
    pub(crate) fn apply_queue(&self, queue: &[queue::Mutation]) -> Result<(), StoreError> {
        if queue.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        queue_batch(&mut batch, queue);
        self.writer.write_synced(batch, "queue changes")
    }

    /// Writes a consistent copy of the store into `dir` (`backup.rs`).
    pub(crate) fn backup(&self, dir: &Path) -> Result<crate::backup::BackupReport, StoreError> {
        if let Some(objects) = &self.objects {
            return Err(objects_not_files(objects, "a backup of the node's block files"));
        }
        crate::backup::backup(&self.db, &self.files, dir)
    }

    /// Flushes memtables to SST and blob files, so a restart replays no WAL.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(storage_error)?;
        self.db.flush_cf(self.blocks()).map_err(storage_error)
    }

    /// Test hook: flips one payload byte of a block's committed version.
    pub(crate) fn corrupt_block(&self, key: &BlockKey) -> Result<(), StoreError> {
        let version = self.block_version(key)?.ok_or_else(|| StoreError::NotFound { what: format!("{key:?}") })?;
        let value = self.read_version(version)?.ok_or_else(|| StoreError::NotFound { what: format!("{key:?}") })?;
        if let Some(objects) = &self.objects {
            return Err(objects_not_files(objects, "corrupting a block's file"));
        }
        self.files.corrupt(version, value.len() / 2 + store_client::block::HEADER_LEN / 2)
    }
}

/// Every version a pointer names.
fn committed_versions(db: &DB) -> Result<HashSet<Uuid>, StoreError> {
    let mut committed = HashSet::new();
    for item in db.prefix_iterator(b"B") {
        let (k, v) = item.map_err(storage_error)?;
        if !k.starts_with(b"B") {
            break;
        }
        if let Ok(v) = Uuid::from_slice(&v) {
            committed.insert(v);
        }
    }
    Ok(committed)
}

fn objects_not_files(objects: &VersionObjects, what: &str) -> StoreError {
    StoreError::InvalidArgument {
        what: format!(
            "{what}: this node keeps its blocks as objects in pool {} (prefix {}), not in files",
            objects.pool(),
            objects.prefix()
        ),
    }
}

/// This store's prefix in a pool: its own id, made at the first open with
/// objects, so that stores sharing a pool never touch each other's.
fn objects_prefix(db: &DB, disk: &Arc<dyn Disk>) -> Result<String, StoreError> {
    let id = match db.get(b"!id").map_err(storage_error)?.and_then(|v| Uuid::from_slice(&v).ok()) {
        Some(id) => id,
        None => {
            let id = Uuid::new_v4();
            let mut batch = WriteBatch::default();
            batch.put(b"!id", id.as_bytes());
            disk.write_batch(db, batch, true)?;
            id
        }
    };
    Ok(format!("ftbag/{}/", id.simple()))
}

/// Refuses to open a store with its blocks elsewhere than where its
/// pointers say (files, or a pool); records where at the first open.
/// A store of before the record, or one without blocks, is of files.
fn check_backend(db: &DB, disk: &Arc<dyn Disk>, objects: Option<&ObjectsConfig>) -> Result<(), StoreError> {
    let wanted = crate::objects::backend_record(objects);
    let has_blocks = db.prefix_iterator(b"B").next().transpose().map_err(storage_error)?.is_some_and(|(k, _)| k.starts_with(b"B"));
    let recorded = match db.get(b"!blocks").map_err(storage_error)? {
        Some(v) => Some(String::from_utf8_lossy(&v).into_owned()),
        None if has_blocks => Some(crate::objects::backend_record(None)),
        None => None,
    };
    match recorded {
        Some(r) if r != wanted => Err(StoreError::InvalidArgument {
            what: format!("this store keeps its blocks as {r}, not as {wanted}: start it the way it was made (--blocks)"),
        }),
        Some(_) => Ok(()),
        None => {
            let mut batch = WriteBatch::default();
            batch.put(b"!blocks", wanted.as_bytes());
            disk.write_batch(db, batch, true)
        }
    }
}

fn blocks_cf(db: &DB) -> &rocksdb::ColumnFamily {
    db.cf_handle(BLOCKS).expect("opened with the blocks family")
}

fn block_version(db: &DB, key: &BlockKey) -> Result<Option<Uuid>, StoreError> {
    let v = db.get(key.pointer()).map_err(storage_error)?;
    v.map(|v| Uuid::from_slice(&v).map_err(|_| StoreError::Corrupt { what: format!("{key:?}: bad version pointer") })).transpose()
}

/// The group committer: each round takes every queued commit, writes them
/// as one synced batch and answers each. Ends when [`Db`] is dropped.
///
/// It also deletes the settled undo records (`Db::commit_beside`): in its
/// next batch, or when it has had no commit for [`SETTLE_AFTER`], and as
/// it ends. Those deletes are not synced: they survive the process, and a
/// power cut that loses one leaves a record whose versions are synced,
/// which the next open checks and deletes.
fn run_committer(w: &Writer, settled: &Mutex<Vec<u64>>, jobs: mpsc::Receiver<CommitJob>) {
    let take_settled = || std::mem::take(&mut *settled.lock().unwrap_or_else(|e| e.into_inner()));
    let delete_settled = |seqs: Vec<u64>| {
        if seqs.is_empty() {
            return;
        }
        let mut batch = WriteBatch::default();
        seqs.iter().for_each(|&seq| batch.delete(undo::key(seq)));
        if let Err(e) = w.disk.write_batch(&w.db, batch, false) {
            tracing::warn!("cannot delete settled undo records (the next open checks them): {e}");
        }
    };
    // Undo records are settled at every open, so numbers restart there.
    let mut next_undo = 0u64;
    loop {
        let first = match jobs.recv_timeout(SETTLE_AFTER) {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                delete_settled(take_settled());
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                delete_settled(take_settled());
                return;
            }
        };
        let mut group = vec![first];
        // Whatever queued while the last group synced goes in this one.
        group.extend(jobs.try_iter());
        let mut batch = WriteBatch::default();
        let mut waiting = Vec::with_capacity(group.len());
        for job in group {
            // A commit whose old values cannot be read fails alone,
            // before any of it is in the batch.
            match add_commit(&w.db, &mut batch, &job) {
                Ok((replaced, undo)) => {
                    let undo = undo.map(|undo| {
                        next_undo += 1;
                        batch.put(undo::key(next_undo), undo.encode());
                        (next_undo, undo)
                    });
                    waiting.push((job.done, Committed { replaced, undo }));
                }
                Err(e) => {
                    let _ = job.done.send(Err(e));
                }
            }
        }
        if waiting.is_empty() {
            continue;
        }
        take_settled().iter().for_each(|&seq| batch.delete(undo::key(seq)));
        // The new versions' directory entries before the pointers to them.
        let result = w.files.sync_dir_if_needed().and_then(|()| w.write_synced(batch, "a commit's batch"));
        for (done, committed) in waiting {
            let _ = done.send(result.clone().map(|()| committed));
        }
    }
}

/// Adds one action's commit to `batch`: its writes (switching block
/// pointers) and its queue changes; returns the versions it replaces, to
/// recycle once the commit is durable, and with `job.undo` its undo
/// record. Reads everything it needs first, so on error nothing of it was
/// added.
fn add_commit(db: &DB, batch: &mut WriteBatch, job: &CommitJob) -> Result<(Vec<Uuid>, Option<Undo>), StoreError> {
    let mut replaced = Vec::new();
    let mut undo = job.undo.as_ref().map(|_| Undo::default());
    let mut changes = Vec::with_capacity(job.writes.len() + job.queue.len());
    for (key, t) in &job.writes {
        changes.push(match (key, t) {
            (ObjKey::Small(k), Tentative::Small(v)) => Change { key: small_key(k), value: Some(Cow::Borrowed(v)), before: None },
            (ObjKey::Small(k), Tentative::Deleted) => Change { key: small_key(k), value: None, before: None },
            (ObjKey::Block(b), Tentative::Block(version)) => {
                let old = block_version(db, b)?;
                replaced.extend(old);
                if let Some(undo) = &mut undo {
                    let mut stamps = job.undo.iter().flatten();
                    let stamp = stamps.find(|(v, _)| v == version).map_or(0, |(_, stamp)| *stamp);
                    undo.versions.push((b.pointer(), *version, stamp));
                }
                let before = undo.is_some().then(|| old.map(|v| v.as_bytes().to_vec()));
                Change { key: b.pointer(), value: Some(Cow::Borrowed(version.as_bytes())), before }
            }
            (k, t) => unreachable!("tentative {t:?} recorded for {k:?}"),
        });
    }
    changes.extend(queue_changes(&job.queue).map(|(key, value)| Change { key, value: value.map(Cow::Owned), before: None }));
    if let Some(undo) = &mut undo {
        for c in &mut changes {
            let before = match c.before.take() {
                Some(before) => before,
                None => db.get(&c.key).map_err(storage_error)?,
            };
            undo.before.push((c.key.clone(), before));
        }
    }
    for c in changes {
        put_or_delete(batch, c.key, c.value);
    }
    // Outside the undo record: a next position only grows, and one left
    // raised by an undone commit only skips numbers.
    merge_next_seqs(batch, &job.queue);
    Ok((replaced, undo))
}

/// A key a commit's batch changes.
struct Change<'a> {
    key: Vec<u8>,
    /// Its new value, borrowed from the commit where it can be; `None`:
    /// deleted.
    value: Option<Cow<'a, [u8]>>,
    /// Its old value for the undo record, where it was read anyway (a
    /// block pointer's, to recycle the version it replaces); the record
    /// reads the others.
    before: Option<Option<Vec<u8>>>,
}

fn queue_batch(batch: &mut WriteBatch, queue: &[queue::Mutation]) {
    for (k, v) in queue_changes(queue) {
        put_or_delete(batch, k, v);
    }
    merge_next_seqs(batch, queue);
}

/// Each bag's next element number, merged so that the largest written
/// stays whatever order concurrent commits' batches land in.
fn merge_next_seqs(batch: &mut WriteBatch, queue: &[queue::Mutation]) {
    for m in queue {
        if let queue::Mutation::NextSeq { bag, next } = m {
            batch.merge([&b"S"[..], bag.as_bytes()].concat(), next.to_le_bytes());
        }
    }
}

/// The merge of `S` keys: the largest u64 of the value and the operands.
fn largest_u64(_key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands) -> Option<Vec<u8>> {
    let largest = existing.into_iter().chain(operands).filter_map(read_u64).max()?;
    Some(largest.to_le_bytes().to_vec())
}

fn read_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(v.get(..8)?.try_into().ok()?))
}

pub(crate) fn put_or_delete(batch: &mut WriteBatch, key: impl AsRef<[u8]>, value: Option<impl AsRef<[u8]>>) {
    match value {
        Some(v) => batch.put(key, v),
        None => batch.delete(key),
    }
}

/// Each queue change as the key it writes and its new value (`None`: the
/// key is deleted); next positions are merged instead.
fn queue_changes(queue: &[queue::Mutation]) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> + '_ {
    queue.iter().filter_map(|m| match m {
        queue::Mutation::Put { bag, seq, payload, attempts } => {
            let mut v = attempts.to_le_bytes().to_vec();
            v.extend_from_slice(payload);
            Some((queue_key(bag, *seq), Some(v)))
        }
        queue::Mutation::Delete { bag, seq } => Some((queue_key(bag, *seq), None)),
        // Merged, not put ([`merge_next_seqs`]).
        queue::Mutation::NextSeq { .. } => None,
    })
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
