//! The client side of the block data plane (format in [`wire`]): a pool of
//! plain TCP connections to the node's data port, one request in flight on
//! each. A block is read straight into the `Vec<f64>` the caller gets and
//! written straight from the caller's; the checksum is checked on arrival.

mod cached;
pub mod fdpass;
mod object_io;
mod peek;
pub mod splice;
pub mod unix_conn;
mod version_file;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::block::{self, HEADER_LEN};
use crate::client::BlockData;
use crate::StoreError;
pub use peek::{current_cpu, PeekedGets, Peeks};
use peek::{PeekCounts, Peeked};
use splice::PipeWriter;
use unix_conn::UnixConn;
use version_file::{read_block_file, read_version_file, BlockName};
use wire::{LocalEntry, Op, Reply, Request, REPLY_LEN};

type Result<T> = std::result::Result<T, StoreError>;

/// Socket buffers large enough that a 32 MiB block streams without the
/// sender stalling on every window.
const SOCKET_BUFFER: usize = 4 << 20;
/// Probes that tell a dead peer (a node whose machine vanished) from a
/// slow one, so a transfer never hangs for ever.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// How long sent data may stay unacknowledged before the kernel gives the
/// connection up (`TCP_USER_TIMEOUT`): keepalive probes only run on an
/// idle connection, and a put into a vanished host is not idle.
const UNACKNOWLEDGED: Duration = Duration::from_secs(30);
/// A data port that does not answer within this (a firewall that drops
/// it, a host gone) fails the connection, naming the port.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Payloads up to this are read on the calling task. From the page cache
/// 2 MiB take about 0.2 ms, no longer than the two thread hand-offs of the
/// blocking pool would add; larger ones go to the pool so that a 32 MiB
/// read never holds up the runtime.
const INLINE_READ: usize = 2 << 20;

/// Read and checksummed in pieces this size, so that the checksum reads
/// each piece from the cache (L2 holds 1 MiB a core here) right after
/// `pread` wrote it there rather than the whole block from memory a
/// second time. Smaller pieces cost more in syscalls than they gain in
/// cache hits: `bench blocks --sizes 256 --no-cold --reps 3`, warm batched
/// gets, three alternations: 512 KiB (one `pread` per block) 13.2–13.5
/// GB/s, 256 KiB 12.7–13.0, 64 KiB 10.8–12.0, 32 KiB 10.3–10.5.
const READ_PIECE: usize = 512 << 10;

/// How long a local get polls for each reply before it parks
/// (`fdpass::recv_with_fds`): a warm batch's reply comes 15–60 µs after
/// its request, a single block's sooner. `bench blocks --sizes 256
/// --no-cold`, the build before and this one alternating four times: warm
/// gets one by one 0.26, 0.24, 0.25, 0.24 of raw → 0.34, 0.34, 0.33, 0.34;
/// batched 0.56, 0.60, 0.56, 0.57 → 0.58, 0.60, 0.60, 0.61. Jobs did not
/// move (`master demo --kills 0`, two alternations, polling off and on:
/// matmul n = 4096 b = 256 75.4, 75.6 and 75.7, 75.1 GFLOP/s; LU b = 256
/// 37.5, 37.6 and 37.7, 37.5). Other replies (calls, commits, puts) wait
/// on disks and locks, and are not polled for; nor does the node poll for
/// the next request (below the line in `PERFORMANCE.md`).
const LOCAL_REPLY_POLL: Duration = Duration::from_micros(100);

/// Where a node's data plane is.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Tcp(SocketAddr),
    /// For a client on the node's machine.
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "{a}"),
            Target::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A data-plane connection, either end: TCP or a Unix socket.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send {
    /// The Unix socket, over which descriptors can be passed.
    fn unix(&self) -> Option<&UnixConn> {
        None
    }

    /// The pipe that puts' payloads take (a client's local connection).
    fn pipe(&self) -> Option<&PipeWriter> {
        None
    }

    /// The blocks the node peeked for this connection (a client's local
    /// connection).
    fn peeks(&mut self) -> Option<&mut Peeks> {
        None
    }
}
impl Conn for TcpStream {}
impl Conn for tokio_rustls::client::TlsStream<TcpStream> {}
impl Conn for tokio_rustls::server::TlsStream<TcpStream> {}
impl Conn for UnixConn {
    fn unix(&self) -> Option<&UnixConn> {
        Some(self)
    }
}
pub type Stream = Box<dyn Conn>;

/// A client's connection to the node on its machine: the Unix socket, the
/// pipe its puts' payloads take ([`splice`]), and the blocks the node
/// peeked for it.
struct Local {
    socket: UnixConn,
    /// `None` where this process could not make one (out of descriptors,
    /// say): its puts go through the socket.
    pipe: Option<PipeWriter>,
    peeks: Peeks,
}

impl Conn for Local {
    fn unix(&self) -> Option<&UnixConn> {
        Some(&self.socket)
    }

    fn pipe(&self) -> Option<&PipeWriter> {
        self.pipe.as_ref()
    }

    fn peeks(&mut self) -> Option<&mut Peeks> {
        Some(&mut self.peeks)
    }
}

impl AsyncRead for Local {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Local {
    fn poll_write(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().socket).poll_write(cx, buf)
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().socket).poll_shutdown(cx)
    }
}

/// Sizes a data-plane socket's buffers (either end). Best effort: the
/// kernel may clamp the sizes.
pub fn size_buffers(socket: &impl std::os::fd::AsFd) {
    let sock = socket2::SockRef::from(socket);
    let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
}

/// Makes a data-plane TCP connection (either end) notice a peer that
/// vanished: keepalive probes while it is idle, and a limit on how long
/// sent data may go unacknowledged. Best effort.
pub fn detect_dead_peers(socket: &TcpStream) {
    let sock = socket2::SockRef::from(socket);
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE).with_interval(KEEPALIVE).with_retries(3);
    let _ = sock.set_tcp_keepalive(&keepalive);
    let _ = sock.set_tcp_user_timeout(Some(UNACKNOWLEDGED));
}

/// TLS to a node's data port: the connector and the name its certificate
/// must carry.
pub(crate) type TlsTo = (tokio_rustls::TlsConnector, tokio_rustls::rustls::pki_types::ServerName<'static>);

/// Connections to one node's data plane.
pub(crate) struct DataPlane {
    target: Target,
    tls: Option<TlsTo>,
    hello: Vec<u8>,
    /// The node whose hello answer a connection must carry (the node's
    /// Unix socket); `None` takes any (a TCP port, a peer).
    node: Option<Uuid>,
    idle: Mutex<Vec<Stream>>,
    /// Set once a `vmsplice` failed for another reason than a closed pipe
    /// (a sandbox that forbids it, say): new connections make no pipe, and
    /// their puts go through the socket.
    no_pipes: std::sync::atomic::AtomicBool,
    peeked: PeekCounts,
    /// A slave's block cache, through which its gets of one block under a
    /// read lock go (TCP only: on the node's machine a get reads the
    /// node's page cache through the file's descriptor already).
    cache: std::sync::OnceLock<std::sync::Arc<crate::cache::BlockCache>>,
    /// Where a node whose blocks are objects keeps them, reached by this
    /// client itself ([`object_io`]).
    objects: std::sync::OnceLock<std::sync::Arc<dyn crate::objects::BlockObjects>>,
    /// The node keeps its blocks as objects, whether or not this client
    /// reaches them: it has no version stamps for a block cache.
    objects_node: std::sync::atomic::AtomicBool,
}

impl DataPlane {
    /// Opens a first connection, so a wrong token or an unreachable port is
    /// known at once rather than on the first block.
    pub(crate) async fn connect(target: Target, token: Option<&str>, tls: Option<TlsTo>, node: Option<Uuid>) -> Result<DataPlane> {
        let plane = DataPlane {
            target,
            tls,
            hello: wire::encode_hello(token.unwrap_or("").as_bytes()),
            node,
            idle: Mutex::new(Vec::new()),
            no_pipes: Default::default(),
            peeked: PeekCounts::default(),
            cache: Default::default(),
            objects: Default::default(),
            objects_node: Default::default(),
        };
        let first = plane.open().await?;
        plane.give_back(first);
        Ok(plane)
    }

    /// Another set of connections to the same data plane, whose puts go
    /// through the socket rather than a pipe (to compare the two).
    pub(crate) async fn without_pipes(&self) -> Result<DataPlane> {
        let plane = DataPlane {
            target: self.target.clone(),
            tls: self.tls.clone(),
            hello: self.hello.clone(),
            node: self.node,
            idle: Mutex::new(Vec::new()),
            no_pipes: true.into(),
            peeked: PeekCounts::default(),
            cache: Default::default(),
            objects: Default::default(),
            objects_node: Default::default(),
        };
        let first = plane.open().await?;
        plane.give_back(first);
        Ok(plane)
    }

    async fn open(&self) -> Result<Stream> {
        let io = |e: std::io::Error| self.unavailable(format!("connecting: {e}"));
        match &self.target {
            Target::Tcp(addr) => {
                let timed_out = || {
                    self.unavailable(format!(
                        "no answer within {} s (a firewall that drops the data port? open it, or use --blocks-over grpc)",
                        CONNECT_TIMEOUT.as_secs()
                    ))
                };
                let mut s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await.map_err(|_| timed_out())?.map_err(io)?;
                s.set_nodelay(true).map_err(io)?;
                size_buffers(&s);
                detect_dead_peers(&s);
                match &self.tls {
                    Some((connector, name)) => {
                        let handshake = connector.connect(name.clone(), s);
                        let mut s = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
                            .await
                            .map_err(|_| timed_out())?
                            .map_err(|e| self.tls_failed(e))?;
                        tokio::time::timeout(CONNECT_TIMEOUT, self.hello(&mut s)).await.map_err(|_| timed_out())??;
                        Ok(Box::new(s))
                    }
                    None => {
                        tokio::time::timeout(CONNECT_TIMEOUT, self.hello(&mut s)).await.map_err(|_| timed_out())??;
                        Ok(Box::new(s))
                    }
                }
            }
            Target::Unix(path) => {
                let mut socket = UnixConn::connect(path).await.map_err(io)?;
                size_buffers(&socket);
                self.hello(&mut socket).await?;
                let pipe = self.give_pipe(&mut socket).await?;
                Ok(Box::new(Local { socket, pipe, peeks: Peeks::default() }))
            }
        }
    }

    async fn hello(&self, s: &mut (impl AsyncRead + AsyncWrite + Unpin)) -> Result<()> {
        s.write_all(&self.hello).await.map_err(|e| self.unavailable(format!("connecting: {e}")))?;
        // Over TLS a write may leave records in the session's buffer when
        // the socket was full: flush before waiting for the answer (a no-op
        // on plain sockets).
        s.flush().await.map_err(|e| self.unavailable(format!("connecting: {e}")))?;
        let len = self.read_reply(s).await??;
        let node = match len {
            0 => None,
            wire::NODE_ID_LEN => {
                let mut id = [0u8; wire::NODE_ID_LEN as usize];
                s.read_exact(&mut id).await.map_err(|e| self.unavailable(format!("connecting: {e}")))?;
                Some(Uuid::from_bytes(id))
            }
            len => return Err(self.unavailable(format!("hello answered with {len} bytes"))),
        };
        // On the node's host the socket must be that node's: a socket
        // file left by another node (or another's data directory) is not.
        match self.node {
            Some(expected) if node != Some(expected) => Err(self.unavailable(format!(
                "{} is not the socket of the node that named it (it answered {})",
                self.target,
                node.map_or_else(|| "as no store node".to_string(), |id| format!("as node {id}"))
            ))),
            _ => Ok(()),
        }
    }

    /// Makes a local connection's pipe and hands the node its read end;
    /// `None` if no pipe could be made.
    async fn give_pipe(&self, socket: &mut UnixConn) -> Result<Option<PipeWriter>> {
        let io = |e: std::io::Error| self.unavailable(format!("handing over a pipe: {e}"));
        if self.no_pipes.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let (read, pipe) = match splice::pipe() {
            Ok(made) => made,
            Err(e) => {
                tracing::debug!("no pipe for a data plane connection ({e}); its puts go through the socket");
                return Ok(None);
            }
        };
        fdpass::send_with_fds(socket, &Request::pipe().encode(), &[std::os::fd::AsFd::as_fd(&read)]).await.map_err(io)?;
        drop(read);
        match self.read_reply(socket).await? {
            Ok(0) => Ok(Some(pipe)),
            Ok(len) => Err(self.unavailable(format!("a pipe answered with {len} bytes"))),
            Err(e) => Err(e),
        }
    }

    fn take(&self) -> Option<Stream> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, s: Stream) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }

    fn unavailable(&self, what: String) -> StoreError {
        StoreError::StoreUnavailable { what: format!("block data plane at {}: {what}", self.target) }
    }

    /// A refused certificate is no outage: retrying cannot cure it.
    fn tls_failed(&self, e: std::io::Error) -> StoreError {
        let text = crate::client::error_chain(&e);
        if text.to_lowercase().contains("certificate") {
            StoreError::Unauthenticated { what: format!("TLS to the block data plane at {}: {text}", self.target) }
        } else {
            self.unavailable(format!("TLS handshake: {text}"))
        }
    }

    /// Whether this is the node's Unix socket.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.target, Target::Unix(_))
    }

    /// Reads one reply head: `Ok(Ok(len))` for success with `len` bytes to
    /// follow, `Ok(Err(e))` for the node's typed error (already read, the
    /// connection stays usable), `Err` when the connection is not.
    async fn read_reply(&self, s: &mut (impl AsyncRead + Unpin + ?Sized)) -> Result<std::result::Result<u64, StoreError>> {
        let mut head = [0u8; REPLY_LEN];
        s.read_exact(&mut head).await.map_err(|e| self.unavailable(format!("reading a reply: {e}")))?;
        let reply = Reply::decode(&head).map_err(|e| self.unavailable(e.to_string()))?;
        if reply.ok {
            return Ok(Ok(reply.len));
        }
        Ok(Err(self.read_error(s, reply.len).await?))
    }

    /// Reads the typed error of a failed reply whose head said `len`.
    async fn read_error(&self, s: &mut (impl AsyncRead + Unpin + ?Sized), len: u64) -> Result<StoreError> {
        if len > wire::MAX_ERROR_LEN {
            return Err(self.unavailable(format!("an error detail of {len} bytes")));
        }
        let mut detail = vec![0u8; len as usize];
        s.read_exact(&mut detail).await.map_err(|e| self.unavailable(format!("reading an error: {e}")))?;
        Ok(StoreError::from_detail(&detail))
    }

    /// A pooled connection, or a new one. An exchange gives it back only
    /// if it left it in step (the node's answer read in full, success or
    /// typed error); a failed or cancelled exchange drops it.
    async fn checkout(&self) -> Result<Stream> {
        match self.take() {
            Some(s) => Ok(s),
            None => self.open().await,
        }
    }

    /// Sends this plane's gets of one block under a read lock through
    /// The address the attached cache serves peers on, if it does.
    pub(crate) fn cache_addr(&self) -> Option<String> {
        self.cache.get().map(|c| c.own_addr()).filter(|a| !a.is_empty())
    }

    /// `cache` (a TCP plane's only); false where it does not.
    pub(crate) fn attach_cache(&self, cache: std::sync::Arc<crate::cache::BlockCache>) -> bool {
        !self.is_local()
            && !self.objects_node.load(std::sync::atomic::Ordering::Relaxed)
            && (self.cache.set(cache).is_ok() || self.cache.get().is_some())
    }

    /// Sends this plane's block reads and writes to `objects`, the node's
    /// object store, with only their versions going through the node.
    pub(crate) fn attach_objects(&self, objects: Option<std::sync::Arc<dyn crate::objects::BlockObjects>>) {
        self.objects_node.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(objects) = objects {
            let _ = self.objects.set(objects);
        }
    }

    pub(crate) async fn get(&self, action: u64, matrix: Uuid, i: u32, j: u32, for_update: bool) -> Result<BlockData> {
        if let Some(objects) = self.objects.get() {
            return self.object_get(objects, action, matrix, i, j, for_update).await;
        }
        // On the node's machine the node hands over the version file and
        // the payload never crosses a socket.
        let local = matches!(self.target, Target::Unix(_));
        if let Some(cache) = self.cache.get() {
            if !for_update {
                return self.get_cached(cache, action, matrix, i, j).await;
            }
        }
        let op = match (local, for_update) {
            (false, false) => Op::Get,
            (false, true) => Op::GetForUpdate,
            (true, false) => Op::GetLocal,
            (true, true) => Op::GetLocalForUpdate,
        };
        let mut s = self.checkout().await?;
        let answer = if local {
            self.get_local_on(&mut s, op, action, BlockName { matrix, i, j }).await?
        } else {
            self.get_on(&mut s, &Request::get(op, action, matrix, i, j, 0)).await?
        };
        self.give_back(s);
        if let (Some(cache), Ok(b)) = (self.cache.get(), &answer) {
            cache.count_store(b.data.len() * 8);
        }
        answer
    }

    /// A local get: the reply carries the version file's descriptor and
    /// the block header; the payload is read from the file here. A block
    /// the node peeked ([`wire::Peek`]) is read while the node takes its
    /// lock, and kept if the version locked has the write stamp read.
    async fn get_local_on(&self, s: &mut Stream, op: Op, action: u64, name: BlockName) -> Result<Result<BlockData>> {
        let BlockName { matrix, i, j } = name;
        let what = || name.to_string();
        let peeked = match s.peeks() {
            Some(peeks) if op == Op::GetLocal && wire::shape_only(action) => peeks.take(matrix, i, j),
            _ => None,
        };
        let flags = wire::LocalGetFlags { stamp_wanted: peeked.is_some(), client_cpu: current_cpu() };
        let req = Request::get(op, action, matrix, i, j, flags.encode());
        s.write_all(&req.encode()).await.map_err(|e| self.unavailable(format!("sending a get: {e}")))?;
        s.flush().await.map_err(|e| self.unavailable(format!("sending a get: {e}")))?;
        // Anything wrong with the peeked file (replaced, reused, cut) only
        // means it is not the block: the reply's file is read instead.
        let early = peeked
            .filter(|p| p.peek.entry.header.payload_len() <= INLINE_READ)
            .and_then(|p| read_version_file(&p.file, p.peek.entry.header, p.peek.entry.cached, action, name).ok())
            .filter(|&(_, stamp)| stamp != 0);
        let (entry, file, next) = match self.recv_one_file(s, &what).await? {
            Ok(answer) => answer,
            Err(e) => return Ok(Err(e)),
        };
        if let (Some((peek, file)), Some(peeks)) = (next, s.peeks()) {
            peeks.put(Peeked { matrix, peek, file });
        }
        let kept = match early {
            Some((block, stamp)) if stamp == entry.stamp => Some(block),
            _ => None,
        };
        if flags.stamp_wanted {
            self.peeked.count(kept.is_some());
        }
        match kept {
            Some(block) => Ok(Ok(block)),
            None => Ok(read_block_file(file, entry, action, name).await),
        }
    }

    /// How the gets of peeked blocks went so far.
    pub(crate) fn peeked_gets(&self) -> PeekedGets {
        self.peeked.snapshot()
    }

    /// Reads a local get's reply head and the descriptors that came with
    /// it, polling for it first (`LOCAL_REPLY_POLL`); a failed reply's
    /// error is read whole. `Err`: the connection is out of step.
    async fn recv_local_head(
        &self,
        s: &mut Stream,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Result<(Reply, Vec<std::os::fd::OwnedFd>)>> {
        let unix = s.unix().ok_or_else(|| self.unavailable("a local get over TCP".into()))?;
        let mut head = [0u8; REPLY_LEN];
        let read = |e: std::io::Error| self.unavailable(format!("reading {}: {e}", what()));
        let fds = fdpass::recv_with_fds(unix, &mut head, LOCAL_REPLY_POLL).await.map_err(read)?;
        let reply = Reply::decode(&head).map_err(|e| self.unavailable(e.to_string()))?;
        if !reply.ok {
            return Ok(Err(self.read_error(s, reply.len).await?));
        }
        Ok(Ok((reply, fds)))
    }

    /// Reads the reply to a local get of one block: its header and file,
    /// and the block the node peeked, if it did. `Err`: the connection is
    /// out of step; `Ok`: the node's answer.
    async fn recv_one_file(
        &self,
        s: &mut Stream,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Result<(LocalEntry, std::fs::File, Option<(wire::Peek, std::fs::File)>)>> {
        let read = |e: std::io::Error| self.unavailable(format!("reading {}: {e}", what()));
        let (reply, fds) = match self.recv_local_head(s, what).await? {
            Ok(got) => got,
            Err(e) => return Ok(Err(e)),
        };
        let with_peek = (HEADER_LEN + wire::PEEK_LEN) as u64;
        let shape_ok = matches!((reply.len, fds.len()), (l, 1) if l == HEADER_LEN as u64) || (reply.len, fds.len()) == (with_peek, 2);
        if !shape_ok {
            return Err(self.unavailable(format!(
                "{}: a local get of one block answered with {} bytes and {} files",
                what(),
                reply.len,
                fds.len()
            )));
        }
        let mut body = vec![0u8; reply.len as usize];
        s.read_exact(&mut body).await.map_err(read)?;
        let bad = || self.unavailable(format!("{}: a local get answered with a bad block header", what()));
        let entry = LocalEntry::decode(&body[..HEADER_LEN]).ok_or_else(bad)?;
        let mut fds = fds.into_iter().map(std::fs::File::from);
        let file = fds.next().expect("one file, as checked");
        let peek = match fds.next() {
            Some(f) => Some((wire::Peek::decode(&body[HEADER_LEN..]).ok_or_else(bad)?, f)),
            None => None,
        };
        Ok(Ok((entry, file, peek)))
    }

    /// Gets blocks of `matrix` in order, under read (`for_update`: write)
    /// locks of `action` (0: the committed versions, no locks), each
    /// [`wire::MAX_MANY`] of them in one exchange: on the node's machine
    /// its reply hands over all their files, elsewhere it carries their
    /// values one after the other. Stops at the first that fails.
    pub(crate) async fn get_many(&self, action: u64, matrix: Uuid, blocks: &[(u32, u32)], for_update: bool) -> Result<Vec<BlockData>> {
        if let Some(objects) = self.objects.get() {
            let mut got = Vec::with_capacity(blocks.len());
            for &(i, j) in blocks {
                got.push(self.object_get(objects, action, matrix, i, j, for_update).await?);
            }
            return Ok(got);
        }
        let local = matches!(self.target, Target::Unix(_));
        let op = if local { Op::GetLocalMany } else { Op::GetMany };
        let mut got = Vec::with_capacity(blocks.len());
        for chunk in blocks.chunks(wire::MAX_MANY as usize) {
            let what = || format!("{} blocks of {matrix} from ({}, {})", chunk.len(), chunk[0].0, chunk[0].1);
            let (req, body) = Request::get_many(op, action, matrix, chunk, for_update);
            let mut s = self.checkout().await?;
            let mut out = req.encode().to_vec();
            out.extend_from_slice(&body);
            s.write_all(&out).await.map_err(|e| self.unavailable(format!("sending a get: {e}")))?;
            s.flush().await.map_err(|e| self.unavailable(format!("sending a get: {e}")))?;
            if !local {
                let values = self.recv_values(&mut s, chunk, matrix).await?;
                self.give_back(s);
                got.extend(values?);
                continue;
            }
            // The node answers in groups as it opens the blocks: each
            // group's blocks are read while it opens the next.
            let mut ids = chunk.iter();
            let mut failed = None;
            let mut left = chunk.len();
            while left > 0 {
                let files = match self.recv_some_files(&mut s, left, &what).await? {
                    Ok(files) => files,
                    Err(e) => {
                        // The node's error ends the get, in step.
                        failed = Some(e);
                        break;
                    }
                };
                left -= files.len();
                for (entry, file) in files {
                    let &(i, j) = ids.next().expect("no more files than blocks asked for");
                    if failed.is_none() {
                        // After a block that failed, the rest are only
                        // received, so that the connection stays in step.
                        match read_block_file(file, entry, action, BlockName { matrix, i, j }).await {
                            Ok(b) => got.push(b),
                            Err(e) => failed = Some(e),
                        }
                    }
                }
            }
            self.give_back(s);
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(got)
    }

    /// Reads the reply to a get of many over the socket: every block's
    /// stored form, read whole (so the connection stays in step) even when
    /// one fails its checksum. `Err`: out of step; `Ok`: the node's answer,
    /// or the first block that arrived damaged.
    async fn recv_values(&self, s: &mut Stream, blocks: &[(u32, u32)], matrix: Uuid) -> Result<Result<Vec<BlockData>>> {
        let mut left = match self.read_reply(s).await? {
            Ok(len) => len,
            Err(e) => return Ok(Err(e)),
        };
        let mut got = Vec::with_capacity(blocks.len());
        let mut damaged = None;
        for &(i, j) in blocks {
            let what = || format!("block ({i}, {j}) of {matrix}");
            match self.read_value(s, &mut left, &what).await? {
                Ok(b) => got.push(b),
                Err(e) => {
                    damaged.get_or_insert(e);
                }
            }
        }
        if left != 0 {
            return Err(self.unavailable(format!("a get of {} blocks answered with {left} bytes more than they hold", blocks.len())));
        }
        Ok(damaged.map_or(Ok(got), Err))
    }

    /// Reads one block's stored form of at most `left` bytes announced.
    /// `Err`: out of step; `Ok(Err)`: it arrived whole but damaged.
    async fn read_value(&self, s: &mut Stream, left: &mut u64, what: &(dyn Fn() -> String + Sync)) -> Result<Result<BlockData>> {
        let read = |e: std::io::Error| self.unavailable(format!("reading {}: {e}", what()));
        let mut head = [0u8; HEADER_LEN];
        if *left < HEADER_LEN as u64 {
            return Err(self.unavailable(format!("{}: the reply ends before its header", what())));
        }
        s.read_exact(&mut head).await.map_err(read)?;
        let Some(header) = block::decode_header(&head) else {
            return Err(self.unavailable(format!("{}: a reply without a block header", what())));
        };
        let len = (HEADER_LEN + header.payload_len()) as u64;
        if header.rows > wire::MAX_BLOCK_SIDE || header.cols > wire::MAX_BLOCK_SIDE || len > *left {
            return Err(self.unavailable(format!("{}: {} bytes left in the reply for {}x{}", what(), *left, header.rows, header.cols)));
        }
        *left -= len;
        let mut data = vec![0f64; header.rows as usize * header.cols as usize];
        s.read_exact(bytemuck::cast_slice_mut(&mut data)).await.map_err(read)?;
        // In step either way: a damaged payload is the block's fault.
        Ok(if block::checksum_matches(&header, bytemuck::cast_slice(&data)) {
            Ok(BlockData { rows: header.rows as usize, cols: header.cols as usize, data })
        } else {
            Err(StoreError::Corrupt { what: format!("{}: checksum mismatch after transfer", what()) })
        })
    }

    /// Reads one reply of a local get with at most `left` blocks still to
    /// come: some of them, in order, or the node's error, which ends the
    /// get (a get of many is answered in groups, `store::dataplane`).
    async fn recv_some_files(
        &self,
        s: &mut Stream,
        left: usize,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Result<Vec<(LocalEntry, std::fs::File)>>> {
        let read = |e: std::io::Error| self.unavailable(format!("reading {}: {e}", what()));
        let (reply, fds) = match self.recv_local_head(s, what).await? {
            Ok(got) => got,
            Err(e) => return Ok(Err(e)),
        };
        let k = fds.len();
        if k == 0 || k > left || reply.len != (k * HEADER_LEN) as u64 {
            return Err(self.unavailable(format!(
                "{}: a local get answered with {} bytes and {k} files ({left} blocks to come)",
                what(),
                reply.len
            )));
        }
        let mut heads = vec![0u8; k * HEADER_LEN];
        s.read_exact(&mut heads).await.map_err(read)?;
        let mut files = Vec::with_capacity(k);
        for (head, fd) in heads.chunks_exact(HEADER_LEN).zip(fds) {
            let Some(entry) = LocalEntry::decode(head) else {
                return Err(self.unavailable(format!("{}: a local get answered with a bad block header", what())));
            };
            files.push((entry, std::fs::File::from(fd)));
        }
        Ok(Ok(files))
    }

    /// `Err`: the connection is out of step; `Ok`: the node's answer.
    async fn get_on(&self, s: &mut Stream, req: &Request) -> Result<Result<BlockData>> {
        let what = || format!("block ({}, {}) of {}", req.i, req.j, req.matrix);
        s.write_all(&req.encode()).await.map_err(|e| self.unavailable(format!("sending a get: {e}")))?;
        s.flush().await.map_err(|e| self.unavailable(format!("sending a get: {e}")))?;
        let mut left = match self.read_reply(s).await? {
            Ok(len) => len,
            Err(e) => return Ok(Err(e)),
        };
        let value = self.read_value(s, &mut left, &what).await?;
        if left != 0 {
            return Err(self.unavailable(format!("{}: a reply {left} bytes longer than the block", what())));
        }
        Ok(value)
    }

    pub(crate) async fn put(&self, action: u64, matrix: Uuid, i: u32, j: u32, block: &BlockData) -> Result<()> {
        let payload: &[u8] = bytemuck::cast_slice(&block.data);
        let side = wire::MAX_BLOCK_SIDE as usize;
        if block.rows * block.cols != block.data.len() || block.rows > side || block.cols > side {
            return Err(StoreError::InvalidArgument {
                what: format!("block ({i}, {j}): {} values do not make a {}x{} block", block.data.len(), block.rows, block.cols),
            });
        }
        if let Some(objects) = self.objects.get() {
            return self.object_put(objects, action, matrix, (i, j), block).await;
        }
        let checksum = block::checksum(payload);
        let mut s = self.checkout().await?;
        let op = if s.pipe().is_some() { Op::PutSpliced } else { Op::Put };
        let req = Request { op, action, matrix, i, j, rows: block.rows as u32, cols: block.cols as u32, checksum, flags: 0 };
        let answer = self.put_on(&mut s, &req, payload).await?;
        self.give_back(s);
        answer
    }

    /// Runs a unary method over the data plane: `request` protobuf-encoded
    /// in, the reply decoded out, errors as the node typed them.
    pub(crate) async fn call<Q: prost::Message, R: prost::Message + Default>(&self, method: wire::Method, request: &Q) -> Result<R> {
        let body = request.encode_to_vec();
        let mut s = self.checkout().await?;
        let answer = self.call_on(&mut s, &Request::call(method, body.len() as u32), &body).await?;
        self.give_back(s);
        R::decode(&answer?[..]).map_err(|e| self.unavailable(format!("decoding the reply to {method:?}: {e}")))
    }

    /// `Err`: the connection is out of step; `Ok`: the node's answer.
    async fn call_on(&self, s: &mut Stream, req: &Request, body: &[u8]) -> Result<Result<Vec<u8>>> {
        let mut out = req.encode().to_vec();
        out.extend_from_slice(body);
        s.write_all(&out).await.map_err(|e| self.unavailable(format!("sending a call: {e}")))?;
        s.flush().await.map_err(|e| self.unavailable(format!("sending a call: {e}")))?;
        match self.read_reply(s).await? {
            Ok(len) if len <= wire::MAX_CALL_BODY => {
                let mut reply = vec![0u8; len as usize];
                s.read_exact(&mut reply).await.map_err(|e| self.unavailable(format!("reading a call's reply: {e}")))?;
                Ok(Ok(reply))
            }
            Ok(len) => Err(self.unavailable(format!("a call's reply of {len} bytes"))),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn put_on(&self, s: &mut Stream, req: &Request, payload: &[u8]) -> Result<Result<()>> {
        let send = |e: std::io::Error| self.unavailable(format!("sending block ({}, {}): {e}", req.i, req.j));
        s.write_all(&req.encode()).await.map_err(send)?;
        match s.pipe() {
            // The payload's pages stay untouched until the answer: the
            // caller's borrow of them outlives this call.
            Some(pipe) if req.op == Op::PutSpliced => pipe.send(payload).await.map_err(|e| {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    self.no_pipes.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                send(e)
            })?,
            _ => s.write_all(payload).await.map_err(send)?,
        }
        s.flush().await.map_err(send)?;
        match self.read_reply(s).await? {
            Ok(0) => Ok(Ok(())),
            Ok(len) => Err(self.unavailable(format!("a put answered with {len} bytes"))),
            Err(e) => Ok(Err(e)),
        }
    }
}
