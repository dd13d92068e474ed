//! `bench params`: measures this machine's model parameters (thesis §4.8.3,
//! Table 4.5) through the real system and writes them as the `model`
//! crate's TOML parameter file.
//!
//! * `P` (multiply), solve and factor: the slaves' own kernels
//!   (`apps::kernels`: dgemm, dtrsm, dpotrf, dgetrf, dsyrk, and LU's two
//!   dtrsm variants), single-threaded as a slave runs them, over a sweep of
//!   block sizes, each call on operands pushed out of the CPU caches first
//!   ([`CacheEvictor`]), as a slave's blocks come from its reads.
//! * `C` (network): a loopback TCP stream, request then `bytes` back, the
//!   path a block takes between a store node and a slave on one machine.
//! * `Dget` cold: block reads through a store node (a real `master serve`
//!   process, as slaves reach one) right after it was restarted with its
//!   files evicted from the page cache (`posix_fadvise(DONTNEED)`), minus
//!   the network part. Every store figure is measured through that
//!   process from a client on a runtime of one worker, as a slave's:
//!   through a node inside the bench process, sharing its runtime, a
//!   cached get of 512 KiB took 0.06–0.07 ms where `bench validate`'s
//!   cluster measured 0.09–0.13 ms, and a get behind an ending 0.14–0.16
//!   ms against 0.25–0.34.
//! * `Dget` cached: the same blocks read again (RocksDB cache and page
//!   cache), minus the network part. Everything the store node does beyond
//!   moving bytes (gRPC framing, checksums, copies) lands here.
//! * Local get (extension): the cached reads whole, as a slave on the
//!   node's machine makes them (the node passes the version file; the
//!   slave reads and checksums it): with `slave_reads` the model charges
//!   reads this instead of `C`.
//! * `Dput`: a block put plus the commit that makes it durable, minus a
//!   commit of a small record (that part is per-task overhead) and minus the
//!   network part; each put after 5 ms idle, as a job's tasks put theirs
//!   after computing, at least 9 per size.
//! * `Dput` overwrite (extension): the same for a put over the block's older
//!   version, which the node writes in place into the replaced version's
//!   file (LU's in-place updates).
//! * Per-task overhead (extension): begin, dequeue, a small record, commit,
//!   the round trips every task pays whatever its blocks.
//! * Job latency (extension): submission to finished record of a job of
//!   one empty task on a real `master serve` + one `slave` ([`job_latency`]).
//! * Ray tracing pixel rate: the "balls" scene at [`RAY_LEVEL`], with
//!   [`RAY_SAMPLES`]² rays per pixel, as `bench validate` renders it.
//!
//! Each parameter is fitted as the model's piecewise-linear form
//! `cost(x) = max(x, threshold)/bandwidth` by least squares on log time
//! over the sweep ([`fit`]): the threshold is where the measured time stops
//! falling with the size.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, ClusterConfig};
use anyhow::Context;
use apps::block::Block;
use apps::kernels;
use model::{Params, Piecewise};
use serde_json::json;
use store_client::{BlockData, Client, Dequeue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::report::Figure;

/// The pause before each empty task that measures `task_wake`: about a
/// b = 256 task's compute.
const IDLE_BEFORE_TASK: Duration = Duration::from_millis(5);

/// Sphereflake level of the scene `bench params` measures and `bench
/// validate` renders (the pixel rate depends on the scene).
pub(crate) const RAY_LEVEL: u32 = 3;
/// Anti-aliasing samples per side of the same scene.
pub(crate) const RAY_SAMPLES: u32 = 2;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced sweep (fewer sizes, shorter repetitions), under a minute.
    #[arg(long)]
    quick: bool,
    /// Where to write the parameter file (TOML, `model::Params`).
    #[arg(long, default_value = "params.toml")]
    out: PathBuf,
    /// Directory in which the store node's data directory is made (and
    /// removed at the end; default: `~/.cache/ftbag-bench`). Use one on the
    /// disk the real store node will use: Dget/Dput are that disk's rates.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Free-text name written into the file (default: host name and date).
    #[arg(long)]
    name: Option<String>,
    /// Skip the job-latency and slave-start measurements (they start
    /// `master serve` and `slave`s from next to this executable).
    #[arg(long)]
    no_job_latency: bool,
    /// Measure only how much co-running kernels slow each other
    /// (`corun`, factors against one copy alone) and write that into the existing file `--out`,
    /// everything else in it kept: for a file measured before the
    /// parameter existed, or on a machine whose cores changed.
    #[arg(long)]
    corun_only: bool,
    /// Measure `C` across this many network-namespace hosts (needs root):
    /// block gets from the last host through a store node on host 0, each
    /// link at `--rate`; the file's `network` and `network_latency` then
    /// describe that link (`bench validate --hosts`), not loopback.
    #[arg(long)]
    hosts: Option<usize>,
    /// With --hosts: each host's link rate both ways (tc tbf, e.g. 1gbit,
    /// 300mbit; `none` unshaped).
    #[arg(long, default_value = "1gbit", requires = "hosts")]
    rate: String,
}

/// The two latencies of a real cluster (`master serve` and `slave`s from
/// next to this executable), each the median of several jobs of one tiny
/// task (a 1×1 image of one sphere):
/// - job latency: submission to the finished record with one idle slave,
///   the slaves' idle polling for new jobs and the job's bookkeeping, paid
///   once per job whatever its size;
/// - slave start: from starting a slave process, while such a job waits,
///   to the job's finished record (process start, connection, session,
///   dequeue): what a replacement for a failed slave takes before it works.
struct Latencies {
    job: f64,
    slave_start: f64,
    /// The store process's CPU seconds per task ([`Params::store_cpu_per_task`]).
    store_cpu_per_task: f64,
    /// The slave's ([`Params::slave_cpu_per_task`]).
    slave_cpu_per_task: f64,
}

/// `master submit` arguments of a job of one tiny task writing `out`.
fn tiny_job(out: &str) -> [&str; 11] {
    ["raytrace", "--level", "0", "--width", "1", "--height", "1", "--grain", "1", "--out", out]
}

/// Tasks of each job [`cpu_per_task`] runs: the store's CPU is read
/// in clock ticks (10 ms), and 0.2 ms a task makes 100 ms of it.
const CPU_TASKS: u32 = 500;

/// The store process's and the slave's CPU seconds per task: over jobs
/// of [`CPU_TASKS`] tiny tasks (a scanline of one pixel each) less jobs of
/// one, each pair run `rounds` times and summed, so the jobs' own
/// bookkeeping cancels.
fn cpu_per_task(c: &crate::cluster::Cluster, rounds: usize) -> anyhow::Result<(f64, f64)> {
    let height = CPU_TASKS.to_string();
    let cpu = |args: &[&str]| -> anyhow::Result<(f64, f64)> {
        let slaves = |s: &crate::cluster::Snapshot| s.slaves.iter().map(|p| p.cpu_s).sum::<f64>();
        let before = c.snapshot();
        let r = c.run_job(args, Duration::from_secs(120))?;
        anyhow::ensure!(r.ok(), "CPU-per-task job failed: {:?}", r.failure);
        let after = c.snapshot();
        Ok((after.store.cpu_s - before.store.cpu_s, slaves(&after) - slaves(&before)))
    };
    let (mut many, mut one) = ((0.0, 0.0), (0.0, 0.0));
    for k in 0..rounds {
        let out = format!("store-cpu-{k}");
        let m = cpu(&["raytrace", "--level", "0", "--width", "1", "--height", &height, "--grain", "1", "--out", &out])?;
        let o = cpu(&tiny_job(&format!("store-cpu-one-{k}")))?;
        many = (many.0 + m.0, many.1 + m.1);
        one = (one.0 + o.0, one.1 + o.1);
    }
    let per = |many: f64, one: f64| ((many - one) / (rounds as f64 * f64::from(CPU_TASKS - 1))).max(0.0);
    Ok((per(many.0, one.0), per(many.1, one.1)))
}

fn latencies(quick: bool) -> anyhow::Result<Latencies> {
    use crate::cluster::{Cluster, ClusterConfig};
    let mut c = Cluster::start(ClusterConfig { slaves: 1, ..ClusterConfig::default() })?;
    let mut job = Vec::new();
    for k in 0..if quick { 3 } else { 7 } {
        let r = c.run_job(&tiny_job(&format!("latency-{k}")), Duration::from_secs(120))?;
        anyhow::ensure!(r.ok(), "latency job failed: {:?}", r.failure);
        job.push(r.seconds);
    }
    let (store_cpu_per_task, slave_cpu_per_task) = cpu_per_task(&c, if quick { 1 } else { 3 })?;
    c.kill_slave(0)?;
    let mut start = Vec::new();
    for k in 0..if quick { 2 } else { 5 } {
        let id = c.submit(&tiny_job(&format!("start-{k}")))?;
        let t0 = Instant::now();
        let slave = c.spawn_slave()?;
        let r = c.wait(id, Duration::from_secs(120))?;
        anyhow::ensure!(r.ok(), "slave-start job failed: {:?}", r.failure);
        start.push(t0.elapsed().as_secs_f64());
        c.kill_slave(slave)?;
    }
    Ok(Latencies { job: median(&mut job), slave_start: median(&mut start), store_cpu_per_task, slave_cpu_per_task })
}

/// One measured point of a sweep: work (flop or bytes) and seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Point {
    pub(crate) units: f64,
    pub(crate) secs: f64,
}

/// Least-squares fit of `max(x, th)/bw` to the points, on log time (every
/// size weighs the same whatever its duration). For each candidate
/// threshold the best bandwidth is closed-form (mean of the log ratios); the
/// threshold with the least residual wins.
pub(crate) fn fit(points: &[Point]) -> Piecewise {
    let pts: Vec<Point> = points.iter().copied().filter(|p| p.units > 0.0 && p.secs > 0.0).collect();
    if pts.is_empty() {
        return Piecewise::new(1.0, 0.0);
    }
    let lo = pts.iter().map(|p| p.units).fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|p| p.units).fold(0.0, f64::max);
    let mut candidates = vec![0.0];
    let steps = 80;
    for k in 0..=steps {
        // From a quarter of the smallest size to the largest, geometrically.
        candidates.push(lo / 4.0 * (hi / (lo / 4.0)).powf(k as f64 / steps as f64));
    }
    // The measured sizes too: a kink at a swept size is then found exactly,
    // not one grid step off (which also skews the bandwidth).
    candidates.extend(pts.iter().map(|p| p.units));
    let mut best = (f64::INFINITY, Piecewise::new(1.0, 0.0));
    for th in candidates {
        let logs: Vec<f64> = pts.iter().map(|p| (p.units.max(th) / p.secs).ln()).collect();
        let log_bw = logs.iter().sum::<f64>() / logs.len() as f64;
        let res: f64 = logs.iter().map(|l| (l - log_bw).powi(2)).sum();
        // Prefer the smaller threshold on (near) ties: no kink unless the data asks.
        if res < best.0 * (1.0 - 1e-9) {
            best = (res, Piecewise::new(log_bw.exp(), th));
        }
    }
    best.1
}

/// The points a fit uses: those at or above `min_units` (blocks smaller
/// than that are not worth running: the per-task overhead dwarfs them, and
/// kernels there do not follow one bandwidth), without anomalies: a point
/// slower than a larger size of the same sweep (e.g. a small gRPC reply
/// caught by a delayed ACK) is printed and left out.
pub(crate) fn fit_range(points: &[Point], min_units: f64, what: &str) -> Piecewise {
    let mut kept = Vec::new();
    for (k, p) in points.iter().enumerate() {
        if p.units < min_units {
            continue;
        }
        if points[k + 1..].iter().any(|q| q.units > p.units && q.secs < p.secs) {
            eprintln!("{what}: {:.0} units took {:.3} ms, more than a larger size: left out of the fit", p.units, p.secs * 1e3);
            continue;
        }
        kept.push(*p);
    }
    fit(if kept.is_empty() { points } else { &kept })
}

/// Median seconds of one call of `op`, repeated until `min_secs` passed
/// (at least 3 calls after one warm-up). `setup` builds each call's input
/// outside the timed part.
fn time_kernel<T>(min_secs: f64, mut setup: impl FnMut() -> T, mut op: impl FnMut(&mut T)) -> f64 {
    let mut x = setup();
    op(&mut x);
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || start.elapsed().as_secs_f64() < min_secs {
        CacheEvictor::run_here();
        let mut x = setup();
        let t = Instant::now();
        op(&mut x);
        times.push(t.elapsed().as_secs_f64());
        if times.len() >= 10_000 {
            break;
        }
    }
    median(&mut times)
}

/// Pushes everything out of the CPU caches before each timed call, so
/// that the call's operands are where they are in a job: a slave's
/// kernels run on blocks its reads have just copied from the page cache
/// (the copies in the caches, their sources not), between other blocks,
/// not on operands left in the caches by the previous call. So each
/// kernel's `setup` copies its operands from sources evicted here, as a
/// read does, and the timed call finds the copies warm. (Timing the
/// copies' sources cold instead, as the sweep did until 2026-11-25: dgemm
/// at b = 256 ran 44–46 Gflop/s, against 52.1–52.7 with operands copied
/// in and 52.2–52.9 warm, b = 512 49–51 against 51–53, b = 1024 the same;
/// in a matmul job, n = 4096, one slave, its 4096 dgemms took 2.69 s of
/// `kernel_ms`, 51.0 Gflop/s. `bench validate`, old and new sweep
/// alternating twice: mean |error| 5.5 and 4.9 % before, 4.8 and 4.3 %
/// after; largest 24.1 and 14.4 %, 12.0 and 15.8 %. Long ago, with kernels
/// timed warm and without the per-task costs the model has now, it had
/// predicted every b = 256 Cholesky and LU job 15–25 % faster than it ran.)
struct CacheEvictor(Vec<u64>);

impl CacheEvictor {
    /// Twice the largest cache this machine reports, and at least 64 MiB
    /// (a fixed 64 MiB until 2026-11-27, twice this VM's 32 MiB L3; a
    /// 16-vCPU Xeon VM reported 300 MiB, and timed its kernels on operands
    /// left in that cache: a matmul job's dgemms at b = 512 ran 22–38 %
    /// over their time alone there).
    fn bytes() -> usize {
        let largest = (0..8)
            .filter_map(|i| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size")).ok())
            .filter_map(|size| cache_bytes(&size))
            .max()
            .unwrap_or(0);
        (2 * largest).max(64 << 20)
    }

    fn new() -> Self {
        CacheEvictor(vec![1; Self::bytes() / 8])
    }

    /// Runs this thread's evictor, made on first use (hundreds of MiB on
    /// a large machine: made once, not per kernel timed).
    fn run_here() {
        thread_local! {
            static EVICTOR: std::cell::RefCell<CacheEvictor> = std::cell::RefCell::new(CacheEvictor::new());
        }
        EVICTOR.with(|e| e.borrow_mut().run());
    }

    fn run(&mut self) {
        let mut sum = 0u64;
        for v in self.0.iter_mut().step_by(8) {
            // One word per 64-byte line, read and written.
            *v = v.wrapping_add(1);
            sum = sum.wrapping_add(*v);
        }
        std::hint::black_box(sum);
    }
}

/// A cache size as sysfs writes it (`32768K`, `1M`, a plain count of
/// bytes), in bytes.
fn cache_bytes(size: &str) -> Option<usize> {
    let size = size.trim();
    let (digits, unit) = match size.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => size.split_at(at),
        None => (size, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(scale)
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

pub(crate) fn random_block(b: usize, seed: u64) -> Block {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut blk = Block::zeros(b, b);
    for v in blk.data.iter_mut() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *v = ((x >> 11) as f64 / (1u64 << 53) as f64) - 0.5;
    }
    blk
}

/// Diagonally dominant, hence SPD when symmetric: potrf and getrf without
/// pivoting trouble.
fn spd_block(b: usize) -> Block {
    let r = random_block(b, 7);
    let mut a = Block::zeros(b, b);
    for i in 0..b {
        for j in 0..b {
            let v = 0.5 * (r.get(i, j) + r.get(j, i));
            a.set(i, j, if i == j { v + b as f64 } else { v });
        }
    }
    a
}

/// Times of the kernels at each block size.
#[derive(Default)]
struct KernelSweep {
    multiply: Vec<Point>,
    solve: Vec<Point>,
    factor: Vec<Point>,
    lu: Vec<Point>,
    syrk: Vec<Point>,
    lu_solve: Vec<Point>,
    multiply_transposed: Vec<Point>,
}

impl KernelSweep {
    /// The measured points as the model's kernel curves.
    fn curves(&self) -> model::KernelCurves {
        let pts = |v: &[Point]| v.iter().map(|p| [p.units, p.secs]).collect();
        model::KernelCurves {
            multiply: pts(&self.multiply),
            solve: pts(&self.solve),
            factor: pts(&self.factor),
            lu: pts(&self.lu),
            syrk: pts(&self.syrk),
            lu_solve: pts(&self.lu_solve),
            multiply_transposed: pts(&self.multiply_transposed),
        }
    }
}

/// The kernels timed again at one block size, as `bench validate` does
/// before each job: the fastest of two short passes.
pub(crate) fn kernels_now(b: usize, quick: bool) -> model::KernelCurves {
    sweep_kernels_best_of(&[b], if quick { 0.03 } else { 0.1 }, 2).curves()
}

/// The kernel sweep `passes` times over; each size keeps its fastest pass.
/// Another process on a shared machine only ever slows a kernel down, and
/// one disturbed pass moved single sizes by 40 % here (b = 256 gemm: 29
/// then 46 Gflop/s in two runs a minute apart).
fn sweep_kernels_best_of(sizes: &[usize], min_secs: f64, passes: usize) -> KernelSweep {
    let best = |a: &mut Vec<Point>, b: Vec<Point>| {
        if a.is_empty() {
            *a = b;
        } else {
            for (x, y) in a.iter_mut().zip(b) {
                x.secs = x.secs.min(y.secs);
            }
        }
    };
    let mut k = KernelSweep::default();
    for pass in 0..passes.max(1) {
        eprintln!("kernel sweep, pass {} of {passes}", pass + 1);
        let s = sweep_kernels(sizes, min_secs);
        best(&mut k.multiply, s.multiply);
        best(&mut k.solve, s.solve);
        best(&mut k.factor, s.factor);
        best(&mut k.lu, s.lu);
        best(&mut k.syrk, s.syrk);
        best(&mut k.lu_solve, s.lu_solve);
        best(&mut k.multiply_transposed, s.multiply_transposed);
    }
    k
}

fn sweep_kernels(sizes: &[usize], min_secs: f64) -> KernelSweep {
    let mut k = KernelSweep::default();
    for &b in sizes {
        let bf = b as f64;
        let (a, bb) = (random_block(b, 1), random_block(b, 2));
        let spd = spd_block(b);
        let mut l = spd.clone();
        kernels::potrf_lower(&mut l).expect("diagonally dominant block is SPD");
        kernels::zero_strict_upper(&mut l);
        // The multiply task body: C += A·B (dgemm with beta = 1), 2b³ flop.
        let t_mult = time_kernel(
            min_secs,
            || (a.clone(), bb.clone(), random_block(b, 3)),
            |(a, bb, c)| kernels::gemm(1.0, a, false, bb, false, 1.0, c),
        );
        // Cholesky's update: C −= A·Bᵀ, 2b³ flop (2–4 % slower than C += A·B
        // at b = 256 and 512 here: a scratch program, three rounds, 49.1–49.8
        // against 51.2–51.3 Gflop/s at b = 512).
        let t_mult_t = time_kernel(
            min_secs,
            || (a.clone(), bb.clone(), random_block(b, 3)),
            |(a, bb, c)| kernels::gemm(-1.0, a, false, bb, true, 1.0, c),
        );
        // Cholesky's panel: X·Lᵀ = B, b³ flop.
        let t_solve = time_kernel(min_secs, || (l.clone(), random_block(b, 4)), |(l, x)| kernels::trsm_right_lower_trans(l, x));
        // Cholesky's diagonal block: b³/3 flop.
        let t_chol = time_kernel(
            min_secs,
            || spd.clone(),
            |x| {
                let _ = kernels::potrf_lower(x);
            },
        );
        // LU's diagonal block with pivoting: 2b³/3 flop.
        let t_lu = time_kernel(
            min_secs,
            || spd.clone(),
            |x| {
                let _ = kernels::getrf(x);
            },
        );
        // Cholesky's diagonal update: C −= A·Aᵀ, lower triangle, b³ flop.
        let t_syrk = time_kernel(min_secs, || (a.clone(), random_block(b, 5)), |(a, c)| kernels::syrk_lower(-1.0, a, 1.0, c));
        // LU's solves, b³ flop each: L(i,k) = X·U⁻¹ and U(k,j) = L⁻¹·X, with
        // the factored diagonal block; half of LU's solve tasks are each.
        let mut d = spd.clone();
        kernels::lu_nopiv(&mut d).expect("diagonally dominant block");
        let t_solve_l = time_kernel(min_secs, || (d.clone(), random_block(b, 6)), |(d, x)| kernels::trsm_right_upper(d, x));
        let t_solve_u = time_kernel(min_secs, || (d.clone(), random_block(b, 7)), |(d, x)| kernels::trsm_left_lower_unit(d, x));
        let t_lu_solve = 0.5 * (t_solve_l + t_solve_u);
        let cube = bf * bf * bf;
        k.lu_solve.push(Point { units: cube, secs: t_lu_solve });
        k.syrk.push(Point { units: cube, secs: t_syrk });
        k.multiply.push(Point { units: 2.0 * cube, secs: t_mult });
        k.multiply_transposed.push(Point { units: 2.0 * cube, secs: t_mult_t });
        k.solve.push(Point { units: cube, secs: t_solve });
        k.factor.push(Point { units: cube / 3.0, secs: t_chol });
        k.lu.push(Point { units: 2.0 * cube / 3.0, secs: t_lu });
        eprintln!(
            "kernels b={b:>5}: gemm {:>7.2} Gflop/s  gemm A·Bᵀ {:>7.2}  trsm {:>7.2}  potrf {:>7.2}  getrf {:>7.2}  syrk {:>7.2}  LU trsm {:>7.2}",
            2.0 * cube / t_mult / 1e9,
            2.0 * cube / t_mult_t / 1e9,
            cube / t_solve / 1e9,
            cube / 3.0 / t_chol / 1e9,
            2.0 * cube / 3.0 / t_lu / 1e9,
            cube / t_syrk / 1e9,
            cube / t_lu_solve / 1e9
        );
    }
    k
}

/// Pixels per second of one slave rendering the validation scene at
/// `side`² pixels: 32 bands of 4 scanlines spread down the image (an
/// eighth of a 1024² image, 0.2 s), the fastest of three passes. (16 bands
/// of 8 put the validation scene's 1024² image at 1.163–1.180 s where
/// rendering it whole took 1.198–1.236, six times in a row: the rows
/// between them cost more than the rows they sampled. 32 of 4 put it at
/// 1.188–1.206; bands of fewer rows pay more per call.) At the
/// image's own size, because a pixel costs less the finer the image
/// (neighbouring rays take the same paths through the scene, and the
/// branch predictor and caches follow): 384² renders ran at 445–584k
/// pixel/s where 1024² ones ran at 527–644k, pass by pass alternating,
/// and 384² rates predicted the validation's 1024² jobs 7–14 % too slow.
/// (One render of 0.14 s read 258k pixel/s on a machine where the jobs
/// ran at 364k: hence three passes.)
///
/// Also the bands' relative costs, top to bottom (`Params::ray_profile`),
/// from the same pass: the scene's rows are far from equal.
pub(crate) fn ray_rate(side: u32, quick: bool) -> anyhow::Result<RayRate> {
    let (bands, rows, passes) = if quick { (4, 4, 1) } else { (32, 4, 3) };
    let p = apps::raytrace::RenderParams { level: RAY_LEVEL, width: side, height: side, grain: side, samples: RAY_SAMPLES };
    let rows = rows.min(side);
    let firsts: Vec<u32> = (0..bands).map(|k| (side - rows) * k / (bands - 1).max(1)).collect();
    let mut best = RayRate { pixels_per_s: 0.0, profile: Vec::new() };
    for _ in 0..passes {
        let mut times = Vec::with_capacity(firsts.len());
        for &first in &firsts {
            let t = Instant::now();
            let _ = apps::raytrace::render_rows(&p, first, first + rows - 1)?;
            times.push(t.elapsed().as_secs_f64());
        }
        let total: f64 = times.iter().sum();
        let rate = (firsts.len() as u32 * rows * side) as f64 / total;
        if rate > best.pixels_per_s {
            let mean = total / times.len() as f64;
            best = RayRate { pixels_per_s: rate, profile: times.iter().map(|t| t / mean).collect() };
        }
    }
    Ok(best)
}

/// One slave's ray-tracing speed on the validation scene.
pub(crate) struct RayRate {
    /// Pixels per second over the whole image.
    pub(crate) pixels_per_s: f64,
    /// Each sampled band's cost relative to their mean, top to bottom.
    pub(crate) profile: Vec<f64>,
}

/// Puts `block` as block `(i, j)` of `matrix` in an action of its own;
/// returns the seconds of begin, put and commit.
async fn timed_put(session: &store_client::Session, matrix: uuid::Uuid, i: u32, j: u32, block: Block) -> anyhow::Result<f64> {
    let t = Instant::now();
    let a = session.begin().await?;
    a.put_block(matrix, i, j, BlockData { rows: block.rows, cols: block.cols, data: block.data }).await?;
    a.commit().await?;
    Ok(t.elapsed().as_secs_f64())
}

/// Runs `n` empty tasks through `bag` as a slave's loop does (begin,
/// dequeue, a done record, commit), each after `pause`; returns their times.
async fn empty_tasks(session: &store_client::Session, bag: &str, n: usize, pause: Duration) -> anyhow::Result<Vec<f64>> {
    let a = session.begin().await?;
    for k in 0..n {
        a.enqueue(bag, &(k as u64).to_le_bytes()).await?;
    }
    a.commit().await?;
    let mut times = Vec::with_capacity(n);
    loop {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let t = Instant::now();
        let a = session.begin().await?;
        let Dequeue::Task(task) = a.dequeue(bag, Duration::ZERO).await? else {
            a.abort().await?;
            return Ok(times);
        };
        a.write_small(&format!("{bag}/done/{}", task.seq), &[1u8; 64]).await?;
        a.commit().await?;
        times.push(t.elapsed().as_secs_f64());
    }
}

/// Counters the measured release requests name, few and many: a dag
/// Cholesky task names one per successor, 10 on average at p = 16
/// (n = 4096, b = 256: 1,360 releases by 135 tasks) and 21 at p = 32. The
/// two sizes give the request's fixed part and its cost per counter.
const RELEASE_COUNTERS: [usize; 2] = [4, 32];

/// Release requests as a dag Cholesky task makes them after its kernels,
/// from its blocking thread: `counters` successors' counters
/// read under their write locks in one request (waited for) and written
/// back behind in another (not waited for). Returns the time of each of `n`.
async fn dag_releases(session: &store_client::Session, n: usize, counters: usize) -> anyhow::Result<Vec<f64>> {
    let keys = move |r: usize| -> Vec<String> { (0..counters).map(|k| format!("bench-params/counter/{counters}/{r}/{k}")).collect() };
    let a = session.begin().await?;
    for r in 0..n {
        for key in keys(r) {
            a.write_small(&key, &2u32.to_le_bytes()).await?;
        }
    }
    a.commit().await?;
    let a = session.begin().await?;
    let rt = tokio::runtime::Handle::current();
    let (a, times) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut times = Vec::with_capacity(n);
        let mut behind = Vec::with_capacity(n);
        for r in 0..n {
            let keys = keys(r);
            let t = Instant::now();
            let values = rt.block_on(a.read_smalls(&keys, true))?;
            for (key, v) in keys.iter().zip(&values) {
                anyhow::ensure!(v.as_deref() == Some(&2u32.to_le_bytes()[..]), "counter {key} read back as {v:?}");
            }
            let written: Vec<(String, Vec<u8>)> = keys.iter().map(|k| (k.clone(), 1u32.to_le_bytes().to_vec())).collect();
            behind.push(rt.spawn(a.write_smalls(&written)));
            times.push(t.elapsed().as_secs_f64());
        }
        for h in behind {
            rt.block_on(h)??;
        }
        Ok((a, times))
    })
    .await??;
    a.commit().await?;
    Ok(times)
}

/// A slave's costs per task beyond its blocks and kernels (seconds).
pub(crate) struct TaskCosts {
    /// The round trips of an empty task (`Params::task_overhead`).
    pub(crate) overhead: f64,
    /// What they take more after a kernel's worth of idling (`task_wake`).
    pub(crate) wake: f64,
    /// One dag Cholesky task's release request, its fixed part
    /// (`dag_release`) ...
    pub(crate) release: f64,
    /// ... and what it takes more per counter (`dag_release_per_counter`).
    pub(crate) release_per_counter: f64,
}

/// The per-task costs through `session`'s node, as `bench params`
/// measures them.
async fn task_costs(session: &store_client::Session, quick: bool) -> anyhow::Result<TaskCosts> {
    let n_tasks = if quick { 50 } else { 200 };
    let overhead = median(&mut empty_tasks(session, "bench-params/overhead", n_tasks, Duration::ZERO).await?);
    // The same after a pause as long as a small task's compute, with the
    // client and the node idle meanwhile: what a slave's first round trips
    // after a kernel pay.
    let mut after_idle = empty_tasks(session, "bench-params/overhead-after-idle", n_tasks / 2, IDLE_BEFORE_TASK).await?;
    let wake = (median(&mut after_idle) - overhead).max(0.0);
    let [few, many] = RELEASE_COUNTERS;
    let t_few = median(&mut dag_releases(session, n_tasks, few).await?);
    let t_many = median(&mut dag_releases(session, n_tasks, many).await?);
    // Noise must not make either part negative.
    let release_per_counter = ((t_many - t_few) / (many - few) as f64).max(0.0);
    let release = (t_few - few as f64 * release_per_counter).max(0.0);
    Ok(TaskCosts { overhead, wake, release, release_per_counter })
}

/// The per-task costs measured again through a running node, as `bench
/// validate` does before each point: on this host they drift as the
/// kernels do (overhead and wake together 0.47, 0.98 and 1.0 ms in three
/// `bench params` runs within an hour), and a job pays them per task.
pub(crate) async fn task_costs_now(client: &Client, quick: bool) -> anyhow::Result<TaskCosts> {
    let session = client.open_session("bench-task-costs").await?;
    task_costs(&session, quick).await
}

/// A task's ending and a task start behind it, at blocks of side `b`,
/// measured again through a running node as `bench params` measures them
/// ([`task_starts_behind_endings`]), for `bench validate` before each
/// block size: they follow the disk's sync latency, which drifts here as
/// the kernels do (the mean ending at 512 KiB read 0.74, 0.91 and 1.09 ms
/// in three `bench params` runs within a day), and a dag task's
/// successors wait for its ending. Returns `(start behind, ending)`.
///
/// The matrix is filled first, so that every timed put replaces an older
/// version of its block, as a job's and `bench params`' do. (Until
/// 2026-11-27 it was empty, and half the puts made a block's first
/// version: at 8 MiB the endings re-timed before each point read 8.4–13.4
/// ms where the parameter file said 3.6, the jobs' own 5.1–10.3, and the
/// dag Cholesky at b = 1024 with two slaves was predicted 12.6 % long.)
pub(crate) async fn endings_now(client: &Client, b: usize) -> anyhow::Result<(Point, Point)> {
    // 16 blocks, each then overwritten twice.
    let g = 4u32;
    let id = filled_matrix(client, &format!("bench-endings-now-{}-{b}", std::process::id()), b, g).await?;
    let measured = task_starts_behind_endings(client, &[(b, id, g)]).await;
    client.delete_matrix(id).await?;
    let (starts, endings) = measured?;
    Ok((starts[0], endings[0]))
}

/// `curve` with `p`, measured again, in place of its point at the same
/// size (`model::curves::merge`).
pub(crate) fn merged(curve: Option<&[[f64; 2]]>, p: Point) -> Option<Vec<[f64; 2]>> {
    Some(model::curves::merge(curve.unwrap_or(&[]), &[[p.units, p.secs]]))
}

/// A measured curve's milliseconds at `units`, for printing beside a
/// figure measured again ("-" without the curve).
pub(crate) fn ms_at(curve: Option<&[[f64; 2]]>, units: f64) -> String {
    curve.filter(|c| !c.is_empty()).map_or("-".to_owned(), |c| format!("{:.3}", model::curves::interpolate(c, units) * 1e3))
}

/// Everything measured through the store node and the loopback.
struct StoreSweep {
    network: Vec<Point>,
    hot_get: Vec<Point>,
    /// Cached reads while a put and commit run ([`gets_behind_puts`]).
    get_behind: Vec<Point>,
    cold_get: Vec<Point>,
    put: Vec<Point>,
    /// Puts over a block's older version.
    put_over: Vec<Point>,
    commit_small: f64,
    per_task: TaskCosts,
    /// Task starts behind an ending, beyond quiet ones ([`task_starts_behind_endings`]).
    start_behind: Vec<Point>,
    /// The endings themselves, whole ([`task_starts_behind_endings`]).
    endings: Vec<Point>,
}

/// Evicts every file under `dir` from the page cache (after syncing it):
/// the next read comes from the disk, as a store node's first read after a
/// reboot, without needing root to drop all caches.
fn evict(dir: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            evict(&path)?;
            continue;
        }
        let Ok(f) = std::fs::File::open(&path) else { continue };
        let _ = f.sync_all();
        // SAFETY: a valid open descriptor; fadvise only drops clean pages.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    Ok(())
}

/// A round trip over loopback TCP: 8-byte request, `bytes` back.
async fn loopback(sizes: &[usize], reps: usize) -> anyhow::Result<Vec<Point>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let max = *sizes.iter().max().unwrap_or(&1);
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let buf = vec![7u8; max];
        let mut req = [0u8; 8];
        while s.read_exact(&mut req).await.is_ok() {
            let n = u64::from_le_bytes(req) as usize;
            s.write_all(&buf[..n.min(max)]).await?;
        }
        anyhow::Ok(())
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let mut buf = vec![0u8; max];
    let mut out = Vec::new();
    for &n in sizes {
        let mut times = Vec::new();
        for _ in 0..reps + 1 {
            let t = Instant::now();
            c.write_all(&(n as u64).to_le_bytes()).await?;
            c.read_exact(&mut buf[..n]).await?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.remove(0);
        out.push(Point { units: n as f64, secs: median(&mut times) });
    }
    drop(c);
    let _ = server.await;
    Ok(out)
}

/// The idle time before each timed put of the store sweep.
const PUT_PAUSE: Duration = Duration::from_millis(5);

/// The store sweep through `node`, a cluster of a store node and no
/// slaves: warm, then (the node killed, its files evicted, the node
/// restarted) cold.
fn sweep_store(node: &mut Cluster, blocks: &[usize], quick: bool) -> anyhow::Result<StoreSweep> {
    let bytes: Vec<usize> = blocks.iter().map(|b| 8 * b * b).collect();
    let network = node.with_client(|_| loopback(&bytes, if quick { 5 } else { 15 }))?;
    let warm = node.with_client(|client| sweep_warm(client, blocks, quick))?;
    // Cold: a fresh node (empty block cache) over files out of the page
    // cache. Killed, not stopped: the blocks are in their synced version
    // files, and its recovery replays the commits' log.
    node.kill_store()?;
    evict(node.dir())?;
    node.restart_store()?;
    let cold_get = node.with_client(|client| async move { read_all(&client, &warm.matrices, 1).await })?;
    Ok(StoreSweep { network, cold_get, ..warm.sweep })
}

/// The store node's CPU seconds per block get (`Params::store_cpu_per_get`):
/// the node process's CPU over thousands of gets of cached blocks, 256 to
/// an action (each block once, so each get takes its lock), divided by
/// the gets (the actions' begins and commits, about 4 % of it, left in).
/// Small blocks: a local get's node work does not grow with the block
/// (the slave reads the file), and they keep the run short.
fn store_cpu_per_get(node: &Cluster, quick: bool) -> anyhow::Result<f64> {
    const B: usize = 32;
    const G: u32 = 16;
    // The CPU is read in clock ticks (10 ms): 4096 gets make about 0.1-0.2 s
    // of it, 2048 (quick) half.
    let rounds = if quick { 8 } else { 16 };
    let name = format!("bench-params-cpu-per-get-{}", std::process::id());
    let m = node.with_client(|c| async move { filled_matrix(&c, &name, B, G).await })?;
    let gets = |rounds: u32| {
        node.with_client(|c| async move {
            let session = c.open_session("bench-params-cpu-per-get").await?;
            for _ in 0..rounds {
                let a = session.begin().await?;
                for i in 0..G {
                    for j in 0..G {
                        a.get_block(m, i, j).await?;
                    }
                }
                a.commit().await?;
            }
            anyhow::Ok(())
        })
    };
    // Warm: the files opened and cached.
    gets(1)?;
    let before = node.snapshot().store.cpu_s;
    gets(rounds)?;
    let cpu = node.snapshot().store.cpu_s - before;
    node.with_client(|c| async move { Ok(c.delete_matrix(m).await?) })?;
    Ok(cpu / f64::from(rounds * G * G))
}

/// The store sweep's part on a warm node; `matrices` for the cold reads.
struct Warm {
    sweep: StoreSweep,
    matrices: Vec<(usize, uuid::Uuid, u32)>,
}

async fn sweep_warm(client: Client, blocks: &[usize], quick: bool) -> anyhow::Result<Warm> {
    let bytes: Vec<usize> = blocks.iter().map(|b| 8 * b * b).collect();
    let session = client.open_session("bench-params").await?;
    let mut matrices = Vec::new();
    let mut put = Vec::new();
    let mut put_over = Vec::new();
    let mut commit_small = Vec::new();
    for &b in blocks {
        // Enough blocks for a steady median, at most ~64 MB per size.
        let budget = if quick { 16e6 } else { 64e6 };
        // At least 9, so one slow put (a node's first of a size) is not
        // the median of 4.
        let g = (((budget / (8.0 * (b * b) as f64)).sqrt().floor() as u32).clamp(3, 12)) as u64;
        let m = client.create_matrix(&format!("bench-params-{b}"), g * b as u64, g * b as u64, b as u32).await?;
        let mut times = Vec::new();
        for i in 0..g as u32 {
            for j in 0..g as u32 {
                // A job's slaves put one block per task, with the disk idle
                // while they compute; back to back, a VM's disk runs at its
                // sustained rate (n = 4096, b = 1024: 8–17 ms per put and
                // commit back to back, 3–9 ms in a dag Cholesky's tasks).
                tokio::time::sleep(PUT_PAUSE).await;
                times.push(timed_put(&session, m.id, i, j, random_block(b, (i * 100 + j) as u64)).await?);
                let t = Instant::now();
                let a = session.begin().await?;
                a.write_small(&format!("bench-params/commit/{b}/{i}/{j}"), &[0u8; 8]).await?;
                a.commit().await?;
                commit_small.push(t.elapsed().as_secs_f64());
            }
        }
        put.push((b, median(&mut times)));
        // The same blocks again: each put now writes over the version it
        // replaces, as LU's in-place updates do (the node recycles the
        // replaced version's file).
        let mut times = Vec::new();
        for i in 0..g as u32 {
            for j in 0..g as u32 {
                tokio::time::sleep(PUT_PAUSE).await;
                times.push(timed_put(&session, m.id, i, j, random_block(b, (i * 100 + j + 7) as u64)).await?);
            }
        }
        put_over.push((b, median(&mut times)));
        matrices.push((b, m.id, g as u32));
    }
    let commit_small = median(&mut commit_small);
    let minus_commit = |v: &[(usize, f64)]| -> Vec<Point> {
        bytes.iter().zip(v).map(|(&n, &(_, t))| Point { units: n as f64, secs: (t - commit_small).max(1e-7) }).collect()
    };
    let (put, put_over) = (minus_commit(&put), minus_commit(&put_over));

    // Per-task costs: what a slave's loop pays around an empty task.
    let per_task = task_costs(&session, quick).await?;

    // Cached reads: a first pass warms the caches, the second is timed.
    let _ = read_all(&client, &matrices, 1).await?;
    let hot_get = read_all(&client, &matrices, 1).await?;
    let get_behind = gets_behind_puts(&client, &matrices).await?;
    let (start_behind, endings) = task_starts_behind_endings(&client, &matrices).await?;
    let sweep = StoreSweep {
        network: Vec::new(),
        hot_get,
        get_behind,
        cold_get: Vec::new(),
        put,
        put_over,
        commit_small,
        per_task,
        start_behind,
        endings,
    };
    Ok(Warm { sweep, matrices })
}

/// Every block of each matrix read `passes` times, one get per action;
/// per block size, the median seconds of a get.
pub(crate) async fn read_all(client: &Client, matrices: &[(usize, uuid::Uuid, u32)], passes: usize) -> anyhow::Result<Vec<Point>> {
    let session = client.open_session("bench-params-read").await?;
    let mut out = Vec::new();
    for &(b, id, g) in matrices {
        let mut times = Vec::new();
        for _ in 0..passes {
            for i in 0..g {
                for j in 0..g {
                    let a = session.begin().await?;
                    // Timed inside a task of the runtime, as a slave's
                    // prefetch runs: from the caller's thread (`block_on`)
                    // each reply would also pay that thread's wake-up.
                    let (a, blk, secs) = tokio::spawn(async move {
                        let t = Instant::now();
                        let blk = a.get_block(id, i, j).await;
                        let secs = t.elapsed().as_secs_f64();
                        (a, blk, secs)
                    })
                    .await?;
                    let blk = blk?;
                    times.push(secs);
                    anyhow::ensure!(blk.data.len() == b * b, "block of {} values, want {}", blk.data.len(), b * b);
                    a.commit().await?;
                }
            }
        }
        out.push(Point { units: (8 * b * b) as f64, secs: median(&mut times) });
    }
    Ok(out)
}

/// A cached read and a read behind a task's ending (`Params::local_get`
/// and `local_get_behind`) at blocks of side `b`, measured again through
/// a running node for `bench validate` before each block size, as
/// [`endings_now`]. They drift more than a point's error allows: the fit
/// of `local_get` read 6.6, 8.2, 8.6 and 10.2 GB/s in four `bench
/// params` runs of one day (at b = 256 the 6.6 one predicts the one-slave
/// dag Cholesky at n = 4096 6.4 % slower than the 10.2 one), and a b × b
/// point reads only b × b blocks. Returns `(local get, behind an ending)`.
pub(crate) async fn gets_now(client: &Client, b: usize) -> anyhow::Result<(Point, Point)> {
    // 16 blocks, as for the endings; each read in three passes (a first
    // one untimed, to warm the caches), and once behind an ending.
    let g = 4u32;
    let m = filled_matrix(client, &format!("bench-gets-now-{}-{b}", std::process::id()), b, g).await?;
    let matrices = [(b, m, g)];
    let measured = async {
        read_all(client, &matrices, 1).await?;
        let cached = read_all(client, &matrices, 2).await?;
        let behind = gets_behind_puts(client, &matrices).await?;
        anyhow::Ok((cached[0], behind[0]))
    }
    .await;
    client.delete_matrix(m).await?;
    measured
}

/// A new matrix `name` of `g × g` blocks of side `b`, each put (with its
/// own commit) from random values; its id.
pub(crate) async fn filled_matrix(client: &Client, name: &str, b: usize, g: u32) -> anyhow::Result<uuid::Uuid> {
    let side = u64::from(g) * b as u64;
    let m = client.create_matrix(name, side, side, b as u32).await?;
    let session = client.open_session("bench-fill").await?;
    for i in 0..g {
        for j in 0..g {
            timed_put(&session, m.id, i, j, random_block(b, u64::from(i * 100 + j))).await?;
        }
    }
    Ok(m.id)
}

/// Cached reads as a slave's task thread makes its first ones under
/// write-behind (`Params::local_get_behind`): from a blocking thread
/// through `Handle::block_on`, each while a put and commit of another
/// block of the same size (the previous task's ending) run on the
/// runtime, started just before. Per block size, the median seconds.
async fn gets_behind_puts(client: &Client, matrices: &[(usize, uuid::Uuid, u32)]) -> anyhow::Result<Vec<Point>> {
    let session = std::sync::Arc::new(client.open_session("bench-params-read-behind").await?);
    let rt = tokio::runtime::Handle::current();
    let mut out = Vec::new();
    for &(b, id, g) in matrices {
        let (session, rt) = (session.clone(), rt.clone());
        let mut times = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<f64>> {
            let mut times = Vec::new();
            for i in 0..g {
                for j in 0..g {
                    // The ending writes a block this read does not lock.
                    let (wi, wj) = ((i + 1) % g, j);
                    let block = random_block(b, (i * 100 + j + 13) as u64);
                    let ending = rt.spawn(task_ending(session.clone(), id, (wi, wj), block, None));
                    let a = rt.block_on(session.begin())?;
                    let t = Instant::now();
                    let blk = rt.block_on(a.get_block(id, i, j))?;
                    times.push(t.elapsed().as_secs_f64());
                    anyhow::ensure!(blk.data.len() == b * b, "block of {} values, want {}", blk.data.len(), b * b);
                    rt.block_on(a.commit())?;
                    rt.block_on(ending)??;
                }
            }
            Ok(times)
        })
        .await??;
        out.push(Point { units: (8 * b * b) as f64, secs: median(&mut times) });
    }
    Ok(out)
}

/// A task's ending as a slave runs it behind its next task: a put of
/// `block` at `at`, the task's done record if given, the commit.
async fn task_ending(
    session: std::sync::Arc<store_client::Session>,
    matrix: uuid::Uuid,
    at: (u32, u32),
    block: Block,
    record: Option<String>,
) -> Result<(), store_client::StoreError> {
    let a = session.begin().await?;
    a.put_block(matrix, at.0, at.1, BlockData { rows: block.rows, cols: block.cols, data: block.data }).await?;
    if let Some(key) = record {
        a.write_small(&key, &[1u8; 64]).await?;
    }
    a.commit().await
}

/// Task starts as a slave makes them under write-behind
/// (`Params::task_start_behind`; `slave::start_task`), timed while the
/// previous task's ending runs (`ending_behind`: its put sent as the task
/// wrote its block, then behind the start the done record written and
/// the commit), and alternately with nothing behind them. Per block size, the median start
/// behind an ending less the median quiet one (at least a microsecond:
/// noise must not make a rate negative); and the endings' own time, from
/// the task's hand-back to their commit answered (`Params::task_ending`):
/// the mean, as a job pays every ending's whole time where it waits for
/// them (their tail is long: 1.0 ms median, 1.3 ms mean at 512 KiB in a
/// Cholesky job).
async fn task_starts_behind_endings(client: &Client, matrices: &[(usize, uuid::Uuid, u32)]) -> anyhow::Result<(Vec<Point>, Vec<Point>)> {
    let session = std::sync::Arc::new(client.open_session("bench-params-start-behind").await?);
    let (mut out, mut endings) = (Vec::new(), Vec::new());
    for &(b, id, g) in matrices {
        let bag = format!("bench-params/start-behind/{b}");
        // At least 32 of each kind: a size of few blocks gave one
        // median of 9 that was half its neighbours'.
        let n = (2 * g * g).max(64);
        let a = session.begin().await?;
        for k in 0..n {
            a.enqueue(&bag, &k.to_le_bytes()).await?;
        }
        a.commit().await?;
        let (mut quiet, mut behind, mut ended) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..n {
            // As after a task's kernels: the node and the client idle.
            tokio::time::sleep(PUT_PAUSE).await;
            let ending = if k % 2 == 1 {
                let at = ((k / 2) % g, (k / 2 / g) % g);
                let record = format!("bench-params/start-behind/done/{b}/{k}");
                Some(ending_behind(session.clone(), id, at, random_block(b, k as u64), record).await?)
            } else {
                None
            };
            let t = Instant::now();
            let ((failed, _), taken) = slave::start_task(client, &session, "bench-params/start-behind/failed", &bag, t).await;
            let (a, _, task) = taken?;
            anyhow::ensure!(failed?.is_none(), "no failure flag was written");
            let Dequeue::Task(_) = task? else { anyhow::bail!("bag {bag} ran dry") };
            let took = t.elapsed().as_secs_f64();
            a.commit().await?;
            match ending {
                Some(e) => {
                    ended.push(e.await??);
                    behind.push(took);
                }
                None => quiet.push(took),
            }
        }
        out.push(Point { units: (8 * b * b) as f64, secs: (median(&mut behind) - median(&mut quiet)).max(1e-6) });
        endings.push(Point { units: (8 * b * b) as f64, secs: ended.iter().sum::<f64>() / ended.len().max(1) as f64 });
    }
    Ok((out, endings))
}

/// A task's ending as a slave runs it (`slave::worker`): the done record
/// read for update first (the slave reads it as the task starts), the
/// block's put sent from the task's thread as it writes the block, the
/// thread handing back to the runtime, then, spawned beside the slave's
/// next start, the put awaited, the done record written, the commit.
/// The spawned part answers its seconds from the hand-back, as a task
/// record's `prev_ending_us` counts them.
async fn ending_behind(
    session: std::sync::Arc<store_client::Session>,
    matrix: uuid::Uuid,
    at: (u32, u32),
    block: Block,
    record: String,
) -> anyhow::Result<tokio::task::JoinHandle<Result<f64, store_client::StoreError>>> {
    let a = session.begin().await?;
    a.read_small(&record, true).await?;
    let writer = a.block_writer();
    let data = BlockData { rows: block.rows, cols: block.cols, data: block.data };
    let put = tokio::spawn(async move { writer.put_block(matrix, at.0, at.1, data).await });
    tokio::task::spawn_blocking(|| ()).await?;
    let t = Instant::now();
    Ok(tokio::spawn(async move {
        put.await.map_err(|e| store_client::StoreError::StoreUnavailable { what: format!("put task failed: {e}") })??;
        a.write_small(&record, &[1u8; 64]).await?;
        a.commit().await?;
        Ok(t.elapsed().as_secs_f64())
    }))
}

/// The store's own part of a transfer: measured time minus the network
/// part the fitted `C` gives (at least a microsecond: noise must not make
/// a rate negative).
fn minus_network(points: &[Point], network: &Piecewise) -> Vec<Point> {
    points.iter().map(|p| Point { units: p.units, secs: (p.secs - network.cost(p.units)).max(1e-6) }).collect()
}

fn print_sweep(what: &str, unit: &str, scale: f64, points: &[Point], fitted: &Piecewise) {
    for p in points {
        eprintln!(
            "{what:<16} {:>12.0} {unit}: {:>10.3} ms measured, {:>10.3} ms fitted",
            p.units,
            p.secs * 1e3,
            fitted.cost(p.units) * 1e3
        );
    }
    eprintln!("{what:<16} => bandwidth {:.1} {unit}/s x{scale:e}, threshold {:.0} {unit}", fitted.bandwidth / scale, fitted.threshold);
}

/// The co-running slow-downs on this machine's cores, printed.
fn measure_corun(quick: bool) -> anyhow::Result<model::Corun> {
    let cores = crate::validate_cmd::this_machine_cores() as usize;
    let corun = crate::corun::measure(cores, quick)?;
    for (what, points) in [("block kernels (dgemm b = 512)", &corun.kernels), ("ray tracing", &corun.ray)] {
        let shown: Vec<String> = points.iter().map(|[k, f]| format!("{k:.0}: {f:.3}")).collect();
        eprintln!("co-running copies of {what}, each's time against one alone: {}", shown.join(", "));
    }
    Ok(corun)
}

/// Each copy's slow-down with every core running one.
fn corun_figures(corun: &model::Corun, quick: bool) {
    let all = |points: &[[f64; 2]]| points.last().map_or(1.0, |p| p[1]);
    for (name, value) in [("params_corun_kernels_all_cores", all(&corun.kernels)), ("params_corun_ray_all_cores", all(&corun.ray))] {
        Figure { name, value, unit: "x", target: None, extra: vec![("quick", json!(quick))] }.print();
    }
}

/// `--corun-only`: the co-running slow-downs written into `--out`.
fn corun_into(args: &Args) -> anyhow::Result<()> {
    let mut params = crate::validate_cmd::load_params(&args.out).context("`--corun-only` updates an existing parameter file")?;
    let corun = measure_corun(args.quick)?;
    params.corun = Some(corun.clone());
    params.validate()?;
    std::fs::write(&args.out, params.to_toml_string()?).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote co-running slow-downs into {}", args.out.display());
    corun_figures(&corun, args.quick);
    Ok(())
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    // Kernel rates are per slave, and a slave runs BLAS on one thread.
    apps::kernels::set_blas_threads(1);
    if args.corun_only {
        return corun_into(&args);
    }
    // A `--data` that cannot be made fails now, not after the kernel
    // sweeps that come before the store is started.
    if let Some(d) = &args.data {
        std::fs::create_dir_all(d).with_context(|| format!("--data {}: creating it", d.display()))?;
    }
    let started = Instant::now();
    let (kernel_sizes, min_secs, passes): (&[usize], f64, usize) = if args.quick {
        (&[16, 32, 64, 128, 192, 256, 384, 512], 0.05, 1)
    } else {
        (&[16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024], 0.3, 3)
    };
    let k = sweep_kernels_best_of(kernel_sizes, min_secs, passes);
    // Fitted from b = 128 up: the block sizes jobs use (see fit_range).
    let from = |b: f64, flop_per_b3: f64| flop_per_b3 * b * b * b;
    let multiply = fit_range(&k.multiply, from(128.0, 2.0), "multiply");
    let solve = fit_range(&k.solve, from(128.0, 1.0), "solve");
    let factor = fit_range(&k.factor, from(128.0, 1.0 / 3.0), "potrf");
    let lu = fit_range(&k.lu, from(128.0, 2.0 / 3.0), "getrf");
    print_sweep("multiply (P)", "flop", 1e9, &k.multiply, &multiply);
    print_sweep("solve", "flop", 1e9, &k.solve, &solve);
    print_sweep("factor (potrf)", "flop", 1e9, &k.factor, &factor);
    print_sweep("factor (getrf)", "flop", 1e9, &k.lu, &lu);
    // The size `bench validate` renders by default.
    let RayRate { pixels_per_s: ray, profile: ray_profile } = ray_rate(if args.quick { 256 } else { 1024 }, args.quick)?;
    eprintln!("ray tracing: {ray:.0} pixels/s (level {RAY_LEVEL}, {RAY_SAMPLES}x{RAY_SAMPLES} samples)");
    let shown: Vec<String> = ray_profile.iter().map(|w| format!("{w:.2}")).collect();
    eprintln!("ray tracing: bands' relative costs, top to bottom: {}", shown.join(" "));
    let corun = measure_corun(args.quick)?;

    let store_blocks: &[usize] = if args.quick { &[32, 64, 128, 256, 512] } else { &[16, 32, 64, 128, 256, 384, 512, 768, 1024] };
    let mut node = Cluster::start(ClusterConfig { slaves: 0, cache_mib: 256, base_dir: args.data.clone(), ..ClusterConfig::default() })?;
    let st = sweep_store(&mut node, store_blocks, args.quick)?;
    let cpu_per_get = store_cpu_per_get(&node, args.quick)?;
    eprintln!("store CPU per block get (lock, the version file passed): {:.3} ms", cpu_per_get * 1e3);
    drop(node);
    // Store rates from 64² blocks (32 KiB) up, as the kernels from 128².
    let min_bytes = 8.0 * 64.0 * 64.0;
    let network = fit_range(&st.network, min_bytes, "network");
    // Each store part printed as it is fitted: the measured time less
    // the network's fitted part.
    let (cold_store, hot_store) = (minus_network(&st.cold_get, &network), minus_network(&st.hot_get, &network));
    let (put_store, put_over_store) = (minus_network(&st.put, &network), minus_network(&st.put_over, &network));
    let disk_get = fit_range(&cold_store, min_bytes, "get cold");
    let disk_get_cached = fit_range(&hot_store, min_bytes, "get cached");
    // The client reads on the node's machine, as the slaves do: the node
    // passes the version file, and no block bytes cross a socket.
    let local_get = fit_range(&st.hot_get, min_bytes, "local get");
    let local_get_behind = fit_range(&st.get_behind, min_bytes, "local get behind a put");
    let disk_put = fit_range(&put_store, min_bytes, "put");
    let disk_put_overwrite = fit_range(&put_over_store, min_bytes, "put over");
    print_sweep("network (C)", "B", 1e6, &st.network, &network);
    print_sweep("get cold less C", "B", 1e6, &cold_store, &disk_get);
    print_sweep("get cached less C", "B", 1e6, &hot_store, &disk_get_cached);
    print_sweep("local get", "B", 1e6, &st.hot_get, &local_get);
    print_sweep("get behind put", "B", 1e6, &st.get_behind, &local_get_behind);
    for p in &st.start_behind {
        eprintln!("{:<16} {:>12.0} B: {:>10.3} ms more than a quiet start", "start behind", p.units, p.secs * 1e3);
    }
    for p in &st.endings {
        eprintln!("{:<16} {:>12.0} B: {:>10.3} ms, put to commit answered (mean)", "task ending", p.units, p.secs * 1e3);
    }
    print_sweep("put less C", "B", 1e6, &put_store, &disk_put);
    print_sweep("overwrite less C", "B", 1e6, &put_over_store, &disk_put_overwrite);
    eprintln!(
        "small commit {:.3} ms, task overhead (begin, dequeue, record, commit) {:.3} ms, {:.3} ms more after {:?} idle",
        st.commit_small * 1e3,
        st.per_task.overhead * 1e3,
        st.per_task.wake * 1e3,
        IDLE_BEFORE_TASK
    );
    eprintln!(
        "dag release request (its counters read under their locks in one round trip, written back behind in another) {:.3} ms + {:.4} ms per counter",
        st.per_task.release * 1e3,
        st.per_task.release_per_counter * 1e3
    );

    let lat = if args.no_job_latency { None } else { Some(latencies(args.quick)?) };
    if let Some(l) = &lat {
        eprintln!("job latency (submit to finished, one empty task, one idle slave): {:.3} s", l.job);
        eprintln!("slave start (process start to its first task committed): {:.3} s", l.slave_start);
        eprintln!("store CPU per task (begin, dequeue, record, commit): {:.3} ms", l.store_cpu_per_task * 1e3);
        eprintln!("slave CPU per task (the same requests, the slave's side): {:.3} ms", l.slave_cpu_per_task * 1e3);
    }
    let (latency, start) = (lat.as_ref().map(|l| l.job), lat.as_ref().map(|l| l.slave_start));
    let store_cpu = lat.as_ref().map(|l| l.store_cpu_per_task);
    let slave_cpu = lat.as_ref().map(|l| l.slave_cpu_per_task);

    // Across hosts, `C` is the shaped link's, measured through the node.
    let link = match args.hosts {
        Some(n) => {
            let blocks: &[usize] = if args.quick { &[256, 512] } else { &[256, 512, 1024] };
            Some(crate::link_rate::fitted(&crate::link_rate::measure_across_hosts(n, &args.rate, blocks)?))
        }
        None => None,
    };
    let host = std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_owned()).unwrap_or_else(|_| "this machine".into());
    let params = Params {
        name: args.name.clone().unwrap_or_else(|| {
            format!(
                "measured by bench params{}{} on {host}; kernels single-threaded; ray rate: balls level {RAY_LEVEL}, {RAY_SAMPLES}x{RAY_SAMPLES} samples",
                if args.quick { " --quick" } else { "" },
                args.hosts.map_or(String::new(), |n| format!(" --hosts {n} --rate {}", args.rate))
            )
        }),
        multiply,
        solve: Some(solve),
        // The thesis has one factor rate; Cholesky's potrf is the one the
        // factor primitive tchol = b³/(3P) stands for. getrf is printed.
        factor: Some(factor),
        add: None,
        network: link.map_or(network, |l| l.0),
        network_latency: link.map(|l| l.1),
        disk_get,
        disk_get_cached: Some(disk_get_cached),
        disk_put,
        disk_put_cached: None,
        disk_put_overwrite: Some(disk_put_overwrite),
        local_get: Some(local_get),
        local_get_behind: Some(local_get_behind),
        bsp: None,
        ray_pixel_rate: Some(ray),
        ray_profile: Some(ray_profile),
        task_overhead: Some(st.per_task.overhead),
        task_wake: Some(st.per_task.wake),
        task_start_behind: Some(st.start_behind.iter().map(|p| [p.units, p.secs]).collect()),
        task_ending: Some(st.endings.iter().map(|p| [p.units, p.secs]).collect()),
        dag_release: Some(st.per_task.release),
        dag_release_per_counter: Some(st.per_task.release_per_counter),
        job_latency: latency,
        slave_start: start,
        store_cpu_per_task: store_cpu,
        store_cpu_per_get: Some(cpu_per_get),
        slave_cpu_per_task: slave_cpu,
        // Beside the fits: the kernels' rates keep rising with b over
        // the sizes jobs use, which one bandwidth cannot follow.
        kernels: Some(k.curves()),
        corun: Some(corun.clone()),
    };
    params.validate()?;
    std::fs::write(&args.out, params.to_toml_string()?).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {} in {:.1} s", args.out.display(), started.elapsed().as_secs_f64());

    let extra = || vec![("quick", json!(args.quick))];
    let fig = |name: &str, value: f64, unit: &str| Figure { name, value, unit, target: None, extra: extra() }.print();
    corun_figures(&corun, args.quick);
    fig("params_multiply_rate", multiply.bandwidth / 1e6, "Mflop/s");
    fig("params_multiply_threshold", multiply.threshold, "flop");
    fig("params_solve_rate", solve.bandwidth / 1e6, "Mflop/s");
    fig("params_factor_rate", factor.bandwidth / 1e6, "Mflop/s");
    fig("params_getrf_rate", lu.bandwidth / 1e6, "Mflop/s");
    fig("params_network_rate", params.network.bandwidth / 1e6, "MB/s");
    fig("params_network_threshold", params.network.threshold, "B");
    if let Some(l) = params.network_latency {
        fig("params_network_latency", l * 1e3, "ms");
    }
    fig("params_disk_get_rate", disk_get.bandwidth / 1e6, "MB/s");
    fig("params_disk_get_threshold", disk_get.threshold, "B");
    fig("params_disk_get_cached_rate", disk_get_cached.bandwidth / 1e6, "MB/s");
    fig("params_disk_put_rate", disk_put.bandwidth / 1e6, "MB/s");
    fig("params_disk_put_threshold", disk_put.threshold, "B");
    fig("params_disk_put_overwrite_rate", disk_put_overwrite.bandwidth / 1e6, "MB/s");
    fig("params_disk_put_overwrite_threshold", disk_put_overwrite.threshold, "B");
    fig("params_local_get_rate", local_get.bandwidth / 1e6, "MB/s");
    fig("params_local_get_threshold", local_get.threshold, "B");
    fig("params_local_get_behind_rate", local_get_behind.bandwidth / 1e6, "MB/s");
    fig("params_local_get_behind_threshold", local_get_behind.threshold, "B");
    fig("params_task_overhead", st.per_task.overhead * 1e3, "ms");
    fig("params_task_wake", st.per_task.wake * 1e3, "ms");
    // The per-size curves: one figure per block size.
    for (name, points) in [("params_task_ending", &st.endings), ("params_task_start_behind", &st.start_behind)] {
        for p in points {
            Figure {
                name,
                value: p.secs * 1e3,
                unit: "ms",
                target: None,
                extra: vec![("quick", json!(args.quick)), ("bytes", json!(p.units))],
            }
            .print();
        }
    }
    fig("params_dag_release", st.per_task.release * 1e3, "ms");
    fig("params_dag_release_per_counter", st.per_task.release_per_counter * 1e3, "ms");
    fig("params_ray_pixel_rate", ray, "pixel/s");
    if let Some(l) = latency {
        fig("params_job_latency", l * 1e3, "ms");
    }
    if let Some(s) = start {
        fig("params_slave_start", s * 1e3, "ms");
    }
    if let Some(c) = store_cpu {
        fig("params_store_cpu_per_task", c * 1e3, "ms");
    }
    if let Some(c) = slave_cpu {
        fig("params_slave_cpu_per_task", c * 1e3, "ms");
    }
    fig("params_store_cpu_per_get", cpu_per_get * 1e3, "ms");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_bytes("32768K\n"), Some(32 << 20));
        assert_eq!(cache_bytes("300M"), Some(300 << 20));
        assert_eq!(cache_bytes("4096"), Some(4096));
        assert_eq!(cache_bytes("lots"), None);
        assert_eq!(cache_bytes("12Q"), None);
        assert!(CacheEvictor::bytes() >= 64 << 20);
    }

    #[test]
    fn fit_recovers_a_piecewise_parameter() {
        let truth = Piecewise::new(2e9, 1e6);
        let pts: Vec<Point> = [1e4, 1e5, 1e6, 4e6, 1.6e7, 6.4e7].iter().map(|&x| Point { units: x, secs: truth.cost(x) }).collect();
        let f = fit(&pts);
        assert!((f.bandwidth / 2e9 - 1.0).abs() < 1e-6, "{f:?}");
        // The grid of candidate thresholds is geometric: within a step.
        assert!((f.threshold / 1e6 - 1.0).abs() < 0.15, "{f:?}");
    }

    #[test]
    fn fit_without_a_kink_has_no_threshold() {
        let pts: Vec<Point> = [1e3, 1e4, 1e5].iter().map(|&x| Point { units: x, secs: x / 5e8 }).collect();
        let f = fit(&pts);
        assert_eq!(f.threshold, 0.0);
        assert!((f.bandwidth / 5e8 - 1.0).abs() < 1e-9);
    }
}
