//! `bench recovery`: the experiment the thesis never ran (§6.1). A matmul
//! job runs on a [`Cluster`] of two slaves; at a random moment (seeded) one
//! slave is SIGKILLed and a replacement started at once. The extra run time
//! against undisturbed runs of the same job is compared with the model's
//! recovery terms (§3.6, `model::recovery`): the average, half a task's
//! work `T₁/(2N)`, and the worst case, the longest task lost just before
//! its commit.
//!
//! Drift: on this host the same job ran 1.39, 1.35 and then 1.11 s in a
//! row (a fresh store's first runs pay for fresh page-cache pages), and the
//! kill runs that followed came out 0.26 s *faster* than that baseline. So
//! warm-up runs come first and are not counted, and each kill run is
//! bracketed by undisturbed runs: its extra time is against the mean of
//! the run just before and the run just after it.
//!
//! Each kill loses the task the victim held (it returns to the bag first in
//! line and is redone) plus the replacement's start (process start,
//! connection, first dequeue), which the thesis's term lacks: the model
//! adds it when the parameter file has `Params::slave_start`: on average
//! shared by the slaves (`Recovery::restart`), in the worst case whole up
//! to one task's time. A task's ending at the job's block size is timed
//! again through the cluster's node before the runs (a kill during it
//! loses that task too).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use model::{predict, App, Options, Params};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::cluster::{Cluster, ClusterConfig};
use crate::params_cmd::median;
use crate::report::Figure;
use crate::validate_cmd::{this_machine_cores, warm};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run (smaller job, 3 kills), under a minute.
    #[arg(long)]
    quick: bool,
    /// Parameter file written by `bench params` (default ./params.toml).
    #[arg(long, default_value = "params.toml")]
    params: PathBuf,
    /// Matrix order of the matmul job (default 4096, quick 1536).
    #[arg(long)]
    n: Option<u64>,
    /// Block size (default 1024, quick 256). Long tasks make a lost task's
    /// cost stand out of the runs' noise: at n = 3072, b = 384 the model's
    /// average recovery (0.04 s) was half the spread of undisturbed runs.
    #[arg(long)]
    block: Option<u64>,
    /// Runs with one SIGKILL each (default 12, quick 3).
    #[arg(long)]
    kills: Option<usize>,
    /// Undisturbed runs before the measured ones, not counted (default 1).
    #[arg(long, default_value_t = 1)]
    warmup_runs: usize,
    /// Seed of the kill moments and victims.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.params).with_context(|| format!("reading {}", args.params.display()))?;
    let params = Params::from_toml_str(&text).with_context(|| format!("parameter file {}", args.params.display()))?;
    let n = args.n.unwrap_or(if args.quick { 1536 } else { 4096 });
    let b = args.block.unwrap_or(if args.quick { 256 } else { 1024 });
    let kills = args.kills.unwrap_or(if args.quick { 3 } else { 12 });
    let slaves = 2u64;
    let cores = this_machine_cores();
    let options = Options::implementation(slaves, cores);

    let started = Instant::now();
    let mut c = Cluster::start(ClusterConfig { slaves: slaves as usize, ..ClusterConfig::default() })?;
    // A task's ending at this block size timed again through this node,
    // as `bench validate` does: it follows the disk's sync latency, which
    // drifts (at b = 1024 the parameter file's 4.1 ms, 5.5–12 ms through
    // validate's nodes within the hour), and a kill during an ending in
    // flight loses that task too (`recovery::Held::ending_behind`).
    let (_, ending) = c.with_client(|client| async move { crate::params_cmd::endings_now(&client, b as usize).await })?;
    eprintln!(
        "task ending now at b = {b}: {:.3} ms (parameter file {} ms)",
        ending.secs * 1e3,
        crate::params_cmd::ms_at(params.task_ending.as_deref(), ending.units)
    );
    let params = Params { task_ending: crate::params_cmd::merged(params.task_ending.as_deref(), ending), ..params };
    let pr = predict(App::Matmul, n, b, &warm(&params), &options)?;
    eprintln!(
        "matmul n={n} b={b}, {} tasks, {slaves} slaves: predicted {:.2} s; recovery average {:.3} s, worst {:.3} s",
        pr.volumes.n_tasks, pr.predicted, pr.recovery.average, pr.recovery.worst
    );
    c.create_matrix("A", n, b as u32, "random", 1)?;
    c.create_matrix("B", n, b as u32, "random", 2)?;
    let job = |c: &Cluster, run: usize| -> anyhow::Result<uuid::Uuid> { c.submit(&["matmul", "A", "B", "--out", &format!("C{run}")]) };

    let mut run_no = 0;
    let mut undisturbed = |c: &Cluster, what: &str| -> anyhow::Result<f64> {
        let id = job(c, run_no)?;
        let r = c.wait(id, Duration::from_secs(1800))?;
        anyhow::ensure!(r.ok(), "{what} run failed: {:?}", r.failure);
        eprintln!("{what}: {:.2} s", r.seconds);
        c.remove_matrix(&format!("C{run_no}"));
        run_no += 1;
        Ok(r.seconds)
    };
    for _ in 0..args.warmup_runs {
        undisturbed(&c, "warm-up")?;
    }
    let mut base = vec![undisturbed(&c, "undisturbed")?];

    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut killed = Vec::new();
    for k in 0..kills {
        // Uniform over the run, leaving the last 5 %: a kill after the
        // last commit would cost nothing and measure nothing.
        let t_before = *base.last().expect("one undisturbed run first");
        let at = rng.gen_range(0.0..0.95) * t_before;
        let victim = rng.gen_range(0..slaves as usize);
        let kill_run = 1_000_000 + k;
        let id = job(&c, kill_run)?;
        std::thread::sleep(Duration::from_secs_f64(at));
        let pid = c.kill_slave(victim)?;
        c.spawn_slave()?;
        let r = c.wait(id, Duration::from_secs(1800))?;
        anyhow::ensure!(r.ok(), "run {k} failed after the kill: {:?}", r.failure);
        let (passed, line) = if k == 0 { c.verify(id)? } else { (true, String::new()) };
        anyhow::ensure!(passed, "run {k}: result wrong after a kill: {line}");
        c.remove_matrix(&format!("C{kill_run}"));
        eprintln!(
            "kill {k}: slave pid {pid} at {at:.2} s ({:.0} % of the run): {:.2} s, {} task(s) redone",
            100.0 * at / t_before,
            r.seconds,
            r.redone
        );
        killed.push((at, r.seconds, r.redone));
        base.push(undisturbed(&c, "undisturbed")?);
    }
    drop(c);
    let t0 = median(&mut base.clone());
    // Each kill run against the undisturbed runs on either side of it.
    let rows: Vec<(f64, f64, f64, usize)> =
        killed.iter().enumerate().map(|(k, &(at, t, redone))| (at, t, t - 0.5 * (base[k] + base[k + 1]), redone)).collect();
    let extras: Vec<f64> = rows.iter().map(|r| r.2).collect();

    let mean = extras.iter().sum::<f64>() / extras.len().max(1) as f64;
    let max = extras.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = {
        let m = base.iter().sum::<f64>() / base.len() as f64;
        (base.iter().map(|t| (t - m).powi(2)).sum::<f64>() / base.len() as f64).sqrt()
    };
    let within_worst = extras.iter().filter(|e| **e <= pr.recovery.worst + 2.0 * spread).count();
    println!();
    println!("{:>4} {:>9} {:>9} {:>9} {:>7}", "kill", "at s", "run s", "extra s", "redone");
    for (k, (at, t, e, redone)) in rows.iter().enumerate() {
        println!("{k:>4} {at:>9.2} {t:>9.2} {e:>+9.2} {redone:>7}");
    }
    println!(
        "baseline {t0:.2} s (runs {:?}, spread {spread:.2} s); measured extra: mean {mean:+.2} s, max {max:+.2} s; \
         model: average {:.3} s, worst {:.3} s",
        base.iter().map(|t| (t * 100.0).round() / 100.0).collect::<Vec<_>>(),
        pr.recovery.average,
        pr.recovery.worst
    );

    let extra = || vec![("n", json!(n)), ("b", json!(b)), ("slaves", json!(slaves)), ("kills", json!(kills)), ("quick", json!(args.quick))];
    let fig = |name: &str, value: f64, unit: &str, target: Option<f64>| Figure { name, value, unit, target, extra: extra() }.print();
    fig("recovery_baseline", t0, "s", None);
    fig("recovery_baseline_spread", spread, "s", None);
    fig("recovery_extra_mean", mean, "s", Some(pr.recovery.average));
    fig("recovery_extra_max", max, "s", Some(pr.recovery.worst));
    fig("recovery_model_average", pr.recovery.average, "s", None);
    fig("recovery_model_worst", pr.recovery.worst, "s", None);
    fig("recovery_model_restart", pr.recovery.restart, "s", None);
    fig("recovery_runs_within_worst", within_worst as f64, "runs", Some(kills as f64));
    fig("recovery_wall", started.elapsed().as_secs_f64(), "s", None);
    Ok(())
}
