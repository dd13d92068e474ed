//! The client library slaves, the master CLI and benchmarks use.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};
use uuid::Uuid;

use crate::block::{self, BlockHeader};
use crate::connect::{host_identity, BlocksOver, ConnectOptions};
use crate::dataplane::wire::{self, Method};
use crate::dataplane::{DataPlane, Target};
use crate::proto::{self, store_client::StoreClient};
use crate::tls::ClientTls;
use crate::StoreError;

mod channel;
mod session;

pub(crate) use channel::error_chain;
use channel::{bearer, configure, connect_data_plane, connect_failed, data_plane_info, first_call_failed, rpc_over, split_host_port};
use session::{get_block, get_blocks, read_small, task_from, AbortOnDrop};
pub use session::{Action, BlockReader, BlockWriter, Session};

/// Blocks travel in chunks of this size: far below any message limit, big
/// enough that per-message costs vanish.
pub const CHUNK_BYTES: usize = 1 << 20;
/// HTTP/2 frames either side accepts, larger than a chunk message, so a
/// chunk travels in one DATA frame instead of h2's default 16 KiB frames.
pub const MAX_FRAME_BYTES: u32 = 4 << 20;
/// Largest message either side accepts.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

type Rpc = StoreClient<InterceptedService<Channel, Auth>>;
type Result<T> = std::result::Result<T, StoreError>;

#[derive(Clone)]
struct Auth(Option<MetadataValue<Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

/// A matrix as the store records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatrixInfo {
    pub id: Uuid,
    pub name: String,
    pub n_rows: u64,
    pub n_cols: u64,
    pub block: u32,
}

impl TryFrom<proto::MatrixInfo> for MatrixInfo {
    type Error = StoreError;
    fn try_from(m: proto::MatrixInfo) -> Result<Self> {
        Ok(MatrixInfo { id: uuid_from(&m.id)?, name: m.name, n_rows: m.n_rows, n_cols: m.n_cols, block: m.block })
    }
}

pub(crate) fn uuid_from(bytes: &[u8]) -> Result<Uuid> {
    Uuid::from_slice(bytes).map_err(|_| StoreError::InvalidArgument { what: format!("bad id of {} bytes", bytes.len()) })
}

/// A block's values, column-major.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockData {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

/// A task handed out by a dequeue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub bag: String,
    pub seq: u64,
    pub payload: Vec<u8>,
    pub attempts: u32,
    pub returns: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dequeue {
    Task(Task),
    /// The bag has no elements at all.
    Empty,
    /// Elements remain, all held by other actions.
    NoneAvailable,
}

/// An open session, as `Client::list_sessions` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionInfo {
    pub session: u64,
    /// The name the client opened it with (a slave's `--name`).
    pub client_name: String,
    /// The client's address as the node saw it.
    pub peer: String,
    pub age_ms: u64,
    pub since_heartbeat_ms: u64,
    /// Actions open in it.
    pub n_actions: u32,
    /// The queue elements its actions hold: "bag#seq".
    pub tasks: Vec<String>,
}

/// What a backup of a node ([`Client::backup`]) wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeBackup {
    /// Block version files in it.
    pub n_versions: u64,
    /// Of their bytes: hard-linked (the backup on the store's
    /// filesystem: none written) and copied.
    pub bytes_linked: u64,
    pub bytes_copied: u64,
    /// RocksDB's checkpoint.
    pub db_bytes: u64,
    /// The backup's time at the node.
    pub seconds: f64,
}

/// A node's connections by the way they came in, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Block data-plane connections over TCP (TLS included).
    pub data_tcp_connections: u64,
    /// Block data-plane connections over its Unix socket (clients on its host).
    pub data_unix_connections: u64,
    /// Sessions opened over TCP.
    pub tcp_sessions: u64,
    /// Sessions opened over its Unix socket.
    pub unix_sessions: u64,
    /// Whether its TCP ports serve TLS.
    pub tls: bool,
    /// Data-plane connections refused at their hello or TLS handshake.
    pub refused_connections: u64,
}

/// Counts for one bag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BagStats {
    pub free: u64,
    pub taken: u64,
    pub dead: u64,
}

/// A connection to a store node. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    rpc: Rpc,
    addr: String,
    /// The node's block data plane; `None`: blocks go over gRPC.
    plane: Option<Arc<DataPlane>>,
    options: ConnectOptions,
}

impl Client {
    /// Connects once with a token and nothing else (plaintext, local fast
    /// path allowed); see [`Client::connect_with`].
    pub async fn connect(addr: &str, token: Option<&str>) -> Result<Client> {
        Client::connect_with(addr, &ConnectOptions::with_token(token)).await
    }

    /// Connects once; fails with `StoreUnavailable` if the node is not
    /// there, `Unauthenticated` for a token or certificate it refuses, and
    /// `IncompatibleBuild` for a node of another build.
    ///
    /// A client on the node's own host (same machine and network
    /// namespace, whatever address it was given) moves its blocks and
    /// makes its tasks' calls over the node's Unix socket, once the node
    /// has answered there with its own id; elsewhere, or with
    /// `options.local` off, over TCP (and TLS, when `options.tls` is set).
    /// Other calls (sessions, matrices) take gRPC over TCP.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Client> {
        let auth = bearer(options.token.as_deref())?;
        let (host, _) = split_host_port(addr)?;
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| StoreError::InvalidArgument { what: format!("store address {addr:?}: {e}") })?;
        if let Some(tls) = &options.tls {
            endpoint = endpoint.tls_config(tls.grpc(host)).map_err(|e| StoreError::InvalidArgument { what: format!("TLS: {e}") })?;
        }
        let channel = configure(endpoint).connect().await.map_err(|e| connect_failed(addr, options, &e))?;
        let rpc = rpc_over(channel, Auth(auth));
        let info = data_plane_info(&rpc).await.map_err(|e| first_call_failed(addr, options, e))?;
        let mut client = Client { rpc, addr: addr.to_owned(), plane: None, options: options.clone() };
        let Some(info) = info else { return Ok(client) };
        if info.wire_version != 0 && info.wire_version != u32::from(wire::own_version()) {
            return Err(StoreError::IncompatibleBuild { client: wire::own_version(), node: info.wire_version as u16 });
        }
        if options.blocks == BlocksOver::DataPlane {
            client.plane = connect_data_plane(&info, addr, options).await?;
        }
        Ok(client)
    }

    /// Connects to a node in this very process through `connect`, which
    /// hands the node one end of a new in-memory stream and returns the
    /// other (`store::Running::client`): control calls only, blocks over
    /// gRPC. For the node's own dashboard (`master serve --http`), which
    /// reads what `master status` reads without a certificate of its own,
    /// whatever TLS the node's ports serve.
    pub async fn connect_in_process<F, Fut>(connect: F, token: Option<&str>) -> Result<Client>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<tokio::io::DuplexStream>> + Send + 'static,
    {
        let auth = bearer(token)?;
        let connect = Arc::new(connect);
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let stream = connect();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream.await?)) }
        });
        // The URI only fills in the requests' :authority; the connector ignores it.
        let channel = configure(Endpoint::from_static("http://in-process"))
            .connect_with_connector(connector)
            .await
            .map_err(|e| StoreError::StoreUnavailable { what: format!("the node in this process: {e}") })?;
        let options = ConnectOptions { token: token.map(str::to_owned), blocks: BlocksOver::Grpc, ..ConnectOptions::default() };
        Ok(Client { rpc: rpc_over(channel, Auth(auth)), addr: "in-process".into(), plane: None, options })
    }

    /// This client with blocks over the gRPC stream RPCs instead of the
    /// data plane (to compare the two, or past a firewall that only lets
    /// the gRPC port through).
    pub fn blocks_over_grpc(mut self) -> Client {
        self.plane = None;
        self
    }

    /// This client with blocks over the data plane's TCP port even on the
    /// node's machine (to compare with its Unix socket).
    pub async fn blocks_over_tcp(mut self) -> Result<Client> {
        self.plane = match data_plane_info(&self.rpc).await? {
            Some(info) => {
                let options = ConnectOptions { local: false, ..self.options.clone() };
                connect_data_plane(&info, &self.addr, &options).await?
            }
            None => None,
        };
        Ok(self)
    }

    /// This client with its block puts through the data plane's Unix
    /// socket rather than a pipe (to compare the two; see
    /// `dataplane::splice`). No change for a client without that socket.
    pub async fn puts_through_socket(mut self) -> Result<Client> {
        if let Some(plane) = &self.plane {
            self.plane = Some(Arc::new(plane.without_pipes().await?));
        }
        Ok(self)
    }

    /// Sends this client's gets of one block under a read lock through
    /// `cache` (`store_client::cache`). False where it cannot: blocks go
    /// over gRPC, or over the node's Unix socket (on the node's machine a
    /// get reads the node's page cache already).
    pub fn attach_block_cache(&self, cache: Arc<crate::cache::BlockCache>) -> bool {
        self.plane.as_ref().is_some_and(|p| p.attach_cache(cache))
    }

    /// Whether blocks travel over the node's data plane.
    pub fn has_data_plane(&self) -> bool {
        self.plane.is_some()
    }

    /// Whether blocks travel over the node's Unix socket (a client on the
    /// node's host).
    pub fn blocks_locally(&self) -> bool {
        self.plane.as_ref().is_some_and(|p| p.is_local())
    }

    /// How this client's gets of blocks the node had peeked went
    /// (`dataplane::wire::Peek`): all zero off the node's machine.
    pub fn peeked_gets(&self) -> crate::dataplane::PeekedGets {
        self.plane.as_ref().map(|p| p.peeked_gets()).unwrap_or_default()
    }

    /// Connects, retrying with exponential back-off (100 ms up to 2 s) for
    /// at most `patience` (forever if `None`), logging each failure.
    pub async fn connect_retrying(addr: &str, token: Option<&str>, patience: Option<Duration>) -> Result<Client> {
        Client::connect_with_retrying(addr, &ConnectOptions::with_token(token), patience).await
    }

    /// [`Client::connect_with`], retrying as [`Client::connect_retrying`]
    /// does. Errors that waiting cannot cure (a refused token, a node of
    /// another build, an untrusted certificate) return at once.
    pub async fn connect_with_retrying(addr: &str, options: &ConnectOptions, patience: Option<Duration>) -> Result<Client> {
        let start = tokio::time::Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match Client::connect_with(addr, options).await {
                Ok(c) => return Ok(c),
                Err(e @ StoreError::StoreUnavailable { .. }) => {
                    if patience.is_some_and(|p| start.elapsed() + delay > p) {
                        return Err(e);
                    }
                    tracing::warn!("store node at {addr} unreachable, retrying in {delay:?}: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Opens a session kept alive by heartbeats on a background task (so a
    /// long computation elsewhere never lets the lease lapse).
    pub async fn open_session(&self, client_name: &str) -> Result<Session> {
        let (tx, rx) = mpsc::channel(4);
        let hb = proto::Heartbeat { client_name: client_name.to_owned() };
        tx.send(hb.clone()).await.expect("receiver held below");
        let mut events = self.rpc.clone().open_session(ReceiverStream::new(rx)).await?.into_inner();
        let first = events.message().await?.ok_or_else(|| StoreError::StoreUnavailable { what: "session stream closed at open".into() })?;
        let lease = Duration::from_millis(first.lease_ms.max(40));
        let (alive_tx, alive) = watch::channel(true);
        let heartbeat = tokio::spawn(async move {
            let mut tick = tokio::time::interval(lease / 4);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if tx.send(hb.clone()).await.is_err() { break; }
                    }
                    ev = events.message() => match ev {
                        Ok(Some(_)) => {}
                        _ => break,
                    },
                }
            }
            let _ = alive_tx.send(false);
        });
        Ok(Session {
            client: self.clone(),
            id: first.session,
            lease,
            alive,
            heartbeat: Arc::new(AbortOnDrop(heartbeat)),
            begun_ahead: Arc::default(),
        })
    }

    pub async fn create_matrix(&self, name: &str, n_rows: u64, n_cols: u64, block: u32) -> Result<MatrixInfo> {
        let m = proto::MatrixInfo { id: Bytes::new(), name: name.to_owned(), n_rows, n_cols, block };
        self.rpc.clone().create_matrix(m).await?.into_inner().try_into()
    }

    pub async fn matrix_by_name(&self, name: &str) -> Result<MatrixInfo> {
        let r = proto::MatrixRef { id: Bytes::new(), name: name.to_owned() };
        self.rpc.clone().get_matrix(r).await?.into_inner().try_into()
    }

    pub async fn matrix(&self, id: Uuid) -> Result<MatrixInfo> {
        let r = proto::MatrixRef { id: id.as_bytes().to_vec().into(), name: String::new() };
        self.rpc.clone().get_matrix(r).await?.into_inner().try_into()
    }

    pub async fn list_matrices(&self) -> Result<Vec<MatrixInfo>> {
        let list = self.rpc.clone().list_matrices(proto::Empty {}).await?.into_inner();
        list.matrices.into_iter().map(MatrixInfo::try_from).collect()
    }

    /// Deletes a matrix record and all its blocks.
    pub async fn delete_matrix(&self, id: Uuid) -> Result<()> {
        let r = proto::MatrixRef { id: id.as_bytes().to_vec().into(), name: String::new() };
        self.rpc.clone().delete_matrix(r).await?;
        Ok(())
    }

    /// Reads the committed state of a block without taking a lock (for
    /// export and verification, when no job writes the matrix).
    ///
    /// The node overwrites the files of replaced versions: a read that
    /// races with a commit replacing this block may see its old version's
    /// file change and fail its checksum. A mismatch is read again (a few
    /// times, since each retry sees the newer pointer); a damaged block
    /// fails every time and is reported. (A file replaced and rewritten
    /// whole before the node read its header holds another block that
    /// passes its checksum: the node sees the pointer moved and reads
    /// again itself.)
    pub async fn read_block_committed(&self, matrix: Uuid, i: u32, j: u32) -> Result<BlockData> {
        const READS: usize = 3;
        let mut attempt = 1;
        loop {
            match get_block(&self.rpc, &self.plane, 0, matrix, i, j, false).await {
                Err(StoreError::Corrupt { .. }) if attempt < READS => attempt += 1,
                read => return read,
            }
        }
    }

    /// [`Client::read_block_committed`] of several blocks of one matrix,
    /// in as few exchanges as [`Action::get_blocks`]. A batch that fails a
    /// checksum is read again block by block, each with its retries.
    pub async fn read_blocks_committed(&self, matrix: Uuid, blocks: &[(u32, u32)]) -> Result<Vec<BlockData>> {
        match get_blocks(&self.rpc, &self.plane, 0, matrix, blocks).await {
            Err(StoreError::Corrupt { .. }) => {
                let mut got = Vec::with_capacity(blocks.len());
                for &(i, j) in blocks {
                    got.push(self.read_block_committed(matrix, i, j).await?);
                }
                Ok(got)
            }
            read => read,
        }
    }

    /// Reads the committed state of a small object without a lock.
    pub async fn peek_small(&self, key: &str) -> Result<Option<Vec<u8>>> {
        read_small(&self.rpc, &self.plane, 0, key, proto::LockMode::Read).await
    }

    /// Committed small objects whose key starts with `prefix`, in key order.
    pub async fn scan_small(&self, prefix: &str, limit: u32) -> Result<Vec<(String, Vec<u8>)>> {
        let r = self.rpc.clone().scan_small(proto::ScanRequest { prefix: prefix.to_owned(), limit }).await?;
        Ok(r.into_inner().items.into_iter().map(|kv| (kv.key, kv.value.to_vec())).collect())
    }

    pub async fn bag_stats(&self, bag: &str) -> Result<BagStats> {
        let r = self.rpc.clone().bag_stats(proto::BagRef { bag: bag.to_owned() }).await?.into_inner();
        Ok(BagStats { free: r.free, taken: r.taken, dead: r.dead })
    }

    /// Every element of a bag (free and taken) in queue order.
    pub async fn list_bag(&self, bag: &str) -> Result<Vec<Task>> {
        let r = self.rpc.clone().list_bag(proto::BagRef { bag: bag.to_owned() }).await?.into_inner();
        Ok(r.elements.into_iter().map(task_from).collect())
    }

    /// The node's open sessions.
    pub async fn list_sessions(&self) -> Result<Vec<SessionInfo>> {
        let list = self.rpc.clone().list_sessions(proto::Empty {}).await?.into_inner();
        Ok(list
            .sessions
            .into_iter()
            .map(|s| SessionInfo {
                session: s.session,
                client_name: s.client_name,
                peer: s.peer,
                age_ms: s.age_ms,
                since_heartbeat_ms: s.since_heartbeat_ms,
                n_actions: s.n_actions,
                tasks: s.tasks,
            })
            .collect())
    }

    /// The node's connections by transport since it started.
    pub async fn node_stats(&self) -> Result<NodeStats> {
        let s = self.rpc.clone().stats(proto::Empty {}).await?.into_inner();
        Ok(NodeStats {
            data_tcp_connections: s.data_tcp_connections,
            data_unix_connections: s.data_unix_connections,
            tcp_sessions: s.tcp_sessions,
            unix_sessions: s.unix_sessions,
            tls: s.tls,
            refused_connections: s.refused_connections,
        })
    }

    /// What the node did since it started (commits, aborts, lock waits,
    /// block bytes) and holds now (sessions, disk, caches).
    pub async fn node_metrics(&self) -> Result<crate::NodeMetrics> {
        Ok(self.rpc.clone().metrics(proto::Empty {}).await?.into_inner().into())
    }

    /// A consistent backup of the store, taken while it serves, into
    /// `dir`: an absolute path on the node's machine that does not exist
    /// yet (its parent does). `master serve --data DIR` opens it.
    pub async fn backup(&self, dir: &str) -> Result<NodeBackup> {
        let r = self.rpc.clone().backup(proto::BackupRequest { dir: dir.into() }).await?.into_inner();
        Ok(NodeBackup {
            n_versions: r.n_versions,
            bytes_linked: r.bytes_linked,
            bytes_copied: r.bytes_copied,
            db_bytes: r.db_bytes,
            seconds: r.seconds,
        })
    }

    /// Test hook (node started with `--test-hooks`): damages a stored block.
    pub async fn corrupt_block_for_test(&self, matrix: Uuid, i: u32, j: u32) -> Result<()> {
        let r = proto::BlockRef { action: 0, matrix: matrix.as_bytes().to_vec().into(), i, j, for_update: false };
        self.rpc.clone().corrupt_block_for_test(r).await?;
        Ok(())
    }
}
