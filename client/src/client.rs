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

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live session. Dropping it closes the stream, which aborts the
/// session's running actions on the node.
#[derive(Clone)]
pub struct Session {
    client: Client,
    id: u64,
    lease: Duration,
    alive: watch::Receiver<bool>,
    heartbeat: Arc<AbortOnDrop>,
    /// Top-level actions the node began for this session as it committed
    /// the previous ones ([`Action::commit`]), for the next `begin`s.
    begun_ahead: BegunAhead,
}

/// Ids of a session's actions begun ahead, shared by its top-level actions.
type BegunAhead = Arc<std::sync::Mutex<Vec<u64>>>;

impl Session {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// False once the node ended the session (lease lapsed, node gone).
    pub fn is_alive(&self) -> bool {
        *self.alive.borrow()
    }

    /// Begins a top-level action. Called while another action of this
    /// session runs, it is a nested top-level action: it commits on its own.
    ///
    /// Each commit of a top-level action asks the node to begin the
    /// session's next one in the same round trip; `begin` takes that one
    /// when there is one, with no round trip of its own (a block put with
    /// its begin and commit, b = 256: one round trip of three).
    pub async fn begin(&self) -> Result<Action> {
        let ahead = self.begun_ahead.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let id = match ahead {
            Some(id) => id,
            None => {
                let mut rpc = self.client.rpc.clone();
                let req = proto::BeginRequest { session: self.id, parent: 0 };
                unary(&self.client.plane, Method::Begin, req, |q| async move { rpc.begin(q).await }).await?.action
            }
        };
        Ok(Action {
            rpc: self.client.rpc.clone(),
            plane: self.client.plane.clone(),
            id,
            _session: self.heartbeat.clone(),
            begun_ahead: Some(self.begun_ahead.clone()),
        })
    }
}

/// Reads blocks inside an action; see [`Action::block_reader`].
#[derive(Clone)]
pub struct BlockReader {
    rpc: Rpc,
    plane: Option<Arc<DataPlane>>,
    action: u64,
}

impl BlockReader {
    /// Reads a block under a read lock of the action.
    pub async fn get_block(&self, matrix: Uuid, i: u32, j: u32) -> Result<BlockData> {
        get_block(&self.rpc, &self.plane, self.action, matrix, i, j, false).await
    }
}

/// Writes blocks inside an action; see [`Action::block_writer`].
#[derive(Clone)]
pub struct BlockWriter {
    rpc: Rpc,
    plane: Option<Arc<DataPlane>>,
    action: u64,
}

impl BlockWriter {
    /// Writes a block under an overwrite lock of the action.
    pub async fn put_block(&self, matrix: Uuid, i: u32, j: u32, block: BlockData) -> Result<()> {
        put_block(&self.rpc, &self.plane, self.action, matrix, i, j, block).await
    }
}

/// A running action. Every call names it; once it is aborted on the node
/// (orphaned, say) every call fails with `ActionAborted`.
pub struct Action {
    rpc: Rpc,
    plane: Option<Arc<DataPlane>>,
    id: u64,
    _session: Arc<AbortOnDrop>,
    /// Where a top-level action's commit leaves the session's next action
    /// (`None`: a nested action, whose commit begins nothing).
    begun_ahead: Option<BegunAhead>,
}

impl Action {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub async fn begin_nested(&self) -> Result<Action> {
        let mut rpc = self.rpc.clone();
        let req = proto::BeginRequest { session: 0, parent: self.id };
        let r = unary(&self.plane, Method::Begin, req, |q| async move { rpc.begin(q).await }).await?;
        Ok(Action { rpc: self.rpc.clone(), plane: self.plane.clone(), id: r.action, _session: self._session.clone(), begun_ahead: None })
    }

    /// Commits: a nested action into its parent; a top-level one durably
    /// (the reply means the batch is synced to disk).
    ///
    /// A top-level action's commit also has the node begin the session's
    /// next top-level action (see [`Session::begin`]) when none is waiting
    /// (one, unless commits ran at once); the session's end aborts it like
    /// any other.
    pub async fn commit(self) -> Result<()> {
        let mut rpc = self.rpc.clone();
        let begin_next = self.begun_ahead.as_ref().is_some_and(|ahead| ahead.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
        let req = proto::ActionRef { action: self.id, begin_next };
        let r: proto::CommitReply = unary(&self.plane, Method::Commit, req, |q| async move { rpc.commit(q).await }).await?;
        if let (Some(ahead), next @ 1..) = (&self.begun_ahead, r.next_action) {
            ahead.lock().unwrap_or_else(|e| e.into_inner()).push(next);
        }
        Ok(())
    }

    pub async fn abort(self) -> Result<()> {
        self.rpc.clone().abort(proto::ActionRef { action: self.id, ..Default::default() }).await?;
        Ok(())
    }

    /// Reads a small object under a read lock (or `write: true`, a write
    /// lock, to update it next).
    pub async fn read_small(&self, key: &str, write: bool) -> Result<Option<Vec<u8>>> {
        let mode = if write { proto::LockMode::Write } else { proto::LockMode::Read };
        read_small(&self.rpc, &self.plane, self.id, key, mode).await
    }

    /// [`Action::read_small`] as a future that owns its request, so it may
    /// run on another task: a slave reads its task's done record for
    /// update when it dequeues the task, beside the task's work, and
    /// awaits it in the task's ending.
    pub fn read_small_owned(&self, key: &str, write: bool) -> impl std::future::Future<Output = Result<Option<Vec<u8>>>> + Send + 'static {
        let mode = if write { proto::LockMode::Write } else { proto::LockMode::Read };
        let (rpc, plane, id, key) = (self.rpc.clone(), self.plane.clone(), self.id, key.to_owned());
        async move { read_small(&rpc, &plane, id, &key, mode).await }
    }

    /// Reads several small objects in one request, under read (or `write:
    /// true`, write) locks taken in the order given; `None` for each that
    /// does not exist. Stops at the first that fails; the locks taken
    /// before it stay with the action, as with [`Action::read_small`] one
    /// by one.
    pub async fn read_smalls(&self, keys: &[String], write: bool) -> Result<Vec<Option<Vec<u8>>>> {
        let mode = if write { proto::LockMode::Write } else { proto::LockMode::Read };
        let req = proto::SmallRefs { action: self.id, keys: keys.to_vec(), mode: mode as i32 };
        let mut rpc = self.rpc.clone();
        let r = unary(&self.plane, Method::ReadSmallMany, req, |q| async move { rpc.read_small_many(q).await }).await?;
        if r.values.len() != keys.len() {
            return Err(StoreError::StoreUnavailable { what: format!("{} small objects read, {} answered", keys.len(), r.values.len()) });
        }
        Ok(r.values.into_iter().map(|v| v.found.then(|| v.value.to_vec())).collect())
    }

    /// Writes a small object under a write lock. The future owns its
    /// request, so it may run on another task (a slave's write-behind).
    pub fn write_small(&self, key: &str, value: &[u8]) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let w = proto::SmallWrite { action: self.id, key: key.to_owned(), value: value.to_vec().into(), delete: false };
        let (mut rpc, plane) = (self.rpc.clone(), self.plane.clone());
        async move { unary::<_, proto::Empty, _, _>(&plane, Method::WriteSmall, w, |q| async move { rpc.write_small(q).await }).await.map(drop) }
    }

    /// Writes several small objects in one request, in the order given,
    /// each under its write lock; stops at the first that fails (those
    /// before it stay written in the action). The future owns its request,
    /// like [`Action::write_small`]'s. (A dag task writes back every
    /// successor's counter: 21 on average at n = 8192, b = 256.)
    pub fn write_smalls(&self, items: &[(String, Vec<u8>)]) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let items = items.iter().map(|(key, value)| proto::KeyValue { key: key.clone(), value: value.clone().into() }).collect();
        let w = proto::SmallWrites { action: self.id, items };
        let (mut rpc, plane) = (self.rpc.clone(), self.plane.clone());
        async move {
            unary::<_, proto::Empty, _, _>(&plane, Method::WriteSmallMany, w, |q| async move { rpc.write_small_many(q).await })
                .await
                .map(drop)
        }
    }

    pub async fn delete_small(&self, key: &str) -> Result<()> {
        let w = proto::SmallWrite { action: self.id, key: key.to_owned(), value: Bytes::new(), delete: true };
        let mut rpc = self.rpc.clone();
        unary::<_, proto::Empty, _, _>(&self.plane, Method::WriteSmall, w, |q| async move { rpc.write_small(q).await }).await.map(drop)
    }

    /// Reads a block under a read lock.
    pub async fn get_block(&self, matrix: Uuid, i: u32, j: u32) -> Result<BlockData> {
        get_block(&self.rpc, &self.plane, self.id, matrix, i, j, false).await
    }

    /// Reads blocks of `matrix` under read locks, taken in the order given.
    /// Up to 64 blocks take one round trip over the data plane (on the
    /// node's machine the node hands over their files together, elsewhere
    /// it sends their values back to back), so reading a row or a panel
    /// costs little more than reading its bytes; over gRPC alone they are
    /// got one by one. Stops at the first that fails;
    /// the locks taken before it stay with the action, as with
    /// [`Action::get_block`] one by one.
    pub async fn get_blocks(&self, matrix: Uuid, blocks: &[(u32, u32)]) -> Result<Vec<BlockData>> {
        get_blocks(&self.rpc, &self.plane, self.id, matrix, blocks).await
    }

    /// A handle that reads blocks under read locks of this action from
    /// other tasks, so a slave can fetch the next blocks while it computes.
    /// Reads through it after the action ended fail with `ActionAborted`.
    pub fn block_reader(&self) -> BlockReader {
        BlockReader { rpc: self.rpc.clone(), plane: self.plane.clone(), action: self.id }
    }

    /// Reads a block under a write lock, to overwrite it next (in place).
    pub async fn get_block_for_update(&self, matrix: Uuid, i: u32, j: u32) -> Result<BlockData> {
        get_block(&self.rpc, &self.plane, self.id, matrix, i, j, true).await
    }

    /// Writes a block under an overwrite lock; visible at top-level commit.
    /// Takes the values by value so they are streamed without a copy.
    pub async fn put_block(&self, matrix: Uuid, i: u32, j: u32, block: BlockData) -> Result<()> {
        put_block(&self.rpc, &self.plane, self.id, matrix, i, j, block).await
    }

    /// A handle that writes blocks under overwrite locks of this action from
    /// other tasks, so a slave can go on while a block travels and the node
    /// syncs it. Writes through it after the action ended fail with
    /// `ActionAborted`; the action's commit must wait for them.
    pub fn block_writer(&self) -> BlockWriter {
        BlockWriter { rpc: self.rpc.clone(), plane: self.plane.clone(), action: self.id }
    }

    /// Dequeues from `bag`; with a non-zero `wait`, blocks on the node up to
    /// `wait` while the bag has elements but none is free.
    pub async fn dequeue(&self, bag: &str, wait: Duration) -> Result<Dequeue> {
        let req = proto::DequeueRequest { action: self.id, bag: bag.to_owned(), wait_ms: wait.as_millis() as u32 };
        let mut rpc = self.rpc.clone();
        let r = unary(&self.plane, Method::Dequeue, req, |q| async move { rpc.dequeue(q).await }).await?;
        use proto::dequeue_reply::Outcome;
        Ok(match r.outcome {
            Some(Outcome::Task(t)) => Dequeue::Task(task_from(t)),
            Some(Outcome::Empty(_)) => Dequeue::Empty,
            Some(Outcome::NoneAvailable(_)) => Dequeue::NoneAvailable,
            None => return Err(StoreError::StoreUnavailable { what: "dequeue reply without outcome".into() }),
        })
    }

    /// Enqueues an element, pending until the action commits. The future
    /// owns its request, like [`Action::write_small`]'s.
    pub fn enqueue(&self, bag: &str, payload: &[u8]) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let req = proto::EnqueueRequest { action: self.id, bag: bag.to_owned(), payload: payload.to_vec().into() };
        let (mut rpc, plane) = (self.rpc.clone(), self.plane.clone());
        async move { unary::<_, proto::Empty, _, _>(&plane, Method::Enqueue, req, |q| async move { rpc.enqueue(q).await }).await.map(drop) }
    }
}

struct F64Bytes(Vec<f64>);

impl AsRef<[u8]> for F64Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

fn task_from(t: proto::Task) -> Task {
    Task { bag: t.bag, seq: t.seq, payload: t.payload.to_vec(), attempts: t.attempts, returns: t.returns }
}

async fn read_small(rpc: &Rpc, plane: &Option<Arc<DataPlane>>, action: u64, key: &str, mode: proto::LockMode) -> Result<Option<Vec<u8>>> {
    let req = proto::SmallRef { action, key: key.to_owned(), mode: mode as i32 };
    let mut rpc = rpc.clone();
    let v = unary(plane, Method::ReadSmall, req, |q| async move { rpc.read_small(q).await }).await?;
    Ok(v.found.then(|| v.value.to_vec()))
}

/// The settings every channel to a node has, TCP or Unix.
fn configure(endpoint: Endpoint) -> Endpoint {
    endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .initial_stream_window_size(8 << 20)
        .initial_connection_window_size(32 << 20)
        .http2_keep_alive_interval(Duration::from_millis(1000))
        .keep_alive_timeout(Duration::from_secs(3))
}

fn rpc_over(channel: Channel, auth: Auth) -> Rpc {
    StoreClient::with_interceptor(channel, auth).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// Where the node's data plane and Unix sockets are; `None` from a node
/// without a data plane.
async fn data_plane_info(rpc: &Rpc) -> Result<Option<proto::DataPlaneInfo>> {
    match rpc.clone().data_plane(proto::Empty {}).await {
        Ok(r) => Ok(Some(r.into_inner()).filter(|info| info.port != 0)),
        Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
        Err(s) => Err(s.into()),
    }
}

/// `host:port` split; a bare host is refused by name rather than left to
/// the transport's "invalid URI".
fn split_host_port(addr: &str) -> Result<(&str, u16)> {
    let bad = |why: &str| StoreError::InvalidArgument { what: format!("store address {addr:?} {why} (host:port, e.g. storehost:7070)") };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() || (host.contains(':') && !host.starts_with('[')) {
        return Err(bad("is not host:port"));
    }
    let port = port.parse().map_err(|_| bad("has no valid port"))?;
    Ok((host, port))
}

/// An error's text with its sources, each said once (transport errors
/// often repeat their source's text in their own).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        source = s.source();
    }
    out
}

/// Why the first connection to `addr` failed, in words a user can act on.
fn connect_failed(addr: &str, options: &ConnectOptions, e: &tonic::transport::Error) -> StoreError {
    let chain = error_chain(e);
    let lower = chain.to_lowercase();
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    if lower.contains("certificate") || lower.contains("unknownissuer") || lower.contains("notvalidforname") {
        return StoreError::Unauthenticated {
            what: format!("TLS to {addr}: the node's certificate is not trusted by --tls-ca, or does not name {host} ({chain})"),
        };
    }
    let what = if lower.contains("dns error") || lower.contains("failed to lookup") || lower.contains("name or service not known") {
        format!("cannot resolve the store node's host {host:?} ({chain})")
    } else if lower.contains("connection refused") {
        format!("nothing listens at {addr} (connection refused): is `master serve` running there, on that port?")
    } else if lower.contains("timed out") || lower.contains("deadline") {
        format!("no answer from {addr} (host down, or a firewall drops the port): {chain}")
    } else if options.tls.is_some() && (lower.contains("tls") || lower.contains("handshake") || lower.contains("corrupt message")) {
        format!("TLS handshake with {addr} failed (does the node serve TLS, and may this client present its certificate?): {chain}")
    } else {
        format!("cannot connect to the store node at {addr}: {chain}")
    };
    StoreError::StoreUnavailable { what }
}

/// The first call on a fresh connection failed: typed errors stand; a
/// connection the node dropped at once says what may be wrong.
fn first_call_failed(addr: &str, options: &ConnectOptions, e: StoreError) -> StoreError {
    match e {
        StoreError::StoreUnavailable { what } if options.tls.is_none() => StoreError::StoreUnavailable {
            what: format!("{addr} answered the first call with a transport failure ({what}); if the node serves TLS, give --tls-ca (STORE_TLS_CA)"),
        },
        StoreError::StoreUnavailable { what } => StoreError::StoreUnavailable {
            what: format!("{addr} answered the first call with a transport failure ({what}); if the node requires client certificates, give --tls-cert and --tls-key"),
        },
        e => e,
    }
}

/// The node's service over its Unix socket, for a client on its host;
/// used only when the node answers there with the id it gave over TCP.
/// The `authorization` value that carries `token`.
fn bearer(token: Option<&str>) -> Result<Option<MetadataValue<Ascii>>> {
    token
        .map(|t| format!("Bearer {t}").parse().map_err(|_| StoreError::InvalidArgument { what: "token is not printable ASCII".into() }))
        .transpose()
}

/// Opens the data plane `info` describes: its Unix socket on the node's
/// own host (decided by identity, never by address: the host's boot id and
/// network namespace; and the socket must answer with the node's id),
/// else its TCP port on the host of `addr`.
async fn connect_data_plane(info: &proto::DataPlaneInfo, addr: &str, options: &ConnectOptions) -> Result<Option<Arc<DataPlane>>> {
    let token = options.token.as_deref();
    let same_host = !info.host_id.is_empty() && info.host_id == host_identity();
    let node = Uuid::from_slice(&info.node_id).ok();
    if options.local && same_host && !info.unix_path.is_empty() && node.is_some() {
        match DataPlane::connect(Target::Unix(info.unix_path.clone().into()), token, None, node).await {
            Ok(plane) => return Ok(Some(Arc::new(plane))),
            Err(e @ StoreError::Unauthenticated { .. }) => return Err(e),
            // The node's host, but its socket is not reachable from here
            // (another mount namespace, say), or is another node's.
            Err(e) => tracing::debug!("no local data plane ({e}); blocks go over TCP"),
        }
    }
    let (host, _) = split_host_port(addr)?;
    let port = info.port;
    let unreachable = |e: std::io::Error| StoreError::StoreUnavailable { what: format!("block data plane at {host}:{port}: {e}") };
    let plane_addr = tokio::net::lookup_host(format!("{host}:{port}"))
        .await
        .map_err(unreachable)?
        .next()
        .ok_or_else(|| unreachable(std::io::Error::other("no address")))?;
    let tls = match &options.tls {
        Some(tls) => Some((tls.connector(), ClientTls::server_name(host)?)),
        None => None,
    };
    Ok(Some(Arc::new(DataPlane::connect(Target::Tcp(plane_addr), token, tls, None).await?)))
}

/// Writes a block under an overwrite lock of `action`: over the data plane
/// when the node has one, else as a chunked gRPC stream.
async fn put_block(rpc: &Rpc, plane: &Option<Arc<DataPlane>>, action: u64, matrix: Uuid, i: u32, j: u32, block: BlockData) -> Result<()> {
    if let Some(plane) = plane {
        return plane.put(action, matrix, i, j, &block).await;
    }
    let bytes = Bytes::from_owner(F64Bytes(block.data));
    let header = proto::BlockHeader {
        action,
        matrix: matrix.as_bytes().to_vec().into(),
        i,
        j,
        rows: block.rows as u32,
        cols: block.cols as u32,
        checksum: block::checksum(&bytes),
    };
    let mut chunks = Vec::with_capacity(bytes.len() / CHUNK_BYTES + 1);
    let mut off = 0;
    loop {
        let end = (off + CHUNK_BYTES).min(bytes.len());
        let header = if off == 0 { Some(header.clone()) } else { None };
        chunks.push(proto::BlockChunk { header, data: bytes.slice(off..end) });
        off = end;
        if off >= bytes.len() {
            break;
        }
    }
    rpc.clone().put_block(tokio_stream::iter(chunks)).await?;
    Ok(())
}

/// One control call: over the data plane when the client has one (a
/// slave's tasks make these; there they skip HTTP/2's framing and its task
/// wake-ups), else as the gRPC method `grpc`.
async fn unary<Q, R, F, Fut>(plane: &Option<Arc<DataPlane>>, method: Method, request: Q, grpc: F) -> Result<R>
where
    Q: prost::Message,
    R: prost::Message + Default,
    F: FnOnce(Q) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<tonic::Response<R>, Status>>,
{
    match plane {
        Some(plane) => plane.call(method, &request).await,
        None => Ok(grpc(request).await?.into_inner()),
    }
}

/// Gets several blocks of one matrix: over the data plane 64 to an
/// exchange, else one gRPC get after another.
async fn get_blocks(rpc: &Rpc, plane: &Option<Arc<DataPlane>>, action: u64, matrix: Uuid, blocks: &[(u32, u32)]) -> Result<Vec<BlockData>> {
    if let Some(plane) = plane {
        return plane.get_many(action, matrix, blocks, false).await;
    }
    let mut got = Vec::with_capacity(blocks.len());
    for &(i, j) in blocks {
        got.push(get_block(rpc, plane, action, matrix, i, j, false).await?);
    }
    Ok(got)
}

async fn get_block(
    rpc: &Rpc,
    plane: &Option<Arc<DataPlane>>,
    action: u64,
    matrix: Uuid,
    i: u32,
    j: u32,
    for_update: bool,
) -> Result<BlockData> {
    if let Some(plane) = plane {
        return plane.get(action, matrix, i, j, for_update).await;
    }
    let req = proto::BlockRef { action, matrix: matrix.as_bytes().to_vec().into(), i, j, for_update };
    let mut stream = rpc.clone().get_block(req).await?.into_inner();
    let truncated = || StoreError::Corrupt { what: format!("block ({i}, {j}) of {matrix}: truncated transfer") };
    let first = stream.message().await?.ok_or_else(truncated)?;
    let h = first.header.ok_or_else(truncated)?;
    let header = BlockHeader { rows: h.rows, cols: h.cols, checksum: h.checksum };
    let mut data = vec![0f64; h.rows as usize * h.cols as usize];
    let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut data);
    let mut off = 0;
    let mut chunk = first.data;
    loop {
        let end = off + chunk.len();
        if end > buf.len() {
            return Err(StoreError::Corrupt { what: format!("block ({i}, {j}) of {matrix}: longer than its header") });
        }
        buf[off..end].copy_from_slice(&chunk);
        off = end;
        match stream.message().await? {
            Some(c) => chunk = c.data,
            None => break,
        }
    }
    if off != buf.len() {
        return Err(truncated());
    }
    if !block::checksum_matches(&header, buf) {
        return Err(StoreError::Corrupt { what: format!("block ({i}, {j}) of {matrix}: checksum mismatch after transfer") });
    }
    Ok(BlockData { rows: h.rows as usize, cols: h.cols as usize, data })
}
