//! Passing a file descriptor with a few bytes over a Unix socket
//! (SCM_RIGHTS), for the data plane's local gets: the node hands a client
//! on its machine the block version's open file, and the client reads it
//! with one `pread`, as fast as a plain file, instead of the node copying
//! 32 MiB through a socket (HDFS's short-circuit local reads work so).

use std::io::{IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::unix_conn::UnixConn;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Most descriptors one message carries here (Linux allows 253).
pub const MAX_FDS: usize = 64;

/// Sends all of `bytes`, the descriptors (at most [`MAX_FDS`]) attached
/// to the first of them.
pub async fn send_with_fds(s: &UnixConn, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} descriptors in one message", fds.len())));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let first = s
        .write_with(|socket| {
            let iov = [IoSlice::new(bytes)];
            let cmsg = [ControlMessage::ScmRights(&raw)];
            sendmsg::<()>(socket.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(std::io::Error::from)
        })
        .await?;
    let mut rest = &bytes[first..];
    while !rest.is_empty() {
        let n = s.write_with(|mut socket| socket.write(rest)).await?;
        rest = &rest[n..];
    }
    Ok(())
}

/// Fills `buf` and returns the descriptors that came with its bytes (at
/// most [`MAX_FDS`]; the kernel closes any a confused peer sent beyond).
///
/// For up to `poll_first`, the socket is polled (a read that may not
/// wait, then a yield of this thread and of this task) before the task
/// parks on the runtime's readiness. A reply that comes within microseconds
/// then finds its reader on a running CPU: on this project's VM an idle
/// vCPU halts at once, and waking it costs its reader about 25 µs (a Unix
/// socket ping-pong after 500 µs of work on the asking side: 48–51 µs a
/// round trip waiting, 20–30 polling). The yields give the CPU to whatever
/// else is ready on it, such as a slave's compute thread or the node.
pub async fn recv_with_fds(s: &UnixConn, buf: &mut [u8], poll_first: std::time::Duration) -> std::io::Result<Vec<OwnedFd>> {
    let mut got = 0;
    let mut fds = Vec::new();
    // No clock read when not polling (the node's reads of requests).
    let polling_until = (!poll_first.is_zero()).then(|| std::time::Instant::now() + poll_first);
    while got < buf.len() && polling_until.is_some_and(|until| std::time::Instant::now() < until) {
        match recv_some(s, &mut buf[got..], MsgFlags::MSG_DONTWAIT) {
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((n, raw)) => {
                got += n;
                fds.extend(raw);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::yield_now();
                tokio::task::yield_now().await;
            }
            Err(e) => return Err(e),
        }
    }
    while got < buf.len() {
        match s.read_with(|_| recv_some(s, &mut buf[got..], MsgFlags::empty())).await? {
            (0, _) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            (n, raw) => {
                got += n;
                fds.extend(raw);
            }
        }
    }
    Ok(fds)
}

/// One `recvmsg` into `buf` (with `flags`): the bytes read and the
/// descriptors that came with them.
fn recv_some(s: &UnixConn, buf: &mut [u8], flags: MsgFlags) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC | flags).map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: SCM_RIGHTS gave this process new descriptors that
            // nothing else owns.
            fds.extend(v.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn descriptors_arrive_in_order_with_their_bytes() {
        let (a, b) = UnixConn::pair().unwrap();
        let mut files: Vec<std::fs::File> = (0..3).map(|_| tempfile::tempfile().unwrap()).collect();
        for (k, f) in files.iter_mut().enumerate() {
            write!(f, "file {k}").unwrap();
        }
        let borrowed: Vec<BorrowedFd> = files.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&a, b"0123456789", &borrowed).await.unwrap();
        send_with_fds(&a, b"ab", &[]).await.unwrap();
        let mut buf = [0u8; 12];
        let fds = recv_with_fds(&b, &mut buf, std::time::Duration::ZERO).await.unwrap();
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

    /// A reply read while polling, one that comes after the polling and
    /// one cut short by the peer closing: the same as without polling.
    #[tokio::test]
    async fn a_reply_is_read_whether_it_comes_while_polling_or_after() {
        use std::time::Duration;
        let (a, b) = UnixConn::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        for (poll, delay) in [(Duration::from_secs(5), Duration::from_millis(2)), (Duration::from_micros(100), Duration::from_millis(30))] {
            let send = async {
                tokio::time::sleep(delay).await;
                send_with_fds(&a, b"abc", &[file.as_fd()]).await.unwrap();
                send_with_fds(&a, b"de", &[]).await.unwrap();
            };
            let mut buf = [0u8; 5];
            let (got, ()) = tokio::join!(recv_with_fds(&b, &mut buf, poll), send);
            assert_eq!(got.unwrap().len(), 1, "{poll:?}");
            assert_eq!(&buf, b"abcde");
        }
        send_with_fds(&a, b"x", &[]).await.unwrap();
        drop(a);
        let mut buf = [0u8; 2];
        let e = recv_with_fds(&b, &mut buf, Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
