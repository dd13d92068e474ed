//! Measuring the machine as BSP sees it (`002…` §14, §16; `000…` Table 6.2):
//! `l` from empty supersteps, `g` from supersteps that each move an
//! h-relation (cyclic shift: h words to one neighbour; total exchange: h
//! words spread over all others), a least-squares fit `C(h) = g·h + l`, and
//! `n½ = l_fit / g` (the message size at half the asymptotic rate). A word is
//! 8 bytes (a double). `s` is the rate of a plain Rust dgemm loop, so that
//! `l` and `g` can be given in flops as the sources do.
//!
//! Every process runs the same loop; process 0's clock is the one reported.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bsplib::Bsp;
use crate::error::Result;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Pattern {
    CyclicShift,
    TotalExchange,
}

/// Mean and sample standard deviation.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Stat {
    pub mean: f64,
    pub sd: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(xs: &[f64]) -> Stat {
        let n = xs.len();
        let mean = xs.iter().sum::<f64>() / n.max(1) as f64;
        let var = if n > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        Stat { mean, sd: var.sqrt(), n }
    }
}

/// Least squares `y = a·x + b`; returns (a, b).
pub fn fit_line(xs: &[f64], ys: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let (sx, sy) = (xs.iter().sum::<f64>(), ys.iter().sum::<f64>());
    let sxx = xs.iter().map(|x| x * x).sum::<f64>();
    let sxy = xs.iter().zip(ys).map(|(x, y)| x * y).sum::<f64>();
    let a = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    (a, (sy - a * sx) / n)
}

/// Flop rate of a plain blocked dgemm loop (n = 192), in flop/s.
pub fn dgemm_rate() -> f64 {
    let n = 192;
    let a: Vec<f64> = (0..n * n).map(|i| (i % 7) as f64 * 0.5).collect();
    let b: Vec<f64> = (0..n * n).map(|i| (i % 5) as f64 * 0.25).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let mut c = vec![0.0f64; n * n];
        let t = Instant::now();
        for i in 0..n {
            for k in 0..n {
                let aik = a[i * n + k];
                let (crow, brow) = (&mut c[i * n..(i + 1) * n], &b[k * n..(k + 1) * n]);
                for (cj, bj) in crow.iter_mut().zip(brow) {
                    *cj += aik * bj;
                }
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&c);
    }
    2.0 * (n * n * n) as f64 / best
}

/// µs per empty superstep: `reps` samples, each the mean of `batch` syncs.
pub fn measure_l(bsp: &mut Bsp, reps: usize, batch: usize) -> Result<Vec<f64>> {
    for _ in 0..batch {
        bsp.sync()?;
    }
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..batch {
            bsp.sync()?;
        }
        out.push(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
    }
    Ok(out)
}

/// µs per superstep moving an h-relation of `h` words per process.
pub fn measure_c(bsp: &mut Bsp, pattern: Pattern, h: usize, reps: usize) -> Result<Vec<f64>> {
    let p = bsp.nprocs();
    let me = bsp.pid();
    let per_dest = match pattern {
        Pattern::CyclicShift => h,
        Pattern::TotalExchange => h / (p - 1).max(1),
    };
    let src = bsp.push_reg(per_dest * 8);
    let dst = bsp.push_reg(per_dest * 8 * p);
    bsp.area_as_mut::<f64>(src).iter_mut().enumerate().for_each(|(i, x)| *x = (i + me) as f64);
    bsp.sync()?;
    let mut out = Vec::with_capacity(reps);
    for rep in 0..reps + 1 {
        let t = Instant::now();
        // hpput: the unbuffered path, the block goes from the area to the socket.
        match pattern {
            Pattern::CyclicShift => {
                if p > 1 {
                    bsp.hpput((me + 1) % p, src, 0, dst, 0, per_dest * 8)?;
                }
            }
            Pattern::TotalExchange => {
                for r in 1..p {
                    bsp.hpput((me + r) % p, src, 0, dst, me * per_dest * 8, per_dest * 8)?;
                }
            }
        }
        bsp.sync()?;
        if rep > 0 {
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    bsp.pop_reg(src);
    bsp.pop_reg(dst);
    bsp.sync()?;
    Ok(out)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeOpts {
    pub hs: Vec<usize>,
    pub reps: usize,
    pub l_reps: usize,
    pub l_batch: usize,
}

impl ProbeOpts {
    pub fn new(quick: bool) -> ProbeOpts {
        if quick {
            ProbeOpts { hs: vec![0, 1024, 4096, 16384], reps: 5, l_reps: 10, l_batch: 50 }
        } else {
            ProbeOpts { hs: vec![0, 256, 1024, 4096, 16384, 65536], reps: 20, l_reps: 30, l_batch: 100 }
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GFit {
    pub pattern: Pattern,
    /// µs per word (fit).
    pub g_us: f64,
    /// µs (fit intercept).
    pub l_us: f64,
    pub n_half: f64,
    /// Per-sample `C(h)/h` at the largest h: the spread of g.
    pub g_at_max_h: Stat,
    pub points: Vec<(usize, Stat)>,
}

/// What the probe writes: the performance model reads this file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeReport {
    pub p: usize,
    pub word_bytes: usize,
    /// dgemm flop/s.
    pub s_flops: f64,
    pub l_us: Stat,
    pub shift: GFit,
    pub total_exchange: GFit,
}

impl ProbeReport {
    pub fn l_flops(&self) -> f64 {
        self.l_us.mean * 1e-6 * self.s_flops
    }
    pub fn g_flops(&self, f: &GFit) -> f64 {
        f.g_us * 1e-6 * self.s_flops
    }
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }
}

fn fit(bsp: &mut Bsp, pattern: Pattern, o: &ProbeOpts) -> Result<GFit> {
    let mut points = Vec::new();
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    let mut last = Vec::new();
    for &h in &o.hs {
        let c = measure_c(bsp, pattern, h, o.reps)?;
        for &y in &c {
            xs.push(h as f64);
            ys.push(y);
        }
        points.push((h, Stat::of(&c)));
        last = c.iter().map(|y| y / h.max(1) as f64).collect();
    }
    let (g, l) = fit_line(&xs, &ys);
    Ok(GFit { pattern, g_us: g, l_us: l, n_half: l / g, g_at_max_h: Stat::of(&last), points })
}

/// Runs the whole probe on every process; process 0 gets the report.
pub fn probe(bsp: &mut Bsp, o: &ProbeOpts) -> Result<Option<ProbeReport>> {
    let s = if bsp.pid() == 0 { dgemm_rate() } else { 0.0 };
    bsp.sync()?;
    let l = measure_l(bsp, o.l_reps, o.l_batch)?;
    let shift = fit(bsp, Pattern::CyclicShift, o)?;
    let te = fit(bsp, Pattern::TotalExchange, o)?;
    Ok((bsp.pid() == 0).then(|| ProbeReport { p: bsp.nprocs(), word_bytes: 8, s_flops: s, l_us: Stat::of(&l), shift, total_exchange: te }))
}

/// The comparisons with MPI, measured the way the C program measures MPI:
/// barrier µs (empty superstep), total exchange of `words` doubles per
/// destination in MB/s sent per process, and ping-pong half round trip
/// between processes 0 and 1 (one 8-byte put each way per superstep pair).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MpiLike {
    pub p: usize,
    pub barrier_us: Stat,
    pub alltoall_mb_s: Stat,
    pub alltoall_us: Stat,
    pub half_rtt_us: Stat,
}

pub fn mpi_like(bsp: &mut Bsp, words: usize, reps: usize) -> Result<Option<MpiLike>> {
    let p = bsp.nprocs();
    let barrier = measure_l(bsp, reps, 50)?;
    let te = measure_c(bsp, Pattern::TotalExchange, words * (p - 1), reps)?;
    let mb: Vec<f64> = te.iter().map(|us| (words * 8 * (p - 1)) as f64 / us).collect();
    // Ping-pong: a superstep in which 0 puts to 1, then one in which 1 puts
    // back; half a round trip is one superstep with one message in it.
    let a = bsp.push_reg(8);
    bsp.sync()?;
    let mut rtt = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..20 {
            if bsp.pid() == 0 {
                bsp.put(1 % p, &1f64.to_le_bytes(), a, 0)?;
            }
            bsp.sync()?;
            if bsp.pid() == 1 {
                bsp.put(0, &2f64.to_le_bytes(), a, 0)?;
            }
            bsp.sync()?;
        }
        rtt.push(t.elapsed().as_secs_f64() * 1e6 / 40.0);
    }
    Ok((bsp.pid() == 0).then(|| MpiLike {
        p,
        barrier_us: Stat::of(&barrier),
        alltoall_mb_s: Stat::of(&mb),
        alltoall_us: Stat::of(&te),
        half_rtt_us: Stat::of(&rtt),
    }))
}

/// Total exchange at `words` per destination under the group's schedule:
/// µs per superstep.
pub fn exchange_time(bsp: &mut Bsp, words: usize, reps: usize) -> Result<Vec<f64>> {
    let p = bsp.nprocs();
    measure_c(bsp, Pattern::TotalExchange, words * (p - 1), reps)
}
