//! `bench model APP`: what the performance model (crate `model`) predicts
//! for one run, and with `--sweep` a table over block sizes and slave
//! counts with the block recommended for a memory budget.
//!
//! Parameters: `--params FILE` (a TOML `model::Params`, as `bench params`
//! writes), or one of the names `thesis-fast`, `thesis-hp`, `thesis-atm`
//! (the thesis's Table 4.5). Without `--params`, `./params.toml` if it
//! exists, else `thesis-fast`; stderr says which.

use std::path::PathBuf;

use anyhow::Context;
use model::{predict, recommend, App, CholeskyCaching, MatmulCaching, MemoryLayout, Options, Params, Prediction, Preset, SharedCpu};
use serde_json::json;

use crate::report::Figure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// matmul, cholesky[-single-bag|-multi-step-1|-multi-step-2|-dag], lu,
    /// lu-pivot, raytrace.
    app: String,
    /// Matrix order (image side for raytrace).
    #[arg(long, default_value_t = 3000)]
    n: u64,
    /// Block width (rows per task for raytrace).
    #[arg(long, default_value_t = 300)]
    block: u64,
    /// Number of slaves.
    #[arg(long, default_value_t = 1)]
    slaves: u64,
    /// Parameter file (TOML), or thesis-fast / thesis-hp / thesis-atm.
    #[arg(long)]
    params: Option<PathBuf>,
    /// Table over block sizes and slave counts, and a recommended block.
    #[arg(long)]
    sweep: bool,
    /// Memory per slave for the block recommendation, MiB.
    #[arg(long, default_value_t = 1024.0)]
    memory_mib: f64,
    /// Caching: matmul (Table 3.3) none, server-block-a, server-row,
    /// server-all, slave-row, slave-all; cholesky (Table 3.4) none,
    /// server-row, server-all.
    #[arg(long, default_value = "none")]
    caching: String,
    /// Extension: the store overlaps disk and network (section 5.5.1).
    #[arg(long)]
    double_buffer: bool,
    /// Extension: slaves prefetch / run two tasks to overlap transfers with
    /// compute (section 5.5.2).
    #[arg(long)]
    overlap: bool,
    /// With --overlap: the share of transfers hidden behind compute (1:
    /// all, §5.5.2; 0.5: this implementation's slave, one block ahead of
    /// updates that read block pairs).
    #[arg(long, default_value_t = model::ONE_BLOCK_AHEAD_OF_PAIRS)]
    overlap_share: f64,
    /// With --overlap: bytes of blocks each slave fetches ahead (at least
    /// one block); where that holds two blocks, every transfer can be
    /// hidden (share 1). 0: one block ahead at every size. This
    /// implementation's slave: 2097152.
    #[arg(long, default_value_t = 0.0)]
    prefetch_bytes: f64,
    /// With --overlap: slaves prefetch only within the task they hold
    /// (this implementation), so the reads a task's first kernel needs
    /// are never hidden (default: the source's two threads per slave).
    #[arg(long)]
    prefetch_within_task: bool,
    /// Updates accumulate inside the multiply kernel (this
    /// implementation's dgemm/dsyrk with beta = 1): no separate add or
    /// subtract (default: the source's separate add, eq. 4.2).
    #[arg(long)]
    fused_update: bool,
    /// With --overlap: the source's slave, whose block writes do not
    /// overlap its compute (default: this implementation's write-behind
    /// slave, whose writes all do).
    #[arg(long)]
    no_write_behind: bool,
    /// Extension: the slaves run on the store node's machine and read
    /// blocks from its files themselves (the local data plane), so a read's
    /// transfer is the slave's time, not the store node's serialised time.
    #[arg(long)]
    slave_reads: bool,
    /// Extension: the slaves run on other hosts, each behind a link of `C`
    /// (`bench params --hosts`): every transfer crosses the store's
    /// full-duplex link and waits on it, not on a core. With
    /// `--this-system`: this implementation across hosts.
    #[arg(long, conflicts_with = "slave_reads")]
    remote_slaves: bool,
    /// Extension: Cholesky's diagonal task updates with dsyrk (b³ flop per
    /// block of its row, this implementation), not a full multiply (2b³,
    /// the source).
    #[arg(long)]
    diagonal_syrk: bool,
    /// LU without pivoting: the blocks below the diagonal are solved as
    /// parallel tasks, not in the serial factor step (this implementation;
    /// the source solved them in the factor step).
    #[arg(long)]
    lu_parallel_solves: bool,
    /// Extension: the dag Cholesky's prediction is its run simulated task
    /// by task (FIFO bag, write-behind endings, releases at commits), not
    /// its lower bound.
    #[arg(long)]
    simulate_dag: bool,
    /// Extension: the prediction of barrier-step runs (matmul, LU, the
    /// other Cholesky variants, ray tracing) is each step's tasks
    /// list-scheduled on the slaves (whole tasks: two slaves take two
    /// tasks' time over a step of three), not its lower bound.
    #[arg(long)]
    simulate_steps: bool,
    /// Extension, with `--cores`: a task's ending (timed alone in the
    /// parameter file) shares the cores with the slaves' kernels, and
    /// takes max(1, (s + 2)/cores) times as long (not with `slave
    /// --compute idle`, whose kernels give way to it).
    #[arg(long)]
    ending_shares_cores: bool,
    /// Extension, ray tracing: each grain's pixels are one small object in
    /// its task's commit (this implementation), not a stored object of
    /// their own: no disk write beyond the commit the per-task overhead
    /// prices
    #[arg(long)]
    pixels_in_commit: bool,
    /// Store nodes.
    #[arg(long, default_value_t = 1)]
    store_nodes: u64,
    /// This implementation on this machine, as `bench validate` predicts
    /// it: --overlap (one block ahead, write-behind), --slave-reads,
    /// --diagonal-syrk, --lu-parallel-solves, --simulate-dag,
    /// --simulate-steps, --ending-shares-cores, --pixels-in-commit (ray
    /// tracing's grains written behind too), and --cores
    /// (default: this machine's). Other
    /// organisation flags are ignored with it.
    #[arg(long)]
    this_system: bool,
    /// Every block read at the store's cached rate (`disk_get_cached`), as
    /// `bench validate` predicts its jobs, whose matrices stay in the
    /// node's memory; without it reads cost the cold rate (`disk_get`),
    /// as for a matrix larger than the machine's memory.
    #[arg(long)]
    warm_store: bool,
    /// Extension: store and slaves share one machine of this many cores.
    #[arg(long)]
    cores: Option<u64>,
    /// Extension: network cost from the BSP g and l of the parameter file.
    #[arg(long)]
    bsp: bool,
    /// Reduced run, under a minute (a smaller sweep).
    #[arg(long)]
    quick: bool,
}

fn load_params(path: Option<&PathBuf>) -> anyhow::Result<Params> {
    let named = |name: &str| match name {
        "thesis-fast" => Some(Params::thesis_fast()),
        "thesis-hp" => Some(Params::thesis_hp()),
        "thesis-atm" => Some(Params::thesis_atm()),
        _ => None,
    };
    let (params, source) = match path {
        Some(p) => match named(&p.to_string_lossy()) {
            Some(params) => (params, format!("built-in set {}", p.display())),
            None => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading parameter file {}", p.display()))?;
                let params = Params::from_toml_str(&text).with_context(|| format!("parameter file {}", p.display()))?;
                (params, format!("file {}", p.display()))
            }
        },
        None => {
            let local = PathBuf::from("params.toml");
            if local.exists() {
                let text = std::fs::read_to_string(&local).context("reading ./params.toml")?;
                (Params::from_toml_str(&text).context("./params.toml")?, "file ./params.toml".to_string())
            } else {
                (Params::thesis_fast(), "default: thesis Table 4.5 \"fast\" (no --params, no ./params.toml)".to_string())
            }
        }
    };
    eprintln!("model parameters: {source} ({})", params.name);
    Ok(params)
}

fn caching(name: &str) -> anyhow::Result<MatmulCaching> {
    Ok(match name {
        "none" => MatmulCaching::None,
        "server-block-a" => MatmulCaching::ServerBlockOfA,
        "server-row" => MatmulCaching::ServerBlockRow,
        "server-all" => MatmulCaching::ServerAll,
        "slave-row" => MatmulCaching::SlaveBlockRow,
        "slave-all" => MatmulCaching::SlaveAll,
        other => anyhow::bail!("unknown caching `{other}` (none, server-block-a, server-row, server-all, slave-row, slave-all)"),
    })
}

fn cholesky_caching(name: &str) -> anyhow::Result<CholeskyCaching> {
    Ok(match name {
        "none" => CholeskyCaching::None,
        "server-row" => CholeskyCaching::ServerBlockRow,
        "server-all" => CholeskyCaching::ServerAll,
        other => anyhow::bail!("caching `{other}` does not apply to cholesky (none, server-row, server-all)"),
    })
}

fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

fn print_prediction(pr: &Prediction) {
    let v = &pr.volumes;
    println!("{} n={} b={} p={} slaves={}", pr.app, pr.n, pr.b, pr.p, pr.slaves);
    println!(
        "  tasks {}   reads {} blocks ({:.1} MB)   writes {} blocks ({:.1} MB)   input {:.1} MB",
        v.n_tasks,
        v.n_gets,
        mb(v.get_bytes),
        v.n_puts,
        mb(v.put_bytes),
        mb(v.input_bytes)
    );
    if pr.barriers > 0 {
        println!("  barriers {}", pr.barriers);
    }
    println!("  T1                {:>12.2} s", pr.t1);
    println!("  T_inf in          [{:.1}, {:.1}] s", pr.t_inf.lwr, pr.t_inf.upr);
    println!("  T_s (s={}) in     [{:.1}, {:.1}] s", pr.slaves, pr.t_s.lwr, pr.t_s.upr);
    if pr.flops > 0.0 {
        println!("  predicted         {:>12.2} s   ({:.1} Mflop/s)", pr.predicted, pr.rate / 1e6);
    } else {
        println!("  predicted         {:>12.2} s   (speedup {:.2})", pr.predicted, pr.t1 / pr.predicted);
    }
    println!("  longest task      {:>12.2} s", pr.longest_task);
    if pr.kernel_slowdown > 1.0 {
        println!("  kernels on shared cores {:.2}x slower while every slave computes", pr.kernel_slowdown);
    }
    println!("  memory per slave  {:>12.1} MiB", pr.memory_per_slave / (1024.0 * 1024.0));
    let r = &pr.recovery;
    print!(
        "  recovery of one slave failure: average {:.2} s ({:.2} % of the run), worst {:.2} s",
        r.average,
        100.0 * r.fraction_of_run,
        r.worst
    );
    match r.permanent_loss_average {
        Some(x) => println!(", slave lost for good {x:.2} s"),
        None => println!(", slave lost for good: run waits for a new slave"),
    }
    println!("  queue requests every {:.2} s on average", r.queue_interval);
}

fn sweep(app: App, args: &Args, params: &Params, options: &Options) -> anyhow::Result<u64> {
    let ps: &[u64] = if args.quick { &[1, 2, 4, 8, 16] } else { &[1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 32, 40] };
    let mut blocks: Vec<u64> = ps.iter().map(|&p| args.n.div_ceil(p.min(args.n))).collect();
    blocks.dedup();
    let slaves: &[u64] = if args.quick { &[1, 2, 4, 8] } else { &[1, 2, 4, 8, 16, 32, 64] };
    println!();
    println!("predicted time lwr{{T_s}} in s (upper bound in brackets), {} n={}", app, args.n);
    print!("{:>8} {:>6}", "b", "tasks");
    for s in slaves {
        print!(" {:>22}", format!("s={s}"));
    }
    println!(" {:>10}", "MiB/slave");
    for &b in &blocks {
        let mut row = Vec::new();
        for &s in slaves {
            row.push(predict(app, args.n, b, params, &Options { slaves: s, ..options.clone() })?);
        }
        print!("{:>8} {:>6}", b, row[0].volumes.n_tasks);
        for pr in &row {
            print!(" {:>22}", format!("{:.1} [{:.1}]", pr.t_s.lwr, pr.t_s.upr));
        }
        println!(" {:>10.1}", row[0].memory_per_slave / (1024.0 * 1024.0));
    }
    let budget = args.memory_mib * 1024.0 * 1024.0 * args.slaves as f64;
    let layout = match options.matmul_caching {
        MatmulCaching::SlaveBlockRow if app == App::Matmul => MemoryLayout::SlaveRow,
        MatmulCaching::ServerBlockRow if app == App::Matmul => MemoryLayout::ServerRowDirected,
        _ => MemoryLayout::NoCache,
    };
    let rec = recommend(app, args.n, budget, layout, params, options)?;
    println!();
    println!(
        "memory {} MiB per slave x {} slaves ({layout:?}, section 5.3): largest block {:.0}; recommended b = {} \
         (predicted {:.1} s, {} tasks, average recovery {:.2} s)",
        args.memory_mib,
        args.slaves,
        rec.b_max,
        rec.b,
        rec.prediction.predicted,
        rec.prediction.volumes.n_tasks,
        rec.prediction.recovery.average
    );
    Ok(rec.b)
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let app: App = args.app.parse().map_err(anyhow::Error::msg)?;
    let params = load_params(args.params.as_ref())?;
    let params = if args.warm_store { crate::validate_cmd::warm(&params) } else { params };
    let options = if args.this_system {
        let cores = args.cores.unwrap_or_else(crate::validate_cmd::this_machine_cores);
        let preset = if args.remote_slaves { Preset::ThisImplementationAcrossHosts } else { Preset::ThisImplementation };
        preset.options(args.slaves, cores)
    } else {
        Options {
            slaves: args.slaves,
            matmul_caching: if app == App::Matmul { caching(&args.caching)? } else { MatmulCaching::None },
            cholesky_caching: if let App::Cholesky(_) = app { cholesky_caching(&args.caching)? } else { CholeskyCaching::None },
            server_double_buffer: args.double_buffer,
            slave_overlap: args.overlap,
            slave_overlap_share: args.overlap_share,
            slave_prefetch_bytes: args.prefetch_bytes,
            prefetch_within_task: args.prefetch_within_task,
            fused_update: args.fused_update,
            write_behind: !args.no_write_behind,
            slave_reads: args.slave_reads,
            remote_slaves: args.remote_slaves,
            diagonal_syrk: args.diagonal_syrk,
            lu_parallel_solves: args.lu_parallel_solves,
            simulate_dag: args.simulate_dag,
            simulate_steps: args.simulate_steps,
            store_nodes: args.store_nodes,
            shared_cpu: args.cores.map(|cores| SharedCpu { cores, store_share: 1.0 }),
            ending_shares_cores: args.ending_shares_cores,
            use_bsp: args.bsp,
            cached_puts: false,
            raytrace_task_overhead: 0.0,
            pixels_in_commit: args.pixels_in_commit,
            // Predictions are for this implementation's jobs (8-bit RGB).
            pixel_bytes: model::IMPLEMENTATION_PIXEL_BYTES,
        }
    };
    let pr = predict(app, args.n, args.block, &params, &options)?;
    print_prediction(&pr);
    let parts = model::parts(app, args.n, args.block, &params, &options)?;
    let share = |x: f64| 100.0 * x / pr.predicted.max(1e-12);
    println!(
        "  of the prediction: compute {:.2} s ({:.0} %), transfers {:.2} s ({:.0} %), per-task costs {:.2} s ({:.0} %)",
        parts.compute,
        share(parts.compute),
        parts.transfers,
        share(parts.transfers),
        parts.task_costs,
        share(parts.task_costs)
    );
    let recommended = if args.sweep { Some(sweep(app, &args, &params, &options)?) } else { None };

    let extra = || {
        vec![
            ("app", json!(app.to_string())),
            ("n", json!(args.n)),
            ("b", json!(args.block)),
            ("slaves", json!(args.slaves)),
            ("params", json!(params.name)),
        ]
    };
    let figure = |name: &str, value: f64, unit: &str| Figure { name, value, unit, target: None, extra: extra() }.print();
    figure("model_t1", pr.t1, "s");
    figure("model_t_inf_lwr", pr.t_inf.lwr, "s");
    figure("model_t_inf_upr", pr.t_inf.upr, "s");
    figure("model_predicted", pr.predicted, "s");
    figure("model_t_s_upr", pr.t_s.upr, "s");
    figure("model_rate", pr.rate / 1e6, "Mflop/s");
    figure("model_tasks", pr.volumes.n_tasks as f64, "tasks");
    figure("model_get", mb(pr.volumes.get_bytes), "MB");
    figure("model_put", mb(pr.volumes.put_bytes), "MB");
    figure("model_memory_per_slave", pr.memory_per_slave / (1024.0 * 1024.0), "MiB");
    figure("model_recovery_average", pr.recovery.average, "s");
    figure("model_recovery_worst", pr.recovery.worst, "s");
    figure("model_part_compute", parts.compute, "s");
    figure("model_part_transfers", parts.transfers, "s");
    figure("model_part_task_costs", parts.task_costs, "s");
    if let Some(b) = recommended {
        let mut e = extra();
        e.push(("memory_mib_per_slave", json!(args.memory_mib)));
        Figure { name: "model_recommended_block", value: b as f64, unit: "elements", target: None, extra: e }.print();
    }
    Ok(())
}
