//! A put whose payload comes through the client's pipe (`Op::PutSpliced`,
//! clients on the node's machine): the node `splice`s it from the pipe
//! into the version's file, so the payload is copied once, into the page
//! cache, where through the socket it was copied three times (see
//! `store_client::dataplane::splice`). The node never holds the payload
//! in its memory, so it checks the checksum in the file, reading it back
//! (`Staging::checksum_at`): a block of several pieces before the put is
//! answered, a block of one piece in the commit that syncs it, beside the
//! commit's batch (`Staging::check_at_sync`).

use std::sync::Arc;

use actions::ActionId;
use store_client::block::{BlockHeader, HEADER_LEN};
use store_client::dataplane::splice::{PipeReader, SpliceError};
use store_client::StoreError;

use crate::blocks::{multi_threaded, sync_last, Piece, PIECE};
use crate::files::Staging;
use crate::keys::BlockKey;
use crate::node::Node;

impl Node {
    /// Writes a block inside `action` under an overwrite lock, its payload
    /// (`header.payload_len()` bytes) taken from `pipe`, every byte even
    /// when the put is refused, so that the connection stays in step.
    /// `Err` means the pipe failed and the connection is lost.
    pub(crate) async fn put_block_spliced(
        self: &Arc<Self>,
        action: Option<ActionId>,
        key: BlockKey,
        header: BlockHeader,
        pipe: &PipeReader,
    ) -> std::io::Result<Result<(), StoreError>> {
        let payload = header.payload_len();
        let (action, mut staging) = match self.prepare_staging(action, key, &header).await {
            Ok(prepared) => prepared,
            Err(e) => {
                pipe.discard(payload).await.map_err(lost)?;
                return Ok(Err(e));
            }
        };
        let synced = sync_last(payload as u64);
        let written = splice_pieces(&staging, header, payload, synced, pipe).await;
        if !synced {
            // Checked by the commit that syncs it, beside its batch.
            staging.check_at_sync(header.checksum);
        }
        self.end_put(action, key, staging, written, synced)
    }
}

/// Moves the payload from `pipe` into the file as it arrives (starting
/// each piece's writeback if the put syncs), then writes the header, and
/// if `sync` checks the payload against the header's checksum and syncs.
///
/// The header goes last because the page cache sizes a file's folios by
/// its first writes: a 32-byte header written first made page 0 a folio
/// of its own, and the payload behind it, unaligned, came in folios of
/// 1, 2, 4, … 64 pages (nine for a 512 KiB block, read from
/// `/proc/kpageflags`), where one write from offset 0 makes one folio of
/// 128 pages. Every later get reads those folios: a `pread` of the
/// payload took 25–27 µs against 18–19 for the same bytes written in one
/// piece, and `bench blocks --sizes 256 --no-cold` warm gets went from
/// 0.44–0.47 of raw to 0.50–0.52 (three alternations). Either order is
/// as safe: nothing reads a staged version before its commit, and the
/// sync covers both. (A put that
/// does not sync leaves both to its commit: `Staging::check_at_sync`.)
/// `Err`: the pipe failed; `Ok(Err)`: the file failed, or the payload is
/// not the one the checksum names (the pipe is drained either way).
async fn splice_pieces(
    staging: &Staging,
    header: BlockHeader,
    payload: usize,
    sync: bool,
    pipe: &PipeReader,
) -> std::io::Result<Result<(), Piece>> {
    let mut done = 0;
    while done < payload {
        let at = (HEADER_LEN + done) as u64;
        match pipe.splice_into(staging.as_fd(), at, payload - done, |splice| blocking(payload, splice)).await {
            Ok(n) => {
                done += n;
                if sync {
                    staging.start_writeback(at, n as u64);
                }
            }
            Err(SpliceError::File(e)) => {
                pipe.discard(payload - done).await.map_err(lost)?;
                return Ok(Err(Piece::Io(e)));
            }
            Err(e) => return Err(lost(e)),
        }
    }
    if let Err(e) = staging.write_unsynced_at(&header.encode_stamped(staging.stamp()), 0) {
        return Ok(Err(Piece::Io(e)));
    }
    if !sync {
        return Ok(Ok(()));
    }
    match blocking(payload, || staging.checksum_at(HEADER_LEN as u64, payload)) {
        Err(e) => return Ok(Err(Piece::Io(e))),
        Ok(crc) if crc != header.checksum => return Ok(Err(Piece::Checksum)),
        Ok(_) => {}
    }
    if let Err(e) = blocking(payload, || staging.finish()) {
        return Ok(Err(Piece::Io(e)));
    }
    Ok(Ok(()))
}

/// Runs file work of a put of `payload` bytes: a block of one piece on
/// this task (b = 256 overwrites in `bench blocks`, three alternations:
/// 193–215 µs a put, against 213–274 lending the worker's other tasks to
/// another thread first), a longer one where blocking is allowed (a 32 MiB
/// block's pieces may meet fresh pages of the page cache, milliseconds
/// each on a VM).
fn blocking<R>(payload: usize, f: impl FnOnce() -> R) -> R {
    if payload > PIECE && multi_threaded() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// A pipe that failed: the connection is lost.
fn lost(e: SpliceError) -> std::io::Error {
    match e {
        SpliceError::Closed => std::io::ErrorKind::UnexpectedEof.into(),
        SpliceError::Pipe(e) | SpliceError::File(e) => e,
    }
}
