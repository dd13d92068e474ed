//! `bench soak`: every app in turn on a real cluster (a `master serve` and
//! slave processes) while a seeded schedule SIGKILLs slaves, SIGSTOPs
//! slaves past their lease (zombies that wake up later and find their
//! work fenced), SIGKILLs and restarts the store node, and with `--hosts`
//! cuts slave hosts' links and restores them, until the asked-for counts
//! of each fault are reached. Every job is checked with
//! `master verify` (an independent computation) and its task records
//! against exactly-once: each task of the plan committed once, none twice.
//! Not part of the test suite's time budget; `--quick` (a few dozen
//! faults) is, through `bench/tests/soak.rs`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use uuid::Uuid;

use crate::cluster::{on_host, Cluster, ClusterConfig, HostsPlacement, Placement};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A few dozen faults (20 slave kills, 5 store-node kills, 3 zombies),
    /// in a minute or two.
    #[arg(long)]
    quick: bool,
    /// Slave SIGKILLs to reach (default 200, quick 20).
    #[arg(long)]
    slave_kills: Option<usize>,
    /// Store-node SIGKILLs (each followed by a restart) to reach (default
    /// 50, quick 5).
    #[arg(long)]
    store_kills: Option<usize>,
    /// Slaves SIGSTOPped past their lease and resumed later (default 20,
    /// quick 3).
    #[arg(long)]
    zombies: Option<usize>,
    /// Run across this many network-namespace hosts (needs root): the
    /// store node on host 0, slaves on the others, the soak's own client on
    /// the last; link cuts then join the faults.
    #[arg(long)]
    hosts: Option<usize>,
    /// With --hosts: slave hosts' links cut (for half a lease to three
    /// leases) and restored (default 20, quick 3).
    #[arg(long, requires = "hosts")]
    link_cuts: Option<usize>,
    /// Seed of the fault schedule (the run prints it; the same seed makes
    /// the same schedule of faults, though not the same interleaving).
    #[arg(long)]
    seed: Option<u64>,
    /// Slave processes kept running.
    #[arg(long, default_value_t = 2)]
    slaves: usize,
    /// Matrix order of every job.
    #[arg(long, default_value_t = 1024)]
    n: u64,
    /// Block size of every job.
    #[arg(long, default_value_t = 128)]
    block: u32,
    /// Mean milliseconds between faults (each gap is drawn uniformly from
    /// half to one and a half of it).
    #[arg(long, default_value_t = 300)]
    every_ms: u64,
}

/// The store node's lease in the soak: a zombie is stopped for longer.
const LEASE: Duration = Duration::from_millis(1000);

/// A job the soak runs: its name, its inputs as (matrix, kind), and its
/// submit arguments with `{out}` for the output's name.
type SoakJob = (&'static str, &'static [(&'static str, &'static str)], &'static [&'static str]);

/// The jobs the soak runs in turn.
const JOBS: [SoakJob; 5] = [
    ("matmul", &[("A", "random"), ("B", "random")], &["matmul", "A", "B", "--out", "{out}"]),
    ("cholesky", &[("S", "spd")], &["cholesky", "S", "--out", "{out}"]),
    ("lu", &[("D", "diag-dominant")], &["lu", "D", "--out", "{out}"]),
    ("lu-pivot", &[("R", "random")], &["lu", "R", "--out", "{out}", "--pivot", "partial"]),
    ("raytrace", &[], &["raytrace", "--out", "{out}", "--level", "2", "--width", "256", "--height", "256", "--grain", "8"]),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    SlaveKill,
    StoreKill,
    Zombie,
    LinkCut,
}

/// Faults still to inject, and those done.
#[derive(Default)]
struct Counts {
    slave_kills: usize,
    store_kills: usize,
    zombies: usize,
    link_cuts: usize,
}

impl Counts {
    fn left(&self, target: &Counts) -> usize {
        (target.slave_kills - self.slave_kills)
            + (target.store_kills - self.store_kills)
            + (target.zombies - self.zombies)
            + (target.link_cuts - self.link_cuts)
    }

    /// A fault drawn with weights by what is left of each kind.
    fn draw(&self, target: &Counts, rng: &mut ChaCha8Rng) -> Option<Fault> {
        let left = [
            (Fault::SlaveKill, target.slave_kills - self.slave_kills),
            (Fault::StoreKill, target.store_kills - self.store_kills),
            (Fault::Zombie, target.zombies - self.zombies),
            (Fault::LinkCut, target.link_cuts - self.link_cuts),
        ];
        let total: usize = left.iter().map(|(_, n)| n).sum();
        if total == 0 {
            return None;
        }
        let mut pick = rng.gen_range(0..total);
        for (fault, n) in left {
            if pick < n {
                return Some(fault);
            }
            pick -= n;
        }
        unreachable!("pick < total")
    }
}

/// A slave stopped with SIGSTOP, and when it is resumed.
struct Frozen {
    pid: u32,
    until: Instant,
}

/// A host whose link is cut, and when it is restored.
struct Cut {
    host: usize,
    until: Instant,
}

/// What is held away from the cluster for a while: stopped slaves and cut
/// links.
#[derive(Default)]
struct Held {
    frozen: Vec<Frozen>,
    cuts: Vec<Cut>,
}

/// What one job of the soak came to.
struct JobCheck {
    app: &'static str,
    job: Uuid,
    tasks: usize,
    planned: usize,
    duplicates: usize,
    verified: bool,
    verify_line: String,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.hosts {
        Some(n) => {
            let placement = HostsPlacement::create(n, "none")?;
            anyhow::ensure!(n >= 3, "--hosts {n}: a link cut needs a slave host besides the soak's own (the last), so at least 3");
            let (hosts, cli) = (placement.hosts.clone(), placement.cli_host);
            on_host(&hosts, cli, || soak(&args, Placement::Hosts(placement)))
        }
        None => soak(&args, Placement::Local),
    }
}

fn soak(args: &Args, placement: Placement) -> anyhow::Result<()> {
    let target = Counts {
        slave_kills: args.slave_kills.unwrap_or(if args.quick { 20 } else { 200 }),
        store_kills: args.store_kills.unwrap_or(if args.quick { 5 } else { 50 }),
        zombies: args.zombies.unwrap_or(if args.quick { 3 } else { 20 }),
        link_cuts: match args.hosts {
            Some(_) => args.link_cuts.unwrap_or(if args.quick { 3 } else { 20 }),
            None => 0,
        },
    };
    let seed = args.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let hosts = args.hosts.map_or_else(|| "one host".to_owned(), |n| format!("{n} namespace hosts"));
    eprintln!(
        "soak: seed {seed}; {} slave kills, {} store-node kills, {} zombies, {} link cuts; n = {}, b = {}, {} slaves on {hosts}",
        target.slave_kills, target.store_kills, target.zombies, target.link_cuts, args.n, args.block, args.slaves
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let config = ClusterConfig {
        slaves: args.slaves,
        serve_args: vec!["--lease-ms".into(), LEASE.as_millis().to_string(), "--attempt-limit".into(), "100000".into()],
        placement,
        ..ClusterConfig::default()
    };
    let mut cluster = Cluster::start(config)?;
    for (k, (_, inputs, _)) in JOBS.iter().enumerate() {
        for (i, (name, kind)) in inputs.iter().enumerate() {
            cluster.create_matrix(name, args.n, args.block, kind, 10 * k as u64 + i as u64 + 1)?;
        }
    }
    let start = Instant::now();
    let mut done = Counts::default();
    let mut held = Held::default();
    let mut checks: Vec<JobCheck> = Vec::new();
    let gap = |rng: &mut ChaCha8Rng| Duration::from_millis(rng.gen_range(args.every_ms / 2..=args.every_ms * 3 / 2).max(1));
    let mut next_fault = Instant::now() + gap(&mut rng);
    let mut round = 0;
    while done.left(&target) > 0 || checks.is_empty() {
        let (app, _, submit) = JOBS[round % JOBS.len()];
        let out = format!("{app}-out-{round}");
        let submit: Vec<String> = submit.iter().map(|a| a.replace("{out}", &out)).collect();
        let submit: Vec<&str> = submit.iter().map(String::as_str).collect();
        let job = cluster.submit(&submit)?;
        let job_start = Instant::now();
        while !cluster.job_ended(job)? {
            if job_start.elapsed() > Duration::from_secs(600) {
                bail!("{app} job {job} did not end within 10 minutes (seed {seed})");
            }
            let now = Instant::now();
            release_due(&mut cluster, &mut held, now)?;
            if now >= next_fault {
                if let Some(fault) = done.draw(&target, &mut rng) {
                    inject(&mut cluster, fault, &mut done, &mut held, &mut rng)?;
                }
                next_fault = Instant::now() + gap(&mut rng);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let result = cluster.wait(job, Duration::from_secs(30))?;
        let planned = cluster.planned_tasks(job)?;
        let (verified, verify_line) = cluster.verify(job)?;
        eprintln!(
            "soak: {app} job {job}: {} ({} of {planned} tasks, {} redone, {} twice), verify {}; faults so far: {} slave kills, {} store kills, {} zombies, {} link cuts",
            result.state,
            result.tasks,
            result.redone,
            result.duplicates,
            if verified { "passed" } else { "FAILED" },
            done.slave_kills,
            done.store_kills,
            done.zombies,
            done.link_cuts
        );
        checks.push(JobCheck {
            app,
            job,
            tasks: result.tasks,
            planned,
            duplicates: result.duplicates,
            verified: verified && result.state == "succeeded",
            verify_line,
        });
        cluster.remove_matrix(&out);
        round += 1;
    }
    // Zombies still stopped are resumed and cut links restored.
    release_due(&mut cluster, &mut held, Instant::now() + LEASE * 10)?;

    let lost: usize = checks.iter().map(|c| c.planned.saturating_sub(c.tasks)).sum();
    let extra: usize = checks.iter().map(|c| c.tasks.saturating_sub(c.planned)).sum();
    let duplicated: usize = checks.iter().map(|c| c.duplicates).sum();
    let failed: Vec<&JobCheck> = checks.iter().filter(|c| !c.verified).collect();
    let wall = start.elapsed().as_secs_f64();
    for c in &failed {
        eprintln!("soak: {} job {} failed its check: {}", c.app, c.job, c.verify_line);
    }
    println!(
        "soak: {} jobs in {wall:.0} s survived {} slave kills, {} store-node kills, {} zombies and {} link cuts: {} lost and {} duplicated commits, {} jobs failed their check",
        checks.len(),
        done.slave_kills,
        done.store_kills,
        done.zombies,
        done.link_cuts,
        lost + extra,
        duplicated,
        failed.len()
    );
    let figure = json!({
        "name": "soak",
        "seed": seed,
        "jobs": checks.len(),
        "slave_kills": done.slave_kills,
        "store_kills": done.store_kills,
        "zombies": done.zombies,
        "link_cuts": done.link_cuts,
        "hosts": args.hosts.unwrap_or(1),
        "lost_commits": lost,
        "unplanned_commits": extra,
        "duplicated_commits": duplicated,
        "jobs_failed_check": failed.len(),
        "wall_s": (wall * 10.0).round() / 10.0,
        "n": args.n,
        "block": args.block,
        "slaves": args.slaves,
    });
    println!("BENCH {figure}");
    if lost + extra + duplicated > 0 || !failed.is_empty() {
        bail!("the soak lost or duplicated work (seed {seed}): see above");
    }
    Ok(())
}

/// Injects one fault, replacing what it takes away.
fn inject(cluster: &mut Cluster, fault: Fault, done: &mut Counts, held: &mut Held, rng: &mut ChaCha8Rng) -> anyhow::Result<()> {
    match fault {
        Fault::SlaveKill => {
            let live = cluster.slave_pids().len();
            if live == 0 {
                return Ok(());
            }
            cluster.kill_slave(rng.gen_range(0..live))?;
            cluster.spawn_slave()?;
            done.slave_kills += 1;
        }
        Fault::StoreKill => {
            cluster.kill_store()?;
            cluster.restart_store().context("restarting the store node after its SIGKILL")?;
            done.store_kills += 1;
        }
        Fault::Zombie => {
            let live = cluster.slave_pids().len();
            if live == 0 {
                return Ok(());
            }
            let pid = cluster.stop_slave(rng.gen_range(0..live))?;
            // Stopped past its lease: the node ends its session and aborts
            // its action; a replacement takes its place meanwhile.
            let asleep = LEASE.mul_f64(rng.gen_range(1.5..3.0));
            held.frozen.push(Frozen { pid, until: Instant::now() + asleep });
            cluster.spawn_slave()?;
            done.zombies += 1;
        }
        Fault::LinkCut => {
            let Placement::Hosts(h) = cluster.placement() else { return Ok(()) };
            // A slave host, not the store's (0) nor the soak's own (the last).
            let cuttable: Vec<usize> = (1..h.cli_host).filter(|host| held.cuts.iter().all(|c| c.host != *host)).collect();
            let Some(&host) = cuttable.get(rng.gen_range(0..cuttable.len().max(1))) else { return Ok(()) };
            h.hosts.cut_link(host).with_context(|| format!("cutting host {host}'s link"))?;
            // Shorter than a lease, the connections ride it out; longer,
            // the node ends the sessions and the slaves start new ones.
            let cut_for = LEASE.mul_f64(rng.gen_range(0.5..3.0));
            held.cuts.push(Cut { host, until: Instant::now() + cut_for });
            done.link_cuts += 1;
        }
    }
    Ok(())
}

/// Resumes the zombies whose time is up (`now`): they find their session
/// ended and their action's commit refused, and go on as slaves. Restores
/// the links whose time is up.
fn release_due(cluster: &mut Cluster, held: &mut Held, now: Instant) -> anyhow::Result<()> {
    let (due, later): (Vec<Frozen>, Vec<Frozen>) = std::mem::take(&mut held.frozen).into_iter().partition(|f| f.until <= now);
    held.frozen = later;
    for f in due {
        cluster.resume_slave(f.pid)?;
    }
    let (due, later): (Vec<Cut>, Vec<Cut>) = std::mem::take(&mut held.cuts).into_iter().partition(|c| c.until <= now);
    held.cuts = later;
    if let Placement::Hosts(h) = cluster.placement() {
        for c in due {
            h.hosts.restore_link(c.host).with_context(|| format!("restoring host {}'s link", c.host))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_drawn_until_each_count_is_reached_and_no_further() {
        let target = Counts { slave_kills: 5, store_kills: 2, zombies: 1, link_cuts: 3 };
        let mut done = Counts::default();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        while let Some(f) = done.draw(&target, &mut rng) {
            match f {
                Fault::SlaveKill => done.slave_kills += 1,
                Fault::StoreKill => done.store_kills += 1,
                Fault::Zombie => done.zombies += 1,
                Fault::LinkCut => done.link_cuts += 1,
            }
        }
        assert_eq!((done.slave_kills, done.store_kills, done.zombies, done.link_cuts), (5, 2, 1, 3));
        assert_eq!(done.left(&target), 0);
    }
}
