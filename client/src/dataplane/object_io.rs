//! A data plane whose node keeps block versions as objects
//! ([`crate::objects`]): the node answers which version a lock lets the
//! client see, and is told which version the client wrote; the payloads go
//! between the client and the object store.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use super::wire::{ObjectVersion, Op, Request};
use super::{DataPlane, Result, Stream};
use crate::block::{self, BlockHeader};
use crate::client::BlockData;
use crate::objects::{read_block, BlockObjects};
use crate::StoreError;

/// Reads without a lock that find their version's object removed (a
/// commit replaced it meanwhile) ask the node again this often.
const UNLOCKED_RETRIES: usize = 3;

/// Runs `f`, which blocks on the object store, without stalling the
/// runtime's other tasks where the runtime has other workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Reads a version's object on the blocking pool; started when called.
fn read_object(
    objects: &Arc<dyn BlockObjects>,
    at: ObjectVersion,
    action: u64,
    (matrix, i, j): (Uuid, u32, u32),
) -> impl std::future::Future<Output = Result<BlockData>> {
    let objects = objects.clone();
    let read = tokio::task::spawn_blocking(move || {
        read_block(&*objects, at.version, Some((at.rows, at.cols)), &|| format!("block ({i}, {j}) of {matrix}"))
    });
    async move {
        match read.await.map_err(|e| StoreError::Storage { what: format!("reading block ({i}, {j}) of {matrix}: {e}") })? {
            // Under a lock the version cannot have been replaced: its
            // object is gone, which is damage, not absence.
            Err(StoreError::NotFound { what }) if action != 0 => {
                Err(StoreError::Corrupt { what: format!("version object missing: {what}") })
            }
            other => other,
        }
    }
}

impl DataPlane {
    pub(super) async fn object_get(
        &self,
        objects: &Arc<dyn BlockObjects>,
        action: u64,
        matrix: Uuid,
        i: u32,
        j: u32,
        for_update: bool,
    ) -> Result<BlockData> {
        let mut attempt = 0;
        loop {
            let at = self.object_version(action, matrix, i, j, for_update).await?;
            match read_object(objects, at, action, (matrix, i, j)).await {
                Err(StoreError::NotFound { .. }) if action == 0 && attempt < UNLOCKED_RETRIES => attempt += 1,
                other => return other,
            }
        }
    }

    /// Blocks of one matrix: their versions asked for one after the other
    /// (each lock taken in order, as the node's gets of many do), then
    /// every object read at once, so that the OSDs holding them all send.
    pub(super) async fn object_get_many(
        &self,
        objects: &Arc<dyn BlockObjects>,
        action: u64,
        matrix: Uuid,
        blocks: &[(u32, u32)],
        for_update: bool,
    ) -> Result<Vec<BlockData>> {
        let mut ats = Vec::with_capacity(blocks.len());
        for &(i, j) in blocks {
            ats.push(self.object_version(action, matrix, i, j, for_update).await?);
        }
        let reads: Vec<_> = ats.iter().zip(blocks).map(|(&at, &(i, j))| read_object(objects, at, action, (matrix, i, j))).collect();
        let mut got = Vec::with_capacity(blocks.len());
        for (read, &(i, j)) in reads.into_iter().zip(blocks) {
            match read.await {
                // Replaced meanwhile (no lock): that block again, alone.
                Err(StoreError::NotFound { .. }) if action == 0 => {
                    got.push(self.object_get(objects, action, matrix, i, j, for_update).await?)
                }
                other => got.push(other?),
            }
        }
        Ok(got)
    }

    async fn object_version(&self, action: u64, matrix: Uuid, i: u32, j: u32, for_update: bool) -> Result<ObjectVersion> {
        let req = Request { op: Op::ObjectGet, action, matrix, i, j, rows: 0, cols: for_update as u32, checksum: 0, flags: 0 };
        let mut s = self.checkout().await?;
        let answer = self.object_version_on(&mut s, &req).await?;
        self.give_back(s);
        answer
    }

    /// `Err`: out of step; `Ok`: the node's answer.
    async fn object_version_on(&self, s: &mut Stream, req: &Request) -> Result<Result<ObjectVersion>> {
        let send = |e: std::io::Error| self.unavailable(format!("sending an object get: {e}"));
        s.write_all(&req.encode()).await.map_err(send)?;
        s.flush().await.map_err(send)?;
        match self.read_reply(s).await? {
            Ok(len) if len == ObjectVersion::LEN as u64 => {
                let mut b = [0u8; ObjectVersion::LEN];
                s.read_exact(&mut b).await.map_err(|e| self.unavailable(format!("reading an object get's answer: {e}")))?;
                Ok(Ok(ObjectVersion::decode(&b)))
            }
            Ok(len) => Err(self.unavailable(format!("an object get answered with {len} bytes"))),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Writes the block's new version as an object under a fresh id, then
    /// hands the node the id. A version the node refuses is removed (what
    /// a failed removal leaves, the node's collection of objects no pointer
    /// names removes).
    pub(super) async fn object_put(
        &self,
        objects: &Arc<dyn BlockObjects>,
        action: u64,
        matrix: Uuid,
        (i, j): (u32, u32),
        block: &BlockData,
    ) -> Result<()> {
        let payload: &[u8] = bytemuck::cast_slice(&block.data);
        let header = BlockHeader { rows: block.rows as u32, cols: block.cols as u32, checksum: block::checksum(payload) };
        let version = Uuid::new_v4();
        blocking(|| objects.put(version, &header.encode(), payload))?;
        let req =
            Request { op: Op::ObjectPut, action, matrix, i, j, rows: header.rows, cols: header.cols, checksum: header.checksum, flags: 0 };
        let mut s = self.checkout().await?;
        let answer = self.object_put_on(&mut s, &req, version).await;
        if let Ok(s_answer) = &answer {
            if s_answer.is_ok() {
                self.give_back(s);
                return Ok(());
            }
            self.give_back(s);
        }
        let _ = blocking(|| objects.remove(&[version]));
        answer?
    }

    async fn object_put_on(&self, s: &mut Stream, req: &Request, version: Uuid) -> Result<Result<()>> {
        let send = |e: std::io::Error| self.unavailable(format!("sending block ({}, {}): {e}", req.i, req.j));
        let mut out = req.encode().to_vec();
        out.extend_from_slice(version.as_bytes());
        s.write_all(&out).await.map_err(send)?;
        s.flush().await.map_err(send)?;
        match self.read_reply(s).await? {
            Ok(0) => Ok(Ok(())),
            Ok(len) => Err(self.unavailable(format!("an object put answered with {len} bytes"))),
            Err(e) => Ok(Err(e)),
        }
    }
}
