//! `master serve`: a store node in the foreground until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::out::{errln, outln};
use anyhow::Context;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Directory of the RocksDB store (created if missing; recovered after a crash).
    #[arg(long)]
    data: PathBuf,
    /// Address of the gRPC port (control calls). Loopback unless you mean
    /// to serve other machines; any other address needs --token (or
    /// --insecure).
    #[arg(long, default_value = store_client::DEFAULT_STORE_ADDR)]
    listen: SocketAddr,
    /// Address of the block data plane (the TCP port that carries block
    /// gets and puts; clients learn it over gRPC). Default: the --listen
    /// IP with a port the system picks; give a fixed one (e.g. 0.0.0.0:7071)
    /// to open it in a firewall.
    #[arg(long)]
    data_listen: Option<SocketAddr>,
    /// Shared cluster token that every client must present (on both ports).
    #[arg(long, env = "STORE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Serve a non-loopback address without a token: anyone who can reach
    /// the ports can read, write and delete everything. Only on a network
    /// you trust.
    #[arg(long)]
    insecure: bool,
    /// PEM certificate chain of this node: both TCP ports serve TLS
    /// (clients then need --tls-ca). It must name the host or IP address
    /// clients use in STORE_ADDR. `master certs` makes one.
    #[arg(long, env = "STORE_NODE_TLS_CERT", value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert.
    #[arg(long, env = "STORE_NODE_TLS_KEY", value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificate: clients must present a certificate it signed
    /// (mutual TLS), besides the token.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve a live dashboard (`/`) and Prometheus metrics (`/metrics`) on
    /// this address, e.g. 127.0.0.1:7080. Off unless given. It asks for the
    /// cluster token like the other ports (open the page as
    /// http://ADDR/?token=TOKEN; scrapers send `Authorization: Bearer
    /// TOKEN`) and serves TLS, with client certificates, where they do.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// RocksDB block cache size in MiB.
    #[arg(long, default_value_t = 256)]
    cache_mib: usize,
    /// Milliseconds without a heartbeat after which a session's actions are aborted.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// Milliseconds a lock request waits before failing with LockTimeout.
    #[arg(long, default_value_t = 10_000)]
    lock_timeout_ms: u64,
    /// Orphanings of a task after which it moves to the dead-letter bag.
    #[arg(long, default_value_t = 3)]
    attempt_limit: u32,
    /// Where block versions are kept: `local`, files in --data (nothing
    /// to install); `rados`, objects of the Ceph pool --pool, which slaves
    /// given --ceph-conf read and write themselves, so that block bytes do
    /// not pass through this node. Locks, the queue and the pointer to each
    /// block's current version stay in --data either way. A store keeps
    /// the choice it was made with.
    #[arg(long, value_enum, default_value_t = Blocks::Local)]
    blocks: Blocks,
    /// The Ceph pool of --blocks rados (create it first: `ceph osd pool
    /// create NAME`). Several stores may share one: each keeps to a prefix
    /// of its own.
    #[arg(long, value_name = "NAME", required_if_eq("blocks", "rados"))]
    pool: Option<String>,
    #[command(flatten)]
    ceph: ftbag_rados::CephArgs,
    /// Test hook: milliseconds between collections of version objects that
    /// nothing names (--blocks rados).
    #[arg(long, hide = true)]
    collect_objects_every_ms: Option<u64>,
    /// Enable test-only RPCs (corrupting a block on purpose). Never in production.
    #[arg(long, hide = true)]
    test_hooks: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Blocks {
    Local,
    Rados,
}

/// How long a stop waits for the requests in flight (see `run`).
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Exits the process at once: its RocksDB LOCK goes with it. Not by
/// returning: the runtime's drop would wait for the node's blocking work.
fn exit_now(failed: bool) -> ! {
    std::process::exit(if failed { 1 } else { 0 })
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    block_alloc::reuse_block_buffers();
    let mut config = store::Config::new(args.data.clone(), args.listen);
    config.data_listen = args.data_listen;
    config.token = args.token;
    config.insecure = args.insecure;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(store_client::ServerTls::from_files(cert, key, args.tls_client_ca.as_deref())?);
    }
    config.cache_mib = args.cache_mib;
    config.node.lease = Duration::from_millis(args.lease_ms);
    config.node.lock_timeout = Duration::from_millis(args.lock_timeout_ms);
    config.node.attempt_limit = args.attempt_limit;
    config.node.test_hooks = args.test_hooks;
    if args.blocks == Blocks::Rados {
        let Some(connector) = args.ceph.connector()? else { anyhow::bail!("--blocks rados needs --ceph-conf (or CEPH_CONF)") };
        let mut objects = store::ObjectsConfig::new(args.pool.clone().unwrap_or_default(), connector);
        if let Some(ms) = args.collect_objects_every_ms {
            objects.collect_every = Duration::from_millis(ms.max(1));
        }
        config.node.objects = Some(objects);
    }
    let (tls, token) = (config.tls.is_some(), config.token.is_some());
    let web = args.http.map(|listen| crate::web::Options { listen, token: config.token.clone(), tls: config.tls.clone() });
    if let Some(w) = &web {
        if !w.listen.ip().is_loopback() && !token && !args.insecure {
            anyhow::bail!("refusing to serve --http {} without a cluster token: give --token (or --insecure)", w.listen);
        }
    }
    let running = store::start(config).await.context("starting the store node")?;
    let web = match web {
        Some(w) => {
            let client = running.client(w.token.as_deref()).await.context("the dashboard's client of the node")?;
            Some(crate::web::start(w, client).await.context("starting the dashboard (--http)")?)
        }
        None => None,
    };
    // A line on stdout that scripts and tests can wait for.
    outln!("listening {}", running.addr());
    if let Some(addr) = web {
        outln!("http {addr}");
    }
    // What a user opens in a firewall and gives clients, at any log level.
    errln!(
        "store node: gRPC on {}, block data plane on {} ({}, {})",
        running.addr(),
        running.data_addr(),
        if tls { "TLS" } else { "plaintext" },
        if token { "token required" } else { "no token" }
    );
    if let Some(addr) = web {
        let scheme = if tls { "https" } else { "http" };
        errln!("dashboard on {scheme}://{addr}/{}, Prometheus metrics on {scheme}://{addr}/metrics", if token { "?token=…" } else { "" });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let stopped_writing = running.writes_stopped();
    let failed = tokio::select! {
        _ = int.recv() => None,
        _ = term.recv() => None,
        why = stopped_writing => Some(why),
    };
    // The node ends its clients' session streams and waits for requests
    // in flight. A request may wait up to --lock-timeout-ms for a lock:
    // past STOP_GRACE the process exits without waiting, as after a
    // crash, whose recovery the next start runs (every commit answered
    // is durable). A second SIGINT or SIGTERM exits at once.
    tracing::info!("shutting down (a second Ctrl-C or SIGTERM exits at once)");
    let stopping = running.shutdown();
    tokio::pin!(stopping);
    tokio::select! {
        r = &mut stopping => r?,
        _ = tokio::time::sleep(STOP_GRACE) => {
            tracing::warn!("requests still running {STOP_GRACE:?} after the stop was asked; exiting without them");
            exit_now(failed.is_some());
        }
        _ = int.recv() => exit_now(failed.is_some()),
        _ = term.recv() => exit_now(failed.is_some()),
    }
    match failed {
        // Exits non-zero so that a supervisor restarts it: the open then
        // settles the commit the node could neither finish nor undo.
        Some(why) => anyhow::bail!("the store node stopped writing and must be restarted: {why}"),
        None => Ok(()),
    }
}
