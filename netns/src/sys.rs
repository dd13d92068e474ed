//! The system calls and commands under a cluster: namespace handles,
//! `ip`/`tc`/`bridge` runs, the privilege check, and killing what runs in
//! a namespace.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::Error;

/// A network namespace, held open (so it outlives its name).
#[derive(Debug, Clone)]
pub(crate) struct NsFd(Arc<File>);

impl NsFd {
    pub(crate) fn open(path: &Path) -> Result<NsFd, Error> {
        File::open(path).map(|f| NsFd(Arc::new(f))).map_err(|e| Error::io(format!("open {}", path.display()), e))
    }

    /// The calling thread's namespace.
    pub(crate) fn current() -> Result<NsFd, Error> {
        NsFd::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// Moves the calling thread into this namespace.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: setns on an open namespace descriptor; it changes only
        // the calling thread's network namespace.
        if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Makes `cmd`'s child join this namespace between fork and exec, so
    /// the program is the child itself (its pid is the one `spawn` gives).
    pub(crate) fn apply(&self, cmd: &mut Command) {
        let ns = Arc::clone(&self.0);
        // SAFETY: the closure only calls setns (async-signal-safe) and
        // reads errno; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Runs `f` on a short-lived thread inside this namespace (for what
    /// follows the calling thread's namespace, such as `/proc/sys/net`).
    pub(crate) fn in_thread<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter()?;
                f()
            })
            .join()
            .expect("namespace helper thread panicked")
        })
    }
}

/// Why this process cannot make network namespaces, if it cannot;
/// checked once.
pub(crate) fn why_unavailable() -> Option<&'static str> {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    CHECK.get_or_init(probe).as_ref().err().map(String::as_str)
}

fn probe() -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!("not root (euid {euid})"));
    }
    for program in ["ip", "tc", "bridge"] {
        match Command::new(program).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(s) if s.success() => {}
            _ => return Err(format!("no working `{program}` command (install iproute2: scripts/setup.sh)")),
        }
    }
    // A throwaway thread makes a namespace of its own: the kernel has
    // them and this process may make them (root in a container may not).
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread, which then exits.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(format!("cannot make a network namespace: {}", io::Error::last_os_error()));
        }
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err("namespace probe thread panicked".into()))
}

/// Runs an iproute2 command in the admin namespace (the cluster creator's,
/// whichever namespace the calling thread is in), feeding it `input`.
pub(crate) fn run(admin: &NsFd, program: &str, args: &[&str], input: Option<&str>) -> Result<String, Error> {
    let command = format!("{program} {}", args.join(" "));
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    admin.apply(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| Error::io(format!("spawn `{command}`"), e))?;
    if let Some(input) = input {
        // A command that fails early may close its stdin first; its exit
        // status and stderr then say why.
        let _ = child.stdin.take().expect("piped stdin").write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| Error::io(format!("wait for `{command}`"), e))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(Error::Command { command, status: out.status.to_string(), stderr });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Turns IPv6 off for `dev` (`"default"`: devices made later) in `ns`, so
/// no router solicitations or MLD reports travel the links and a link's
/// byte counts are the traffic of the programs alone. A kernel without
/// IPv6 has nothing to turn off.
pub(crate) fn disable_ipv6(ns: &NsFd, dev: &str) -> Result<(), Error> {
    let path = format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6");
    ns.in_thread(|| match std::fs::write(&path, "1") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    })
    .map_err(|e| Error::io(format!("write {path}"), e))
}

/// SIGKILLs every process (but this one) whose network namespace is one
/// of `namespaces` (paths of namespace files), until none is left or 5 s
/// passed. Returns how many were still running then.
pub(crate) fn kill_all_in(namespaces: &[&Path]) -> usize {
    let ids: HashSet<(u64, u64)> = namespaces.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| (m.dev(), m.ino())).collect();
    if ids.is_empty() {
        return 0;
    }
    let me = std::process::id();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let inside = pids_in(&ids, me);
        if inside.is_empty() || Instant::now() > deadline {
            return inside.len();
        }
        for pid in inside {
            // SAFETY: kill has no memory effects; a pid that exited since
            // the scan gets ESRCH.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // A killed process leaves its namespace when it exits, which the
        // kernel does promptly but not synchronously: look again.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Processes (not `me`) in one of the namespaces `ids` (device, inode).
/// A zombie has left its namespaces and is not counted.
fn pids_in(ids: &HashSet<(u64, u64)>, me: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| ids.contains(&(m.dev(), m.ino()))))
        .collect()
}
