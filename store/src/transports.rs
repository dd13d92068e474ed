//! Counts of the node's connections by the way they came in, so that tests
//! and operators can see which path clients took (a client on another host
//! must never reach the node through its Unix sockets).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub(crate) struct Transports {
    pub(crate) data_tcp: AtomicU64,
    pub(crate) data_unix: AtomicU64,
    pub(crate) tcp_sessions: AtomicU64,
    pub(crate) unix_sessions: AtomicU64,
    /// Connections refused at their hello or TLS handshake.
    pub(crate) refused: AtomicU64,
}

impl Transports {
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self, tls: bool) -> store_client::proto::NodeStats {
        store_client::proto::NodeStats {
            data_tcp_connections: self.data_tcp.load(Relaxed),
            data_unix_connections: self.data_unix.load(Relaxed),
            tcp_sessions: self.tcp_sessions.load(Relaxed),
            unix_sessions: self.unix_sessions.load(Relaxed),
            tls,
            refused_connections: self.refused.load(Relaxed),
        }
    }
}
