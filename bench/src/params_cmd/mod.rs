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

mod fit;
mod kernel_sweep;
mod store;
mod tasks;

pub(crate) use fit::*;
use kernel_sweep::*;
pub(crate) use kernel_sweep::{kernels_now, random_block, ray_rate, RayRate};
use store::*;
pub(crate) use store::{filled_matrix, gets_now, read_all};
use tasks::*;
pub(crate) use tasks::{endings_now, task_costs_now, TaskCosts};

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
