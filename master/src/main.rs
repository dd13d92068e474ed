//! `master`: the command line of the system. It runs store nodes and talks
//! to them; it holds no state of its own and is not needed while a job runs.

mod backup_cmd;
mod certs;
mod choices;
mod control;
mod demo;
mod gang_cmd;
mod joblog;
mod jobs;
mod manual;
mod matrix;
mod node_cmd;
mod npy;
mod out;
mod progress;
mod serve;
mod source;
mod store_args;
mod web;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::out::{errln, outln};
use store_args::StoreArgs;

/// What every subcommand's exit status means (`--help` shows it).
const EXIT_STATUS: &str = "\
Exit status:
  0    success (for wait/status --watch/verify: the job succeeded, the check passed)
  1    failure: an error (said on stderr), a job that failed, a check that failed
  2    bad command line (unknown flag, bad value)
  141  stdout was closed before everything was written (e.g. `master jobs | head -1`);
       the output stops quietly, as for programs ended by SIGPIPE";

#[derive(Parser)]
#[command(name = "master", version, about = "Fault-tolerant out-of-core bag-of-tasks compute: the master CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a store node: RocksDB objects, atomic actions and bags of tasks
    /// over gRPC. Stops on Ctrl-C or SIGTERM within 3 s, slaves connected
    /// or not (they reconnect when it is back); a second one stops it at
    /// once.
    Serve(serve::Args),
    /// Make a private CA and certificates for TLS between the hosts of a cluster.
    Certs(certs::Args),
    /// The store node's connections by transport (TCP or its Unix sockets), TLS, refusals.
    Node(node_cmd::Args),
    /// A consistent backup of the serving store node into a new directory
    /// on its machine, while jobs run; `serve --data DIR` restores it
    /// (commits after the backup are lost, their tasks done again).
    Backup(backup_cmd::Args),
    /// The whole story on one machine: embedded store, local slaves, a job, a slave killed halfway, verified.
    Demo(demo::Args),
    /// Create, import, export, list, inspect and delete matrices.
    #[command(subcommand)]
    Matrix(matrix::Command),
    /// Submit a job; prints its id alone on stdout.
    #[command(subcommand)]
    Submit(jobs::Submit),
    /// Wait for a job; exit status 0 only if it succeeded. Rides through
    /// restarts of the store node that last less than --patience-s.
    Wait(jobs::JobArg),
    /// Cancel a job: slaves stop taking its tasks (those running end),
    /// its bags are emptied, and it is recorded as cancelled. Its output
    /// matrices are kept, listed as incomplete, unless --remove-outputs.
    Cancel {
        /// Job id (a unique prefix, or "last").
        job: String,
        /// Delete the job's output matrices.
        #[arg(long)]
        remove_outputs: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Run a failed job again where it stopped: its dead-lettered tasks
    /// (given up after repeated slave deaths) go back to their bags, its
    /// failure is forgotten, and slaves take it up again.
    Retry(jobs::JobArg),
    /// A job's tasks: who ran what, what went wrong.
    #[command(subcommand)]
    Job(JobCommand),
    /// List jobs, oldest first: id, app, state, tasks done.
    Jobs {
        /// One JSON array of job objects on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Progress of a job (default: the latest): tasks per bag, slaves, GFLOP/s, time left.
    Status {
        /// Job id (a unique prefix, or "last").
        #[arg(default_value = "last")]
        job: String,
        /// Keep watching with a progress bar until the job ends (exit
        /// status as for `wait`); rides through store-node restarts.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Check a finished job's result against an independent computation.
    Verify(jobs::JobArg),
    /// List live sessions (slaves and other clients) of the store node.
    /// "actions" counts each session's running actions, including the one
    /// its last commit began ahead for its next task.
    Slaves {
        /// One JSON array of session objects on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Export a ray-traced image.
    #[command(subcommand)]
    Image(demo::ImageCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(manual::CompletionsArgs),
    /// Write man pages for master and each subcommand.
    Man(manual::ManArgs),
}

#[derive(Subcommand)]
enum JobCommand {
    /// Every committed task (when, by which slave, after how many
    /// orphanings), the tasks dead-lettered, the runs that failed and sent
    /// their task back (with the message), and the job's failure.
    Log {
        /// Job id (a unique prefix, or "last").
        #[arg(default_value = "last")]
        job: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn main() -> ExitCode {
    apps::kernels::use_fast_blas_kernels();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    // Settings file first: the environment and flags override it.
    if let Err(e) = store_client::load_config_file() {
        errln!("error: {e}");
        return ExitCode::FAILURE;
    }
    // Every subcommand's --help ends with what its exit status means.
    let matches = with_exit_status(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            errln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: many errors put
/// their source's text in their own (`binding …: Address already in use`)
/// and name it as their source too, which `{:#}` printed again.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if t.is_empty() || text.contains(&t) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&t);
    }
    text
}

/// `cmd` and its subcommands, at every depth, with [`EXIT_STATUS`] after their help.
fn with_exit_status(cmd: clap::Command) -> clap::Command {
    cmd.after_help(EXIT_STATUS).mut_subcommands(with_exit_status)
}

/// Ok(false): the command ran but its answer is "no" (job failed, check failed).
async fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Serve(args) => serve::run(args).await.map(|()| true),
        Command::Certs(args) => certs::run(args).map(|()| true),
        Command::Node(args) => node_cmd::run(args).await.map(|()| true),
        Command::Backup(args) => backup_cmd::run(args).await.map(|()| true),
        Command::Demo(args) => demo::run(args).await,
        Command::Matrix(cmd) => matrix::run(cmd).await.map(|()| true),
        Command::Submit(cmd) => jobs::submit(cmd).await.map(|()| true),
        Command::Wait(arg) => {
            let mut conn = jobs::Reconnecting::connect(&arg.store).await?;
            let id = jobs::resolve(conn.client(), &arg.job).await?;
            jobs::wait(&mut conn, id, None).await
        }
        Command::Cancel { job, remove_outputs, store } => {
            let client = store.connect().await?;
            let id = jobs::resolve(&client, &job).await?;
            let drained = control::cancel(&client, id, remove_outputs).await?;
            let outputs = if remove_outputs { "its outputs removed" } else { "its outputs kept, marked incomplete" };
            outln!("cancelled job {id}: {drained} task(s) taken out of its bags, {outputs}");
            Ok(true)
        }
        Command::Job(JobCommand::Log { job, json, store }) => {
            let client = store.connect().await?;
            let id = jobs::resolve(&client, &job).await?;
            joblog::log(&client, id, json).await.map(|()| true)
        }
        Command::Retry(arg) => {
            let client = arg.store.connect().await?;
            let id = jobs::resolve(&client, &arg.job).await?;
            let n = control::retry(&client, id).await?;
            outln!("job {id} runs again: {n} dead-lettered task(s) back in its bags");
            Ok(true)
        }
        Command::Jobs { json, store } => {
            let client = store.connect().await?;
            let mut all = Vec::new();
            for j in jobs::all_jobs(&client).await? {
                let s = jobs::job_status(&client, j.id()).await?;
                if json {
                    all.push(jobs::status_json(&s, None));
                } else {
                    outln!("{}  {:<9} {:<10} {}/{} tasks", j.id(), j.spec.app_name(), s.state(), s.n_done(), j.total_tasks());
                }
            }
            if json {
                outln!("{}", serde_json::Value::Array(all));
            }
            Ok(true)
        }
        Command::Status { job, watch, json, store } => {
            if watch {
                let mut conn = jobs::Reconnecting::connect(&store).await?;
                let id = jobs::resolve(conn.client(), &job).await?;
                let bar = progress::bar(true, 0, "tasks");
                let ok = jobs::wait(&mut conn, id, Some(&bar)).await?;
                bar.finish_and_clear();
                let (s, n) = conn.call(|c| async move { Ok((jobs::job_status(&c, id).await?, jobs::slaves(&c).await?)) }).await?;
                jobs::print_status(&s, n);
                return Ok(ok);
            }
            let client = store.connect().await?;
            let id = jobs::resolve(&client, &job).await?;
            let s = jobs::job_status(&client, id).await?;
            let n_slaves = jobs::slaves(&client).await?;
            let gang = gang_cmd::view(&client, &s.record).await?;
            if json {
                let mut v = jobs::status_json(&s, Some(n_slaves));
                if let Some(g) = &gang {
                    v["gang"] = gang_cmd::json(g, s.state() != "running");
                }
                outln!("{v}");
            } else {
                jobs::print_status(&s, n_slaves);
                if let Some(g) = &gang {
                    gang_cmd::print(g, s.state() != "running");
                }
            }
            Ok(true)
        }
        Command::Verify(arg) => {
            let client = arg.store.connect().await?;
            let id = jobs::resolve(&client, &arg.job).await?;
            jobs::verify(&client, id).await
        }
        Command::Slaves { json, store } => {
            let client = store.connect().await?;
            if json {
                let all: Vec<_> = client
                    .list_sessions()
                    .await?
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "session": s.session,
                            "name": s.client_name,
                            "host": host_of(&s.peer),
                            "peer": s.peer,
                            "age_s": Duration::from_millis(s.age_ms).as_secs_f64(),
                            "since_heartbeat_ms": s.since_heartbeat_ms,
                            "actions": s.n_actions,
                        })
                    })
                    .collect();
                outln!("{}", serde_json::Value::Array(all));
                return Ok(true);
            }
            outln!("{:>16} {:<24} {:<22} {:>8} {:>10} {:>7}", "session", "name", "host", "age s", "heartbeat", "actions");
            for s in client.list_sessions().await? {
                let host = host_of(&s.peer);
                outln!(
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
        Command::Completions(args) => {
            manual::completions(args, with_exit_status(Cli::command()));
            Ok(true)
        }
        Command::Man(args) => manual::man(args, with_exit_status(Cli::command())).map(|()| true),
    }
}

/// The address the node sees a session at, less its port: the slave's host.
fn host_of(peer: &str) -> &str {
    peer.rsplit_once(':').map_or(peer, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every positional and flag of every subcommand says what it is.
    #[test]
    fn every_argument_has_help() {
        fn check(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let cmd = with_exit_status(Cli::command());
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        check(&cmd, "master", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }

    #[test]
    fn an_error_and_its_causes_are_said_once() {
        let inner = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        let e = anyhow::Error::new(inner).context("binding 127.0.0.1:7070: Address already in use").context("starting the store node");
        assert_eq!(error_text(&e), "starting the store node: binding 127.0.0.1:7070: Address already in use");
    }
}
