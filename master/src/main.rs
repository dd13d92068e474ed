//! `master`: the command line of the system. It runs store nodes and talks
//! to them; it holds no state of its own and is not needed while a job runs.

mod certs;
mod demo;
mod jobs;
mod matrix;
mod node_cmd;
mod npy;
mod progress;
mod serve;
mod source;
mod store_args;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use store_args::StoreArgs;

#[derive(Parser)]
#[command(name = "master", version, about = "Fault-tolerant out-of-core bag-of-tasks compute: the master CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a store node: RocksDB objects, atomic actions and bags of tasks over gRPC.
    Serve(serve::Args),
    /// Make a private CA and certificates for TLS between the hosts of a cluster.
    Certs(certs::Args),
    /// The store node's connections by transport (TCP or its Unix sockets), TLS, refusals.
    Node(node_cmd::Args),
    /// The whole story on one machine: embedded store, local slaves, a job, a slave killed halfway, verified.
    Demo(demo::Args),
    /// Create, import, export, list, inspect and delete matrices.
    #[command(subcommand)]
    Matrix(matrix::Command),
    /// Submit a job; prints its id alone on stdout.
    #[command(subcommand)]
    Submit(jobs::Submit),
    /// Wait for a job; exit status 0 only if it succeeded.
    Wait(jobs::JobArg),
    /// List jobs.
    Jobs {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Progress of a job (default: the latest): tasks per bag, slaves, GFLOP/s, time left.
    Status {
        /// Job id (a unique prefix, or "last").
        #[arg(default_value = "last")]
        job: String,
        /// Keep watching with a progress bar until the job ends.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Check a finished job's result against an independent computation.
    Verify(jobs::JobArg),
    /// List live sessions (slaves and other clients) of the store node.
    /// "actions" counts each session's running actions, including the one
    /// its last commit began ahead for its next task.
    Slaves {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Export a ray-traced image.
    #[command(subcommand)]
    Image(demo::ImageCommand),
}

fn main() -> ExitCode {
    apps::kernels::use_fast_blas_kernels();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ok(false): the command ran but its answer is "no" (job failed, check failed).
async fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Serve(args) => serve::run(args).await.map(|()| true),
        Command::Certs(args) => certs::run(args).map(|()| true),
        Command::Node(args) => node_cmd::run(args).await.map(|()| true),
        Command::Demo(args) => demo::run(args).await,
        Command::Matrix(cmd) => matrix::run(cmd).await.map(|()| true),
        Command::Submit(cmd) => jobs::submit(cmd).await.map(|()| true),
        Command::Wait(arg) => {
            let client = arg.store.connect().await?;
            let id = jobs::resolve(&client, &arg.job).await?;
            jobs::wait(&client, id, None).await
        }
        Command::Jobs { store } => {
            let client = store.connect().await?;
            for j in jobs::all_jobs(&client).await? {
                let s = jobs::job_status(&client, j.id()).await?;
                println!("{}  {:<9} {:<10} {}/{} tasks", j.id(), j.spec.app_name(), s.state(), s.n_done(), j.total_tasks());
            }
            Ok(true)
        }
        Command::Status { job, watch, store } => {
            let client = store.connect().await?;
            let id = jobs::resolve(&client, &job).await?;
            if watch {
                let bar = progress::bar(true, 0, "tasks");
                let ok = jobs::wait(&client, id, Some(&bar)).await?;
                bar.finish_and_clear();
                let s = jobs::job_status(&client, id).await?;
                jobs::print_status(&s, jobs::slaves(&client).await?);
                return Ok(ok);
            }
            let s = jobs::job_status(&client, id).await?;
            jobs::print_status(&s, jobs::slaves(&client).await?);
            Ok(true)
        }
        Command::Verify(arg) => {
            let client = arg.store.connect().await?;
            let id = jobs::resolve(&client, &arg.job).await?;
            jobs::verify(&client, id).await
        }
        Command::Slaves { store } => {
            let client = store.connect().await?;
            println!("{:>16} {:<24} {:<22} {:>8} {:>10} {:>7}", "session", "name", "host", "age s", "heartbeat", "actions");
            for s in client.list_sessions().await? {
                // The address the node sees, less its port: the slave's host.
                let host = s.peer.rsplit_once(':').map_or(s.peer.as_str(), |(h, _)| h);
                println!(
                    "{:>16} {:<24} {:<22} {:>8.1} {:>8}ms {:>7}",
                    s.session,
                    s.client_name,
                    host,
                    Duration::from_millis(s.age_ms).as_secs_f64(),
                    s.since_heartbeat_ms,
                    s.n_actions
                );
            }
            Ok(true)
        }
        Command::Image(cmd) => demo::image(cmd).await.map(|()| true),
    }
}
