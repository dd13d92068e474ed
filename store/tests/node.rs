//! A real store node (RocksDB + gRPC on loopback) in-process, driven
//! through the client library: the semantics over the wire.

use std::time::{Duration, Instant};

use store_client::dataplane::unix_conn::UnixConn;
use store_client::dataplane::wire;
use store_client::{BlockData, Client, Dequeue, StoreError};

struct Node {
    _dir: tempfile::TempDir,
    running: Option<store::Running>,
    client: Client,
}

async fn node_with(f: impl FnOnce(&mut store::Config)) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut config = store::Config::new(dir.path().to_owned(), "127.0.0.1:0".parse().unwrap());
    config.node.lock_timeout = Duration::from_millis(300);
    config.node.test_hooks = true;
    f(&mut config);
    let token = config.token.clone();
    let running = store::start(config).await.unwrap();
    let client = Client::connect(&running.addr().to_string(), token.as_deref()).await.unwrap();
    Node { _dir: dir, running: Some(running), client }
}

async fn node() -> Node {
    node_with(|_| {}).await
}

/// The ways a block can travel; block tests run on each.
#[derive(Clone, Copy, Debug)]
enum Path {
    Unix,
    /// The Unix socket with puts through the socket, not a pipe.
    UnixSocket,
    Tcp,
    Grpc,
}
const PATHS: [Path; 4] = [Path::Unix, Path::UnixSocket, Path::Tcp, Path::Grpc];

async fn node_over(path: Path) -> Node {
    let mut n = node().await;
    assert!(n.client.has_data_plane(), "a node serves the data plane by default");
    n.client = match path {
        Path::Unix => n.client,
        Path::UnixSocket => n.client.puts_through_socket().await.unwrap(),
        Path::Tcp => n.client.blocks_over_tcp().await.unwrap(),
        Path::Grpc => n.client.blocks_over_grpc(),
    };
    n
}

/// Waits until the node has counted `n` more lock waits than `before`
/// (`NodeMetrics::lock_waits`): a request that the test needs queued
/// behind a lock is then known to wait there.
async fn lock_waits_reach(client: &Client, before: u64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = client.node_metrics().await.unwrap().lock_waits;
        if now >= before + n {
            return;
        }
        assert!(Instant::now() < deadline, "lock waits stayed at {now}, {n} more than {before} expected");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the node has counted `n` more blocked dequeues than `before`
/// (`NodeMetrics::dequeue_waits`).
async fn dequeue_waits_reach(client: &Client, before: u64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = client.node_metrics().await.unwrap().dequeue_waits;
        if now >= before + n {
            return;
        }
        assert!(Instant::now() < deadline, "dequeue waits stayed at {now}, {n} more than {before} expected");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn block(rows: usize, cols: usize, seed: f64) -> BlockData {
    BlockData { rows, cols, data: (0..rows * cols).map(|k| seed + k as f64).collect() }
}

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
    let (reply, _) = data_plane_hello(data, b"s3cret").await;
    assert!(reply.ok && reply.len == 0);
}

/// A client on the node's machine calls over the node's Unix socket, which
/// checks the token as the TCP port does; without the socket (a node in a
/// container, say) the client falls back to TCP.
#[tokio::test]
async fn local_clients_call_over_the_unix_socket() {
    let n = node_with(|c| c.token = Some("s3cret".into())).await;
    assert!(n.client.calls_locally(), "a loopback client should use the node's Unix socket");
    n.client.list_matrices().await.unwrap();
    let socket = n._dir.path().join(store::RPC_SOCKET);

    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost").connect_with_connector(connector).await.unwrap();
    let mut bare = store_client::proto::store_client::StoreClient::new(channel);
    let e = StoreError::from(bare.list_matrices(store_client::proto::Empty {}).await.unwrap_err());
    assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");

    std::fs::remove_file(n._dir.path().join(store::RPC_SOCKET)).unwrap();
    let addr = n.running.as_ref().unwrap().addr().to_string();
    let tcp = Client::connect(&addr, Some("s3cret")).await.unwrap();
    assert!(!tcp.calls_locally());
    let m = tcp.create_matrix("over-tcp", 4, 4, 2).await.unwrap();
    assert!(n.client.list_matrices().await.unwrap().iter().any(|x| x.id == m.id), "both clients see one node");
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

#[tokio::test]
async fn garbage_on_the_data_plane_is_refused_and_blocks_keep_flowing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let n = node().await;
    let data = n.running.as_ref().unwrap().data_addr();
    let m = n.client.create_matrix("A", 8, 8, 8).await.unwrap();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    a.put_block(m.id, 0, 0, block(8, 8, 1.0)).await.unwrap();
    a.commit().await.unwrap();
    // Not a hello; a hello then a garbage request; a put announcing a block
    // far larger than any (the node must not allocate it).
    let huge =
        wire::Request { op: wire::Op::Put, action: 1, matrix: m.id, i: 0, j: 0, rows: u32::MAX, cols: u32::MAX, checksum: 0, flags: 0 };
    let mut after_hello = wire::encode_hello(b"");
    after_hello.extend_from_slice(&[0xffu8; 4096]);
    let mut huge_put = wire::encode_hello(b"");
    huge_put.extend_from_slice(&huge.encode());
    // A call announcing a body past the limit (not allocated either).
    let mut huge_call = wire::encode_hello(b"");
    huge_call.extend_from_slice(&wire::Request::call(wire::Method::Dequeue, u32::MAX).encode());
    // A local get of more blocks than one message may pass; a get of none.
    let mut huge_many = wire::encode_hello(b"");
    huge_many.extend_from_slice(&wire::Request { op: wire::Op::GetLocalMany, rows: u32::MAX, ..huge }.encode());
    let mut no_blocks = wire::encode_hello(b"");
    no_blocks.extend_from_slice(&wire::Request { op: wire::Op::GetMany, rows: 0, ..huge }.encode());
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &after_hello, &huge_put, &huge_call, &huge_many, &no_blocks] {
        // 7 s: past the 5 s a silent client gets to say hello.
        assert!(closes_after(data, garbage, Duration::from_secs(7)).await, "the node should close a data connection speaking garbage");
    }
    // Requests the node refuses with a typed error, keeping the
    // connection in step for the next one: a local get (descriptor
    // passing) over TCP, a call of an unknown method, a call whose body is
    // not its protobuf, a commit without an action, a begin in a session
    // that does not exist.
    let mut sock = tokio::net::TcpStream::connect(data).await.unwrap();
    sock.write_all(&wire::encode_hello(b"")).await.unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    sock.read_exact(&mut head).await.unwrap();
    let local_get = wire::Request::get(wire::Op::GetLocal, 0, m.id, 0, 0, 0);
    use prost::Message;
    use store_client::proto;
    let call = |method: wire::Method, body: Vec<u8>| (wire::Request::call(method, body.len() as u32), body);
    let unknown_method = wire::Request { rows: 99, ..wire::Request::call(wire::Method::Dequeue, 0) };
    type Refusal = ((wire::Request, Vec<u8>), fn(&StoreError) -> bool);
    let refused: Vec<Refusal> = vec![
        ((local_get, vec![]), |e| matches!(e, StoreError::InvalidArgument { .. })),
        (wire::Request::get_many(wire::Op::GetLocalMany, 0, m.id, &[(0, 0), (0, 0)], false), |e| {
            matches!(e, StoreError::InvalidArgument { .. })
        }),
        ((unknown_method, vec![]), |e| matches!(e, StoreError::InvalidArgument { .. })),
        (call(wire::Method::Dequeue, vec![0xff; 3]), |e| matches!(e, StoreError::InvalidArgument { .. })),
        (call(wire::Method::Commit, proto::ActionRef { action: 0, begin_next: false }.encode_to_vec()), |e| {
            matches!(e, StoreError::InvalidArgument { .. })
        }),
        (call(wire::Method::Begin, proto::BeginRequest { session: 123_456, parent: 0 }.encode_to_vec()), |e| {
            matches!(e, StoreError::SessionExpired { .. })
        }),
    ];
    for ((req, body), expected) in refused {
        let e = refusal(&mut sock, &req, &body).await;
        assert!(expected(&e), "{req:?}: {e}");
    }
    assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), block(8, 8, 1.0));
}

/// A put's payload goes to its version's file piece by piece as it
/// arrives: one whose bytes do not match its checksum (in one piece, and
/// in several) is refused with the connection kept in step, one cut off
/// mid-payload loses its connection, and neither changes the block.
#[tokio::test]
async fn puts_that_arrive_damaged_or_cut_off_change_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (n, m, s, small, big) = two_big_blocks().await;
    let data = n.running.as_ref().unwrap().data_addr();

    let a = s.begin().await.unwrap();
    let mut sock = tokio::net::TcpStream::connect(data).await.unwrap();
    sock.write_all(&wire::encode_hello(b"")).await.unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    sock.read_exact(&mut head).await.unwrap();
    let put = |j: u32, checksum: u32| wire::Request {
        op: wire::Op::Put,
        action: a.id(),
        matrix: m.id,
        i: 0,
        j,
        rows: 1200,
        cols: 1200,
        checksum,
        flags: 0,
    };
    let payload = |seed: f64| -> Vec<u8> { bytemuck::cast_slice(&block(1200, 1200, seed).data).to_vec() };
    let good = payload(3.0);
    let crc = store_client::block::checksum(&good);
    let mut damaged = good.clone();
    *damaged.last_mut().unwrap() ^= 1;
    for j in [0, 1] {
        let e = refusal(&mut sock, &put(j, crc), &damaged).await;
        assert!(matches!(&e, StoreError::Corrupt { what } if what.contains("checksum")), "{e}");
    }
    // In step: the same connection takes a good put.
    sock.write_all(&put(0, crc).encode()).await.unwrap();
    sock.write_all(&good).await.unwrap();
    sock.read_exact(&mut head).await.unwrap();
    assert!(wire::Reply::decode(&head).unwrap().ok);
    // Cut off after two of its 11 MiB.
    sock.write_all(&put(1, crc).encode()).await.unwrap();
    sock.write_all(&good[..2 << 20]).await.unwrap();
    drop(sock);
    a.commit().await.unwrap();
    assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), block(1200, 1200, 3.0));
    assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), big);
    // The cut-off put left the block's lock free for the next action.
    let b = s.begin().await.unwrap();
    b.put_block(m.id, 0, 1, small.clone()).await.unwrap();
    b.commit().await.unwrap();
    assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), small);
}

/// A local client's put sends its payload through its connection's pipe
/// (`Op::PutSpliced`): one whose bytes do not match its checksum, and one
/// the node refuses before reading (a wrong shape), are answered with
/// typed errors and the pipe drained, in step for the next put; one whose
/// client goes away mid-payload loses its connection and changes nothing;
/// a spliced put on a connection that handed over no pipe, and a "pipe"
/// that is a file, are refused and their connections closed.
#[tokio::test]
async fn spliced_puts_that_arrive_damaged_refused_or_cut_off_change_nothing() {
    use std::os::fd::AsFd;
    use store_client::dataplane::{fdpass, splice};
    use tokio::io::AsyncWriteExt;
    let (n, m, s, small, big) = two_big_blocks().await;
    let socket_path = n._dir.path().join(store::DATA_SOCKET);

    let connect = || async {
        let mut sock = UnixConn::connect(&socket_path).await.unwrap();
        sock.write_all(&wire::encode_hello(b"")).await.unwrap();
        assert!(matches!(unix_answer(&mut sock).await, Ok(Some(0))));
        sock
    };
    let a = s.begin().await.unwrap();
    let mut sock = connect().await;
    let (read, pipe) = splice::pipe().unwrap();
    fdpass::send_with_fds(&sock, &wire::Request::pipe().encode(), &[read.as_fd()]).await.unwrap();
    drop(read);
    assert!(matches!(unix_answer(&mut sock).await, Ok(Some(0))));
    let action = a.id();
    let put = |j: u32, side: u32, checksum: u32| wire::Request {
        op: wire::Op::PutSpliced,
        action,
        matrix: m.id,
        i: 0,
        j,
        rows: side,
        cols: side,
        checksum,
        flags: 0,
    };
    let payload = |side: usize, seed: f64| -> Vec<u8> { bytemuck::cast_slice(&block(side, side, seed).data).to_vec() };
    let good = payload(1200, 3.0);
    let crc = store_client::block::checksum(&good);
    let mut damaged = good.clone();
    *damaged.last_mut().unwrap() ^= 1;
    let wrong_shape = payload(1000, 4.0);
    let refused = [
        (put(0, 1200, crc), &damaged, "checksum"),
        (put(1, 1000, store_client::block::checksum(&wrong_shape)), &wrong_shape, "must be 1200x1200"),
    ];
    for (req, body, why) in refused {
        sock.write_all(&req.encode()).await.unwrap();
        let (sent, answer) = tokio::join!(pipe.send(body), unix_answer(&mut sock));
        sent.unwrap();
        let e = answer.unwrap_err();
        assert!(e.to_string().contains(why), "{req:?}: {e}");
    }
    // In step: the same connection and pipe take a good put.
    sock.write_all(&put(0, 1200, crc).encode()).await.unwrap();
    let (sent, answer) = tokio::join!(pipe.send(&good), unix_answer(&mut sock));
    sent.unwrap();
    assert_eq!(answer.unwrap(), Some(0));
    // Cut off after two of its 11 MiB.
    sock.write_all(&put(1, 1200, crc).encode()).await.unwrap();
    pipe.send(&good[..2 << 20]).await.unwrap();
    drop((pipe, sock));
    a.commit().await.unwrap();
    assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), block(1200, 1200, 3.0));
    assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), big);

    // A spliced put with no pipe to take its payload from.
    let b = s.begin().await.unwrap();
    let mut sock = connect().await;
    let req = wire::Request { action: b.id(), ..put(1, 1200, crc) };
    sock.write_all(&req.encode()).await.unwrap();
    let e = unix_answer(&mut sock).await.unwrap_err();
    assert!(matches!(&e, StoreError::InvalidArgument { what } if what.contains("without a pipe")), "{e}");
    assert!(matches!(unix_answer(&mut sock).await, Ok(None)), "the node closes the connection");
    // A file passed as the pipe.
    let mut sock = connect().await;
    let file = tempfile::tempfile().unwrap();
    fdpass::send_with_fds(&sock, &wire::Request::pipe().encode(), &[file.as_fd()]).await.unwrap();
    let e = unix_answer(&mut sock).await.unwrap_err();
    assert!(matches!(&e, StoreError::InvalidArgument { what } if what.contains("not one")), "{e}");
    assert!(matches!(unix_answer(&mut sock).await, Ok(None)), "the node closes the connection");
    // The cut-off and refused puts left the block's lock free.
    b.put_block(m.id, 0, 1, small.clone()).await.unwrap();
    b.commit().await.unwrap();
    assert_eq!(n.client.read_block_committed(m.id, 0, 1).await.unwrap(), small);
}

/// A spliced put of one piece (b ≤ 512) is answered before its payload
/// is read back: its commit checks it beside its batch. One whose bytes do
/// not match its checksum is answered, a read of it inside the action
/// fails its checksum, and its commit fails `Corrupt` with the batch
/// undone: the block keeps its committed value, the other block the same
/// commit wrote is not written, the connection stays in step, and the
/// next action commits.
#[tokio::test]
async fn a_small_spliced_put_that_arrives_damaged_fails_its_commit_and_changes_nothing() {
    use std::os::fd::AsFd;
    use store_client::dataplane::{fdpass, splice};
    use tokio::io::AsyncWriteExt;
    let n = node().await;
    let m = n.client.create_matrix("S", 64, 128, 64).await.unwrap();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    a.put_block(m.id, 0, 0, block(64, 64, 1.0)).await.unwrap();
    a.commit().await.unwrap();

    let mut sock = UnixConn::connect(&n._dir.path().join(store::DATA_SOCKET)).await.unwrap();
    sock.write_all(&wire::encode_hello(b"")).await.unwrap();
    assert!(matches!(unix_answer(&mut sock).await, Ok(Some(0))));
    let (read, pipe) = splice::pipe().unwrap();
    fdpass::send_with_fds(&sock, &wire::Request::pipe().encode(), &[read.as_fd()]).await.unwrap();
    drop(read);
    assert!(matches!(unix_answer(&mut sock).await, Ok(Some(0))));
    let good: Vec<u8> = bytemuck::cast_slice(&block(64, 64, 3.0).data).to_vec();
    let checksum = store_client::block::checksum(&good);
    let mut damaged = good.clone();
    damaged[100] ^= 1;
    let put = |action: u64, j: u32| wire::Request {
        op: wire::Op::PutSpliced,
        action,
        matrix: m.id,
        i: 0,
        j,
        rows: 64,
        cols: 64,
        checksum,
        flags: 0,
    };

    let b = s.begin().await.unwrap();
    b.put_block(m.id, 0, 1, block(64, 64, 5.0)).await.unwrap();
    sock.write_all(&put(b.id(), 0).encode()).await.unwrap();
    let (sent, answer) = tokio::join!(pipe.send(&damaged), unix_answer(&mut sock));
    sent.unwrap();
    assert_eq!(answer.unwrap(), Some(0), "a one-piece spliced put is answered before its check");
    let e = b.get_block(m.id, 0, 0).await.unwrap_err();
    assert!(matches!(&e, StoreError::Corrupt { what } if what.contains("checksum")), "{e}");
    let e = b.commit().await.unwrap_err();
    assert!(matches!(&e, StoreError::Corrupt { what } if what.contains("checksum")), "{e}");
    assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), block(64, 64, 1.0));
    let e = n.client.read_block_committed(m.id, 0, 1).await.unwrap_err();
    assert!(matches!(&e, StoreError::NotFound { .. }), "the failed commit's other block: {e}");

    // In step: the same connection and pipe take a good put, which commits.
    let c = s.begin().await.unwrap();
    sock.write_all(&put(c.id(), 0).encode()).await.unwrap();
    let (sent, answer) = tokio::join!(pipe.send(&good), unix_answer(&mut sock));
    sent.unwrap();
    assert_eq!(answer.unwrap(), Some(0));
    c.commit().await.unwrap();
    assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), block(64, 64, 3.0));
}

/// Reads one reply on a raw Unix data-plane connection: `Ok(Some(len))`
/// for success (nothing after it is read), `Ok(None)` if the node closed
/// the connection instead, the typed error it answered with.
async fn unix_answer(sock: &mut (impl tokio::io::AsyncRead + Unpin)) -> Result<Option<u64>, StoreError> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; wire::REPLY_LEN];
    match sock.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => panic!("reading a reply: {e}"),
    }
    let reply = wire::Reply::decode(&head).unwrap();
    if reply.ok {
        return Ok(Some(reply.len));
    }
    let mut detail = vec![0u8; reply.len as usize];
    sock.read_exact(&mut detail).await.unwrap();
    Err(StoreError::from_detail(&detail))
}

/// A get answered through the node's Unix socket itself (a client that
/// asks for the value rather than the file): 11 MiB fill the socket's
/// buffer many times over while the client is not reading, so the node's
/// writes wait for space (its socket is watched for writing only then,
/// `unix_conn`), and the value arrives whole and in step for the next
/// request on the same connection.
#[tokio::test]
async fn a_large_value_through_the_unix_socket_waits_for_its_reader_and_arrives_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (n, m, _s, small, big) = two_big_blocks().await;
    let mut sock = UnixConn::connect(&n._dir.path().join(store::DATA_SOCKET)).await.unwrap();
    sock.write_all(&wire::encode_hello(b"")).await.unwrap();
    assert!(matches!(unix_answer(&mut sock).await, Ok(Some(0))));
    let get = |j: u32| wire::Request::get(wire::Op::Get, 0, m.id, 0, j, 0);
    for (j, want) in [(1, &big), (0, &small)] {
        sock.write_all(&get(j).encode()).await.unwrap();
        if j == 1 {
            socket_buffer_full(&sock).await;
        }
        let len = unix_answer(&mut sock).await.unwrap().expect("a value");
        let mut value = vec![0u8; len as usize];
        tokio::time::timeout(Duration::from_secs(20), sock.read_exact(&mut value)).await.expect("the value in time").unwrap();
        let (header, payload) = store_client::block::decode(&value, &|| format!("block (0, {j})")).unwrap();
        assert_eq!((header.rows, header.cols), (1200, 1200));
        assert!(payload == bytemuck::cast_slice::<f64, u8>(&want.data), "block (0, {j})");
    }
}

/// Waits until the bytes queued for reading on `sock` stop growing: the
/// node has filled the socket's buffer and waits for space. (For a
/// value of many buffers: one that fits would look the same.)
async fn socket_buffer_full(sock: &UnixConn) {
    use std::os::fd::AsRawFd;
    let queued = || {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut n) };
        assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
        n
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut last, mut same) = (0, 0);
    // Unchanged over several looks a millisecond apart, and not empty.
    while same < 5 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = queued();
        (same, last) = if now > 0 && now == last { (same + 1, now) } else { (0, now) };
        assert!(Instant::now() < deadline, "the node never filled the socket's buffer ({last} bytes queued)");
    }
}

/// The version files in a node's `blocks/` directory that hold a block
/// (spares are empty), each with whether its first page is cached (asked
/// without reading it).
fn version_files_cached(data: &std::path::Path) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    for entry in std::fs::read_dir(data.join("blocks")).unwrap() {
        let f = std::fs::File::open(entry.unwrap().path()).unwrap();
        if f.metadata().unwrap().len() == 0 {
            continue;
        }
        // `mincore` on a mapping: a probing read, even one that may not
        // wait, would start reading the file.
        // SAFETY: a read-only shared mapping of one page of an open file,
        // unmapped before the file is closed; `vec` has room for one page.
        unsafe {
            let page = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
            assert_ne!(page, libc::MAP_FAILED);
            let mut vec = [0u8; 1];
            assert_eq!(libc::mincore(page, 4096, vec.as_mut_ptr()), 0);
            libc::munmap(page, 4096);
            out.push(vec[0] & 1 == 1);
        }
    }
    out
}

/// Drops every version file of a node from the page cache.
fn evict_version_files(data: &std::path::Path) {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(data.join("blocks")).unwrap() {
        let f = std::fs::File::open(entry.unwrap().path()).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a plain syscall on a descriptor owned here.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// A client that reads cold blocks one by one along a row: after its
/// second get the node starts reading the blocks ahead (`readahead`), so
/// their files come into the page cache without being asked for.
#[tokio::test]
async fn cold_gets_along_a_row_start_reading_the_blocks_ahead() {
    let n = node().await;
    let m = n.client.create_matrix("R", 64, 64 * 12, 64).await.unwrap();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    for j in 0..12 {
        a.put_block(m.id, 0, j, block(64, 64, j as f64)).await.unwrap();
    }
    a.commit().await.unwrap();
    let data = n._dir.path();
    evict_version_files(data);
    let before = version_files_cached(data);
    assert_eq!(before.len(), 12);
    assert_eq!(before.iter().filter(|&&c| c).count(), 0, "the page cache kept the files: this test cannot run here");

    let r = s.begin().await.unwrap();
    for j in 0..2 {
        assert_eq!(r.get_block(m.id, 0, j).await.unwrap(), block(64, 64, j as f64));
    }
    // The two read, and the ten ahead of them as their reads finish.
    let deadline = Instant::now() + Duration::from_secs(10);
    let cached = loop {
        let cached = version_files_cached(data).iter().filter(|&&c| c).count();
        if cached == 12 || Instant::now() > deadline {
            break cached;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(cached, 12, "blocks ahead of two cold gets along a row were not read ahead");
    for j in 2..12 {
        assert_eq!(r.get_block(m.id, 0, j).await.unwrap(), block(64, 64, j as f64));
    }
    r.commit().await.unwrap();
}

/// A node that peeks whatever CPU it runs on, with a row of `n`
/// committed 64×64 blocks (block j filled from seed j); a writer's
/// session; and a reader's action that has read blocks (0, 0) and (0, 1),
/// so that the node has peeked (0, 2) for it.
async fn a_reader_two_blocks_along_a_row(n: u32) -> (Node, store_client::MatrixInfo, store_client::Session, store_client::Action) {
    let node = node_with(|c| {
        c.node.lock_timeout = Duration::from_secs(5);
        c.node.peek_on_the_readers_cpu = true;
    })
    .await;
    let m = node.client.create_matrix("R", 64, 64 * n as u64, 64).await.unwrap();
    let s = node.client.open_session("reader").await.unwrap();
    let a = s.begin().await.unwrap();
    for j in 0..n {
        a.put_block(m.id, 0, j, block(64, 64, j as f64)).await.unwrap();
    }
    a.commit().await.unwrap();
    let w = node.client.open_session("writer").await.unwrap();
    let r = s.begin().await.unwrap();
    for j in 0..2 {
        assert_eq!(r.get_block(m.id, 0, j).await.unwrap(), block(64, 64, j as f64));
    }
    (node, m, w, r)
}

#[tokio::test]
async fn a_block_peeked_ahead_of_a_reader_and_replaced_before_its_get_is_read_as_replaced() {
    let (n, m, w, r) = a_reader_two_blocks_along_a_row(6).await;
    // The node has peeked (0, 2) for the reader, which holds no lock on
    // it yet: a writer replaces it.
    let b = w.begin().await.unwrap();
    b.put_block(m.id, 0, 2, block(64, 64, 100.0)).await.unwrap();
    b.commit().await.unwrap();
    assert_eq!(r.get_block(m.id, 0, 2).await.unwrap(), block(64, 64, 100.0), "the peeked version came back");
    assert_eq!(n.client.peeked_gets(), store_client::dataplane::PeekedGets { kept: 0, read_again: 1 });
    // Unchanged ones are kept as read.
    for j in 3..6 {
        assert_eq!(r.get_block(m.id, 0, j).await.unwrap(), block(64, 64, j as f64));
    }
    assert_eq!(n.client.peeked_gets(), store_client::dataplane::PeekedGets { kept: 3, read_again: 1 });
    r.commit().await.unwrap();
}

#[tokio::test]
async fn a_get_of_a_peeked_block_that_waits_for_a_writer_returns_what_the_writer_committed() {
    let (n, m, w, r) = a_reader_two_blocks_along_a_row(4).await;
    // A writer holds (0, 2) with a new version staged: the reader's get
    // reads the peeked (old) file, then waits for the lock.
    let b = w.begin().await.unwrap();
    b.put_block(m.id, 0, 2, block(64, 64, 200.0)).await.unwrap();
    let waits = n.client.node_metrics().await.unwrap().lock_waits;
    let reader = tokio::spawn(async move {
        let got = r.get_block(m.id, 0, 2).await;
        (r, got)
    });
    lock_waits_reach(&n.client, waits, 1).await;
    assert!(!reader.is_finished(), "the get did not wait for the writer's lock");
    b.commit().await.unwrap();
    let (r, got) = reader.await.unwrap();
    assert_eq!(got.unwrap(), block(64, 64, 200.0), "the get returned the version it read before its lock");
    assert_eq!(n.client.peeked_gets().read_again, 1);
    r.commit().await.unwrap();
}

/// A node with a matrix of two committed blocks of 1200² doubles (11 MiB:
/// several of the node's pieces, many pipe-fulls), a session, and the two
/// blocks' values.
async fn two_big_blocks() -> (Node, store_client::MatrixInfo, store_client::Session, BlockData, BlockData) {
    let n = node().await;
    let m = n.client.create_matrix("P", 1200, 2400, 1200).await.unwrap();
    let (small, big) = (block(1200, 1200, 1.0), block(1200, 1200, 2.0));
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    a.put_block(m.id, 0, 0, small.clone()).await.unwrap();
    a.put_block(m.id, 0, 1, big.clone()).await.unwrap();
    a.commit().await.unwrap();
    (n, m, s, small, big)
}

/// Sends a request and its body on a raw data-plane connection; the typed
/// error the node refused it with.
async fn refusal(sock: &mut tokio::net::TcpStream, req: &wire::Request, body: &[u8]) -> StoreError {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    sock.write_all(&req.encode()).await.unwrap();
    sock.write_all(body).await.unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    sock.read_exact(&mut head).await.unwrap();
    let reply = wire::Reply::decode(&head).unwrap();
    let mut detail = vec![0u8; reply.len as usize];
    sock.read_exact(&mut detail).await.unwrap();
    assert!(!reply.ok, "{req:?} was accepted");
    StoreError::from_detail(&detail)
}

/// Sends `garbage` on a new connection to `addr`; whether the node closes
/// it (reading whatever it answers first) within `patience`.
async fn closes_after(addr: std::net::SocketAddr, garbage: &[u8], patience: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(garbage).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let drained = async {
        while let Ok(n) = sock.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(patience, drained).await.is_ok()
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
