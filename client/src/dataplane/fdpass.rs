//! Passing a file descriptor with a few bytes over a Unix socket
//! (SCM_RIGHTS), for the data plane's local gets: the node hands a client
//! on its machine the block version's open file, and the client reads it
//! with one `pread`, as fast as a plain file, instead of the node copying
//! 32 MiB through a socket (HDFS's short-circuit local reads work so).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Sends all of `bytes`, the descriptor attached to the first of them.
pub async fn send_with_fd(s: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let raw = [fd.as_raw_fd()];
    let first = loop {
        s.writable().await?;
        let sent = s.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(bytes)];
            let cmsg = [ControlMessage::ScmRights(&raw)];
            sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(std::io::Error::from)
        });
        match sent {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    let mut rest = &bytes[first..];
    while !rest.is_empty() {
        s.writable().await?;
        match s.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf` and returns the descriptor that came with its bytes, if
/// one did. Any further descriptors (a confused peer) are closed.
pub async fn recv_with_fd(s: &UnixStream, buf: &mut [u8]) -> std::io::Result<Option<OwnedFd>> {
    let mut got = 0;
    let mut fd = None;
    while got < buf.len() {
        s.readable().await?;
        let received = s.try_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(&mut buf[got..])];
            let mut space = nix::cmsg_space!([RawFd; 2]);
            let msg = recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).map_err(std::io::Error::from)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(v) = c {
                    fds.extend(v);
                }
            }
            Ok((msg.bytes, fds))
        });
        match received {
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((n, fds)) => {
                got += n;
                for raw in fds {
                    // SAFETY: SCM_RIGHTS gave this process a new descriptor
                    // that nothing else owns.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(fd)
}
