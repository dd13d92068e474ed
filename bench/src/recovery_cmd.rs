//! `bench recovery`: the experiment the thesis never ran (§6.1). A matmul
//! job runs on a [`Cluster`] of two slaves; at a random moment (seeded) one
//! slave is SIGKILLed and a replacement started at once. The extra run time
//! against undisturbed runs of the same job is compared with the model's
//! recovery terms (§3.6, `model::recovery`): the average, half a task's
//! work `T₁/(2N)`, and the worst case, the longest task lost just before
//! its commit.
//!
//! Each kill loses the task the victim held (it returns to the bag first in
//! line and is redone) plus the replacement's start (process start,
//! connection, first dequeue), which the thesis's term lacks: the model
//! adds `Params::slave_start / s` (`Recovery::restart`) when the parameter
//! file has it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use model::{predict, App, Params};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::cluster::{Cluster, ClusterConfig};
use crate::params_cmd::median;
use crate::report::Figure;
use crate::validate_cmd::{implementation_options, this_machine_cores, warm};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run (smaller job, 3 kills), under a minute.
    #[arg(long)]
    quick: bool,
    /// Parameter file written by `bench params` (default ./params.toml).
    #[arg(long, default_value = "params.toml")]
    params: PathBuf,
    /// Matrix order of the matmul job (default 3072, quick 1536).
    #[arg(long)]
    n: Option<u64>,
    /// Block size (default 384, quick 256).
    #[arg(long)]
    block: Option<u64>,
    /// Runs with one SIGKILL each (default 12, quick 3).
    #[arg(long)]
    kills: Option<usize>,
    /// Undisturbed runs that give the baseline time (default 3, quick 2).
    #[arg(long)]
    baseline_runs: Option<usize>,
    /// Seed of the kill moments and victims.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.params).with_context(|| format!("reading {}", args.params.display()))?;
    let params = Params::from_toml_str(&text).with_context(|| format!("parameter file {}", args.params.display()))?;
    let n = args.n.unwrap_or(if args.quick { 1536 } else { 3072 });
    let b = args.block.unwrap_or(if args.quick { 256 } else { 384 });
    let kills = args.kills.unwrap_or(if args.quick { 3 } else { 12 });
    let baseline_runs = args.baseline_runs.unwrap_or(if args.quick { 2 } else { 3 }).max(1);
    let slaves = 2u64;
    let cores = this_machine_cores();
    let options = implementation_options(App::Matmul, slaves, cores);
    let pr = predict(App::Matmul, n, b, &warm(&params), &options)?;
    eprintln!(
        "matmul n={n} b={b}, {} tasks, {slaves} slaves: predicted {:.2} s; recovery average {:.3} s, worst {:.3} s",
        pr.volumes.n_tasks, pr.predicted, pr.recovery.average, pr.recovery.worst
    );

    let started = Instant::now();
    let mut c = Cluster::start(ClusterConfig { slaves: slaves as usize, ..ClusterConfig::default() })?;
    c.create_matrix("A", n, b as u32, "random", 1)?;
    c.create_matrix("B", n, b as u32, "random", 2)?;
    let job = |c: &Cluster, run: usize| -> anyhow::Result<uuid::Uuid> { c.submit(&["matmul", "A", "B", "--out", &format!("C{run}")]) };

    let mut base = Vec::new();
    for run_no in 0..baseline_runs {
        let id = job(&c, run_no)?;
        let r = c.wait(id, Duration::from_secs(1800))?;
        anyhow::ensure!(r.ok(), "baseline run failed: {:?}", r.failure);
        eprintln!("baseline: {:.2} s", r.seconds);
        base.push(r.seconds);
        c.remove_matrix(&format!("C{run_no}"));
    }
    let t0 = median(&mut base.clone());

    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut extras = Vec::new();
    let mut rows = Vec::new();
    for k in 0..kills {
        // Uniform over the run, leaving the last 5 %: a kill after the
        // last commit would cost nothing and measure nothing.
        let at = rng.gen_range(0.0..0.95) * t0;
        let victim = rng.gen_range(0..slaves as usize);
        let run_no = baseline_runs + k;
        let id = job(&c, run_no)?;
        std::thread::sleep(Duration::from_secs_f64(at));
        let pid = c.kill_slave(victim)?;
        c.spawn_slave()?;
        let r = c.wait(id, Duration::from_secs(1800))?;
        anyhow::ensure!(r.ok(), "run {k} failed after the kill: {:?}", r.failure);
        let (passed, line) = if k == 0 { c.verify(id)? } else { (true, String::new()) };
        anyhow::ensure!(passed, "run {k}: result wrong after a kill: {line}");
        let extra = r.seconds - t0;
        eprintln!(
            "kill {k}: slave pid {pid} at {at:.2} s ({:.0} % of the run): {:.2} s, extra {extra:+.2} s, {} task(s) redone",
            100.0 * at / t0,
            r.seconds,
            r.redone
        );
        extras.push(extra);
        rows.push((at, r.seconds, extra, r.redone));
        c.remove_matrix(&format!("C{run_no}"));
    }
    drop(c);

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
