//! A block put's payload through a pipe, for clients on the node's machine
//! (Unix socket only): the client `vmsplice`s its block's pages into the
//! pipe (no copy: the pipe holds references to them) and the node
//! `splice`s them into the version's file (one copy, into the page cache).
//! Through the socket a 512 KiB payload was copied three times (into the
//! socket, out of it, into the file): 225 µs a put against 81 through a
//! pipe, measured by a C probe of both paths on this VM.
//!
//! The pipe is the connection's: the client makes it when it connects and
//! hands the node its read end ([`super::wire::Op::Pipe`]); a put's payload
//! follows its request through it ([`super::wire::Op::PutSpliced`]).
//!
//! The pages stay the caller's until the node has spliced them: a put
//! waits for the node's answer before it gives the block back, and a put
//! cut off midway drops its connection (and so the pipe). The node checks
//! the payload's checksum in the file all the same, so that a payload
//! changed under the pipe is refused as `Corrupt`, never stored.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The pipe's capacity, asked for (the kernel may give less: a user's
/// limit is `/proc/sys/fs/pipe-max-size`, 1 MiB by default): a 512 KiB
/// block goes in one `vmsplice`, before the node reads any of it.
pub const PIPE_BYTES: usize = 1 << 20;

/// Makes a pipe: the read end for the node, the write end for this client.
pub fn pipe() -> std::io::Result<(OwnedFd, PipeWriter)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe2` returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `pipe2` made these descriptors, owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Best effort: a smaller pipe only takes more rounds.
    // SAFETY: a plain fcntl on a descriptor this function owns.
    unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) };
    // SAFETY: an `OwnedFd` keeps its descriptor open and the same for as
    // long as the `AsyncFd` owns it.
    let write = unsafe { AsyncFd::register_with_interest(write, Interest::WRITABLE) }.map_err(std::io::Error::from)?;
    Ok((read, PipeWriter(write)))
}

/// The client's end of a connection's pipe.
pub struct PipeWriter(AsyncFd<OwnedFd>);

impl PipeWriter {
    /// Hands all of `bytes` to the pipe, waiting while it is full. The
    /// pipe refers to `bytes`' pages until the reader takes them: the
    /// caller keeps them unchanged until the node has answered.
    pub async fn send(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let mut ready = self.0.writable().await?;
            let sent = ready.try_io(|fd| {
                let iov = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: rest.len() };
                // SAFETY: `iov` names `rest`, borrowed for the call.
                let n = unsafe { libc::vmsplice(fd.as_raw_fd(), &iov, 1, libc::SPLICE_F_NONBLOCK) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match sent {
                Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => rest = &rest[n..],
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }
}

/// The node's end of a connection's pipe.
pub struct PipeReader(AsyncFd<OwnedFd>);

/// Why a [`PipeReader::splice_into`] stopped.
#[derive(Debug)]
pub enum SpliceError {
    /// The pipe's writer is gone (the client closed or died midway).
    Closed,
    /// Reading the pipe failed: the connection is out of step.
    Pipe(std::io::Error),
    /// Writing the file failed (a full disk, say); the pipe still holds
    /// what was not moved.
    File(std::io::Error),
}

impl PipeReader {
    /// Takes a descriptor a client passed as its pipe's read end. `Err`
    /// if it is not a pipe.
    pub fn new(fd: OwnedFd) -> std::io::Result<PipeReader> {
        // SAFETY: `st` is written by `fstat` before it is read.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a plain fstat on an owned descriptor.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the descriptor passed as a pipe is not one"));
        }
        // SAFETY: plain fcntls on an owned descriptor.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as in `pipe`: an owned descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(std::io::Error::from)?;
        Ok(PipeReader(fd))
    }

    /// Moves up to `len` bytes from the pipe into `file` at `offset`,
    /// waiting until some have arrived; returns how many moved. `write`
    /// runs the `splice` call, which copies into the page cache (so that
    /// the caller can run it where blocking is allowed).
    pub async fn splice_into(
        &self,
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        write: impl Fn(&mut dyn FnMut() -> std::io::Result<usize>) -> std::io::Result<usize>,
    ) -> Result<usize, SpliceError> {
        loop {
            let mut ready = self.0.readable().await.map_err(SpliceError::Pipe)?;
            let moved = ready.try_io(|fd| {
                let mut once = || {
                    let mut off = offset as libc::loff_t;
                    // SAFETY: both descriptors are open for the call; `off`
                    // is a local the kernel updates.
                    let n = unsafe {
                        libc::splice(
                            fd.as_raw_fd(),
                            std::ptr::null_mut(),
                            file.as_raw_fd(),
                            &mut off,
                            len,
                            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                        )
                    };
                    if n < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
                };
                write(&mut once)
            });
            match moved {
                Ok(Ok(0)) => return Err(SpliceError::Closed),
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A nonblocking splice that found the pipe empty: `try_io`
                // saw `WouldBlock` and cleared the readiness.
                Err(_would_block) => {}
                // The pipe end is fine (it was readable): the file failed.
                Ok(Err(e)) => return Err(SpliceError::File(e)),
            }
        }
    }

    /// Reads and drops `len` bytes from the pipe (the payload of a put
    /// that was refused), so that the connection stays in step.
    pub async fn discard(&self, mut len: usize) -> Result<(), SpliceError> {
        let mut sink = vec![0u8; len.min(PIPE_BYTES)];
        while len > 0 {
            let mut ready = self.0.readable().await.map_err(SpliceError::Pipe)?;
            let want = len.min(sink.len());
            let read = ready.try_io(|fd| {
                // SAFETY: `sink` has room for `want` bytes.
                let n = unsafe { libc::read(fd.as_raw_fd(), sink.as_mut_ptr().cast(), want) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(Ok(0)) => return Err(SpliceError::Closed),
                Ok(Ok(n)) => len -= n,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(SpliceError::Pipe(e)),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }
}

impl AsFd for PipeReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.get_ref().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn blocking(f: &mut dyn FnMut() -> std::io::Result<usize>) -> std::io::Result<usize> {
        f()
    }

    #[tokio::test]
    async fn a_payload_larger_than_the_pipe_arrives_whole_in_the_file() {
        let (read, writer) = pipe().unwrap();
        let reader = PipeReader::new(read).unwrap();
        let payload: Vec<u8> = (0..3 * PIPE_BYTES + 12345).map(|k| (k * 7 % 251) as u8).collect();
        let file = tempfile::tempfile().unwrap();
        let (sent, received) = tokio::join!(writer.send(&payload), async {
            let mut done = 0;
            while done < payload.len() {
                done += reader.splice_into(file.as_fd(), 100 + done as u64, payload.len() - done, blocking).await.unwrap();
            }
        });
        sent.unwrap();
        let () = received;
        let mut back = vec![0u8; payload.len()];
        file.read_exact_at(&mut back, 100).unwrap();
        assert!(back == payload, "the file holds other bytes than were sent");
        // The writer gone, the reader sees the end rather than waiting.
        drop(writer);
        assert!(matches!(reader.splice_into(file.as_fd(), 0, 10, blocking).await, Err(SpliceError::Closed)));
    }

    #[tokio::test]
    async fn discard_keeps_the_pipe_in_step() {
        let (read, writer) = pipe().unwrap();
        let reader = PipeReader::new(read).unwrap();
        writer.send(&[1u8; 5000]).await.unwrap();
        writer.send(b"next").await.unwrap();
        reader.discard(5000).await.unwrap();
        let file = tempfile::tempfile().unwrap();
        assert_eq!(reader.splice_into(file.as_fd(), 0, 4, blocking).await.unwrap(), 4);
        let mut back = [0u8; 4];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(&back, b"next");
    }

    #[test]
    fn only_a_pipe_is_taken_as_one() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _guard = rt.enter();
        let file = tempfile::tempfile().unwrap();
        let err = PipeReader::new(OwnedFd::from(file)).err().expect("a file is not a pipe");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}
