//! A block version's file while it is written: its payload in pieces, its
//! writeback, its checksum check and its sync.

use super::*;

/// A version's file being written, from [`BlockFiles::stage`]. Its data
/// is durable once [`Staging::finish`] returns; a staging that does not
/// finish goes back with [`BlockFiles::abandon`] or [`BlockFiles::failed`].
pub(crate) struct Staging {
    pub(super) version: Uuid,
    pub(super) file: File,
    /// The value's length.
    pub(super) len: u64,
    /// The file's length when it was taken (a recycled version's).
    pub(super) was: u64,
    /// The mark the writer puts in the value's header
    /// (`block::BlockHeader::encode_stamped`): random, so that the file
    /// of a recycled version, which still holds an older block, does not
    /// pass for this write's.
    pub(super) stamp: u64,
    /// The checksum its payload must have, where the put left the check
    /// to the commit ([`Staging::check_at_sync`]).
    pub(super) check: Option<u32>,
    pub(super) disk: Arc<dyn Disk>,
}

impl Staging {
    pub(crate) fn version(&self) -> Uuid {
        self.version
    }

    pub(crate) fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Leaves the check of the payload against `checksum` to the commit that
    /// syncs this version ([`BlockFiles::sync_staged`]), which reads it
    /// back while its batch goes to the disk, instead of the put before
    /// its answer. For a one-piece put whose payload the node never held
    /// (spliced from a client's pipe). A mismatch then fails the commit,
    /// whose batch is undone, so no damaged block ever becomes current.
    pub(crate) fn check_at_sync(&mut self, checksum: u32) {
        self.check = Some(checksum);
    }

    /// The deferred check ([`Staging::check_at_sync`]), if any: `Ok(false)`
    /// when the payload is not the one its checksum names.
    pub(super) fn passes_check(&self) -> std::io::Result<bool> {
        let Some(checksum) = self.check else { return Ok(true) };
        let header = HEADER_LEN as u64;
        Ok(self.checksum_at(header, (self.len - header) as usize)? == checksum)
    }

    /// Writes `bytes` at `offset` and starts their writeback at once, so
    /// that a value written in pieces is mostly on the disk when its
    /// last piece arrives and [`Staging::finish`] waits for that piece
    /// only (32 MiB: write and `fdatasync` 17 ms, in 1 MiB pieces with
    /// writeback started after each 12.5 ms, on this VM).
    pub(crate) fn write_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.write_unsynced_at(bytes, offset)?;
        self.start_writeback(offset, bytes.len() as u64);
        Ok(())
    }

    /// Starts writing `len` bytes from `offset` to the disk (0: to the
    /// end). Only a hint; durability comes from a sync. A filesystem that
    /// does not do it (some answer EINVAL or ESPIPE) loses only the head
    /// start, so its refusal is not the put's.
    pub(crate) fn start_writeback(&self, offset: u64, len: u64) {
        // SAFETY: the descriptor is open for the call's duration.
        let started = unsafe { libc::sync_file_range(self.file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
        if started != 0 {
            tracing::trace!("sync_file_range: {}", std::io::Error::last_os_error());
        }
    }

    /// Writes the value's last `bytes` at `offset`, then finishes: no
    /// writeback hint, as the sync right after it starts the writeback
    /// anyway (a small block's only piece paid one more syscall for
    /// nothing; no change above noise in `bench blocks`).
    pub(crate) fn write_last_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.write_unsynced_at(bytes, offset)?;
        self.finish()
    }

    /// Writes `bytes` at `offset` and nothing more: no writeback hint, no
    /// sync (a one-piece put's staging goes to [`BlockFiles::sync_later`]
    /// next).
    pub(crate) fn write_unsynced_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.disk.write_at(&self.file, bytes, offset)
    }

    /// The file, for a write that does not go through a buffer of this
    /// process (a `splice` from a client's pipe).
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.file)
    }

    /// The checksum of the `len` bytes at `offset` as the file holds them
    /// (just written: read back from the page cache). Read in pieces into
    /// a buffer that stays in this core's cache: `bench blocks`, b = 256
    /// overwrites, three alternations each: 201–217 µs a put, against
    /// 224–231 through a mapping of the file (whose page-table set-up and
    /// teardown cost more than the copy).
    pub(crate) fn checksum_at(&self, offset: u64, len: usize) -> std::io::Result<u32> {
        use std::os::unix::fs::FileExt;
        thread_local!(static PIECE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 128 << 10]));
        PIECE.with(|piece| {
            let mut piece = piece.borrow_mut();
            let mut sum = block::Checksum::new();
            let mut done = 0;
            while done < len {
                let n = (len - done).min(piece.len());
                self.file.read_exact_at(&mut piece[..n], offset + done as u64)?;
                sum.update(&piece[..n]);
                done += n;
            }
            Ok(sum.value())
        })
    }

    /// Cuts a longer recycled file to the value's length and syncs the
    /// data: after this, the version survives a crash.
    pub(crate) fn finish(&self) -> std::io::Result<()> {
        self.cut()?;
        self.sync()
    }

    /// Makes the data written so far durable.
    pub(super) fn sync(&self) -> std::io::Result<()> {
        self.disk.sync_data(&self.file)
    }

    /// Cuts a longer recycled file to the value's length (a read of the
    /// version checks the length against its header).
    pub(super) fn cut(&self) -> std::io::Result<()> {
        if self.was > self.len {
            self.disk.set_len(&self.file, self.len)?;
        }
        Ok(())
    }
}

/// A write stamp: random and never 0 (a header without one).
pub(super) fn new_stamp() -> u64 {
    let (a, b) = Uuid::new_v4().as_u64_pair();
    (a ^ b).max(1)
}
