//! Real processes for the crash tests: store nodes started from the
//! `master` binary, and client roles run by re-executing this test binary.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub mod cluster;
pub mod dense;
pub mod web;

/// Makes `cmd`'s process get SIGKILL when the test thread that starts it
/// ends, however it ends. Drops kill the processes a test started; a test
/// process that dies without them (a crash in a library) would otherwise
/// leave its store nodes and slaves running, holding its output pipe open,
/// and a `cargo test | grep` would wait for them for ever.
pub fn dies_with_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: `prctl` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        cmd.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A store node process (`master serve`), SIGKILLed on drop.
pub struct StoreProc {
    pub child: Child,
    pub addr: String,
}

impl StoreProc {
    pub fn start(data: &Path, extra: &[&str]) -> StoreProc {
        Self::start_on(data, "127.0.0.1:0", extra)
    }

    pub fn start_on(data: &Path, listen: &str, extra: &[&str]) -> StoreProc {
        Self::spawn(
            Command::new(env!("CARGO_BIN_EXE_master")).args(["serve", "--data", data.to_str().unwrap(), "--listen", listen]).args(extra),
        )
    }

    /// Starts `cmd` (a `master serve` command line, e.g. inside a
    /// namespace host) and waits for its listening line.
    pub fn spawn(cmd: &mut Command) -> StoreProc {
        Self::spawn_saying(cmd, &[]).0
    }

    /// [`StoreProc::spawn`] of a `master serve --http ADDR`: also waits
    /// for its `http ADDR` line and returns that address.
    pub fn spawn_with_http(cmd: &mut Command) -> (StoreProc, String) {
        let (node, mut said) = Self::spawn_saying(cmd, &["http "]);
        (node, said.remove(0))
    }

    /// Starts `cmd`, reads its listening line and then one line per
    /// prefix in `then`, each less its prefix.
    fn spawn_saying(cmd: &mut Command, then: &[&str]) -> (StoreProc, Vec<String>) {
        let mut child = dies_with_test(cmd)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn master serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut said = |prefix: &str| {
            let mut line = String::new();
            out.read_line(&mut line).expect("read master serve's stdout");
            line.trim().strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}")).to_owned()
        };
        let addr = said("listening ");
        let lines = then.iter().map(|p| said(p)).collect();
        (StoreProc { child, addr }, lines)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for StoreProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A client role: this test binary re-executed to run only `test_name`
/// with `FT_ROLE` set, talking line by line over stdin/stdout.
pub struct RoleProc {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl RoleProc {
    pub fn start(test_name: &str, role: &str, env: &[(&str, &str)]) -> RoleProc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env("FT_ROLE", role)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn role");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        RoleProc { child, stdin, stdout }
    }

    /// What the role said next with `tell` (the text after `@`; libtest
    /// prints lines of its own too).
    pub fn expect_line(&mut self) -> String {
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).unwrap() == 0 {
                panic!("role exited before saying anything");
            }
            // libtest may have printed "test NAME ... " on the same line.
            if let Some(at) = line.find('@') {
                return line[at + 1..].trim().to_owned();
            }
        }
    }

    pub fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    pub fn kill9(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for RoleProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a role process: print a line the parent reads with `expect_line`.
pub fn tell(line: &str) {
    // Straight to fd 1: the test harness may capture `println!`.
    use std::os::fd::FromRawFd;
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
    out.write_all(format!("@{line}\n").as_bytes()).unwrap();
}

/// In a role process: wait for a line from the parent.
pub fn hear() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line.trim().to_owned()
}

pub fn role() -> Option<String> {
    std::env::var("FT_ROLE").ok()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Polls `f` until it returns Some or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

// --- The CLI and slave processes, as a user runs them. -----------------

/// Runs `master ARGS` against the store node at `store`.
pub fn master(store: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_master")).args(args).env("STORE_ADDR", store).env("RUST_LOG", "warn").output().expect("run master")
}

/// Runs `master ARGS`, asserts it succeeded, returns its trimmed stdout.
pub fn master_ok(store: &str, args: &[&str]) -> String {
    let out = master(store, args);
    assert!(out.status.success(), "master {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The `slave` binary next to `master` (cargo builds it with the workspace).
pub fn slave_exe() -> std::path::PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_master")).with_file_name("slave");
    assert!(p.exists(), "{} missing: build the workspace first (cargo build --workspace)", p.display());
    p
}

/// Starts a slave process; its log goes to stderr when `FT_VERBOSE` is set.
pub fn slave(store: &str, name: &str, extra: &[&str]) -> Child {
    let verbose = std::env::var_os("FT_VERBOSE").is_some();
    dies_with_test(&mut Command::new(slave_exe()))
        .args(["--store", store, "--name", name])
        .args(extra)
        .env("RUST_LOG", if verbose { "info" } else { "warn" })
        .stdout(Stdio::null())
        .stderr(if verbose { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .expect("spawn slave")
}

/// Runs `n` slaves until `ended()` says so, the first `kills` of them with
/// seeded kill points (`slave --kill-at`: a place in a task, and whether
/// their first or second task) where they SIGKILL themselves. Each death is
/// replaced at once by a slave with the next kill point while any remain;
/// plain slaves start only once every kill point has fired. Returns the
/// kill points that fired before the end.
///
/// (Kills from outside, made when the count of committed tasks crossed
/// seeded thresholds, landed fewer the more loaded the machine: fresh
/// slaves ran three or four tasks before the test's next look, and CI saw
/// a 45-task render end after nine. A kill point lands inside a task
/// whatever the timing: until the last one fires only slaves with one
/// run, and each dies within its first two tasks. Plain slaves started
/// beside the last of them took a multi-step job's last, narrow steps
/// first: nine kills once.)
pub fn run_slaves_with_kill_points(store: &str, n: usize, kills: usize, seed: u64, ended: impl FnMut() -> bool) -> Vec<String> {
    run_slaves_with_kill_points_by(|k, extra| slave(store, &format!("slave-{k}"), extra), n, kills, seed, ended)
}

/// [`run_slaves_with_kill_points`], each slave started by `start(k,
/// extra)` (its k-th start, with extra flags): on namespace hosts, say.
pub fn run_slaves_with_kill_points_by(
    mut start: impl FnMut(usize, &[&str]) -> Child,
    n: usize,
    kills: usize,
    seed: u64,
    mut ended: impl FnMut() -> bool,
) -> Vec<String> {
    use rand::{Rng, SeedableRng};
    use std::os::unix::process::ExitStatusExt;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut points: Vec<String> = (0..kills)
        .map(|_| {
            let place = slave::kill_point::KillPlace::ALL[rng.gen_range(0..3)];
            slave::kill_point::KillPoint { place, task: rng.gen_range(1..=2) }.to_string()
        })
        .collect();
    points.reverse();
    // (process, its kill point)
    let mut slaves: Vec<(Child, Option<String>)> = Vec::new();
    let mut started = 0;
    let mut spawn = |slaves: &mut Vec<(Child, Option<String>)>, points: &mut Vec<String>| {
        let point = points.pop();
        let extra: Vec<&str> = point.as_deref().map(|p| vec!["--kill-at", p]).unwrap_or_default();
        slaves.push((start(started, &extra), point));
        started += 1;
    };
    for _ in 0..n {
        spawn(&mut slaves, &mut points);
    }
    let mut fired = Vec::new();
    let mut owed = 0;
    while !ended() {
        let mut k = 0;
        while k < slaves.len() {
            let Some(status) = slaves[k].0.try_wait().unwrap() else {
                k += 1;
                continue;
            };
            let (_, point) = slaves.remove(k);
            assert!(
                status.signal() == Some(nix::libc::SIGKILL) && point.is_some(),
                "a slave (kill point {point:?}) ended on its own: {status}"
            );
            fired.extend(point);
            owed += 1;
        }
        let points_left = fired.len() < kills;
        while owed > 0 && (!points.is_empty() || !points_left) {
            spawn(&mut slaves, &mut points);
            owed -= 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    slaves.into_iter().for_each(|(c, _)| kill_child(c));
    fired
}

/// SIGKILLs a child and reaps it.
pub fn kill_child(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// `master matrix create NAME` with a generated matrix of `kind`.
pub fn create_kind(store: &str, name: &str, rows: u64, cols: u64, block: u32, kind: &str, seed: u64) {
    let (r, c, b, s) = (rows.to_string(), cols.to_string(), block.to_string(), seed.to_string());
    master_ok(store, &["matrix", "create", name, "--n", &r, "--cols", &c, "--block", &b, "--kind", kind, "--seed", &s]);
}
