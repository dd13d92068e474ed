//! `master`: the command line of the system. It runs store nodes and talks
//! to them; it holds no state of its own and is not needed while a job runs.

mod serve;
mod store_args;

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
        }
    })
}
