//! `ftbag-hosts`: a cluster of network-namespace "hosts" on this machine,
//! for running the store node, slaves or BSP processes as if on separate
//! machines. `run` starts one command per host and tears down after;
//! `up` holds a cluster until Ctrl-C for commands started by hand.

mod run;
mod signals;

use std::sync::mpsc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use netns::{Cluster, Rate, Spec};

#[derive(Parser)]
#[command(
    name = "ftbag-hosts",
    version,
    about = "Network-namespace hosts on one machine: a bridge, a namespace per host with its own address in 10.77.<s>.0/24, links shaped with tc. Needs root."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start COMMAND once per host inside its namespace, print host 0's
    /// output, tear everything down when they end. Each gets HOST_INDEX,
    /// BSP_PID (the same index), BSP_HOSTS (every host's addr:port),
    /// BSP_BIND (its own addr:port) and STORE_TOKEN.
    Run(run::RunArgs),
    /// Make the cluster, print each host's namespace and address, and hold
    /// it until Ctrl-C or SIGTERM; run commands on a host with
    /// `ip netns exec <ns> COMMAND` from other terminals meanwhile.
    Up(Shape),
}

/// The cluster's shape, shared by both subcommands.
#[derive(Args, Clone)]
pub(crate) struct Shape {
    /// Number of hosts.
    #[arg(short = 'n', long = "hosts", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=netns::MAX_HOSTS as i64))]
    hosts: u16,
    /// Each host's link rate, both directions (tc notation: 1gbit, 300mbit, 12.5mbps).
    #[arg(long)]
    rate: Option<Rate>,
    /// One-way delay on what each host sends (tc notation: 0.1ms, 100us); needs the kernel's netem, and says so when it is missing.
    #[arg(long, value_parser = netns::parse_delay)]
    delay: Option<Duration>,
}

impl Shape {
    fn spec(&self) -> Spec {
        Spec { hosts: self.hosts.into(), rate: self.rate, delay: self.delay }
    }

    fn describe(&self, cluster: &Cluster) -> String {
        let rate = self.rate.map_or("unshaped".into(), |r| format!("rate {r} each way"));
        let delay = match self.delay {
            None => String::new(),
            Some(d) if cluster.delay_applied() => format!(", delay {d:?}"),
            Some(d) => format!(", delay {d:?} NOT applied (no netem)"),
        };
        let a = cluster.addr(0).octets();
        format!("{} hosts on {}.{}.{}.0/24, bridge {} ({rate}{delay})", cluster.hosts(), a[0], a[1], a[2], cluster.bridge_name())
    }
}

/// What the main thread waits for.
pub(crate) enum Event {
    Signal(libc::c_int),
    Exited { host: usize, status: std::io::Result<std::process::ExitStatus> },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // First, before any thread exists (see `signals::forward`).
    let (tx, rx) = mpsc::channel();
    signals::forward(tx.clone(), Event::Signal)?;
    let code = match cli.command {
        Cmd::Run(args) => run::run(args, tx, rx)?,
        Cmd::Up(shape) => up(shape, rx)?,
    };
    std::process::exit(code)
}

fn create(shape: &Shape) -> anyhow::Result<Cluster> {
    Cluster::create(shape.spec()).map_err(|e| match &e {
        netns::Error::NeedsRoot { reason } => anyhow::anyhow!("{e} ({reason})"),
        _ => e.into(),
    })
}

fn up(shape: Shape, rx: mpsc::Receiver<Event>) -> anyhow::Result<i32> {
    let cluster = create(&shape)?;
    println!("{}", shape.describe(&cluster));
    for h in 0..cluster.hosts() {
        println!("host {h} ns={} addr={} link={}", cluster.ns_name(h), cluster.addr(h), cluster.link_name(h));
    }
    let (ns1, link1) = (cluster.ns_name(cluster.hosts() - 1), cluster.link_name(cluster.hosts() - 1));
    println!("run a command on a host:  ip netns exec {ns1} COMMAND…   (e.g. ip netns exec {ns1} slave --store {}:7070)", cluster.addr(0));
    println!("cut a host's link silently: bridge link set dev {link1} state 0   (restore: state 3)");
    println!("Ctrl-C or SIGTERM kills what runs on the hosts and removes them.");
    use std::io::Write;
    std::io::stdout().flush()?;
    loop {
        if let Event::Signal(sig) = rx.recv()? {
            eprintln!("ftbag-hosts: {}: tearing down", signals::name(sig));
            break;
        }
    }
    drop(cluster);
    Ok(0)
}
