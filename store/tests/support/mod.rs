//! An in-process store node for the integration tests, and what they
//! share: the ways a block can travel, waits on the node's counters.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use store_client::{BlockData, Client};

pub struct Node {
    pub _dir: tempfile::TempDir,
    pub running: Option<store::Running>,
    pub client: Client,
}

pub async fn node_with(f: impl FnOnce(&mut store::Config)) -> Node {
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

pub async fn node() -> Node {
    node_with(|_| {}).await
}

/// The ways a block can travel; block tests run on each.
#[derive(Clone, Copy, Debug)]
pub enum Path {
    Unix,
    /// The Unix socket with puts through the socket, not a pipe.
    UnixSocket,
    Tcp,
    Grpc,
}
pub const PATHS: [Path; 4] = [Path::Unix, Path::UnixSocket, Path::Tcp, Path::Grpc];

pub async fn node_over(path: Path) -> Node {
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
pub async fn lock_waits_reach(client: &Client, before: u64, n: u64) {
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
pub async fn dequeue_waits_reach(client: &Client, before: u64, n: u64) {
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

pub fn block(rows: usize, cols: usize, seed: f64) -> BlockData {
    BlockData { rows, cols, data: (0..rows * cols).map(|k| seed + k as f64).collect() }
}

/// Sends `garbage` on a new connection to `addr`; whether the node closes
/// it (reading whatever it answers first) within `patience`.
pub async fn closes_after(addr: std::net::SocketAddr, garbage: &[u8], patience: Duration) -> bool {
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

/// Says hello on a new data-plane connection (no token) and reads the
/// node's answer: its id.
pub async fn hello(sock: &mut (impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin)) {
    use store_client::dataplane::wire;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    sock.write_all(&wire::encode_hello(b"")).await.unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    sock.read_exact(&mut head).await.unwrap();
    let reply = wire::Reply::decode(&head).unwrap();
    assert!(reply.ok && reply.len == wire::NODE_ID_LEN, "a hello is answered with the node's id: {reply:?}");
    let mut id = [0u8; wire::NODE_ID_LEN as usize];
    sock.read_exact(&mut id).await.unwrap();
}
