//! A Unix stream socket registered with the runtime, with the operations
//! the data plane needs beyond a byte stream: a read or write run by the
//! caller (descriptor passing, `MSG_DONTWAIT` polls) until the socket is
//! ready for it.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A connected Unix stream socket (see the module's comment).
pub struct UnixConn {
    io: AsyncFd<StdUnixStream>,
}

impl UnixConn {
    /// Takes over a connected socket (made non-blocking here).
    pub fn new(socket: StdUnixStream) -> std::io::Result<UnixConn> {
        socket.set_nonblocking(true)?;
        // SAFETY: the socket owns its descriptor, which stays open, and is
        // the one `as_raw_fd` gives, for as long as the `AsyncFd` holds it.
        let io = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE | Interest::WRITABLE) }?;
        Ok(UnixConn { io })
    }

    /// Takes over a socket the runtime already watches (one a listener
    /// accepted, say).
    pub fn from_tokio(socket: tokio::net::UnixStream) -> std::io::Result<UnixConn> {
        UnixConn::new(socket.into_std()?)
    }

    pub async fn connect(path: &std::path::Path) -> std::io::Result<UnixConn> {
        UnixConn::from_tokio(tokio::net::UnixStream::connect(path).await?)
    }

    /// A connected pair, for tests.
    pub fn pair() -> std::io::Result<(UnixConn, UnixConn)> {
        let (a, b) = StdUnixStream::pair()?;
        Ok((UnixConn::new(a)?, UnixConn::new(b)?))
    }

    /// The socket, for an operation that must not block (it is
    /// non-blocking).
    pub fn socket(&self) -> &StdUnixStream {
        self.io.get_ref()
    }

    /// Runs `op` (a read of the socket) until it does not find it empty,
    /// waiting for the runtime to say it is readable in between.
    pub async fn read_with<R>(&self, mut op: impl FnMut(&StdUnixStream) -> std::io::Result<R>) -> std::io::Result<R> {
        loop {
            let mut ready = self.io.readable().await?;
            match ready.try_io(|s| op(s.get_ref())) {
                Ok(done) => return done,
                Err(_would_block) => continue,
            }
        }
    }

    /// Runs `op` (a write to the socket) until it does not find the buffer
    /// full, waiting for the runtime to say it is writable in between.
    pub async fn write_with<R>(&self, mut op: impl FnMut(&StdUnixStream) -> std::io::Result<R>) -> std::io::Result<R> {
        loop {
            let mut ready = self.io.writable().await?;
            match ready.try_io(|s| op(s.get_ref())) {
                Ok(done) => return done,
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsRawFd for UnixConn {
    fn as_raw_fd(&self) -> RawFd {
        self.socket().as_raw_fd()
    }
}

impl AsFd for UnixConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket().as_fd()
    }
}

impl AsyncRead for UnixConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let mut ready = ready!(self.io.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match ready.try_io(|s| s.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for UnixConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            let mut ready = ready!(self.io.poll_write_ready(cx))?;
            match ready.try_io(|s| s.get_ref().write(buf)) {
                Ok(done) => return Poll::Ready(done),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(self.socket().shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

    /// More bytes than the socket's buffers hold, both ways at once: each
    /// side's writes must wait for the other to read, and nothing is lost
    /// or reordered.
    #[tokio::test]
    async fn writes_that_fill_the_buffer_wait_for_the_reader_and_arrive_whole() {
        let (mut a, mut b) = UnixConn::pair().unwrap();
        let data: Vec<u8> = (0..8 << 20).map(|k: u32| (k.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let (mut ar, mut br) = (vec![0u8; data.len()], vec![0u8; data.len()]);
        let a_side = async {
            a.write_all(&data).await.unwrap();
            a.read_exact(&mut ar).await.unwrap();
            a
        };
        let b_side = async {
            // Reads first, so that `a`'s writes fill the buffer and wait.
            b.read_exact(&mut br).await.unwrap();
            b.write_all(&data).await.unwrap();
            b
        };
        // A write whose wait for buffer space were never woken would hang.
        let (a, mut b) = tokio::time::timeout(LIMIT, async { tokio::join!(a_side, b_side) }).await.expect("both sides finish");
        assert!(ar == data && br == data);
        // A closed peer reads as the end of the stream, not as a wait.
        drop(a);
        assert_eq!(b.read(&mut [0u8; 4]).await.unwrap(), 0);
    }

    /// `write_with` and `read_with` carry an operation through a full
    /// buffer and an empty one.
    #[tokio::test]
    async fn an_operation_goes_through_once_the_socket_is_ready() {
        let (a, b) = UnixConn::pair().unwrap();
        let chunk = vec![7u8; 1 << 20];
        let writer = async {
            let mut sent = 0;
            while sent < 16 << 20 {
                let piece = &chunk[..(16 << 20) - sent.max(15 << 20)];
                sent += a.write_with(|s| (&*s).write(piece)).await.unwrap();
            }
            sent
        };
        let reader = async {
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < 16 << 20 {
                let want = buf.len().min((16 << 20) - got);
                let n = b.read_with(|s| (&*s).read(&mut buf[..want])).await.unwrap();
                assert!(n > 0 && buf[..n].iter().all(|&x| x == 7));
                got += n;
            }
            got
        };
        let (sent, got) = tokio::time::timeout(LIMIT, async { tokio::join!(writer, reader) }).await.expect("both sides finish");
        assert_eq!((sent, got), (16 << 20, 16 << 20));
    }
}
