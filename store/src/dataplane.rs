//! The node's side of the block data plane (format in
//! `store_client::dataplane::wire`): a TCP listener beside gRPC, and a Unix
//! socket in the data directory for clients on the same machine (loopback
//! TCP moves 1.6 GB/s on the reference machine, a Unix socket 4.9 GB/s),
//! whose connections carry block gets and puts, one at a time each. Every request
//! goes through the same `Node` calls as the gRPC handlers (locks, fencing,
//! checksums); this module only moves bytes.
//!
//! A connection is closed, never resynchronised, on anything that is not
//! the protocol: a bad hello, a wrong token, a garbage request, a put
//! larger than a block can be.

use std::sync::Arc;
use std::time::Duration;

use actions::{ActionId, LockMode};
use std::os::fd::AsFd;
use store_client::block::{BlockHeader, HEADER_LEN};

use store_client::dataplane::splice::PipeReader;
use store_client::dataplane::wire::{self, Op, Reply, Request, REQUEST_LEN};
use store_client::dataplane::{detect_dead_peers, fdpass, size_buffers, unix_conn::UnixConn, Stream};
use store_client::StoreError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::blocks::MAX_BLOCK;
use crate::holders::Holders;
use crate::keys::BlockKey;
use crate::node::Node;
use crate::readahead::Readahead;
use crate::transports::Transports;

/// A client that connects must say hello within this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a stopping node waits for the requests its connections are
/// serving to be answered before it drops them.
const STOP_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Wire(#[from] wire::WireError),
    #[error("{0}")]
    Refused(String),
}

/// Accepts data-plane connections (TCP, and Unix if `unix` is given) until
/// `stop` changes (or its sender is dropped). Then each connection answers
/// the request it is serving and closes, within [`STOP_GRACE`]: a commit
/// whose failure stopped the node is answered with that failure, not a
/// closed connection. Aborting the task ends every connection at once.
pub(crate) async fn serve(
    (tcp, unix): (TcpListener, Option<UnixListener>),
    node: Arc<Node>,
    token: Option<String>,
    tls: Option<TlsAcceptor>,
    transports: Arc<Transports>,
    node_id: uuid::Uuid,
    stop: tokio::sync::watch::Receiver<()>,
) {
    let mut stopping = stop.clone();
    let token: Arc<[u8]> = token.unwrap_or_default().into_bytes().into();
    let mut connections = JoinSet::new();
    let spawn = |connections: &mut JoinSet<()>, s: Incoming, peer: String| {
        let (node, token, tls, transports, stop) = (node.clone(), token.clone(), tls.clone(), transports.clone(), stop.clone());
        connections.spawn(async move {
            let served = async {
                let s = match (s, tls) {
                    (Incoming::Tcp(s), Some(tls)) => tokio::time::timeout(HELLO_TIMEOUT, handshake(s, &tls))
                        .await
                        .map_err(|_| ConnError::Refused("no TLS handshake in time".into()))??,
                    (Incoming::Tcp(s), None) => Box::new(s),
                    (Incoming::Unix(s), _) => s,
                };
                connection(s, &node, &token, node_id, stop).await
            };
            if let Err(e) = served.await {
                if matches!(e, ConnError::Refused(_) | ConnError::Wire(_)) {
                    Transports::count(&transports.refused);
                }
                tracing::debug!(%peer, "data plane connection closed: {e}");
            }
        });
    };
    loop {
        tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok((s, peer)) => {
                    let _ = s.set_nodelay(true);
                    size_buffers(&s);
                    // A host that vanishes mid-put frees its connection
                    // and its staged file.
                    detect_dead_peers(&s);
                    Transports::count(&transports.data_tcp);
                    spawn(&mut connections, Incoming::Tcp(s), peer.to_string());
                }
                Err(e) => accept_failed(e).await,
            },
            accepted = async { unix.as_ref().expect("guarded").accept().await }, if unix.is_some() => match accepted {
                Ok((s, _)) => match UnixConn::from_tokio(s) {
                    Ok(s) => {
                        size_buffers(&s);
                        Transports::count(&transports.data_unix);
                        spawn(&mut connections, Incoming::Unix(Box::new(s)), "unix socket".into());
                    }
                    Err(e) => tracing::warn!("data plane: a Unix connection not taken: {e}"),
                },
                Err(e) => accept_failed(e).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stopping.changed() => break,
        }
    }
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(STOP_GRACE, drained).await.is_err() {
        tracing::warn!("data plane: requests still running {STOP_GRACE:?} after the stop; dropping them");
    }
}

/// A connection as accepted, before its TLS handshake (TCP only).
enum Incoming {
    Tcp(TcpStream),
    Unix(Stream),
}

/// The TLS handshake of a data-plane connection. A client that sends a
/// plaintext hello to a node that requires TLS is told so in plaintext, in
/// the reply format it reads, rather than left with a closed connection.
async fn handshake(s: TcpStream, tls: &TlsAcceptor) -> Result<Stream, ConnError> {
    let mut first = [0u8; 1];
    if s.peek(&mut first).await? == 1 && first[0] == wire::HELLO_MAGIC[0] {
        let e = StoreError::Unauthenticated {
            what: "this store node's data plane requires TLS: give the client --tls-ca (STORE_TLS_CA)".into(),
        };
        let mut plain: Stream = Box::new(s);
        send_error(&mut plain, &e).await?;
        return Err(ConnError::Refused(e.to_string()));
    }
    let s = tls.accept(s).await.map_err(|e| ConnError::Refused(format!("TLS handshake: {e}")))?;
    Ok(Box::new(s))
}

/// Out of descriptors, say: keep serving the connections there are, and
/// try again shortly.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!("data plane accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

async fn connection(
    mut s: Stream,
    node: &Arc<Node>,
    token: &[u8],
    node_id: uuid::Uuid,
    mut stop: tokio::sync::watch::Receiver<()>,
) -> Result<(), ConnError> {
    tokio::time::timeout(HELLO_TIMEOUT, hello(&mut s, token, node_id))
        .await
        .map_err(|_| ConnError::Refused("no hello in time".into()))??;
    // The pipe a local client's spliced puts take (`Op::Pipe`).
    let mut pipe: Option<PipeReader> = None;
    let mut readahead = Readahead::default();
    loop {
        // The previous answer (or the hello's) whole on the wire before
        // waiting for the next request: over TLS a write may leave records
        // in the session's buffer when the socket was full, and a client
        // waiting for them would wait for ever (a no-op on plain sockets).
        s.flush().await?;
        let mut head = [0u8; REQUEST_LEN];
        // On a Unix socket a request may carry a descriptor (`Op::Pipe`'s);
        // any other request's are dropped (closed) here.
        let next = async {
            match s.unix() {
                // Never polled: the next request may be long in coming.
                Some(unix) => fdpass::recv_with_fds(unix, &mut head, Duration::ZERO).await,
                None => s.read_exact(&mut head).await.map(|_| Vec::new()),
            }
        };
        // A stopping node takes no new request; the one being served
        // was answered above.
        let read = tokio::select! {
            read = next => read,
            _ = stop.changed() => return Ok(()),
        };
        let mut fds = match read {
            Ok(fds) => fds,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let req = Request::decode(&head)?;
        let key = BlockKey { matrix: req.matrix, i: req.i, j: req.j };
        let action = (req.action != 0).then_some(ActionId(req.action));
        match req.op {
            Op::Get | Op::GetForUpdate => {
                let mode = if req.op == Op::Get { LockMode::Read } else { LockMode::Write };
                match node.get_block(action, key, mode).await {
                    Ok((_, value)) => {
                        s.write_all(&Reply { ok: true, len: value.len() as u64 }.encode()).await?;
                        s.write_all(&value).await?;
                    }
                    Err(e) => send_error(&mut s, &e).await?,
                }
            }
            Op::GetCached => {
                let mut head = [0u8; 16];
                s.read_exact(&mut head).await?;
                let Some((mut get, own, bad)) = wire::CachedGet::decode_head(&head) else {
                    let e = StoreError::InvalidArgument { what: "a cached get with an address too long".into() };
                    send_error(&mut s, &e).await?;
                    return Err(ConnError::Refused(e.to_string()));
                };
                let mut addrs = vec![0u8; own + bad];
                s.read_exact(&mut addrs).await?;
                get.own_addr = String::from_utf8_lossy(&addrs[..own]).into_owned();
                get.bad = String::from_utf8_lossy(&addrs[own..]).into_owned();
                match cached_get(node, &node.holders, action, key, &get).await {
                    Ok(answer) => send_cached(&mut s, &node.holders, key, &get, answer).await?,
                    Err(e) => send_error(&mut s, &e).await?,
                }
            }
            Op::ObjectGet => {
                let mode = if req.cols == 0 { LockMode::Read } else { LockMode::Write };
                match node.object_version(action, key, mode).await {
                    Ok(at) => {
                        let mut out = Reply { ok: true, len: wire::ObjectVersion::LEN as u64 }.encode().to_vec();
                        out.extend_from_slice(&at.encode());
                        s.write_all(&out).await?;
                    }
                    Err(e) => send_error(&mut s, &e).await?,
                }
            }
            Op::ObjectPut => {
                let mut id = [0u8; 16];
                s.read_exact(&mut id).await?;
                let answer = if req.rows == 0 || req.cols == 0 || req.rows > MAX_BLOCK || req.cols > MAX_BLOCK {
                    Err(StoreError::InvalidArgument { what: format!("{key:?}: a block of {}x{}", req.rows, req.cols) })
                } else {
                    let header = BlockHeader { rows: req.rows, cols: req.cols, checksum: req.checksum };
                    node.object_put(action, key, header, uuid::Uuid::from_bytes(id)).await
                };
                match answer {
                    Ok(()) => s.write_all(&Reply { ok: true, len: 0 }.encode()).await?,
                    Err(e) => send_error(&mut s, &e).await?,
                }
            }
            Op::PeerGet => {
                let e = StoreError::InvalidArgument { what: "a peer get is for slaves, not the node".into() };
                send_error(&mut s, &e).await?;
                return Err(ConnError::Refused(e.to_string()));
            }
            Op::GetLocal | Op::GetLocalForUpdate => {
                let mode = if req.op == Op::GetLocal { LockMode::Read } else { LockMode::Write };
                let Some(unix) = s.unix() else {
                    let e = StoreError::InvalidArgument { what: "a local get needs the node's Unix socket".into() };
                    send_error(&mut s, &e).await?;
                    continue;
                };
                let Err(e) = get_local_one(node, unix, &mut readahead, &req, action, mode).await? else { continue };
                send_error(&mut s, &e).await?;
            }
            Op::GetLocalMany | Op::GetMany => {
                if req.rows == 0 || req.rows > wire::MAX_MANY || req.cols > 1 {
                    let e = StoreError::InvalidArgument { what: format!("a get of {} blocks (at most {})", req.rows, wire::MAX_MANY) };
                    send_error(&mut s, &e).await?;
                    return Err(ConnError::Refused(e.to_string()));
                }
                let mut body = vec![0u8; req.rows as usize * 8];
                s.read_exact(&mut body).await?;
                let mode = if req.cols == 0 { LockMode::Read } else { LockMode::Write };
                let blocks = wire::decode_many(&body);
                if req.op == Op::GetMany && node.db.objects().is_some() {
                    match get_stored(node, action, key.matrix, &blocks, mode).await {
                        Ok(values) => send_stored(&mut s, &values).await?,
                        Err(e) => send_error(&mut s, &e).await?,
                    }
                    continue;
                }
                if req.op == Op::GetMany {
                    match open_blocks(node, action, req.matrix, &blocks, mode).await {
                        Ok((files, _)) => send_values(&mut s, &files).await?,
                        Err(e) => send_error(&mut s, &e).await?,
                    }
                    continue;
                }
                let Some(unix) = s.unix() else {
                    let e = StoreError::InvalidArgument { what: "a local get needs the node's Unix socket".into() };
                    send_error(&mut s, &e).await?;
                    continue;
                };
                // In groups, each sent as soon as it is open: the client
                // reads the first blocks while the node opens the rest. Once
                // a group is found not cached, the rest go in one group, so
                // that all their files' reads are in flight at once
                // (b = 256 cold gets in groups: 0.56-0.68 of raw, against
                // 0.81-1.41 in one).
                let (mut sent, mut cold) = (0, false);
                while sent < blocks.len() {
                    let group = local_group(blocks.len() - sent, cold);
                    match open_local(node, action, req.matrix, &blocks[sent..sent + group], mode).await {
                        Ok(opened) => {
                            send_files(unix, &opened.files, opened.cached).await?;
                            sent += group;
                            cold |= opened.cold;
                        }
                        Err(e) => {
                            send_error(&mut s, &e).await?;
                            break;
                        }
                    }
                }
            }
            Op::Call => {
                if req.cols as u64 > wire::MAX_CALL_BODY {
                    let e = StoreError::InvalidArgument { what: format!("a call body of {} bytes", req.cols) };
                    send_error(&mut s, &e).await?;
                    return Err(ConnError::Refused(e.to_string()));
                }
                let mut body = vec![0u8; req.cols as usize];
                s.read_exact(&mut body).await?;
                match call(node, req.rows, &body).await {
                    Ok(reply) => {
                        let mut out = Reply { ok: true, len: reply.len() as u64 }.encode().to_vec();
                        out.extend_from_slice(&reply);
                        s.write_all(&out).await?;
                    }
                    Err(e) => send_error(&mut s, &e).await?,
                }
            }
            Op::Pipe => {
                let taken = match (fds.pop(), fds.is_empty(), &pipe) {
                    (Some(fd), true, None) => PipeReader::new(fd).map_err(|e| e.to_string()),
                    (_, _, Some(_)) => Err("a second pipe for one connection".into()),
                    _ => Err("a pipe request must carry exactly one descriptor".into()),
                };
                match taken {
                    Ok(p) => {
                        pipe = Some(p);
                        s.write_all(&Reply { ok: true, len: 0 }.encode()).await?;
                    }
                    Err(why) => {
                        let e = StoreError::InvalidArgument { what: format!("data plane pipe: {why}") };
                        send_error(&mut s, &e).await?;
                        return Err(ConnError::Refused(e.to_string()));
                    }
                }
            }
            Op::Put | Op::PutSpliced => {
                if req.rows == 0 || req.cols == 0 || req.rows > MAX_BLOCK || req.cols > MAX_BLOCK {
                    let e = StoreError::InvalidArgument { what: format!("{key:?}: a block of {}x{}", req.rows, req.cols) };
                    send_error(&mut s, &e).await?;
                    return Err(ConnError::Refused(e.to_string()));
                }
                let header = BlockHeader { rows: req.rows, cols: req.cols, checksum: req.checksum };
                let answer = match (req.op, &pipe) {
                    (Op::Put, _) => node.put_block_from(action, key, header, &mut s).await?,
                    (_, Some(pipe)) => node.put_block_spliced(action, key, header, pipe).await?,
                    (_, None) => {
                        // Its payload is nowhere this node can read: out of step.
                        let e = StoreError::InvalidArgument { what: format!("{key:?}: a spliced put on a connection without a pipe") };
                        send_error(&mut s, &e).await?;
                        return Err(ConnError::Refused(e.to_string()));
                    }
                };
                match answer {
                    Ok(()) => s.write_all(&Reply { ok: true, len: 0 }.encode()).await?,
                    Err(e) => send_error(&mut s, &e).await?,
                }
            }
        }
    }
}

/// Answers a local get of one block (`req`): its file, and the next
/// block on the connection's line if it peeks one ([`peek`]); then the
/// read hints its `readahead` calls for. `Ok(Err)`: the node's answer is
/// this error, not yet sent.
async fn get_local_one(
    node: &Arc<Node>,
    unix: &UnixConn,
    readahead: &mut Readahead,
    req: &Request,
    action: Option<ActionId>,
    mode: LockMode,
) -> std::io::Result<Result<(), StoreError>> {
    let key = BlockKey { matrix: req.matrix, i: req.i, j: req.j };
    let opened = match open_local(node, action, key.matrix, &[(key.i, key.j)], mode).await {
        Ok(opened) => opened,
        Err(e) => return Ok(Err(e)),
    };
    let (header, file) = &opened.files[0];
    let flags = wire::LocalGetFlags::decode(req.flags);
    let mut entry = wire::LocalEntry { header: *header, cached: opened.cached, stamp: 0 };
    if flags.stamp_wanted {
        entry.stamp = node.block_stamp(file).unwrap_or(0);
    }
    let bytes = header.payload_len() as u64;
    let hints = readahead.after_get(key.matrix, (key.i, key.j), bytes, opened.cold);
    // Only a reader under locks can tell a peeked version from the one it
    // locks (`wire::Peek`), and only one on another CPU reads it beside
    // the node (`wire::LocalGetFlags`).
    let under_lock = action.is_some_and(|a| wire::shape_only(a.0)) && req.op == Op::GetLocal;
    let apart = || flags.client_cpu.is_none_or(|c| store_client::dataplane::current_cpu() != Some(c)) || node.peeks_on_the_readers_cpu();
    let peeked = if under_lock && apart() { peek(node, readahead, key.matrix, bytes).await } else { None };
    send_local(unix, &[entry], &[file.as_fd()], peeked.as_ref()).await?;
    read_ahead(node, key.matrix, hints).await;
    Ok(Ok(()))
}

/// After a local get of one block, once it is answered: starts reading
/// the committed versions of the blocks the connection's `Readahead` calls
/// for (no locks: a hint only), up to the first that is outside the
/// matrix or has none. (Gets of many hint their own files when cold, and
/// reading further ahead of them made cold batches slower: b = 256 0.57,
/// 0.50 of raw against 0.76, 0.69.)
async fn read_ahead(node: &Arc<Node>, matrix: uuid::Uuid, hints: Vec<(u32, u32)>) {
    for (i, j) in hints {
        match node.open_block(None, BlockKey { matrix, i, j }, LockMode::Read).await {
            Ok((_, file)) => node.prefetch_block(&file),
            Err(_) => break,
        }
    }
}

/// The block after a local get of one block on the line its connection
/// reads along, peeked (`wire::Peek`): its committed version's file,
/// opened without a lock, and its shape. `None` when there is no line,
/// the block is larger than peeks are for, or it is outside the matrix or
/// has no version yet.
async fn peek(node: &Arc<Node>, readahead: &Readahead, matrix: uuid::Uuid, bytes: u64) -> Option<(wire::Peek, Arc<std::fs::File>)> {
    if bytes > wire::PEEK_MAX_BYTES {
        return None;
    }
    let (i, j) = readahead.next_on_line(matrix)?;
    let (_, file) = node.open_block(None, BlockKey { matrix, i, j }, LockMode::Read).await.ok()?;
    let (rows, cols) = crate::blocks::block_shape(&node.matrix(Some(matrix), "").ok()?, i, j).ok()?;
    let entry = wire::LocalEntry { header: BlockHeader { rows, cols, checksum: 0 }, cached: node.block_cached(&file), stamp: 0 };
    Some((wire::Peek { i, j, entry }, file))
}

/// An opened block: what the reply names it by, and its version's file.
type Opened = (BlockHeader, Arc<std::fs::File>);

/// A local get's blocks, opened ([`open_local`]).
struct LocalFiles {
    files: Vec<Opened>,
    /// Some were found not cached (and were given the read hint).
    cold: bool,
    /// What the reply marks them (`wire::LocalEntry::cached`).
    cached: bool,
}

/// Opens a local get's blocks: under an action by their shapes
/// ([`open_locked_shapes`], `wire::shape_only`), else with their headers
/// read ([`open_blocks`]), which leaves every file's first page cached.
async fn open_local(
    node: &Arc<Node>,
    action: Option<ActionId>,
    matrix: uuid::Uuid,
    blocks: &[(u32, u32)],
    mode: LockMode,
) -> Result<LocalFiles, StoreError> {
    match action {
        Some(a) if wire::shape_only(a.0) => {
            let (files, cold) = open_locked_shapes(node, a, matrix, blocks, mode).await?;
            Ok(LocalFiles { files, cold, cached: !cold })
        }
        _ => {
            let (files, cold) = open_blocks(node, action, matrix, blocks, mode).await?;
            Ok(LocalFiles { files, cold, cached: true })
        }
    }
}

/// Opens the blocks in order under `action`'s locks; the first that fails
/// fails them all (the locks taken before it stay with the action, as
/// after the same gets one by one). Also says whether they were found not
/// cached (and were given the read hint). Without an action (the committed
/// state, no locks), a batch whose blocks were replaced before their
/// headers were read is opened again: a replaced version's file may
/// already hold another block (`Recheck::AfterReading`). One replaced
/// after its header was read fails its checksum at the reader, which
/// reads again.
async fn open_blocks(
    node: &Arc<Node>,
    action: Option<ActionId>,
    matrix: uuid::Uuid,
    blocks: &[(u32, u32)],
    mode: LockMode,
) -> Result<(Vec<Opened>, bool), StoreError> {
    for _ in 0..crate::blocks::UNLOCKED_READS {
        let mut files = Vec::with_capacity(blocks.len());
        let mut cold = false;
        for &(i, j) in blocks {
            let (version, file) = node.open_block(action, BlockKey { matrix, i, j }, mode).await?;
            let mut cached = None;
            if blocks.len() > 1 {
                cached = node.cached_block_header(&file);
                if cached.is_none() {
                    node.prefetch_block(&file);
                    cold = true;
                }
            }
            files.push((BlockKey { matrix, i, j }, version, file, cached));
        }
        // The headers not cached after all the opens: a header read waits
        // for its file's first page, and by then every file of the batch
        // is being read.
        let headers: Vec<_> = files.iter().map(|(key, _, f, cached)| cached.map_or_else(|| node.block_header(f, *key), Ok)).collect();
        // A moved pointer also explains a header that failed its checks
        // (a file being rewritten): read again before reporting it.
        let mut current = true;
        if action.is_none() {
            for (key, version, _, _) in &files {
                current &= node.is_current(*key, *version)?;
            }
        }
        if current {
            let headers = headers.into_iter().collect::<Result<Vec<_>, _>>()?;
            return Ok((headers.into_iter().zip(files).map(|(h, (_, _, f, _))| (h, f)).collect(), cold));
        }
    }
    Err(StoreError::Corrupt { what: format!("blocks of {matrix}: kept being replaced while read without a lock") })
}

/// [`open_blocks`] under an action's locks, each block named by the shape
/// its matrix gives it, checksum 0 (`wire::shape_only`): no header read and no length checked here, for
/// the client reads each file's header with its payload and checks both.
/// Only a batch's first and last files are probed for the page cache: a
/// block's open costs the node about 3 µs and each probe or header read
/// about 1 more, and the client waits for all of them before it reads the
/// first block. If either is not cached, every file of a batch gets the
/// read hint (a single get's reader starts its own read). A batch cached at
/// both ends but not in the middle is read one file after another, each
/// read starting its own.
async fn open_locked_shapes(
    node: &Arc<Node>,
    action: ActionId,
    matrix: uuid::Uuid,
    blocks: &[(u32, u32)],
    mode: LockMode,
) -> Result<(Vec<Opened>, bool), StoreError> {
    let m = node.matrix(Some(matrix), "")?;
    let hint = blocks.len() > 1;
    let mut files: Vec<Opened> = Vec::with_capacity(blocks.len());
    let mut cold = false;
    for (n, &(i, j)) in blocks.iter().enumerate() {
        let (_, file) = node.open_block(Some(action), BlockKey { matrix, i, j }, mode).await?;
        let (rows, cols) = crate::blocks::block_shape(&m, i, j)?;
        let probed = n == 0 || n == blocks.len() - 1;
        if !cold && probed && !node.block_cached(&file) {
            cold = true;
            if hint {
                // The files before it had none.
                for (_, f) in &files {
                    node.prefetch_block(f);
                }
            }
        }
        if cold && hint {
            node.prefetch_block(&file);
        }
        files.push((BlockHeader { rows, cols, checksum: 0 }, file));
    }
    Ok((files, cold))
}

/// Blocks in one reply of a local get of many while they are cached.
const WARM_GROUP: usize = 16;

/// The size of the next reply of a local get of many
/// (`wire::Op::GetLocalMany`) with `left` blocks to go: up to
/// [`WARM_GROUP`] blocks, so that the client reads a group while the node
/// opens the next; every block left at once once a group was `cold` (not
/// cached), so that all their reads are in flight together.
///
/// A warm block costs the node a few µs to open and lock, about what each
/// further reply costs the client; smaller groups made warm batched gets
/// no faster (`PERFORMANCE.md`).
fn local_group(left: usize, cold: bool) -> usize {
    if cold {
        left
    } else {
        left.min(WARM_GROUP)
    }
}

/// Answers a local get: the blocks' entries (headers, marked `cached` or
/// not), their files' descriptors with them.
async fn send_files(unix: &UnixConn, files: &[Opened], cached: bool) -> std::io::Result<()> {
    let entries: Vec<_> = files.iter().map(|&(header, _)| wire::LocalEntry { header, cached, stamp: 0 }).collect();
    let fds: Vec<_> = files.iter().map(|(_, f)| f.as_fd()).collect();
    send_local(unix, &entries, &fds, None).await
}

/// Sends a local get's reply: the `entries`, then the `peek` if any, with
/// the files' descriptors in the same order.
async fn send_local(
    unix: &UnixConn,
    entries: &[wire::LocalEntry],
    fds: &[std::os::fd::BorrowedFd<'_>],
    peek: Option<&(wire::Peek, Arc<std::fs::File>)>,
) -> std::io::Result<()> {
    let len = entries.len() * HEADER_LEN + peek.map_or(0, |_| wire::PEEK_LEN);
    let mut reply = Reply { ok: true, len: len as u64 }.encode().to_vec();
    for entry in entries {
        reply.extend_from_slice(&entry.encode());
    }
    let mut fds = fds.to_vec();
    if let Some((p, file)) = peek {
        reply.extend_from_slice(&p.encode());
        fds.push(file.as_fd());
    }
    fdpass::send_with_fds(unix, &reply, &fds).await
}

/// Blocks read whole through the node, one after the other (a node whose
/// versions are objects, for a client that does not reach the pool).
async fn get_stored(
    node: &Arc<Node>,
    action: Option<ActionId>,
    matrix: uuid::Uuid,
    blocks: &[(u32, u32)],
    mode: LockMode,
) -> Result<Vec<bytes::Bytes>, StoreError> {
    let mut values = Vec::with_capacity(blocks.len());
    for &(i, j) in blocks {
        values.push(node.get_block(action, BlockKey { matrix, i, j }, mode).await?.1);
    }
    Ok(values)
}

async fn send_stored(s: &mut Stream, values: &[bytes::Bytes]) -> std::io::Result<()> {
    let len: u64 = values.iter().map(|v| v.len() as u64).sum();
    s.write_all(&Reply { ok: true, len }.encode()).await?;
    for v in values {
        s.write_all(v).await?;
    }
    Ok(())
}

/// Answers a get of many over the socket itself: each block's stored form
/// (header, then payload read from its file), one after the other. The
/// payloads' checksums are the reader's to check: a damaged block reaches
/// it as sent, in step, and fails there as `Corrupt`. A file that cannot be
/// read midway leaves the connection out of step: it is dropped.
async fn send_values(s: &mut Stream, files: &[Opened]) -> std::io::Result<()> {
    let len: u64 = files.iter().map(|(h, _)| (HEADER_LEN + h.payload_len()) as u64).sum();
    s.write_all(&Reply { ok: true, len }.encode()).await?;
    // One buffer, read into on the blocking pool (a 32 MiB read must not
    // hold up the runtime) and written from here, block after block.
    let mut buf = Vec::new();
    for (header, file) in files {
        let (file, mut value, len) = (file.clone(), std::mem::take(&mut buf), HEADER_LEN + header.payload_len());
        let read = move || {
            use std::os::unix::fs::FileExt;
            value.resize(len, 0);
            file.read_exact_at(&mut value[HEADER_LEN..], HEADER_LEN as u64).map(|()| value)
        };
        buf = tokio::task::spawn_blocking(read).await.map_err(std::io::Error::other)??;
        buf[..HEADER_LEN].copy_from_slice(&header.encode());
        s.write_all(&buf).await?;
    }
    Ok(())
}

/// How the node answers a cached get: the version's header and stamp,
/// and what to send.
enum CachedAnswer {
    Unchanged(BlockHeader, u64),
    Peer(BlockHeader, u64, String),
    Data(BlockHeader, u64, Arc<std::fs::File>),
}

/// Takes the read lock and finds the version the action sees: the client
/// holds it (no payload), a peer holds it (its address, if the client
/// takes peers), or its file is sent. The directory is told what the
/// client reported about a failed peer first.
async fn cached_get(
    node: &Arc<Node>,
    holders: &std::sync::Mutex<Holders>,
    action: Option<ActionId>,
    key: BlockKey,
    get: &wire::CachedGet,
) -> Result<CachedAnswer, StoreError> {
    if !get.bad.is_empty() {
        let mut h = holders.lock().unwrap_or_else(|p| p.into_inner());
        if get.bad_peer_dead {
            h.forget_peer(&get.bad);
        }
        if get.bad_peer_version {
            h.forget_version(key, &get.bad);
        }
    }
    let (mut opened, _) = open_blocks(node, action, key.matrix, &[(key.i, key.j)], LockMode::Read).await?;
    let (header, file) = opened.pop().expect("one block opened");
    // Under the lock the file holds this version; without one (action 0)
    // the stamp is still what the file held when it was checked current.
    let stamp = node.block_stamp(&file).unwrap_or(0);
    if stamp != 0 && stamp == get.have {
        return Ok(CachedAnswer::Unchanged(header, stamp));
    }
    if get.peers_ok && stamp != 0 {
        let mut holders = holders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(peer) = holders.peer_for(key, stamp, &get.own_addr) {
            return Ok(CachedAnswer::Peer(header, stamp, peer));
        }
        // A holder from now, in the same look: a get of this version right
        // behind this one goes to this reader (which makes it wait for the
        // payload to land) instead of taking the store's link again.
        holders.holds(key, stamp, &get.own_addr);
    }
    Ok(CachedAnswer::Data(header, stamp, file))
}

/// Sends a cached get's answer; the client then holds the version (from
/// here or from the peer named), which the directory records.
async fn send_cached(
    s: &mut Stream,
    holders: &std::sync::Mutex<Holders>,
    key: BlockKey,
    get: &wire::CachedGet,
    answer: CachedAnswer,
) -> std::io::Result<()> {
    use wire::CachedKind;
    let (header, stamp) = match &answer {
        CachedAnswer::Unchanged(h, st) | CachedAnswer::Peer(h, st, _) | CachedAnswer::Data(h, st, _) => (*h, *st),
    };
    holders.lock().unwrap_or_else(|p| p.into_inner()).holds(key, stamp, &get.own_addr);
    match answer {
        CachedAnswer::Unchanged(..) => {
            let head = wire::encode_cached_head(&header, stamp, CachedKind::Unchanged, 0);
            let mut out = Reply { ok: true, len: head.len() as u64 }.encode().to_vec();
            out.extend_from_slice(&head);
            s.write_all(&out).await
        }
        CachedAnswer::Peer(_, _, peer) => {
            let head = wire::encode_cached_head(&header, stamp, CachedKind::Peer, peer.len() as u32);
            let mut out = Reply { ok: true, len: (head.len() + peer.len()) as u64 }.encode().to_vec();
            out.extend_from_slice(&head);
            out.extend_from_slice(peer.as_bytes());
            s.write_all(&out).await
        }
        CachedAnswer::Data(_, _, file) => {
            let len = wire::CACHED_HEAD_LEN + header.payload_len();
            let read = move || {
                use std::os::unix::fs::FileExt;
                let mut value = vec![0u8; len];
                file.read_exact_at(&mut value[wire::CACHED_HEAD_LEN..], HEADER_LEN as u64).map(|()| value)
            };
            let mut value = tokio::task::spawn_blocking(read).await.map_err(std::io::Error::other)??;
            value[..wire::CACHED_HEAD_LEN].copy_from_slice(&wire::encode_cached_head(&header, stamp, CachedKind::Data, 0));
            s.write_all(&Reply { ok: true, len: len as u64 }.encode()).await?;
            s.write_all(&value).await
        }
    }
}

/// Runs a unary call the data plane carries (`Op::Call`) with the gRPC
/// handler's own body; returns the encoded reply.
async fn call(node: &Arc<Node>, method: u32, body: &[u8]) -> Result<Vec<u8>, StoreError> {
    use prost::Message;
    use store_client::proto;
    let bad = |e: prost::DecodeError| StoreError::InvalidArgument { what: format!("a call's request: {e}") };
    let reply = match wire::Method::from_u32(method) {
        Some(wire::Method::Dequeue) => {
            crate::rpc::dequeue(node, proto::DequeueRequest::decode(body).map_err(bad)?).await.map(|r| r.encode_to_vec())
        }
        Some(wire::Method::WriteSmall) => {
            crate::rpc::write_small(node, proto::SmallWrite::decode(body).map_err(bad)?).await.map(|r| r.encode_to_vec())
        }
        Some(wire::Method::Begin) => crate::rpc::begin(node, proto::BeginRequest::decode(body).map_err(bad)?).map(|r| r.encode_to_vec()),
        Some(wire::Method::ReadSmall) => {
            crate::rpc::read_small(node, proto::SmallRef::decode(body).map_err(bad)?).await.map(|r| r.encode_to_vec())
        }
        Some(wire::Method::ReadSmallMany) => {
            crate::rpc::read_small_many(node, proto::SmallRefs::decode(body).map_err(bad)?).await.map(|r| r.encode_to_vec())
        }
        Some(wire::Method::WriteSmallMany) => {
            crate::rpc::write_small_many(node, proto::SmallWrites::decode(body).map_err(bad)?).await.map(|r| r.encode_to_vec())
        }
        Some(wire::Method::Enqueue) => {
            crate::rpc::enqueue(node, proto::EnqueueRequest::decode(body).map_err(bad)?).map(|r| r.encode_to_vec())
        }
        Some(wire::Method::Commit) => {
            crate::rpc::commit(node, proto::ActionRef::decode(body).map_err(bad)?).await.map(|r| r.encode_to_vec())
        }
        None => return Err(StoreError::InvalidArgument { what: format!("unknown data plane method {method}") }),
    };
    reply.map_err(|status| StoreError::from_status(&status))
}

/// Reads a client's hello and answers it with this node's id, which a
/// client on the node's host checks before it trusts the Unix socket.
async fn hello(s: &mut Stream, token: &[u8], node_id: uuid::Uuid) -> Result<(), ConnError> {
    let mut head = [0u8; 8];
    s.read_exact(&mut head).await?;
    let len = match wire::decode_hello_head(&head) {
        Ok(len) => len,
        // A client of another build: say so, in the reply head every
        // version reads, rather than close on it (it would retry for ever).
        Err(wire::WireError::BadVersion(client)) => {
            send_error(s, &StoreError::IncompatibleBuild { client, node: wire::VERSION }).await?;
            return Err(wire::WireError::BadVersion(client).into());
        }
        Err(e) => return Err(e.into()),
    };
    let mut got = vec![0u8; len];
    s.read_exact(&mut got).await?;
    if !token.is_empty() && !wire::tokens_equal(&got, token) {
        let what = if got.is_empty() { "this store node needs the cluster token (--token / STORE_TOKEN)" } else { "wrong cluster token" };
        let e = StoreError::Unauthenticated { what: what.into() };
        send_error(s, &e).await?;
        return Err(ConnError::Refused(e.to_string()));
    }
    let mut answer = Reply { ok: true, len: wire::NODE_ID_LEN }.encode().to_vec();
    answer.extend_from_slice(node_id.as_bytes());
    s.write_all(&answer).await?;
    Ok(())
}

async fn send_error(s: &mut Stream, e: &StoreError) -> std::io::Result<()> {
    let detail = e.to_detail();
    s.write_all(&Reply { ok: false, len: detail.len() as u64 }.encode()).await?;
    s.write_all(&detail).await?;
    s.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The group sizes of a local get of `n` blocks whose groups from
    /// `cold_from` on are cold.
    fn groups(n: usize, cold_from: usize) -> Vec<usize> {
        let (mut sent, mut out) = (0, Vec::new());
        while sent < n {
            let g = local_group(n - sent, out.len() > cold_from);
            out.push(g);
            sent += g;
        }
        out
    }

    #[test]
    fn a_local_get_is_answered_in_groups_of_sixteen_and_the_rest_at_once_when_cold() {
        assert_eq!(groups(16, usize::MAX), vec![16]);
        assert_eq!(groups(1, usize::MAX), vec![1]);
        assert_eq!(groups(64, usize::MAX), vec![16, 16, 16, 16]);
        assert_eq!(groups(40, usize::MAX), vec![16, 16, 8]);
        assert_eq!(groups(64, 0), vec![16, 48], "after a cold first group, the rest at once");
        assert_eq!(groups(64, 1), vec![16, 16, 32]);
        assert!(groups(0, usize::MAX).is_empty());
    }
}
