//! The `ftbag-hosts` binary: `run`'s environment, output and failures,
//! `up` until SIGINT, teardown on SIGTERM. Skips, saying
//! `skipped: needs root for network namespaces`, without root.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

const HOSTS: &str = env!("CARGO_BIN_EXE_ftbag-hosts");

/// One test at a time: each checks its cluster's names are gone after the
/// binary exits, and a test beside it could take the freed names at once.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The subnet index from the line describing the cluster
/// (`… on 10.77.<s>.0/24, bridge ftbag<s>br …`).
fn subnet_in(text: &str) -> String {
    let at = text.find("bridge ftbag").unwrap_or_else(|| panic!("no cluster line in {text:?}")) + "bridge ftbag".len();
    text[at..].split("br").next().unwrap().to_owned()
}

/// Asserts that no namespace or link of subnet `s` is left.
fn assert_gone(s: &str) {
    let run = |args: &[&str]| String::from_utf8(Command::new("ip").args(args).output().unwrap().stdout).unwrap();
    let shown = run(&["netns", "list"]) + &run(&["-o", "link", "show"]);
    for prefix in [format!("ftbag{s}h"), format!("ftbag{s}v"), format!("ftbag{s}br")] {
        assert!(!shown.contains(&prefix), "{prefix}… is still there:\n{shown}");
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

#[test]
fn run_gives_every_host_its_environment_and_prints_host_0() {
    if netns::skip_unless_root() {
        return;
    }
    let _alone = alone();
    let logs = std::env::temp_dir().join(format!("ftbag-hosts-test-{}", std::process::id()));
    let out = Command::new(HOSTS)
        .args(["run", "-n", "3", "--rate", "1gbit", "--token", "sesame", "--logs"])
        .arg(&logs)
        .args(["--", "sh", "-c", "echo $HOST_INDEX $BSP_PID $BSP_BIND $BSP_HOSTS $STORE_TOKEN; ip -o -4 addr show dev eth0"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let s = subnet_in(&stderr);
    let addr = |h: usize| format!("10.77.{s}.{}:7400", 10 + h);
    let all = format!("{},{},{}", addr(0), addr(1), addr(2));
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(format!("0 0 {} {all} sesame", addr(0)).as_str()));
    assert!(lines.next().is_some_and(|l| l.contains(&format!("10.77.{s}.10/24"))), "{stdout}");
    // The others' output is in their logs, kept with --logs.
    for h in 1..3 {
        let log = std::fs::read_to_string(logs.join(format!("host-{h}.log"))).unwrap();
        assert!(log.starts_with(&format!("{h} {h} {} {all} sesame\n", addr(h))), "{log}");
    }
    std::fs::remove_dir_all(&logs).unwrap();
    assert_gone(&s);
}

#[test]
fn run_fails_when_a_host_fails_and_shows_the_logs() {
    if netns::skip_unless_root() {
        return;
    }
    let _alone = alone();
    let started = Instant::now();
    let out = Command::new(HOSTS)
        .args([
            "run",
            "-n",
            "2",
            "--grace",
            "0.2",
            "--",
            "sh",
            "-c",
            "echo said by $HOST_INDEX; [ $HOST_INDEX = 0 ] || exit 3; exec sleep 60",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Host 1's code; host 0 killed after the grace, not waited for.
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(stderr.contains("host 1 failed (exit status: 3)"), "{stderr}");
    assert!(stderr.contains("host 0 (killed at teardown)"), "{stderr}");
    assert!(stderr.contains("said by 1"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "said by 0\n");
    assert_gone(&subnet_in(&stderr));
}

#[test]
fn run_tears_down_on_sigterm() {
    if netns::skip_unless_root() {
        return;
    }
    let _alone = alone();
    let mut child = Command::new(HOSTS)
        .args(["run", "-n", "2", "--", "sh", "-c", "echo started; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    signal(child.id(), libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("SIGTERM: tearing down"), "{stderr}");
    assert_gone(&subnet_in(&stderr));
}

#[test]
fn up_holds_the_cluster_until_ctrl_c() {
    if netns::skip_unless_root() {
        return;
    }
    let _alone = alone();
    let mut child = Command::new(HOSTS).args(["up", "-n", "2"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    while !said.contains("Ctrl-C") {
        assert!(stdout.read_line(&mut said).unwrap() > 0, "up ended early: {said}");
    }
    let s = subnet_in(&said);
    assert!(said.contains(&format!("host 1 ns=ftbag{s}h1 addr=10.77.{s}.11")), "{said}");
    // The hosts are there for commands started by hand.
    // Host 0 answers host 1 (refused: nothing listens there).
    let ping = Command::new("ip")
        .args(["netns", "exec", &format!("ftbag{s}h1"), "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/10.77.{s}.10/9"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&ping.stderr).contains("Connection refused"), "{ping:?}");
    signal(child.id(), libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SIGINT: tearing down"));
    assert_gone(&s);
}
