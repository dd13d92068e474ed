//! The CLI as scripts and users meet it, with real processes: output into
//! closed pipes, sizes past what a store can hold, bad values, JSON.

mod support;

use std::process::{Command, Stdio};

use support::{master, master_ok, StoreProc};

/// `master ARGS` with stdout a pipe whose reader has already gone (as
/// `master jobs | head -1` once `head` has its line): every write meets
/// EPIPE, deterministically.
fn master_into_closed_pipe(store: &str, args: &[&str]) -> std::process::Output {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    Command::new(env!("CARGO_BIN_EXE_master"))
        .args(args)
        .env("STORE_ADDR", store)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .expect("run master")
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_with_status_141() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    support::create_kind(s, "A", 64, 64, 32, "random", 1);
    master_ok(s, &["submit", "matmul", "A", "A", "--out", "C"]);
    for args in [&["jobs"][..], &["matrix", "list"], &["matrix", "info", "A"], &["status"], &["slaves"]] {
        let out = master_into_closed_pipe(s, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "master {args:?}: {}\n{err}", out.status);
        assert!(!err.contains("panicked"), "master {args:?}: {err}");
    }
}

/// Runs `cmd` to its end, failing the test if it takes longer than `limit`
/// (a size that is not checked first runs for minutes or until the OOM
/// killer ends it).
fn output_within(cmd: &mut Command, limit: std::time::Duration) -> std::process::Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let ended = support::wait_for(limit, || child.try_wait().unwrap());
    if ended.is_none() {
        let _ = child.kill();
        panic!("{cmd:?} still running after {limit:?}");
    }
    child.wait_with_output().unwrap()
}

fn master_cmd(store: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_master"));
    c.args(args).env("STORE_ADDR", store).env("RUST_LOG", "warn");
    c
}

#[test]
fn matrices_too_large_for_the_store_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    let limit = std::time::Duration::from_secs(20);
    // More bytes than 64 bits count (the example, which wrapped
    // and ran out of memory): refused by the CLI itself, typed.
    let out = output_within(&mut master_cmd(s, &["matrix", "create", "X", "--n", "99999999999", "--block", "4096"]), limit);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("more than 2^64 bytes"), "{err}");
    // 800 TB (which wrote until the disk filled): larger than the store's
    // disk, refused by the node, saying how much it needs and is free.
    let out = output_within(&mut master_cmd(s, &["matrix", "create", "X", "--n", "10000000", "--block", "4096"]), limit);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("does not fit") && err.contains("GiB free"), "{err}");
    // Nothing half-made: no record, nothing listed.
    assert!(!master(s, &["matrix", "info", "X"]).status.success(), "no record of X");
    assert_eq!(master_ok(s, &["matrix", "list"]).lines().count(), 1, "the header alone");
}

#[test]
fn a_create_interrupted_midway_removes_its_matrix_and_one_killed_leaves_it_marked_incomplete() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    let listed_incomplete = |name: &str| master_ok(s, &["matrix", "list"]).lines().any(|l| l.starts_with(name) && l.contains("incomplete"));
    for (name, signal) in [("interrupted", Signal::SIGINT), ("killed", Signal::SIGKILL)] {
        // 4096 blocks, each its own commit: seconds of work.
        let mut child = master_cmd(s, &["matrix", "create", name, "--n", "2048", "--block", "32"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        support::wait_for(std::time::Duration::from_secs(20), || listed_incomplete(name).then_some(())).expect("the matrix being made");
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "{name}: {status}");
    }
    assert!(!master(s, &["matrix", "info", "interrupted"]).status.success(), "an interrupted create removes its matrix");
    let info = master_ok(s, &["matrix", "info", "killed"]);
    assert!(info.contains("state     incomplete"), "{info}");
}

/// A `master` process whose stderr is collected as it comes.
struct Watcher {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Watcher {
    fn start(store: &str, args: &[&str]) -> Watcher {
        use std::io::BufRead;
        let mut child = support::dies_with_test(&mut master_cmd(store, args))
            .env("RUST_LOG", "master=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (err, lines) = (stderr.clone(), std::io::BufReader::new(child.stderr.take().unwrap()));
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let mut e = err.lock().unwrap();
                e.push_str(&line);
                e.push('\n');
            }
        });
        Watcher { child, stderr }
    }

    fn said(&self, what: &str) -> bool {
        self.stderr.lock().unwrap().contains(what)
    }

    /// Its exit status, within `limit`.
    fn ended_within(&mut self, limit: std::time::Duration) -> std::process::ExitStatus {
        support::wait_for(limit, || self.child.try_wait().unwrap())
            .unwrap_or_else(|| panic!("still running after {limit:?}; said:\n{}", self.stderr.lock().unwrap()))
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Random n×n matrices A and B in blocks of 64, and a submitted C = A·B;
/// returns the job id.
fn submit_matmul(s: &str, n: u64) -> String {
    support::create_kind(s, "A", n, n, 64, "random", 1);
    support::create_kind(s, "B", n, n, 64, "random", 2);
    master_ok(s, &["submit", "matmul", "A", "B", "--out", "C"])
}

#[test]
fn serve_stops_within_5_s_of_sigterm_with_slaves_connected_and_starts_again_on_its_directory() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let mut store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.clone();
    let job = submit_matmul(&s, 512);
    let slaves: Vec<_> = (0..2).map(|k| support::slave(&s, &format!("slave-{k}"), &[])).collect();
    support::wait_for(std::time::Duration::from_secs(20), || {
        (master_ok(&s, &["slaves"]).lines().filter(|l| l.contains("slave-")).count() == 2).then_some(())
    })
    .expect("both slaves connected");
    kill(Pid::from_raw(store.child.id() as i32), Signal::SIGTERM).unwrap();
    let stopped = support::wait_for(std::time::Duration::from_secs(5), || store.child.try_wait().unwrap());
    let status = stopped.expect("master serve still running 5 s after SIGTERM with slaves connected");
    assert!(status.success(), "{status}");
    // Its RocksDB LOCK went with it: a node starts on the same directory
    // (`start_on` fails unless it says it listens) and the job ends there.
    let store = StoreProc::start_on(dir.path(), &s, &[]);
    master_ok(&store.addr, &["wait", &job]);
    assert!(master_ok(&store.addr, &["verify", &job]).contains("in-core dgemm"));
    slaves.into_iter().for_each(support::kill_child);
}

#[test]
fn wait_and_status_watch_ride_through_a_store_node_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.clone();
    let job = submit_matmul(&s, 256);
    // No slave yet: the job cannot end before the node goes.
    let mut watchers = [Watcher::start(&s, &["wait", &job]), Watcher::start(&s, &["status", "--watch", &job])];
    for w in &watchers {
        support::wait_for(std::time::Duration::from_secs(20), || w.said("waiting for job").then_some(())).expect("watching the job");
    }
    store.kill9();
    let store = StoreProc::start_on(dir.path(), &s, &[]);
    let slaves: Vec<_> = (0..2).map(|k| support::slave(&store.addr, &format!("slave-{k}"), &[])).collect();
    for w in &mut watchers {
        let status = w.ended_within(std::time::Duration::from_secs(60));
        assert!(status.success(), "{status}; said:\n{}", w.stderr.lock().unwrap());
        assert!(w.said("lost the store node"), "the restart was seen: {}", w.stderr.lock().unwrap());
    }
    assert!(master_ok(&store.addr, &["verify", &job]).contains("in-core dgemm"));
    slaves.into_iter().for_each(support::kill_child);
}

/// A 2-D float64 `.npy` file (C order) of `rows`×`cols` values `f(r, c)`.
fn write_npy(path: &std::path::Path, rows: usize, cols: usize, f: impl Fn(usize, usize) -> f64) {
    let mut header = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for r in 0..rows {
        for c in 0..cols {
            bytes.extend_from_slice(&f(r, c).to_le_bytes());
        }
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn nan_is_refused_at_import_and_a_nan_result_fails_verification_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    let npy = dir.path().join("nan.npy");
    write_npy(&npy, 20, 20, |r, c| if (r, c) == (13, 5) { f64::NAN } else { (r * 20 + c) as f64 });
    let out = master(s, &["matrix", "import", "N", npy.to_str().unwrap(), "--block", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("element (13, 5) is NaN, in block (1, 0)"), "{err}");
    assert!(!master(s, &["matrix", "info", "N"]).status.success(), "nothing half-imported");

    // A result that holds NaN (written here behind the job's back) fails
    // its verification, which says so and why.
    support::create_kind(s, "A", 64, 64, 32, "random", 1);
    let job = master_ok(s, &["submit", "matmul", "A", "A", "--out", "C"]);
    let slave = support::slave(s, "slave-0", &["--exit-when-idle"]);
    master_ok(s, &["wait", &job]);
    support::kill_child(slave);
    let rt = support::runtime();
    rt.block_on(async {
        let c = store_client::Client::connect(s, None).await.unwrap();
        let m = c.matrix_by_name("C").await.unwrap();
        let session = c.open_session("test").await.unwrap();
        let a = session.begin().await.unwrap();
        a.put_block(m.id, 1, 1, store_client::BlockData { rows: 32, cols: 32, data: vec![f64::NAN; 32 * 32] }).await.unwrap();
        a.commit().await.unwrap();
    });
    let out = master(s, &["verify", &job]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("verification FAILED") && text.contains("residual is NaN"), "{text}");
}

#[test]
fn messages_say_what_happened_once_and_list_the_right_values() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    // `matrix create` says what it made; --quiet gives the id alone.
    let said = master_ok(s, &["matrix", "create", "R", "--n", "64", "--block", "32", "--kind", "random"]);
    let id = said.rsplit(' ').next().unwrap();
    assert!(said.starts_with("created matrix R (64 × 64, blocks of 32): ") && id.len() == 36, "{said}");
    assert_eq!(master_ok(s, &["matrix", "create", "Q", "--n", "64", "--block", "32", "--quiet"]).len(), 36);
    // Cholesky's variants, not LU's schedules, in the error and in --help.
    let out = master(s, &["submit", "cholesky", "R", "--out", "L", "--variant", "foo"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("single-bag") && err.contains("multi-step-1") && !err.contains("bags,"), "{err}");
    let help = master_ok(s, &["submit", "cholesky", "--help"]);
    assert!(help.contains("multi-step-2") && help.contains("[default: dag]") && help.contains("Exit status:"), "{help}");
    // A failed job (a random matrix is not positive definite): `verify`
    // says it failed and why, not that there is nothing to verify yet.
    let job = master_ok(s, &["submit", "cholesky", "R", "--out", "L"]);
    let slave = support::slave(s, "slave-0", &["--exit-when-idle"]);
    assert_eq!(master(s, &["wait", &job]).status.code(), Some(1));
    support::kill_child(slave);
    let out = master(s, &["verify", &job]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("failed: ") && err.contains("no result to verify") && !err.contains("yet"), "{err}");
    let status = master_ok(s, &["status", &job]);
    assert!(status.contains(" failed ") && !status.contains("-0.00") && !status.contains("left"), "{status}");
    // Errors whose text holds their source's say it once: a second node
    // on the same directory.
    let other = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_master"))
        .args(["serve", "--data", dir.path().to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.matches("LOCK").count() == 1, "{err}");
    // And a second node on the same address.
    let out = Command::new(env!("CARGO_BIN_EXE_master"))
        .args(["serve", "--data", other.path().to_str().unwrap(), "--listen", s])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.to_lowercase().matches("address already in use").count() == 1, "{err}");
}

#[test]
fn matrix_rm_of_a_matrix_a_running_job_uses_is_refused_naming_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    support::create_kind(s, "A", 64, 64, 32, "random", 1);
    support::create_kind(s, "B", 64, 64, 32, "random", 2);
    // No slave: the job stays running.
    let job = master_ok(s, &["submit", "matmul", "A", "B", "--out", "C"]);
    for (name, verb) in [("A", "read"), ("C", "written")] {
        let out = master(s, &["matrix", "rm", name]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("is {verb} by job {job}")) && err.contains("--force"), "{err}");
        master_ok(s, &["matrix", "info", name]);
    }
    // Replacing the output under it is refused as well.
    let out = master(s, &["submit", "matmul", "A", "B", "--out", "C", "--force"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains(&job), "{}", String::from_utf8_lossy(&out.stderr));
    // --force overrides; a matrix no running job uses goes freely.
    master_ok(s, &["matrix", "rm", "B", "--force"]);
    assert!(!master(s, &["matrix", "info", "B"]).status.success());
    support::create_kind(s, "D", 64, 64, 32, "random", 3);
    master_ok(s, &["matrix", "rm", "D"]);
}

/// Tasks of `job` committed so far.
fn n_done(store: &str, job: &str) -> usize {
    let rt = support::runtime();
    rt.block_on(async {
        let c = store_client::Client::connect(store, None).await.unwrap();
        c.scan_small(&format!("done/{job}/"), 0).await.unwrap().len()
    })
}

/// `master status JOB --json`, parsed.
fn status_json(store: &str, job: &str) -> serde_json::Value {
    serde_json::from_str(&master_ok(store, &["status", job, "--json"])).unwrap()
}

#[test]
fn cancel_stops_a_job_with_slaves_busy_and_they_go_on_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    // 256 tasks of 16 block products each: seconds for two slaves.
    support::create_kind(s, "A", 2048, 2048, 128, "random", 1);
    let long = master_ok(s, &["submit", "matmul", "A", "A", "--out", "C1"]);
    support::create_kind(s, "S", 64, 64, 32, "random", 2);
    let next = master_ok(s, &["submit", "matmul", "S", "S", "--out", "C2"]);
    let unstarted = master_ok(s, &["submit", "matmul", "S", "S", "--out", "C3"]);
    // Cancelled before any slave runs it: its output stays, incomplete.
    let said = master_ok(s, &["cancel", &unstarted]);
    assert!(said.contains("cancelled job") && said.contains("4 task(s) taken out"), "{said}");
    let slaves: Vec<_> = (0..2).map(|k| support::slave(s, &format!("slave-{k}"), &[])).collect();
    support::wait_for(std::time::Duration::from_secs(60), || (n_done(s, &long) >= 2).then_some(())).expect("the long job under way");
    let said = master_ok(s, &["cancel", &long, "--remove-outputs"]);
    assert!(said.contains("its outputs removed"), "{said}");
    let at_cancel = n_done(s, &long);
    // The slaves went on to the next job, and nothing of the cancelled one
    // is left to run.
    master_ok(s, &["wait", &next]);
    let st = status_json(s, &long);
    assert_eq!(st["state"], "cancelled", "{st}");
    assert!(st["tasks_done"].as_u64().unwrap() < 256, "{st}");
    for bag in st["bags"].as_array().unwrap() {
        assert_eq!((bag["waiting"].as_u64(), bag["running"].as_u64()), (Some(0), Some(0)), "{st}");
    }
    // Tasks running at the cancel may commit; none after the next job ended.
    assert!(n_done(s, &long) <= at_cancel + 2, "tasks of the cancelled job ran on");
    assert!(master_ok(s, &["status", &long]).contains("cancelled"));
    let out = master(s, &["wait", &long]);
    assert!(out.status.code() == Some(1) && String::from_utf8_lossy(&out.stderr).contains("cancelled"));
    assert!(!master(s, &["matrix", "info", "C1"]).status.success(), "--remove-outputs");
    let c3: serde_json::Value = serde_json::from_str(&master_ok(s, &["matrix", "info", "C3", "--json"])).unwrap();
    assert_eq!(c3["complete"], false, "{c3}");
    assert!(c3["incomplete"].as_str().unwrap().contains("cancelled job"), "{c3}");
    slaves.into_iter().for_each(support::kill_child);
}

#[test]
fn retry_runs_a_job_whose_task_was_dead_lettered_to_the_right_result() {
    let dir = tempfile::tempdir().unwrap();
    // One orphaning dead-letters a task.
    let store = StoreProc::start(dir.path(), &["--attempt-limit", "1"]);
    let s = store.addr.as_str();
    support::create_kind(s, "A", 128, 128, 32, "random", 1);
    support::create_kind(s, "B", 128, 128, 32, "random", 2);
    let job = master_ok(s, &["submit", "matmul", "A", "B", "--out", "C"]);
    // A slave that SIGKILLs itself holding its first task.
    let mut doomed = support::slave(s, "doomed", &["--kill-at", "dequeued:1"]);
    assert!(!doomed.wait().unwrap().success());
    support::wait_for(std::time::Duration::from_secs(20), || (status_json(s, &job)["tasks_dead"] == 1).then_some(()))
        .expect("the task dead-lettered");
    let mut rest = support::slave(s, "slave-1", &["--exit-when-idle"]);
    assert!(rest.wait().unwrap().success());
    let out = master(s, &["wait", &job]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && err.contains("dead-lettered") && err.contains("master retry"), "{err}");
    let c: serde_json::Value = serde_json::from_str(&master_ok(s, &["matrix", "info", "C", "--json"])).unwrap();
    assert!(c["incomplete"].as_str().unwrap().contains("failed job"), "{c}");

    let log = master_ok(s, &["job", "log", &job]);
    assert!(
        log.contains("15/16 tasks committed") && log.contains("dead-lettered (given up") && log.contains("after 1 orphaning(s)"),
        "{log}"
    );
    let said = master_ok(s, &["retry", &job]);
    assert!(said.contains("1 dead-lettered task(s) back"), "{said}");
    assert_eq!(status_json(s, &job)["state"], "running");
    let mut again = support::slave(s, "slave-2", &["--exit-when-idle"]);
    assert!(again.wait().unwrap().success());
    master_ok(s, &["wait", &job]);
    assert!(master_ok(s, &["verify", &job]).contains("in-core dgemm"));
    let st = status_json(s, &job);
    assert_eq!(
        (st["state"].as_str(), st["tasks_done"].as_u64(), st["tasks_dead"].as_u64()),
        (Some("succeeded"), Some(16), Some(0)),
        "{st}"
    );
    let c: serde_json::Value = serde_json::from_str(&master_ok(s, &["matrix", "info", "C", "--json"])).unwrap();
    assert_eq!(c["complete"], true, "{c}");
    // --force replaces an existing output.
    let out = master(s, &["submit", "matmul", "A", "B", "--out", "C"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--force"));
    let job2 = master_ok(s, &["submit", "matmul", "A", "B", "--out", "C", "--force"]);
    let mut last = support::slave(s, "slave-3", &["--exit-when-idle"]);
    assert!(last.wait().unwrap().success());
    master_ok(s, &["wait", &job2]);
}

#[test]
fn json_output_parses_and_matches_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    support::create_kind(s, "A", 100, 70, 32, "random", 1);
    support::create_kind(s, "B", 70, 64, 32, "random", 2);
    let job = master_ok(s, &["submit", "matmul", "A", "B", "--out", "C"]);
    let slave = support::slave(s, "slave-7", &[]);
    master_ok(s, &["wait", &job]);
    let parse = |args: &[&str]| -> serde_json::Value { serde_json::from_str(&master_ok(s, args)).unwrap() };
    let jobs = parse(&["jobs", "--json"]);
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
    assert_eq!(
        (jobs[0]["id"].as_str(), jobs[0]["state"].as_str(), jobs[0]["app"].as_str()),
        (Some(&job[..]), Some("succeeded"), Some("matmul"))
    );
    // C is 100x64 in blocks of 32: 4x2 tasks.
    let st = parse(&["status", &job, "--json"]);
    assert_eq!((st["tasks_total"].as_u64(), st["tasks_done"].as_u64(), st["slaves"].as_u64()), (Some(8), Some(8), Some(1)), "{st}");
    assert!(st["failure"].is_null() && st["bags"][0]["done"] == 8, "{st}");
    let list = parse(&["matrix", "list", "--json"]);
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["A", "B", "C"]);
    let c = parse(&["matrix", "info", "C", "--json"]);
    assert_eq!(
        (c["rows"].as_u64(), c["cols"].as_u64(), c["block_rows"].as_u64(), c["bytes"].as_u64()),
        (Some(100), Some(64), Some(4), Some(100 * 64 * 8))
    );
    assert_eq!(c["complete"], true);
    let slaves = parse(&["slaves", "--json"]);
    assert!(slaves.as_array().unwrap().iter().any(|x| x["name"] == "slave-7"), "{slaves}");
    support::kill_child(slave);
}

#[test]
fn status_is_bounded_and_says_no_time_left_without_slaves() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    // A pivoted LU with bags: 8 block columns, four bags each.
    support::create_kind(s, "D", 256, 256, 32, "random", 1);
    let lu = master_ok(s, &["submit", "lu", "D", "--out", "LU", "--pivot", "--schedule", "bags"]);
    let status = master_ok(s, &["status", &lu]);
    assert!(status.lines().count() <= 12 && status.contains("more bag(s) of "), "{status}");
    assert!(status.contains("no slave alive") && !status.contains("left") && !status.contains("GFLOP/s"), "{status}");
    let all: serde_json::Value = serde_json::from_str(&master_ok(s, &["status", &lu, "--json"])).unwrap();
    assert!(all["bags"].as_array().unwrap().len() > 8, "{all}");
    // Ray tracing counts no flops: no rate of 0.00 GFLOP/s.
    let rt = master_ok(s, &["submit", "raytrace", "--level", "0", "--width", "16", "--height", "16", "--out", "img"]);
    let slave = support::slave(s, "slave-0", &["--exit-when-idle", "--job", &rt]);
    master_ok(s, &["wait", &rt]);
    support::kill_child(slave);
    let status = master_ok(s, &["status", &rt]);
    assert!(status.contains("succeeded") && !status.contains("GFLOP/s") && !status.contains("left"), "{status}");
}

/// The sessions of the node named `prefix…`, with their ids.
fn sessions_named(store: &str, prefix: &str) -> Vec<(String, u64)> {
    let all: serde_json::Value = serde_json::from_str(&master_ok(store, &["slaves", "--json"])).unwrap();
    let mut v: Vec<(String, u64)> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["name"].as_str().unwrap().starts_with(prefix))
        .map(|x| (x["name"].as_str().unwrap().to_owned(), x["session"].as_u64().unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn slave_count_supervises_its_processes_and_replaces_one_killed() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    let mut sup = support::dies_with_test(&mut Command::new(support::slave_exe()))
        .args(["--store", s, "--count", "3", "--name", "crew"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let limit = std::time::Duration::from_secs(20);
    let first = support::wait_for(limit, || Some(sessions_named(s, "crew")).filter(|v| v.len() == 3)).expect("three slaves connected");
    let names: Vec<&str> = first.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["crew-0", "crew-1", "crew-2"]);
    // SIGKILL one of its processes: it is started again, a new session.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", sup.id())).unwrap();
    let victim: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    support::wait_for(limit, || {
        let now = sessions_named(s, "crew");
        (now.len() == 3 && now.iter().filter(|x| first.contains(x)).count() == 2).then_some(())
    })
    .expect("the killed slave replaced");
    // SIGTERM stops them all, and the supervisor.
    kill(Pid::from_raw(sup.id() as i32), Signal::SIGTERM).unwrap();
    let status = support::wait_for(limit, || sup.try_wait().unwrap()).expect("the supervisor stopped");
    assert!(status.success(), "{status}");
    support::wait_for(limit, || sessions_named(s, "crew").is_empty().then_some(())).expect("its slaves gone");
}

#[test]
fn a_dead_lettered_task_stops_a_barrier_job_at_its_bag_until_retried() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &["--attempt-limit", "1"]);
    let s = store.addr.as_str();
    support::create_kind(s, "D", 128, 128, 32, "diag-dominant", 1);
    // Bags per block column with barriers between: the first task of the
    // first bag is given up after the slave holding it dies.
    let job = master_ok(s, &["submit", "lu", "D", "--out", "LU", "--schedule", "bags"]);
    let mut doomed = support::slave(s, "doomed", &["--kill-at", "dequeued:1"]);
    assert!(!doomed.wait().unwrap().success());
    support::wait_for(std::time::Duration::from_secs(20), || (status_json(s, &job)["tasks_dead"] == 1).then_some(()))
        .expect("the task dead-lettered");
    let mut rest = support::slave(s, "slave-1", &["--exit-when-idle"]);
    assert!(rest.wait().unwrap().success());
    // The job failed, saying why, and no task past the dead one's bag ran.
    let st = status_json(s, &job);
    assert_eq!(st["state"], "failed", "{st}");
    assert!(st["failure"].as_str().unwrap().contains("dead-lettered") && st["finished_ms"].is_null(), "{st}");
    let bags = st["bags"].as_array().unwrap();
    let first_open = bags.iter().position(|b| b["dead"] == 1).unwrap();
    assert!(bags[first_open + 1..].iter().all(|b| b["done"] == 0), "tasks ran past the barrier: {st}");
    master_ok(s, &["retry", &job]);
    let mut again = support::slave(s, "slave-2", &["--exit-when-idle"]);
    assert!(again.wait().unwrap().success());
    master_ok(s, &["wait", &job]);
    assert!(master_ok(s, &["verify", &job]).contains("‖PA − L·U‖"));
}

#[test]
fn job_log_says_which_slave_ran_what_and_why_a_run_failed() {
    let dir = tempfile::tempdir().unwrap();
    // A lock wait gives up after 300 ms.
    let store = StoreProc::start(dir.path(), &["--lock-timeout-ms", "300"]);
    let s = store.addr.as_str();
    support::create_kind(s, "A", 64, 64, 32, "random", 1);
    let job = master_ok(s, &["submit", "matmul", "A", "A", "--out", "C"]);
    let rt = support::runtime();
    let c = rt.block_on(store_client::Client::connect(s, None)).unwrap();
    let m = rt.block_on(c.matrix_by_name("C")).unwrap();
    let session = rt.block_on(c.open_session("test")).unwrap();
    // Block (0, 0) of C held for writing: the task that writes it fails
    // its run with a lock timeout, and goes back to its bag.
    let holder = rt.block_on(session.begin()).unwrap();
    let zeros = store_client::BlockData { rows: 32, cols: 32, data: vec![0.0; 32 * 32] };
    rt.block_on(holder.put_block(m.id, 0, 0, zeros)).unwrap();
    let slave = support::slave(s, "slave-log", &[]);
    let failed_run = || {
        let log: serde_json::Value = serde_json::from_str(&master_ok(s, &["job", "log", &job, "--json"])).unwrap();
        (!log["failed_runs"].as_array().unwrap().is_empty()).then_some(log)
    };
    let log = support::wait_for(std::time::Duration::from_secs(30), failed_run).expect("a failed run logged");
    let run = &log["failed_runs"][0];
    assert_eq!(run["slave"], "slave-log", "{log}");
    assert!(run["message"].as_str().unwrap().to_lowercase().contains("lock"), "{log}");
    rt.block_on(holder.abort()).unwrap();
    master_ok(s, &["wait", &job]);
    let log: serde_json::Value = serde_json::from_str(&master_ok(s, &["job", "log", &job, "--json"])).unwrap();
    let committed = log["committed"].as_array().unwrap();
    assert_eq!(committed.len(), 4, "{log}");
    assert!(committed.iter().all(|t| t["slave"] == "slave-log" && t["count"] == 1), "{log}");
    let text = master_ok(s, &["job", "log", &job]);
    assert!(text.contains("4/4 tasks committed") && text.contains("failed runs (the task went back to its bag):"), "{text}");
    support::kill_child(slave);
}

/// A node with a request stuck in a lock wait for a minute (over gRPC,
/// which the server's graceful stop waits for), and the runtime and
/// client that keep it there.
fn node_with_a_stuck_request(dir: &std::path::Path) -> (StoreProc, tokio::runtime::Runtime, store_client::Session) {
    let store = StoreProc::start(dir, &["--lock-timeout-ms", "60000"]);
    let rt = support::runtime();
    let session = rt.block_on(async {
        let c = store_client::Client::connect(&store.addr, None).await.unwrap().blocks_over_grpc();
        let session = c.open_session("test").await.unwrap();
        let holder = session.begin().await.unwrap();
        holder.write_small("k", b"held").await.unwrap();
        let waiter = session.begin().await.unwrap();
        tokio::spawn(async move {
            let _keep = holder;
            let _ = waiter.read_small("k", true).await;
        });
        session
    });
    // The waiter's request is at the node once the node says the session
    // runs two actions.
    support::wait_for(std::time::Duration::from_secs(10), || {
        let all: serde_json::Value = serde_json::from_str(&master_ok(&store.addr, &["slaves", "--json"])).unwrap();
        all.as_array().unwrap().iter().any(|s| s["name"] == "test" && s["actions"].as_u64() >= Some(2)).then_some(())
    })
    .expect("the waiter at the node");
    (store, rt, session)
}

#[test]
fn serve_stops_within_its_grace_with_a_request_stuck_and_at_once_on_a_second_signal() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _rt, _session) = node_with_a_stuck_request(dir.path());
    let t = std::time::Instant::now();
    kill(Pid::from_raw(store.child.id() as i32), Signal::SIGTERM).unwrap();
    let status = support::wait_for(std::time::Duration::from_secs(5), || store.child.try_wait().unwrap()).expect("stopped within 5 s");
    assert!(status.success() && t.elapsed() >= std::time::Duration::from_secs(2), "{status} after {:?}: the grace was waited", t.elapsed());
    drop((_rt, _session));

    let dir = tempfile::tempdir().unwrap();
    let (mut store, _rt, _session) = node_with_a_stuck_request(dir.path());
    let t = std::time::Instant::now();
    kill(Pid::from_raw(store.child.id() as i32), Signal::SIGINT).unwrap();
    // A check that something does not happen (and two signals sent at
    // once may be delivered as one): the first Ctrl-C still waits 300 ms
    // later.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(store.child.try_wait().unwrap().is_none(), "the first Ctrl-C waits for the request");
    kill(Pid::from_raw(store.child.id() as i32), Signal::SIGINT).unwrap();
    let status = support::wait_for(std::time::Duration::from_secs(5), || store.child.try_wait().unwrap()).expect("stopped");
    assert!(status.success() && t.elapsed() < std::time::Duration::from_millis(1500), "{status} after {:?}", t.elapsed());
}

/// A settings file names the store and the token; the environment
/// overrides the file and flags override both; a key the file may not
/// hold is refused naming the file.
#[test]
fn a_settings_file_names_the_store_and_the_environment_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(&dir.path().join("store"), &["--token", "from-the-file"]);
    let file = dir.path().join("config.toml");
    std::fs::write(&file, format!("store = \"{}\"\ntoken = \"from-the-file\"\n", store.addr)).unwrap();
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_master"))
            .args(["matrix", "list", "--patience-s", "2"])
            .args(args)
            .env_remove("STORE_ADDR")
            .env_remove("STORE_TOKEN")
            .env("FTBAG_CONFIG", &file)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = run(&[], &[]);
    assert!(ok, "the file's store and token: {err}");
    let (ok, err) = run(&[("STORE_TOKEN", "from-the-environment")], &[]);
    assert!(!ok && err.contains("wrong cluster token"), "the environment overrides the file: {err}");
    let (ok, err) = run(&[("STORE_TOKEN", "from-the-environment")], &["--token", "from-the-file"]);
    assert!(ok, "a flag overrides the environment: {err}");
    std::fs::write(&file, "stor = \"x:1\"\n").unwrap();
    let (ok, err) = run(&[], &[]);
    assert!(!ok && err.contains("unknown key") && err.contains("config.toml"), "{err}");
}

/// What a user gets wrong about reaching the node is said as such: a
/// missing port, a host that does not resolve, nothing listening, a wrong
/// or missing token (not "unreachable", which would send them looking for
/// an outage).
#[test]
fn connection_mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(&dir.path().join("store"), &["--token", "right"]);
    let run = |addr: &str, token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_master"));
        cmd.args(["matrix", "list", "--patience-s", "1"]).env("STORE_ADDR", addr).env_remove("STORE_TOKEN");
        if let Some(t) = token {
            cmd.env("STORE_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        // The answer; the retries' warnings before it may repeat it.
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line: {err}")).to_owned()
    };
    let err = run("127.0.0.1", None);
    assert!(err.contains("has no port"), "{err}");
    let err = run("no-such-host.invalid:7070", None);
    assert!(err.contains("cannot resolve"), "{err}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let err = run(&closed.to_string(), None);
    assert!(err.contains("nothing listens") && err.matches("master serve").count() == 1, "{err}");
    let err = run(&store.addr, Some("wrong"));
    assert!(err.contains("wrong cluster token") && !err.contains("unavailable"), "{err}");
    let err = run(&store.addr, None);
    assert!(err.contains("needs the cluster token"), "{err}");
}
