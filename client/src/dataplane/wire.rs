//! The block data plane's wire format: plain TCP beside the gRPC control
//! plane, so a block crosses the socket once, straight from the node's
//! read buffer into the slave's `Vec<f64>` (gRPC cuts it into messages,
//! HTTP/2 into frames, and each layer copies and wakes tasks: three
//! quarters of the node's CPU under a multiply went there).
//!
//! All integers little endian. A connection opens with a hello and its
//! reply; then any number of request/reply pairs, one at a time.
//!
//! ```text
//! hello   "FTBH" | version u16 | token_len u16 | token
//! request "FTBQ" | op u8 | 0 0 0 | action u64 | matrix [16] | i u32 | j u32
//!                | rows u32 | cols u32 | checksum u32 | flags u32      (56 bytes)
//!         flags: on a local get of one block, [`STAMP_WANTED`] and the
//!         client's CPU ([`LocalGetFlags`]); else 0
//!         put: then rows·cols·8 payload bytes
//!         spliced put: the same request, its payload through the
//!         connection's pipe instead (Unix socket only; see [`super::splice`])
//!         pipe: the read end of the connection's pipe passed with the
//!         request (SCM_RIGHTS); the other fields are zero
//!         call: rows = the method ([`Method`]), cols = the length of the
//!         protobuf request that follows (at most MAX_CALL_BODY); the
//!         other fields are zero
//!         get of many, local get of many: rows = the count n
//!         (1..=MAX_MANY), cols = 1 for write locks (0: read locks), i = j
//!         = 0; then n × (i u32 | j u32), blocks of `matrix`, locked in
//!         that order
//! reply   "FTBR" | status u8 | 0 0 0 | len u64                        (16 bytes)
//!         ok get: len = 32-byte block header + payload (the stored form)
//!         ok local get: len = 32, a block header (a [`LocalEntry`]: it
//!         also says whether the file is cached), and the version file's
//!         descriptor passed with the reply (SCM_RIGHTS; Unix socket only):
//!         the client reads the file's header and payload from it and
//!         checks them against the header sent ([`shape_only`]: under an
//!         action, the header sent gives the shape alone, checksum 0, and
//!         the payload is checked against the file's own header); with
//!         [`STAMP_WANTED`], the entry also carries the version's write
//!         stamp ([`LocalEntry::stamp`]). A local get of one block under
//!         an action may also name a block ahead: then len = 32 + 40, the
//!         entry and a [`Peek`], and a second descriptor, the peeked
//!         block's file
//!         ok get of many: len = Σ (32 + payload), each block's stored
//!         form (header, payload) in request order
//!         ok local get of many: one reply per group of k blocks (the
//!         node's groups, up to all n), each len = k × 32, the group's
//!         headers in request order (shapes under an action, as a local
//!         get's), and its k descriptors passed with it
//!         ok hello: len = 16, the store node's id (random per start;
//!         a client on the node's host checks it against the id the
//!         node gave over gRPC before it trusts the Unix socket), or 0
//!         from a slave serving its cache to peers
//!         ok put / spliced put / pipe: len = 0
//!         ok call: len bytes of the method's protobuf reply
//!         error: len bytes of ErrorDetail (protobuf), see StoreError::to_detail
//!
//! cached get (a slave's block cache, [`CachedGet`]): op 11, one block
//!         under a read lock; the body follows the request:
//!         have u64 | flags u32 | self_len u16 | bad_len u16 | self | bad
//!         (have: the write stamp of the version the client holds, 0 for
//!         none; self: the address the client serves its cache to peers
//!         at; bad: a peer that failed it, [`CachedGet`]'s flags say how)
//!   ok:   len = 40 + extra: the version's stored header with its write
//!         stamp | kind u32 | extra_len u32, then for kind 0 (data) the
//!         payload, kind 1 (unchanged) nothing, kind 2 (peer) the
//!         address of a peer that holds this version
//! peer get (slave to slave, the same hello and token): op 12, matrix,
//!         i, j; body: stamp u64; ok: the version's stored form with its
//!         stamp; `NotFound` when the peer no longer holds it
//! ```
//!
//! Every length is checked against the block limits before anything is
//! allocated, so garbage on the socket is an error, never a huge buffer.

use uuid::Uuid;

use crate::block::{self, BlockHeader, HEADER_LEN};

pub const HELLO_MAGIC: [u8; 4] = *b"FTBH";
pub const REQUEST_MAGIC: [u8; 4] = *b"FTBQ";
pub const REPLY_MAGIC: [u8; 4] = *b"FTBR";
/// 2: calls; 3: gets of many blocks; 4: puts through a pipe; 5: a local
/// get of many answered in groups; 6: local gets under an action answered
/// with shapes ([`shape_only`]); 7: blocks' checksums are XXH3's
/// (`block::checksum`), not CRC-32C; 8: a local get of one block may
/// name the next block's committed version ([`Peek`]) and answer its
/// version's write stamp ([`STAMP_WANTED`]); 9: cached gets and peer gets
/// ([`Op::GetCached`], [`Op::PeerGet`]); 10: a node's hello answer
/// carries its id ([`NODE_ID_LEN`]).
pub const VERSION: u16 = 10;
pub const REQUEST_LEN: usize = 56;
/// The length of a store node's hello answer: its id.
pub const NODE_ID_LEN: u64 = 16;
pub const REPLY_LEN: usize = 16;
/// Longest token a hello may carry.
pub const MAX_TOKEN: usize = 4096;
/// Largest block side either end accepts: a block of 4096² doubles is
/// 128 MiB.
pub const MAX_BLOCK_SIDE: u32 = 4096;
/// Longest error detail a reply may carry.
pub const MAX_ERROR_LEN: u64 = 1 << 20;
/// Longest protobuf body a call's request or reply may carry.
pub const MAX_CALL_BODY: u64 = 64 << 20;
/// Most blocks one local get of many names: their descriptors travel in
/// one message (Linux passes at most 253).
pub const MAX_MANY: u32 = 64;
/// A local get's flag: answer with the write stamp of the version the get
/// locked ([`LocalEntry::stamp`]), so that a client that read a [`Peek`]ed
/// file can tell whether it read that version.
pub const STAMP_WANTED: u32 = 1;

/// The flags of a local get of one block: bit 0 [`STAMP_WANTED`], bits
/// 16..32 the CPU the client sent it from, plus one (0: not known). A node
/// that finds itself on the client's CPU peeks nothing: the client's read
/// of a peeked block could only run after the node's side, not beside it
/// (a kernel that packs a woken thread onto its waker's CPU does that),
/// and the peek's open would be work for nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalGetFlags {
    pub stamp_wanted: bool,
    pub client_cpu: Option<u16>,
}

impl LocalGetFlags {
    pub fn encode(self) -> u32 {
        let cpu = self.client_cpu.map_or(0, |c| c as u32 + 1) & 0xffff;
        (cpu << 16) | self.stamp_wanted as u32
    }

    pub fn decode(flags: u32) -> LocalGetFlags {
        LocalGetFlags { stamp_wanted: flags & STAMP_WANTED != 0, client_cpu: (flags >> 16).checked_sub(1).map(|c| c as u16) }
    }
}
/// Blocks up to this many payload bytes are peeked ([`Peek`]). A larger
/// one takes long enough to read that the round trip of its get is a small
/// part of it (b = 1024: 8 MiB, about 0.6 ms from the page cache).
pub const PEEK_MAX_BYTES: u64 = 2 << 20;

/// Whether a local get by `action` is answered with each block's shape
/// (from its matrix) and checksum 0 rather than the header in its file.
/// Under an action the block is locked, so its version and file cannot
/// change before the client reads them, and the client takes the checksum
/// from the file's header, read in the same `preadv` as the payload: the
/// node then neither reads the header nor checks the file's length. A get
/// of committed versions (action 0) holds no lock: a version replaced after
/// the node opened it may have had its file reused for another block, whose
/// own header and payload agree, so the client checks the payload against
/// the header the node read before it made sure the version was current.
pub fn shape_only(action: u64) -> bool {
    action != 0
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Read under a read lock (or the committed version with action 0).
    Get = 1,
    /// Read under a write lock, to overwrite in place next.
    GetForUpdate = 2,
    /// Write under an overwrite lock; the payload follows the request.
    Put = 3,
    /// `Get`, answered with the version file's descriptor (Unix socket).
    GetLocal = 4,
    /// `GetForUpdate`, answered with the descriptor.
    GetLocalForUpdate = 5,
    /// A unary gRPC method's request and reply, protobuf-encoded.
    Call = 6,
    /// Several `GetLocal`s (or `GetLocalForUpdate`s) of one matrix in one
    /// exchange (Unix socket), answered with their descriptors in groups, in
    /// order, each group as soon as its blocks are open; an error reply
    /// ends the answer (the blocks before it stay locked, as one by one).
    GetLocalMany = 7,
    /// Several `Get`s (or `GetForUpdate`s) of one matrix in one exchange,
    /// answered with their stored forms one after the other.
    GetMany = 8,
    /// Hands the node the read end of this connection's pipe, passed with
    /// the request (Unix socket).
    Pipe = 9,
    /// `Put` whose payload comes through the connection's pipe.
    PutSpliced = 10,
    /// `Get` by a client that caches blocks ([`CachedGet`]): no payload
    /// when it holds the current version, or a peer that holds it.
    GetCached = 11,
    /// A slave's get of a version a peer slave caches (never to a node).
    PeerGet = 12,
    /// On a node whose blocks are objects ([`crate::objects`]): takes the
    /// lock a `Get` (`cols` 0) or `GetForUpdate` (`cols` 1) takes and
    /// answers the version the action sees, for the client to read
    /// itself: [`ObjectVersion`].
    ObjectGet = 13,
    /// On such a node: the client wrote the block's new version as an
    /// object (its id, 16 bytes, follows the request); the node takes the
    /// overwrite lock, checks the object's size against `rows`×`cols` and
    /// makes it the action's tentative state of the block.
    ObjectPut = 14,
}

/// The gRPC methods a data-plane call may name: the control calls a
/// slave makes for its tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Method {
    /// `DequeueRequest` → `DequeueReply`.
    Dequeue = 1,
    /// `SmallWrite` → `Empty`.
    WriteSmall = 2,
    /// `BeginRequest` → `BeginReply`, top-level or nested.
    Begin = 3,
    /// `SmallRef` → `SmallValue`.
    ReadSmall = 4,
    /// `EnqueueRequest` → `Empty`.
    Enqueue = 5,
    /// `ActionRef` → `Empty`: the commit, as the gRPC `Commit` runs it.
    Commit = 6,
    /// `SmallRefs` → `SmallValues`.
    ReadSmallMany = 7,
    /// `SmallWrites` → `Empty`.
    WriteSmallMany = 8,
}

impl Method {
    pub const ALL: [Method; 8] = [
        Method::Dequeue,
        Method::WriteSmall,
        Method::Begin,
        Method::ReadSmall,
        Method::Enqueue,
        Method::Commit,
        Method::ReadSmallMany,
        Method::WriteSmallMany,
    ];

    pub fn from_u32(m: u32) -> Option<Method> {
        Method::ALL.into_iter().find(|&k| k as u32 == m)
    }
}

/// One request. `rows`, `cols` and `checksum` describe a put's payload and
/// are zero for gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub action: u64,
    pub matrix: Uuid,
    pub i: u32,
    pub j: u32,
    pub rows: u32,
    pub cols: u32,
    pub checksum: u32,
    /// A local get of one block's [`LocalGetFlags`]; else 0.
    pub flags: u32,
}

/// Why bytes on the socket are not a message of this protocol.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unknown operation {0}")]
    BadOp(u8),
    #[error("unsupported data plane version {0}")]
    BadVersion(u16),
    #[error("token of {0} bytes is too long")]
    TokenTooLong(usize),
    #[error("reply status {0} is neither ok nor error")]
    BadStatus(u8),
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = self.op as u8;
        b[8..16].copy_from_slice(&self.action.to_le_bytes());
        b[16..32].copy_from_slice(self.matrix.as_bytes());
        for (k, v) in [self.i, self.j, self.rows, self.cols, self.checksum, self.flags].into_iter().enumerate() {
            b[32 + 4 * k..36 + 4 * k].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, WireError> {
        check_magic(&b[0..4], REQUEST_MAGIC)?;
        let op = match b[4] {
            1 => Op::Get,
            2 => Op::GetForUpdate,
            3 => Op::Put,
            4 => Op::GetLocal,
            5 => Op::GetLocalForUpdate,
            6 => Op::Call,
            7 => Op::GetLocalMany,
            8 => Op::GetMany,
            9 => Op::Pipe,
            10 => Op::PutSpliced,
            11 => Op::GetCached,
            12 => Op::PeerGet,
            13 => Op::ObjectGet,
            14 => Op::ObjectPut,
            other => return Err(WireError::BadOp(other)),
        };
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Ok(Request {
            op,
            action: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            matrix: Uuid::from_bytes(b[16..32].try_into().expect("16 bytes")),
            i: u32_at(32),
            j: u32_at(36),
            rows: u32_at(40),
            cols: u32_at(44),
            checksum: u32_at(48),
            flags: u32_at(52),
        })
    }

    /// A call of `method` whose protobuf request is `body_len` bytes.
    pub fn call(method: Method, body_len: u32) -> Request {
        Request { op: Op::Call, action: 0, matrix: Uuid::nil(), i: 0, j: 0, rows: method as u32, cols: body_len, checksum: 0, flags: 0 }
    }

    /// Hands the node a pipe (its read end goes with the request).
    pub fn pipe() -> Request {
        Request { op: Op::Pipe, action: 0, matrix: Uuid::nil(), i: 0, j: 0, rows: 0, cols: 0, checksum: 0, flags: 0 }
    }

    /// A get (`op`: [`Op::GetMany`] or [`Op::GetLocalMany`]) of the
    /// `blocks` of `matrix` (at most [`MAX_MANY`]), with the body that
    /// follows it.
    pub fn get_many(op: Op, action: u64, matrix: Uuid, blocks: &[(u32, u32)], for_update: bool) -> (Request, Vec<u8>) {
        let req = Request { op, action, matrix, i: 0, j: 0, rows: blocks.len() as u32, cols: for_update as u32, checksum: 0, flags: 0 };
        (req, blocks.iter().flat_map(|&(i, j)| i.to_le_bytes().into_iter().chain(j.to_le_bytes())).collect())
    }

    /// A get of one block (`op`: [`Op::Get`], [`Op::GetForUpdate`],
    /// [`Op::GetLocal`] or [`Op::GetLocalForUpdate`]).
    pub fn get(op: Op, action: u64, matrix: Uuid, i: u32, j: u32, flags: u32) -> Request {
        Request { op, action, matrix, i, j, rows: 0, cols: 0, checksum: 0, flags }
    }

    /// Payload bytes that follow a put.
    pub fn payload_len(&self) -> usize {
        self.rows as usize * self.cols as usize * 8
    }
}

/// The answer to an [`Op::ObjectGet`]: the version the action sees and
/// the block's shape, which its object's header must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectVersion {
    pub version: Uuid,
    pub rows: u32,
    pub cols: u32,
}

impl ObjectVersion {
    pub const LEN: usize = 24;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..16].copy_from_slice(self.version.as_bytes());
        b[16..20].copy_from_slice(&self.rows.to_le_bytes());
        b[20..24].copy_from_slice(&self.cols.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; Self::LEN]) -> ObjectVersion {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        ObjectVersion { version: Uuid::from_bytes(b[0..16].try_into().expect("16 bytes")), rows: u32_at(16), cols: u32_at(20) }
    }
}

/// A reply's fixed part: success and the length of what follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub ok: bool,
    pub len: u64,
}

impl Reply {
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&REPLY_MAGIC);
        b[4] = if self.ok { 0 } else { 1 };
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; REPLY_LEN]) -> Result<Reply, WireError> {
        check_magic(&b[0..4], REPLY_MAGIC)?;
        let ok = match b[4] {
            0 => true,
            1 => false,
            s => return Err(WireError::BadStatus(s)),
        };
        Ok(Reply { ok, len: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) })
    }
}

/// The version this process's hellos carry: [`VERSION`], or, to test how
/// a node answers a client of another build, the one the environment
/// variable `FTBAG_SIMULATE_WIRE_VERSION` names.
pub fn own_version() -> u16 {
    static OWN: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| std::env::var("FTBAG_SIMULATE_WIRE_VERSION").ok().and_then(|v| v.parse().ok()).unwrap_or(VERSION))
}

pub fn encode_hello(token: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + token.len());
    b.extend_from_slice(&HELLO_MAGIC);
    b.extend_from_slice(&own_version().to_le_bytes());
    b.extend_from_slice(&(token.len() as u16).to_le_bytes());
    b.extend_from_slice(token);
    b
}

/// What a local get's reply says of one block: the header its file must
/// agree with ([`shape_only`]) and whether the node found the file in the
/// page cache. On the wire, 32 bytes: the header's encoding with `stamp`
/// where a stored header has its write stamp, its byte 24 (reserved in a
/// stored header) 1 when cached. The client reads a cached file's header
/// with the payload's first piece in one read that may not wait, and any
/// other's header alone first, as readahead reads a file from disk
/// fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalEntry {
    pub header: BlockHeader,
    pub cached: bool,
    /// The write stamp in the version file's header, when the get asked
    /// for it ([`STAMP_WANTED`]) and the node read one; else 0.
    pub stamp: u64,
}

/// The byte of a [`LocalEntry`] that marks a cached file.
const CACHED_AT: usize = 24;

impl LocalEntry {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = self.header.encode_stamped(self.stamp);
        b[CACHED_AT] = self.cached as u8;
        b
    }

    /// `None`: not a block header, or a side past [`MAX_BLOCK_SIDE`].
    pub fn decode(b: &[u8]) -> Option<LocalEntry> {
        let header = block::decode_header(b).filter(|h| h.rows <= MAX_BLOCK_SIDE && h.cols <= MAX_BLOCK_SIDE)?;
        Some(LocalEntry { header, cached: b[CACHED_AT] == 1, stamp: block::stamp(b)? })
    }
}

/// A block ahead of a local get of one block, on the line the get's
/// connection has been reading along (`store::readahead`): its committed
/// version's file, opened without a lock, goes with the reply as a second
/// descriptor. When the client then gets that block, it reads the file
/// while the node takes the lock, and keeps what it read only if the
/// version the lock gives it has the write stamp it read (every write
/// stamps its version file with a random, non-zero stamp; a replaced
/// version's file may be reused for another block, and only the stamp
/// tells its writes apart). So the read that waited for the round trip now
/// runs beside it, and what a get returns is still what its lock holds.
/// On the wire, 40 bytes: i u32 | j u32 | the block's [`LocalEntry`]
/// (shape and cached mark).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peek {
    pub i: u32,
    pub j: u32,
    pub entry: LocalEntry,
}

pub const PEEK_LEN: usize = 8 + HEADER_LEN;

impl Peek {
    pub fn encode(&self) -> [u8; PEEK_LEN] {
        let mut b = [0u8; PEEK_LEN];
        b[0..4].copy_from_slice(&self.i.to_le_bytes());
        b[4..8].copy_from_slice(&self.j.to_le_bytes());
        b[8..].copy_from_slice(&self.entry.encode());
        b
    }

    /// `None`: not [`PEEK_LEN`] bytes, or no [`LocalEntry`] in them.
    pub fn decode(b: &[u8]) -> Option<Peek> {
        if b.len() != PEEK_LEN {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Some(Peek { i: u32_at(0), j: u32_at(4), entry: LocalEntry::decode(&b[8..])? })
    }
}

/// The body of a cached get ([`Op::GetCached`]).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CachedGet {
    /// The write stamp of the version the client holds (0: none).
    pub have: u64,
    /// The client takes a peer's address instead of the payload.
    pub peers_ok: bool,
    /// `bad` did not answer (dead, stopped, refused): forget it for every
    /// block.
    pub bad_peer_dead: bool,
    /// `bad` sent this version with a wrong checksum (or did not hold it):
    /// forget it for this version.
    pub bad_peer_version: bool,
    /// Where the client serves its cache to peers (empty: it does not).
    pub own_addr: String,
    /// The peer the flags above are about.
    pub bad: String,
}

/// Longest address a cached get may carry.
pub const MAX_ADDR: usize = 256;

impl CachedGet {
    pub fn encode(&self) -> Vec<u8> {
        let flags = self.peers_ok as u32 | (self.bad_peer_dead as u32) << 1 | (self.bad_peer_version as u32) << 2;
        let mut b = Vec::with_capacity(16 + self.own_addr.len() + self.bad.len());
        b.extend_from_slice(&self.have.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&(self.own_addr.len().min(MAX_ADDR) as u16).to_le_bytes());
        b.extend_from_slice(&(self.bad.len().min(MAX_ADDR) as u16).to_le_bytes());
        b.extend_from_slice(&self.own_addr.as_bytes()[..self.own_addr.len().min(MAX_ADDR)]);
        b.extend_from_slice(&self.bad.as_bytes()[..self.bad.len().min(MAX_ADDR)]);
        b
    }

    /// The fixed part: `have`, the flags and the two lengths to read next
    /// (each checked against [`MAX_ADDR`]).
    pub fn decode_head(b: &[u8; 16]) -> Option<(CachedGet, usize, usize)> {
        let flags = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        let own = u16::from_le_bytes([b[12], b[13]]) as usize;
        let bad = u16::from_le_bytes([b[14], b[15]]) as usize;
        if own > MAX_ADDR || bad > MAX_ADDR {
            return None;
        }
        let get = CachedGet {
            have: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            peers_ok: flags & 1 != 0,
            bad_peer_dead: flags & 2 != 0,
            bad_peer_version: flags & 4 != 0,
            own_addr: String::new(),
            bad: String::new(),
        };
        Some((get, own, bad))
    }
}

/// What a cached get's reply is, after its stored header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum CachedKind {
    /// The payload follows.
    Data = 0,
    /// The client holds this version: nothing follows.
    Unchanged = 1,
    /// A peer's address follows.
    Peer = 2,
}

/// A cached get's reply head: 32 + 8 bytes.
pub const CACHED_HEAD_LEN: usize = HEADER_LEN + 8;

pub fn encode_cached_head(header: &BlockHeader, stamp: u64, kind: CachedKind, extra: u32) -> [u8; CACHED_HEAD_LEN] {
    let mut b = [0u8; CACHED_HEAD_LEN];
    b[..HEADER_LEN].copy_from_slice(&header.encode_stamped(stamp));
    b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&(kind as u32).to_le_bytes());
    b[HEADER_LEN + 4..].copy_from_slice(&extra.to_le_bytes());
    b
}

/// `None`: not a block header, a side past [`MAX_BLOCK_SIDE`], or an
/// unknown kind.
pub fn decode_cached_head(b: &[u8; CACHED_HEAD_LEN]) -> Option<(BlockHeader, u64, CachedKind, u32)> {
    let header = block::decode_header(&b[..HEADER_LEN]).filter(|h| h.rows <= MAX_BLOCK_SIDE && h.cols <= MAX_BLOCK_SIDE)?;
    let stamp = block::stamp(&b[..HEADER_LEN])?;
    let kind = match u32::from_le_bytes(b[HEADER_LEN..HEADER_LEN + 4].try_into().expect("4 bytes")) {
        0 => CachedKind::Data,
        1 => CachedKind::Unchanged,
        2 => CachedKind::Peer,
        _ => return None,
    };
    Some((header, stamp, kind, u32::from_le_bytes(b[HEADER_LEN + 4..].try_into().expect("4 bytes"))))
}

/// The blocks a local get of many names, from its body.
pub fn decode_many(body: &[u8]) -> Vec<(u32, u32)> {
    body.chunks_exact(8)
        .map(|c| (u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")), u32::from_le_bytes(c[4..8].try_into().expect("4 bytes"))))
        .collect()
}

/// Checks a hello's fixed 8 bytes; returns the token length to read next.
pub fn decode_hello_head(b: &[u8; 8]) -> Result<usize, WireError> {
    check_magic(&b[0..4], HELLO_MAGIC)?;
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    let len = u16::from_le_bytes([b[6], b[7]]) as usize;
    if len > MAX_TOKEN {
        return Err(WireError::TokenTooLong(len));
    }
    Ok(len)
}

fn check_magic(got: &[u8], want: [u8; 4]) -> Result<(), WireError> {
    if got == want {
        Ok(())
    } else {
        Err(WireError::BadMagic(got.try_into().expect("4 bytes")))
    }
}

/// Compares tokens in time independent of where they differ.
pub fn tokens_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_entry_keeps_its_header_and_mark_and_refuses_what_is_not_one() {
        for (cached, stamp) in [(false, 0), (true, 0), (false, u64::MAX - 5)] {
            let e = LocalEntry { header: BlockHeader { rows: 3, cols: MAX_BLOCK_SIDE, checksum: 0xdead_beef }, cached, stamp };
            assert_eq!(LocalEntry::decode(&e.encode()), Some(e));
            let p = Peek { i: u32::MAX, j: 17, entry: e };
            assert_eq!(Peek::decode(&p.encode()), Some(p));
            assert_eq!(Peek::decode(&p.encode()[..PEEK_LEN - 1]), None);
        }
        let too_big = LocalEntry { header: BlockHeader { rows: MAX_BLOCK_SIDE + 1, cols: 1, checksum: 0 }, cached: true, stamp: 0 };
        assert_eq!(LocalEntry::decode(&too_big.encode()), None);
        assert_eq!(LocalEntry::decode(&[0u8; HEADER_LEN]), None);
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let r = Request { op: Op::Put, action: 7, matrix: Uuid::new_v4(), i: 3, j: 9, rows: 5, cols: 2, checksum: 0xdead_beef, flags: 0 };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        for f in [
            LocalGetFlags { stamp_wanted: true, client_cpu: None },
            LocalGetFlags { stamp_wanted: false, client_cpu: Some(0) },
            LocalGetFlags { stamp_wanted: true, client_cpu: Some(u16::MAX - 1) },
        ] {
            let r = Request::get(Op::GetLocal, 9, Uuid::new_v4(), 4, 5, f.encode());
            assert_eq!(Request::decode(&r.encode()), Ok(r));
            assert_eq!(LocalGetFlags::decode(r.flags), f);
        }
        assert_eq!(LocalGetFlags::decode(0), LocalGetFlags::default());
        for m in Method::ALL {
            assert_eq!(Method::from_u32(m as u32), Some(m));
        }
        assert_eq!(Method::from_u32(0), None);
        let r = Request::call(Method::Commit, u32::MAX - 3);
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        for reply in [Reply { ok: true, len: 1 << 33 }, Reply { ok: false, len: 12 }] {
            assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        }
        let blocks = [(0, 1), (7, u32::MAX), (3, 3)];
        let (r, body) = Request::get_many(Op::GetLocalMany, 5, Uuid::new_v4(), &blocks, true);
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        assert_eq!((r.rows, r.cols, body.len()), (3, 1, 24));
        assert_eq!(decode_many(&body), blocks);
        let h = encode_hello(b"secret");
        assert_eq!(decode_hello_head(h[..8].try_into().unwrap()), Ok(6));
    }

    #[test]
    fn cached_gets_round_trip() {
        let g = CachedGet {
            have: u64::MAX - 1,
            peers_ok: true,
            bad_peer_dead: false,
            bad_peer_version: true,
            own_addr: "10.0.0.1:5".into(),
            bad: "x:1".into(),
        };
        let b = g.encode();
        let (mut got, own, bad) = CachedGet::decode_head(b[..16].try_into().unwrap()).unwrap();
        got.own_addr = String::from_utf8(b[16..16 + own].to_vec()).unwrap();
        got.bad = String::from_utf8(b[16 + own..16 + own + bad].to_vec()).unwrap();
        assert_eq!(got, g);
        let h = BlockHeader { rows: 4, cols: 5, checksum: 77 };
        for kind in [CachedKind::Data, CachedKind::Unchanged, CachedKind::Peer] {
            assert_eq!(decode_cached_head(&encode_cached_head(&h, 99, kind, 12)), Some((h, 99, kind, 12)));
        }
        let mut bad = encode_cached_head(&h, 99, CachedKind::Data, 0);
        bad[HEADER_LEN] = 3;
        assert_eq!(decode_cached_head(&bad), None);
    }

    #[test]
    fn object_ops_and_answers_round_trip() {
        for op in [Op::ObjectGet, Op::ObjectPut] {
            let req = Request { op, action: 7, matrix: Uuid::new_v4(), i: 3, j: 4, rows: 5, cols: 6, checksum: 9, flags: 0 };
            assert_eq!(Request::decode(&req.encode()), Ok(req));
        }
        let at = ObjectVersion { version: Uuid::new_v4(), rows: 4096, cols: 17 };
        assert_eq!(ObjectVersion::decode(&at.encode()), at);
    }

    #[test]
    fn garbage_is_refused_before_any_allocation() {
        let mut b = Request::get(Op::Get, 1, Uuid::nil(), 0, 0, 0).encode();
        b[4] = 15;
        assert_eq!(Request::decode(&b), Err(WireError::BadOp(15)));
        b[4] = 0;
        assert_eq!(Request::decode(&b), Err(WireError::BadOp(0)));
        b[0] = b'X';
        assert!(matches!(Request::decode(&b), Err(WireError::BadMagic(_))));
        let mut r = Reply { ok: true, len: 0 }.encode();
        r[4] = 2;
        assert_eq!(Reply::decode(&r), Err(WireError::BadStatus(2)));
        let mut h = encode_hello(b"");
        h[4..6].copy_from_slice(&(VERSION + 1).to_le_bytes());
        assert_eq!(decode_hello_head(h[..8].try_into().unwrap()), Err(WireError::BadVersion(VERSION + 1)));
        let mut h = encode_hello(b"");
        h[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(decode_hello_head(h[..8].try_into().unwrap()), Err(WireError::TokenTooLong(65535)));
        assert!(tokens_equal(b"abc", b"abc") && !tokens_equal(b"abc", b"abd") && !tokens_equal(b"ab", b"abc"));
    }
}
