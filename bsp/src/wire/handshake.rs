//! The hello exchanged on every new connection, before any frame: the group's
//! shared token, who the connector is, and (for the launcher's rendezvous)
//! the address it listens on.
//!
//! ```text
//! "BSPH" | version u16 | token_len u16 | token | pid u32 | nprocs u32 | addr_len u16 | addr (utf-8)
//! reply: one byte, 0 = accepted, 1 = bad token, 2 = wrong group shape
//! ```
//!
//! Architecture invariant: nothing from a connection reaches the group before
//! its hello has been read in full and its token compared in constant time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::error::BspError;

const MAGIC: [u8; 4] = *b"BSPH";
const VERSION: u16 = 1;
const MAX_TOKEN: usize = 4096;
const MAX_ADDR: usize = 512;

pub(crate) const ACCEPTED: u8 = 0;
pub(crate) const BAD_TOKEN: u8 = 1;
pub(crate) const BAD_GROUP: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) token: Vec<u8>,
    pub(crate) pid: u32,
    pub(crate) nprocs: u32,
    pub(crate) addr: String,
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + self.token.len() + self.addr.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.token);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.nprocs.to_le_bytes());
        b.extend_from_slice(&(self.addr.len() as u16).to_le_bytes());
        b.extend_from_slice(self.addr.as_bytes());
        b
    }

    /// Reads a hello; a stream that is not one gives `Protocol`, never a hang
    /// (the caller sets a read timeout) and never a large allocation.
    pub(crate) fn read_from(s: &mut impl Read, from: &str) -> Result<Hello, BspError> {
        let proto = |detail: String| BspError::Protocol { from: from.to_string(), detail };
        let io = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                proto("truncated hello".into())
            } else {
                proto(format!("reading hello: {e}"))
            }
        };
        let mut head = [0u8; 8];
        s.read_exact(&mut head).map_err(io)?;
        if head[0..4] != MAGIC {
            return Err(proto(format!("not a BSP hello (first bytes {:02x?})", &head[0..4])));
        }
        let version = u16::from_le_bytes([head[4], head[5]]);
        if version != VERSION {
            return Err(proto(format!("hello version {version}, expected {VERSION}")));
        }
        let tlen = u16::from_le_bytes([head[6], head[7]]) as usize;
        if tlen > MAX_TOKEN {
            return Err(proto(format!("token of {tlen} bytes")));
        }
        let mut token = vec![0u8; tlen];
        s.read_exact(&mut token).map_err(io)?;
        let mut mid = [0u8; 10];
        s.read_exact(&mut mid).map_err(io)?;
        let pid = u32::from_le_bytes(mid[0..4].try_into().expect("4"));
        let nprocs = u32::from_le_bytes(mid[4..8].try_into().expect("4"));
        let alen = u16::from_le_bytes([mid[8], mid[9]]) as usize;
        if alen > MAX_ADDR {
            return Err(proto(format!("address of {alen} bytes")));
        }
        let mut addr = vec![0u8; alen];
        s.read_exact(&mut addr).map_err(io)?;
        let addr = String::from_utf8(addr).map_err(|_| proto("address is not utf-8".into()))?;
        Ok(Hello { token, pid, nprocs, addr })
    }
}

/// Constant-time comparison, so the time to refuse says nothing about how
/// much of a guessed token was right.
pub(crate) fn token_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Connector side: send our hello, read the verdict.
pub(crate) fn client(s: &mut TcpStream, hello: &Hello, peer: &str, timeout: Duration) -> Result<(), BspError> {
    s.set_read_timeout(Some(timeout))?;
    s.write_all(&hello.encode())?;
    let mut verdict = [0u8; 1];
    s.read_exact(&mut verdict).map_err(|e| BspError::Protocol { from: peer.into(), detail: format!("no hello verdict: {e}") })?;
    s.set_read_timeout(None)?;
    match verdict[0] {
        ACCEPTED => Ok(()),
        BAD_TOKEN => Err(BspError::Auth { from: peer.into() }),
        v => Err(BspError::Setup(format!("{peer} refused us (verdict {v})"))),
    }
}

/// Acceptor side: read a hello under a timeout and check the token. On a bad
/// token the verdict is sent before the error is returned.
pub(crate) fn server(s: &mut TcpStream, token: &[u8], timeout: Duration) -> Result<Hello, BspError> {
    let from = s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    s.set_read_timeout(Some(timeout))?;
    let hello = Hello::read_from(s, &from)?;
    if !token_eq(&hello.token, token) {
        let _ = s.write_all(&[BAD_TOKEN]);
        return Err(BspError::Auth { from });
    }
    s.set_read_timeout(None)?;
    Ok(hello)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_truncation() {
        let h = Hello { token: b"sekret".to_vec(), pid: 3, nprocs: 8, addr: "127.0.0.1:5000".into() };
        let b = h.encode();
        assert_eq!(Hello::read_from(&mut &b[..], "t").unwrap(), h);
        for cut in [0, 3, 8, 12, b.len() - 1] {
            let e = Hello::read_from(&mut &b[..cut], "t").unwrap_err();
            assert!(matches!(e, BspError::Protocol { .. }), "cut {cut}: {e}");
        }
        let e = Hello::read_from(&mut &b"GET / HTTP/1.1\r\n\r\n"[..], "t").unwrap_err();
        assert!(e.to_string().contains("not a BSP hello"), "{e}");
    }

    #[test]
    fn token_compare() {
        assert!(token_eq(b"abc", b"abc"));
        assert!(!token_eq(b"abc", b"abd"));
        assert!(!token_eq(b"abc", b"ab"));
    }
}
