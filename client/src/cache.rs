//! A slave's block cache (DESIGN §6, caching; `003…` §3.5, §5.3): block
//! versions it read, kept in memory up to a bound in bytes and dropped
//! least recently used first. A version is immutable and named by the
//! write stamp the node gives each write (a recycled version file gets a
//! new one), so a cached copy is never stale: a read under a lock asks the
//! node which version the lock gives, and moves no payload when this cache
//! holds it (`wire::Op::GetCached`). The cache also serves its versions to
//! peer slaves ([`serve_peers`]) and counts where the bytes of its reads
//! came from ([`ReadBytes`]).
//!
//! Nothing here is a source of truth: an entry can vanish at any moment
//! (eviction, a crash) and every read still has the node to fall back on.
//! Every copy handed out is checked against the checksum in the header the
//! node sent under the reader's lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::block::{self, BlockHeader, HEADER_LEN};
use crate::dataplane::wire::{self, Op, Reply, Request, REQUEST_LEN};
use crate::dataplane::{DataPlane, Target};
use crate::StoreError;

mod inflight;

use inflight::{Flight, InFlight};

/// A version arriving ([`BlockCache::arriving`]).
pub(crate) type Arrival<'a> = Flight<'a, (BlockKey, u64)>;

/// A block: matrix, row, column.
pub type BlockKey = (Uuid, u32, u32);

/// How long a peer's connection may take to say hello (its TLS handshake
/// first, where there is one).
const PEER_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer that did not answer is not asked again.
const DEAD_PEER_FOR: Duration = Duration::from_secs(60);

/// Bytes of block payload a process read, by where they came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadBytes {
    /// Sent by the store node.
    pub store: u64,
    /// Sent by peer slaves.
    pub peers: u64,
    /// Found in this process's cache (the node sent only a header).
    pub cache: u64,
}

impl ReadBytes {
    /// What was read between `earlier` and `self`.
    pub fn since(&self, earlier: &ReadBytes) -> ReadBytes {
        ReadBytes {
            store: self.store.saturating_sub(earlier.store),
            peers: self.peers.saturating_sub(earlier.peers),
            cache: self.cache.saturating_sub(earlier.cache),
        }
    }
}

/// Crash tests of slave-to-slave transfer: what a peer does to the first
/// version it serves (`slave --peer-hook`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerHook {
    #[default]
    None,
    /// Flips one payload byte of every version it serves (the header, and
    /// so the checksum, stay the node's).
    Corrupt,
    /// SIGKILLs itself halfway through its first payload.
    KillMidTransfer,
    /// SIGSTOPs itself halfway through its first payload.
    StopMidTransfer,
}

impl std::str::FromStr for PeerHook {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(PeerHook::None),
            "corrupt" => Ok(PeerHook::Corrupt),
            "kill-mid-transfer" => Ok(PeerHook::KillMidTransfer),
            "stop-mid-transfer" => Ok(PeerHook::StopMidTransfer),
            other => Err(format!("unknown peer hook {other:?} (none, corrupt, kill-mid-transfer, stop-mid-transfer)")),
        }
    }
}

struct Entry {
    stamp: u64,
    header: BlockHeader,
    data: Arc<Vec<f64>>,
    tick: u64,
}

#[derive(Default)]
struct Lru {
    map: HashMap<BlockKey, Entry>,
    order: BTreeMap<u64, BlockKey>,
    tick: u64,
    bytes: usize,
}

impl Lru {
    fn remove(&mut self, key: &BlockKey) {
        if let Some(e) = self.map.remove(key) {
            self.order.remove(&e.tick);
            self.bytes -= e.data.len() * 8;
        }
    }

    fn touch(&mut self, key: &BlockKey) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.map.get_mut(key) {
            self.order.remove(&e.tick);
            e.tick = tick;
            self.order.insert(tick, *key);
        }
    }
}

/// Peers this process will not ask: dead ones for a while, and versions
/// a peer sent damaged for good.
#[derive(Default)]
struct Distrust {
    dead: HashMap<String, Instant>,
    versions: HashSet<(String, BlockKey, u64)>,
}

/// See the module's documentation. Shared by a slave's tasks, its
/// prefetches and its peer server.
pub struct BlockCache {
    capacity: usize,
    lru: Mutex<Lru>,
    store: AtomicU64,
    peers: AtomicU64,
    cached: AtomicU64,
    /// Where this process serves peers; empty: it does not.
    own_addr: Mutex<String>,
    /// Whether reads may come from peers.
    fetch_from_peers: bool,
    peer_timeout: Duration,
    token: String,
    distrust: Mutex<Distrust>,
    peer_planes: Mutex<HashMap<String, Arc<DataPlane>>>,
    /// TLS to peers, where the node uses it: the cluster's CA, each peer
    /// named by its address ([`BlockCache::with_peer_tls`]).
    peer_tls: Option<crate::tls::ClientTls>,
    /// Versions this process is reading now, from the node or a peer. The
    /// node names a reader as a holder the moment it sends or refers it a
    /// version, so a peer may ask for one before it has landed here: the
    /// peer's get waits for it rather than fall back to the node, which
    /// would send the store's link the same block again.
    arriving: InFlight<(BlockKey, u64)>,
}

impl BlockCache {
    /// A cache of at most `capacity` bytes of payload; `peer_timeout`
    /// bounds a read from a peer (connection included), after which the
    /// read goes to the node.
    pub fn new(capacity: usize, fetch_from_peers: bool, peer_timeout: Duration, token: Option<&str>) -> BlockCache {
        BlockCache {
            capacity,
            lru: Mutex::default(),
            store: AtomicU64::new(0),
            peers: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            own_addr: Mutex::default(),
            fetch_from_peers,
            peer_timeout,
            token: token.unwrap_or("").to_owned(),
            distrust: Mutex::default(),
            peer_planes: Mutex::default(),
            peer_tls: None,
            arriving: InFlight::default(),
        }
    }

    /// Reads from peers over TLS, trusting `tls`'s CA for their
    /// certificates (each must name the address it serves on); peers then
    /// serve over TLS too ([`BlockCache::serve_peers`] with an acceptor).
    pub fn with_peer_tls(mut self, tls: Option<crate::tls::ClientTls>) -> BlockCache {
        self.peer_tls = tls;
        self
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Payload bytes the cache holds now.
    pub fn bytes(&self) -> usize {
        self.lru().bytes
    }

    /// Where this process's bytes came from since it started.
    pub fn read_bytes(&self) -> ReadBytes {
        ReadBytes {
            store: self.store.load(Ordering::Relaxed),
            peers: self.peers.load(Ordering::Relaxed),
            cache: self.cached.load(Ordering::Relaxed),
        }
    }

    fn lru(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stamp of the version held for `key`; 0 for none.
    pub(crate) fn stamp_of(&self, key: &BlockKey) -> u64 {
        self.lru().map.get(key).map_or(0, |e| e.stamp)
    }

    /// The version `stamp` of `key`, if held (and marked used).
    pub(crate) fn get(&self, key: &BlockKey, stamp: u64) -> Option<(BlockHeader, Arc<Vec<f64>>)> {
        let mut lru = self.lru();
        let found = lru.map.get(key).filter(|e| e.stamp == stamp).map(|e| (e.header, e.data.clone()))?;
        lru.touch(key);
        Some(found)
    }

    /// Marks version `stamp` of `key` as arriving until the returned
    /// guard is dropped (after [`BlockCache::insert`], or on failure).
    pub(crate) fn arriving(&self, key: BlockKey, stamp: u64) -> Arrival<'_> {
        self.arriving.begin((key, stamp))
    }

    /// Version `stamp` of `key`, waiting up to `patience` for it if it is
    /// arriving now; `None` if it is neither held nor arriving, or did not
    /// land in time.
    pub(crate) async fn get_or_await(&self, key: &BlockKey, stamp: u64, patience: Duration) -> Option<(BlockHeader, Arc<Vec<f64>>)> {
        if let Some(found) = self.get(key, stamp) {
            return Some(found);
        }
        if !self.arriving.wait_while(&(*key, stamp), tokio::time::Instant::now() + patience).await {
            return None;
        }
        self.get(key, stamp)
    }

    pub(crate) fn remove(&self, key: &BlockKey) {
        self.lru().remove(key);
    }

    /// Keeps version `stamp` of `key` (0: not a version the node named:
    /// not kept), dropping the least recently used entries to make room.
    pub(crate) fn insert(&self, key: BlockKey, stamp: u64, header: BlockHeader, data: &[f64]) {
        let bytes = data.len() * 8;
        if stamp == 0 || bytes > self.capacity {
            return;
        }
        let mut lru = self.lru();
        lru.remove(&key);
        while lru.bytes + bytes > self.capacity {
            let Some((_, oldest)) = lru.order.pop_first() else { break };
            if let Some(e) = lru.map.remove(&oldest) {
                lru.bytes -= e.data.len() * 8;
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.order.insert(tick, key);
        lru.map.insert(key, Entry { stamp, header, data: Arc::new(data.to_vec()), tick });
        lru.bytes += bytes;
    }

    pub(crate) fn count_store(&self, bytes: usize) {
        self.store.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_peer(&self, bytes: usize) {
        self.peers.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_cache(&self, bytes: usize) {
        self.cached.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn own_addr(&self) -> String {
        self.own_addr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a read may take a peer's address instead of the payload.
    pub(crate) fn peers_ok(&self) -> bool {
        self.fetch_from_peers
    }

    pub(crate) fn peer_timeout(&self) -> Duration {
        self.peer_timeout
    }

    pub(crate) fn distrusted(&self, peer: &str, key: &BlockKey, stamp: u64) -> bool {
        let mut d = self.distrust.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&until) = d.dead.get(peer) {
            if Instant::now() < until {
                return true;
            }
            d.dead.remove(peer);
        }
        d.versions.contains(&(peer.to_owned(), *key, stamp))
    }

    pub(crate) fn distrust_peer(&self, peer: &str) {
        self.distrust.lock().unwrap_or_else(|p| p.into_inner()).dead.insert(peer.to_owned(), Instant::now() + DEAD_PEER_FOR);
        self.peer_planes.lock().unwrap_or_else(|p| p.into_inner()).remove(peer);
    }

    pub(crate) fn distrust_version(&self, peer: &str, key: &BlockKey, stamp: u64) {
        self.distrust.lock().unwrap_or_else(|p| p.into_inner()).versions.insert((peer.to_owned(), *key, stamp));
    }

    /// Whether `peer`'s version `stamp` of `key` is not trusted (a test's
    /// view of [`BlockCache::distrust_version`]).
    pub fn distrusts(&self, peer: &str, key: BlockKey, stamp: u64) -> bool {
        self.distrusted(peer, &key, stamp)
    }

    /// Connections to `peer`, opened (hello and token) if there are none.
    pub(crate) async fn peer_plane(&self, peer: &str) -> Result<Arc<DataPlane>, StoreError> {
        if let Some(p) = self.peer_planes.lock().unwrap_or_else(|p| p.into_inner()).get(peer) {
            return Ok(p.clone());
        }
        let addr: std::net::SocketAddr =
            peer.parse().map_err(|_| StoreError::InvalidArgument { what: format!("peer address {peer:?}") })?;
        let tls = match &self.peer_tls {
            Some(tls) => Some((tls.connector(), crate::tls::ClientTls::server_name(&addr.ip().to_string())?)),
            None => None,
        };
        let plane = Arc::new(DataPlane::connect(Target::Tcp(addr), Some(&self.token), tls, None).await?);
        self.peer_planes.lock().unwrap_or_else(|p| p.into_inner()).insert(peer.to_owned(), plane.clone());
        Ok(plane)
    }

    /// Starts serving this cache's versions to peers on `listener`, whose
    /// address (as peers reach it) is `addr`, over TLS with `tls`; from now
    /// on reads tell the node so, and it may refer other slaves here.
    pub fn serve_peers(
        self: &Arc<Self>,
        listener: TcpListener,
        addr: String,
        tls: Option<tokio_rustls::TlsAcceptor>,
        hook: PeerHook,
    ) -> tokio::task::JoinHandle<()> {
        *self.own_addr.lock().unwrap_or_else(|p| p.into_inner()) = addr;
        let cache = self.clone();
        tokio::spawn(async move {
            let token: Arc<[u8]> = cache.token.as_bytes().into();
            let served = Arc::new(AtomicU64::new(0));
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let _ = s.set_nodelay(true);
                crate::dataplane::size_buffers(&s);
                let (cache, token, served, tls) = (cache.clone(), token.clone(), served.clone(), tls.clone());
                tokio::spawn(async move {
                    let s: crate::dataplane::Stream = match tls {
                        Some(tls) => match tokio::time::timeout(PEER_HELLO_TIMEOUT, tls.accept(s)).await {
                            Ok(Ok(s)) => Box::new(s),
                            Ok(Err(e)) => return tracing::debug!("a peer's TLS handshake failed: {e}"),
                            Err(_) => return tracing::debug!("a peer's TLS handshake did not end in time"),
                        },
                        None => Box::new(s),
                    };
                    if let Err(e) = serve_peer(s, &cache, &token, hook, &served).await {
                        tracing::debug!("peer connection closed: {e}");
                    }
                });
            }
        })
    }
}

/// One peer's connection: a hello with the cluster's token, then peer
/// gets, one at a time.
async fn serve_peer(
    mut s: crate::dataplane::Stream,
    cache: &BlockCache,
    token: &[u8],
    hook: PeerHook,
    served: &AtomicU64,
) -> std::io::Result<()> {
    let send_error = |e: StoreError| {
        let detail = e.to_detail();
        let mut out = Reply { ok: false, len: detail.len() as u64 }.encode().to_vec();
        out.extend_from_slice(&detail);
        out
    };
    let mut head = [0u8; 8];
    tokio::time::timeout(PEER_HELLO_TIMEOUT, s.read_exact(&mut head)).await.map_err(std::io::Error::other)??;
    let len = wire::decode_hello_head(&head).map_err(std::io::Error::other)?;
    let mut got = vec![0u8; len];
    s.read_exact(&mut got).await?;
    if !token.is_empty() && !wire::tokens_equal(&got, token) {
        s.write_all(&send_error(StoreError::Unauthenticated { what: "wrong cluster token".into() })).await?;
        return Err(std::io::Error::other("a peer with a wrong token"));
    }
    s.write_all(&Reply { ok: true, len: 0 }.encode()).await?;
    loop {
        let mut head = [0u8; REQUEST_LEN];
        match s.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let req = Request::decode(&head).map_err(std::io::Error::other)?;
        if req.op != Op::PeerGet {
            s.write_all(&send_error(StoreError::InvalidArgument { what: "a slave serves only peer gets".into() })).await?;
            return Err(std::io::Error::other("not a peer get"));
        }
        let mut stamp = [0u8; 8];
        s.read_exact(&mut stamp).await?;
        let stamp = u64::from_le_bytes(stamp);
        let key = (req.matrix, req.i, req.j);
        // Half the peer timeout, so that an asker gets "not held" and takes
        // the block from the node before it gives this peer up as dead.
        let Some((header, data)) = cache.get_or_await(&key, stamp, cache.peer_timeout() / 2).await else {
            let e = StoreError::NotFound { what: format!("block ({}, {}) of {}: version not held by this peer", req.i, req.j, req.matrix) };
            s.write_all(&send_error(e)).await?;
            continue;
        };
        let payload: &[u8] = bytemuck::cast_slice(&data);
        let mut out = Reply { ok: true, len: (HEADER_LEN + payload.len()) as u64 }.encode().to_vec();
        out.extend_from_slice(&header.encode_stamped(stamp));
        let first = served.fetch_add(1, Ordering::SeqCst) == 0;
        match hook {
            PeerHook::Corrupt => {
                let mut bad = payload.to_vec();
                bad[payload.len() / 2] ^= 0x40;
                s.write_all(&out).await?;
                s.write_all(&bad).await?;
            }
            PeerHook::KillMidTransfer | PeerHook::StopMidTransfer if first => {
                s.write_all(&out).await?;
                s.write_all(&payload[..payload.len() / 2]).await?;
                s.flush().await?;
                let signal = if hook == PeerHook::KillMidTransfer { libc::SIGKILL } else { libc::SIGSTOP };
                tracing::warn!("peer hook: signal {signal} to this slave halfway through a transfer");
                // SAFETY: raise has no preconditions.
                unsafe { libc::raise(signal) };
                s.write_all(&payload[payload.len() / 2..]).await?;
            }
            _ => {
                s.write_all(&out).await?;
                s.write_all(payload).await?;
            }
        }
        s.flush().await?;
    }
}

/// Checks a payload against the header the node sent under the reader's
/// lock.
pub(crate) fn matches_node(node: &BlockHeader, payload: &[f64]) -> bool {
    payload.len() == node.rows as usize * node.cols as usize && block::checksum_matches(node, bytemuck::cast_slice(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> BlockKey {
        (Uuid::nil(), i, 0)
    }

    fn header(n: usize) -> BlockHeader {
        BlockHeader { rows: n as u32, cols: 1, checksum: 0 }
    }

    #[test]
    fn the_cache_keeps_its_bound_and_drops_the_least_recently_used() {
        let cache = BlockCache::new(3 * 800, false, Duration::from_secs(1), None);
        for i in 0..3 {
            cache.insert(key(i), 10 + i as u64, header(100), &[i as f64; 100]);
        }
        assert_eq!(cache.bytes(), 2400);
        assert!(cache.get(&key(0), 10).is_some(), "0 is now the most recently used");
        cache.insert(key(3), 13, header(100), &[3.0; 100]);
        assert!(cache.bytes() <= cache.capacity());
        assert!(cache.get(&key(1), 11).is_none(), "1 was the least recently used");
        assert!(cache.get(&key(0), 10).is_some() && cache.get(&key(2), 12).is_some() && cache.get(&key(3), 13).is_some());
        assert!(cache.get(&key(0), 99).is_none(), "another version of a held block is not held");
        cache.insert(key(0), 20, header(100), &[9.0; 100]);
        assert_eq!(cache.stamp_of(&key(0)), 20, "a newer version replaces the older");
        assert!(cache.get(&key(0), 10).is_none());
        cache.insert(key(9), 0, header(10), &[0.0; 10]);
        assert_eq!(cache.stamp_of(&key(9)), 0, "an unstamped version is not kept");
        cache.insert(key(8), 5, header(400), &[0.0; 400]);
        assert_eq!(cache.stamp_of(&key(8)), 0, "a block larger than the cache is not kept");
        assert!(cache.bytes() <= cache.capacity());
    }

    #[tokio::test]
    async fn a_version_being_read_is_awaited_and_one_not_being_read_is_not() {
        let cache = Arc::new(BlockCache::new(1 << 20, true, Duration::from_secs(1), None));
        let patience = Duration::from_secs(5);
        assert!(cache.get_or_await(&key(1), 7, patience).await.is_none(), "neither held nor arriving: at once");

        // Lands while a peer's get waits for it.
        let arrival = cache.arriving(key(1), 7);
        let waiter = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get_or_await(&key(1), 7, patience).await.map(|(_, d)| d[0]) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the version has not landed yet");
        cache.insert(key(1), 7, header(10), &[4.5; 10]);
        drop(arrival);
        assert_eq!(waiter.await.unwrap(), Some(4.5));

        // A read that fails wakes the waiter, which finds nothing.
        let arrival = cache.arriving(key(2), 3);
        let waiter = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get_or_await(&key(2), 3, patience).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(arrival);
        assert!(!waiter.await.unwrap());
        assert!(cache.arriving.is_empty(), "every arrival ended");

        // One that does not land within the patience is given up.
        let _slow = cache.arriving(key(3), 1);
        let started = Instant::now();
        assert!(cache.get_or_await(&key(3), 1, Duration::from_millis(50)).await.is_none());
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn distrust_is_per_version_or_per_dead_peer() {
        let cache = BlockCache::new(1000, true, Duration::from_secs(1), None);
        cache.distrust_version("a:1", &key(1), 5);
        assert!(cache.distrusted("a:1", &key(1), 5));
        assert!(!cache.distrusted("a:1", &key(1), 6) && !cache.distrusted("a:1", &key(2), 5));
        cache.distrust_peer("b:1");
        assert!(cache.distrusted("b:1", &key(7), 1));
    }
}
