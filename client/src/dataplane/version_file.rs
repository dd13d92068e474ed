//! Reading a block from its version file, through the descriptor a local
//! get hands over: the header checked against what the node sent, the
//! payload against its checksum, read as the page cache and readahead read
//! fastest.

use super::*;

/// A block in errors, formatted only when one is made.
#[derive(Clone, Copy)]
pub(super) struct BlockName {
    pub(super) matrix: Uuid,
    pub(super) i: u32,
    pub(super) j: u32,
}

impl std::fmt::Display for BlockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "block ({}, {}) of {}", self.i, self.j, self.matrix)
    }
}

/// Reads a version file's header and payload (see [`read_version_file`]):
/// here when small; when large, on this
/// worker thread turned blocking (`block_in_place`: the runtime's other
/// tasks move to another thread) or, on a runtime of one thread, on the
/// blocking pool. Lending the worker saves the pool's hand-off: `bench
/// blocks --sizes 1024,2048 --no-cold`, alternating three times, b = 1024
/// warm gets 0.68, 0.64, 0.63 of raw through the pool, 0.71, 0.69, 0.77
/// lending the worker; b = 2048 within the spread (0.87–0.92, 0.86–0.96).
pub(super) async fn read_block_file(file: std::fs::File, entry: LocalEntry, action: u64, name: BlockName) -> Result<BlockData> {
    let read = move |file: &std::fs::File| read_version_file(file, entry.header, entry.cached, action, name).map(|(block, _)| block);
    if entry.header.payload_len() <= INLINE_READ {
        return read(&file);
    }
    if tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        return tokio::task::block_in_place(|| read(&file));
    }
    tokio::task::spawn_blocking(move || read(&file))
        .await
        .map_err(|e| StoreError::StoreUnavailable { what: format!("reading a block: {e}") })?
}

/// Reads a version file into a new block, checksummed as it goes: when the
/// node found it `cached`, its header with the payload's first piece in one
/// `preadv` that may not wait, then the rest piece by piece. The file's
/// header must be a block header of the shape `sent` gives, and the payload
/// must match the checksum of the file's header under an action
/// (`wire::shape_only`), else `sent`'s. Also answers the write stamp in
/// the file's header.
///
/// A file not in the page cache is read as readahead reads it fastest: its
/// header alone, then the payload in pieces. Cold 8 MiB files on this VM's
/// disk (a C loop over 24 files): 2.8–3.0 GB/s that way, 1.7–2.1 with the
/// header and the first piece in one read, 2.0–2.2 when that read may not
/// wait and fails (it starts readahead of its whole length), 1.4–1.7 in
/// one read of the whole file.
pub(super) fn read_version_file(
    file: &std::fs::File,
    sent: block::BlockHeader,
    cached: bool,
    action: u64,
    name: BlockName,
) -> Result<(BlockData, u64)> {
    use std::os::fd::AsRawFd;
    let values = sent.rows as usize * sent.cols as usize;
    let len = values * 8;
    // Not zeroed first: `preadv` fills every byte, or the block is dropped
    // with the error.
    let mut data: Vec<f64> = Vec::with_capacity(values);
    let base = data.as_mut_ptr() as *mut u8;
    let corrupt = |why: String| StoreError::Corrupt { what: format!("{name}: {why}") };
    let mut head = [0u8; HEADER_LEN];
    // The file's header, once read and checked.
    let mut found = None;
    let mut sum = block::Checksum::new();
    // Bytes of the header, then of the payload, read so far.
    let (mut in_head, mut done) = (0, 0);
    let (mut nowait, mut header_alone) = (cached, !cached);
    while in_head < HEADER_LEN || done < len {
        let want = READ_PIECE.min(len - done);
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
        let mut parts = 0;
        if in_head < HEADER_LEN {
            iov[0] = libc::iovec { iov_base: head[in_head..].as_mut_ptr().cast(), iov_len: HEADER_LEN - in_head };
            parts = 1;
        }
        if want > 0 && !(header_alone && in_head < HEADER_LEN) {
            // SAFETY: `done + want <= len`, the buffer's capacity in bytes.
            iov[parts] = libc::iovec { iov_base: unsafe { base.add(done) }.cast(), iov_len: want };
            parts += 1;
        }
        let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
        nowait = false;
        let at = in_head + done;
        // SAFETY: every iovec points at writable bytes that outlive the call.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), iov.as_ptr(), parts as libc::c_int, at as libc::off_t, flags) };
        match n {
            n if n > 0 => {
                let mut n = n as usize;
                if in_head < HEADER_LEN {
                    let took = n.min(HEADER_LEN - in_head);
                    in_head += took;
                    n -= took;
                    if in_head == HEADER_LEN {
                        found = Some(check_file_header(&head, &sent).map_err(corrupt)?);
                    }
                }
                // SAFETY: `preadv2` initialised these `n` bytes.
                let got = unsafe { std::slice::from_raw_parts(base.add(done), n) };
                sum.update(got);
                done += n;
            }
            0 => return Err(corrupt("reading its version file: the file ends before the block does".into())),
            _ => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    // Not cached after all (or no `RWF_NOWAIT` here).
                    Some(libc::EAGAIN | libc::EOPNOTSUPP) if flags != 0 => header_alone = true,
                    Some(libc::EINTR) => {}
                    _ => return Err(corrupt(format!("reading its version file: {e}"))),
                }
            }
        }
    }
    let found = found.expect("the loop ends only with the header read");
    let expected = if wire::shape_only(action) { found.checksum } else { sent.checksum };
    if sum.value() != expected {
        return Err(corrupt("checksum mismatch".into()));
    }
    // SAFETY: `preadv` wrote all `len` bytes, and any bit pattern is an f64.
    unsafe { data.set_len(values) };
    let stamp = block::stamp(&head).expect("a header, as checked");
    Ok((BlockData { rows: sent.rows as usize, cols: sent.cols as usize, data }, stamp))
}

/// A version file's header, checked against the header the node sent: a
/// block header, of the same shape.
pub(super) fn check_file_header(head: &[u8; HEADER_LEN], sent: &block::BlockHeader) -> std::result::Result<block::BlockHeader, String> {
    let found = block::decode_header(head).ok_or_else(|| format!("reading its version file: {}", block::bad_header(head)))?;
    if (found.rows, found.cols) != (sent.rows, sent.cols) {
        return Err(format!("its version file holds a {}x{} block, not {}x{}", found.rows, found.cols, sent.rows, sent.cols));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::BlockHeader;

    const NAME: BlockName = BlockName { matrix: Uuid::nil(), i: 1, j: 2 };
    /// Any action: its gets are answered with shapes.
    const UNDER_ACTION: u64 = 7;

    /// A version file holding `header` then `payload`.
    fn version_file(header: &[u8; HEADER_LEN], payload: &[u8]) -> std::fs::File {
        use std::io::{Seek, Write};
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(header).unwrap();
        f.write_all(payload).unwrap();
        f.rewind().unwrap();
        f
    }

    /// A block of `rows`×`cols` (more than one read piece of values) and
    /// its stored form's header.
    fn stored(rows: u32, cols: u32) -> (Vec<f64>, BlockHeader) {
        let data: Vec<f64> = (0..rows as usize * cols as usize).map(|k| k as f64 * 0.5 - 3.0).collect();
        let header = BlockHeader { rows, cols, checksum: block::checksum(bytemuck::cast_slice(&data)) };
        (data, header)
    }

    fn read(f: &std::fs::File, sent: BlockHeader, action: u64) -> Result<BlockData> {
        let whole = read_version_file(f, sent, true, action, NAME).map(|(block, _)| block);
        // Read as a file not cached, the same.
        let from_disk = read_version_file(f, sent, false, action, NAME).map(|(block, _)| block);
        assert_eq!(format!("{whole:?}"), format!("{from_disk:?}"));
        whole
    }

    fn why(r: Result<BlockData>) -> String {
        match r {
            Err(StoreError::Corrupt { what }) => what,
            other => panic!("not Corrupt: {other:?}"),
        }
    }

    #[test]
    fn a_version_file_is_read_whole_and_checked_against_the_right_checksum() {
        // 300 × 400 values: 960,000 bytes, two read pieces.
        let (data, header) = stored(300, 400);
        let f = version_file(&header.encode_stamped(99), bytemuck::cast_slice(&data));
        let shape = BlockHeader { checksum: 0, ..header };
        // Under an action: the shape is sent, the checksum is the file's.
        let got = read(&f, shape, UNDER_ACTION).unwrap();
        assert_eq!((got.rows, got.cols), (300, 400));
        assert_eq!(got.data, data);
        // The file's write stamp comes with it (what a peeked block is
        // kept by).
        assert_eq!(read_version_file(&f, shape, true, UNDER_ACTION, NAME).unwrap().1, 99);
        // Without one: the checksum is the one the node sent, and a file
        // whose own header and payload agree but differ from it (reused
        // for another block) fails.
        assert_eq!(read(&f, header, 0).unwrap().data, data);
        let other = BlockHeader { checksum: header.checksum ^ 1, ..header };
        assert!(why(read(&f, other, 0)).contains("checksum mismatch"));
        // Not in the page cache: the read that may not wait fails, and the
        // file is read as from disk, the same.
        use std::os::fd::AsRawFd;
        f.sync_all().unwrap();
        // SAFETY: a plain syscall on a descriptor this test owns.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(read(&f, shape, UNDER_ACTION).unwrap().data, data);
    }

    #[test]
    fn a_damaged_version_file_is_corrupt_and_says_how() {
        let (data, header) = stored(64, 64);
        let payload: &[u8] = bytemuck::cast_slice(&data);
        let shape = BlockHeader { checksum: 0, ..header };
        // A flipped payload byte.
        let mut flipped = payload.to_vec();
        flipped[4000] ^= 0x10;
        let e = why(read(&version_file(&header.encode(), &flipped), shape, UNDER_ACTION));
        assert!(e.contains("checksum mismatch") && e.contains("block (1, 2)"), "{e}");
        // A checksum in the header that is not the payload's.
        let wrong = BlockHeader { checksum: header.checksum.wrapping_add(1), ..header };
        assert!(why(read(&version_file(&wrong.encode(), payload), shape, UNDER_ACTION)).contains("checksum mismatch"));
        // No block header at all.
        let mut garbage = header.encode();
        garbage[0] ^= 0xff;
        for action in [0, UNDER_ACTION] {
            let sent = if action == 0 { header } else { shape };
            assert!(why(read(&version_file(&garbage, payload), sent, action)).contains("bad block header"));
        }
        // A header of another shape (same bytes).
        let other = BlockHeader { rows: 32, cols: 128, ..header };
        let e = why(read(&version_file(&other.encode(), payload), shape, UNDER_ACTION));
        assert!(e.contains("holds a 32x128 block, not 64x64"), "{e}");
        // Cut short, inside the payload and inside the header.
        let e = why(read(&version_file(&header.encode(), &payload[..payload.len() - 8]), shape, UNDER_ACTION));
        assert!(e.contains("ends before the block does"), "{e}");
        let cut = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &cut, &header.encode()[..20]).unwrap();
        assert!(why(read(&cut, shape, UNDER_ACTION)).contains("ends before the block does"));
    }
}
