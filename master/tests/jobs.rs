//! End to end with real processes: `master serve`, `slave` processes and
//! `master` CLI calls, as a user would run them.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use store_client::Client;
use support::{master, master_ok, runtime, slave, slave_exe, StoreProc};

fn create(store: &str, name: &str, rows: u64, cols: u64, block: u32, seed: u64) {
    support::create_kind(store, name, rows, cols, block, "random", seed);
}

fn kill(c: Child) {
    support::kill_child(c);
}

#[test]
fn multiplies_of_several_shapes_match_in_core_dgemm() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    let slaves: Vec<Child> = (0..2).map(|k| slave(s, &format!("slave-{k}"), &[])).collect();
    // (m, k, n, b): square, n not a multiple of b, rectangular, one block.
    for (idx, (m, k, n, b)) in [(256, 256, 256, 64), (300, 200, 130, 64), (97, 33, 150, 40), (50, 50, 50, 64)].into_iter().enumerate() {
        let (a, bb, c) = (format!("A{idx}"), format!("B{idx}"), format!("C{idx}"));
        create(s, &a, m, k, b, 10 + idx as u64);
        create(s, &bb, k, n, b, 20 + idx as u64);
        let job = master_ok(s, &["submit", "matmul", &a, &bb, "--out", &c]);
        master_ok(s, &["wait", &job]);
        let report = master_ok(s, &["verify", &job]);
        assert!(report.contains("in-core dgemm"), "{report}");
    }
    slaves.into_iter().for_each(kill);
}

/// Runs C = A·B with `n_slaves` slaves, the first `kills` of them with
/// kill points seeded by `seed` (`support::run_slaves_with_kill_points`).
/// Returns the job id and the kills that landed while the job ran.
fn run_with_kills(store: &str, out: &str, n_slaves: usize, kills: usize, seed: u64) -> (String, usize) {
    let job = master_ok(store, &["submit", "matmul", "A", "B", "--out", out]);
    let id: uuid::Uuid = job.parse().unwrap();
    let rt = runtime();
    let c = rt.block_on(Client::connect(store, None)).unwrap();
    let ended = || {
        let peek = |k: String| rt.block_on(c.peek_small(&k)).unwrap().is_some();
        peek(job_record::finished_key(id)) || peek(job_record::failed_key(id))
    };
    let made = support::run_slaves_with_kill_points(store, n_slaves, kills, seed, ended);
    master_ok(store, &["wait", &job]);
    (job, made.len())
}

#[test]
fn ten_slave_kills_leave_the_product_bit_identical_and_every_task_committed_once() {
    let seed: u64 = std::env::var("FT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    eprintln!("seed {seed} (set FT_SEED to replay)");
    let dir = tempfile::tempdir().unwrap();
    // Rapid kills hit the task first in line again and again: raise the
    // poison limit so this test is about recovery, not dead-lettering.
    let store = StoreProc::start(dir.path(), &["--attempt-limit", "1000"]);
    let s = store.addr.as_str();
    create(s, "A", 1280, 1280, 128, 1);
    create(s, "B", 1280, 1280, 128, 2);
    let (clean, _) = run_with_kills(s, "C_clean", 3, 0, seed);
    let (killed, kills) = run_with_kills(s, "C_killed", 3, 10, seed);
    assert!(kills >= 10, "only {kills} kills landed while the job ran");
    let rt = runtime();
    rt.block_on(async {
        let c = Client::connect(s, None).await.unwrap();
        let (x, y) = (c.matrix_by_name("C_clean").await.unwrap(), c.matrix_by_name("C_killed").await.unwrap());
        for i in 0..10 {
            for j in 0..10 {
                let (bx, by) = (c.read_block_committed(x.id, i, j).await.unwrap(), c.read_block_committed(y.id, i, j).await.unwrap());
                assert!(bx.data.iter().zip(&by.data).all(|(p, q)| p.to_bits() == q.to_bits()), "block ({i}, {j}) differs");
            }
        }
        for job in [&clean, &killed] {
            let done = c.scan_small(&format!("done/{job}/"), 0).await.unwrap();
            assert_eq!(done.len(), 100, "every task has its record");
            let mut redone = 0;
            for (k, v) in done {
                let d: job_record::TaskDone = serde_json::from_slice(&v).unwrap();
                assert_eq!(d.count, 1, "{k} committed {} times", d.count);
                redone += usize::from(d.attempts > 0);
            }
            assert_eq!(redone > 0, job == &killed, "job {job}: {redone} task(s) redone after a kill");
        }
    });
    let status = master_ok(s, &["status", &killed]);
    assert!(status.contains("succeeded") && status.contains("100/100"), "{status}");
}

#[test]
fn a_job_runs_to_the_end_without_the_cli_and_a_new_cli_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    create(s, "A", 256, 256, 64, 1);
    create(s, "B", 256, 256, 64, 2);
    let job = master_ok(s, &["submit", "matmul", "A", "B", "--out", "C"]);
    assert_eq!(job.len(), 36, "the job id alone on stdout: {job:?}");
    // The submitting CLI has exited; slaves alone finish the job. One
    // computes as SCHED_IDLE (`--compute idle`), the other as usual.
    let slaves: Vec<Child> = [&["--exit-when-idle"][..], &["--exit-when-idle", "--compute", "idle"]]
        .iter()
        .enumerate()
        .map(|(k, extra)| slave(s, &format!("slave-{k}"), extra))
        .collect();
    for mut c in slaves {
        assert!(c.wait().unwrap().success());
    }
    let status = master_ok(s, &["status", &job[..8]]);
    assert!(status.contains("succeeded") && status.contains("16/16"), "{status}");
    // The slaves' task records say how long their kernels ran, so status
    // gives the rate while in them.
    let in_kernels = number_after(&status, "s in kernels (");
    assert!(in_kernels > 0.0 && in_kernels.is_finite(), "{status}");
    assert!(status.contains("and waiting for reads:") && status.contains("s for blocks"), "{status}");
    // Every task began and was dequeued: at least the dequeue's round trip
    // each (its begin is none since a commit begins the next action, so the
    // 16 tasks' sum may print as 0.00 s: the records are checked).
    let starts = seconds_on_line(&status, "between the tasks' begins");
    assert!(starts >= 0.0 && starts.is_finite(), "{status}");
    let rt = runtime();
    let done = rt.block_on(async {
        let c = Client::connect(s, None).await.unwrap();
        c.scan_small(&format!("done/{job}/"), 0).await.unwrap()
    });
    assert_eq!(done.len(), 16, "every task has its record");
    for (k, v) in done {
        let d: job_record::TaskDone = serde_json::from_slice(&v).unwrap();
        assert!(d.start_us > 0, "{k}: no time from its begin to its dequeue's answer");
    }
    // And how long, once computed, they waited for the previous ending.
    let settling = seconds_on_line(&status, "waiting for the previous task's ending");
    assert!(settling >= 0.0 && settling.is_finite(), "{status}");
    // Each slave ran several of the 16 tasks, so the records hold endings
    // (a put, a record and a synced commit each: no ending takes 0 ms).
    let ending_ms = number_after(&status, "commit: ");
    assert!(ending_ms > 0.0 && ending_ms.is_finite(), "{status}");
    // Every task went to its compute thread and back (microseconds each
    // here, so the sum may print as 0.00).
    let handing = seconds_on_line(&status, "handing the tasks to their compute threads");
    assert!(handing >= 0.0 && handing.is_finite(), "{status}");
    assert!(master_ok(s, &["jobs"]).contains(&job));
}

/// The number right after `marker` in `status`; panics, showing it, if
/// there is none.
fn number_after(status: &str, marker: &str) -> f64 {
    status
        .split_once(marker)
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no number after {marker:?} in {status}"))
}

/// The seconds a `master status` line containing `marker` starts with
/// ("  and 0.12 s ..."); panics, showing the status, if there is none.
fn seconds_on_line(status: &str, marker: &str) -> f64 {
    status
        .lines()
        .find(|l| l.contains(marker))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no line with {marker:?} and its seconds in {status}"))
}

#[test]
fn slaves_outlive_a_store_node_restart_and_the_job_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.clone();
    create(&s, "A", 1024, 1024, 128, 1);
    create(&s, "B", 1024, 1024, 128, 2);
    let job = master_ok(&s, &["submit", "matmul", "A", "B", "--out", "C"]);
    let slaves: Vec<Child> = (0..2).map(|k| slave(&s, &format!("slave-{k}"), &[])).collect();
    let rt = runtime();
    let c = rt.block_on(Client::connect(&s, None)).unwrap();
    support::wait_for(Duration::from_secs(60), || {
        let n = rt.block_on(c.scan_small(&format!("done/{job}/"), 0)).map(|v| v.len()).unwrap_or(0);
        (n >= 10).then_some(())
    })
    .expect("progress before the crash");
    // `kill9` reaps the node: its exit closed its listening socket, so the
    // address is free for the restart.
    store.kill9();
    let store = StoreProc::start_on(dir.path(), &s, &[]);
    let t = Instant::now();
    master_ok(&store.addr, &["wait", &job]);
    eprintln!("finished {:?} after the restart", t.elapsed());
    assert!(master_ok(&store.addr, &["verify", &job]).contains("in-core dgemm"));
    slaves.into_iter().for_each(kill);
}

#[test]
fn bad_input_gives_clear_errors_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    create(s, "A", 100, 50, 32, 1);
    create(s, "B", 60, 40, 32, 2);
    let out = master(s, &["submit", "matmul", "A", "B", "--out", "C"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("A") && err.contains("B") && (err.contains("incompatible") || err.contains("shape")), "{err}");
    let out = master(s, &["matrix", "info", "C"]);
    assert!(!out.status.success(), "C must not exist after a refused submit");

    let out = master(s, &["submit", "matmul", "A", "nope", "--out", "C"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));

    let npy = dir.path().join("bad.npy");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 4), }          \n";
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 40]);
    std::fs::write(&npy, bytes).unwrap();
    let out = master(s, &["matrix", "import", "M", npy.to_str().unwrap(), "--block", "2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs 128"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!master(s, &["matrix", "info", "M"]).status.success(), "nothing half-created");
    assert_eq!(master_ok(s, &["matrix", "list"]).lines().count(), 3, "header + A + B");

    // A slave pointed at a dead store retries with back-off and says so.
    let mut dead = Command::new(slave_exe())
        .args(["--store", "127.0.0.1:9", "--name", "lost"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its log, line by line as it comes, until the second retry.
    let (lines, said) = std::sync::mpsc::channel();
    let stderr = std::io::BufReader::new(dead.stderr.take().unwrap());
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut err = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while err.matches("unreachable, retrying").count() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match said.recv_timeout(left) {
            Ok(line) => err += &(line + "\n"),
            Err(_) => panic!("no second retry within 30 s: {err}"),
        }
    }
    assert!(dead.try_wait().unwrap().is_none(), "the slave keeps retrying");
    let _ = dead.kill();
    let _ = dead.wait();
}

#[test]
fn npy_export_and_import_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path(), &[]);
    let s = store.addr.as_str();
    create(s, "A", 70, 45, 16, 5);
    let f = dir.path().join("a.npy");
    master_ok(s, &["matrix", "export", "A", f.to_str().unwrap()]);
    master_ok(s, &["matrix", "import", "A2", f.to_str().unwrap(), "--block", "32"]);
    let rt = runtime();
    rt.block_on(async {
        let c = Client::connect(s, None).await.unwrap();
        let (a, a2) = (c.matrix_by_name("A").await.unwrap(), c.matrix_by_name("A2").await.unwrap());
        // Element (r, c) through both blockings.
        for (r, col) in [(0u64, 0u64), (69, 44), (17, 33), (40, 5)] {
            let x = c.read_block_committed(a.id, (r / 16) as u32, (col / 16) as u32).await.unwrap();
            let y = c.read_block_committed(a2.id, (r / 32) as u32, (col / 32) as u32).await.unwrap();
            let vx = x.data[(col % 16) as usize * x.rows + (r % 16) as usize];
            let vy = y.data[(col % 32) as usize * y.rows + (r % 32) as usize];
            assert_eq!(vx.to_bits(), vy.to_bits(), "element ({r}, {col})");
        }
    });
}

/// A backup taken while a job runs (`master backup`), restored after the
/// node is lost (`master serve --data BACKUP` on the same address, the
/// slaves riding through): the job finishes from the backup's state with
/// the right product, and the tasks committed after the backup, which it
/// does not hold, are done again.
#[test]
fn a_backup_taken_mid_job_restores_and_the_tasks_committed_after_it_are_redone() {
    use std::collections::BTreeSet;
    let dir = tempfile::tempdir().unwrap();
    let mut store = StoreProc::start(&dir.path().join("live"), &[]);
    let s = store.addr.clone();
    create(&s, "A", 1536, 1536, 128, 1);
    create(&s, "B", 1536, 1536, 128, 2);
    let job = master_ok(&s, &["submit", "matmul", "A", "B", "--out", "C"]);
    let id: uuid::Uuid = job.parse().unwrap();
    let slaves: Vec<Child> = (0..2).map(|k| slave(&s, &format!("slave-{k}"), &[])).collect();
    let rt = runtime();
    let done = |c: &Client| -> BTreeSet<String> {
        rt.block_on(c.scan_small(&format!("done/{job}/"), 0)).unwrap().into_iter().map(|(k, _)| k).collect()
    };
    let c = rt.block_on(Client::connect(&s, None)).unwrap();
    support::wait_for(Duration::from_secs(120), || (done(&c).len() >= 10).then_some(())).expect("progress before the backup");

    let backup = dir.path().join("backup");
    let report = master_ok(&s, &["backup", backup.to_str().unwrap(), "--json"]);
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    eprintln!("backup: {report}");
    assert!(report["versions"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["bytes_copied"].as_u64(), Some(0), "a backup on the store's filesystem links its blocks: {report}");
    // Commits after the backup, which it must not hold.
    let after = support::wait_for(Duration::from_secs(120), || {
        let now = done(&c);
        let ended = rt.block_on(c.peek_small(&job_record::finished_key(id))).unwrap().is_some();
        (ended || now.len() >= 20).then_some(now)
    })
    .expect("progress after the backup");
    drop(c);
    store.kill9();

    // What the backup holds, read on a port of its own before the slaves
    // can reach it.
    let (in_backup, total_before) = {
        let restored = StoreProc::start(&backup, &[]);
        let c = rt.block_on(Client::connect(&restored.addr, None)).unwrap();
        let record = rt.block_on(c.peek_small(&job_record::finished_key(id))).unwrap();
        assert!(record.is_none(), "the backup was taken mid-job");
        (done(&c), after.len())
    };
    assert!(in_backup.is_subset(&after), "the backup is a cut of the commits: it holds only tasks the node had committed");
    let lost: BTreeSet<&String> = after.difference(&in_backup).collect();
    assert!(!lost.is_empty(), "tasks committed after the backup ({total_before} done at the kill, {} in the backup)", in_backup.len());

    let store = StoreProc::start_on(&backup, &s, &[]);
    master_ok(&store.addr, &["wait", &job]);
    assert!(master_ok(&store.addr, &["verify", &job]).contains("in-core dgemm"));
    let c = rt.block_on(Client::connect(&store.addr, None)).unwrap();
    let finally = done(&c);
    assert!(lost.iter().all(|k| finally.contains(*k)), "every task committed after the backup was done again");
    let commits = rt.block_on(c.node_metrics()).unwrap().commits as usize;
    let redone = finally.len() - in_backup.len();
    assert!(commits >= redone, "the restored node committed {commits} actions, fewer than the {redone} tasks not in the backup");
    eprintln!("{} tasks in the backup, {} lost with the node and done again, {} in all", in_backup.len(), lost.len(), finally.len());
    slaves.into_iter().for_each(kill);
}
