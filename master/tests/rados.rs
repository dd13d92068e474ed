//! The Ceph tier with real processes (issue 48): a `master serve --blocks
//! rados` node whose block versions are objects of a pool of a throwaway
//! cluster (`scripts/ceph-cluster.sh`, started once for the binary), and
//! slaves that read and write those objects themselves (`--ceph-conf`) or
//! through the node (without). Results are checked with `master verify`
//! and bit for bit against runs without kills; every task is committed
//! once; the pool holds exactly the versions the node's pointers name.
//! Without root or Ceph every test prints `skipped:`, which CI fails on.

#[path = "../../rados/tests/harness/mod.rs"]
mod harness;
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::TestCluster;
use support::*;
use uuid::Uuid;

type Env = support::cluster::Cluster;

/// A pool of its own for one test, so that its objects can be counted.
fn pool(c: &TestCluster, name: &str, copies: u32) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh");
    let out = Command::new("bash").arg(script).arg("pool").arg(c.dir()).args([name, &copies.to_string()]).output().unwrap();
    assert!(out.status.success(), "pool {name}: {}", String::from_utf8_lossy(&out.stderr));
    name.to_owned()
}

fn serve_args<'a>(c: &'a TestCluster, pool: &'a str) -> Vec<&'a str> {
    vec!["--blocks", "rados", "--pool", pool, "--ceph-conf", c.conf.to_str().unwrap(), "--ceph-timeout-s", "10", "--attempt-limit", "1000"]
}

/// A slave over TCP; with `direct`, reading and writing the pool itself.
fn rados_slave(store: &str, conf: &Path, name: &str, direct: bool, extra: &[&str]) -> Child {
    let mut cmd = Command::new(slave_exe());
    cmd.args(["--store", store, "--name", name, "--no-local"]).args(extra).stdout(Stdio::null());
    if direct {
        cmd.arg("--ceph-conf").arg(conf);
    } else {
        cmd.env_remove("CEPH_CONF");
    }
    let verbose = std::env::var_os("FT_VERBOSE").is_some();
    cmd.env("RUST_LOG", if verbose { "info" } else { "warn" }).stderr(if verbose { Stdio::inherit() } else { Stdio::null() });
    dies_with_test(&mut cmd).spawn().expect("spawn slave")
}

/// The version objects in `pool`.
fn objects_in(c: &TestCluster, pool: &str) -> usize {
    let out = Command::new("rados").arg("-c").arg(&c.conf).args(["-p", pool, "ls"]).output().unwrap();
    assert!(out.status.success(), "rados ls: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("ftbag/")).count()
}

/// Waits until the pool holds exactly `blocks` version objects: every
/// block's current version, and nothing else once the node collected.
fn assert_objects_settle_to(c: &TestCluster, pool: &str, blocks: usize, within: Duration) {
    let start = Instant::now();
    loop {
        let n = objects_in(c, pool);
        if n == blocks {
            return;
        }
        assert!(n >= blocks, "{pool}: {n} objects for {blocks} blocks: a version named by a pointer is gone");
        assert!(start.elapsed() < within, "{pool}: {n} objects for {blocks} blocks after {within:?}: orphans left");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Issue 48, test 1: matmul, Cholesky and LU on the `rados` backend with
/// ten seeded slave kills each: verified, the same bits as without kills,
/// each task committed once; slaves reading the pool themselves beside one
/// going through the node. Then the pool holds the pointers' versions only.
#[test]
fn apps_on_rados_with_slave_kills_are_exact_and_each_task_once() {
    let Some(c) = TestCluster::shared() else { return };
    let pool = pool(c, "apps", 1);
    let mut args = serve_args(c, &pool);
    args.extend(["--collect-objects-every-ms", "1000"]);
    let env = Env::start(&args);
    let s = env.s();
    let seed = std::env::var("FT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(11u64);
    eprintln!("seed {seed} (set FT_SEED to replay)");
    create_kind(s, "A", 384, 384, 64, "random", 1);
    create_kind(s, "B", 384, 384, 64, "random", 2);
    create_kind(s, "S", 320, 320, 64, "spd", 3);
    create_kind(s, "D", 320, 320, 64, "diag-dominant", 4);
    let cases: [(&str, Vec<&str>, usize); 3] = [
        ("C", vec!["matmul", "A", "B"], 36),
        ("L", vec!["cholesky", "S", "--variant", "multi-step-1", "--flag-timeout-ms", "500"], 15),
        ("U", vec!["lu", "D", "--schedule", "bags"], 0),
    ];
    for (k, (out, args, total)) in cases.into_iter().enumerate() {
        let mut outs = Vec::new();
        for kills in [0, 10] {
            let name = format!("{out}-{kills}");
            let mut full = args.clone();
            full.extend(["--out", name.as_str()]);
            let job = env.submit(&full);
            let start = Instant::now();
            let made = run_slaves_with_kill_points_by(
                // The first slave of each run goes through the node.
                |i, extra| rados_slave(s, &c.conf, &format!("s{k}-{kills}-{i}"), i != 0, extra),
                3,
                kills,
                seed + k as u64,
                || {
                    assert!(start.elapsed() < Duration::from_secs(240), "job {job} stalled");
                    env.ended(job)
                },
            );
            env.wait_ended(job, Duration::from_secs(30));
            assert!(made.len() >= kills, "{out}: only {} kills landed", made.len());
            let total = if total == 0 { env.done(job).len() } else { total };
            env.assert_each_task_once(job, total);
            env.verify(job);
            outs.push(env.export_bytes(&name));
        }
        assert!(outs[0] == outs[1], "{out}: the result with kills differs from the one without");
    }
    // Every block of every matrix has one version, and nothing else is left
    // once the node removed the aborted versions and collected what killed
    // slaves wrote without handing over (a slave ends one task's writes
    // while it starts the next, where its kill point may fire).
    let pointers = env.rt.block_on(async {
        let mut n = 0;
        for m in env.client.list_matrices().await.unwrap() {
            n += m.n_rows.div_ceil(u64::from(m.block)) * m.n_cols.div_ceil(u64::from(m.block));
        }
        n as usize
    });
    assert_objects_settle_to(c, &pool, pointers, Duration::from_secs(30));
}

/// Issue 48, test 3: the store node SIGKILLed mid-job (slaves mid-write
/// among them) and restarted on its data: the job completes exactly, and
/// after the node's recovery and collection the pool holds exactly the
/// versions its pointers name.
#[test]
fn a_store_killed_mid_job_leaves_no_orphaned_objects_after_recovery_and_collection() {
    let Some(c) = TestCluster::shared() else { return };
    let pool = pool(c, "orphans", 1);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    let mut args = serve_args(c, &pool);
    args.extend(["--collect-objects-every-ms", "700", "--lease-ms", "1500"]);
    let mut store = StoreProc::start(&data, &args);
    let s = store.addr.clone();
    create_kind(&s, "A", 512, 512, 64, "random", 5);
    create_kind(&s, "B", 512, 512, 64, "random", 6);
    let job: Uuid = master_ok(&s, &["submit", "matmul", "A", "B", "--out", "C"]).parse().unwrap();
    let slaves: Vec<Child> = (0..3).map(|i| rados_slave(&s, &c.conf, &format!("o{i}"), true, &[])).collect();
    let rt = runtime();
    // Tasks done so far, as a fresh client sees them (0 while the node is down).
    let done = || -> usize {
        rt.block_on(async {
            let client = store_client::Client::connect(&s, None).await.ok()?;
            client.scan_small(&job_record::done_prefix(job), 0).await.ok().map(|d| d.len())
        })
        .unwrap_or(0)
    };
    for round in 0..2 {
        let started = Instant::now();
        let before = done();
        while done() < before + 6 {
            assert!(started.elapsed() < Duration::from_secs(120), "round {round}: no progress");
            std::thread::sleep(Duration::from_millis(50));
        }
        store.kill9();
        store = StoreProc::start_on(&data, &s, &args);
    }
    let env_wait = Instant::now();
    loop {
        let out = master(&s, &["wait", &job.to_string(), "--patience-s", "60"]);
        if out.status.success() {
            break;
        }
        assert!(env_wait.elapsed() < Duration::from_secs(240), "job {job}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let verified = master(&s, &["verify", &job.to_string()]);
    assert!(verified.status.success(), "verify: {}", String::from_utf8_lossy(&verified.stderr));
    slaves.into_iter().for_each(kill_child);
    // A, B and C: 64 blocks each, one version each.
    assert_objects_settle_to(c, &pool, 3 * 64, Duration::from_secs(30));
    drop(store);
}

/// Issue 48, test 4: what a user gets wrong is a clear error at start: no
/// cluster at the configuration's address, a pool that does not exist, a
/// wrong key, --blocks rados without a configuration, and a store made with
/// its blocks in files reopened with them in a pool (and back).
#[test]
fn bad_cluster_settings_are_clear_errors_at_start() {
    let Some(c) = TestCluster::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let serve = |data: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_master"))
            .args(["serve", "--data", dir.path().join(data).to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("CEPH_CONF")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "serve {extra:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let conf = c.conf.to_str().unwrap();
    // A configuration whose monitor address has no monitor.
    let text = std::fs::read_to_string(&c.conf).unwrap();
    let nowhere = dir.path().join("nowhere.conf");
    let mut moved = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("mon host") {
            moved.push_str("mon host = 127.0.0.1:9\n");
        } else {
            moved.push_str(line);
            moved.push('\n');
        }
    }
    std::fs::write(&nowhere, moved).unwrap();
    let started = Instant::now();
    let err = serve("a", &["--blocks", "rados", "--pool", "ftbag", "--ceph-conf", nowhere.to_str().unwrap(), "--ceph-timeout-s", "3"]);
    assert!(err.contains("cannot reach the monitors"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "an unreachable cluster took {:?} to be reported", started.elapsed());
    let err = serve("b", &["--blocks", "rados", "--pool", "no-such-pool", "--ceph-conf", conf]);
    assert!(err.contains("no pool no-such-pool"), "{err}");
    // A keyring whose key is not the cluster's.
    let wrong = dir.path().join("wrong.keyring");
    std::fs::write(&wrong, "[client.admin]\n\tkey = AQBQAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAA==\n").unwrap();
    let err = serve(
        "c",
        &["--blocks", "rados", "--pool", "ftbag", "--ceph-conf", conf, "--ceph-keyring", wrong.to_str().unwrap(), "--ceph-timeout-s", "5"],
    );
    assert!(err.contains("refused client.admin's key") || err.contains("cannot connect"), "{err}");
    let err = serve("d", &["--blocks", "rados", "--pool", "ftbag"]);
    assert!(err.contains("--ceph-conf"), "{err}");
    // A store of files, reopened as objects, is refused; and the other way.
    {
        let store = StoreProc::start(&dir.path().join("files"), &[]);
        create_kind(&store.addr, "M", 64, 64, 32, "random", 1);
    }
    let err = serve("files", &["--blocks", "rados", "--pool", "ftbag", "--ceph-conf", conf]);
    assert!(err.contains("keeps its blocks as files"), "{err}");
    {
        let store = StoreProc::start(&dir.path().join("objects"), &["--blocks", "rados", "--pool", "ftbag", "--ceph-conf", conf]);
        create_kind(&store.addr, "M", 64, 64, 32, "random", 1);
    }
    let err = serve("objects", &[]);
    assert!(err.contains("keeps its blocks as objects in pool ftbag"), "{err}");
}

/// Issue 48, test 2: a pool of two copies over two OSDs, one OSD SIGKILLed
/// mid-job: the job completes exactly, and every block reads back. Then,
/// with a pool of one copy, the OSD holding it SIGKILLed: reading fails
/// with a clear error within the client's timeout; nothing hangs, nothing
/// wrong is served.
#[test]
fn an_osd_killed_mid_job_loses_nothing_with_two_copies_and_fails_clearly_with_one() {
    if let Some(why) = harness::cannot_run() {
        harness::skip(&why);
        return;
    }
    // Its own cluster: daemons of the shared one are not this test's to kill.
    let c = TestCluster::start(2, &[("two", 2), ("one", 1)]);
    // A matrix in the pool of one copy, spread over both OSDs, for later.
    let single = Env::start(&["--blocks", "rados", "--pool", "one", "--ceph-conf", c.conf.to_str().unwrap(), "--ceph-timeout-s", "5"]);
    create_kind(single.s(), "M", 256, 256, 32, "random", 9);
    let env = Env::start(&serve_args(&c, "two"));
    let s = env.s();
    create_kind(s, "A", 512, 512, 128, "random", 7);
    create_kind(s, "B", 512, 512, 128, "random", 8);
    let job = env.submit(&["matmul", "A", "B", "--out", "C"]);
    let slaves: Vec<Child> = (0..2).map(|i| rados_slave(s, &c.conf, &format!("d{i}"), true, &[])).collect();
    let started = Instant::now();
    while env.done(job).len() < 4 {
        assert!(started.elapsed() < Duration::from_secs(120), "no progress before the OSD kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill("osd.1");
    env.wait_ended(job, Duration::from_secs(240));
    env.assert_each_task_once(job, 16);
    env.verify(job);
    slaves.into_iter().for_each(kill_child);

    // One copy: the blocks on the dead OSD cannot be read, and the read
    // says so, in time.
    let started = Instant::now();
    let out = master(single.s(), &["matrix", "export", "M", single.path("M.npy").to_str().unwrap()]);
    let took = started.elapsed();
    assert!(!out.status.success(), "an export with the only OSD dead succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("timed out") || err.contains("down or unreachable"), "{err}");
    assert!(took < Duration::from_secs(60), "the failed read took {took:?}");
}
