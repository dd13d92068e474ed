//! Fuzz body: protobuf requests into an in-process store node's handlers,
//! through its data plane's `Op::Call` (the bodies the gRPC handlers run
//! too, `store::rpc`). The first byte picks the method; the rest is the
//! request. Every input gets an answer, a reply or a typed error, and the
//! connection stays in step: the next call on it is answered as well.
//! Shared by `fuzz_targets/node_call.rs` and `store/tests/fuzz_replay.rs`.

use std::sync::OnceLock;

use store_client::dataplane::unix_conn::UnixConn;
use store_client::dataplane::wire;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Fixture {
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    _node: store::Running,
    conn: tokio::sync::Mutex<UnixConn>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        let dir = tempfile::tempdir().expect("a directory");
        let (node, conn) = rt.block_on(async {
            let mut config = store::Config::new(dir.path().to_owned(), "127.0.0.1:0".parse().expect("an address"));
            config.cache_mib = 8;
            config.node.lock_timeout = std::time::Duration::from_millis(50);
            let node = store::start(config).await.expect("a node");
            let mut conn = UnixConn::connect(&dir.path().join(store::DATA_SOCKET)).await.expect("the data socket");
            conn.write_all(&wire::encode_hello(b"")).await.expect("hello");
            let (ok, len) = reply(&mut conn).await;
            assert!(ok && len == wire::NODE_ID_LEN, "the hello is answered with the node's id");
            let mut id = [0u8; wire::NODE_ID_LEN as usize];
            conn.read_exact(&mut id).await.expect("the node's id");
            (node, conn)
        });
        Fixture { rt, _dir: dir, _node: node, conn: tokio::sync::Mutex::new(conn) }
    })
}

async fn reply(conn: &mut UnixConn) -> (bool, u64) {
    let mut b = [0u8; wire::REPLY_LEN];
    conn.read_exact(&mut b).await.expect("a reply");
    let r = wire::Reply::decode(&b).expect("a well-formed reply");
    (r.ok, r.len)
}

/// Sends one call and reads its whole answer; returns whether it was a reply.
async fn call(conn: &mut UnixConn, method: wire::Method, body: &[u8]) -> bool {
    conn.write_all(&wire::Request::call(method, body.len() as u32).encode()).await.expect("request sent");
    conn.write_all(body).await.expect("body sent");
    let (ok, len) = reply(conn).await;
    let mut answer = vec![0u8; len as usize];
    conn.read_exact(&mut answer).await.expect("the answer");
    if !ok {
        // A typed error, whatever the input.
        let _ = store_client::StoreError::from_detail(&answer);
    }
    ok
}

pub(crate) fn run(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else { return };
    let method = wire::Method::ALL[pick as usize % wire::Method::ALL.len()];
    let f = fixture();
    f.rt.block_on(async {
        let mut conn = f.conn.lock().await;
        call(&mut conn, method, body).await;
        // Still in step: an empty read of a key nobody writes.
        let probe = prost::Message::encode_to_vec(&store_client::proto::SmallRef { key: "fuzz/probe".into(), ..Default::default() });
        let _ = call(&mut conn, wire::Method::ReadSmall, &probe).await;
    });
}
