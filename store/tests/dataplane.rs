//! The block data plane of a real store node, in-process: garbage and
//! damaged or cut-off puts over TCP and the Unix socket, the pipe of
//! spliced puts, large values through the socket, and the node's
//! readahead and peeks for a reader along a line.

mod support;

use std::time::{Duration, Instant};

use store_client::dataplane::unix_conn::UnixConn;
use store_client::dataplane::wire;
use store_client::{BlockData, StoreError};
use support::*;

#[tokio::test]
async fn garbage_on_the_data_plane_is_refused_and_blocks_keep_flowing() {
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
    hello(&mut sock).await;
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
    hello(&mut sock).await;
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
    let mut head = [0u8; wire::REPLY_LEN];
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
        hello(&mut sock).await;
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
    hello(&mut sock).await;
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
    hello(&mut sock).await;
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
