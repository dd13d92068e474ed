//! `master demo`: an embedded store node in a temporary directory, local
//! slave processes, a job, a slave SIGKILLed halfway and replaced, the
//! result verified, and a summary. Also `master image export`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use apps::generate::MatrixKind;
use apps::job::{CholeskyVariant, JobSpec, LuSchedule};
use store_client::Client;
use uuid::Uuid;

use crate::jobs;
use crate::out::{errln, outln};
use crate::source::{meta, with_source};
use crate::store_args::StoreArgs;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Application: matmul, cholesky, lu, raytrace, or all (one after another).
    #[arg(long, default_value = "matmul")]
    app: String,
    /// Matrix order n.
    #[arg(long, default_value_t = 4096)]
    n: u64,
    /// Block size b.
    #[arg(long, default_value_t = 512)]
    block: u32,
    /// Number of slave processes.
    #[arg(long, default_value_t = 2)]
    slaves: usize,
    /// How many times to SIGKILL a slave (evenly through the run) and start a replacement.
    #[arg(long, default_value_t = 1)]
    kills: usize,
    /// Cholesky: how the factorisation is split into bags of tasks.
    #[arg(long, value_enum, default_value_t = crate::choices::Variant::Dag)]
    variant: crate::choices::Variant,
    /// Ray tracing: sphereflake recursion level.
    #[arg(long, default_value_t = 3)]
    level: u32,
    /// Ray tracing: image width and height in pixels.
    #[arg(long, default_value_t = 512)]
    side: u32,
    /// Ray tracing: scanlines per task.
    #[arg(long, default_value_t = 8)]
    grain: u32,
    /// Keep the store's data here instead of a temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Store block cache, MiB.
    #[arg(long, default_value_t = 1024)]
    cache_mib: usize,
}

#[derive(clap::Subcommand)]
pub(crate) enum ImageCommand {
    /// Write a ray-traced image (by the --out name given at submit) as PNG.
    Export {
        /// The image's name (`--out` of `master submit raytrace`).
        name: String,
        /// The PNG file to write.
        out: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
}

pub(crate) async fn image(cmd: ImageCommand) -> anyhow::Result<()> {
    let ImageCommand::Export { name, out, store } = cmd;
    let client = store.connect().await?;
    let job = jobs::all_jobs(&client)
        .await?
        .into_iter()
        .rev()
        .find(|j| matches!(&j.spec, JobSpec::Raytrace { name: n, .. } if *n == name))
        .with_context(|| format!("no ray-tracing job made an image {name:?}"))?;
    let JobSpec::Raytrace { job: id, params, .. } = job.spec else { unreachable!() };
    let (width, height) = (params.width, params.height);
    let rgb = with_source(&client, move |src| apps::raytrace::assemble(src, id, &params)).await??;
    let png = apps::raytrace::encode_png(width, height, &rgb)?;
    std::fs::write(&out, png).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

struct Slaves {
    exe: PathBuf,
    store: String,
    logs: PathBuf,
    running: Vec<Child>,
    started: usize,
}

impl Slaves {
    fn spawn(&mut self) -> anyhow::Result<()> {
        self.started += 1;
        let name = format!("slave-{}", self.started);
        let log = std::fs::File::create(self.logs.join(format!("{name}.log")))?;
        let child = Command::new(&self.exe)
            .args(["--store", &self.store, "--name", &name])
            .env("OPENBLAS_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        self.running.push(child);
        Ok(())
    }

    fn kill_one(&mut self) -> Option<u32> {
        let mut victim = self.running.remove(0);
        let pid = victim.id();
        let killed = victim.kill();
        // Reaped either way: a failed kill means it had already exited.
        let _ = victim.wait();
        killed.ok().map(|()| pid)
    }
}

impl Drop for Slaves {
    fn drop(&mut self) {
        for c in &mut self.running {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<bool> {
    let tmp = tempfile::tempdir()?;
    let data = args.data.clone().unwrap_or_else(|| tmp.path().join("store"));
    let mut config = store::Config::new(data.clone(), "127.0.0.1:0".parse().expect("literal address"));
    config.cache_mib = args.cache_mib;
    let node = store::start(config).await.context("starting the embedded store node")?;
    let addr = node.addr().to_string();
    errln!("store node on {addr}, data in {}", data.display());
    let client = Client::connect(&addr, None).await?;
    let exe = std::env::current_exe()?.with_file_name("slave");
    if !exe.exists() {
        bail!("{} is missing: build it with `cargo build --release -p slave`", exe.display());
    }
    let mut slaves = Slaves { exe, store: addr.clone(), logs: tmp.path().to_owned(), running: Vec::new(), started: 0 };
    for _ in 0..args.slaves {
        slaves.spawn()?;
    }
    errln!("{} slaves started (logs in {})", args.slaves, tmp.path().display());
    let apps: Vec<&str> = if args.app == "all" { vec!["matmul", "cholesky", "lu", "raytrace"] } else { vec![args.app.as_str()] };
    let mut all_ok = true;
    for app in apps {
        all_ok &= run_app(&args, app, &client, &mut slaves).await?;
    }
    drop(slaves);
    node.shutdown().await?;
    Ok(all_ok)
}

async fn run_app(args: &Args, app: &str, client: &Client, slaves: &mut Slaves) -> anyhow::Result<bool> {
    let (n, b) = (args.n, args.block);
    errln!("== {app}: n = {n}, b = {b}, {} slaves, {} kill(s)", args.slaves, args.kills);
    let id = match app {
        "matmul" => {
            crate::matrix::create(client, "A", n, n, b, MatrixKind::Random, 1, true).await?;
            crate::matrix::create(client, "B", n, n, b, MatrixKind::Random, 2, true).await?;
            jobs::submit_matmul(client, "A", "B", "C", false, jobs::MatmulOrder::Nearest).await?
        }
        "cholesky" => {
            let a = meta(&crate::matrix::create(client, "S", n, n, b, MatrixKind::Spd, 3, true).await?);
            let l = meta(&client.create_matrix("L", n, n, b).await?);
            let variant: CholeskyVariant = args.variant.into();
            let spec = JobSpec::Cholesky { job: Uuid::new_v4(), a, l, variant, flag_timeout_ms: apps::cholesky::DEFAULT_FLAG_TIMEOUT_MS };
            jobs::submit_spec(client, spec).await?
        }
        "lu" => {
            let a = meta(&crate::matrix::create(client, "D", n, n, b, MatrixKind::DiagDominant, 4, true).await?);
            let lu = meta(&client.create_matrix("LU", n, n, b).await?);
            jobs::submit_spec(
                client,
                JobSpec::Lu { job: Uuid::new_v4(), a, lu, pivot: true, schedule: LuSchedule::Dag, pivot_rule: Default::default() },
            )
            .await?
        }
        "raytrace" => {
            let params =
                apps::raytrace::RenderParams { level: args.level, width: args.side, height: args.side, grain: args.grain, samples: 1 };
            jobs::submit_spec(client, JobSpec::Raytrace { job: Uuid::new_v4(), name: "balls".into(), params }).await?
        }
        other => bail!("unknown app {other:?} (matmul, cholesky, lu, raytrace, all)"),
    };
    let start = Instant::now();
    let bar = crate::progress::bar(true, 0, "tasks");
    let mut kills_done = 0;
    let status = loop {
        let s = jobs::job_status(client, id).await?;
        let total = s.record.total_tasks();
        bar.set_length(total as u64);
        bar.set_position(s.n_done() as u64);
        bar.set_message(format!("{:.1} GFLOP/s", s.flops_done() / start.elapsed().as_secs_f64() / 1e9));
        if s.state() != "running" {
            break s;
        }
        // Kill at evenly spaced fractions of the run: k/(kills+1).
        if kills_done < args.kills && s.n_done() * (args.kills + 1) >= total * (kills_done + 1) {
            if let Some(pid) = slaves.kill_one() {
                bar.println(format!("killed slave pid {pid} with SIGKILL at {}/{total} tasks; starting a replacement", s.n_done()));
            }
            slaves.spawn()?;
            kills_done += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish_and_clear();
    let elapsed = start.elapsed().as_secs_f64();
    if status.state() != "succeeded" {
        jobs::print_status(&status, slaves.running.len());
        return Ok(false);
    }
    let verified = jobs::verify(client, id).await?;
    let flops = apps::job::flops(&status.record.spec);
    outln!("{app}: {} tasks in {elapsed:.1} s", status.record.total_tasks());
    if flops > 0.0 {
        outln!("  rate              {:.2} GFLOP/s", flops / elapsed / 1e9);
    }
    jobs::print_task_times(&status);
    outln!("  slaves killed     {kills_done} (SIGKILL), each replaced");
    outln!("  tasks redone      {} (their first run was lost with a killed slave)", status.n_redone());
    outln!("  tasks committed   {} once each, {} more than once", status.n_done(), status.n_duplicates());
    outln!("  verified          {}", if verified { "yes" } else { "NO" });
    Ok(verified && status.n_duplicates() == 0)
}
