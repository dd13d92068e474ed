//! The data-parallel multiply against the bag of tasks (`003…` §5.6,
//! "Exploiting Patterns", eqs. 5.21–5.25), and the data-parallel engine
//! this implementation runs over the BSP transport (`slave::gang`).
//!
//! The source's algorithm (Fig. 5.19, 5.23) caches a block row of A,
//! `b₁×b₂` blocks with `b₂ = n/s`, across the `s` slaves, streams B's
//! block columns through them and forms each `b₁×b₁` block of C by a
//! global sum: [`lwr_single_threaded`] (5.23) and [`lwr_overlapped`]
//! (5.24); [`io_cost_bag`] and [`io_cost_data_parallel`] are the I/O
//! terms 5.25 compares, [`io_cost_difference`] its closed form.
//!
//! The printed 5.23 and `Tcdatap` multiply the output terms (global sum
//! and write) by one factor `n/b₁`; 5.25's closed form (`8n²` for them)
//! needs `(n/b₁)²`, one term per `b₁×b₁` block of C. These functions
//! follow 5.25, as 5.24 does.
//!
//! The engine built here is not the global-sum one: rank `r` of `P` owns
//! C's block rows `i ≡ r (mod P)` of square `b×b` blocks, and superstep
//! `k` broadcasts B's block row `k` (each block read from the store once,
//! by its owner) and multiplies it into the rank's rows with its own
//! `A(i, k)` ([`Broadcast`]). Its time is priced with the same primitives
//! (5.21, 5.22) and the transport's measured `g` and `l` for the
//! broadcast, on a star: every store transfer crosses the store's one link
//! (the "bus" of 5.23), rank-to-rank traffic each rank's own (the
//! "switch" of 5.24). A rank does its steps in series (no overlap of its
//! reads with its kernels), as the engine does.

use crate::primitives::Primitives;
use crate::{ModelError, Options, Params, ParamsError, ELEMENT_BYTES};

fn ceil_log2(x: f64) -> f64 {
    if x <= 1.0 {
        0.0
    } else {
        x.log2().ceil()
    }
}

fn check(n: u64, b1: u64, b2: u64) -> Result<(f64, f64, f64), ModelError> {
    for b in [b1, b2] {
        if n == 0 || b == 0 || b > n {
            return Err(ModelError::InvalidProblem { n, b });
        }
    }
    Ok((n as f64, (n as f64 / b1 as f64).ceil(), (n as f64 / b2 as f64).ceil()))
}

/// Eq. 5.23: single-threaded slaves, no double buffering, a bus: every
/// transfer in series, `s = n/b₂` slaves.
pub fn lwr_single_threaded(params: &Params, n: u64, b1: u64, b2: u64, options: &Options) -> Result<f64, ModelError> {
    let (_, p1, p2) = check(n, b1, b2)?;
    let rect = Primitives::rect(params, b1, b2, options)?;
    let out = Primitives::rect(params, b1, b1, options)?;
    let row = p2 * (1.0 + p1) * rect.tget + p1 * rect.tmult;
    let outputs = p1 * (p2 * out.tcom + ceil_log2(p2) * out.tadd + out.tput);
    Ok(p1 * (row + outputs))
}

/// Eq. 5.24: multithreaded slaves, double buffering at the server, a
/// switch: the greater of communication and computation.
pub fn lwr_overlapped(params: &Params, n: u64, b1: u64, b2: u64, options: &Options) -> Result<f64, ModelError> {
    let (_, p1, p2) = check(n, b1, b2)?;
    let rect = Primitives::rect(params, b1, b2, options)?;
    let out = Primitives::rect(params, b1, b1, options)?;
    let log = ceil_log2(p2);
    let comm = p2 * (1.0 + p1) * rect.tdget.max(rect.tcom) + p1 * (log * out.tcom + out.tput);
    let comp = p1 * (rect.tmult + log * out.tadd);
    Ok(p1 * comm.max(comp))
}

/// `Tcbot` of 5.25: the I/O of the bag of tasks that caches a block row at
/// the server, `b×b` blocks.
pub fn io_cost_bag(params: &Params, n: u64, b: u64, options: &Options) -> Result<f64, ModelError> {
    let (_, p, _) = check(n, b, b)?;
    let t = Primitives::square(params, b, options)?;
    Ok(p * p * ((2.0 * p + 1.0) * t.tcom).max((p + 1.0) * t.tdget + t.tdput))
}

/// `Tcdatap` of 5.25: the communication term of 5.24.
pub fn io_cost_data_parallel(params: &Params, n: u64, b1: u64, b2: u64, options: &Options) -> Result<f64, ModelError> {
    let (_, p1, p2) = check(n, b1, b2)?;
    let rect = Primitives::rect(params, b1, b2, options)?;
    let out = Primitives::rect(params, b1, b1, options)?;
    Ok(p1 * (p2 * (1.0 + p1) * rect.tdget.max(rect.tcom) + p1 * (ceil_log2(p2) * out.tcom + out.tput)))
}

/// Eq. 5.25, `Tcdatap − Tcbot` in closed form from the bandwidths alone
/// (thresholds and latencies left out, as the source does): positive where
/// the data-parallel structure moves more.
pub fn io_cost_difference(params: &Params, n: u64, b: u64, b1: u64, b2: u64) -> Result<f64, ModelError> {
    let (nf, p1, p2) = check(n, b1, b2)?;
    let (_, p, _) = check(n, b, b)?;
    let (c, dget, dput) = (params.network.bandwidth, params.disk_get.bandwidth, params.disk_put.bandwidth);
    let nn = ELEMENT_BYTES * nf * nf;
    Ok(nn * (p1 + 1.0) * (1.0 / dget).max(1.0 / c) + nn / c * (ceil_log2(p2) + 1.0) + nn / dput
        - nn * ((2.0 * p + 1.0) / c).max((p + 1.0) / dget + 1.0 / dput))
}

/// What the engine's time is made of, measured on the machine that runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// One rank's block-multiply rate with a core to itself, flop/s.
    pub rank_rate: f64,
    /// All ranks' multiply rate together while every rank computes: `P ×
    /// rank_rate` where each rank has its own cores, less where ranks
    /// share them.
    pub machine_rate: f64,
    /// The store's link as blocks stream over it (`C`, bytes/s), both
    /// ways: the busier direction is what a transfer waits for.
    pub store_link: f64,
    /// What one get or put takes beyond its bytes (its round trip), s.
    pub latency: f64,
    /// The BSP transport's `g` (seconds per byte a rank sends in an
    /// h-relation) over the ranks' links.
    pub g: f64,
    /// The BSP transport's `l` (seconds per superstep).
    pub l: f64,
}

impl Machine {
    fn validate(&self) -> Result<(), ParamsError> {
        for (name, value) in [("rank_rate", self.rank_rate), ("machine_rate", self.machine_rate), ("store_link", self.store_link)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ParamsError::Invalid { name: name.into(), value, reason: "must be finite and > 0" });
            }
        }
        Ok(())
    }
}

/// The data-parallel engine's multiply: `n×n` by `n×n`, `b×b` blocks,
/// `ranks` ranks, committing all of C `checkpoints` times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Broadcast {
    pub n: u64,
    pub b: u64,
    pub ranks: u32,
    /// Checkpoints in the run (at least the last superstep's).
    pub checkpoints: u32,
}

/// The engine's predicted time and traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BroadcastTime {
    /// Supersteps (block columns of A).
    pub supersteps: f64,
    /// Reading B's row (every owner at once, over the store's link).
    pub read_b: f64,
    /// The broadcast, `g·h + l`.
    pub exchange: f64,
    /// Reading the slowest rank's `A(i, k)` blocks.
    pub read_a: f64,
    /// The slowest rank's kernels.
    pub compute: f64,
    /// One superstep: the four above in series.
    pub step: f64,
    /// One checkpoint: all of C into the store.
    pub checkpoint: f64,
    /// The whole run: supersteps and checkpoints.
    pub total: f64,
    /// Bytes the store's link sends (A and B once each) and receives (C
    /// once per checkpoint).
    pub store_sent: f64,
    pub store_received: f64,
    /// Bytes the busiest rank sends to the others in all.
    pub rank_sent: f64,
}

impl Broadcast {
    /// The engine's time on `m`: per superstep the store's link carries B's
    /// row (`p` blocks, read by `⌈p/P⌉` owners each in series), the
    /// broadcast moves `h = ⌈p/P⌉(P−1)` blocks out of each rank, and the
    /// slowest rank (`⌈p/P⌉` rows) reads its `A(i, k)` in series with its
    /// kernels (the first of every rank's at once over the store's link)
    /// and multiplies `⌈p/P⌉·p` block pairs, no faster than the machine
    /// runs all ranks' `p²`. Blocks are priced whole (an upper bound for
    /// edge blocks).
    pub fn time(&self, m: &Machine) -> Result<BroadcastTime, ModelError> {
        let (n, b) = (self.n, self.b);
        let (_, p, _) = check(n, b, b)?;
        if self.ranks == 0 {
            return Err(ModelError::ZeroSlaves);
        }
        m.validate()?;
        let ranks = f64::from(self.ranks);
        let share = (p / ranks).ceil();
        let block = ELEMENT_BYTES * (b as f64).powi(2);
        let on_link = block / m.store_link;
        let one_get = on_link + m.latency.max(0.0);
        let tmult = 2.0 * (b as f64).powi(3);
        let read_b = (p * on_link).max(share * one_get);
        let exchange = m.g.max(0.0) * share * (ranks - 1.0) * block + m.l.max(0.0);
        let read_a = ranks.min(p) * on_link + (share - 1.0).max(0.0) * one_get + m.latency.max(0.0);
        let compute = (share * p * tmult / m.rank_rate).max(p * p * tmult / m.machine_rate);
        let step = read_b + exchange + read_a + compute;
        let checkpoint = (p * p * on_link).max(share * p * one_get);
        let checkpoints = f64::from(self.checkpoints.max(1));
        Ok(BroadcastTime {
            supersteps: p,
            read_b,
            exchange,
            read_a,
            compute,
            step,
            checkpoint,
            total: p * step + checkpoints * checkpoint,
            store_sent: 2.0 * p * p * block,
            store_received: checkpoints * p * p * block,
            rank_sent: p * share * (ranks - 1.0) * block,
        })
    }
}

/// The bag of tasks without caching on the same machine, its lower bound:
/// each of the `p²` tasks reads its `2p` blocks over the store's link and
/// writes one, the link full duplex; or all `2n³` flop at the machine's
/// rate, whichever is longer (reads hide behind kernels, §5.5).
pub fn bag_lower_bound(n: u64, b: u64, m: &Machine) -> Result<f64, ModelError> {
    let (nf, p, _) = check(n, b, b)?;
    m.validate()?;
    let block = ELEMENT_BYTES * (b as f64).powi(2);
    let sent = 2.0 * p.powi(3) * block / m.store_link;
    let received = p * p * block / m.store_link;
    Ok(sent.max(received).max(2.0 * nf.powi(3) / m.machine_rate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Piecewise;

    /// Round rates, no thresholds: P 10⁸ flop/s, C 10⁶ B/s, Dget 5·10⁵,
    /// Dput 2.5·10⁵.
    fn round() -> Params {
        Params {
            multiply: Piecewise::new(1e8, 0.0),
            network: Piecewise::new(1e6, 0.0),
            disk_get: Piecewise::new(5e5, 0.0),
            disk_put: Piecewise::new(2.5e5, 0.0),
            ..Params::thesis_fast()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
    }

    #[test]
    fn eq_5_23_by_hand() {
        // n = 8, b₁ = 2, b₂ = 4: p₁ = 4, p₂ = 2. tget{2,4} = 64(2+1)µs = 192 µs,
        // tmult{2,4} = 32/10⁸, tcom{2,2} = 32 µs, tadd{2,2} = 4·10⁻⁸,
        // tput{2,2} = 32(4+1) µs = 160 µs, ⌈log₂ 2⌉ = 1:
        // 4(2·5·192e-6 + 4·3.2e-7) + 16(2·32e-6 + 4e-8 + 160e-6).
        let t = lwr_single_threaded(&round(), 8, 2, 4, &Options::default()).unwrap();
        assert!(close(t, 0.011_269_76), "{t}");
    }

    #[test]
    fn eq_5_24_by_hand() {
        // max(tdget{2,4} = 128 µs, tcom{2,4} = 64 µs) = 128 µs;
        // communication 2·5·128 + 4(32 + 160) = 2048 µs, computation
        // 4(0.32 + 0.04) µs; times p₁ = 4.
        let t = lwr_overlapped(&round(), 8, 2, 4, &Options::default()).unwrap();
        assert!(close(t, 0.008_192), "{t}");
    }

    #[test]
    fn eq_5_25_closed_form_is_the_difference_of_the_io_terms() {
        let (p, o) = (round(), Options::default());
        // Tcbot at b = 2 (p = 4): 16·max(9·32, 5·64 + 128) µs = 7168 µs.
        let bot = io_cost_bag(&p, 8, 2, &o).unwrap();
        assert!(close(bot, 0.007_168), "{bot}");
        let datap = io_cost_data_parallel(&p, 8, 2, 4, &o).unwrap();
        assert!(close(datap, 0.008_192), "{datap}");
        let diff = io_cost_difference(&p, 8, 2, 2, 4).unwrap();
        assert!(close(diff, 0.001_024), "{diff}");
        for (n, b, b1, b2) in [(64, 8, 4, 16), (120, 10, 12, 30), (30_000, 1000, 700, 2143)] {
            let d = io_cost_difference(&p, n, b, b1, b2).unwrap();
            let e = io_cost_data_parallel(&p, n, b1, b2, &o).unwrap() - io_cost_bag(&p, n, b, &o).unwrap();
            // Where n is not a multiple of b₂ the closed form's n² and the
            // terms' whole blocks differ by the rounding.
            assert!((d - e).abs() <= 0.02 * e.abs().max(d.abs()), "n {n}: {d} vs {e}");
        }
    }

    #[test]
    fn source_remark_data_parallel_moves_more_when_c_is_at_least_twice_dget() {
        // C ≥ 2·Dget and p₁ ≥ p: positive (the source's remark under 5.25).
        let p = Params { network: Piecewise::new(2e6, 0.0), ..round() };
        assert!(io_cost_difference(&p, 64, 8, 8, 16).unwrap() > 0.0);
    }

    fn machine() -> Machine {
        Machine { rank_rate: 10e9, machine_rate: 20e9, store_link: 100e6, latency: 1e-3, g: 1e-8, l: 1e-3 }
    }

    #[test]
    fn broadcast_engine_by_hand() {
        // n = 4096, b = 512: p = 8, 2 MiB blocks (0.020 971 52 s on the
        // link), P = 3: ⌈8/3⌉ = 3 rows and B columns for the slowest rank.
        let t = Broadcast { n: 4096, b: 512, ranks: 3, checkpoints: 1 }.time(&machine()).unwrap();
        assert!(close(t.read_b, 8.0 * 0.020_971_52), "{}", t.read_b);
        assert!(close(t.exchange, 1e-8 * 6.0 * 2_097_152.0 + 1e-3), "{}", t.exchange);
        assert!(close(t.read_a, 3.0 * 0.020_971_52 + 2.0 * 0.021_971_52 + 1e-3), "{}", t.read_a);
        // 64 pairs at 20 GFLOP/s beat 24 at 10.
        assert!(close(t.compute, 64.0 * 268_435_456.0 / 20e9), "{}", t.compute);
        assert!(close(t.checkpoint, 64.0 * 0.020_971_52));
        assert!(close(t.total, 11.433_795_99), "{}", t.total);
        assert_eq!(t.store_sent, 2.0 * 64.0 * 2_097_152.0);
        assert_eq!(t.store_received, 64.0 * 2_097_152.0);
        assert_eq!(t.rank_sent, 8.0 * 3.0 * 2.0 * 2_097_152.0);
    }

    #[test]
    fn crossover_between_the_engines() {
        // A slow store link: the bag reads 2p³ blocks through it, the
        // engine 2p²; 1024·0.021 s against 11.4 s.
        let slow = machine();
        let bag = bag_lower_bound(4096, 512, &slow).unwrap();
        assert!(close(bag, 1024.0 * 0.020_971_52), "{bag}");
        let dp = Broadcast { n: 4096, b: 512, ranks: 3, checkpoints: 1 }.time(&slow).unwrap().total;
        assert!(bag > 1.8 * dp, "bag {bag} vs data-parallel {dp}");
        // A fast one: both at the kernels' rate, and the engine's steps in
        // series (reads, broadcast) make it the slower.
        let fast = Machine { store_link: 5e9, g: 2e-10, ..machine() };
        let bag = bag_lower_bound(4096, 512, &fast).unwrap();
        let dp = Broadcast { n: 4096, b: 512, ranks: 3, checkpoints: 1 }.time(&fast).unwrap().total;
        assert!(close(bag, 2.0 * 4096f64.powi(3) / 20e9));
        assert!(dp > bag, "bag {bag} vs data-parallel {dp}");
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(lwr_overlapped(&round(), 0, 2, 4, &Options::default()).is_err());
        assert!(Broadcast { n: 64, b: 8, ranks: 0, checkpoints: 1 }.time(&machine()).is_err());
        assert!(Broadcast { n: 64, b: 8, ranks: 2, checkpoints: 1 }.time(&Machine { store_link: 0.0, ..machine() }).is_err());
    }
}
