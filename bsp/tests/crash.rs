//! Test tier 3: real processes; one is SIGKILLed mid-superstep; every
//! survivor's `sync` must return the typed, retryable error within a bound.

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bsp::Launcher;

#[test]
fn sigkill_mid_superstep_gives_every_survivor_peer_lost() {
    let p = 4;
    let victim = 2;
    let bound = Duration::from_secs(10);
    let mut job = Launcher::new(p, env!("CARGO_BIN_EXE_bsp"), vec!["worker".into(), "crash-loop".into()])
        .token("crash-test-token")
        .capture_stdout(true)
        .spawn()
        .unwrap();
    let os_pids = job.os_pids();
    // One reader thread per process, forwarding lines.
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    for (pid, c) in job.children_mut().iter_mut().enumerate() {
        let out = c.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((pid, line));
            }
        });
    }
    drop(tx);
    // Wait until every process has done at least 20 supersteps.
    let mut steps = vec![0u64; p];
    let start = Instant::now();
    while steps.iter().any(|&s| s < 20) {
        let (pid, line) = rx.recv_timeout(Duration::from_secs(30)).expect("processes stopped reporting");
        if let Some(s) = line.strip_prefix("STEP ") {
            steps[pid] = s.parse().unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "group too slow to start");
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(os_pids[victim] as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    let mut errors: Vec<Option<(String, Duration)>> = vec![None; p];
    while errors.iter().enumerate().any(|(i, e)| i != victim && e.is_none()) {
        let left = bound.saturating_sub(killed_at.elapsed());
        let Ok((pid, line)) = rx.recv_timeout(left) else { break };
        if line.starts_with("ERROR") {
            errors[pid] = Some((line, killed_at.elapsed()));
        }
    }
    if errors.iter().enumerate().any(|(i, e)| i != victim && e.is_none()) {
        job.kill_all(); // don't leave hung survivors behind; the asserts below fail
    }
    for pid in (0..p).filter(|&i| i != victim) {
        let (line, after) = errors[pid].clone().unwrap_or_else(|| panic!("survivor {pid} got no error within {bound:?}"));
        assert!(line.contains("retryable=true") && line.contains("PeerLost"), "survivor {pid}: {line}");
        // A survivor that has already failed and exited is itself a lost
        // peer for the others, so blaming it is right too; the victim must
        // be blamed by at least one (checked below).
        assert!(after < bound, "survivor {pid} took {after:?}");
    }
    assert!(errors.iter().flatten().any(|(l, _)| l.contains(&format!("pid: {victim}"))), "nobody blamed the victim: {errors:?}");
    let statuses = job.wait().unwrap();
    for pid in (0..p).filter(|&i| i != victim) {
        assert_eq!(statuses[pid].code(), Some(3), "survivor {pid} exit");
    }
}
