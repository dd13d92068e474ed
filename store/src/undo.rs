//! Undo records: what lets a commit's synced batch and the syncs of the
//! block versions it names run side by side.
//!
//! A commit whose versions were answered unsynced (`BlockFiles::sync_later`)
//! used to sync them first and write its batch after: two device flushes
//! one after the other (b = 256 on this VM: 125 µs, then 162 µs). Now the
//! committer writes the batch while the commit's own worker syncs the
//! versions. A crash between the two can leave a durable pointer to a
//! version whose data never reached the disk; the commit was not
//! answered yet, so it may be lost, but only whole. So the batch carries,
//! under `"U" seq`, every key it changes with the value it had before and
//! the versions it names. The record is deleted once the versions are
//! synced (by the committer, with its next batch or when idle); at open, [`resolve`] checks the versions of every
//! record left, and puts the old values back for a record whose version is
//! damaged or not this commit's write (its header's write stamp, kept in
//! the record, differs: a recycled file whose new data never reached the
//! disk still holds an older, whole block) and still current.
//!
//! Why a damaged version that is no longer current is no reason to roll
//! back: a later commit replaced it, and that commit took the block's lock
//! after this one was answered, which is after its versions were synced.
//! (The later batch also deletes the record, so this is a second guard.)

use rocksdb::{WriteBatch, DB};
use store_client::{block, StoreError};
use uuid::Uuid;

use crate::db::{put_or_delete, storage_error};
use crate::files::BlockFiles;

/// The records' key prefix.
pub(crate) const PREFIX: &[u8] = b"U";

pub(crate) fn key(seq: u64) -> Vec<u8> {
    [PREFIX, &seq.to_be_bytes()].concat()
}

/// What one commit changed, to put back if its versions did not survive.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Undo {
    /// Every key the commit's batch puts or deletes, with its value before
    /// (`None`: it did not exist).
    pub(crate) before: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The versions the commit names, each with its block's pointer key
    /// and the stamp its put wrote in its header (0: synced at its put,
    /// so nothing to check).
    pub(crate) versions: Vec<(Vec<u8>, Uuid, u64)>,
}

impl Undo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let bytes = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        };
        out.extend_from_slice(&(self.before.len() as u32).to_le_bytes());
        for (k, v) in &self.before {
            bytes(&mut out, k);
            match v {
                Some(v) => {
                    out.push(1);
                    bytes(&mut out, v);
                }
                None => out.push(0),
            }
        }
        out.extend_from_slice(&(self.versions.len() as u32).to_le_bytes());
        for (k, v, stamp) in &self.versions {
            bytes(&mut out, k);
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(&stamp.to_le_bytes());
        }
        out
    }

    /// `None` for anything [`Undo::encode`] did not write. A record
    /// written before versions carried stamps decodes with stamps 0.
    pub(crate) fn decode(b: &[u8]) -> Option<Undo> {
        Undo::decode_with(b, true).or_else(|| Undo::decode_with(b, false))
    }

    fn decode_with(mut b: &[u8], stamps: bool) -> Option<Undo> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, rest) = (b.get(..n)?, b.get(n..)?);
            *b = rest;
            Some(head)
        }
        fn count(b: &mut &[u8]) -> Option<usize> {
            Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize)
        }
        fn bytes(b: &mut &[u8]) -> Option<Vec<u8>> {
            let n = count(b)?;
            Some(take(b, n)?.to_vec())
        }
        let mut undo = Undo::default();
        for _ in 0..count(&mut b)? {
            let k = bytes(&mut b)?;
            let v = match take(&mut b, 1)?[0] {
                0 => None,
                1 => Some(bytes(&mut b)?),
                _ => return None,
            };
            undo.before.push((k, v));
        }
        for _ in 0..count(&mut b)? {
            let k = bytes(&mut b)?;
            let version = Uuid::from_slice(take(&mut b, 16)?).ok()?;
            let stamp = if stamps { u64::from_le_bytes(take(&mut b, 8)?.try_into().ok()?) } else { 0 };
            undo.versions.push((k, version, stamp));
        }
        b.is_empty().then_some(undo)
    }

    /// Adds to `batch` the writes that put every key back as it was, and
    /// the record's own deletion.
    pub(crate) fn roll_back(&self, seq: u64, batch: &mut WriteBatch) {
        for (k, v) in &self.before {
            put_or_delete(batch, k, v.as_ref());
        }
        batch.delete(key(seq));
    }
}

/// What [`resolve`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// Records whose versions were all intact (or replaced since).
    pub(crate) kept: usize,
    /// Records whose commits were undone.
    pub(crate) rolled_back: usize,
}

/// At open, before anything reads pointers or queues: settles every undo
/// record left by a crash, in one synced batch written by the caller.
pub(crate) fn resolve(db: &DB, files: &BlockFiles, batch: &mut WriteBatch) -> Result<Resolved, StoreError> {
    let mut resolved = Resolved::default();
    for item in db.prefix_iterator(PREFIX) {
        let (k, v) = item.map_err(storage_error)?;
        if !k.starts_with(PREFIX) {
            break;
        }
        let seq = k.get(1..9).and_then(|s| s.try_into().ok()).map(u64::from_be_bytes);
        let (Some(seq), Some(undo)) = (seq, Undo::decode(&v)) else {
            return Err(StoreError::Corrupt { what: format!("undo record {k:?} cannot be read") });
        };
        if lost_a_current_version(db, files, &undo)? {
            tracing::warn!(seq, "a commit's block version did not survive the crash: the commit is undone");
            undo.roll_back(seq, batch);
            resolved.rolled_back += 1;
        } else {
            batch.delete(&k);
            resolved.kept += 1;
        }
    }
    Ok(resolved)
}

fn lost_a_current_version(db: &DB, files: &BlockFiles, undo: &Undo) -> Result<bool, StoreError> {
    for (pointer, version, stamp) in &undo.versions {
        let current = db.get(pointer).map_err(storage_error)?;
        if current.as_deref() != Some(version.as_bytes()) {
            continue;
        }
        // Whole, and the commit's own write: a recycled version's file
        // whose new data never reached the disk still holds an older
        // block, whole but with that write's stamp.
        let ours = |value: &[u8]| *stamp == 0 || block::stamp(value) == Some(*stamp);
        let intact = files.read(*version)?.is_some_and(|value| block::decode(&value, &|| String::new()).is_ok() && ours(&value));
        if !intact {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::db::Db;
    use crate::keys::{BlockKey, ObjKey, Tentative};
    use std::sync::Arc;
    use store_client::block::BlockHeader;

    const BAG: &str = "bag";

    fn block_key() -> BlockKey {
        BlockKey { matrix: Uuid::from_u128(7), i: 0, j: 1 }
    }

    /// The stored form of a 4×4 block of `fill`, with `stamp`.
    pub(crate) fn stored_block(fill: f64, stamp: u64) -> Vec<u8> {
        let payload: Vec<u8> = [fill; 16].iter().flat_map(|x| x.to_le_bytes()).collect();
        let header = BlockHeader { rows: 4, cols: 4, checksum: block::checksum(&payload) };
        [&header.encode_stamped(stamp)[..], &payload].concat()
    }

    /// A version of a 4×4 block of `fill`, written and left unsynced as a
    /// data-plane put leaves it.
    fn staged_block(db: &Db, fill: f64) -> Uuid {
        let staging = db.files().stage(stored_block(fill, 0).len() as u64).unwrap();
        staging.write_unsynced_at(&stored_block(fill, staging.stamp()), 0).unwrap();
        db.files().sync_later(staging).unwrap()
    }

    /// Commits block (0, 1) = `fill`, the flag = `flag`, and the removal of
    /// queue element `seq`, its version synced beside the batch by
    /// `sync_versions`.
    async fn commit_beside(
        db: &Db,
        fill: f64,
        flag: &str,
        seq: u64,
        sync_versions: impl std::future::Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let version = staged_block(db, fill);
        let writes =
            vec![(ObjKey::Block(block_key()), Tentative::Block(version)), (ObjKey::Small("flag".into()), Tentative::Small(flag.into()))];
        db.commit_beside(writes, vec![queue::Mutation::Delete { bag: BAG.into(), seq }], sync_versions).await
    }

    /// A store with block (0, 1) = 1.0, the flag "old" and queue elements
    /// 1 to 3, all committed the ordinary way (versions synced first).
    async fn committed_start(dir: &std::path::Path) -> Arc<Db> {
        committed_start_on(dir, Arc::new(crate::disk::RealDisk)).await
    }

    async fn committed_start_on(dir: &std::path::Path, disk: Arc<dyn crate::disk::Disk>) -> Arc<Db> {
        let (db, _) = Db::open(dir, 8, disk).unwrap();
        let version = staged_block(&db, 1.0);
        db.files().sync_staged(&[version]).unwrap();
        let writes = vec![
            (ObjKey::Block(block_key()), Tentative::Block(version)),
            (ObjKey::Small("flag".into()), Tentative::Small(b"old".to_vec())),
        ];
        let queue = (1..=3).map(|seq| queue::Mutation::Put { bag: BAG.into(), seq, payload: vec![seq as u8], attempts: 0 }).collect();
        db.commit(writes, queue).await.unwrap();
        db
    }

    /// The fill of a stored 4×4 block ([`stored_block`]), checked whole.
    pub(crate) fn fill_of(value: &[u8]) -> f64 {
        let (_, payload) = block::decode(value, &|| "the block".into()).expect("the block is intact");
        f64::from_le_bytes(payload[..8].try_into().unwrap())
    }

    fn block_fill(db: &Db) -> f64 {
        let version = db.block_version(&block_key()).unwrap().expect("the block exists");
        fill_of(&db.read_version(version).unwrap().expect("its version's file exists"))
    }

    fn undo_records(db: &Db) -> usize {
        db.raw().prefix_iterator(PREFIX).filter(|item| item.as_ref().is_ok_and(|(k, _)| k.starts_with(PREFIX))).count()
    }

    /// What became of a cut-off commit's versions.
    #[derive(Clone, Copy)]
    enum Versions {
        /// They reached the disk.
        Synced,
        /// Part of each did (a byte is wrong).
        Torn,
        /// None of the put did: each file holds the older block it held
        /// as a recycled version (a whole block, with another stamp).
        Lost,
    }

    /// Runs a commit whose node "dies" while its versions sync: the sync
    /// waits for the durable batch, then leaves the versions as `versions`
    /// says (a power cut may lose them) and never returns, so the commit
    /// is never answered.
    async fn cut_off_commit(db: &Arc<Db>, fill: f64, seq: u64, versions: Versions) {
        let (files, raw) = (db.files().clone(), db.clone());
        let (done, died) = tokio::sync::oneshot::channel();
        let dying = async move {
            while undo_records(&raw) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let unsynced = files.unsynced_versions();
            match versions {
                Versions::Synced => files.sync_staged(&unsynced).unwrap(),
                Versions::Torn => unsynced.iter().for_each(|&v| files.corrupt(v, block::HEADER_LEN + 3).unwrap()),
                Versions::Lost => unsynced.iter().for_each(|&v| files.put_back(v, &stored_block(-1.0, 0x01d))),
            }
            let _ = done.send(());
            std::future::pending().await
        };
        tokio::select! {
            answer = commit_beside(db, fill, "new", seq, dying) => panic!("a commit whose syncs never returned was answered: {answer:?}"),
            _ = died => {}
        }
    }

    fn queue_seqs(recovered: &crate::db::Recovered) -> Vec<u64> {
        recovered.queue.iter().map(|(_, seq, _, _)| *seq).collect()
    }

    /// A fresh store, one commit cut off ([`cut_off_commit`]), the store
    /// reopened: every undo record must be settled by the open.
    async fn cut_off_and_reopened(versions: Versions) -> (tempfile::TempDir, Arc<Db>, crate::db::Recovered) {
        let dir = tempfile::tempdir().unwrap();
        let db = committed_start(dir.path()).await;
        cut_off_commit(&db, 2.0, 1, versions).await;
        assert_eq!(undo_records(&db), 1, "the cut-off commit's record is there");
        drop(db);
        let (db, recovered) = Db::open(dir.path(), 8, Arc::new(crate::disk::RealDisk)).unwrap();
        assert_eq!(undo_records(&db), 0, "settled at open");
        (dir, db, recovered)
    }

    /// After an open: the commits it undid, block (0, 1)'s fill, the flag,
    /// the queue's elements.
    fn state(db: &Db, recovered: &crate::db::Recovered) -> (usize, f64, Option<Vec<u8>>, Vec<u64>) {
        (recovered.n_commits_undone, block_fill(db), db.get_small("flag").unwrap(), queue_seqs(recovered))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_that_lost_a_committed_version_undoes_the_whole_commit() {
        let (_dir, db, recovered) = cut_off_and_reopened(Versions::Torn).await;
        // The block is its old version again, the small write went with it,
        // and the dequeued element is back.
        assert_eq!(state(&db, &recovered), (1, 1.0, Some(b"old".to_vec()), vec![1, 2, 3]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_that_lost_a_whole_put_to_a_recycled_file_undoes_the_commit() {
        // The file holds an older block that passes its checksum (-1.0):
        // only its stamp tells it from the commit's.
        let (_dir, db, recovered) = cut_off_and_reopened(Versions::Lost).await;
        assert_eq!(state(&db, &recovered), (1, 1.0, Some(b"old".to_vec()), vec![1, 2, 3]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_after_the_versions_reached_the_disk_keeps_the_commit() {
        let (_dir, db, recovered) = cut_off_and_reopened(Versions::Synced).await;
        assert_eq!(state(&db, &recovered), (0, 2.0, Some(b"new".to_vec()), vec![2, 3]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_version_sync_undoes_the_commit_at_once_and_settled_records_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let db = committed_start(dir.path()).await;
        let failed = async { Err(StoreError::Storage { what: "injected: fdatasync failed".into() }) };
        let e = commit_beside(&db, 2.0, "new", 1, failed).await.unwrap_err();
        assert!(matches!(e, StoreError::Storage { .. }), "{e:?}");
        assert_eq!(block_fill(&db), 1.0);
        assert_eq!(db.get_small("flag").unwrap().as_deref(), Some(&b"old"[..]));
        assert_eq!(undo_records(&db), 0, "the undo deletes its record");

        let files = db.files().clone();
        commit_beside(&db, 3.0, "newer", 2, async { files.sync_staged(&files.unsynced_versions()) }).await.unwrap();
        db.commit(vec![(ObjKey::Small("other".into()), Tentative::Small(b"x".to_vec()))], Vec::new()).await.unwrap();
        assert_eq!(undo_records(&db), 0, "the next batch deleted the settled record");
        // With no commit after it, the idle committer deletes it.
        commit_beside(&db, 4.0, "newest", 3, async { files.sync_staged(&files.unsynced_versions()) }).await.unwrap();
        let deadline = std::time::Instant::now() + 50 * crate::db::SETTLE_AFTER;
        while undo_records(&db) > 0 {
            assert!(std::time::Instant::now() < deadline, "a settled record outlived an idle committer");
            tokio::time::sleep(crate::db::SETTLE_AFTER / 4).await;
        }
        drop(db);
        let (db, recovered) = Db::open(dir.path(), 8, Arc::new(crate::disk::RealDisk)).unwrap();
        assert_eq!(block_fill(&db), 4.0);
        assert_eq!(queue_seqs(&recovered), [1], "element 1 came back with the undone commit, elements 2 and 3 went with the kept ones");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_undo_that_cannot_be_written_stops_every_write_until_a_restart_settles_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(crate::disk::FaultyDisk::new());
        let db = committed_start_on(dir.path(), disk.clone()).await;
        // The commit's batch is the next synced one, its undo the second.
        disk.fail(Some(crate::disk::Op::SyncedBatch), 2, crate::disk::FaultKind::Eio, crate::disk::After::Recovers);
        let mut stopped = db.writes_stopped();
        assert!(stopped.borrow().is_none());
        let failed = async { Err(StoreError::Storage { what: "injected: fdatasync failed".into() }) };
        let e = commit_beside(&db, 2.0, "new", 1, failed).await.unwrap_err();
        assert!(e.to_string().contains("injected: fdatasync"), "the sync's error is answered: {e}");
        // Whoever watches (`master serve`) learns why, to exit and restart.
        let why = stopped.wait_for(Option::is_some).await.unwrap().clone().unwrap();
        assert!(why.contains("the undo of a commit") && why.contains("injected fault"), "{why}");
        // The batch is on the disk, the node's memory has the action
        // aborted: any write built on that memory is refused.
        let refused = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Storage { what }) if what.contains("restarted"));
        let other = vec![(ObjKey::Small("other".into()), Tentative::Small(b"x".to_vec()))];
        assert!(refused(db.commit(other, Vec::new()).await));
        assert!(refused(db.apply_queue(&[queue::Mutation::Delete { bag: BAG.into(), seq: 2 }])));
        assert!(refused(db.put_matrix(Uuid::from_u128(9), "m", b"record")));
        drop(db);
        // The version reached the page cache, so the open finds it whole
        // and keeps the commit; nothing written after it is there.
        let (db, recovered) = Db::open(dir.path(), 8, Arc::new(crate::disk::RealDisk)).unwrap();
        assert_eq!(state(&db, &recovered), (0, 2.0, Some(b"new".to_vec()), vec![2, 3]));
        assert_eq!(db.get_small("other").unwrap(), None);
        assert_eq!(undo_records(&db), 0);
        // And the reopened node writes again.
        db.commit(vec![(ObjKey::Small("other".into()), Tentative::Small(b"y".to_vec()))], Vec::new()).await.unwrap();
    }

    #[test]
    fn a_record_decodes_to_what_was_encoded_and_nothing_else_does() {
        let undo = Undo {
            before: vec![(b"Bk".to_vec(), Some(vec![7; 16])), (b"Oflag".to_vec(), None), (b"Q".to_vec(), Some(Vec::new()))],
            versions: vec![(b"Bk".to_vec(), Uuid::from_u128(42), 0x5eed)],
        };
        let bytes = undo.encode();
        assert_eq!(Undo::decode(&bytes), Some(undo));
        assert_eq!(Undo::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Undo::decode(&[bytes.clone(), vec![0]].concat()), None);
        // A record from before the stamps: the version without its 8 bytes.
        let legacy = &bytes[..bytes.len() - 8];
        let read = Undo::decode(legacy).expect("a stampless record decodes");
        assert_eq!(read.versions, [(b"Bk".to_vec(), Uuid::from_u128(42), 0)]);
    }
}
