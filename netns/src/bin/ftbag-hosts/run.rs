//! `ftbag-hosts run`: one command per host, host 0 in the foreground.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use crate::{create, signals, Event, Shape};

/// Lines of each host's log shown when a host failed.
const TAIL_LINES: usize = 10;

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    shape: Shape,
    /// Port of every entry of BSP_HOSTS and of BSP_BIND.
    #[arg(long, default_value_t = 7400)]
    port: u16,
    /// Cluster token given to every host as STORE_TOKEN [default: $STORE_TOKEN, else random].
    #[arg(long, env = "STORE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Keep the output of hosts 1.. in DIR/host-1.log, host-2.log, … [default: a temporary directory, removed at exit].
    #[arg(long, value_name = "DIR")]
    logs: Option<PathBuf>,
    /// Once a host has failed, how long the others get to end by themselves before they are killed.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    grace: f64,
    /// The command and its arguments, after `--`; started once on every host.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// How the hosts' commands ended.
struct Outcome {
    /// Per host: its exit, or `None` if it still ran at the end.
    ended: Vec<Option<std::io::Result<ExitStatus>>>,
    first_failure: Option<usize>,
    signal: Option<libc::c_int>,
}

pub(crate) fn run(args: RunArgs, tx: Sender<Event>, rx: Receiver<Event>) -> anyhow::Result<i32> {
    let grace = Duration::try_from_secs_f64(args.grace).context("--grace")?;
    let cluster = create(&args.shape)?;
    let n = cluster.hosts();
    let token = match &args.token {
        Some(t) => t.clone(),
        None => random_token()?,
    };
    let all: Vec<String> = (0..n).map(|h| format!("{}:{}", cluster.addr(h), args.port)).collect();
    let (logs, temporary) = match &args.logs {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("ftbag-hosts-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    eprintln!("ftbag-hosts: {}; the output of hosts 1.. goes to {}", args.shape.describe(&cluster), logs.display());

    // Hosts 1.. first, then host 0 with this terminal.
    for host in (1..n).chain([0]) {
        let mut cmd = cluster.command(host, &args.command[0]);
        cmd.args(&args.command[1..])
            .env("HOST_INDEX", host.to_string())
            .env("BSP_PID", host.to_string())
            .env("BSP_HOSTS", all.join(","))
            .env("BSP_BIND", &all[host])
            .env("STORE_TOKEN", &token);
        if host > 0 {
            let path = log_path(&logs, host);
            let log = File::create(&path).with_context(|| format!("create {}", path.display()))?;
            cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        }
        // An error returns, dropping the cluster: what started is killed.
        let mut child = cmd.spawn().with_context(|| format!("start {:?} on host {host}", args.command[0]))?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(Event::Exited { host, status });
        });
    }

    let outcome = wait(&rx, n, grace)?;
    // Kills whatever still runs on the hosts, and removes them.
    drop(cluster);
    let code = report(&outcome, &logs);
    if temporary {
        let _ = std::fs::remove_dir_all(&logs);
    }
    Ok(code)
}

/// Until every host's command ended, a signal came, or `grace` passed
/// since the first failure.
fn wait(rx: &Receiver<Event>, n: usize, grace: Duration) -> anyhow::Result<Outcome> {
    let mut out = Outcome { ended: (0..n).map(|_| None).collect(), first_failure: None, signal: None };
    let mut deadline: Option<Instant> = None;
    while out.ended.iter().any(Option::is_none) {
        let event = match deadline {
            None => rx.recv()?,
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => break,
                Err(e @ RecvTimeoutError::Disconnected) => return Err(e.into()),
            },
        };
        match event {
            Event::Signal(sig) => {
                eprintln!("ftbag-hosts: {}: tearing down", signals::name(sig));
                out.signal = Some(sig);
                break;
            }
            Event::Exited { host, status } => {
                let ok = status.as_ref().is_ok_and(ExitStatus::success);
                out.ended[host] = Some(status);
                if !ok && out.first_failure.is_none() {
                    out.first_failure = Some(host);
                    deadline = Some(Instant::now() + grace);
                }
            }
        }
    }
    Ok(out)
}

/// Says what failed, with the tails of the hosts' logs; the exit code.
fn report(out: &Outcome, logs: &Path) -> i32 {
    if let Some(sig) = out.signal {
        return 128 + sig;
    }
    let Some(failed) = out.first_failure else { return 0 };
    let describe = |h: usize| match &out.ended[h] {
        None => "killed at teardown".to_owned(),
        Some(Ok(s)) => s.to_string(),
        Some(Err(e)) => format!("not waited for: {e}"),
    };
    eprintln!("ftbag-hosts: host {failed} failed ({}); host 0 ({}) wrote above; the others' logs:", describe(failed), describe(0));
    for h in 1..out.ended.len() {
        let path = log_path(logs, h);
        eprintln!("--- host {h} ({}), last {TAIL_LINES} lines of {}:", describe(h), path.display());
        eprintln!("{}", tail(&path, TAIL_LINES));
    }
    match &out.ended[failed] {
        Some(Ok(s)) => s.code().or(s.signal().map(|sig| 128 + sig)).unwrap_or(1),
        _ => 1,
    }
}

fn log_path(logs: &Path, host: usize) -> PathBuf {
    logs.join(format!("host-{host}.log"))
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else { return format!("(cannot read {})", path.display()) };
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// 16 random bytes in hex, as the old script made them.
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).context("read /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
