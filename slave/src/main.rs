//! `slave`: one per core. Loops over the bags of the running jobs until
//! killed (or idle, with `--exit-when-idle`).

use std::time::Duration;

use clap::Parser;

mod supervise;

/// Blocks get mappings of their own, reused by size: the slave's peak RSS
/// is the blocks it holds at once, not what heap fragmentation adds.
#[global_allocator]
static ALLOCATOR: block_alloc::BlockAllocator = block_alloc::BlockAllocator::new();

#[derive(Parser)]
#[command(name = "slave", version, about = "A stateless worker of the fault-tolerant bag of tasks")]
struct Args {
    #[command(flatten)]
    connect: store_client::ConnectArgs,
    /// Where a node started with `--blocks rados` keeps its blocks: with
    /// --ceph-conf, this slave reads and writes them in the pool itself
    /// (without, they go through the node).
    #[command(flatten)]
    ceph: ftbag_rados::CephArgs,
    /// Name shown by `master slaves` (default: slave-<pid>).
    #[arg(long)]
    name: Option<String>,
    /// Exit when no job is running instead of waiting for the next.
    #[arg(long)]
    exit_when_idle: bool,
    /// Work only on this job id.
    #[arg(long)]
    job: Option<uuid::Uuid>,
    /// Milliseconds one blocking dequeue waits on the node when every task
    /// of the bag is held by other slaves.
    #[arg(long, default_value_t = 2000)]
    dequeue_wait_ms: u64,
    /// Crash tests: SIGKILL this slave at PLACE of its N-th task
    /// (PLACE:N; PLACE one of dequeued, computed, before-commit).
    #[arg(long, value_name = "PLACE:N")]
    kill_at: Option<slave::kill_point::KillPoint>,
    /// Fault tests: SIGSTOP this slave at PLACE of its N-th task (PLACE:N,
    /// as --kill-at); it stays frozen until SIGCONT.
    #[arg(long, value_name = "PLACE:N")]
    stop_at: Option<slave::kill_point::KillPoint>,
    /// How the thread that runs the tasks' kernels is scheduled: `normal`
    /// competes for the CPU like any program; `idle` (Linux `SCHED_IDLE`)
    /// gives way at once to anything else that wants the core, so on a
    /// shared workstation the owner's programs (and the store node) go
    /// first and the slave uses what they leave. Jobs run about as fast
    /// either way on an otherwise idle machine.
    #[arg(long, value_enum, default_value_t = slave::compute::ComputePriority::Normal)]
    compute: slave::compute::ComputePriority,
    /// The block cache's size in MiB: versions this slave read, kept for
    /// its next reads and for peers (0: no cache). Default: an eighth of
    /// the machine's memory over its cores, at least 64 and at most 4096.
    /// Only slaves that read blocks over TCP (other hosts) cache.
    #[arg(long, value_name = "MIB")]
    cache_mib: Option<u64>,
    /// Do not serve this slave's cache to other slaves, nor read from theirs.
    #[arg(long)]
    no_peers: bool,
    /// Milliseconds a read from a peer slave may take before the block is
    /// read from the store node instead.
    #[arg(long, default_value_t = 2000)]
    peer_timeout_ms: u64,
    /// Where the node uses TLS: the certificate this slave serves its cache
    /// to peers with, signed by the cluster's CA and naming this host's
    /// address (`master certs --peer-host`). Without it, peers are off
    /// under TLS.
    #[arg(long, env = "SLAVE_PEER_TLS_CERT", value_name = "PEM", requires = "peer_tls_key")]
    peer_tls_cert: Option<std::path::PathBuf>,
    /// Private key of --peer-tls-cert.
    #[arg(long, env = "SLAVE_PEER_TLS_KEY", value_name = "PEM", requires = "peer_tls_cert")]
    peer_tls_key: Option<std::path::PathBuf>,
    /// Crash tests of peer transfers: none, corrupt, kill-mid-transfer,
    /// stop-mid-transfer.
    #[arg(long, default_value = "none", hide = true)]
    peer_hook: store_client::cache::PeerHook,
    /// Fault tests of gang jobs: `kill:N` SIGKILLs this slave right after
    /// the communication of superstep N of a rank it runs, `stop:N`
    /// SIGSTOPs it right before it commits superstep N.
    #[arg(long, value_name = "kill:N|stop:N", hide = true)]
    gang_fault: Option<slave::gang::GangFault>,
    /// Run N slave processes (one per core: N = the cores to give), named
    /// NAME-0 … NAME-(N-1), each with the other flags given here. One that
    /// dies is started again; Ctrl-C or SIGTERM stops them all.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    count: Option<u32>,
}

/// This process's arguments less `--count N` and `--name X` (in either
/// spelling), for the processes `--count` starts.
fn args_for_each() -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--count" | "--name") => {
                args.next();
            }
            Some(s) if s.starts_with("--count=") || s.starts_with("--name=") => {}
            _ => out.push(a),
        }
    }
    out
}

/// An eighth of the machine's memory over its cores (one slave per core),
/// within [64, 4096] MiB.
fn default_cache_mib() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(4 << 20);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    (total_kib / 1024 / 8 / cores).clamp(64, 4096)
}

fn main() -> anyhow::Result<()> {
    // Settings file first: the environment and flags override it.
    store_client::load_config_file()?;
    apps::kernels::use_fast_blas_kernels();
    block_alloc::reuse_block_buffers();
    // One slave per core: BLAS must not spawn threads of its own. OpenBLAS
    // read OPENBLAS_NUM_THREADS when it was loaded, before main: an unset
    // variable meant "all cores", so the count is set through its API.
    let blas_threads = std::env::var("OPENBLAS_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    apps::kernels::set_blas_threads(blas_threads);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Some(n) = args.count {
        let name = args.name.unwrap_or_else(|| format!("slave-{}", std::process::id()));
        return supervise::run(n as usize, args_for_each(), name);
    }
    let config = slave::SlaveConfig {
        store: args.connect.store.clone(),
        connect: store_client::ConnectOptions { objects: args.ceph.connector()?, ..args.connect.options()? },
        name: args.name.unwrap_or_else(|| format!("slave-{}", std::process::id())),
        exit_when_idle: args.exit_when_idle,
        job: args.job,
        dequeue_wait: Duration::from_millis(args.dequeue_wait_ms),
        kill_point: args.kill_at,
        stop_point: args.stop_at,
        compute: args.compute,
        cache_bytes: (args.cache_mib.unwrap_or_else(default_cache_mib) << 20) as usize,
        peers: !args.no_peers,
        peer_timeout: Duration::from_millis(args.peer_timeout_ms),
        peer_hook: args.peer_hook,
        peer_tls: match (&args.peer_tls_cert, &args.peer_tls_key) {
            (Some(cert), Some(key)) => Some(store_client::ServerTls::from_files(cert, key, None)?),
            _ => None,
        },
        gang_fault: args.gang_fault,
    };
    if config.peer_tls.is_some() && config.connect.tls.is_none() {
        anyhow::bail!("--peer-tls-cert is for a node that uses TLS (--tls-ca): peers use TLS exactly where the node does");
    }
    // One worker thread: the task computes on its compute thread, and the
    // runtime only moves blocks and small requests. With two workers every
    // request woke the idle one to steal work: a matmul slave (n=4096,
    // b=256) spent a quarter of its CPU in context switches and wake-ups,
    // and its job took 6.5 s on average against 5.7 s with one (b=1024:
    // 3.85 against 3.45 s; one slave, 3-4 runs each).
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    rt.block_on(slave::run(config))?;
    Ok(())
}
