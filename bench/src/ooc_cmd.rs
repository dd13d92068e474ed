//! `bench ooc matmul|cholesky|lu`: out-of-core jobs on the real system
//! (store node + slave processes, see [`crate::cluster`]) against in-core
//! OpenBLAS/LAPACK with 2 threads and against Dask on zarr arrays, all in
//! one run so the ratios share the machine's load of the moment.
//!
//! With `--hosts N` the job runs across network-namespace hosts instead,
//! beside the same job on one host and Dask distributed ([`hosts`]).
//!
//! The in-core reference runs in this process: OpenBLAS reads
//! `OPENBLAS_NUM_THREADS` only when the library loads, so the thread count
//! is set through `apps::kernels::set_blas_threads` instead.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use apps::block::Block;
use serde_json::{json, Value};

use crate::cluster::{Cluster, ClusterConfig, JobResult, ProcStats, Snapshot};
use crate::report::Figure;

mod dask_hosts;
mod gang_hosts;
mod hosts;
mod memcap;
mod scalapack_hosts;

/// Sets the BLAS threads of this process.
pub(crate) fn set_blas_threads(n: usize) {
    apps::kernels::set_blas_threads(n);
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum App {
    Matmul,
    Cholesky,
    Lu,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Which job: matmul (issue 3), cholesky or lu (issue 4).
    #[arg(value_enum)]
    app: App,
    /// Matrix order n of the out-of-core job (default 16384; with --hosts 4096).
    #[arg(long = "n", value_name = "N")]
    n_arg: Option<u64>,
    #[arg(skip)]
    n: u64,
    /// Block size b (default 2048; with --hosts 512).
    #[arg(long = "block", value_name = "B")]
    block_arg: Option<u32>,
    #[arg(skip)]
    block: u32,
    /// Slave processes.
    #[arg(long, default_value_t = 2)]
    slaves: usize,
    /// The store node's block cache, MiB (its RSS target is this + 256 MiB).
    #[arg(long, default_value_t = 1024)]
    cache_mib: usize,
    /// Order of the in-core reference (dgemm / dpotrf / dgetrf, 2 threads).
    #[arg(long, default_value_t = 8192)]
    ref_n: usize,
    /// Runs of the in-core reference; the fastest counts.
    #[arg(long, default_value_t = 2)]
    ref_reps: usize,
    /// Threads of the in-core reference and of Dask (the slaves' total).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// matmul: further block sizes to run the same job at.
    #[arg(long, value_delimiter = ',', default_value = "1024,512")]
    sweep: Vec<u32>,
    /// matmul: skip the block-size sweep.
    #[arg(long)]
    no_sweep: bool,
    /// matmul: matrix order for the block-size sweep (default: --n). Small
    /// blocks at the full n move n³/b·16 bytes and take long.
    #[arg(long)]
    sweep_n: Option<u64>,
    /// cholesky: variants to run (default: all four).
    #[arg(long, value_delimiter = ',')]
    variant: Vec<String>,
    /// lu: run only pivoted jobs (default: without and with pivoting).
    /// `--pivot` or `--pivot partial`: partial pivoting on both schedules;
    /// `--pivot tournament`: tournament pivoting beside partial pivoting's dag.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "partial", value_name = "RULE")]
    pivot: Option<PivotRuns>,
    /// Skip the Dask comparison.
    #[arg(long)]
    no_dask: bool,
    /// Skip `master verify` of each result (it reads every block once more).
    #[arg(long)]
    no_verify: bool,
    /// Reduced run under a minute: n = 2048, b = 512, reference n = 2048.
    #[arg(long)]
    quick: bool,
    /// Parent directory for store data and zarr arrays (default ~/.cache/ftbag-bench).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds any one job may take before the bench gives up.
    #[arg(long, default_value_t = 3600)]
    job_timeout_s: u64,
    /// Run the job across this many network-namespace hosts (needs root):
    /// the store node on host 0, one slave on each other host, the CLI on
    /// the last; beside the same job on one host with as many slaves, the
    /// job again with one slave SIGKILLed halfway, and Dask distributed on
    /// the same hosts (matmul, cholesky). Replaces the in-core and zarr
    /// comparisons.
    #[arg(long, value_name = "N")]
    hosts: Option<usize>,
    /// With --hosts: each host's link rate both ways (tc tbf, e.g. 1gbit,
    /// 300mbit; "none": unshaped). No delay is applied (no netem here).
    #[arg(long, default_value = "1gbit", requires = "hosts")]
    rate: String,
    /// With --hosts: skip the runs with a slave (Dask: a worker) SIGKILLed halfway.
    #[arg(long, requires = "hosts")]
    no_kill: bool,
    /// With --hosts, matmul: the engines to run. `bag`: the bag of tasks
    /// (on one host, across hosts with caching off and on, a slave killed,
    /// Dask); `bsp`: the data-parallel engine, one rank per slave host,
    /// beside the bag of tasks with caching off in the same cluster, with
    /// the model's prediction of both (`bsp` alone runs just that pair);
    /// `scalapack`: ScaLAPACK's pdgemm in core on the same hosts (OpenMPI,
    /// installed if missing).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "bag,bsp", requires = "hosts")]
    engine: Vec<Engine>,
    /// Beyond memory: the job capped and uncapped and Dask under the same
    /// cap and without, side by side: a memory cgroup (needs root) of SIZE
    /// (e.g. 2G) around the store node and slaves, page cache included,
    /// and one of the same size around Dask. Runs one job per app
    /// (cholesky: the first --variant, default dag; lu: partial pivoting's
    /// dag, or `--pivot tournament`), no in-core reference. Without root
    /// or a memory controller it prints `skipped: …` and fails.
    #[arg(long, value_name = "SIZE", value_parser = crate::cgroup::parse_size, conflicts_with = "hosts")]
    mem_cap: Option<u64>,
}

/// `bench ooc --engine`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Bag,
    Bsp,
    Scalapack,
}

const MIB: f64 = 1024.0 * 1024.0;

pub(crate) fn run(mut args: Args) -> anyhow::Result<()> {
    let (n, b) = if args.hosts.is_some() { (4096, 512) } else { (16384, 2048) };
    args.n = args.n_arg.unwrap_or(n);
    args.block = args.block_arg.unwrap_or(b);
    if args.quick && args.mem_cap.is_some() {
        // Data several times the cap the test gives, in seconds.
        args.n = 4096;
        args.block = 512;
    } else if args.quick {
        args.n = 2048;
        args.block = 512;
        args.ref_n = 2048;
        args.ref_reps = 3;
        args.sweep = vec![256];
        args.sweep_n = None;
    }
    let base = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => crate::cluster::default_base_dir()?,
    };
    let mut figs: Figs = Vec::new();
    match args.app {
        _ if args.hosts.is_some() => hosts::run(&args, &base, &mut figs)?,
        _ if args.mem_cap.is_some() => memcap::run(&args, &base, &mut figs)?,
        App::Matmul => matmul(&args, &base, &mut figs)?,
        App::Cholesky => cholesky(&args, &base, &mut figs)?,
        App::Lu => lu(&args, &base, &mut figs)?,
    }
    eprintln!("(2 cores shared with other work: rates are noisy; the ratios compare runs made minutes apart in this one run)");
    for (name, value, unit, target, extra) in &figs {
        Figure { name, value: *value, unit, target: *target, extra: extra.clone() }.print();
    }
    Ok(())
}

/// A figure's extra JSON fields.
type Extra = Vec<(&'static str, Value)>;
/// Figures to print: name, value, unit, target, extra fields.
type Figs = Vec<(String, f64, &'static str, Option<f64>, Extra)>;

fn start(args: &Args, base: &Path) -> anyhow::Result<Cluster> {
    Cluster::start(ClusterConfig {
        slaves: args.slaves,
        cache_mib: args.cache_mib,
        base_dir: Some(base.to_owned()),
        ..ClusterConfig::default()
    })
}

/// One out-of-core job with its RSS and I/O figures.
struct Measured {
    job: JobResult,
    before: Snapshot,
    after: Snapshot,
    verified: Option<(bool, String)>,
}

fn measure(c: &Cluster, args: &Args, submit: &[&str]) -> anyhow::Result<Measured> {
    c.reset_peaks();
    let before = c.snapshot();
    let job = c.run_job(submit, Duration::from_secs(args.job_timeout_s))?;
    let after = c.snapshot();
    if !job.ok() {
        bail!("job {} ({}) did not succeed: {}", job.id, submit.join(" "), job.failure.clone().unwrap_or_default());
    }
    let verified = if args.no_verify { None } else { Some(c.verify(job.id)?) };
    if let Some((ok, line)) = &verified {
        eprintln!("  verify: {} {line}", if *ok { "ok" } else { "FAILED" });
    }
    let (store_cpu, slaves_cpu) = before.cpu_since(&after);
    eprintln!("  CPU: store node {store_cpu:.1} s, slaves {slaves_cpu:.1} s");
    eprintln!(
        "  {}: {} tasks in {:.1} s, {:.2} GFLOP/s (store peak RSS {:.0} MiB, slaves {:?} MiB)",
        submit.join(" "),
        job.tasks,
        job.seconds,
        job.gflops(),
        after.store.peak_rss as f64 / MIB,
        after.slaves.iter().map(|s| (s.peak_rss as f64 / MIB).round()).collect::<Vec<_>>()
    );
    Ok(Measured { job, before, after, verified })
}

fn job_extra(m: &Measured, n: u64, b: u32) -> Extra {
    let mut e = vec![
        ("n", json!(n)),
        ("block", json!(b)),
        ("seconds", json!(round3(m.job.seconds))),
        ("tasks", json!(m.job.tasks)),
        ("gflops", json!(round3(m.job.gflops()))),
        ("store_cpu_s", json!(round3(m.before.cpu_since(&m.after).0))),
        ("slaves_cpu_s", json!(round3(m.before.cpu_since(&m.after).1))),
    ];
    if let Some((ok, _)) = &m.verified {
        e.push(("verified", json!(ok)));
    }
    e
}

/// Flops per CPU second of store node and slaves together, over in-core's:
/// what the wall-clock ratio would be on an otherwise idle machine, if the
/// cluster kept every core busy.
fn per_cpu_figure(figs: &mut Figs, prefix: &str, m: &Measured, ref_per_cpu: f64) {
    let (store, slaves) = m.before.cpu_since(&m.after);
    let ours = m.job.flops / (store + slaves).max(1e-9) / 1e9;
    figs.push((
        format!("{prefix}_per_cpu_s_vs_incore"),
        round3(ours / ref_per_cpu),
        "ratio",
        None,
        vec![
            ("gflop_per_cpu_s", json!(round3(ours))),
            ("incore_gflop_per_cpu_s", json!(round3(ref_per_cpu))),
            ("store_cpu_s", json!(round3(store))),
            ("slaves_cpu_s", json!(round3(slaves))),
        ],
    ));
}

/// Runs the same job (`args.n`, `args.block`) in Dask and pushes `name`:
/// `ours` (GFLOP/s) over Dask's rate, beside Dask's rate and time and the
/// fact `beside` gives from Dask's rate.
#[allow(clippy::too_many_arguments)]
fn push_vs_dask(
    figs: &mut Figs,
    name: &str,
    target: f64,
    app: App,
    ours: f64,
    args: &Args,
    base: &Path,
    beside: impl Fn(f64) -> (&'static str, f64),
) -> anyhow::Result<()> {
    let (n, b) = (args.n, args.block);
    let (dgf, ds) = dask(app, n, b, args.threads, base)?;
    let (fact, value) = beside(dgf);
    let e = vec![
        ("n", json!(n)),
        ("block", json!(b)),
        ("dask_gflops", json!(round3(dgf))),
        ("dask_seconds", json!(round3(ds))),
        (fact, json!(round3(value))),
    ];
    figs.push((name.into(), round3(ours / dgf), "ratio", Some(target), e));
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// RSS figures of one job: store ≤ cache + 256 MiB, slave ≤ 4 blocks + 64 MiB.
fn rss_figures(figs: &mut Figs, prefix: &str, m: &Measured, cache_mib: usize, b: u32) {
    let store = m.after.store.peak_rss as f64 / MIB;
    figs.push((
        format!("{prefix}_store_peak_rss"),
        store.round(),
        "MiB",
        Some(cache_mib as f64 + 256.0),
        vec![("cache_mib", json!(cache_mib))],
    ));
    let block_mib = (b as f64).powi(2) * 8.0 / MIB;
    let slave = m.after.slaves.iter().map(|s| s.peak_rss).max().unwrap_or(0) as f64 / MIB;
    figs.push((
        format!("{prefix}_slave_peak_rss"),
        slave.round(),
        "MiB",
        Some(4.0 * block_mib + 64.0),
        vec![
            ("block_mib", json!(block_mib)),
            ("per_slave_mib", json!(m.after.slaves.iter().map(|s| (s.peak_rss as f64 / MIB).round()).collect::<Vec<_>>())),
        ],
    ));
}

// ---------------------------------------------------------------- in-core

fn lcg_fill(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// In-core rate in GFLOP/s of `op` on an n×n matrix with `threads` BLAS
/// threads: the best of `reps` runs. The best, because other work on a
/// shared machine only ever slows a run down, and the fastest in-core run
/// is the strictest denominator for our ratios.
/// Also returns GFLOP per CPU second of the best run: a
/// rate that other work on a shared machine barely moves (it takes cores
/// away, not speed per core), to compare with the cluster's flops per CPU
/// second of store node and slaves together.
pub(crate) fn incore_with_cpu(op: App, n: usize, threads: usize, reps: usize) -> anyhow::Result<(f64, f64)> {
    set_blas_threads(threads);
    eprintln!("in-core reference: {op:?} n = {n}, {threads} BLAS threads, best of {reps}");
    let mut best = (f64::INFINITY, f64::INFINITY);
    let cpu_now = || ProcStats::read(std::process::id()).map_or(0.0, |p| p.cpu_s);
    for _ in 0..reps.max(1) {
        let c0 = cpu_now();
        let wall = incore_once(op, n)?;
        // Includes generating the inputs: a slight overcount of CPU time.
        let cpu = cpu_now() - c0;
        if wall < best.0 {
            best = (wall, cpu);
        }
    }
    set_blas_threads(1);
    let f = flops(op, n as f64);
    let (gf, per_cpu) = (f / best.0 / 1e9, f / best.1.max(1e-9) / 1e9);
    eprintln!("  {gf:.2} GFLOP/s ({:.2} s; {per_cpu:.2} GFLOP per CPU second)", best.0);
    Ok((gf, per_cpu))
}

fn incore_once(op: App, n: usize) -> anyhow::Result<f64> {
    let mut a = Block { rows: n, cols: n, data: lcg_fill(n * n, 1) };
    let secs = match op {
        App::Matmul => {
            let b = Block { rows: n, cols: n, data: lcg_fill(n * n, 2) };
            let mut c = Block::zeros(n, n);
            let t = Instant::now();
            apps::kernels::gemm(1.0, &a, false, &b, false, 0.0, &mut c);
            t.elapsed().as_secs_f64()
        }
        App::Cholesky => {
            // Symmetric, diagonally dominant: positive definite.
            for c in 0..n {
                for r in c + 1..n {
                    let v = a.data[r + c * n];
                    a.data[c + r * n] = v;
                }
                a.data[c + c * n] += n as f64;
            }
            let t = Instant::now();
            apps::kernels::potrf_lower(&mut a).map_err(|k| anyhow::anyhow!("reference dpotrf: minor {k} not positive"))?;
            t.elapsed().as_secs_f64()
        }
        App::Lu => {
            let t = Instant::now();
            let (_, r) = apps::kernels::getrf(&mut a);
            r.map_err(|k| anyhow::anyhow!("reference dgetrf: singular at {k}"))?;
            t.elapsed().as_secs_f64()
        }
    };
    Ok(secs)
}

fn flops(op: App, n: f64) -> f64 {
    match op {
        App::Matmul => 2.0 * n.powi(3),
        App::Cholesky => n.powi(3) / 3.0,
        App::Lu => 2.0 * n.powi(3) / 3.0,
    }
}

// ---------------------------------------------------------------- Dask

/// Where the benchmark keeps its Python environment.
fn venv_dir() -> PathBuf {
    std::env::var_os("HOME").map_or_else(std::env::temp_dir, |h| PathBuf::from(h).join(".cache")).join("ftbag-dask-venv")
}

fn venv_ready(py: &Path) -> bool {
    Command::new(py).args(["-c", "import dask, dask.array, distributed, zarr, numpy, scipy"]).output().is_ok_and(|o| o.status.success())
}

/// Creates the virtual environment with dask, distributed, zarr, numpy and scipy if it is
/// not there yet (installing python3-venv with apt-get if venv is missing);
/// returns its python.
pub(crate) fn dask_python() -> anyhow::Result<PathBuf> {
    let dir = venv_dir();
    let py = dir.join("bin/python");
    if venv_ready(&py) {
        return Ok(py);
    }
    eprintln!("creating the Dask environment in {} (once)", dir.display());
    let venv = |d: &Path| Command::new("python3").args(["-m", "venv"]).arg(d).status().is_ok_and(|s| s.success());
    if !py.exists() && !venv(&dir) {
        eprintln!("python3 -m venv failed; installing python3-venv with apt-get");
        let _ = std::fs::remove_dir_all(&dir);
        let ok = Command::new("apt-get").args(["update", "-q"]).status().is_ok_and(|s| s.success())
            && Command::new("apt-get").args(["install", "-y", "-q", "python3-venv"]).status().is_ok_and(|s| s.success());
        if !ok || !venv(&dir) {
            bail!("cannot create a Python virtual environment in {} (need python3 and python3-venv)", dir.display());
        }
    }
    // zarr 2: the array format dask's to_zarr/from_zarr have used longest.
    let st = Command::new(dir.join("bin/pip"))
        .args(["install", "-q", "dask[array]", "distributed", "zarr>=2.16,<3", "numpy", "scipy"])
        .status()
        .context("running pip")?;
    if !st.success() || !venv_ready(&py) {
        bail!("pip could not install dask, distributed, zarr, numpy and scipy into {}", dir.display());
    }
    Ok(py)
}

/// The script next to the sources, found from the build-time manifest path
/// (or `FTBAG_DASK_SCRIPT`).
fn dask_script() -> anyhow::Result<PathBuf> {
    let p = std::env::var_os("FTBAG_DASK_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("dask/ooc_dask.py"));
    if !p.exists() {
        bail!("{} is missing (set FTBAG_DASK_SCRIPT to bench/dask/ooc_dask.py)", p.display());
    }
    Ok(p)
}

/// Runs the Dask side; returns its GFLOP/s and seconds.
pub(crate) fn dask(op: App, n: u64, b: u32, threads: usize, base: &Path) -> anyhow::Result<(f64, f64)> {
    let r = dask_in(op, n, b, threads, base, None)?;
    Ok((r.gflops, r.seconds))
}

/// What one Dask run measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DaskRun {
    pub(crate) gflops: f64,
    pub(crate) seconds: f64,
    /// Storage bytes its timed part read (page-cache hits excluded).
    pub(crate) read_bytes: u64,
    pub(crate) write_bytes: u64,
    pub(crate) peak_rss: u64,
}

/// Runs the Dask side, in `cgroup` if given (the script's process joins
/// it at spawn, so its zarr files' page cache counts there too).
pub(crate) fn dask_in(
    op: App,
    n: u64,
    b: u32,
    threads: usize,
    base: &Path,
    cgroup: Option<&crate::cgroup::Joiner>,
) -> anyhow::Result<DaskRun> {
    let py = dask_python()?;
    let dir = tempfile::Builder::new().prefix("dask-").tempdir_in(base)?;
    let opname = match op {
        App::Matmul => "matmul",
        App::Cholesky => "cholesky",
        App::Lu => "lu",
    };
    eprintln!("Dask: {opname} n = {n}, chunks {b}, {threads} threads, zarr in {}", dir.path().display());
    let mut cmd = Command::new(py);
    cmd.arg(dask_script()?)
        .args(["--op", opname, "--n", &n.to_string(), "--block", &b.to_string(), "--threads", &threads.to_string()])
        .arg("--dir")
        .arg(dir.path().join("arrays"));
    if let Some(g) = cgroup {
        g.join_on_spawn(&mut cmd);
    }
    let out = cmd.output().context("running the Dask script")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
        bail!("the Dask script failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    };
    let v: Value = serde_json::from_str(line)?;
    let gf = v["gflops"].as_f64().context("no gflops")?;
    let s = v["seconds"].as_f64().context("no seconds")?;
    let count = |k: &str| v[k].as_u64().unwrap_or(0);
    eprintln!("  {gf:.2} GFLOP/s ({s:.1} s)");
    Ok(DaskRun {
        gflops: gf,
        seconds: s,
        read_bytes: count("read_bytes"),
        write_bytes: count("write_bytes"),
        peak_rss: count("peak_rss_bytes"),
    })
}

// ---------------------------------------------------------------- jobs

fn matmul(args: &Args, base: &Path, figs: &mut Figs) -> anyhow::Result<()> {
    let (reference, ref_per_cpu) = incore_with_cpu(App::Matmul, args.ref_n, args.threads, args.ref_reps)?;
    let c = start(args, base)?;
    let run_at = |n: u64, b: u32| -> anyhow::Result<Measured> {
        eprintln!("out-of-core matmul n = {n}, b = {b}, {} slaves: creating A and B", args.slaves);
        c.create_matrix("A", n, b, "random", 1)?;
        c.create_matrix("B", n, b, "random", 2)?;
        let m = measure(&c, args, &["matmul", "A", "B", "--out", "C"])?;
        for name in ["A", "B", "C"] {
            c.remove_matrix(name);
        }
        Ok(m)
    };
    let (n, b) = (args.n, args.block);
    let m = run_at(n, b)?;
    let gf = m.job.gflops();
    let mut e = job_extra(&m, n, b);
    e.push(("incore_gflops", json!(round3(reference))));
    e.push(("ref_n", json!(args.ref_n)));
    figs.push(("ooc_matmul_vs_incore_dgemm".into(), round3(gf / reference), "ratio", Some(0.85), e));
    figs.push(("ooc_matmul_gflops".into(), round3(gf), "GFLOP/s", None, job_extra(&m, n, b)));
    per_cpu_figure(figs, "ooc_matmul", &m, ref_per_cpu);
    figs.push((
        "incore_dgemm_gflops".into(),
        round3(reference),
        "GFLOP/s",
        None,
        vec![("n", json!(args.ref_n)), ("threads", json!(args.threads))],
    ));
    rss_figures(figs, "ooc_matmul", &m, args.cache_mib, b);
    // The source's count (Table 3.3, no caching): 2p per task read, p² tasks, one write each.
    let p = n.div_ceil(b as u64) as f64;
    let block_bytes = (b as f64).powi(2) * 8.0;
    let source_read = 2.0 * p.powi(3) * block_bytes;
    let source_write = p * p * block_bytes;
    let (disk_r, disk_w) = m.before.store_io_since(&m.after);
    let wire = m.before.loopback_since(&m.after) as f64;
    let io_extra = vec![
        ("source_reads_bytes", json!(source_read)),
        ("source_writes_bytes", json!(source_write)),
        ("p", json!(p)),
        ("store_disk_read_bytes", json!(disk_r)),
        ("store_disk_write_bytes", json!(disk_w)),
        ("loopback_bytes", json!(wire)),
    ];
    figs.push(("ooc_matmul_transfer_vs_source".into(), round3(wire / (source_read + source_write)), "ratio", Some(1.0), io_extra.clone()));
    figs.push(("ooc_matmul_disk_read_vs_source".into(), round3(disk_r as f64 / source_read), "ratio", None, io_extra.clone()));
    figs.push(("ooc_matmul_disk_write_vs_source".into(), round3(disk_w as f64 / source_write), "ratio", None, io_extra));
    let sweep_n = args.sweep_n.unwrap_or(n);
    let sweep = if args.no_sweep { &[][..] } else { &args.sweep[..] };
    for &sb in sweep {
        let m = run_at(sweep_n, sb)?;
        let mut e = job_extra(&m, sweep_n, sb);
        e.push(("incore_gflops", json!(round3(reference))));
        figs.push((format!("ooc_matmul_b{sb}_vs_incore_dgemm"), round3(m.job.gflops() / reference), "ratio", None, e));
    }
    drop(c);
    if !args.no_dask {
        push_vs_dask(figs, "ooc_matmul_vs_dask", 1.3, App::Matmul, gf, args, base, |_| ("ours_gflops", gf))?;
    }
    Ok(())
}

const VARIANTS: [&str; 4] = ["single-bag", "multi-step-1", "multi-step-2", "dag"];

fn cholesky(args: &Args, base: &Path, figs: &mut Figs) -> anyhow::Result<()> {
    let (reference, ref_per_cpu) = incore_with_cpu(App::Cholesky, args.ref_n, args.threads, args.ref_reps)?;
    let variants: Vec<String> =
        if args.variant.is_empty() { VARIANTS.iter().map(|s| s.to_string()).collect() } else { args.variant.clone() };
    let c = start(args, base)?;
    let (n, b) = (args.n, args.block);
    eprintln!("out-of-core cholesky n = {n}, b = {b}, {} slaves: creating S (SPD)", args.slaves);
    c.create_matrix("S", n, b, "spd", 3)?;
    let mut best: Option<(String, f64)> = None;
    for v in &variants {
        let out = format!("L-{v}");
        let m = measure(&c, args, &["cholesky", "S", "--out", &out, "--variant", v])?;
        c.remove_matrix(&out);
        let gf = m.job.gflops();
        let mut e = job_extra(&m, n, b);
        e.push(("variant", json!(v)));
        e.push(("incore_gflops", json!(round3(reference))));
        figs.push((format!("ooc_cholesky_{v}_vs_incore_dpotrf"), round3(gf / reference), "ratio", None, e));
        rss_figures(figs, &format!("ooc_cholesky_{v}"), &m, args.cache_mib, b);
        per_cpu_figure(figs, &format!("ooc_cholesky_{v}"), &m, ref_per_cpu);
        if best.as_ref().is_none_or(|(_, g)| gf > *g) {
            best = Some((v.clone(), gf));
        }
    }
    drop(c);
    let (bv, bgf) = best.context("no variant ran")?;
    figs.push((
        "ooc_cholesky_best_vs_incore_dpotrf".into(),
        round3(bgf / reference),
        "ratio",
        Some(0.85),
        vec![
            ("variant", json!(bv)),
            ("n", json!(n)),
            ("block", json!(b)),
            ("gflops", json!(round3(bgf))),
            ("incore_gflops", json!(round3(reference))),
            ("ref_n", json!(args.ref_n)),
        ],
    ));
    if !args.no_dask {
        push_vs_dask(figs, "ooc_cholesky_best_vs_dask", 1.0, App::Cholesky, bgf, args, base, |dgf| ("dask_vs_incore", dgf / reference))?;
    }
    Ok(())
}

/// `bench ooc lu --pivot`: which pivoted runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PivotRuns {
    /// Partial pivoting on the bags and the dag.
    Partial,
    /// Tournament pivoting beside partial pivoting, both on the dag.
    Tournament,
}

impl PivotRuns {
    /// The `master submit lu` flags of a pivoted run.
    pub(crate) fn flags(self) -> [&'static str; 2] {
        match self {
            PivotRuns::Partial => ["--pivot", "partial"],
            PivotRuns::Tournament => ["--pivot", "tournament"],
        }
    }
}

fn lu(args: &Args, base: &Path, figs: &mut Figs) -> anyhow::Result<()> {
    let (reference, ref_per_cpu) = incore_with_cpu(App::Lu, args.ref_n, args.threads, args.ref_reps)?;
    let c = start(args, base)?;
    let (n, b) = (args.n, args.block);
    // Without pivoting both schedules on one diagonally dominant input;
    // with it, a plain random matrix makes the row interchanges real.
    use PivotRuns::{Partial, Tournament};
    let runs: &[(Option<PivotRuns>, &str)] = match args.pivot {
        Some(Partial) => &[(Some(Partial), "bags"), (Some(Partial), "dag")],
        // Tournament first, on fresh slaves: a slave keeps freed block
        // buffers for reuse, and after partial pivoting's panels (a block
        // column each) its resident set starts far above the tournament's
        // own peak, which VmHWM then reports.
        Some(Tournament) => &[(Some(Tournament), "dag"), (Some(Partial), "dag")],
        None => &[(None, "bags"), (None, "dag"), (Some(Partial), "bags"), (Some(Partial), "dag"), (Some(Tournament), "dag")],
    };
    // Dask's LU pivots: compare with our best pivoted run.
    let mut best_pivot: Option<(&str, f64, Extra)> = None;
    let mut best_nopiv: Option<(&str, f64, Extra)> = None;
    for (k, &(rule, schedule)) in runs.iter().enumerate() {
        let pivot = rule.is_some();
        let (input, kind, seed) = if pivot { ("R", "random", 5) } else { ("D", "diag-dominant", 4) };
        let first_use = k == 0 || runs[k - 1].0.is_some() != pivot;
        let last_use = runs.get(k + 1).is_none_or(|next| next.0.is_some() != pivot);
        let what = match rule {
            None => "nopiv",
            Some(Partial) => "pivot",
            Some(Tournament) => "tournament",
        };
        eprintln!("out-of-core lu {what} ({schedule}) n = {n}, b = {b}, {} slaves", args.slaves);
        if first_use {
            eprintln!("  creating {input} ({kind})");
            c.create_matrix(input, n, b, kind, seed)?;
        }
        let mut submit = vec!["lu", input, "--out", "LU", "--schedule", schedule];
        submit.extend(rule.map(PivotRuns::flags).into_iter().flatten());
        let mut m = measure(&c, args, &submit)?;
        // Rated by the job's 2n³/3, as the in-core dgetrf is: the
        // tournament's tasks count their tree's flops too, which are
        // extra work, not more of the job done.
        let task_flops = std::mem::replace(&mut m.job.flops, flops(App::Lu, n as f64));
        eprintln!("  by 2n³/3: {:.2} GFLOP/s (tasks' own count: {:.1} GFLOP)", m.job.gflops(), task_flops / 1e9);
        c.remove_matrix("LU");
        if last_use {
            c.remove_matrix(input);
        }
        let gf = m.job.gflops();
        let name = format!("{what}_{schedule}");
        if rule == Some(Tournament) {
            let mut e = job_extra(&m, n, b);
            e.push(("incore_gflops", json!(round3(reference))));
            e.push(("task_gflop", json!(round3(task_flops / 1e9))));
            figs.push(("ooc_lu_tournament_vs_incore_dgetrf".into(), round3(gf / reference), "ratio", Some(0.85), e));
        }
        let mut e = job_extra(&m, n, b);
        e.push(("schedule", json!(schedule)));
        e.push(("incore_gflops", json!(round3(reference))));
        e.push(("ref_n", json!(args.ref_n)));
        figs.push((format!("ooc_lu_{name}_vs_incore_dgetrf"), round3(gf / reference), "ratio", None, e.clone()));
        let best = if pivot { &mut best_pivot } else { &mut best_nopiv };
        if best.as_ref().is_none_or(|(_, g, _)| gf > *g) {
            *best = Some((schedule, gf, e));
        }
        rss_figures(figs, &format!("ooc_lu_{name}"), &m, args.cache_mib, b);
        per_cpu_figure(figs, &format!("ooc_lu_{name}"), &m, ref_per_cpu);
    }
    if let Some((_, gf, e)) = best_nopiv {
        figs.push(("ooc_lu_nopiv_vs_incore_dgetrf".into(), round3(gf / reference), "ratio", Some(0.75), e));
    }
    let pivot_gf = best_pivot.as_ref().map_or(0.0, |(_, gf, _)| *gf);
    if let Some((_, gf, e)) = best_pivot {
        figs.push(("ooc_lu_pivot_vs_incore_dgetrf".into(), round3(gf / reference), "ratio", Some(0.65), e));
    }
    drop(c);
    if !args.no_dask {
        push_vs_dask(figs, "ooc_lu_pivot_vs_dask", 1.0, App::Lu, pivot_gf, args, base, |dgf| ("dask_vs_incore", dgf / reference))?;
    }
    Ok(())
}
