//! The gRPC layer: each handler converts from protobuf (bad input becomes
//! `InvalidArgument`), makes one call into the node, and maps the error
//! with `StoreError::to_status`. No decisions are made here.

// Handlers answer `tonic::Status`, tonic's error type, by value: a large
// `Err` is what the framework asks for, and these run once per request.
#![allow(clippy::result_large_err)]

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use actions::{ActionId, LockMode, SessionId};
use bytes::Bytes;
use futures::Stream;
use store_client::block::{BlockHeader, HEADER_LEN};
use store_client::proto::{self, store_server::Store};
use store_client::{MatrixInfo, StoreError, CHUNK_BYTES};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

use crate::blocks::MAX_BLOCK;
use crate::keys::BlockKey;
use crate::node::Node;
use crate::transports::Transports;

/// The longest a blocking dequeue may wait in one call.
const MAX_DEQUEUE_WAIT: Duration = Duration::from_secs(60);

pub(crate) struct Rpc {
    pub(crate) node: Arc<Node>,
    /// The block data plane's port, told to clients.
    pub(crate) data_port: u16,
    /// Its Unix socket, for clients on this machine.
    pub(crate) unix_path: Option<std::path::PathBuf>,
    /// Random per start: a client checks that a Unix socket is this node's.
    pub(crate) node_id: Uuid,
    /// This node's machine and network namespace (`host_identity`).
    pub(crate) host_id: String,
    pub(crate) transports: Arc<Transports>,
    pub(crate) tls: bool,
}

type Reply<T> = Result<Response<T>, Status>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn status(e: StoreError) -> Status {
    e.to_status()
}

fn join_error(e: tokio::task::JoinError) -> Status {
    status(StoreError::Storage { what: format!("request task failed: {e}") })
}

fn invalid(what: impl Into<String>) -> Status {
    status(StoreError::InvalidArgument { what: what.into() })
}

fn uuid(bytes: &[u8]) -> Result<Uuid, Status> {
    Uuid::from_slice(bytes).map_err(|_| invalid(format!("an id must be 16 bytes, got {}", bytes.len())))
}

fn action(id: u64) -> Option<ActionId> {
    (id != 0).then_some(ActionId(id))
}

fn required_action(id: u64) -> Result<ActionId, Status> {
    action(id).ok_or_else(|| invalid("this request needs an action"))
}

fn lock_mode(mode: i32) -> Result<LockMode, Status> {
    match proto::LockMode::try_from(mode) {
        Ok(proto::LockMode::Read) => Ok(LockMode::Read),
        Ok(proto::LockMode::Write) => Ok(LockMode::Write),
        Ok(proto::LockMode::Overwrite) => Ok(LockMode::Overwrite),
        Err(_) => Err(invalid(format!("unknown lock mode {mode}"))),
    }
}

fn bag_name(bag: &str) -> Result<&str, Status> {
    if bag.is_empty() || bag.len() > 200 || bag.contains('\0') {
        return Err(invalid(format!("bag name {bag:?}")));
    }
    Ok(bag)
}

fn matrix_proto(m: &MatrixInfo) -> proto::MatrixInfo {
    proto::MatrixInfo { id: m.id.as_bytes().to_vec().into(), name: m.name.clone(), n_rows: m.n_rows, n_cols: m.n_cols, block: m.block }
}

fn task_proto(d: queue::Dequeued) -> proto::Task {
    proto::Task { bag: d.bag, seq: d.seq, payload: d.payload.into(), attempts: d.attempts, returns: d.returns }
}

// The unary calls a slave makes for its tasks, which the data plane
// carries too (`Op::Call`): one body for both transports.

pub(crate) fn begin(node: &Node, r: proto::BeginRequest) -> Result<proto::BeginReply, Status> {
    let id = node.begin(SessionId(r.session), action(r.parent)).map_err(status)?;
    Ok(proto::BeginReply { action: id.0 })
}

pub(crate) async fn commit(node: &Arc<Node>, r: proto::ActionRef) -> Result<proto::CommitReply, Status> {
    let a = required_action(r.action)?;
    // Spawned: if the client vanishes mid-commit, the handler (or the
    // data-plane connection) is dropped, but the commit must still finish
    // (release locks, settle the bags) once its batch is durable.
    let node = node.clone();
    let begin_next = r.begin_next;
    let next = tokio::spawn(async move { node.commit_then_begin(a, begin_next).await }).await.map_err(join_error)?.map_err(status)?;
    Ok(proto::CommitReply { next_action: next.map_or(0, |n| n.0) })
}

pub(crate) async fn read_small(node: &Node, r: proto::SmallRef) -> Result<proto::SmallValue, Status> {
    let mode = lock_mode(r.mode)?;
    let v = node.read_small(action(r.action), &r.key, mode).await.map_err(status)?;
    Ok(proto::SmallValue { found: v.is_some(), value: v.unwrap_or_default().into() })
}

/// Most keys one `ReadSmallMany` names.
const MAX_SMALL_MANY: usize = 4096;

/// Refuses a request naming more than [`MAX_SMALL_MANY`] small objects.
fn at_most_many(n: usize, what: &str) -> Result<(), Status> {
    if n > MAX_SMALL_MANY {
        return Err(status(StoreError::InvalidArgument { what: format!("a {what} of {n} small objects (at most {MAX_SMALL_MANY})") }));
    }
    Ok(())
}

pub(crate) async fn read_small_many(node: &Node, r: proto::SmallRefs) -> Result<proto::SmallValues, Status> {
    let mode = lock_mode(r.mode)?;
    at_most_many(r.keys.len(), "read")?;
    let mut values = Vec::with_capacity(r.keys.len());
    for key in &r.keys {
        let v = node.read_small(action(r.action), key, mode).await.map_err(status)?;
        values.push(proto::SmallValue { found: v.is_some(), value: v.unwrap_or_default().into() });
    }
    Ok(proto::SmallValues { values })
}

pub(crate) async fn write_small_many(node: &Node, r: proto::SmallWrites) -> Result<proto::Empty, Status> {
    let a = required_action(r.action)?;
    at_most_many(r.items.len(), "write")?;
    for item in r.items {
        node.write_small(a, &item.key, Some(item.value.to_vec())).await.map_err(status)?;
    }
    Ok(proto::Empty {})
}

pub(crate) fn enqueue(node: &Node, r: proto::EnqueueRequest) -> Result<proto::Empty, Status> {
    let a = required_action(r.action)?;
    let inputs = r.inputs.iter().map(|b| Ok(BlockKey { matrix: uuid(&b.matrix)?, i: b.i, j: b.j })).collect::<Result<Vec<_>, Status>>()?;
    node.enqueue(a, bag_name(&r.bag)?, r.payload.to_vec(), &inputs).map_err(status)?;
    Ok(proto::Empty {})
}

pub(crate) async fn dequeue(node: &Node, r: proto::DequeueRequest) -> Result<proto::DequeueReply, Status> {
    let a = required_action(r.action)?;
    let wait = Duration::from_millis(r.wait_ms as u64).min(MAX_DEQUEUE_WAIT);
    use proto::dequeue_reply::Outcome;
    let outcome = match node.dequeue(a, bag_name(&r.bag)?, wait, &r.near).await.map_err(status)? {
        queue::Dequeue::Task(t) => Outcome::Task(task_proto(t)),
        queue::Dequeue::Empty => Outcome::Empty(proto::Empty {}),
        queue::Dequeue::NoneAvailable => Outcome::NoneAvailable(proto::Empty {}),
    };
    Ok(proto::DequeueReply { outcome: Some(outcome) })
}

pub(crate) async fn write_small(node: &Node, r: proto::SmallWrite) -> Result<proto::Empty, Status> {
    let a = required_action(r.action)?;
    let value = (!r.delete).then(|| r.value.to_vec());
    node.write_small(a, &r.key, value).await.map_err(status)?;
    Ok(proto::Empty {})
}

#[tonic::async_trait]
impl Store for Rpc {
    type OpenSessionStream = ReceiverStream<Result<proto::SessionEvent, Status>>;
    type GetBlockStream = BoxStream<proto::BlockChunk>;

    async fn open_session(&self, req: Request<Streaming<proto::Heartbeat>>) -> Reply<Self::OpenSessionStream> {
        // No address: the client is in the node's own process.
        let peer = req.remote_addr().map_or_else(|| "the node's process".to_owned(), |a| a.to_string());
        Transports::count(if req.remote_addr().is_some() { &self.transports.tcp_sessions } else { &self.transports.unix_sessions });
        let mut incoming = req.into_inner();
        let first = incoming.message().await?.ok_or_else(|| invalid("a session opens with a heartbeat"))?;
        let (id, mut ended) = self.node.open_session(first.client_name, peer);
        let (tx, rx) = mpsc::channel(1);
        let lease_ms = self.node.config.lease.as_millis() as u64;
        let _ = tx.send(Ok(proto::SessionEvent { session: id.0, lease_ms })).await;
        let node = self.node.clone();
        let stopping = node.stopping();
        tokio::spawn(async move {
            tokio::pin!(stopping);
            let why = loop {
                tokio::select! {
                    msg = incoming.message() => match msg {
                        Ok(Some(_)) => if node.heartbeat(id).is_err() { break Some("lease lapsed") },
                        Ok(None) => break Some(crate::node::CLOSED_BY_CLIENT),
                        Err(_) => break Some("connection lost"),
                    },
                    _ = &mut ended => break Some("lease lapsed"),
                    // The stream ends and the node goes, without orphaning
                    // the session's actions: a stop is no fault of their
                    // tasks (no attempt counted), and the next start
                    // returns their elements as after a crash.
                    () = &mut stopping => break None,
                }
            };
            if let Some(why) = why {
                node.close_session(id, why);
            }
            drop(tx);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn list_sessions(&self, _: Request<proto::Empty>) -> Reply<proto::SessionList> {
        Ok(Response::new(proto::SessionList { sessions: self.node.sessions_info() }))
    }

    async fn data_plane(&self, _: Request<proto::Empty>) -> Reply<proto::DataPlaneInfo> {
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Response::new(proto::DataPlaneInfo {
            port: self.data_port as u32,
            unix_path: path(&self.unix_path),
            wire_version: u32::from(store_client::dataplane::wire::VERSION),
            node_id: self.node_id.as_bytes().to_vec().into(),
            host_id: self.host_id.clone(),
            object_pool: self.node.db.objects().map(|o| o.pool().to_owned()).unwrap_or_default(),
            object_prefix: self.node.db.objects().map(|o| o.prefix().to_owned()).unwrap_or_default(),
        }))
    }

    async fn stats(&self, _: Request<proto::Empty>) -> Reply<proto::NodeStats> {
        Ok(Response::new(self.transports.snapshot(self.tls)))
    }

    async fn metrics(&self, _: Request<proto::Empty>) -> Reply<proto::NodeMetrics> {
        Ok(Response::new(self.node.metrics_snapshot()))
    }

    async fn begin(&self, req: Request<proto::BeginRequest>) -> Reply<proto::BeginReply> {
        Ok(Response::new(begin(&self.node, req.into_inner())?))
    }

    async fn commit(&self, req: Request<proto::ActionRef>) -> Reply<proto::CommitReply> {
        Ok(Response::new(commit(&self.node, req.into_inner()).await?))
    }

    async fn abort(&self, req: Request<proto::ActionRef>) -> Reply<proto::Empty> {
        let a = required_action(req.into_inner().action)?;
        self.node.abort(a).map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn read_small(&self, req: Request<proto::SmallRef>) -> Reply<proto::SmallValue> {
        Ok(Response::new(read_small(&self.node, req.into_inner()).await?))
    }

    async fn read_small_many(&self, req: Request<proto::SmallRefs>) -> Reply<proto::SmallValues> {
        Ok(Response::new(read_small_many(&self.node, req.into_inner()).await?))
    }

    async fn write_small(&self, req: Request<proto::SmallWrite>) -> Reply<proto::Empty> {
        Ok(Response::new(write_small(&self.node, req.into_inner()).await?))
    }

    async fn write_small_many(&self, req: Request<proto::SmallWrites>) -> Reply<proto::Empty> {
        Ok(Response::new(write_small_many(&self.node, req.into_inner()).await?))
    }

    async fn scan_small(&self, req: Request<proto::ScanRequest>) -> Reply<proto::ScanReply> {
        let r = req.into_inner();
        let limit = if r.limit == 0 { 100_000 } else { r.limit as usize };
        let items = self.node.db.scan_small(&r.prefix, limit).map_err(status)?;
        let items = items.into_iter().map(|(key, value)| proto::KeyValue { key, value: value.into() }).collect();
        Ok(Response::new(proto::ScanReply { items }))
    }

    async fn create_matrix(&self, req: Request<proto::MatrixInfo>) -> Reply<proto::MatrixInfo> {
        let r = req.into_inner();
        let m = self.node.create_matrix(&r.name, r.n_rows, r.n_cols, r.block).map_err(status)?;
        Ok(Response::new(matrix_proto(&m)))
    }

    async fn get_matrix(&self, req: Request<proto::MatrixRef>) -> Reply<proto::MatrixInfo> {
        let r = req.into_inner();
        let id = if r.id.is_empty() { None } else { Some(uuid(&r.id)?) };
        let m = self.node.matrix(id, &r.name).map_err(status)?;
        Ok(Response::new(matrix_proto(&m)))
    }

    async fn list_matrices(&self, _: Request<proto::Empty>) -> Reply<proto::MatrixList> {
        let matrices = self.node.list_matrices().iter().map(matrix_proto).collect();
        Ok(Response::new(proto::MatrixList { matrices }))
    }

    async fn delete_matrix(&self, req: Request<proto::MatrixRef>) -> Reply<proto::Empty> {
        let r = req.into_inner();
        let id = if r.id.is_empty() { self.node.matrix(None, &r.name).map_err(status)?.id } else { uuid(&r.id)? };
        self.node.delete_matrix(id).map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn get_block(&self, req: Request<proto::BlockRef>) -> Reply<Self::GetBlockStream> {
        let r = req.into_inner();
        let key = BlockKey { matrix: uuid(&r.matrix)?, i: r.i, j: r.j };
        let mode = if r.for_update { LockMode::Write } else { LockMode::Read };
        let (h, value) = self.node.get_block(action(r.action), key, mode).await.map_err(status)?;
        let header =
            proto::BlockHeader { action: r.action, matrix: r.matrix, i: r.i, j: r.j, rows: h.rows, cols: h.cols, checksum: h.checksum };
        // Chunks are slices of the one buffer read from RocksDB.
        let mut chunks = Vec::with_capacity(value.len() / CHUNK_BYTES + 1);
        let mut off = HEADER_LEN;
        loop {
            let end = (off + CHUNK_BYTES).min(value.len());
            let header = (off == HEADER_LEN).then(|| header.clone());
            chunks.push(Ok(proto::BlockChunk { header, data: value.slice(off..end) }));
            off = end;
            if off >= value.len() {
                break;
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn put_block(&self, req: Request<Streaming<proto::BlockChunk>>) -> Reply<proto::Empty> {
        let mut stream = req.into_inner();
        let first = stream.message().await?.ok_or_else(|| invalid("empty block stream"))?;
        let h = first.header.ok_or_else(|| invalid("the first block chunk must carry the header"))?;
        let a = required_action(h.action)?;
        let key = BlockKey { matrix: uuid(&h.matrix)?, i: h.i, j: h.j };
        if h.rows == 0 || h.cols == 0 || h.rows > MAX_BLOCK || h.cols > MAX_BLOCK {
            return Err(invalid(format!("{key:?}: a block of {}x{}", h.rows, h.cols)));
        }
        let header = BlockHeader { rows: h.rows, cols: h.cols, checksum: h.checksum };
        let total = HEADER_LEN + header.payload_len();
        let mut value = Vec::with_capacity(total);
        value.extend_from_slice(&header.encode());
        let mut chunk: Bytes = first.data;
        loop {
            if value.len() + chunk.len() > total {
                return Err(invalid(format!("{key:?}: more data than {}x{} doubles", h.rows, h.cols)));
            }
            value.extend_from_slice(&chunk);
            match stream.message().await? {
                Some(c) => chunk = c.data,
                None => break,
            }
        }
        if value.len() != total {
            return Err(invalid(format!("{key:?}: {} bytes short", total - value.len())));
        }
        let node = self.node.clone();
        tokio::spawn(async move { node.put_block(a, key, value).await }).await.map_err(join_error)?.map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn dequeue(&self, req: Request<proto::DequeueRequest>) -> Reply<proto::DequeueReply> {
        Ok(Response::new(dequeue(&self.node, req.into_inner()).await?))
    }

    async fn enqueue(&self, req: Request<proto::EnqueueRequest>) -> Reply<proto::Empty> {
        Ok(Response::new(enqueue(&self.node, req.into_inner())?))
    }

    async fn bag_stats(&self, req: Request<proto::BagRef>) -> Reply<proto::BagStatsReply> {
        let r = req.into_inner();
        let (s, dead) = self.node.bag_stats(bag_name(&r.bag)?);
        Ok(Response::new(proto::BagStatsReply { free: s.free as u64, taken: s.taken as u64, dead: (dead.free + dead.taken) as u64 }))
    }

    async fn list_bag(&self, req: Request<proto::BagRef>) -> Reply<proto::BagElements> {
        let r = req.into_inner();
        let elements = self.node.list_bag(bag_name(&r.bag)?).into_iter().map(task_proto).collect();
        Ok(Response::new(proto::BagElements { elements }))
    }

    async fn backup(&self, req: Request<proto::BackupRequest>) -> Reply<proto::BackupReply> {
        let dir = req.into_inner().dir;
        if !std::path::Path::new(&dir).is_absolute() {
            return Err(status(StoreError::InvalidArgument { what: format!("backup directory {dir:?}: not an absolute path") }));
        }
        let r = self.node.backup(dir.into()).await.map_err(status)?;
        Ok(Response::new(proto::BackupReply {
            n_versions: r.n_versions,
            bytes_linked: r.bytes_linked,
            bytes_copied: r.bytes_copied,
            db_bytes: r.db_bytes,
            seconds: r.seconds,
        }))
    }

    async fn corrupt_block_for_test(&self, req: Request<proto::BlockRef>) -> Reply<proto::Empty> {
        let r = req.into_inner();
        let key = BlockKey { matrix: uuid(&r.matrix)?, i: r.i, j: r.j };
        self.node.corrupt_block_for_test(key).map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }
}
