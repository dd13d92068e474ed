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

/// Most descriptors one message carries here (Linux allows 253).
pub const MAX_FDS: usize = 64;

/// Sends all of `bytes`, the descriptors (at most [`MAX_FDS`]) attached
/// to the first of them.
pub async fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} descriptors in one message", fds.len())));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
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

/// Fills `buf` and returns the descriptors that came with its bytes (at
/// most [`MAX_FDS`]; the kernel closes any a confused peer sent beyond).
pub async fn recv_with_fds(s: &UnixStream, buf: &mut [u8]) -> std::io::Result<Vec<OwnedFd>> {
    let mut got = 0;
    let mut fds = Vec::new();
    while got < buf.len() {
        s.readable().await?;
        let received = s.try_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(&mut buf[got..])];
            let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
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
            Ok((n, raw)) => {
                got += n;
                // SAFETY: SCM_RIGHTS gave this process new descriptors
                // that nothing else owns.
                fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn descriptors_arrive_in_order_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut files: Vec<std::fs::File> = (0..3).map(|_| tempfile::tempfile().unwrap()).collect();
        for (k, f) in files.iter_mut().enumerate() {
            write!(f, "file {k}").unwrap();
        }
        let borrowed: Vec<BorrowedFd> = files.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&a, b"0123456789", &borrowed).await.unwrap();
        send_with_fds(&a, b"ab", &[]).await.unwrap();
        let mut buf = [0u8; 12];
        let fds = recv_with_fds(&b, &mut buf).await.unwrap();
        assert_eq!(&buf, b"0123456789ab");
        assert_eq!(fds.len(), 3);
        for (k, fd) in fds.into_iter().enumerate() {
            let mut f = std::fs::File::from(fd);
            f.rewind().unwrap();
            let mut text = String::new();
            f.read_to_string(&mut text).unwrap();
            assert_eq!(text, format!("file {k}"));
        }
        let too_many: Vec<BorrowedFd> = (0..=MAX_FDS).map(|_| files[0].as_fd()).collect();
        assert_eq!(send_with_fds(&a, b"x", &too_many).await.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    }
}
