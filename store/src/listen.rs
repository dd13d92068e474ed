//! The gRPC port's incoming connections, with or without TLS.
//!
//! Handshakes run here, each in its own task with a deadline, rather than
//! in tonic's accept loop: a client that never finishes its handshake
//! holds nothing but its task, and no handshake error, whatever its kind,
//! can end the server.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A client must finish its TLS handshake within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections accepted by a task that lives as long as this stream.
pub(crate) struct Accepted<IO> {
    rx: mpsc::Receiver<IO>,
    accept: Option<tokio::task::JoinHandle<()>>,
}

impl<IO> Drop for Accepted<IO> {
    fn drop(&mut self) {
        // Closes the listener with the server.
        if let Some(a) = &self.accept {
            a.abort();
        }
    }
}

impl<IO> Stream for Accepted<IO> {
    type Item = std::io::Result<IO>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|io| io.map(Ok))
    }
}

/// Plain TCP connections.
pub(crate) fn plain(listener: TcpListener) -> Accepted<TcpStream> {
    let (tx, rx) = mpsc::channel(16);
    let listener = std::sync::Arc::new(listener);
    let accept = tokio::spawn(async move {
        loop {
            let s = accepted_from(&listener).await;
            if tx.send(s).await.is_err() {
                return;
            }
        }
    });
    Accepted { rx, accept: Some(accept) }
}

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// TLS connections; handshakes that fail or time out are dropped, logged.
/// Connections that open in plaintext (a client without `--tls-ca`) come
/// out of the second stream, for a server that tells them so.
pub(crate) fn tls(listener: TcpListener, acceptor: TlsAcceptor) -> (Accepted<TlsStream<TcpStream>>, Accepted<TcpStream>) {
    let (tx, rx) = mpsc::channel(16);
    let (plain_tx, plain_rx) = mpsc::channel(16);
    let listener = std::sync::Arc::new(listener);
    let accept = tokio::spawn(async move {
        let mut handshakes = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                s = accepted_from(&listener) => {
                    let (acceptor, tx, plain_tx) = (acceptor.clone(), tx.clone(), plain_tx.clone());
                    handshakes.spawn(async move {
                        let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                        let handshake = async {
                            let mut first = [0u8; 1];
                            if s.peek(&mut first).await? == 1 && first[0] != TLS_HANDSHAKE {
                                return Ok(Err(s));
                            }
                            acceptor.accept(s).await.map(Ok)
                        };
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                            Ok(Ok(Ok(s))) => {
                                let _ = tx.send(s).await;
                            }
                            Ok(Ok(Err(plain))) => {
                                tracing::info!(%peer, "a plaintext client on the TLS port: told to use TLS");
                                let _ = plain_tx.send(plain).await;
                            }
                            Ok(Err(e)) => tracing::info!(%peer, "gRPC TLS handshake refused: {e}"),
                            Err(_) => tracing::info!(%peer, "gRPC TLS handshake not finished in time"),
                        }
                    });
                }
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    (Accepted { rx, accept: Some(accept) }, Accepted { rx: plain_rx, accept: None })
}

async fn accepted_from(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                // Or Nagle holds a response's last small write until the
                // client's delayed ACK, 40 ms later.
                let _ = s.set_nodelay(true);
                return s;
            }
            // Out of descriptors, say: keep serving, try again shortly.
            Err(e) => {
                tracing::warn!("gRPC accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
