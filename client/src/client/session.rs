//! Sessions and the actions they begin: a session's heartbeat and its
//! actions' block and small-object reads and writes, queue calls and
//! commits, over the data plane where the client has one.

use super::*;

pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live session. Dropping it closes the stream, which aborts the
/// session's running actions on the node.
#[derive(Clone)]
pub struct Session {
    pub(super) client: Client,
    pub(super) id: u64,
    pub(super) lease: Duration,
    pub(super) alive: watch::Receiver<bool>,
    pub(super) heartbeat: Arc<AbortOnDrop>,
    /// Top-level actions the node began for this session as it committed
    /// the previous ones ([`Action::commit`]), for the next `begin`s.
    pub(super) begun_ahead: BegunAhead,
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
    /// Dequeues from `bag`, waiting up to `wait` while every element is
    /// taken. A client with a block cache that serves peers is handed
    /// first a task whose inputs its cache holds (if the bag's tasks say
    /// what they read, [`Action::enqueue_near`]).
    pub async fn dequeue(&self, bag: &str, wait: Duration) -> Result<Dequeue> {
        let near = self.plane.as_ref().and_then(|p| p.cache_addr()).unwrap_or_default();
        let req = proto::DequeueRequest { action: self.id, bag: bag.to_owned(), wait_ms: wait.as_millis() as u32, near };
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
        self.enqueue_near(bag, payload, &[])
    }

    /// Enqueues an element that reads `inputs` (matrix, block row, block
    /// column): a slave whose cache holds them is handed it first. The
    /// bag's order still rules the elements enqueued without inputs.
    pub fn enqueue_near(
        &self,
        bag: &str,
        payload: &[u8],
        inputs: &[(Uuid, u32, u32)],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let inputs = inputs.iter().map(|(m, i, j)| proto::BlockInput { matrix: m.as_bytes().to_vec().into(), i: *i, j: *j }).collect();
        let req = proto::EnqueueRequest { action: self.id, bag: bag.to_owned(), payload: payload.to_vec().into(), inputs };
        let (mut rpc, plane) = (self.rpc.clone(), self.plane.clone());
        async move { unary::<_, proto::Empty, _, _>(&plane, Method::Enqueue, req, |q| async move { rpc.enqueue(q).await }).await.map(drop) }
    }
}

pub(super) struct F64Bytes(Vec<f64>);

impl AsRef<[u8]> for F64Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

pub(super) fn task_from(t: proto::Task) -> Task {
    Task { bag: t.bag, seq: t.seq, payload: t.payload.to_vec(), attempts: t.attempts, returns: t.returns }
}

pub(super) async fn read_small(
    rpc: &Rpc,
    plane: &Option<Arc<DataPlane>>,
    action: u64,
    key: &str,
    mode: proto::LockMode,
) -> Result<Option<Vec<u8>>> {
    let req = proto::SmallRef { action, key: key.to_owned(), mode: mode as i32 };
    let mut rpc = rpc.clone();
    let v = unary(plane, Method::ReadSmall, req, |q| async move { rpc.read_small(q).await }).await?;
    Ok(v.found.then(|| v.value.to_vec()))
}

/// Writes a block under an overwrite lock of `action`: over the data plane
/// when the node has one, else as a chunked gRPC stream.
pub(super) async fn put_block(
    rpc: &Rpc,
    plane: &Option<Arc<DataPlane>>,
    action: u64,
    matrix: Uuid,
    i: u32,
    j: u32,
    block: BlockData,
) -> Result<()> {
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
pub(super) async fn unary<Q, R, F, Fut>(plane: &Option<Arc<DataPlane>>, method: Method, request: Q, grpc: F) -> Result<R>
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
pub(super) async fn get_blocks(
    rpc: &Rpc,
    plane: &Option<Arc<DataPlane>>,
    action: u64,
    matrix: Uuid,
    blocks: &[(u32, u32)],
) -> Result<Vec<BlockData>> {
    if let Some(plane) = plane {
        return plane.get_many(action, matrix, blocks, false).await;
    }
    let mut got = Vec::with_capacity(blocks.len());
    for &(i, j) in blocks {
        got.push(get_block(rpc, plane, action, matrix, i, j, false).await?);
    }
    Ok(got)
}

pub(super) async fn get_block(
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
