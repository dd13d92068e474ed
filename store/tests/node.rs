//! A real store node (RocksDB + gRPC on loopback) in-process, driven
//! through the client library: the semantics over the wire.

use std::time::{Duration, Instant};

use store_client::dataplane::wire;
use store_client::{Client, Dequeue, StoreError};

mod support;

use support::*;

#[tokio::test]
async fn nested_writes_are_visible_only_after_top_level_commit() {
    let n = node().await;
    let s = n.client.open_session("t").await.unwrap();
    let top = s.begin().await.unwrap();
    let child = top.begin_nested().await.unwrap();
    child.write_small("k", b"v1").await.unwrap();
    child.commit().await.unwrap();
    assert_eq!(top.read_small("k", false).await.unwrap(), Some(b"v1".to_vec()), "read your own writes");
    assert_eq!(n.client.peek_small("k").await.unwrap(), None, "not committed yet");
    let aborted_child = top.begin_nested().await.unwrap();
    aborted_child.write_small("k", b"v2").await.unwrap();
    aborted_child.abort().await.unwrap();
    top.commit().await.unwrap();
    assert_eq!(n.client.peek_small("k").await.unwrap(), Some(b"v1".to_vec()));
}

#[tokio::test]
async fn blocks_round_trip_with_read_your_own_writes_and_abort_discards() {
    for path in PATHS {
        let n = node_over(path).await;
        let m = n.client.create_matrix("A", 100, 70, 64).await.unwrap();
        let s = n.client.open_session("t").await.unwrap();
        let a = s.begin().await.unwrap();
        a.put_block(m.id, 1, 1, block(36, 6, 1.0)).await.unwrap();
        assert_eq!(a.get_block(m.id, 1, 1).await.unwrap(), block(36, 6, 1.0));
        a.commit().await.unwrap();
        assert_eq!(n.client.read_block_committed(m.id, 1, 1).await.unwrap(), block(36, 6, 1.0));

        let b = s.begin().await.unwrap();
        b.put_block(m.id, 1, 1, block(36, 6, 9.0)).await.unwrap();
        b.abort().await.unwrap();
        assert_eq!(n.client.read_block_committed(m.id, 1, 1).await.unwrap(), block(36, 6, 1.0));
    }
}

/// A get of many blocks (more than one exchange carries, in an order of
/// the caller's) returns each block where it was asked for, holds their
/// read locks like single gets, and fails as a whole on a bad block.
#[tokio::test]
async fn many_blocks_come_back_in_the_order_asked_under_read_locks() {
    for path in PATHS {
        let n = node_over(path).await;
        // 3 × 30 blocks of 8², the last row and column cut short.
        let m = n.client.create_matrix("M", 21, 235, 8).await.unwrap();
        let (rows, cols) = (m.n_rows.div_ceil(8) as u32, m.n_cols.div_ceil(8) as u32);
        let shape = |i: u32, j: u32| ((21 - 8 * i as usize).min(8), (235 - 8 * j as usize).min(8));
        let s = n.client.open_session("t").await.unwrap();
        let w = s.begin().await.unwrap();
        for i in 0..rows {
            for j in 0..cols {
                let (r, c) = shape(i, j);
                w.put_block(m.id, i, j, block(r, c, (100 * i + j) as f64)).await.unwrap();
            }
        }
        w.commit().await.unwrap();
        // Every block once, column-major and backwards: 90 blocks.
        let mut ids: Vec<(u32, u32)> = (0..cols).flat_map(|j| (0..rows).map(move |i| (i, j))).collect();
        ids.reverse();
        let r = s.begin().await.unwrap();
        let got = r.get_blocks(m.id, &ids).await.unwrap();
        assert_eq!(got.len(), ids.len());
        for (&(i, j), b) in ids.iter().zip(&got) {
            let (rr, cc) = shape(i, j);
            assert_eq!(*b, block(rr, cc, (100 * i + j) as f64), "{path:?}: block ({i}, {j})");
        }
        assert_eq!(n.client.read_blocks_committed(m.id, &ids[..5]).await.unwrap(), got[..5].to_vec());
        // The read locks are held: another action cannot overwrite.
        let other = s.begin().await.unwrap();
        let e = other.put_block(m.id, 2, 29, block(5, 3, 0.0)).await.unwrap_err();
        assert!(matches!(e, StoreError::LockTimeout { .. }), "{path:?}: {e}");
        other.abort().await.unwrap();
        // A block outside the matrix fails the whole get with a typed
        // error; the client goes on working.
        let e = r.get_blocks(m.id, &[(0, 0), (3, 0)]).await.unwrap_err();
        assert!(matches!(e, StoreError::InvalidArgument { .. }), "{path:?}: {e}");
        assert_eq!(r.get_blocks(m.id, &[(1, 1)]).await.unwrap(), vec![block(8, 8, 101.0)]);
        r.commit().await.unwrap();
        // A damaged block fails the batch it is in, in every way of reading.
        n.client.corrupt_block_for_test(m.id, 1, 2).await.unwrap();
        let r = s.begin().await.unwrap();
        let e = r.get_blocks(m.id, &[(1, 1), (1, 2)]).await.unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{path:?}: {e}");
        let e = n.client.read_blocks_committed(m.id, &[(1, 1), (1, 2)]).await.unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{path:?}: {e}");
        // A local get is answered in groups of 16 blocks: a refusal after a
        // group went out, and a damaged block with another group behind
        // it, leave the connection in step.
        let mut ids: Vec<(u32, u32)> = (0..20).map(|j| (0, j)).collect();
        ids.push((3, 0));
        let e = r.get_blocks(m.id, &ids).await.unwrap_err();
        assert!(matches!(e, StoreError::InvalidArgument { .. }), "{path:?}: {e}");
        let ids: Vec<(u32, u32)> = (0..30).map(|j| (1, j)).collect();
        let e = r.get_blocks(m.id, &ids).await.unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{path:?}: {e}");
        let ids: Vec<(u32, u32)> = (5..30).map(|j| (2, j)).collect();
        let got = r.get_blocks(m.id, &ids).await.unwrap();
        let want: Vec<_> = ids.iter().map(|&(i, j)| (shape(i, j), (100 * i + j) as f64)).map(|((rr, cc), v)| block(rr, cc, v)).collect();
        assert_eq!(got, want, "{path:?}");
        r.abort().await.unwrap();
    }
}

/// Version files under `dir` this process has open: (all, those deleted).
fn open_version_files(dir: &std::path::Path) -> (usize, usize) {
    let blocks = dir.join("blocks");
    let (mut all, mut deleted) = (0, 0);
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else { continue };
        let target = target.to_string_lossy().into_owned();
        if target.starts_with(&*blocks.to_string_lossy()) {
            all += 1;
            deleted += usize::from(target.ends_with(" (deleted)"));
        }
    }
    (all, deleted)
}

/// The node keeps version files open for reads; deleting a matrix closes
/// them with their names, so no removed file's space stays held.
#[tokio::test]
async fn a_deleted_matrix_leaves_no_version_file_open() {
    let n = node().await;
    let dir = n._dir.path().to_owned();
    let m = n.client.create_matrix("D", 32, 32, 8).await.unwrap();
    let ids: Vec<(u32, u32)> = (0..4).flat_map(|i| (0..4).map(move |j| (i, j))).collect();
    let s = n.client.open_session("t").await.unwrap();
    let w = s.begin().await.unwrap();
    for &(i, j) in &ids {
        w.put_block(m.id, i, j, block(8, 8, (i * 4 + j) as f64)).await.unwrap();
    }
    w.commit().await.unwrap();
    let r = s.begin().await.unwrap();
    assert_eq!(r.get_blocks(m.id, &ids).await.unwrap().len(), ids.len());
    r.commit().await.unwrap();
    let (open, deleted) = open_version_files(&dir);
    assert!(open >= ids.len() && deleted == 0, "the node keeps the files it read open: {open} open, {deleted} deleted");
    n.client.delete_matrix(m.id).await.unwrap();
    assert_eq!(open_version_files(&dir).1, 0, "a removed version's file stays open");
}

#[tokio::test]
async fn a_32_mib_block_streams_both_ways() {
    for path in PATHS {
        let n = node_over(path).await;
        let m = n.client.create_matrix("big", 2048, 2048, 2048).await.unwrap();
        let s = n.client.open_session("t").await.unwrap();
        let a = s.begin().await.unwrap();
        let big = block(2048, 2048, 0.5);
        a.put_block(m.id, 0, 0, big.clone()).await.unwrap();
        a.commit().await.unwrap();
        assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), big);
    }
}

#[tokio::test]
async fn a_write_lock_conflict_times_out_and_a_crossing_pair_deadlocks() {
    let n = node().await;
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    let b = s.begin().await.unwrap();
    a.write_small("x", b"a").await.unwrap();
    let t = Instant::now();
    let err = b.read_small("x", false).await.unwrap_err();
    assert!(matches!(err, StoreError::LockTimeout { .. }), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(250));

    b.write_small("y", b"b").await.unwrap();
    let waits = n.client.node_metrics().await.unwrap().lock_waits;
    let a_waits = async { a.read_small("y", false).await };
    let b_closes_cycle = async {
        lock_waits_reach(&n.client, waits, 1).await;
        b.read_small("x", false).await
    };
    let (ra, rb) = tokio::join!(a_waits, b_closes_cycle);
    assert!(matches!(rb, Err(StoreError::Deadlock { .. })), "{rb:?}");
    // a still waits for y and times out: b holds it until it ends.
    assert!(matches!(ra, Err(StoreError::LockTimeout { .. })), "{ra:?}");
}

#[tokio::test]
async fn a_read_of_many_small_objects_answers_in_order_and_holds_every_lock() {
    for path in PATHS {
        let n = node_over(path).await;
        let s = n.client.open_session("t").await.unwrap();
        let setup = s.begin().await.unwrap();
        setup.write_small("c/1", b"one").await.unwrap();
        setup.write_small("c/3", b"three").await.unwrap();
        setup.commit().await.unwrap();

        let a = s.begin().await.unwrap();
        let keys: Vec<String> = ["c/3", "c/2", "c/1"].iter().map(|k| k.to_string()).collect();
        let got = a.read_smalls(&keys, true).await.unwrap();
        assert_eq!(got, vec![Some(b"three".to_vec()), None, Some(b"one".to_vec())], "{path:?}");

        // Every key, the missing one too, is write-locked by `a` now.
        let b = s.begin().await.unwrap();
        for key in &keys {
            let err = b.read_small(key, false).await.unwrap_err();
            assert!(matches!(err, StoreError::LockTimeout { .. }), "{path:?} {key}: {err}");
        }
        a.write_small("c/2", b"two").await.unwrap();
        a.commit().await.unwrap();
        assert_eq!(b.read_smalls(&keys[1..], false).await.unwrap(), vec![Some(b"two".to_vec()), Some(b"one".to_vec())]);

        let too_many: Vec<String> = (0..5000).map(|k| format!("k/{k}")).collect();
        let err = b.read_smalls(&too_many, false).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidArgument { .. }), "{path:?}: {err}");
    }
}

#[tokio::test]
async fn a_write_of_many_small_objects_is_one_request_that_commits_or_aborts_with_its_action() {
    for path in PATHS {
        let n = node_over(path).await;
        let s = n.client.open_session("t").await.unwrap();
        let items = |v: &[u8]| -> Vec<(String, Vec<u8>)> { ["w/1", "w/2", "w/3"].iter().map(|k| (k.to_string(), v.to_vec())).collect() };

        let aborted = s.begin().await.unwrap();
        aborted.write_smalls(&items(b"lost")).await.unwrap();
        // Its own reads see them; the committed state does not.
        assert_eq!(aborted.read_small("w/2", false).await.unwrap().as_deref(), Some(&b"lost"[..]), "{path:?}");
        aborted.abort().await.unwrap();
        assert_eq!(n.client.peek_small("w/2").await.unwrap(), None, "{path:?}");

        let a = s.begin().await.unwrap();
        a.write_smalls(&items(b"kept")).await.unwrap();
        // Every key is write-locked by `a` until it commits.
        let b = s.begin().await.unwrap();
        let err = b.read_small("w/3", false).await.unwrap_err();
        assert!(matches!(err, StoreError::LockTimeout { .. }), "{path:?}: {err}");
        a.commit().await.unwrap();
        let keys: Vec<String> = items(b"").into_iter().map(|(k, _)| k).collect();
        assert_eq!(b.read_smalls(&keys, false).await.unwrap(), vec![Some(b"kept".to_vec()); 3], "{path:?}");

        let too_many: Vec<(String, Vec<u8>)> = (0..5000).map(|k| (format!("k/{k}"), vec![1])).collect();
        let err = b.write_smalls(&too_many).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidArgument { .. }), "{path:?}: {err}");
    }
}

#[tokio::test]
async fn a_waiter_gets_the_lock_when_the_holder_commits() {
    let n = node_with(|c| c.node.lock_timeout = Duration::from_secs(5)).await;
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    let b = s.begin().await.unwrap();
    a.write_small("x", b"new").await.unwrap();
    let waits = n.client.node_metrics().await.unwrap().lock_waits;
    let reader = async { b.read_small("x", false).await };
    let committer = async {
        lock_waits_reach(&n.client, waits, 1).await;
        a.commit().await
    };
    let (r, c) = tokio::join!(reader, committer);
    c.unwrap();
    assert_eq!(r.unwrap(), Some(b"new".to_vec()));
}

/// A bag whose elements were all taken and committed is empty on disk,
/// yet a restarted node must not hand out their numbers again: a task's
/// records are keyed by its element's number (`bench soak` found an LU
/// job whose late tasks reused the numbers of earlier ones).
#[tokio::test]
async fn a_restarted_node_never_reuses_the_number_of_a_committed_element() {
    let dir = tempfile::tempdir().unwrap();
    let start = || async {
        let running = store::start(store::Config::new(dir.path().to_owned(), "127.0.0.1:0".parse().unwrap())).await.unwrap();
        let client = Client::connect(&running.addr().to_string(), None).await.unwrap();
        (running, client)
    };
    let (running, client) = start().await;
    let s = client.open_session("t").await.unwrap();
    let e = s.begin().await.unwrap();
    for t in ["t0", "t1", "t2"] {
        e.enqueue("bag", t.as_bytes()).await.unwrap();
    }
    e.commit().await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..3 {
        let a = s.begin().await.unwrap();
        let Dequeue::Task(t) = a.dequeue("bag", Duration::ZERO).await.unwrap() else { panic!("a task") };
        a.commit().await.unwrap();
        taken.push(t.seq);
    }
    drop((s, client));
    running.shutdown().await.unwrap();

    let (_running, client) = start().await;
    let s = client.open_session("t").await.unwrap();
    let e = s.begin().await.unwrap();
    e.enqueue("bag", b"t3").await.unwrap();
    e.commit().await.unwrap();
    let a = s.begin().await.unwrap();
    let Dequeue::Task(t) = a.dequeue("bag", Duration::ZERO).await.unwrap() else { panic!("a task") };
    assert!(!taken.contains(&t.seq) && t.seq > *taken.iter().max().unwrap(), "element {} reused one of {taken:?}", t.seq);
}

#[tokio::test]
async fn queue_over_the_wire_empty_none_available_blocking_dequeue_and_old_position() {
    let n = node().await;
    let s = n.client.open_session("t").await.unwrap();
    let e = s.begin().await.unwrap();
    for t in ["t1", "t2"] {
        e.enqueue("bag", t.as_bytes()).await.unwrap();
    }
    e.commit().await.unwrap();

    let a = s.begin().await.unwrap();
    let Dequeue::Task(t1) = a.dequeue("bag", Duration::ZERO).await.unwrap() else { panic!() };
    let Dequeue::Task(t2) = a.dequeue("bag", Duration::ZERO).await.unwrap() else { panic!() };
    assert_eq!((t1.payload.as_slice(), t2.payload.as_slice()), (&b"t1"[..], &b"t2"[..]));
    let b = s.begin().await.unwrap();
    assert_eq!(b.dequeue("bag", Duration::ZERO).await.unwrap(), Dequeue::NoneAvailable);

    // A blocked dequeue gets t1 back, first in line, when a aborts.
    let waits = n.client.node_metrics().await.unwrap().dequeue_waits;
    let waiter = async { b.dequeue("bag", Duration::from_secs(5)).await };
    let aborter = async {
        dequeue_waits_reach(&n.client, waits, 1).await;
        a.abort().await
    };
    let (got, ab) = tokio::join!(waiter, aborter);
    ab.unwrap();
    let Dequeue::Task(again) = got.unwrap() else { panic!() };
    assert_eq!(again.payload, b"t1");
    assert_eq!(again.returns, 1);
    let Dequeue::Task(_) = b.dequeue("bag", Duration::ZERO).await.unwrap() else { panic!() };
    b.commit().await.unwrap();
    let c = s.begin().await.unwrap();
    assert_eq!(c.dequeue("bag", Duration::ZERO).await.unwrap(), Dequeue::Empty);
    assert_eq!(c.dequeue("never-made", Duration::ZERO).await.unwrap(), Dequeue::Empty);
}

/// A commit is visible to reads without locks (a slave's scan for job
/// records) a moment before its queue elements are free. A dequeue in that
/// moment must say "wait", not "empty": a slave took "empty" for a finished
/// job and marked it so before any task had run (seen as a missing grain
/// and a never-written block in loaded test runs).
#[tokio::test]
async fn a_bag_whose_commit_is_visible_but_unfinished_is_not_empty() {
    let n = node_with(|c| c.node.hold_after_batch = Duration::from_millis(400)).await;
    let submit = n.client.open_session("submit").await.unwrap();
    let a = submit.begin().await.unwrap();
    a.write_small("job/1", b"record").await.unwrap();
    a.enqueue("job/1/bag", b"task").await.unwrap();
    let commit = tokio::spawn(async move { a.commit().await });

    let started = Instant::now();
    while n.client.peek_small("job/1").await.unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "the commit never became visible");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let slave = n.client.open_session("slave").await.unwrap();
    let d = slave.begin().await.unwrap();
    let first = d.dequeue("job/1/bag", Duration::ZERO).await.unwrap();
    assert!(!commit.is_finished(), "the test hook holds the commit open");
    assert_eq!(first, Dequeue::NoneAvailable, "a bag whose elements are being committed is not empty");
    let Dequeue::Task(t) = d.dequeue("job/1/bag", Duration::from_secs(10)).await.unwrap() else { panic!("the waiter is woken") };
    assert_eq!(t.payload, b"task");
    commit.await.unwrap().unwrap();
    d.commit().await.unwrap();
    let e = slave.begin().await.unwrap();
    assert_eq!(e.dequeue("job/1/bag", Duration::ZERO).await.unwrap(), Dequeue::Empty);
}

#[tokio::test]
async fn bad_input_gets_typed_errors_and_loses_nothing() {
    for path in PATHS {
        let n = node_over(path).await;
        let m = n.client.create_matrix("A", 10, 10, 4).await.unwrap();
        let s = n.client.open_session("t").await.unwrap();
        let a = s.begin().await.unwrap();
        a.put_block(m.id, 0, 0, block(4, 4, 1.0)).await.unwrap();
        a.commit().await.unwrap();

        let a = s.begin().await.unwrap();
        let e = a.put_block(m.id, 2, 2, block(4, 4, 0.0)).await.unwrap_err();
        assert!(matches!(&e, StoreError::InvalidArgument { what } if what.contains("must be 2x2")), "{e}");
        let e = a.put_block(m.id, 3, 0, block(4, 4, 0.0)).await.unwrap_err();
        assert!(matches!(&e, StoreError::InvalidArgument { what } if what.contains("outside")), "{e}");
        let e = a.get_block(uuid::Uuid::new_v4(), 0, 0).await.unwrap_err();
        assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
        let e = a.get_block(m.id, 1, 1).await.unwrap_err();
        assert!(matches!(&e, StoreError::NotFound { what } if what.contains("never written")), "{e}");
        let e = n.client.matrix_by_name("nope").await.unwrap_err();
        assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
        let e = n.client.create_matrix("A", 10, 10, 4).await.unwrap_err();
        assert!(matches!(e, StoreError::AlreadyExists { .. }), "{e}");
        let e = n.client.create_matrix("Z", 0, 10, 4).await.unwrap_err();
        assert!(matches!(e, StoreError::InvalidArgument { .. }), "{e}");
        a.abort().await.unwrap();
        let e = fenced_call(&s).await;
        assert!(matches!(e, StoreError::ActionAborted { .. }), "{e}");

        n.client.corrupt_block_for_test(m.id, 0, 0).await.unwrap();
        let e = n.client.read_block_committed(m.id, 0, 0).await.unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt { what } if what.contains("checksum")), "{e}");
        // The node keeps serving everything else.
        let b = s.begin().await.unwrap();
        b.put_block(m.id, 0, 1, block(4, 4, 2.0)).await.unwrap();
        b.commit().await.unwrap();
        assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), block(4, 4, 2.0));
        // A block put by a fenced action fails typed on this path too.
        let c = s.begin().await.unwrap();
        let nested = c.begin_nested().await.unwrap();
        c.abort().await.unwrap();
        let e = nested.put_block(m.id, 0, 1, block(4, 4, 3.0)).await.unwrap_err();
        assert!(matches!(e, StoreError::ActionAborted { .. }), "{e}");
        let e = nested.get_block(m.id, 0, 1).await.unwrap_err();
        assert!(matches!(e, StoreError::ActionAborted { .. }), "{e}");
        assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), block(4, 4, 2.0));
    }
}

/// A top-level commit has the node begin the session's next top-level
/// action in the same round trip; the next `begin` takes it instead of
/// asking. That action works like any other, a nested commit begins
/// nothing, and the session's end takes it with the session.
#[tokio::test]
async fn a_commit_begins_the_sessions_next_action_for_its_next_begin() {
    for path in PATHS {
        let n = node_over(path).await;
        let m = n.client.create_matrix("A", 4, 8, 4).await.unwrap();
        let s = n.client.open_session("t").await.unwrap();
        let client = n.client.clone();
        let actions = |session: u64| {
            let client = client.clone();
            async move { client.list_sessions().await.unwrap().iter().find(|x| x.session == session).map(|x| x.n_actions) }
        };
        let a = s.begin().await.unwrap();
        let a_id = a.id();
        let nested = a.begin_nested().await.unwrap();
        nested.put_block(m.id, 0, 0, block(4, 4, 1.0)).await.unwrap();
        nested.commit().await.unwrap();
        assert_eq!(actions(s.id()).await, Some(1), "{path:?}: a nested commit begins nothing");
        a.commit().await.unwrap();
        assert_eq!(actions(s.id()).await, Some(1), "{path:?}: the commit began the next action");
        let b = s.begin().await.unwrap();
        assert_eq!(actions(s.id()).await, Some(1), "{path:?}: begin took the action begun ahead");
        assert_ne!(b.id(), a_id);
        b.put_block(m.id, 0, 1, block(4, 4, 2.0)).await.unwrap();
        assert_eq!(b.get_block(m.id, 0, 0).await.unwrap(), block(4, 4, 1.0));
        b.commit().await.unwrap();
        assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), block(4, 4, 2.0));
        // Two begins at once: one takes the action begun ahead, the other asks.
        let (c, d) = tokio::join!(s.begin(), s.begin());
        let (c, d) = (c.unwrap(), d.unwrap());
        assert_ne!(c.id(), d.id());
        assert_eq!(actions(s.id()).await, Some(2), "{path:?}");
        d.abort().await.unwrap();
        c.commit().await.unwrap();
        let id = s.id();
        drop(s);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while actions(id).await.is_some() {
            assert!(std::time::Instant::now() < deadline, "{path:?}: the session and its action begun ahead outlived it");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A nested action whose parent was aborted is fenced: every call fails.
async fn fenced_call(s: &store_client::Session) -> StoreError {
    let a = s.begin().await.unwrap();
    let nested = a.begin_nested().await.unwrap();
    a.abort().await.unwrap();
    nested.dequeue("bag", Duration::ZERO).await.unwrap_err()
}

#[tokio::test]
async fn a_node_with_a_token_refuses_clients_without_it() {
    let n = node_with(|c| c.token = Some("s3cret".into())).await;
    n.client.list_matrices().await.unwrap();
    let addr = n.running.as_ref().unwrap().addr().to_string();
    for token in [None, Some("wrong")] {
        // Connecting asks the node for its data plane: refused at once.
        let e = Client::connect(&addr, token).await.err().expect("a client without the token must be refused");
        assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");
    }
    // The data plane checks the token on its own, in its hello.
    let data = n.running.as_ref().unwrap().data_addr();
    for token in [&b""[..], b"wrong"] {
        let (reply, detail) = data_plane_hello(data, token).await;
        assert!(!reply.ok);
        let e = StoreError::from_detail(&detail);
        assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");
    }
    let (reply, id) = data_plane_hello(data, b"s3cret").await;
    assert!(reply.ok && reply.len == wire::NODE_ID_LEN && id.iter().any(|&b| b != 0), "a hello is answered with the node's id");
}

/// A client on the node's machine moves its blocks (and its tasks' calls)
/// over the node's Unix socket, once the socket answers with the node's
/// id. A socket there that answers as another node is not trusted, and
/// without the socket (a node in a container, say) the client falls back
/// to TCP. The node's own process reaches it in memory, token checked.
#[tokio::test]
async fn local_clients_take_the_unix_socket_only_when_it_is_the_nodes() {
    let n = node_with(|c| c.token = Some("s3cret".into())).await;
    assert!(n.client.blocks_locally(), "a loopback client should use the node's Unix socket");
    let running = n.running.as_ref().unwrap();
    let addr = running.addr().to_string();
    let socket = n._dir.path().join(store::DATA_SOCKET);
    let works = |c: Client, name: &'static str| async move {
        let m = c.create_matrix(name, 4, 4, 2).await.unwrap();
        let a = c.open_session(name).await.unwrap().begin().await.unwrap();
        a.put_block(m.id, 0, 0, block(2, 2, 1.0)).await.unwrap();
        assert_eq!(a.get_block(m.id, 0, 0).await.unwrap(), block(2, 2, 1.0));
        a.commit().await.unwrap();
    };

    // Another node's socket where this node's was.
    let other = node_with(|c| c.token = Some("s3cret".into())).await;
    std::fs::remove_file(&socket).unwrap();
    std::os::unix::fs::symlink(other._dir.path().join(store::DATA_SOCKET), &socket).unwrap();
    let fooled = Client::connect(&addr, Some("s3cret")).await.unwrap();
    assert!(fooled.has_data_plane() && !fooled.blocks_locally(), "another node's socket was trusted");
    works(fooled, "not-fooled").await;

    std::fs::remove_file(&socket).unwrap();
    let tcp = Client::connect(&addr, Some("s3cret")).await.unwrap();
    assert!(tcp.has_data_plane() && !tcp.blocks_locally());
    works(tcp, "over-tcp").await;
    let names: Vec<_> = n.client.list_matrices().await.unwrap().into_iter().map(|m| m.name).collect();
    assert!(names.contains(&"not-fooled".into()) && names.contains(&"over-tcp".into()), "one node: {names:?}");
    assert!(other.client.list_matrices().await.unwrap().is_empty(), "nothing reached the other node");

    let e = running.client(None).await.unwrap().list_matrices().await.unwrap_err();
    assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");
    assert_eq!(running.client(Some("s3cret")).await.unwrap().list_matrices().await.unwrap().len(), 2);
}

async fn data_plane_hello(addr: std::net::SocketAddr, token: &[u8]) -> (wire::Reply, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(&wire::encode_hello(token)).await.unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    sock.read_exact(&mut head).await.unwrap();
    let reply = wire::Reply::decode(&head).unwrap();
    let mut detail = vec![0u8; reply.len as usize];
    sock.read_exact(&mut detail).await.unwrap();
    (reply, detail)
}

#[tokio::test]
async fn a_request_after_shutdown_is_store_unavailable() {
    let mut n = node().await;
    n.running.take().unwrap().shutdown().await.unwrap();
    let e = n.client.list_matrices().await.unwrap_err();
    assert!(matches!(e, StoreError::StoreUnavailable { .. }), "{e}");
    assert!(e.is_retryable());
}

/// A data directory whose blocks are of the earlier (CRC-32C) format is
/// refused when the node starts, saying so, rather than served with every
/// get failing its checksum; the same directory of this format opens.
#[tokio::test]
async fn a_store_of_the_earlier_block_format_is_refused_at_start() {
    let mut n = node().await;
    let m = n.client.create_matrix("F", 8, 8, 8).await.unwrap();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    a.put_block(m.id, 0, 0, block(8, 8, 1.0)).await.unwrap();
    a.commit().await.unwrap();
    drop(s);
    n.running.take().unwrap().shutdown().await.unwrap();
    let config = || store::Config::new(n._dir.path().to_owned(), "127.0.0.1:0".parse().unwrap());
    // The same directory opens again while its blocks are of this format.
    store::start(config()).await.unwrap().shutdown().await.unwrap();
    let mut patched = 0;
    for entry in std::fs::read_dir(n._dir.path().join("blocks")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if bytes.len() >= 4 && &bytes[0..4] == b"FTB2" {
            bytes[0..4].copy_from_slice(b"FTB1");
            std::fs::write(&path, bytes).unwrap();
            patched += 1;
        }
    }
    assert_eq!(patched, 1, "one version file");
    let e = match store::start(config()).await {
        Ok(_) => panic!("a store of FTB1 blocks was opened"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("earlier format (FTB1") && e.contains("import them again"), "{e}");
}

#[tokio::test]
async fn garbage_on_the_port_is_refused_and_the_node_keeps_serving() {
    let n = node().await;
    let addr = n.running.as_ref().unwrap().addr();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    a.write_small("kept", b"1").await.unwrap();
    a.commit().await.unwrap();
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xffu8; 4096][..], b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x99\xff"] {
        // The node answers (an HTTP/2 GOAWAY or nothing) and closes.
        assert!(closes_after(addr, garbage, Duration::from_secs(5)).await, "the node should close a connection speaking garbage");
    }
    assert_eq!(n.client.peek_small("kept").await.unwrap(), Some(b"1".to_vec()));
    let b = s.begin().await.unwrap();
    b.write_small("after", b"2").await.unwrap();
    b.commit().await.unwrap();
}

/// A backup holds the store as it was when it was taken, whatever is
/// committed after it: the node neither removes nor overwrites (recycles)
/// a version the backup names. It links the blocks on the store's
/// filesystem and copies them to another (`/dev/shm`, a tmpfs, where
/// there is one), and opens as a store of its own.
#[tokio::test]
async fn a_backup_keeps_its_state_while_commits_replace_it_and_opens_as_a_store() {
    use std::os::unix::fs::MetadataExt;
    let mut places = vec![tempfile::tempdir().unwrap()];
    if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
        places.push(shm);
    }
    for place in places {
        let n = node().await;
        let m = n.client.create_matrix("A", 64, 64 * 8, 64).await.unwrap();
        let s = n.client.open_session("t").await.unwrap();
        let a = s.begin().await.unwrap();
        for j in 0..8 {
            a.put_block(m.id, 0, j, block(64, 64, j as f64)).await.unwrap();
        }
        a.write_small("k", b"before").await.unwrap();
        a.commit().await.unwrap();

        let dir = place.path().join("backup");
        let b = n.client.backup(dir.to_str().unwrap()).await.unwrap();
        let same_fs = std::fs::metadata(place.path()).unwrap().dev() == std::fs::metadata(n._dir.path()).unwrap().dev();
        assert_eq!(b.n_versions, 8, "{b:?}");
        let bytes = 8 * (64 * 64 * 8 + store_client::block::HEADER_LEN as u64);
        assert_eq!((b.bytes_linked, b.bytes_copied), if same_fs { (bytes, 0) } else { (0, bytes) }, "{b:?}");
        let again = n.client.backup(dir.to_str().unwrap()).await.unwrap_err();
        assert!(matches!(again, StoreError::AlreadyExists { .. }), "{again}");

        // Every block replaced three times: each replaced version is
        // retired, and the pool of recycled files is overwritten by the
        // next round's puts.
        for round in 1..=3 {
            let a = s.begin().await.unwrap();
            for j in 0..8 {
                a.put_block(m.id, 0, j, block(64, 64, (100 * round + j) as f64)).await.unwrap();
            }
            a.write_small("k", format!("round {round}").as_bytes()).await.unwrap();
            a.commit().await.unwrap();
        }
        assert_eq!(n.client.read_block_committed(m.id, 0, 5).await.unwrap(), block(64, 64, 305.0));

        let restored = store::start(store::Config::new(dir.clone(), "127.0.0.1:0".parse().unwrap())).await.unwrap();
        let r = Client::connect(&restored.addr().to_string(), None).await.unwrap();
        for j in 0..8 {
            assert_eq!(r.read_block_committed(m.id, 0, j).await.unwrap(), block(64, 64, j as f64), "block (0, {j}) in {}", dir.display());
        }
        assert_eq!(r.peek_small("k").await.unwrap(), Some(b"before".to_vec()));
        restored.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_backup_into_a_relative_or_existing_directory_is_refused() {
    let n = node().await;
    let err = n.client.backup("relative/dir").await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidArgument { .. }), "{err}");
    let err = n.client.backup(n._dir.path().to_str().unwrap()).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
}
