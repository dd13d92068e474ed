//! The store node: a persistent object store (RocksDB) with nested atomic
//! actions and recoverable queues, served over gRPC.
//!
//! [`start`] opens (or recovers) the data directory and serves until
//! [`Running::shutdown`]; `master serve` and the embedded store of
//! `master demo` are both this. The durability design is in
//! `store/DURABILITY.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), store::ServeError> {
//! let config = store::Config::new("/tmp/data".into(), "127.0.0.1:0".parse().unwrap());
//! let node = store::start(config).await?;
//! println!("serving on {}", node.addr());
//! node.shutdown().await?;
//! # Ok(()) }
//! ```

mod backup;
mod blocks;
mod dataplane;
mod db;
pub mod disk;
mod files;
mod holders;
mod keys;
mod listen;
mod matrix_record;
mod metrics;
mod node;
mod objects;
mod open_files;
mod readahead;
mod rpc;
mod spliced;
mod transports;
mod undo;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use store_client::proto::store_server::StoreServer;
use store_client::{host_identity, ServerTls, StoreError, MAX_FRAME_BYTES, MAX_MESSAGE_BYTES};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Status};

pub use backup::BackupReport;
pub use blocks::MAX_BLOCK;
/// The bag a bag's dead-lettered elements move to (for `master retry`).
pub use queue::dead_letter_bag;

/// The data plane's Unix socket, in the data directory.
pub const DATA_SOCKET: &str = "blocks.sock";
/// Each direction's buffer of an in-process connection
/// ([`Running::client`]).
const IN_PROCESS_BUFFER: usize = 1 << 20;
pub use node::NodeConfig;
pub use objects::ObjectsConfig;

/// Everything a store node is started with.
#[derive(Clone, Debug)]
pub struct Config {
    pub data: PathBuf,
    pub listen: SocketAddr,
    /// Where the block data plane listens; `None`: the gRPC address's IP
    /// with a port the system picks (clients learn it over gRPC).
    pub data_listen: Option<SocketAddr>,
    /// Clients must present this shared token.
    pub token: Option<String>,
    /// TLS on the gRPC and data-plane TCP ports (the Unix sockets, for
    /// clients on this host, stay plain).
    pub tls: Option<ServerTls>,
    /// Serve a non-loopback address without a token. Off, such a node
    /// refuses to start ([`ServeError::Insecure`]).
    pub insecure: bool,
    /// RocksDB block cache, MiB.
    pub cache_mib: usize,
    pub node: NodeConfig,
}

impl Config {
    pub fn new(data: PathBuf, listen: SocketAddr) -> Config {
        Config { data, listen, data_listen: None, token: None, tls: None, insecure: false, cache_mib: 256, node: NodeConfig::default() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the store at {path}: {source}")]
    Open { path: PathBuf, source: StoreError },
    #[error("cannot read the store at {path}: {source}")]
    Read { path: PathBuf, source: StoreError },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("server task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// A node that other hosts can reach, with nothing to tell its
    /// clients from anyone else's.
    #[error(
        "refusing to serve {addr} without a cluster token: other hosts can reach it. Give --token (or STORE_TOKEN), \
         or --insecure to serve it open on a network you trust"
    )]
    Insecure { addr: SocketAddr },
}

/// A serving node.
pub struct Running {
    addr: SocketAddr,
    data_addr: SocketAddr,
    stop: watch::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
    writes_stopped: watch::Receiver<Option<String>>,
    /// Hands the node the server end of an in-process connection.
    in_process: mpsc::Sender<tokio::io::DuplexStream>,
}

impl Running {
    /// The address it listens on (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The block data plane's address.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
    }

    /// A client of this node from inside its own process, over in-memory
    /// streams (`Client::connect_in_process`): control calls only.
    pub async fn client(&self, token: Option<&str>) -> Result<store_client::Client, store_client::StoreError> {
        let to_node = self.in_process.clone();
        store_client::Client::connect_in_process(
            move || {
                let to_node = to_node.clone();
                async move {
                    let (ours, theirs) = tokio::io::duplex(IN_PROCESS_BUFFER);
                    to_node.send(theirs).await.map_err(|_| std::io::Error::other("the node has stopped"))?;
                    Ok(ours)
                }
            },
            token,
        )
        .await
    }

    /// Resolves, with the reason, if the node stops writing: a commit
    /// whose versions failed to sync could not be undone either (see
    /// `store/DURABILITY.md`). It then refuses every write until it is
    /// restarted, and its open settles that commit from the disk; a
    /// serving process should exit so that its supervisor restarts it.
    pub fn writes_stopped(&self) -> impl std::future::Future<Output = String> + 'static {
        let mut rx = self.writes_stopped.clone();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(why) => why.clone().unwrap_or_default(),
                // The node is gone: it will not stop writing now.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Stops accepting, lets in-flight requests finish, closes the store.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.stop.send(());
        self.task.await?
    }

    /// Serves until the server fails (or forever).
    pub async fn wait(self) -> Result<(), ServeError> {
        let _keep = self.stop;
        self.task.await?
    }
}

/// Opens the data directory (recovering after a crash) and starts serving.
// The token interceptor's closure returns tonic's `Status`, a large `Err`.
#[allow(clippy::result_large_err)]
pub async fn start(config: Config) -> Result<Running, ServeError> {
    for addr in [Some(config.listen), config.data_listen].into_iter().flatten() {
        if !addr.ip().is_loopback() && config.token.is_none() && !config.insecure {
            return Err(ServeError::Insecure { addr });
        }
    }
    let (db, recovered) = db::Db::open_with(&config.data, config.cache_mib, config.node.disk.clone(), config.node.objects.as_ref())
        .map_err(|source| ServeError::Open { path: config.data.clone(), source })?;
    tracing::info!(
        boot = recovered.boot,
        n_queue_elements = recovered.queue.len(),
        n_garbage_versions = recovered.n_garbage_versions,
        n_commits_undone = recovered.n_commits_undone,
        "store opened at {}",
        config.data.display()
    );
    let records = db.matrix_records().map_err(|source| ServeError::Read { path: config.data.clone(), source })?;
    let matrices = blocks::Matrices::load(records);
    let writes_stopped = db.writes_stopped();
    let node = Arc::new(node::Node::new(db.clone(), recovered, matrices, config.node.clone()));

    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|source| ServeError::Bind { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: config.listen, source })?;

    let data_addr = config.data_listen.unwrap_or(SocketAddr::new(addr.ip(), 0));
    let data_listener = tokio::net::TcpListener::bind(data_addr).await.map_err(|source| ServeError::Bind { addr: data_addr, source })?;
    let data_addr = data_listener.local_addr().map_err(|source| ServeError::Bind { addr: data_addr, source })?;
    let data_port = data_addr.port();
    let (unix_path, unix_listener) = bind_unix(&config.data.join(DATA_SOCKET), "local block transfers").unzip();
    // An earlier build's gRPC socket: nothing listens there any more.
    let _ = std::fs::remove_file(config.data.join("rpc.sock"));
    // The node's own process (its dashboard) calls it over in-memory
    // streams, not a socket: no file, no port, no certificate.
    let (in_process, in_process_streams) = mpsc::channel::<tokio::io::DuplexStream>(8);
    let transports = Arc::new(transports::Transports::default());
    // At shutdown the session streams end first: the servers' graceful
    // shutdown waits for them. The data plane answers what it is serving.
    let (stop, stopped) = watch::channel(());
    let node_id = uuid::Uuid::new_v4();
    let data_plane = tokio::spawn(dataplane::serve(
        (data_listener, unix_listener),
        node.clone(),
        config.token.clone(),
        config.tls.as_ref().map(ServerTls::acceptor),
        transports.clone(),
        node_id,
        stopped.clone(),
    ));
    let reaper = spawn_reaper(node.clone());
    tokio::spawn({
        let (node, mut stopped) = (node.clone(), stopped.clone());
        async move {
            let _ = stopped.changed().await;
            node.begin_shutdown();
        }
    });
    let token = config.token.clone().map(|t| format!("Bearer {t}"));
    let rpc = rpc::Rpc { node, data_port, unix_path, node_id, host_id: host_identity(), transports, tls: config.tls.is_some() };
    let service = StoreServer::new(rpc).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES);
    // One service, two ways in: TCP, and in-memory streams from this process.
    let router = || {
        let token = token.clone();
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(32 << 20)
            // Block chunks arrive in frames this large instead of h2's default
            // 16 KiB: a 32 MiB put is 32 frames, not 2048 (each one a read,
            // a decode and a wake-up on both sides).
            .max_frame_size(Some(MAX_FRAME_BYTES))
            .http2_keepalive_interval(Some(Duration::from_secs(1)))
            .http2_keepalive_timeout(Some(Duration::from_secs(3)))
            .layer(tonic::service::interceptor(move |req: Request<()>| check_token(token.as_deref(), req)))
            .add_service(service.clone())
    };
    type Serving = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>>;
    let server: Serving = match &config.tls {
        Some(tls) => {
            let (secure, plain) = listen::tls(listener, tls.acceptor());
            // Plaintext clients of a TLS node get every call refused with
            // the reason, rather than a dropped connection read as an outage.
            let refuse = |_: Request<()>| -> Result<Request<()>, Status> {
                Err(StoreError::Unauthenticated { what: "this store node requires TLS: give the client --tls-ca (STORE_TLS_CA)".into() }
                    .to_status())
            };
            let refusing = tonic::transport::Server::builder()
                .layer(tonic::service::interceptor(refuse))
                .add_service(service.clone())
                .serve_with_incoming_shutdown(plain, shutdown_signal(stopped.clone()));
            let secure = router().serve_with_incoming_shutdown(secure, shutdown_signal(stopped.clone()));
            Box::pin(async move {
                let (secure, refusing) = tokio::join!(secure, refusing);
                secure.and(refusing)
            })
        }
        None => Box::pin(router().serve_with_incoming_shutdown(listen::plain(listener), shutdown_signal(stopped.clone()))),
    };
    let streams = ReceiverStream::new(in_process_streams).map(Ok::<_, std::io::Error>);
    let local = router().serve_with_incoming_shutdown(streams, shutdown_signal(stopped));
    let task = tokio::spawn(async move {
        let (r, local) = tokio::join!(server, local);
        reaper.abort();
        let _ = data_plane.await;
        if let Err(e) = db.flush() {
            tracing::warn!("flush at shutdown failed (the WAL still has everything): {e}");
        }
        // Closed when the last request's task lets go of the node (a
        // connection's, after the servers ended), so that the directory
        // can be opened again as soon as this returns.
        let deadline = std::time::Instant::now() + CLOSE_GRACE;
        while Arc::strong_count(&db) > 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if Arc::strong_count(&db) > 1 {
            tracing::warn!("the store is still in use {CLOSE_GRACE:?} after the stop; it closes when the last request ends");
        }
        r.and(local).map_err(ServeError::from)
    });
    let tls = match &config.tls {
        Some(t) if t.is_mutual() => "TLS, client certificates required",
        Some(_) => "TLS",
        None => "plaintext",
    };
    let auth = if config.token.is_some() { "token required" } else { "no token" };
    tracing::info!("store node listening on {addr} (gRPC) and {data_addr} (block data plane), {tls}, {auth}");
    Ok(Running { addr, data_addr, stop, task, writes_stopped, in_process })
}

/// How long a stop waits, once its servers ended, for the requests still
/// holding the store.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Resolves at [`Running::shutdown`], or when the `Running` is dropped.
async fn shutdown_signal(mut stopped: watch::Receiver<()>) {
    let _ = stopped.changed().await;
}

/// Binds a Unix socket at `path` (a previous run's is removed first); on
/// failure, warns and returns `None`: local clients then use TCP.
fn bind_unix(path: &std::path::Path, what: &str) -> Option<(PathBuf, tokio::net::UnixListener)> {
    let _ = std::fs::remove_file(path);
    match tokio::net::UnixListener::bind(path) {
        Ok(l) => Some((path.to_owned(), l)),
        Err(e) => {
            tracing::warn!("no Unix socket for {what} at {}: {e}; local clients use TCP", path.display());
            None
        }
    }
}

// Tonic's interceptor signature: its `Status` is the large `Err`.
#[allow(clippy::result_large_err)]
fn check_token(expected: Option<&str>, req: Request<()>) -> Result<Request<()>, Status> {
    let Some(expected) = expected else { return Ok(req) };
    match req.metadata().get("authorization").map(|v| v.as_bytes()) {
        // Constant time: how far a guess matched must not show in the time.
        Some(got) if store_client::dataplane::wire::tokens_equal(got, expected.as_bytes()) => Ok(req),
        Some(_) => Err(StoreError::Unauthenticated { what: "wrong cluster token".into() }.to_status()),
        None => {
            Err(StoreError::Unauthenticated { what: "this store node needs the cluster token (--token / STORE_TOKEN)".into() }.to_status())
        }
    }
}

fn spawn_reaper(node: Arc<node::Node>) -> tokio::task::JoinHandle<()> {
    let period = (node.config.lease / 10).clamp(Duration::from_millis(10), Duration::from_millis(250));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            node.reap_expired();
        }
    })
}
