//! `bench`: the project's benchmarks. Every subcommand ends by printing one
//! line per figure, `BENCH {json}`, so a script can check any figure, and
//! takes `--quick` for a reduced run under a minute.

mod blocks_cmd;
mod bsp_cmd;
mod cgroup;
mod cluster;
mod corun;
mod link_rate;
mod model_cmd;
mod ooc_cmd;
mod params_cmd;
mod queue_cmd;
#[cfg(feature = "rados")]
mod rados_cmd;
mod raytrace_cmd;
mod recovery_cmd;
mod report;
mod soak_cmd;
mod store_node;
mod validate_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bench", about = "Benchmarks of the fault-tolerant bag-of-tasks system")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// BSP transport: l, g, total exchange schedules, OpenMPI side by side.
    Bsp(bsp_cmd::Args),
    /// Performance model: predictions, bounds and block-size sweeps.
    Model(model_cmd::Args),
    /// Measures this machine's model parameters (P, C, Dget, Dput, thresholds) into a TOML file.
    Params(params_cmd::Args),
    /// Runs a grid of real jobs and compares measured times with the model (table, BENCH, PNG).
    Validate(validate_cmd::Args),
    /// SIGKILLs a slave at seeded random moments of a run; extra time vs the model's recovery.
    Recovery(recovery_cmd::Args),
    /// Durable dequeue+commit throughput and latency of empty tasks, 1..32 clients.
    Queue(queue_cmd::Args),
    /// Block put/get throughput through the store node, as a ratio to a plain file.
    Blocks(blocks_cmd::Args),
    /// Out-of-core matmul, Cholesky or LU on the real system vs in-core BLAS and Dask.
    Ooc(ooc_cmd::Args),
    /// Ray tracing with 2 slaves at several grains vs a single-process render.
    Raytrace(raytrace_cmd::Args),
    /// Every app in turn under seeded slave kills, zombies and store-node kills; checks exactly-once.
    Soak(soak_cmd::Args),
    /// Block versions as Ceph RADOS objects against version files (feature `rados`).
    #[cfg(feature = "rados")]
    Rados(rados_cmd::Args),
    /// One co-running kernel copy of `bench params` (internal).
    #[command(hide = true)]
    CorunCopy(corun::CopyArgs),
}

fn main() -> anyhow::Result<()> {
    apps::kernels::use_fast_blas_kernels();
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    match Cli::parse().command {
        Command::Bsp(args) => bsp_cmd::run(args),
        Command::Model(args) => model_cmd::run(args),
        Command::Params(args) => params_cmd::run(args),
        Command::Validate(args) => validate_cmd::run(args),
        Command::Recovery(args) => recovery_cmd::run(args),
        Command::Queue(args) => queue_cmd::run(args),
        Command::Blocks(args) => blocks_cmd::run(args),
        Command::Ooc(args) => ooc_cmd::run(args),
        Command::CorunCopy(args) => corun::run_copy(args),
        Command::Raytrace(args) => raytrace_cmd::run(args),
        Command::Soak(args) => soak_cmd::run(args),
        #[cfg(feature = "rados")]
        Command::Rados(args) => rados_cmd::run(args),
    }
}
