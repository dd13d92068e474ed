//! A real store node (RocksDB + gRPC on loopback) in-process, driven
//! through the client library: the semantics over the wire.

use std::time::{Duration, Instant};

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
    let n = node().await;
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

#[tokio::test]
async fn a_32_mib_block_streams_both_ways() {
    let n = node().await;
    let m = n.client.create_matrix("big", 2048, 2048, 2048).await.unwrap();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    let big = block(2048, 2048, 0.5);
    a.put_block(m.id, 0, 0, big.clone()).await.unwrap();
    a.commit().await.unwrap();
    assert_eq!(n.client.read_block_committed(m.id, 0, 0).await.unwrap(), big);
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
    let a_waits = async { a.read_small("y", false).await };
    let b_closes_cycle = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.read_small("x", false).await
    };
    let (ra, rb) = tokio::join!(a_waits, b_closes_cycle);
    assert!(matches!(rb, Err(StoreError::Deadlock { .. })), "{rb:?}");
    // a still waits for y and times out: b holds it until it ends.
    assert!(matches!(ra, Err(StoreError::LockTimeout { .. })), "{ra:?}");
}

#[tokio::test]
async fn a_waiter_gets_the_lock_when_the_holder_commits() {
    let n = node_with(|c| c.node.lock_timeout = Duration::from_secs(5)).await;
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    let b = s.begin().await.unwrap();
    a.write_small("x", b"new").await.unwrap();
    let reader = async { b.read_small("x", false).await };
    let committer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    let waiter = async { b.dequeue("bag", Duration::from_secs(5)).await };
    let aborter = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
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

#[tokio::test]
async fn bad_input_gets_typed_errors_and_loses_nothing() {
    let n = node().await;
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
        let c = Client::connect(&addr, token).await.unwrap();
        let e = c.list_matrices().await.unwrap_err();
        assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");
    }
}

#[tokio::test]
async fn a_request_after_shutdown_is_store_unavailable() {
    let mut n = node().await;
    n.running.take().unwrap().shutdown().await.unwrap();
    let e = n.client.list_matrices().await.unwrap_err();
    assert!(matches!(e, StoreError::StoreUnavailable { .. }), "{e}");
    assert!(e.is_retryable());
}

#[tokio::test]
async fn garbage_on_the_port_is_refused_and_the_node_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let n = node().await;
    let addr = n.running.as_ref().unwrap().addr();
    let s = n.client.open_session("t").await.unwrap();
    let a = s.begin().await.unwrap();
    a.write_small("kept", b"1").await.unwrap();
    a.commit().await.unwrap();
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xffu8; 4096][..], b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x99\xff"] {
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        sock.write_all(garbage).await.unwrap();
        let mut buf = vec![0u8; 1024];
        // The node answers (an HTTP/2 GOAWAY or nothing) and closes.
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the node should close a connection speaking garbage");
    }
    assert_eq!(n.client.peek_small("kept").await.unwrap(), Some(b"1".to_vec()));
    let b = s.begin().await.unwrap();
    b.write_small("after", b"2").await.unwrap();
    b.commit().await.unwrap();
}
