//! `bench ooc APP --mem-cap SIZE`: beyond memory. The same job on a fresh
//! store node and slaves twice, first in a memory cgroup without a limit,
//! then in one of SIZE, page cache included ([`crate::cgroup`]), and the
//! same job in Dask under the same cap and without; the ratios side by
//! side. Each run reports its cgroup's peak and the bytes its processes
//! read from storage (`/proc/PID/io`, page-cache hits excluded), which
//! show a capped run was out of core; and the kernel's page-cache
//! refaults (`workingset_refault_file`), which show how much it thrashed.
//!
//! Without root or a memory controller it says `skipped: …` and fails:
//! it never runs uncapped in a capped run's place.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;

use super::{dask_in, flops, round3, App, Args, DaskRun, Figs, PivotRuns, MIB};
use crate::cgroup::MemCgroup;
use crate::cluster::{Cluster, ClusterConfig, JobResult};

/// The one job an app runs under the cap.
struct Job {
    /// A name for figures: `matmul`, `cholesky_dag`, `lu_pivot_dag`…
    label: String,
    app: App,
    /// Matrices to create: name, kind, seed.
    inputs: Vec<(&'static str, &'static str, u64)>,
    submit: Vec<String>,
    /// Bytes of every matrix the job reads or writes.
    matrix_bytes: f64,
}

fn job(args: &Args) -> Job {
    let n2 = (args.n as f64).powi(2) * 8.0;
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match args.app {
        App::Matmul => Job {
            label: "matmul".into(),
            app: App::Matmul,
            inputs: vec![("A", "random", 1), ("B", "random", 2)],
            submit: owned(&["matmul", "A", "B", "--out", "C"]),
            matrix_bytes: 3.0 * n2,
        },
        App::Cholesky => {
            let v = args.variant.first().map_or("dag", String::as_str);
            Job {
                label: format!("cholesky_{}", v.replace('-', "_")),
                app: App::Cholesky,
                inputs: vec![("S", "spd", 3)],
                submit: owned(&["cholesky", "S", "--out", "L", "--variant", v]),
                matrix_bytes: 2.0 * n2,
            }
        }
        App::Lu => {
            let rule = args.pivot.unwrap_or(PivotRuns::Partial);
            let what = match rule {
                PivotRuns::Partial => "pivot",
                PivotRuns::Tournament => "tournament",
            };
            let mut submit = owned(&["lu", "R", "--out", "LU", "--schedule", "dag"]);
            submit.extend(rule.flags().iter().map(|s| s.to_string()));
            Job { label: format!("lu_{what}_dag"), app: App::Lu, inputs: vec![("R", "random", 5)], submit, matrix_bytes: 2.0 * n2 }
        }
    }
}

/// What one of our runs measured.
struct Ours {
    job: JobResult,
    /// The cgroup's peak over the job (processes and page cache).
    peak: u64,
    /// Storage bytes the store node and slaves read / wrote during the job.
    disk_read: u64,
    disk_write: u64,
    /// Page-cache pages read back soon after being dropped, during the job.
    refaults: Option<u64>,
    oom_kills: u64,
    /// The data directory's block device over the job, whoever used it:
    /// bytes read, and the fraction of the job it was busy.
    device_read: Option<u64>,
    device_busy: Option<f64>,
    store_rss: u64,
    slave_rss: Vec<u64>,
    verified: Option<bool>,
}

impl Ours {
    /// The share of the slaves' time in the job spent in kernels: what
    /// the cap costs in waits, whatever else on the host slows kernels
    /// down between the runs (the wall-clock ratio moves with it).
    fn kernel_share(&self, slaves: usize) -> f64 {
        self.job.times.kernels / (self.job.seconds * slaves as f64).max(1e-9)
    }
}

/// A Dask run and its cgroup's peak; or why it failed (under a cap Dask
/// may be killed for memory, which is a result, not a bench failure).
type DaskOutcome = Result<(DaskRun, u64, u64), String>;

pub(super) fn run(args: &Args, base: &Path, figs: &mut Figs) -> anyhow::Result<()> {
    let cap = args.mem_cap.expect("memcap::run runs with --mem-cap");
    let job = job(args);
    let (n, b) = (args.n, args.block);
    eprintln!(
        "beyond memory: {} n = {n}, b = {b}, {} slaves; {:.2} GiB of matrices, cap {:.2} GiB ({:.1}× the cap)",
        job.label,
        args.slaves,
        job.matrix_bytes / (1u64 << 30) as f64,
        cap as f64 / (1u64 << 30) as f64,
        job.matrix_bytes / cap as f64
    );
    let uncapped = ours(args, &job, None, base)?;
    let capped = ours(args, &job, Some(cap), base)?;
    let (dask_capped, dask_uncapped) =
        if args.no_dask { (None, None) } else { (Some(dask(args, &job, Some(cap), base)?), Some(dask(args, &job, None, base)?)) };
    table(&job, args.slaves, cap, &uncapped, &capped, dask_uncapped.as_ref(), dask_capped.as_ref());
    push_figures(figs, args, &job, cap, &uncapped, &capped, dask_uncapped.as_ref(), dask_capped.as_ref());
    Ok(())
}

/// A fresh cgroup (`limit`: none, to measure an uncapped run the same
/// way); says `skipped:` where this machine cannot cap memory.
fn cgroup(label: &str, limit: Option<u64>) -> anyhow::Result<MemCgroup> {
    match MemCgroup::create(label, limit) {
        Ok(g) => Ok(g),
        Err(e) if e.is_unavailable() => {
            use std::io::Write;
            let line = format!("skipped: bench ooc --mem-cap cannot cap memory here: {e}");
            let _ = writeln!(std::io::stdout().lock(), "{line}");
            let _ = writeln!(std::io::stderr().lock(), "{line}");
            bail!("{e}: no run without the cap in its place")
        }
        Err(e) => Err(e.into()),
    }
}

fn mode(limit: Option<u64>) -> &'static str {
    if limit.is_some() {
        "capped"
    } else {
        "uncapped"
    }
}

/// Our job on a fresh store node and slaves inside a fresh cgroup.
fn ours(args: &Args, job: &Job, limit: Option<u64>, base: &Path) -> anyhow::Result<Ours> {
    let what = mode(limit);
    // Declared before the cluster, so dropped after it (a panic's
    // unwinding included): the processes are gone when the group goes.
    let mut g = cgroup(&format!("ooc-{what}"), limit)?;
    let c = Cluster::start(ClusterConfig {
        slaves: args.slaves,
        cache_mib: args.cache_mib,
        base_dir: Some(base.to_owned()),
        cgroup: Some(g.joiner()),
        ..ClusterConfig::default()
    })?;
    eprintln!("ours {what}: {} (cgroup {})", job.label, g.path().display());
    for &(name, kind, seed) in &job.inputs {
        eprintln!("  creating {name} ({kind})");
        c.create_matrix(name, args.n, args.block, kind, seed)?;
    }
    eprintln!("  cgroup holds {:.0} MiB before the job", g.usage()? as f64 / MIB);
    g.reset_peak()?;
    let refaults0 = g.stat("workingset_refault_file")?;
    c.reset_peaks();
    let disk0 = DiskStats::of(base);
    let before = c.snapshot();
    let submit: Vec<&str> = job.submit.iter().map(String::as_str).collect();
    let mut r = c.run_job(&submit, Duration::from_secs(args.job_timeout_s))?;
    let after = c.snapshot();
    let disk1 = DiskStats::of(base);
    let peak = g.peak()?;
    let refaults = g.stat("workingset_refault_file")?.zip(refaults0).map(|(a, b)| a.saturating_sub(b));
    let oom_kills = g.oom_kills()?;
    if !r.ok() {
        bail!("{what} job {} ({}) did not succeed: {}", r.id, job.submit.join(" "), r.failure.clone().unwrap_or_default());
    }
    if job.app == App::Lu {
        // By the job's 2n³/3, as elsewhere: a tournament's tasks count
        // their tree's flops too.
        r.flops = flops(App::Lu, args.n as f64);
    }
    // Slaves by position; one the OOM killer ended drops out of `after`.
    let io = |s: &crate::cluster::Snapshot| {
        let slaves = |f: fn(&crate::cluster::ProcStats) -> u64| s.slaves.iter().map(f).sum::<u64>();
        (s.store.read_bytes + slaves(|p| p.read_bytes), s.store.write_bytes + slaves(|p| p.write_bytes))
    };
    let ((r0, w0), (r1, w1)) = (io(&before), io(&after));
    let verified = if args.no_verify {
        None
    } else {
        let (ok, line) = c.verify(r.id)?;
        eprintln!("  verify: {} {line}", if ok { "ok" } else { "FAILED" });
        Some(ok)
    };
    let o = Ours {
        peak,
        disk_read: r1.saturating_sub(r0),
        disk_write: w1.saturating_sub(w0),
        refaults,
        oom_kills,
        device_read: disk0.zip(disk1).map(|(a, b)| b.read_bytes.saturating_sub(a.read_bytes)),
        device_busy: disk0.zip(disk1).map(|(a, b)| b.busy_ms.saturating_sub(a.busy_ms) as f64 / 1e3 / r.seconds.max(1e-9)),
        store_rss: after.store.peak_rss,
        slave_rss: after.slaves.iter().map(|s| s.peak_rss).collect(),
        verified,
        job: r,
    };
    if let (Some(read), Some(busy)) = (o.device_read, o.device_busy) {
        eprintln!("  the data's disk: {:.2} GiB read by everyone, busy {:.0} % of the job", read as f64 / GIB, busy * 100.0);
    }
    eprintln!(
        "  {:.2} GFLOP/s ({:.1} s); cgroup peak {:.0} MiB; read {:.2} GiB, wrote {:.2} GiB; refaults {}; OOM kills {}; \
         block waits {:.1} s, kernels {:.1} s (task sums); store RSS {:.0} MiB, slaves {:?} MiB",
        o.job.gflops(),
        o.job.seconds,
        o.peak as f64 / MIB,
        o.disk_read as f64 / (1u64 << 30) as f64,
        o.disk_write as f64 / (1u64 << 30) as f64,
        o.refaults.map_or("n/a".to_owned(), |x| x.to_string()),
        o.oom_kills,
        o.job.times.block_wait,
        o.job.times.kernels,
        o.store_rss as f64 / MIB,
        o.slave_rss.iter().map(|s| (*s as f64 / MIB).round()).collect::<Vec<_>>()
    );
    drop(c);
    Ok(o)
}

/// Dask's run of the job in a fresh cgroup: its result, the group's peak
/// and OOM kills; an error only where the bench itself failed.
fn dask(args: &Args, job: &Job, limit: Option<u64>, base: &Path) -> anyhow::Result<DaskOutcome> {
    let what = mode(limit);
    let mut g = cgroup(&format!("dask-{what}"), limit)?;
    eprintln!("Dask {what} (cgroup {})", g.path().display());
    let r = dask_in(job.app, args.n, args.block, args.threads, base, Some(&g.joiner()));
    // A fresh group per run: its peak is the run's, input generation included.
    let (peak, oom_kills) = (g.peak()?, g.oom_kills()?);
    drop(g);
    match r {
        Ok(d) => Ok(Ok((d, peak, oom_kills))),
        Err(e) => {
            eprintln!("  Dask {what} failed (OOM kills in its cgroup: {oom_kills}): {e:#}");
            Ok(Err(format!("OOM kills {oom_kills}: {e:#}")))
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The runs side by side on stderr.
#[allow(clippy::too_many_arguments)]
fn table(
    job: &Job,
    slaves: usize,
    cap: u64,
    uncapped: &Ours,
    capped: &Ours,
    dask_uncapped: Option<&DaskOutcome>,
    dask_capped: Option<&DaskOutcome>,
) {
    eprintln!();
    eprintln!("{} under a {:.2} GiB cap ({:.2} GiB of matrices):", job.label, cap as f64 / GIB, job.matrix_bytes / GIB);
    eprintln!("  {:<15} {:>9} {:>9} {:>14} {:>14} {:>14}", "run", "GFLOP/s", "seconds", "cgroup peak", "disk read", "block waits");
    for (name, o) in [("ours uncapped", uncapped), ("ours capped", capped)] {
        eprintln!(
            "  {name:<15} {:>9.2} {:>9.1} {:>10.0} MiB {:>10.2} GiB {:>12.1} s",
            o.job.gflops(),
            o.job.seconds,
            o.peak as f64 / MIB,
            o.disk_read as f64 / GIB,
            o.job.times.block_wait
        );
    }
    for (name, d) in [("Dask uncapped", dask_uncapped), ("Dask capped", dask_capped)] {
        match d {
            Some(Ok((d, peak, _))) => eprintln!(
                "  {name:<15} {:>9.2} {:>9.1} {:>10.0} MiB {:>10.2} GiB",
                d.gflops,
                d.seconds,
                *peak as f64 / MIB,
                d.read_bytes as f64 / GIB
            ),
            Some(Err(e)) => eprintln!("  {name:<15} failed: {e}"),
            None => {}
        }
    }
    eprintln!("  capped / uncapped: {:.3} (target 0.92)", capped.job.gflops() / uncapped.job.gflops());
    eprintln!(
        "  slaves' time in kernels: {:.3} uncapped, {:.3} capped, ratio {:.3} (unmoved by the host's speed)",
        uncapped.kernel_share(slaves),
        capped.kernel_share(slaves),
        capped.kernel_share(slaves) / uncapped.kernel_share(slaves)
    );
    if let Some(Ok((d, _, _))) = dask_capped {
        eprintln!("  ours / Dask, both capped: {:.3} (target 1.4)", capped.job.gflops() / d.gflops);
    }
    if let Some(Ok((d, _, _))) = dask_uncapped {
        eprintln!("  ours / Dask, both uncapped: {:.3}", uncapped.job.gflops() / d.gflops);
    }
}

fn ours_extra(o: &Ours, args: &Args, cap: Option<u64>) -> super::Extra {
    let mut e = vec![
        ("n", json!(args.n)),
        ("block", json!(args.block)),
        ("slaves", json!(args.slaves)),
        ("seconds", json!(round3(o.job.seconds))),
        ("gflops", json!(round3(o.job.gflops()))),
        ("cap_bytes", json!(cap)),
        ("cgroup_peak_bytes", json!(o.peak)),
        ("disk_read_bytes", json!(o.disk_read)),
        ("disk_write_bytes", json!(o.disk_write)),
        ("refaults", json!(o.refaults)),
        ("oom_kills", json!(o.oom_kills)),
        ("device_read_bytes", json!(o.device_read)),
        ("device_busy", json!(o.device_busy.map(round3))),
        ("block_wait_s", json!(round3(o.job.times.block_wait))),
        ("kernel_share", json!(round3(o.kernel_share(args.slaves)))),
        ("kernels_s", json!(round3(o.job.times.kernels))),
        ("core_wait_s", json!(round3(o.job.times.core_wait))),
        ("store_peak_rss_bytes", json!(o.store_rss)),
        ("slave_peak_rss_bytes", json!(o.slave_rss)),
    ];
    if let Some(v) = o.verified {
        e.push(("verified", json!(v)));
    }
    e
}

fn dask_extra(d: &DaskOutcome, args: &Args, cap: Option<u64>) -> super::Extra {
    let mut e = vec![("n", json!(args.n)), ("block", json!(args.block)), ("threads", json!(args.threads)), ("cap_bytes", json!(cap))];
    match d {
        Ok((d, peak, oom)) => e.extend([
            ("seconds", json!(round3(d.seconds))),
            ("cgroup_peak_bytes", json!(peak)),
            ("disk_read_bytes", json!(d.read_bytes)),
            ("disk_write_bytes", json!(d.write_bytes)),
            ("peak_rss_bytes", json!(d.peak_rss)),
            ("oom_kills", json!(oom)),
        ]),
        Err(why) => e.push(("failed", json!(why))),
    }
    e
}

#[allow(clippy::too_many_arguments)]
fn push_figures(
    figs: &mut Figs,
    args: &Args,
    job: &Job,
    cap: u64,
    uncapped: &Ours,
    capped: &Ours,
    dask_uncapped: Option<&DaskOutcome>,
    dask_capped: Option<&DaskOutcome>,
) {
    let l = &job.label;
    let (gu, gc) = (uncapped.job.gflops(), capped.job.gflops());
    let both = |extra: super::Extra| {
        let mut e = extra;
        e.extend([
            ("capped_gflops", json!(round3(gc))),
            ("uncapped_gflops", json!(round3(gu))),
            ("cap_bytes", json!(cap)),
            ("matrix_bytes", json!(job.matrix_bytes)),
            ("capped_disk_read_bytes", json!(capped.disk_read)),
            ("capped_cgroup_peak_bytes", json!(capped.peak)),
        ]);
        e
    };
    let nb = vec![("n", json!(args.n)), ("block", json!(args.block))];
    figs.push((format!("memcap_{l}_capped_vs_uncapped"), round3(gc / gu), "ratio", Some(0.92), both(nb.clone())));
    let (ku, kc) = (uncapped.kernel_share(args.slaves), capped.kernel_share(args.slaves));
    let mut e = both(nb.clone());
    e.extend([("capped_kernel_share", json!(round3(kc))), ("uncapped_kernel_share", json!(round3(ku)))]);
    figs.push((format!("memcap_{l}_capped_vs_uncapped_kernel_share"), round3(kc / ku), "ratio", None, e));
    if let Some(Ok((d, _, _))) = dask_capped {
        let mut e = both(nb.clone());
        e.push(("dask_capped_gflops", json!(round3(d.gflops))));
        figs.push((format!("memcap_{l}_capped_vs_dask_capped"), round3(gc / d.gflops), "ratio", Some(1.4), e));
    }
    // Out of core: what the capped run read from storage, per byte of
    // its matrices (0 would mean it ran from the page cache).
    figs.push((
        format!("memcap_{l}_capped_disk_read_vs_matrices"),
        round3(capped.disk_read as f64 / job.matrix_bytes),
        "ratio",
        None,
        both(nb.clone()),
    ));
    figs.push((format!("memcap_{l}_capped_cgroup_peak"), (capped.peak as f64 / MIB).round(), "MiB", Some(cap as f64 / MIB), both(nb)));
    figs.push((format!("memcap_{l}_ours_capped_gflops"), round3(gc), "GFLOP/s", None, ours_extra(capped, args, Some(cap))));
    figs.push((format!("memcap_{l}_ours_uncapped_gflops"), round3(gu), "GFLOP/s", None, ours_extra(uncapped, args, None)));
    for (what, d, limit) in [("capped", dask_capped, Some(cap)), ("uncapped", dask_uncapped, None)] {
        if let Some(d) = d {
            let value = d.as_ref().map_or(0.0, |(d, _, _)| round3(d.gflops));
            figs.push((format!("memcap_{l}_dask_{what}_gflops"), value, "GFLOP/s", None, dask_extra(d, args, limit)));
        }
    }
}

/// Counters of the block device a directory lives on (`/proc/diskstats`),
/// whoever used it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct DiskStats {
    read_bytes: u64,
    /// Milliseconds the device had I/O in flight (`io_ticks`).
    busy_ms: u64,
}

impl DiskStats {
    /// `None` where the device is not in `/proc/diskstats` (tmpfs, overlay).
    fn of(dir: &Path) -> Option<DiskStats> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(dir).ok()?.dev();
        // glibc's gnu_dev_major / gnu_dev_minor.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        parse_diskstats(&std::fs::read_to_string("/proc/diskstats").ok()?, major, minor)
    }
}

fn parse_diskstats(text: &str, major: u64, minor: u64) -> Option<DiskStats> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        if num(0)? != major || num(1)? != minor {
            return None;
        }
        // After major, minor and name: reads, merged, sectors read, ms
        // reading, writes, merged, sectors written, ms writing, in
        // flight, io_ticks.
        Some(DiskStats { read_bytes: num(5)? * 512, busy_ms: num(12)? })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats_give_the_device_of_the_directory() {
        let text = " 253       0 zram0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n 254       0 vda 7698393 212274 392867074 96905308 4604907 955703 1691015896 19247031 0 4247612 118249320 870681 62 2342090488 949121 1180326 1147858\n";
        assert_eq!(parse_diskstats(text, 254, 0), Some(DiskStats { read_bytes: 392867074 * 512, busy_ms: 4247612 }));
        assert_eq!(parse_diskstats(text, 253, 0), Some(DiskStats { read_bytes: 0, busy_ms: 0 }));
        assert_eq!(parse_diskstats(text, 8, 1), None);
    }
}
