//! The progress thread: one per process, owning every group socket.
//!
//! Why a thread and not the caller: a process busy in a long computation (a
//! BLAS call, say) must keep reading what its peers send, or their sends back
//! up and the whole group stalls (`001…` §7). It is also what makes the
//! flood-everyone pattern deadlock free: this thread always reads every
//! readable socket, whatever the user thread is blocked on, which is the
//! "drain your receives while a send is refused" rule of `000…` §3.2 done
//! structurally instead of by each caller.
//!
//! Data flow: the user thread appends `OutFrame`s to per-peer queues in
//! `State` (admission limited by one per-process byte budget) and pokes the
//! wake socket; this thread moves them to its own queues, writes them with
//! `writev` in global enqueue order, and parses incoming bytes into `InFrame`s
//! that it appends to per-peer inboxes. Everything shared sits behind one
//! mutex and one condvar; the critical sections never include a syscall.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::frame::{Header, InFrame, Kind, OutFrame, HEADER_LEN};

const STAGE: usize = 256 * 1024;
const MAX_IOV: usize = 64;
/// How long the progress thread stays parked after the user thread leaves `sync`.
const LINGER: Duration = Duration::from_millis(1);
/// How often a parked progress thread looks whether the caller has left `sync`:
/// the longest a computing caller waits for its progress thread to resume.
const PARKED_CHECK: Duration = Duration::from_millis(10);

/// Recycled payload buffers. Large payloads come every superstep in the
/// same sizes; a fresh vector each time is an mmap, page faults and a
/// munmap per frame (a fifth of the CPU time of a p = 8 total exchange).
pub(crate) struct Pool {
    bufs: Mutex<Vec<Vec<u8>>>,
}

const POOL_MIN: usize = 16 * 1024;
const POOL_MAX_BUFS: usize = 64;

impl Pool {
    pub(crate) fn new() -> Pool {
        Pool { bufs: Mutex::new(Vec::new()) }
    }

    /// A zero-initialised-or-reused vector of exactly `len` bytes (its
    /// contents are overwritten by the read, so stale bytes are fine).
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        if len >= POOL_MIN {
            let mut bufs = self.bufs.lock();
            if let Some(i) = bufs.iter().position(|b| b.capacity() >= len) {
                let mut v = bufs.swap_remove(i);
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, 0);
                }
                return v;
            }
        }
        vec![0u8; len]
    }

    pub(crate) fn give(&self, v: Vec<u8>) {
        if v.capacity() >= POOL_MIN {
            let mut bufs = self.bufs.lock();
            if bufs.len() < POOL_MAX_BUFS {
                bufs.push(v);
            }
        }
    }
}

/// Why a peer is gone.
#[derive(Clone, Debug)]
pub(crate) enum Gone {
    /// Sent `Bye` and closed: fine unless we still need its frames.
    Departed,
    /// Connection failed, closed without `Bye`, spoke garbage, or went silent.
    Lost(String),
}

pub(crate) struct State {
    pub(crate) inbox: Vec<VecDeque<InFrame>>,
    pub(crate) outq: Vec<VecDeque<OutFrame>>,
    pub(crate) queued_bytes: usize,
    pub(crate) borrowed_outstanding: usize,
    pub(crate) gone: Vec<Option<Gone>>,
    pub(crate) abort: Option<(usize, String)>,
    pub(crate) next_seq: u64,
    /// Flush what is queued, then exit.
    pub(crate) stopping: bool,
    /// Exit now, dropping queues.
    pub(crate) stop_now: bool,
    pub(crate) exited: bool,
    /// The user thread is running rounds itself; the thread stays parked.
    pub(crate) user_driving: bool,
    pub(crate) drive_ended: Option<Instant>,
    /// The first peer lost: the one to blame (later losses may be cascades).
    pub(crate) first_lost: Option<(usize, String)>,
    /// The progress thread is waiting on the condvar, not in poll.
    pub(crate) progress_parked: bool,
    /// A caller outside `sync` is blocked on the progress thread (budget):
    /// stop lingering.
    pub(crate) progress_wanted: bool,
}

pub(crate) struct Shared {
    pub(crate) st: Mutex<State>,
    /// Wakes the user thread (frames in, budget freed, peer lost).
    pub(crate) cv: Condvar,
    /// Wakes a parked progress thread (stop). Separate from `cv` so that
    /// publishing frames to a driving caller does not wake the parked
    /// thread every time for nothing.
    pub(crate) park_cv: Condvar,
}

pub(crate) struct Timing {
    /// How long a caller blocked in `sync` polls before sleeping.
    pub(crate) spin: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) peer_timeout: Duration,
    pub(crate) max_frame: u32,
}

struct Reader {
    stage: Vec<u8>,
    s: usize,
    e: usize,
    hdr: Option<Header>,
    payload: Vec<u8>,
    filled: usize,
}

enum ReadOutcome {
    Open,
    Eof,
}

impl Reader {
    fn new() -> Reader {
        Reader { stage: vec![0; STAGE], s: 0, e: 0, hdr: None, payload: Vec::new(), filled: 0 }
    }

    /// Reads what the socket has, appending complete frames to `out`. Small
    /// frames are parsed out of one staging buffer (many per `read`); a
    /// large payload is read straight into its own exact-size vector.
    fn read_ready(&mut self, sock: &mut TcpStream, max_frame: u32, pool: &Pool, out: &mut Vec<InFrame>) -> io::Result<ReadOutcome> {
        let mut budget = 8 * STAGE; // fairness between peers in one round
                                    // A short read means the socket is empty: parse what we have and
                                    // stop, instead of paying one more read() just to see EAGAIN.
        let mut drained = false;
        loop {
            match self.hdr {
                None => {
                    if self.e - self.s >= HEADER_LEN {
                        let hb: &[u8; HEADER_LEN] = self.stage[self.s..self.s + HEADER_LEN].try_into().expect("len");
                        let h = Header::decode(hb, max_frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                        self.s += HEADER_LEN;
                        self.payload = pool.take(h.len as usize);
                        self.filled = 0;
                        self.hdr = Some(h);
                        continue;
                    }
                }
                Some(h) => {
                    let need = h.len as usize - self.filled;
                    let take = need.min(self.e - self.s);
                    self.payload[self.filled..self.filled + take].copy_from_slice(&self.stage[self.s..self.s + take]);
                    self.s += take;
                    self.filled += take;
                    if self.filled == h.len as usize {
                        out.push(InFrame { header: h, payload: std::mem::take(&mut self.payload) });
                        self.hdr = None;
                        continue;
                    }
                    if need - take >= STAGE / 2 {
                        // Large remainder: no staging copy.
                        if drained {
                            return Ok(ReadOutcome::Open);
                        }
                        let want = self.payload.len() - self.filled;
                        match sock.read(&mut self.payload[self.filled..]) {
                            Ok(0) => return Ok(ReadOutcome::Eof),
                            Ok(n) => {
                                drained = n < want;
                                self.filled += n;
                                budget = budget.saturating_sub(n);
                                if budget == 0 {
                                    return Ok(ReadOutcome::Open);
                                }
                                continue;
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Open),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            // Refill the staging buffer.
            if self.s == self.e {
                self.s = 0;
                self.e = 0;
            } else if self.s > 0 {
                self.stage.copy_within(self.s..self.e, 0);
                self.e -= self.s;
                self.s = 0;
            }
            if drained {
                return Ok(ReadOutcome::Open);
            }
            let want = self.stage.len() - self.e;
            match sock.read(&mut self.stage[self.e..]) {
                Ok(0) => return Ok(ReadOutcome::Eof),
                Ok(n) => {
                    drained = n < want;
                    self.e += n;
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        // Parse what we have on the next call; the socket is
                        // still readable so poll returns at once.
                        return Ok(ReadOutcome::Open);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

struct Peer {
    sock: Option<TcpStream>,
    reader: Reader,
    queue: VecDeque<OutFrame>,
    /// Bytes of the head frame already written.
    head_off: usize,
    last_recv: Instant,
    last_send: Instant,
}

pub(crate) struct Progress {
    me: usize,
    peers: Vec<Peer>,
    wake: UnixStream,
    shared: Arc<Shared>,
    timing: Timing,
    half_closed: bool,
    spin: Duration,
    pool: Arc<Pool>,
}

/// Outcome of one round, published under the lock.
#[derive(Default)]
struct Round {
    frames: Vec<(usize, InFrame)>,
    written_bytes: usize,
    borrowed_done: usize,
    gone: Vec<(usize, Gone)>,
}

impl Progress {
    pub(crate) fn new(
        me: usize,
        socks: Vec<Option<TcpStream>>,
        wake: UnixStream,
        shared: Arc<Shared>,
        timing: Timing,
        pool: Arc<Pool>,
    ) -> io::Result<Progress> {
        wake.set_nonblocking(true)?;
        let now = Instant::now();
        let mut peers = Vec::new();
        for s in socks {
            if let Some(s) = &s {
                s.set_nonblocking(true)?;
            }
            peers.push(Peer { sock: s, reader: Reader::new(), queue: VecDeque::new(), head_off: 0, last_recv: now, last_send: now });
        }
        Ok(Progress { me, peers, wake, shared, spin: timing.spin, timing, half_closed: false, pool })
    }

    /// One round of progress: take queued frames, write optimistically,
    /// poll, read, write, heartbeats, publish. Returns true when the engine
    /// should stop. Called by the progress thread, or by the user thread
    /// itself while it is blocked inside `sync` (see `Wire::drive_begin`).
    pub(crate) fn round(&mut self, spin: bool) -> bool {
        {
            let mut round = Round::default();
            // Take new frames; decide whether to stop.
            {
                let mut st = self.shared.st.lock();
                if st.stop_now {
                    return true;
                }
                for (p, peer) in self.peers.iter_mut().enumerate() {
                    let q = &mut st.outq[p];
                    if peer.sock.is_none() {
                        // Peer gone: drop what was queued for it.
                        for f in q.drain(..) {
                            round.written_bytes += f.total_len();
                            round.borrowed_done += f.is_borrowed() as usize;
                        }
                    } else {
                        peer.queue.extend(q.drain(..));
                    }
                }
                if st.stopping && self.peers.iter().all(|p| p.queue.is_empty() || p.sock.is_none()) {
                    // Everything (our Bye included) is written. Half-close and
                    // read until every peer has closed too: closing a socket
                    // with unread bytes sends RST, and an RST can destroy the
                    // peer's own unread frames from us.
                    if !self.half_closed {
                        self.half_closed = true;
                        for peer in &self.peers {
                            if let Some(s) = &peer.sock {
                                let _ = s.shutdown(std::net::Shutdown::Write);
                            }
                        }
                    }
                    if self.peers.iter().all(|p| p.sock.is_none()) {
                        return true;
                    }
                }
                if round.written_bytes > 0 {
                    st.queued_bytes -= round.written_bytes;
                    st.borrowed_outstanding -= round.borrowed_done;
                    self.shared.cv.notify_all();
                }
                round = Round::default();
            }

            // Optimistic writes: a socket with room takes them without a poll first.
            let all = vec![true; self.peers.len()];
            self.write_pass(all, &mut round);

            // Poll.
            let mut fds = vec![libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
            let mut idx = Vec::new();
            for (p, peer) in self.peers.iter().enumerate() {
                if let Some(s) = &peer.sock {
                    let mut ev = libc::POLLIN;
                    if !peer.queue.is_empty() {
                        ev |= libc::POLLOUT;
                    }
                    fds.push(libc::pollfd { fd: s.as_raw_fd(), events: ev, revents: 0 });
                    idx.push(p);
                }
            }
            let timeout = (self.timing.heartbeat.as_millis() as i32 / 2).max(1);
            // A caller blocked in `sync` spins a little (poll without
            // sleeping, yielding the core between tries) before it sleeps:
            // a sleep/wake-up pair costs more than a small message's whole
            // trip over loopback. The progress thread never spins.
            // If the optimistic writes already freed budget, do not block in
            // poll: end the round and publish, someone may be waiting for it.
            let timeout = if round.written_bytes > 0 || round.borrowed_done > 0 { 0 } else { timeout };
            let spin_until = spin.then(|| Instant::now() + self.spin);
            let rc = loop {
                let spinning = timeout != 0 && spin_until.is_some_and(|u| Instant::now() < u);
                let t = if spinning { 0 } else { timeout };
                // SAFETY: `fds` is a live, correctly sized array of pollfd.
                let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, t) };
                if rc != 0 || !spinning {
                    break rc;
                }
                std::thread::yield_now();
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "poll failed");
                    return true;
                }
                self.publish(round);
                return false;
            }
            if fds[0].revents != 0 {
                let mut buf = [0u8; 256];
                while matches!(self.wake.read(&mut buf), Ok(n) if n > 0) {}
            }

            // Reads.
            let mut writable = vec![false; self.peers.len()];
            for (k, &p) in idx.iter().enumerate() {
                let rev = fds[k + 1].revents;
                if rev & libc::POLLOUT != 0 {
                    writable[p] = true;
                }
                if rev & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    self.read_peer(p, &mut round);
                }
            }

            self.write_pass(writable, &mut round);

            // Heartbeats and silence.
            let now = Instant::now();
            for p in 0..self.peers.len() {
                let peer = &mut self.peers[p];
                if peer.sock.is_none() {
                    continue;
                }
                if now.duration_since(peer.last_recv) > self.timing.peer_timeout {
                    let silent = now.duration_since(peer.last_recv);
                    self.lose(p, Gone::Lost(format!("silent for {silent:?}")), &mut round);
                    continue;
                }
                if !self.half_closed && peer.queue.is_empty() && now.duration_since(peer.last_send) > self.timing.heartbeat {
                    let mut f = OutFrame::new(Kind::Heartbeat, 0, 0, Vec::new(), super::frame::Payload::Owned(Vec::new()));
                    f.seq = u64::MAX; // not counted against the budget
                    peer.queue.push_back(f);
                    peer.last_send = now;
                }
            }

            self.publish(round);
            false
        }
    }

    /// Writes, lowest global sequence number first, until nothing writable is left.
    fn write_pass(&mut self, mut writable: Vec<bool>, round: &mut Round) {
        loop {
            let next = (0..self.peers.len())
                .filter(|&p| writable[p] && self.peers[p].sock.is_some())
                .filter_map(|p| self.peers[p].queue.front().map(|f| (f.seq, p)))
                .min();
            let Some((_, p)) = next else { break };
            match self.write_peer(p, round) {
                Ok(true) => {}
                Ok(false) => writable[p] = false,
                Err(e) => self.lose(p, Gone::Lost(format!("write failed: {e}")), round),
            }
        }
    }

    fn read_peer(&mut self, p: usize, round: &mut Round) {
        let max = self.timing.max_frame;
        let peer = &mut self.peers[p];
        let Some(sock) = peer.sock.as_mut() else { return };
        let mut got = Vec::new();
        let r = peer.reader.read_ready(sock, max, &self.pool, &mut got);
        if !got.is_empty() {
            peer.last_recv = Instant::now();
        }
        let mut departed = false;
        for f in got {
            match f.header.kind {
                Kind::Heartbeat => {}
                Kind::Bye => departed = true,
                _ => round.frames.push((p, f)),
            }
        }
        match r {
            Ok(ReadOutcome::Open) if !departed => {}
            Ok(ReadOutcome::Open) | Ok(ReadOutcome::Eof) if departed => self.lose(p, Gone::Departed, round),
            Ok(_) if self.half_closed => self.lose(p, Gone::Departed, round),
            Ok(_) => self.lose(p, Gone::Lost("connection closed without bye".into()), round),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::error!(me = self.me, peer = p, error = %e, "protocol error, dropping peer");
                self.lose(p, Gone::Lost(format!("protocol error: {e}")), round)
            }
            Err(e) => self.lose(p, Gone::Lost(format!("read failed: {e}")), round),
        }
    }

    /// Writes from `p`'s queue once. Ok(true): progress, call again; Ok(false): would block.
    fn write_peer(&mut self, p: usize, round: &mut Round) -> io::Result<bool> {
        let peer = &mut self.peers[p];
        let sock = peer.sock.as_mut().expect("checked by caller");
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(MAX_IOV);
        let mut skip = peer.head_off;
        for f in peer.queue.iter() {
            for part in [&f.header[..], &f.prefix[..], f.body.as_slice()] {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                iov.push(IoSlice::new(&part[skip..]));
                skip = 0;
            }
            if iov.len() + 3 > MAX_IOV {
                break;
            }
        }
        let n = match sock.write_vectored(&iov) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        };
        drop(iov);
        peer.last_send = Instant::now();
        let mut left = peer.head_off + n;
        while let Some(f) = peer.queue.front() {
            let t = f.total_len();
            if left < t {
                break;
            }
            left -= t;
            let f = peer.queue.pop_front().expect("front");
            if f.seq != u64::MAX {
                round.written_bytes += t;
            }
            round.borrowed_done += f.is_borrowed() as usize;
        }
        peer.head_off = left;
        Ok(true)
    }

    fn lose(&mut self, p: usize, why: Gone, round: &mut Round) {
        let peer = &mut self.peers[p];
        if let Some(s) = peer.sock.take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Gone::Lost(reason) = &why {
            tracing::warn!(me = self.me, peer = p, reason, "peer lost");
        }
        for f in peer.queue.drain(..) {
            if f.seq != u64::MAX {
                round.written_bytes += f.total_len();
            }
            round.borrowed_done += f.is_borrowed() as usize;
        }
        peer.head_off = 0;
        round.gone.push((p, why));
    }

    fn publish(&mut self, round: Round) {
        if round.frames.is_empty() && round.written_bytes == 0 && round.gone.is_empty() && round.borrowed_done == 0 {
            return;
        }
        let mut st = self.shared.st.lock();
        for (p, f) in round.frames {
            if f.header.kind == Kind::Abort {
                if st.abort.is_none() {
                    // `aux` names the origin of a forwarded abort (pid + 1).
                    let origin = match f.header.aux as usize {
                        0 => p,
                        a => a - 1,
                    };
                    st.abort = Some((origin, String::from_utf8_lossy(&f.payload).into_owned()));
                }
            } else {
                st.inbox[p].push_back(f);
            }
        }
        st.queued_bytes -= round.written_bytes;
        st.borrowed_outstanding -= round.borrowed_done;
        for (p, g) in round.gone {
            if let (Gone::Lost(r), None) = (&g, &st.first_lost) {
                st.first_lost = Some((p, r.clone()));
            }
            if st.gone[p].is_none() {
                st.gone[p] = Some(g);
            }
        }
        self.shared.cv.notify_all();
    }
}

/// The progress thread: rounds, except while the user thread drives.
pub(crate) fn run_thread(engine: Arc<Mutex<Progress>>, shared: Arc<Shared>) {
    let _guard = ExitGuard(shared.clone());
    loop {
        {
            // Stay parked while the user thread drives, and for a moment
            // after: in a loop of back-to-back supersteps taking the engine
            // back between two syncs would cost two thread switches each
            // time. A caller that goes off to compute gets its progress
            // thread back within `LINGER`.
            let mut st = shared.st.lock();
            st.progress_parked = true;
            loop {
                if st.stop_now || st.stopping {
                    break;
                }
                if std::mem::take(&mut st.progress_wanted) && !st.user_driving {
                    break;
                }
                if st.user_driving {
                    // Coarse: every wake-up here is a context switch taken
                    // from the processes doing the superstep.
                    shared.park_cv.wait_for(&mut st, PARKED_CHECK);
                    continue;
                }
                let since = st.drive_ended.map_or(LINGER, |t| t.elapsed());
                if since < LINGER {
                    shared.park_cv.wait_for(&mut st, LINGER - since);
                    continue;
                }
                break;
            }
            st.progress_parked = false;
        }
        if engine.lock().round(false) {
            return;
        }
    }
}

/// Marks the thread exited (even on panic) so no waiter sleeps forever.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let mut st = self.0.st.lock();
        st.exited = true;
        st.borrowed_outstanding = 0;
        self.0.cv.notify_all();
    }
}

/// Writes one byte to the wake socket (ignoring a full socket: a wake-up is
/// already pending then).
pub(crate) fn poke(w: &UnixStream) {
    let _ = (&*w).write(&[1u8]);
}
