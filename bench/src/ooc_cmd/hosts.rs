//! `bench ooc APP --hosts N --rate R`: the same out-of-core job across N
//! network-namespace hosts (`netns`): the store node on host 0 (fixed
//! ports, a token), one slave on each of hosts 1..N-1, the `master` CLI and
//! this bench's own client on host N-1, every block over TCP through the
//! shaped links; beside it, in the same run, the job on one host with as
//! many slaves (the existing path: loopback, the node's Unix sockets).
//! Then the same job across hosts once more with one slave SIGKILLed
//! halfway (it must finish), and Dask distributed on the same hosts
//! ([`super::dask_hosts`]).
//!
//! Across hosts the slaves cache blocks and serve them to each other
//! (`slave --cache-mib`, the default); the same job with caching off
//! (`--cache-mib 0`: every read from the store) runs beside it in the
//! same run, so the two share the machine's noise.
//!
//! Bytes per link come from each host's veth counters
//! ([`netns::Cluster::link_bytes`]) read before and after the job: the
//! store host's link carries every block a slave reads or writes.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::{dask_hosts, gang_hosts, round3, scalapack_hosts, App, Args, Engine, Extra, Figs};
use job_record as record;

use crate::cluster::{on_host, Cluster, ClusterConfig, HostsPlacement, JobResult, Placement};

/// What one app's job is: the inputs to create (name, kind, seed), the
/// `master submit` arguments and the matrix it writes.
#[derive(Clone)]
struct Job {
    inputs: Vec<(&'static str, &'static str, u64)>,
    submit: Vec<String>,
    output: &'static str,
    label: String,
}

impl Job {
    fn of(args: &Args) -> Job {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match args.app {
            App::Matmul => Job {
                inputs: vec![("A", "random", 1), ("B", "random", 2)],
                submit: own(&["matmul", "A", "B", "--out", "C"]),
                output: "C",
                label: "matmul".into(),
            },
            App::Cholesky => {
                let v = args.variant.first().map_or("dag", String::as_str).to_owned();
                Job {
                    inputs: vec![("S", "spd", 3)],
                    submit: own(&["cholesky", "S", "--out", "L", "--variant", &v]),
                    output: "L",
                    label: format!("cholesky ({v})"),
                }
            }
            App::Lu if args.pivot.is_some() => {
                let rule = args.pivot.map_or(["--pivot", "partial"], super::PivotRuns::flags);
                Job {
                    inputs: vec![("R", "random", 5)],
                    submit: own(&["lu", "R", "--out", "LU", "--schedule", "dag", rule[0], rule[1]]),
                    output: "LU",
                    label: format!("lu ({} pivoting, dag)", rule[1]),
                }
            }
            App::Lu => Job {
                inputs: vec![("D", "diag-dominant", 4)],
                submit: own(&["lu", "D", "--out", "LU", "--schedule", "dag"]),
                output: "LU",
                label: "lu (no pivoting, dag)".into(),
            },
        }
    }

    fn submit_args(&self) -> Vec<&str> {
        self.submit.iter().map(String::as_str).collect()
    }

    fn create_inputs(&self, c: &Cluster, n: u64, b: u32) -> anyhow::Result<()> {
        for &(name, kind, seed) in &self.inputs {
            c.create_matrix(name, n, b, kind, seed)?;
        }
        Ok(())
    }
}

/// One job measured: its result, the bytes each host's link carried
/// (across hosts) and whether `master verify` passed.
struct Run {
    job: JobResult,
    links: Vec<netns::LinkBytes>,
    verified: Option<bool>,
}

/// A cluster across hosts whose slaves cache blocks and serve them to each other.
fn cached_cluster(args: &Args, base: &Path, placement: &HostsPlacement, slaves: usize) -> anyhow::Result<Cluster> {
    Cluster::start(ClusterConfig {
        slaves,
        cache_mib: args.cache_mib,
        base_dir: Some(base.to_owned()),
        placement: Placement::Hosts(placement.clone()),
        ..ClusterConfig::default()
    })
}

fn print_reads(r: &record::ReadSources) {
    let mib = |b: u64| b as f64 / super::MIB;
    eprintln!(
        "    block reads: {:.0} MiB from the store, {:.0} from peers, {:.0} from the slaves' own caches",
        mib(r.store),
        mib(r.peers),
        mib(r.cache)
    );
}

fn run_once(c: &Cluster, job: &Job, args: &Args) -> anyhow::Result<Run> {
    let before = c.snapshot();
    let r = c.run_job(&job.submit_args(), Duration::from_secs(args.job_timeout_s))?;
    let after = c.snapshot();
    if !r.ok() {
        bail!("job {} ({}) did not succeed: {}", r.id, job.label, r.failure.clone().unwrap_or_default());
    }
    let verified = verify(c, args, r.id)?;
    eprintln!("  {}: {} tasks in {:.1} s, {:.2} GFLOP/s", job.label, r.tasks, r.seconds, r.gflops());
    Ok(Run { job: r, links: before.links_since(&after), verified })
}

pub(super) fn verify(c: &Cluster, args: &Args, id: uuid::Uuid) -> anyhow::Result<Option<bool>> {
    if args.no_verify {
        return Ok(None);
    }
    let (ok, line) = c.verify(id)?;
    eprintln!("  verify: {} {line}", if ok { "ok" } else { "FAILED" });
    Ok(Some(ok))
}

/// The links' bytes as JSON: the store host's, then each slave host's.
pub(super) fn links_json(links: &[netns::LinkBytes]) -> Value {
    let host = |i: usize, l: &netns::LinkBytes| json!({"host": i, "tx_bytes": l.tx, "rx_bytes": l.rx});
    json!({
        "store": links.first().map(|l| host(0, l)),
        "slaves": links.iter().enumerate().skip(1).map(|(i, l)| host(i, l)).collect::<Vec<_>>(),
    })
}

fn print_links(links: &[netns::LinkBytes], secs: f64) {
    for (i, l) in links.iter().enumerate() {
        let role = if i == 0 { "store host" } else { "slave host" };
        eprintln!(
            "    host {i} ({role}): sent {:.0} MiB, received {:.0} MiB ({:.0} / {:.0} Mbit/s over the job)",
            l.tx as f64 / super::MIB,
            l.rx as f64 / super::MIB,
            l.tx as f64 * 8.0 / secs.max(1e-9) / 1e6,
            l.rx as f64 * 8.0 / secs.max(1e-9) / 1e6
        );
    }
}

/// The data-parallel runs of [`uncached_pair`]: the model's inputs, the
/// job, and (unless `--no-kill`) the job with a rank killed.
type GangRuns = (gang_hosts::Inputs, gang_hosts::GangRun, Option<gang_hosts::KillRun>);

/// The bag of tasks with caching off across hosts and, with `gang`, the
/// data-parallel engine after it in the same cluster (the model's inputs
/// measured first).
fn uncached_pair(args: &Args, base: &Path, placement: &HostsPlacement, job: &Job, gang: bool) -> anyhow::Result<(Run, Option<GangRuns>)> {
    let (slaves, cli_host) = (placement.hosts.hosts() - 1, placement.cli_host);
    on_host(&placement.hosts, cli_host, || {
        let mut c = Cluster::start(ClusterConfig {
            slaves,
            cache_mib: args.cache_mib,
            base_dir: Some(base.to_owned()),
            placement: Placement::Hosts(placement.clone()),
            slave_args: vec!["--cache-mib".into(), "0".into()],
            ..ClusterConfig::default()
        })?;
        let inputs = if gang { Some(gang_hosts::measure(&c, placement, slaves, args.block, args.quick)?) } else { None };
        eprintln!("  caching off: creating the inputs (over host {cli_host}'s link)");
        job.create_inputs(&c, args.n, args.block)?;
        let r = run_once(&c, job, args)?;
        print_links(&r.links, r.job.seconds);
        let Some(inputs) = inputs else { return Ok((r, None)) };
        let g = gang_hosts::run(&c, slaves, args)?;
        print_links(&g.links, g.job.seconds);
        let kill = if args.no_kill {
            None
        } else {
            // A few checkpoints in the run, so that a kill loses part of an interval.
            let steps = args.n.div_ceil(u64::from(args.block)) as u32;
            Some(gang_hosts::run_with_kill(&mut c, slaves, args, (steps / 4).max(1))?)
        };
        Ok((r, Some((inputs, g, kill))))
    })
}

/// `--engine bsp` without `bag`: the pair of [`uncached_pair`] (and
/// ScaLAPACK with `scalapack`), nothing else.
fn bag_and_gang(args: &Args, base: &Path, figs: &mut Figs, common: &dyn Fn(&mut Extra)) -> anyhow::Result<()> {
    let n_hosts = args.hosts.context("--hosts")?;
    let placement = HostsPlacement::create(n_hosts, &args.rate)?;
    eprintln!("across hosts: store node on host 0 ({}), a rank on each of hosts 1..{}", placement.store_addr(), n_hosts - 1);
    let (bag, gang) = uncached_pair(args, base, &placement, &Job::of(args), true)?;
    let (inputs, g, kill) = gang.context("the data-parallel run")?;
    gang_hosts::figures(figs, args, n_hosts - 1, &inputs, &bag.job, &g, common)?;
    if let Some(k) = &kill {
        gang_hosts::kill_figures(figs, &inputs, args, n_hosts - 1, k, common)?;
    }
    scalapack(figs, args, base, &placement, &g, common)
}

/// ScaLAPACK's block size: its usual panel width, which keeps the block
/// columns spread evenly over a few ranks at these orders.
const SCALAPACK_NB: u32 = 128;

/// With `--engine scalapack`: pdgemm at the same n on the same hosts, and
/// the data-parallel engine's rate against it.
fn scalapack(
    figs: &mut Figs,
    args: &Args,
    base: &Path,
    placement: &HostsPlacement,
    gang: &gang_hosts::GangRun,
    common: &dyn Fn(&mut Extra),
) -> anyhow::Result<()> {
    if !args.engine.contains(&Engine::Scalapack) {
        return Ok(());
    }
    let ranks = placement.hosts.hosts() - 1;
    eprintln!("  ScaLAPACK pdgemm in core, n = {}, nb = {SCALAPACK_NB}, one MPI rank on each of hosts 1..{ranks}", args.n);
    let r = scalapack_hosts::run(placement, ranks, args.n, SCALAPACK_NB, if args.quick { 1 } else { 2 }, base)?;
    let gf = r.result["gflops"].as_f64().context("pdgemm's gflops")?;
    eprintln!(
        "  ScaLAPACK: {:.2} GFLOP/s ({:.2} s); data-parallel {:.2}: {:.2}× it",
        gf,
        r.result["seconds"].as_f64().unwrap_or(f64::NAN),
        gang.job.gflops(),
        gang.job.gflops() / gf.max(1e-9)
    );
    print_links(&r.links, r.result["seconds"].as_f64().unwrap_or(1.0));
    let mut e: Extra = vec![("scalapack", r.result.clone()), ("links_whole_mpirun", links_json(&r.links)), ("ranks", json!(ranks))];
    common(&mut e);
    figs.push(("ooc_hosts_matmul_scalapack_gflops".into(), round3(gf), "GFLOP/s", None, e));
    let mut e: Extra = vec![("bsp_gflops", json!(round3(gang.job.gflops()))), ("scalapack_gflops", json!(round3(gf)))];
    common(&mut e);
    figs.push(("ooc_hosts_matmul_bsp_vs_scalapack".into(), round3(gang.job.gflops() / gf.max(1e-9)), "ratio", Some(0.8), e));
    Ok(())
}

pub(super) fn run(args: &Args, base: &Path, figs: &mut Figs) -> anyhow::Result<()> {
    let n_hosts = args.hosts.context("--hosts")?;
    if n_hosts < 2 {
        bail!("--hosts needs 2 hosts or more (the store's and at least one slave's)");
    }
    let slaves = n_hosts - 1;
    let (n, b) = (args.n, args.block);
    let job = Job::of(args);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let oversubscribed = slaves + 1 > cores;
    let rate = args.rate.clone();
    eprintln!("ooc across hosts: {} n = {n}, b = {b}; {n_hosts} hosts at {rate} (no delay applied), {slaves} slaves", job.label);
    if oversubscribed {
        eprintln!(
            "note: {slaves} slaves and the store node share this machine's {cores} cores: oversubscribed, so both runs \
             are CPU-bound below what {n_hosts} real hosts would do; the link figures are the point"
        );
    }
    let common = |e: &mut Extra| {
        e.extend([
            ("n", json!(n)),
            ("block", json!(b)),
            ("hosts", json!(n_hosts)),
            ("rate", json!(rate)),
            ("slaves", json!(slaves)),
            ("cores", json!(cores)),
            ("oversubscribed", json!(oversubscribed)),
            ("delay", json!("none (no netem)")),
        ])
    };

    let gang = args.app == App::Matmul && args.engine.contains(&Engine::Bsp);
    if gang && !args.engine.contains(&Engine::Bag) {
        return bag_and_gang(args, base, figs, &common);
    }

    // ---- the same job on one host, as many slaves ----
    eprintln!("one host: {slaves} slaves, the node's Unix sockets");
    let one = {
        let c = Cluster::start(ClusterConfig {
            slaves,
            cache_mib: args.cache_mib,
            base_dir: Some(base.to_owned()),
            ..ClusterConfig::default()
        })?;
        job.create_inputs(&c, n, b)?;
        run_once(&c, &job, args)?
    };

    // ---- across hosts ----
    let placement = HostsPlacement::create(n_hosts, &rate)?;
    let (hosts, cli_host) = (placement.hosts.clone(), placement.cli_host);
    eprintln!(
        "across hosts: store node on host 0 ({}), slaves on hosts 1..{}, CLI on host {cli_host}",
        placement.store_addr(),
        n_hosts - 1
    );
    let (uncached, with_gang) = uncached_pair(args, base, &placement, &job, gang)?;
    if let Some((inputs, g, kill)) = &with_gang {
        gang_hosts::figures(figs, args, slaves, inputs, &uncached.job, g, &common)?;
        if let Some(k) = kill {
            gang_hosts::kill_figures(figs, inputs, args, slaves, k, &common)?;
        }
        scalapack(figs, args, base, &placement, g, &common)?;
    }
    // Locality-aware dequeue against the bag's order and the two-level
    // bag, each on fresh slaves (a second job on warm caches would read
    // nothing).
    let mut orders = Vec::new();
    if args.app == App::Matmul {
        for order in ["rows", "two-level"] {
            eprintln!("  caching on, `--order {order}`");
            let variant = Job {
                submit: [job.submit.clone(), vec!["--order".into(), order.into()]].concat(),
                label: format!("{} ({order})", job.label),
                ..job.clone()
            };
            let r = on_host(&hosts, cli_host, || {
                let c = cached_cluster(args, base, &placement, slaves)?;
                variant.create_inputs(&c, n, b)?;
                run_once(&c, &variant, args)
            })?;
            print_links(&r.links, r.job.seconds);
            print_reads(&r.job.reads);
            orders.push((order, r));
        }
    }
    eprintln!("  caching on (slave block caches, slave-to-slave transfer)");
    let (across, killed) = on_host(&hosts, cli_host, || {
        let mut c = cached_cluster(args, base, &placement, slaves)?;
        eprintln!("  creating the inputs (over host {cli_host}'s link)");
        job.create_inputs(&c, n, b)?;
        let across = run_once(&c, &job, args)?;
        print_links(&across.links, across.job.seconds);
        print_reads(&across.job.reads);
        if args.no_kill {
            return Ok((across, None));
        }
        c.remove_matrix(job.output);
        eprintln!("  again, SIGKILLing the slave on host {} halfway", c.slave_host(0).unwrap_or(1));
        let id = c.submit(&job.submit_args())?;
        let timeout = Duration::from_secs(args.job_timeout_s);
        let (done, total) = c.wait_progress(id, 0.5, timeout)?;
        c.kill_slave(0)?;
        let r = c.wait(id, timeout)?;
        eprintln!(
            "  with a kill at {done}/{total} tasks: {} in {:.1} s ({:.2} GFLOP/s, {} redone, {} committed twice)",
            r.state,
            r.seconds,
            r.gflops(),
            r.redone,
            r.duplicates
        );
        let verified = if r.ok() { verify(&c, args, r.id)? } else { None };
        Ok((across, Some((r, done, total, verified))))
    })?;

    let (gf, one_gf) = (across.job.gflops(), one.job.gflops());
    let app = match args.app {
        App::Matmul => "matmul",
        App::Cholesky => "cholesky",
        App::Lu => "lu",
    };
    let mut e = vec![
        ("seconds", json!(round3(across.job.seconds))),
        ("tasks", json!(across.job.tasks)),
        ("one_host_gflops", json!(round3(one_gf))),
        ("one_host_seconds", json!(round3(one.job.seconds))),
        ("vs_one_host", json!(round3(gf / one_gf.max(1e-9)))),
        ("links", links_json(&across.links)),
        ("job", json!(job.label)),
        ("caching_off_gflops", json!(round3(uncached.job.gflops()))),
        ("caching_off_links", links_json(&uncached.links)),
        ("vs_caching_off", json!(round3(gf / uncached.job.gflops().max(1e-9)))),
    ];
    if let Some(v) = across.verified {
        e.push(("verified", json!(v)));
    }
    if let (App::Matmul, Some(l)) = (args.app, across.links.first()) {
        // The source's count (no caching): 2p reads per task, p² tasks, a write each.
        let p = n.div_ceil(b as u64) as f64;
        let block_bytes = (b as f64).powi(2) * 8.0;
        let source = (2.0 * p.powi(3) + p * p) * block_bytes;
        e.push(("source_block_bytes", json!(source)));
        e.push(("store_link_vs_source", json!(round3((l.tx + l.rx) as f64 / source))));
        // The target with caches: each input block leaves the store
        // about once, plus the product going in.
        let inputs_and_output = 3.0 * (n as f64).powi(2) * 8.0;
        e.push(("store_link_vs_inputs_and_output", json!(round3((l.tx + l.rx) as f64 / inputs_and_output))));
    }
    common(&mut e);
    figs.push((format!("ooc_hosts_{app}_gflops"), round3(gf), "GFLOP/s", None, e));
    let mut e = vec![("gflops", json!(round3(gf))), ("one_host_gflops", json!(round3(one_gf)))];
    common(&mut e);
    figs.push((format!("ooc_hosts_{app}_vs_one_host"), round3(gf / one_gf.max(1e-9)), "ratio", None, e));
    if !orders.is_empty() {
        let reads = |r: &record::ReadSources| json!({"store": r.store, "peers": r.peers, "cache": r.cache});
        // Table 3.3's "everything at the slave": each slave reads each block
        // of the job's inputs it needs once (N₃ from outside its memory),
        // the rest from its own (N₁). Partitioned by block columns, as
        // dequeues near a slave tend to, a slave needs all of A and 1/s of B.
        let p = n.div_ceil(u64::from(b));
        let counts = model::matmul::read_counts(model::MatmulCaching::SlaveAll, p, u64::from(b), slaves as u64);
        let block_bytes = (b as f64).powi(2) * 8.0;
        let outside = |r: &record::ReadSources| round3((r.store + r.peers) as f64 / (counts.n3 * block_bytes));
        eprintln!("  reads from outside a slave's own cache against Table 3.3's N₃ = p²(1+s): nearest {:.2}×", outside(&across.job.reads));
        for (order, r) in &orders {
            eprintln!(
                "  {order}: {:.2} GFLOP/s, nearest {:.2}× it; reads from outside the cache {:.2}× N₃",
                r.job.gflops(),
                gf / r.job.gflops().max(1e-9),
                outside(&r.job.reads)
            );
            let mut e = vec![
                ("model_slave_all_n3_bytes", json!(counts.n3 * block_bytes)),
                ("model_slave_all_n1_bytes", json!(counts.n1 * block_bytes)),
                ("nearest_outside_vs_n3", json!(outside(&across.job.reads))),
                ("other_outside_vs_n3", json!(outside(&r.job.reads))),
                ("nearest_gflops", json!(round3(gf))),
                ("other_gflops", json!(round3(r.job.gflops()))),
                ("nearest_reads", reads(&across.job.reads)),
                ("other_reads", reads(&r.job.reads)),
                ("nearest_links", links_json(&across.links)),
                ("other_links", links_json(&r.links)),
            ];
            if let Some(v) = r.verified {
                e.push(("other_verified", json!(v)));
            }
            common(&mut e);
            let name = format!("ooc_hosts_matmul_nearest_vs_{}", order.replace('-', "_"));
            figs.push((name, round3(gf / r.job.gflops().max(1e-9)), "ratio", None, e));
        }
    }
    if let Some((r, done, total, verified)) = &killed {
        let mut e = vec![
            ("finished", json!(r.ok())),
            ("gflops", json!(round3(r.gflops()))),
            ("killed_at_tasks", json!(format!("{done}/{total}"))),
            ("redone", json!(r.redone)),
            ("duplicates", json!(r.duplicates)),
            ("no_kill_seconds", json!(round3(across.job.seconds))),
            ("extra_vs_no_kill", json!(round3(r.seconds / across.job.seconds.max(1e-9) - 1.0))),
        ];
        if let Some(v) = verified {
            e.push(("verified", json!(v)));
        }
        common(&mut e);
        figs.push((format!("ooc_hosts_{app}_one_slave_killed_seconds"), round3(r.seconds), "s", None, e));
    }

    // ---- Dask distributed on the same hosts ----
    if !args.no_dask && matches!(args.app, App::Matmul | App::Cholesky) {
        let d = dask_hosts::run(&hosts, cli_host, args.app, n, b, !args.no_kill, base)?;
        let mut e = d.extra();
        e.push(("ours_gflops", json!(round3(gf))));
        common(&mut e);
        figs.push((format!("dask_hosts_{app}_gflops"), round3(d.plain.gflops), "GFLOP/s", None, e.clone()));
        figs.push((format!("ooc_hosts_{app}_vs_dask"), round3(gf / d.plain.gflops.max(1e-9)), "ratio", None, e));
        if let Some(k) = &d.killed {
            let mut e = vec![
                ("finished", json!(k.finished)),
                ("no_kill_seconds", json!(round3(d.plain.seconds))),
                ("killed_after_s", json!(round3(k.killed_after_s))),
                ("ours_one_slave_killed_seconds", json!(killed.as_ref().map(|k| round3(k.0.seconds)))),
            ];
            common(&mut e);
            figs.push((format!("dask_hosts_{app}_one_worker_killed_seconds"), round3(k.seconds), "s", None, e));
        }
    }
    drop(hosts);
    Ok(())
}
