//! The BSPlib layer (`002…` Table 1 and App. A, in Rust form).
//!
//! Everything a superstep asks for is recorded locally and only travels
//! inside `sync` (`000…` §5.1):
//! 1. **Get requests** go out first, one frame per destination asked.
//! 2. **Data in schedule order** (`Config::early_data`, the default: right
//!    away, overlapping step 3; otherwise after it): puts and sends to one
//!    destination are combined into one frame; big blocks go as their own
//!    frame, `hpput` ones straight from the source area (no copy).
//!    Destinations are visited in a Latin-square order, `(pid + r) mod p`
//!    in round `r`.
//! 3. **Count exchange = barrier.** A dissemination all-gather of the p×p
//!    matrix of frame counts: ⌈log₂ p⌉ rounds, in round k each process sends
//!    the rows it knows to `pid + 2^k`. Knowing every row means every
//!    process entered `sync`.
//! 4. **Gets are served** right after, from memory no put of this superstep
//!    has touched yet, so every get reads before any put lands.
//! 5. **Completion by counting:** the process leaves once it holds every
//!    frame its column of the matrix announces; it does not wait for its
//!    own sends to be read.
//! 6. Apply: puts by source pid then issue order, get replies, the new BSMP
//!    queue, then registrations and the tag size take effect.
//!
//! While blocked in `sync` the calling thread runs the socket engine itself
//! (see `wire::Wire::drive_begin`); between supersteps the progress thread
//! does.

mod records;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::error::{BspError, Result};
use crate::wire::frame::{InFrame, Kind, OutFrame, Payload};
use crate::wire::mesh::Endpoint;
use crate::wire::progress::Timing;
use crate::wire::Wire;
use records::Record;

/// Destination order inside `sync`, and whether puts are deferred at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Schedule {
    /// Round `r` sends to `(pid + r) mod p`: no two senders target one receiver
    /// in the same round (`000…` §5.1, `002…` §15).
    LatinSquare,
    /// Every process sends to 0, 1, 2, … in turn: the contended order.
    Naive,
    /// No deferral: each put is sent when called (the "immediate" column of
    /// `002…` Table 3); `sync` only exchanges counts.
    Eager,
}

impl std::str::FromStr for Schedule {
    type Err = BspError;
    fn from_str(s: &str) -> Result<Schedule> {
        match s {
            "latin" | "latin-square" => Ok(Schedule::LatinSquare),
            "naive" => Ok(Schedule::Naive),
            "eager" => Ok(Schedule::Eager),
            _ => Err(BspError::Config(format!("unknown schedule {s:?} (latin, naive, eager)"))),
        }
    }
}

/// How a group runs. `token` is required: processes of a group refuse
/// connections that do not present it.
#[derive(Clone, Debug)]
pub struct Config {
    pub token: Vec<u8>,
    /// Bytes that may wait in this process's send queues, all peers together.
    pub budget: usize,
    pub schedule: Schedule,
    /// Puts at least this big get a frame of their own instead of being
    /// copied into the combined buffer.
    pub big_threshold: usize,
    pub heartbeat: Duration,
    /// How long a process blocked in `sync` polls its sockets (yielding the
    /// core between polls) before it sleeps. Zero: sleep at once.
    pub spin: Duration,
    /// A peer silent for this long is lost.
    pub peer_timeout: Duration,
    pub setup_timeout: Duration,
    /// Largest frame accepted from a peer.
    pub max_frame: u32,
    /// Start sending the data (in schedule order) as soon as `sync` starts,
    /// behind the get requests and ahead of the count exchange, instead of
    /// after the barrier. Receivers hold early frames until they have the
    /// counts, so the semantics are the same; the barrier's latency overlaps
    /// the data's. `false` is `000…` §5.1 to the letter.
    pub early_data: bool,
}

impl Config {
    pub fn new(token: impl Into<Vec<u8>>) -> Config {
        Config {
            token: token.into(),
            budget: 16 << 20,
            schedule: Schedule::LatinSquare,
            big_threshold: 64 << 10,
            heartbeat: Duration::from_millis(500),
            spin: Duration::from_micros(200),
            peer_timeout: Duration::from_secs(10),
            setup_timeout: Duration::from_secs(30),
            max_frame: u32::MAX - 64,
            early_data: true,
        }
    }

    /// Token from `STORE_TOKEN`, overrides from `BSP_SCHEDULE`
    /// (`latin`, `naive`, `eager`), `BSP_BUDGET` (bytes) and
    /// `BSP_PEER_TIMEOUT_MS`.
    pub fn from_env() -> Result<Config> {
        let t = std::env::var("STORE_TOKEN").map_err(|_| BspError::Config("STORE_TOKEN is not set".into()))?;
        let mut c = Config::new(t);
        c.apply_env()?;
        Ok(c)
    }

    pub fn apply_env(&mut self) -> Result<()> {
        if let Ok(s) = std::env::var("BSP_SCHEDULE") {
            self.schedule = s.parse()?;
        }
        if let Ok(b) = std::env::var("BSP_BUDGET") {
            self.budget = b.parse().map_err(|_| BspError::Config(format!("BSP_BUDGET={b}")))?;
        }
        if let Ok(b) = std::env::var("BSP_EARLY_DATA") {
            self.early_data = b != "0";
        }
        if let Ok(b) = std::env::var("BSP_SPIN_US") {
            self.spin = Duration::from_micros(b.parse().map_err(|_| BspError::Config(format!("BSP_SPIN_US={b}")))?);
        }
        if let Ok(b) = std::env::var("BSP_PEER_TIMEOUT_MS") {
            self.peer_timeout = Duration::from_millis(b.parse().map_err(|_| BspError::Config(format!("BSP_PEER_TIMEOUT_MS={b}")))?);
        }
        Ok(())
    }
}

/// A registered memory area: the registration's sequence number, the same on
/// every process because all processes register in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Area(u32);

struct AreaBuf {
    /// u64 words so typed views of f64/u64 are aligned.
    words: Vec<u64>,
    len: usize,
    registered: bool,
}

impl AreaBuf {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

enum Big {
    Owned(Vec<u8>),
    Hp { src: u32, off: usize, len: usize },
}

struct Outgoing {
    combined: Vec<u8>,
    big: Vec<([u8; records::PUT_HEAD], Big)>,
    gets: Vec<u8>,
    /// (local area, offset, len) per get request, in order.
    get_dst: Vec<(u32, u64, u64)>,
    eager: u32,
}

impl Outgoing {
    fn new() -> Outgoing {
        Outgoing { combined: Vec::new(), big: Vec::new(), gets: Vec::new(), get_dst: Vec::new(), eager: 0 }
    }
}

/// A BSMP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub tag: Vec<u8>,
    pub payload: Vec<u8>,
}

/// One process of a BSP group.
pub struct Bsp {
    pid: usize,
    n: usize,
    cfg: Config,
    wire: Option<Wire>,
    start: Instant,
    step: u64,
    areas: Vec<Option<AreaBuf>>,
    pending_pop: Vec<u32>,
    out: Vec<Outgoing>,
    queue: VecDeque<Message>,
    tagsize: usize,
    next_tagsize: usize,
    failed: Option<String>,
}

impl Bsp {
    /// Forms a group from a host list: `hosts[i]` is where process `i`
    /// listens; `ep` is this process's bound endpoint (`hosts[pid]`).
    pub fn connect(ep: Endpoint, hosts: &[String], pid: usize, cfg: Config) -> Result<Bsp> {
        if cfg.token.is_empty() {
            return Err(BspError::Config("empty token".into()));
        }
        if pid >= hosts.len() {
            return Err(BspError::BadPid { pid, nprocs: hosts.len() });
        }
        let n = hosts.len();
        let wire = if n > 1 {
            let socks = crate::wire::mesh::connect_mesh(ep, hosts, pid, &cfg.token, cfg.setup_timeout)?;
            let timing = Timing { spin: cfg.spin, heartbeat: cfg.heartbeat, peer_timeout: cfg.peer_timeout, max_frame: cfg.max_frame };
            Some(Wire::start(pid, socks, cfg.budget, timing)?)
        } else {
            None
        };
        tracing::debug!(pid, n, "group formed");
        Ok(Bsp {
            pid,
            n,
            cfg,
            wire,
            start: Instant::now(),
            step: 0,
            areas: Vec::new(),
            pending_pop: Vec::new(),
            out: (0..n).map(|_| Outgoing::new()).collect(),
            queue: VecDeque::new(),
            tagsize: 0,
            next_tagsize: 0,
            failed: None,
        })
    }

    pub fn pid(&self) -> usize {
        self.pid
    }
    pub fn nprocs(&self) -> usize {
        self.n
    }
    /// Seconds since this process joined the group.
    pub fn time(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    /// Supersteps completed.
    pub fn superstep(&self) -> u64 {
        self.step
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Registers a new zeroed area of `len` bytes. Usable locally at once; a
    /// target for remote access from the next `sync` on. Every process must
    /// register in the same order.
    pub fn push_reg(&mut self, len: usize) -> Area {
        let id = self.areas.len() as u32;
        self.areas.push(Some(AreaBuf { words: vec![0u64; len.div_ceil(8)], len, registered: false }));
        Area(id)
    }

    /// Unregisters an area at the next `sync`.
    pub fn pop_reg(&mut self, a: Area) {
        self.pending_pop.push(a.0);
    }

    fn buf(&self, a: Area) -> Result<&AreaBuf> {
        self.areas.get(a.0 as usize).and_then(|x| x.as_ref()).ok_or(BspError::NotRegistered { pid: self.pid, area: a.0 })
    }

    /// Local bytes of an area.
    pub fn area(&self, a: Area) -> &[u8] {
        self.buf(a).expect("area exists").bytes()
    }
    pub fn area_mut(&mut self, a: Area) -> &mut [u8] {
        self.areas[a.0 as usize].as_mut().expect("area exists").bytes_mut()
    }
    /// Typed view (f64, u64, …). The area's length must be a multiple of `size_of::<T>()`.
    pub fn area_as<T: bytemuck::Pod>(&self, a: Area) -> &[T] {
        bytemuck::cast_slice(self.area(a))
    }
    pub fn area_as_mut<T: bytemuck::Pod>(&mut self, a: Area) -> &mut [T] {
        bytemuck::cast_slice_mut(self.area_mut(a))
    }

    fn check_pid(&self, pid: usize) -> Result<()> {
        if pid >= self.n {
            return Err(BspError::BadPid { pid, nprocs: self.n });
        }
        Ok(())
    }

    fn check_remote_area(&self, dst: Area) -> Result<()> {
        match self.areas.get(dst.0 as usize).and_then(|x| x.as_ref()) {
            Some(b) if b.registered => Ok(()),
            _ => Err(BspError::NotRegistered { pid: self.pid, area: dst.0 }),
        }
    }

    /// Buffered put: `src` is copied now; it lands in `dst` at `offset` on
    /// process `pid` at the end of the next `sync`, after all gets have read.
    pub fn put(&mut self, pid: usize, src: &[u8], dst: Area, offset: usize) -> Result<()> {
        self.check_pid(pid)?;
        self.check_remote_area(dst)?;
        if self.cfg.schedule == Schedule::Eager && pid != self.pid {
            let head = records::put_head(dst.0, offset as u64, src.len() as u64);
            let step = self.step;
            self.out[pid].eager += 1;
            return self.wire_send(pid, OutFrame::new(Kind::Data, step, 0, head.to_vec(), Payload::Owned(src.to_vec())));
        }
        if src.len() >= self.cfg.big_threshold && pid != self.pid {
            let head = records::put_head(dst.0, offset as u64, src.len() as u64);
            self.out[pid].big.push((head, Big::Owned(src.to_vec())));
        } else {
            records::push_put(&mut self.out[pid].combined, dst.0, offset as u64, src);
        }
        Ok(())
    }

    /// Typed put: `offset` counts elements of `T`.
    pub fn put_slice<T: bytemuck::Pod>(&mut self, pid: usize, src: &[T], dst: Area, offset: usize) -> Result<()> {
        self.put(pid, bytemuck::cast_slice(src), dst, offset * std::mem::size_of::<T>())
    }

    /// Unbuffered put: `len` bytes of the local area `src` from `src_offset`
    /// are read during the next `sync` (not now) and written from the area
    /// itself, with no staging copy. Whatever `src` holds when `sync` starts
    /// is what arrives.
    pub fn hpput(&mut self, pid: usize, src: Area, src_offset: usize, dst: Area, dst_offset: usize, len: usize) -> Result<()> {
        self.check_pid(pid)?;
        self.check_remote_area(dst)?;
        let size = self.buf(src)?.len;
        if src_offset + len > size {
            return Err(BspError::OutOfBounds {
                pid: self.pid,
                area: src.0,
                offset: src_offset as u64,
                len: len as u64,
                size: size as u64,
            });
        }
        let head = records::put_head(dst.0, dst_offset as u64, len as u64);
        if pid == self.pid {
            let data = self.area(src)[src_offset..src_offset + len].to_vec();
            records::push_put(&mut self.out[pid].combined, dst.0, dst_offset as u64, &data);
        } else {
            self.out[pid].big.push((head, Big::Hp { src: src.0, off: src_offset, len }));
        }
        Ok(())
    }

    /// Get: `len` bytes at `offset` of area `src` on process `pid`, as they
    /// stand when `sync` starts (before any of this superstep's puts), land in
    /// the local area `dst` at `dst_offset` at the end of `sync`.
    pub fn get(&mut self, pid: usize, src: Area, offset: usize, dst: Area, dst_offset: usize, len: usize) -> Result<()> {
        self.check_pid(pid)?;
        self.check_remote_area(src)?;
        let size = self.buf(dst)?.len;
        if dst_offset + len > size {
            return Err(BspError::OutOfBounds {
                pid: self.pid,
                area: dst.0,
                offset: dst_offset as u64,
                len: len as u64,
                size: size as u64,
            });
        }
        let o = &mut self.out[pid];
        records::push_getq(&mut o.gets, src.0, offset as u64, len as u64);
        o.get_dst.push((dst.0, dst_offset as u64, len as u64));
        Ok(())
    }

    /// `hpget` is `get`: the reply is already written straight from the
    /// remote area and read into one buffer, so there is no extra copy to save.
    pub fn hpget(&mut self, pid: usize, src: Area, offset: usize, dst: Area, dst_offset: usize, len: usize) -> Result<()> {
        self.get(pid, src, offset, dst, dst_offset, len)
    }

    /// Sets the BSMP tag size from the next superstep on; returns the old one.
    pub fn set_tagsize(&mut self, size: usize) -> usize {
        let old = self.next_tagsize;
        self.next_tagsize = size;
        old
    }

    /// BSMP send: appended to `pid`'s queue, readable there after the next `sync`.
    pub fn send(&mut self, pid: usize, tag: &[u8], payload: &[u8]) -> Result<()> {
        self.check_pid(pid)?;
        if tag.len() != self.tagsize {
            return Err(BspError::BadTag { got: tag.len(), want: self.tagsize });
        }
        records::push_send(&mut self.out[pid].combined, tag, payload);
        Ok(())
    }

    /// (messages, payload bytes) in the queue.
    pub fn qsize(&self) -> (usize, usize) {
        (self.queue.len(), self.queue.iter().map(|m| m.payload.len()).sum())
    }

    /// Payload length and tag of the next message, if any.
    pub fn get_tag(&self) -> Option<(usize, &[u8])> {
        self.queue.front().map(|m| (m.payload.len(), &m.tag[..]))
    }

    /// `bsp_move`: removes the next message and returns its payload.
    pub fn move_msg(&mut self) -> Option<Vec<u8>> {
        self.queue.pop_front().map(|m| m.payload)
    }

    /// `bsp_hpmove`: the whole next message, tag and payload, without copying.
    pub fn take_message(&mut self) -> Option<Message> {
        self.queue.pop_front()
    }

    /// Stops the whole group: every other process's next (or current) `sync`
    /// returns `Aborted`. Returns that error for this process too.
    pub fn abort(&mut self, message: &str) -> BspError {
        tracing::error!(pid = self.pid, message, "bsp abort");
        if let Some(w) = &mut self.wire {
            w.abort(message);
            w.close(Duration::from_secs(2));
        }
        self.failed = Some(format!("aborted: {message}"));
        BspError::Aborted { pid: self.pid, message: message.to_string() }
    }

    /// Leaves the group cleanly (also done on drop).
    pub fn end(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(mut w) = self.wire.take() {
            w.close(Duration::from_secs(5));
        }
    }

    fn wire_send(&self, to: usize, f: OutFrame) -> Result<()> {
        self.wire.as_ref().ok_or(BspError::Closed)?.send(to, f)
    }

    fn order(&self) -> Vec<usize> {
        match self.cfg.schedule {
            Schedule::LatinSquare => (1..self.n).map(|r| (self.pid + r) % self.n).collect(),
            Schedule::Naive | Schedule::Eager => (0..self.n).filter(|&d| d != self.pid).collect(),
        }
    }

    /// The barrier and the superstep's communication. On a group failure
    /// (lost peer, abort) the transport is torn down and every later call
    /// fails too; on a local error (a put outside an area) the group stays
    /// consistent and the error is returned after delivery.
    pub fn sync(&mut self) -> Result<()> {
        if let Some(f) = &self.failed {
            return Err(BspError::Setup(format!("group already failed: {f}")));
        }
        if let Some(w) = &self.wire {
            w.drive_begin();
        }
        let r = self.sync_inner();
        if let Some(w) = &self.wire {
            w.drive_end();
        }
        match r {
            Ok(()) => Ok(()),
            Err(e) if matches!(e, BspError::OutOfBounds { .. } | BspError::NotRegistered { .. }) => Err(e),
            Err(e) => {
                self.failed = Some(e.to_string());
                if let Some(mut w) = self.wire.take() {
                    match &e {
                        // Pass the abort on and leave cleanly, so every peer
                        // reports the abort, not this process's departure.
                        BspError::Aborted { pid, message } if *pid != self.pid => {
                            w.forward_abort(*pid, message);
                            w.close(ABORT_FORWARD_FLUSH);
                        }
                        _ => w.kill(),
                    }
                }
                Err(e)
            }
        }
    }

    fn sync_inner(&mut self) -> Result<()> {
        let step = self.step;
        let order = self.order();
        let mut out: Vec<Outgoing> = (0..self.n).map(|_| Outgoing::new()).collect();
        std::mem::swap(&mut out, &mut self.out);

        // 1. Count exchange (the barrier). Get requests go first, as their
        // own frames. Then a dissemination all-gather of the p×p matrix of
        // frame counts (`000…` §5.1's reduction): in round k every process
        // sends all rows it knows to pid + 2^k and hears from pid − 2^k, so
        // after ⌈log₂ p⌉ rounds everyone knows every row, and nobody can
        // have finished the rounds before everybody started them.
        // Row entry: frames sent to that pid, bit 31 = get requests too.
        let n = self.n;
        let mut metas: Vec<Option<InFrame>> = (0..n).map(|_| None).collect();
        let mut data: Vec<Vec<InFrame>> = (0..n).map(|_| Vec::new()).collect();
        let mut counts = vec![0u32; n];
        if let Some(w) = &self.wire {
            const GETS: u32 = 1 << 31;
            let mut rows: Vec<Option<Vec<u32>>> = vec![None; n];
            let mut mine = vec![0u32; n];
            let mut reqs = Vec::new();
            for &d in &order {
                let o = &mut out[d];
                mine[d] = o.eager + (!o.combined.is_empty()) as u32 + o.big.len() as u32;
                if !o.gets.is_empty() {
                    mine[d] |= GETS;
                    reqs.push((d, OutFrame::new(Kind::GetReq, step, 0, Vec::new(), Payload::Owned(std::mem::take(&mut o.gets)))));
                }
            }
            rows[self.pid] = Some(mine);
            w.send_all(reqs)?;
            if self.cfg.early_data {
                for &d in &order {
                    self.send_data(w, d, &mut out[d], step)?;
                }
            }
            let mut k = 1;
            while k < n {
                let (to, from) = ((self.pid + k) % n, (self.pid + n - k) % n);
                let mut payload = Vec::with_capacity(n * (n + 1) * 4);
                for (j, row) in rows.iter().enumerate() {
                    if let Some(row) = row {
                        payload.extend_from_slice(&(j as u32).to_le_bytes());
                        row.iter().for_each(|c| payload.extend_from_slice(&c.to_le_bytes()));
                    }
                }
                w.send(to, OutFrame::new(Kind::Meta, step, k as u32, Vec::new(), Payload::Owned(payload)))?;
                loop {
                    let f = w.recv(from)?;
                    self.expect_step(from, &f, step)?;
                    match f.header.kind {
                        Kind::Meta if f.header.aux as usize == k => {
                            self.merge_rows(from, &f.payload, &mut rows)?;
                            break;
                        }
                        Kind::Data => data[from].push(f),
                        Kind::GetReq => metas[from] = Some(f),
                        kind => return Err(self.unexpected(from, kind)),
                    }
                }
                k *= 2;
            }
            // Every row is known now; collect the get requests sent to us.
            for &src in order.iter().rev() {
                let c = rows[src].as_ref().ok_or_else(|| BspError::Protocol {
                    from: format!("process {src}"),
                    detail: "count row missing after the barrier".into(),
                })?[self.pid];
                counts[src] = c & !GETS;
                while c & GETS != 0 && metas[src].is_none() {
                    let f = w.recv(src)?;
                    self.expect_step(src, &f, step)?;
                    match f.header.kind {
                        Kind::Data => data[src].push(f),
                        Kind::GetReq => metas[src] = Some(f),
                        kind => return Err(self.unexpected(src, kind)),
                    }
                }
            }
        }

        // 2. Serve gets before anything lands.
        // A get outside an area is the requester's bug, but the reply must
        // still have its length or the group falls out of step: zeros go
        // back and the error is reported here after delivery.
        let mut first_err: Option<BspError> = None;
        let mut replies: Vec<Vec<u8>> = vec![Vec::new(); self.n];
        let mut serve = |me: &Bsp, reqs: &[u8], src: usize, into: &mut Vec<u8>| -> Result<()> {
            for (area, off, len) in records::parse_getqs(reqs, src)? {
                match me.read_area(area, off, len) {
                    Ok(b) => into.extend_from_slice(b),
                    Err(e) => {
                        first_err.get_or_insert(e);
                        into.resize(into.len() + len.min(1 << 32) as usize, 0);
                    }
                }
            }
            Ok(())
        };
        for (src, m) in metas.iter().enumerate() {
            if let Some(m) = m {
                serve(self, &m.payload, src, &mut replies[src])?;
            }
        }
        let mut local_get = Vec::new();
        serve(self, &out[self.pid].gets, self.pid, &mut local_get)?;

        // 3. Data, destination by destination in schedule order.
        if let Some(w) = &self.wire {
            for &d in &order {
                if !replies[d].is_empty() || !metas[d].as_ref().is_none_or(|m| m.payload.is_empty()) {
                    w.send(d, OutFrame::new(Kind::GetReply, step, 0, Vec::new(), Payload::Owned(std::mem::take(&mut replies[d]))))?;
                }
                if !self.cfg.early_data {
                    self.send_data(w, d, &mut out[d], step)?;
                }
            }

            // 4. Completion by counting.
            let mut get_replies: Vec<Option<InFrame>> = (0..self.n).map(|_| None).collect();
            let mut result = Ok(());
            'peers: for &src in order.iter().rev() {
                let want = counts[src] as usize;
                let want_reply = !out[src].get_dst.is_empty();
                while data[src].len() < want || (want_reply && get_replies[src].is_none()) {
                    let f = match w.recv(src) {
                        Ok(f) => f,
                        Err(e) => {
                            result = Err(e);
                            break 'peers;
                        }
                    };
                    if let Err(e) = self.expect_step(src, &f, step) {
                        result = Err(e);
                        break 'peers;
                    }
                    match f.header.kind {
                        Kind::Data => data[src].push(f),
                        Kind::GetReply => get_replies[src] = Some(f),
                        k => {
                            result = Err(self.unexpected(src, k));
                            break 'peers;
                        }
                    }
                }
            }
            // Borrowed payloads point into our areas: they must be written
            // (or dropped) before anything below writes to an area.
            w.wait_borrowed();
            result?;
            for (src, r) in get_replies.into_iter().enumerate() {
                if let Some(r) = r {
                    self.land_gets(src, &out[src].get_dst, &r.payload)?;
                }
            }
        }

        // 5. Apply: local gets first (they read before puts), then puts and
        // sends by source pid, in issue order.
        self.land_gets(self.pid, &out[self.pid].get_dst.clone(), &local_get)?;
        let mut queue = VecDeque::new();
        for src in 0..self.n {
            let bufs: Vec<&[u8]> =
                if src == self.pid { vec![&out[src].combined[..]] } else { data[src].iter().map(|f| &f.payload[..]).collect() };
            for b in bufs {
                for r in records::parse(b, src)? {
                    match r {
                        Record::Put { area, offset, data } => {
                            if let Err(e) = self.write_area(area, offset, data) {
                                first_err.get_or_insert(e);
                            }
                        }
                        Record::Send { tag, payload } => queue.push_back(Message { tag: tag.to_vec(), payload: payload.to_vec() }),
                    }
                }
            }
        }
        self.queue = queue;
        if let Some(w) = &self.wire {
            for f in data.into_iter().flatten() {
                w.recycle(f.payload);
            }
        }
        for a in self.areas.iter_mut().flatten() {
            a.registered = true;
        }
        for a in self.pending_pop.drain(..) {
            if let Some(slot) = self.areas.get_mut(a as usize) {
                *slot = None;
            }
        }
        self.tagsize = self.next_tagsize;
        self.step += 1;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Queues this superstep's data frames for `d`: the combined buffer, then
    /// each big block (an `hpput` one straight from its area).
    fn send_data(&self, w: &Wire, d: usize, o: &mut Outgoing, step: u64) -> Result<()> {
        if !o.combined.is_empty() {
            w.send(d, OutFrame::new(Kind::Data, step, 0, Vec::new(), Payload::Owned(std::mem::take(&mut o.combined))))?;
        }
        for (head, big) in o.big.drain(..) {
            let body = match big {
                Big::Owned(v) => Payload::Owned(v),
                Big::Hp { src, off, len } => {
                    let b = &self.areas[src as usize].as_ref().ok_or(BspError::NotRegistered { pid: self.pid, area: src })?.bytes()
                        [off..off + len];
                    Payload::Borrowed { ptr: b.as_ptr(), len }
                }
            };
            w.send(d, OutFrame::new(Kind::Data, step, 0, head.to_vec(), body))?;
        }
        Ok(())
    }

    /// Merges the count rows of a dissemination message into `rows`.
    fn merge_rows(&self, from: usize, b: &[u8], rows: &mut [Option<Vec<u32>>]) -> Result<()> {
        let n = self.n;
        let bad = || BspError::Protocol { from: format!("process {from}"), detail: "malformed count rows".into() };
        if !b.len().is_multiple_of((n + 1) * 4) {
            return Err(bad());
        }
        for chunk in b.chunks((n + 1) * 4) {
            let w: Vec<u32> = chunk.chunks(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
            let j = w[0] as usize;
            if j >= n {
                return Err(bad());
            }
            if rows[j].is_none() {
                rows[j] = Some(w[1..].to_vec());
            }
        }
        Ok(())
    }

    fn expect_step(&self, src: usize, f: &InFrame, step: u64) -> Result<()> {
        if f.header.step != step {
            return Err(BspError::Protocol {
                from: format!("process {src}"),
                detail: format!("frame of superstep {} during superstep {step}", f.header.step),
            });
        }
        Ok(())
    }

    fn unexpected(&self, src: usize, k: Kind) -> BspError {
        BspError::Protocol { from: format!("process {src}"), detail: format!("unexpected {k:?} frame") }
    }

    fn read_area(&self, area: u32, off: u64, len: u64) -> Result<&[u8]> {
        let b = self
            .areas
            .get(area as usize)
            .and_then(|x| x.as_ref())
            .filter(|b| b.registered)
            .ok_or(BspError::NotRegistered { pid: self.pid, area })?;
        let end = off.checked_add(len).filter(|&e| e <= b.len as u64).ok_or(BspError::OutOfBounds {
            pid: self.pid,
            area,
            offset: off,
            len,
            size: b.len as u64,
        })?;
        Ok(&b.bytes()[off as usize..end as usize])
    }

    fn write_area(&mut self, area: u32, off: u64, data: &[u8]) -> Result<()> {
        let pid = self.pid;
        let b = self
            .areas
            .get_mut(area as usize)
            .and_then(|x| x.as_mut())
            .filter(|b| b.registered)
            .ok_or(BspError::NotRegistered { pid, area })?;
        let len = data.len() as u64;
        let size = b.len as u64;
        let end = off.checked_add(len).filter(|&e| e <= size).ok_or(BspError::OutOfBounds { pid, area, offset: off, len, size })?;
        b.bytes_mut()[off as usize..end as usize].copy_from_slice(data);
        Ok(())
    }

    fn land_gets(&mut self, src: usize, dst: &[(u32, u64, u64)], mut payload: &[u8]) -> Result<()> {
        for &(area, off, len) in dst {
            if (payload.len() as u64) < len {
                return Err(BspError::Protocol { from: format!("process {src}"), detail: "short get reply".into() });
            }
            let (h, t) = payload.split_at(len as usize);
            payload = t;
            let b = self.areas.get_mut(area as usize).and_then(|x| x.as_mut()).ok_or(BspError::NotRegistered { pid: self.pid, area })?;
            b.bytes_mut()[off as usize..(off + len) as usize].copy_from_slice(h);
        }
        Ok(())
    }
}

/// How long a process that learnt of an abort waits for its forwarded
/// `Abort` frames to be written before it leaves.
const ABORT_FORWARD_FLUSH: Duration = Duration::from_millis(500);

impl Drop for Bsp {
    fn drop(&mut self) {
        self.shutdown();
    }
}
