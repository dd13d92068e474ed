//! The wire layer: reliable framed connections between the processes of a
//! group, one progress thread per process, per-peer send queues under one
//! per-process byte budget.
//!
//! API boundary: `Wire` is the only thing the BSPlib layer sees. Its contract
//! is the messaging layer of `000…` Table 3.2 cut down to what `sync` needs:
//! an all-or-nothing `send` that blocks (with back-pressure) while the budget
//! is spent, a per-source FIFO `recv`, `abort`, and a clean `close`.

pub(crate) mod frame;
pub(crate) mod handshake;
pub(crate) mod mesh;
pub(crate) mod progress;

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::cell::Cell;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::error::BspError;
use frame::{InFrame, Kind, OutFrame, Payload};
use progress::{Gone, Pool, Progress, Shared, State, Timing};

pub(crate) struct Wire {
    me: usize,
    n: usize,
    shared: Arc<Shared>,
    wake: UnixStream,
    budget: usize,
    thread: Option<JoinHandle<()>>,
    engine: Arc<Mutex<Progress>>,
    /// Between `drive_begin` and `drive_end`: this thread runs the rounds.
    driving: Cell<bool>,
    pool: Arc<Pool>,
}

impl Wire {
    pub(crate) fn start(me: usize, socks: Vec<Option<TcpStream>>, budget: usize, timing: Timing) -> Result<Wire, BspError> {
        let n = socks.len();
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                inbox: (0..n).map(|_| VecDeque::new()).collect(),
                outq: (0..n).map(|_| VecDeque::new()).collect(),
                queued_bytes: 0,
                borrowed_outstanding: 0,
                gone: vec![None; n],
                abort: None,
                next_seq: 0,
                stopping: false,
                stop_now: false,
                exited: false,
                user_driving: false,
                drive_ended: None,
                first_lost: None,
                progress_parked: false,
                progress_wanted: false,
            }),
            cv: Condvar::new(),
            park_cv: Condvar::new(),
        });
        let (a, b) = UnixStream::pair()?;
        a.set_nonblocking(true)?;
        let pool = Arc::new(Pool::new());
        let engine = Arc::new(Mutex::new(Progress::new(me, socks, b, shared.clone(), timing, pool.clone())?));
        let (e2, s2) = (engine.clone(), shared.clone());
        let thread = std::thread::Builder::new().name(format!("bsp-progress-{me}")).spawn(move || progress::run_thread(e2, s2))?;
        Ok(Wire { me, n, shared, wake: a, budget, thread: Some(thread), engine, driving: Cell::new(false), pool })
    }

    /// Hands a received payload back for reuse.
    pub(crate) fn recycle(&self, v: Vec<u8>) {
        self.pool.give(v);
    }

    /// From here until `drive_end` the calling thread, which is about to
    /// block in `sync` anyway, does the socket work itself instead of
    /// handing every frame to the progress thread and back: on a small
    /// machine those two thread switches per message are most of the
    /// latency of a barrier. The progress thread parks meanwhile; it takes
    /// over again when the caller goes back to computing.
    pub(crate) fn drive_begin(&self) {
        let parked = {
            let mut st = self.shared.st.lock();
            st.user_driving = true;
            st.progress_parked
        };
        if !parked {
            // It may be blocked in poll, holding the engine: wake it so it lets go.
            progress::poke(&self.wake);
        }
        self.driving.set(true);
    }

    /// Wakes the progress thread, unless this thread is the one driving.
    fn wake_progress(&self) {
        if !self.driving.get() {
            progress::poke(&self.wake);
        }
    }

    pub(crate) fn drive_end(&self) {
        self.driving.set(false);
        let mut st = self.shared.st.lock();
        st.user_driving = false;
        st.drive_ended = Some(Instant::now());
    }

    /// Waits for the progress thread's next publication, or, while driving,
    /// runs one round (which blocks in `poll` until something happens).
    fn wait(&self, st: &mut MutexGuard<'_, State>) {
        if self.driving.get() {
            MutexGuard::unlocked(st, || {
                let _ = self.engine.lock().round(true);
            });
        } else {
            if st.progress_parked {
                st.progress_wanted = true;
                self.shared.park_cv.notify_all();
            }
            self.shared.cv.wait(st);
        }
    }

    /// The group-level error, if any: abort first, then any lost peer.
    fn group_error(st: &State) -> Option<BspError> {
        if let Some((pid, message)) = &st.abort {
            return Some(BspError::Aborted { pid: *pid, message: message.clone() });
        }
        if let Some((pid, reason)) = &st.first_lost {
            return Some(BspError::PeerLost { pid: *pid, reason: reason.clone() });
        }
        if st.exited {
            return Some(BspError::Closed);
        }
        None
    }

    /// Queues a frame for `to`, blocking while the per-process budget is spent.
    /// All or nothing: the frame is queued whole or not at all. A frame larger
    /// than the whole budget is admitted when nothing else is queued, so any
    /// size makes progress.
    pub(crate) fn send(&self, to: usize, mut f: OutFrame) -> Result<(), BspError> {
        debug_assert_ne!(to, self.me);
        let len = f.total_len();
        let mut st = self.shared.st.lock();
        loop {
            if let Some(e) = Self::group_error(&st) {
                return Err(e);
            }
            if let Some(Gone::Departed) = st.gone[to] {
                return Err(BspError::PeerLost { pid: to, reason: "left the group".into() });
            }
            if st.queued_bytes == 0 || st.queued_bytes + len <= self.budget {
                break;
            }
            self.wait(&mut st);
        }
        f.seq = st.next_seq;
        st.next_seq += 1;
        st.queued_bytes += len;
        st.borrowed_outstanding += f.is_borrowed() as usize;
        st.outq[to].push_back(f);
        drop(st);
        self.wake_progress();
        Ok(())
    }

    /// Queues one frame per destination with a single wake-up of the
    /// progress thread (the count exchange sends p−1 tiny frames at once).
    pub(crate) fn send_all(&self, frames: Vec<(usize, OutFrame)>) -> Result<(), BspError> {
        let mut st = self.shared.st.lock();
        for (to, mut f) in frames {
            let len = f.total_len();
            loop {
                if let Some(e) = Self::group_error(&st) {
                    return Err(e);
                }
                if let Some(Gone::Departed) = st.gone[to] {
                    return Err(BspError::PeerLost { pid: to, reason: "left the group".into() });
                }
                if st.queued_bytes == 0 || st.queued_bytes + len <= self.budget {
                    break;
                }
                self.wake_progress();
                self.wait(&mut st);
            }
            f.seq = st.next_seq;
            st.next_seq += 1;
            st.queued_bytes += len;
            st.borrowed_outstanding += f.is_borrowed() as usize;
            st.outq[to].push_back(f);
        }
        drop(st);
        self.wake_progress();
        Ok(())
    }

    /// Next frame from `from`, in order. Fails fast on any group error.
    pub(crate) fn recv(&self, from: usize) -> Result<InFrame, BspError> {
        let mut st = self.shared.st.lock();
        loop {
            if let Some(f) = st.inbox[from].pop_front() {
                return Ok(f);
            }
            if let Some(e) = Self::group_error(&st) {
                return Err(e);
            }
            if let Some(Gone::Departed) = st.gone[from] {
                return Err(BspError::PeerLost { pid: from, reason: "left the group".into() });
            }
            self.wait(&mut st);
        }
    }

    /// The group error, without waiting.
    #[allow(dead_code)]
    pub(crate) fn check(&self) -> Result<(), BspError> {
        match Self::group_error(&self.shared.st.lock()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits until every borrowed payload has been written or dropped, so
    /// the memory it points into may be touched again.
    pub(crate) fn wait_borrowed(&self) {
        let mut st = self.shared.st.lock();
        while st.borrowed_outstanding > 0 && !st.exited {
            self.wait(&mut st);
        }
    }

    /// Sends `Abort` to every live peer and gives it a moment to leave.
    pub(crate) fn abort(&self, message: &str) {
        self.send_abort(self.me, message);
        let mut st = self.shared.st.lock();
        if st.abort.is_none() {
            st.abort = Some((self.me, message.to_string()));
        }
    }

    /// Passes on an abort that came from `origin` before this process
    /// leaves: a peer that has not heard it yet would otherwise see our
    /// connection close first and report a lost peer instead of the abort
    /// (frames on one connection keep their order; across two they do not).
    pub(crate) fn forward_abort(&self, origin: usize, message: &str) {
        self.send_abort(origin, message);
    }

    /// `Abort` frames name their origin in `aux` (pid + 1), so a forwarded
    /// one reports the process that aborted, not the one that passed it on.
    fn send_abort(&self, origin: usize, message: &str) {
        for p in (0..self.n).filter(|&p| p != self.me) {
            let f = OutFrame::new(Kind::Abort, 0, origin as u32 + 1, Vec::new(), Payload::Owned(message.as_bytes().to_vec()));
            let _ = self.send_unchecked(p, f);
        }
    }

    fn send_unchecked(&self, to: usize, mut f: OutFrame) -> Result<(), BspError> {
        let mut st = self.shared.st.lock();
        if st.gone[to].is_some() {
            return Ok(());
        }
        f.seq = st.next_seq;
        st.next_seq += 1;
        st.queued_bytes += f.total_len();
        st.outq[to].push_back(f);
        drop(st);
        progress::poke(&self.wake);
        Ok(())
    }

    /// Clean shutdown: `Bye` to every live peer, flush (bounded by `flush`), join.
    pub(crate) fn close(&mut self, flush: Duration) {
        for p in (0..self.n).filter(|&p| p != self.me) {
            let _ = self.send_unchecked(p, OutFrame::new(Kind::Bye, 0, 0, Vec::new(), Payload::Owned(Vec::new())));
        }
        let deadline = Instant::now() + flush;
        {
            let mut st = self.shared.st.lock();
            st.stopping = true;
        }
        self.shared.park_cv.notify_all();
        progress::poke(&self.wake);
        let mut st = self.shared.st.lock();
        while !st.exited {
            if self.shared.cv.wait_until(&mut st, deadline).timed_out() {
                st.stop_now = true;
                break;
            }
        }
        drop(st);
        progress::poke(&self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Immediate teardown after a failure: queues dropped, thread joined.
    pub(crate) fn kill(&mut self) {
        self.shared.st.lock().stop_now = true;
        self.shared.park_cv.notify_all();
        progress::poke(&self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.kill();
        }
    }
}
