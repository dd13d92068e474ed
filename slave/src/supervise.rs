//! `slave --count N`: N slave processes started and supervised together
//! (one per core). Each is this binary run again with the same flags less
//! `--count`, named `NAME-k`. A process that dies is started again (after
//! a back-off if it keeps dying young); one that exits successfully (with
//! `--exit-when-idle`) is not. SIGINT or SIGTERM is passed on to every
//! process, and the supervisor exits once they have; if the supervisor
//! itself is killed, its processes get SIGTERM from the kernel
//! (`PR_SET_PDEATHSIG`).

use std::ffi::OsString;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

/// A process that ran at least this long before dying is restarted at
/// once; one that died younger waits a back-off that doubles.
const YOUNG: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

struct Slot {
    name: String,
    child: Option<Child>,
    started: Instant,
    /// How long after `started` (its death, while it has no process) it
    /// is started again.
    backoff: Duration,
    /// Ended successfully: not restarted.
    done: bool,
}

/// Runs `count` slaves with `args` (this process's arguments less
/// `--count`) until they all exit successfully or a signal stops them.
pub(crate) fn run(count: usize, args: Vec<OsString>, name: String) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(supervise(count, args, name))
}

fn spawn(args: &[OsString], name: &str) -> anyhow::Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args).arg("--name").arg(name).kill_on_drop(false);
    // SAFETY: `prctl` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd.spawn()?)
}

async fn supervise(count: usize, args: Vec<OsString>, name: String) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut slots: Vec<Slot> = Vec::with_capacity(count);
    for k in 0..count {
        let name = format!("{name}-{k}");
        let child = spawn(&args, &name)?;
        tracing::info!(pid = child.id(), "started slave {name}");
        slots.push(Slot { name, child: Some(child), started: Instant::now(), backoff: FIRST_BACKOFF, done: false });
    }
    loop {
        if slots.iter().all(|s| s.done) {
            tracing::info!("every slave exited: done");
            return Ok(());
        }
        // The first process to end, or the first restart due.
        let next = async {
            loop {
                for (k, s) in slots.iter_mut().enumerate() {
                    match s.child.as_mut() {
                        Some(c) => {
                            if let Some(status) = c.try_wait()? {
                                return anyhow::Ok(Event::Exited(k, status));
                            }
                        }
                        None if !s.done && s.started.elapsed() >= s.backoff => return Ok(Event::RestartDue(k)),
                        None => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            event = next => match event? {
                Event::RestartDue(k) => {
                    let s = &mut slots[k];
                    let child = spawn(&args, &s.name)?;
                    tracing::info!(pid = child.id(), "restarted slave {}", s.name);
                    s.child = Some(child);
                    s.started = Instant::now();
                }
                Event::Exited(k, status) => {
                    let s = &mut slots[k];
                    s.child = None;
                    if status.success() {
                        tracing::info!("slave {} exited", s.name);
                        s.done = true;
                        continue;
                    }
                    let young = s.started.elapsed() < YOUNG;
                    s.backoff = if young { (s.backoff * 2).min(MAX_BACKOFF) } else { FIRST_BACKOFF };
                    tracing::warn!("slave {} ended ({status}); starting it again in {:?}", s.name, s.backoff);
                    // The back-off counts from now.
                    s.started = Instant::now();
                }
            },
            _ = term.recv() => return stop(slots, libc::SIGTERM).await,
            _ = int.recv() => return stop(slots, libc::SIGTERM).await,
        }
    }
}

enum Event {
    /// Slot k's process ended.
    Exited(usize, std::process::ExitStatus),
    /// Slot k's back-off is over: start it again.
    RestartDue(usize),
}

/// Passes `sig` on to every process and waits for them.
async fn stop(slots: Vec<Slot>, sig: i32) -> anyhow::Result<()> {
    tracing::info!("stopping {} slave(s)", slots.iter().filter(|s| s.child.is_some()).count());
    for s in &slots {
        if let Some(pid) = s.child.as_ref().and_then(Child::id) {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }
    for mut s in slots {
        if let Some(c) = s.child.as_mut() {
            let _ = c.wait().await;
        }
    }
    Ok(())
}
