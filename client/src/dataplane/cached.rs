//! Gets of a client with a block cache ([`crate::cache`]) over TCP: a
//! cached get names the version the client holds, and the node answers
//! with the version its lock gives: "unchanged" (no payload), a peer that
//! holds it, or the payload. A peer that fails (no answer within the
//! cache's timeout, a refused connection, bytes that fail the checksum
//! the node sent, a version it no longer holds) is reported to the node
//! in the next get, which then takes no peer, so the payload comes from
//! the node: a read costs at most one peer timeout more than without peers.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use super::wire::{self, CachedKind, Op, Request};
use super::{DataPlane, Stream};
use crate::block::{BlockHeader, HEADER_LEN};
use crate::cache::{matches_node, BlockCache, BlockKey};
use crate::client::BlockData;
use crate::StoreError;

type Result<T> = std::result::Result<T, StoreError>;

/// A cached get's answer.
enum Answer<'a> {
    Unchanged(BlockHeader, u64),
    Peer(BlockHeader, u64, String),
    /// With the version marked arriving until it is kept.
    Data(BlockHeader, u64, Vec<f64>, crate::cache::Arrival<'a>),
}

/// How a peer failed.
enum PeerFailure {
    /// No answer, or no connection: forget it for every block.
    Dead,
    /// It does not hold the version, or sent it damaged.
    Version,
}

impl DataPlane {
    /// Reads block `(i, j)` of `matrix` under a read lock of `action`
    /// through `cache` (see the module's documentation).
    pub(crate) async fn get_cached(&self, cache: &BlockCache, action: u64, matrix: Uuid, i: u32, j: u32) -> Result<BlockData> {
        let key: BlockKey = (matrix, i, j);
        let mut get = wire::CachedGet {
            have: cache.stamp_of(&key),
            peers_ok: cache.peers_ok(),
            own_addr: cache.own_addr(),
            ..wire::CachedGet::default()
        };
        // Unchanged but evicted meanwhile, then a failed peer, then the node.
        for _ in 0..4 {
            let mut s = self.checkout().await?;
            let answer = self.cached_get_on(&mut s, cache, action, key, &get).await?;
            self.give_back(s);
            match answer? {
                Answer::Data(header, stamp, data, _arrival) => {
                    cache.count_store(data.len() * 8);
                    cache.insert(key, stamp, header, &data);
                    return Ok(BlockData { rows: header.rows as usize, cols: header.cols as usize, data });
                }
                Answer::Unchanged(header, stamp) => {
                    match cache.get(&key, stamp) {
                        Some((_, data)) if matches_node(&header, &data) => {
                            cache.count_cache(data.len() * 8);
                            return Ok(BlockData { rows: header.rows as usize, cols: header.cols as usize, data: data.to_vec() });
                        }
                        _ => cache.remove(&key),
                    }
                    get.have = 0;
                    continue;
                }
                Answer::Peer(_, 0, _) => {
                    // The node refers to peers only for stamped versions.
                    get.peers_ok = false;
                    continue;
                }
                Answer::Peer(header, stamp, peer) => {
                    let failure = if cache.distrusted(&peer, &key, stamp) {
                        Some(PeerFailure::Version)
                    } else {
                        let _arrival = cache.arriving(key, stamp);
                        match tokio::time::timeout(cache.peer_timeout(), peer_get(cache, &peer, key, stamp, &header)).await {
                            Ok(Ok(data)) => {
                                cache.count_peer(data.len() * 8);
                                cache.insert(key, stamp, header, &data);
                                return Ok(BlockData { rows: header.rows as usize, cols: header.cols as usize, data });
                            }
                            Ok(Err(e @ (StoreError::Corrupt { .. } | StoreError::NotFound { .. }))) => {
                                tracing::debug!(%peer, "peer get failed ({e}); the block comes from the node");
                                if matches!(e, StoreError::Corrupt { .. }) {
                                    tracing::warn!(%peer, "a peer sent block ({i}, {j}) of {matrix} damaged; not trusted for that version again");
                                    cache.distrust_version(&peer, &key, stamp);
                                }
                                Some(PeerFailure::Version)
                            }
                            Ok(Err(e)) => {
                                tracing::info!(%peer, "peer failed ({e}); not asked again for a while");
                                cache.distrust_peer(&peer);
                                Some(PeerFailure::Dead)
                            }
                            Err(_) => {
                                tracing::info!(%peer, "peer did not answer within {:?}; not asked again for a while", cache.peer_timeout());
                                cache.distrust_peer(&peer);
                                Some(PeerFailure::Dead)
                            }
                        }
                    };
                    get.peers_ok = false;
                    get.bad_peer_dead = matches!(failure, Some(PeerFailure::Dead));
                    get.bad_peer_version = matches!(failure, Some(PeerFailure::Version));
                    get.bad = peer;
                }
            }
        }
        Err(self.unavailable(format!("block ({i}, {j}) of {matrix}: a cached get did not settle")))
    }

    /// One cached get. `Err`: the connection is out of step; `Ok`: the
    /// node's answer.
    async fn cached_get_on<'c>(
        &self,
        s: &mut Stream,
        cache: &'c BlockCache,
        action: u64,
        key: BlockKey,
        get: &wire::CachedGet,
    ) -> Result<Result<Answer<'c>>> {
        let (matrix, i, j) = key;
        let what = || format!("block ({i}, {j}) of {matrix}");
        let send = |e: std::io::Error| self.unavailable(format!("sending a get: {e}"));
        let mut out = Request::get(Op::GetCached, action, matrix, i, j, 0).encode().to_vec();
        out.extend_from_slice(&get.encode());
        s.write_all(&out).await.map_err(send)?;
        s.flush().await.map_err(send)?;
        let len = match self.read_reply(s).await? {
            Ok(len) => len,
            Err(e) => return Ok(Err(e)),
        };
        let read = |e: std::io::Error| self.unavailable(format!("reading {}: {e}", what()));
        let mut head = [0u8; wire::CACHED_HEAD_LEN];
        if len < head.len() as u64 {
            return Err(self.unavailable(format!("{}: a cached get answered with {len} bytes", what())));
        }
        s.read_exact(&mut head).await.map_err(read)?;
        let Some((header, stamp, kind, extra)) = wire::decode_cached_head(&head) else {
            return Err(self.unavailable(format!("{}: a cached get answered with a bad head", what())));
        };
        let rest = len - head.len() as u64;
        match kind {
            CachedKind::Unchanged if rest == 0 => Ok(Ok(Answer::Unchanged(header, stamp))),
            CachedKind::Peer if rest == extra as u64 && extra as usize <= wire::MAX_ADDR => {
                let mut addr = vec![0u8; extra as usize];
                s.read_exact(&mut addr).await.map_err(read)?;
                Ok(Ok(Answer::Peer(header, stamp, String::from_utf8_lossy(&addr).into_owned())))
            }
            CachedKind::Data if rest == header.payload_len() as u64 => {
                // The node counts this process a holder from now on.
                let arrival = cache.arriving(key, stamp);
                let mut data = vec![0f64; header.rows as usize * header.cols as usize];
                s.read_exact(bytemuck::cast_slice_mut(&mut data)).await.map_err(read)?;
                // In step either way: a damaged payload is the block's fault.
                if !matches_node(&header, &data) {
                    return Ok(Err(StoreError::Corrupt { what: format!("{}: checksum mismatch after transfer", what()) }));
                }
                Ok(Ok(Answer::Data(header, stamp, data, arrival)))
            }
            _ => Err(self.unavailable(format!("{}: a cached get answered {kind:?} with {rest} bytes more", what()))),
        }
    }

    /// A peer get on this plane (a peer slave's): the version `stamp` of
    /// `key`, checked against the header the node sent (`node`).
    async fn peer_get_on(&self, key: BlockKey, stamp: u64, node: &BlockHeader) -> Result<Vec<f64>> {
        let (matrix, i, j) = key;
        let what = || format!("block ({i}, {j}) of {matrix} from a peer");
        let mut s = self.checkout().await?;
        let send = |e: std::io::Error| self.unavailable(format!("sending a peer get: {e}"));
        let mut out = Request::get(Op::PeerGet, 0, matrix, i, j, 0).encode().to_vec();
        out.extend_from_slice(&stamp.to_le_bytes());
        s.write_all(&out).await.map_err(send)?;
        s.flush().await.map_err(send)?;
        let len = match self.read_reply(&mut s).await? {
            Ok(len) => len,
            Err(e) => {
                self.give_back(s);
                return Err(e);
            }
        };
        let read = |e: std::io::Error| self.unavailable(format!("reading {}: {e}", what()));
        if len != (HEADER_LEN + node.payload_len()) as u64 {
            return Err(StoreError::Corrupt { what: format!("{}: {len} bytes for a {}x{} block", what(), node.rows, node.cols) });
        }
        let mut head = [0u8; HEADER_LEN];
        s.read_exact(&mut head).await.map_err(read)?;
        let mut data = vec![0f64; node.rows as usize * node.cols as usize];
        s.read_exact(bytemuck::cast_slice_mut(&mut data)).await.map_err(read)?;
        self.give_back(s);
        let theirs = crate::block::decode_header(&head);
        if theirs.map(|h| (h.rows, h.cols, h.checksum)) != Some((node.rows, node.cols, node.checksum))
            || crate::block::stamp(&head) != Some(stamp)
            || !matches_node(node, &data)
        {
            return Err(StoreError::Corrupt { what: format!("{}: not the version the node named (checksum mismatch)", what()) });
        }
        Ok(data)
    }
}

/// Reads version `stamp` of `key` from `peer`.
async fn peer_get(cache: &BlockCache, peer: &str, key: BlockKey, stamp: u64, node: &BlockHeader) -> Result<Vec<f64>> {
    let plane: Arc<DataPlane> = cache.peer_plane(peer).await?;
    plane.peer_get_on(key, stamp, node).await
}
