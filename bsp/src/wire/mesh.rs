//! Forming a group: every pair of processes gets one authenticated TCP
//! connection. The higher pid connects, the lower accepts, so each pair is
//! set up exactly once and setup cannot deadlock (accepting runs on its own
//! thread while connecting proceeds).
//!
//! Also the launcher's rendezvous: processes started on one machine do not
//! know each other's ports, so each binds port 0, reports its address to the
//! launcher, and receives the full host list back.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::handshake::{self, Hello, ACCEPTED, BAD_GROUP};
use crate::error::BspError;

/// A bound listening socket, created before the group is formed so that its
/// address can be published (in a host list, or to a launcher).
pub struct Endpoint {
    pub(crate) listener: TcpListener,
    addr: SocketAddr,
}

impl Endpoint {
    /// Binds `addr` (use `127.0.0.1:0` for an ephemeral loopback port).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<Endpoint, BspError> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        Ok(Endpoint { listener, addr })
    }
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Waits until `fd` is readable or `deadline` passes.
fn wait_readable(fd: i32, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
    rc > 0
}

fn tune(s: &TcpStream) -> Result<(), BspError> {
    s.set_nodelay(true)?;
    Ok(())
}

/// Connects this process to all others. Returns one stream per pid (None
/// for our own).
pub(crate) fn connect_mesh(
    ep: Endpoint,
    hosts: &[String],
    me: usize,
    token: &[u8],
    timeout: Duration,
) -> Result<Vec<Option<TcpStream>>, BspError> {
    let n = hosts.len();
    let deadline = Instant::now() + timeout;
    let tok = token.to_vec();
    let acceptor = std::thread::spawn(move || accept_higher(ep, me, n, &tok, deadline));
    let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let hello = Hello { token: token.to_vec(), pid: me as u32, nprocs: n as u32, addr: String::new() };
    let mut first_err = None;
    for (j, host) in hosts.iter().enumerate().take(me) {
        match connect_one(host, &hello, deadline) {
            Ok(s) => socks[j] = Some(s),
            Err(e) => {
                first_err = Some(e);
                break;
            }
        }
    }
    let accepted = acceptor.join().map_err(|_| BspError::Setup("acceptor panicked".into()))?;
    if let Some(e) = first_err {
        return Err(e);
    }
    for (j, s) in accepted? {
        socks[j] = Some(s);
    }
    Ok(socks)
}

fn connect_one(host: &str, hello: &Hello, deadline: Instant) -> Result<TcpStream, BspError> {
    let mut backoff = Duration::from_millis(5);
    loop {
        let attempt = (|| {
            let addr = host.to_socket_addrs()?.next().ok_or_else(|| BspError::Setup(format!("cannot resolve {host}")))?;
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
            let mut s = TcpStream::connect_timeout(&addr, left)?;
            tune(&s)?;
            handshake::client(&mut s, hello, host, left)?;
            Ok::<_, BspError>(s)
        })();
        match attempt {
            Ok(s) => return Ok(s),
            Err(e @ BspError::Auth { .. }) => return Err(e),
            Err(e) if Instant::now() >= deadline => return Err(BspError::Setup(format!("connecting to {host}: {e}"))),
            Err(e) => {
                tracing::debug!(host, error = %e, "connect retry");
                // A peer that has not bound yet: back off (bounded by the deadline).
                std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

fn accept_higher(ep: Endpoint, me: usize, n: usize, token: &[u8], deadline: Instant) -> Result<Vec<(usize, TcpStream)>, BspError> {
    let mut got: Vec<(usize, TcpStream)> = Vec::new();
    let want = n - me - 1;
    // Each connection's hello is read on a thread of its own, so that one
    // that says nothing (until its handshake times out) holds up no other.
    let (done, hellos) = std::sync::mpsc::channel();
    let token: std::sync::Arc<[u8]> = token.into();
    while got.len() < want {
        while let Ok((s, from, hello)) = hellos.try_recv() {
            admit(s, from, hello, me, n, &mut got)?;
        }
        if got.len() >= want {
            break;
        }
        if Instant::now() >= deadline {
            return Err(BspError::Setup(format!("process {me}: only {} of {want} higher peers connected in time", got.len())));
        }
        // A short wait, so that the hellos read meanwhile are taken in time.
        if !wait_readable(ep.listener.as_raw_fd(), (Instant::now() + Duration::from_millis(5)).min(deadline)) {
            continue;
        }
        let (mut s, from) = match ep.listener.accept() {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let hs_timeout = deadline.saturating_duration_since(Instant::now()).min(Duration::from_secs(5)).max(Duration::from_millis(100));
        let (done, token) = (done.clone(), token.clone());
        std::thread::spawn(move || {
            let hello = handshake::server(&mut s, &token, hs_timeout);
            // The group may have formed without it: then nobody listens.
            let _ = done.send((s, from, hello));
        });
    }
    Ok(got)
}

/// Takes a higher peer whose hello was read (`hello`) into the group, or
/// refuses the connection: a foreign or broken client, or a hello that
/// does not fit this group.
fn admit(
    mut s: TcpStream,
    from: SocketAddr,
    hello: Result<Hello, BspError>,
    me: usize,
    n: usize,
    got: &mut Vec<(usize, TcpStream)>,
) -> Result<(), BspError> {
    match hello {
        Ok(h) => {
            let pid = h.pid as usize;
            if h.nprocs as usize != n || pid <= me || pid >= n || got.iter().any(|(q, _)| *q == pid) {
                tracing::warn!(%from, pid, nprocs = h.nprocs, "hello does not fit this group, refused");
                let _ = s.write_all(&[BAD_GROUP]);
                return Ok(());
            }
            s.write_all(&[ACCEPTED])?;
            tune(&s)?;
            got.push((pid, s));
        }
        // Refused; the group goes on forming.
        Err(e) => tracing::warn!(%from, error = %e, "connection refused during group setup"),
    }
    Ok(())
}

/// The launcher's side of the rendezvous: collects `n` hellos carrying
/// listen addresses, then sends everyone the full list.
pub(crate) fn rendezvous_serve(listener: &TcpListener, n: usize, token: &[u8], timeout: Duration) -> Result<Vec<String>, BspError> {
    let deadline = Instant::now() + timeout;
    let mut conns: Vec<Option<(TcpStream, String)>> = (0..n).map(|_| None).collect();
    let mut have = 0;
    while have < n {
        if !wait_readable(listener.as_raw_fd(), deadline) {
            return Err(BspError::Setup(format!("rendezvous: {have} of {n} processes reported in time")));
        }
        let (mut s, from) = listener.accept()?;
        match handshake::server(&mut s, token, Duration::from_secs(5)) {
            Ok(h) if (h.pid as usize) < n && h.nprocs as usize == n && conns[h.pid as usize].is_none() => {
                conns[h.pid as usize] = Some((s, h.addr));
                have += 1;
            }
            Ok(h) => {
                tracing::warn!(%from, pid = h.pid, "rendezvous hello does not fit, refused");
                let _ = s.write_all(&[BAD_GROUP]);
            }
            Err(e) => tracing::warn!(%from, error = %e, "rendezvous connection refused"),
        }
    }
    let hosts: Vec<String> = conns.iter().map(|c| c.as_ref().expect("all present").1.clone()).collect();
    let mut reply = vec![ACCEPTED];
    reply.extend_from_slice(&(n as u32).to_le_bytes());
    for h in &hosts {
        reply.extend_from_slice(&(h.len() as u16).to_le_bytes());
        reply.extend_from_slice(h.as_bytes());
    }
    for (s, _) in conns.iter_mut().flatten() {
        s.write_all(&reply)?;
    }
    Ok(hosts)
}

/// A process's side of the rendezvous.
pub(crate) fn rendezvous_join(at: &str, hello: &Hello, timeout: Duration) -> Result<Vec<String>, BspError> {
    let deadline = Instant::now() + timeout;
    let addr = at.to_socket_addrs()?.next().ok_or_else(|| BspError::Setup(format!("cannot resolve {at}")))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10))))?;
    s.write_all(&hello.encode())?;
    let proto = |d: String| BspError::Protocol { from: at.to_string(), detail: d };
    let mut v = [0u8; 1];
    s.read_exact(&mut v).map_err(|e| proto(format!("rendezvous verdict: {e}")))?;
    if v[0] == handshake::BAD_TOKEN {
        return Err(BspError::Auth { from: at.into() });
    }
    if v[0] != ACCEPTED {
        return Err(BspError::Setup(format!("rendezvous refused us ({})", v[0])));
    }
    let mut c = [0u8; 4];
    s.read_exact(&mut c).map_err(|e| proto(e.to_string()))?;
    let n = u32::from_le_bytes(c) as usize;
    if n > 1 << 16 {
        return Err(proto(format!("{n} hosts")));
    }
    let mut hosts = Vec::with_capacity(n);
    for _ in 0..n {
        let mut l = [0u8; 2];
        s.read_exact(&mut l).map_err(|e| proto(e.to_string()))?;
        let mut b = vec![0u8; u16::from_le_bytes(l) as usize];
        s.read_exact(&mut b).map_err(|e| proto(e.to_string()))?;
        hosts.push(String::from_utf8(b).map_err(|_| proto("host not utf-8".into()))?);
    }
    Ok(hosts)
}
