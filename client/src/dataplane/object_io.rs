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
        let req = Request { op: Op::ObjectGet, action, matrix, i, j, rows: 0, cols: for_update as u32, checksum: 0, flags: 0 };
        let mut attempt = 0;
        loop {
            let mut s = self.checkout().await?;
            let answer = self.object_version_on(&mut s, &req).await?;
            self.give_back(s);
            let at = answer?;
            let objects = objects.clone();
            let read = tokio::task::spawn_blocking(move || {
                read_block(&*objects, at.version, Some((at.rows, at.cols)), &|| format!("block ({i}, {j}) of {matrix}"))
            })
            .await
            .map_err(|e| StoreError::Storage { what: format!("reading block ({i}, {j}) of {matrix}: {e}") })?;
            match read {
                Err(StoreError::NotFound { .. }) if action == 0 && attempt < UNLOCKED_RETRIES => attempt += 1,
                // Under a lock the version cannot have been replaced: its
                // object is gone, which is damage, not absence.
                Err(StoreError::NotFound { what }) => return Err(StoreError::Corrupt { what: format!("version object missing: {what}") }),
                other => return other,
            }
        }
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
