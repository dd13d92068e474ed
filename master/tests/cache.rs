//! Slave block caches and slave-to-slave transfer, with real processes:
//! a `master serve` and slaves that read over TCP (`--no-local`, as
//! slaves on other hosts do), so that their gets go through the cache.
//! Results are compared bit for bit with runs without a cache, and checked
//! with `master verify`; every task is committed once.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use job_record::{ReadSources, TaskDone};
use store_client::cache::BlockCache;
use store_client::{BlockData, Client, ConnectOptions};
use support::*;
use uuid::Uuid;

type Env = support::cluster::Cluster;

fn start() -> Env {
    Env::start(&["--attempt-limit", "1000"])
}

/// Every one of `total` tasks committed once; the reads' sources.
fn each_task_once(env: &Env, job: Uuid, total: usize) -> ReadSources {
    let done: Vec<TaskDone> = env.assert_each_task_once(job, total).into_iter().map(|(_, d)| d).collect();
    ReadSources::of(&done)
}

/// A slave reading over TCP with a cache of `mib`, logging to `log`.
fn cached_slave(store: &str, name: &str, mib: u32, extra: &[&str], log: Option<&std::path::Path>) -> Child {
    let mib = mib.to_string();
    let mut cmd = Command::new(slave_exe());
    cmd.args(["--store", store, "--name", name, "--no-local", "--cache-mib", &mib]).args(extra).stdout(Stdio::null());
    match log {
        Some(log) => cmd.env("RUST_LOG", "info").stderr(std::fs::File::create(log).unwrap()),
        None => cmd.env("RUST_LOG", "warn").stderr(Stdio::null()),
    };
    dies_with_test(&mut cmd).spawn().expect("spawn slave")
}

/// Test 1 of the issue: Matmul (as one bag and as the two-level bag),
/// Cholesky and LU with caching on and ten seeded kills: the
/// same bits as without a cache, verified, each task once; and the caches
/// and peers served reads.
#[test]
fn apps_with_caches_and_kills_match_runs_without_each_task_once() {
    let env = start();
    let s = env.s();
    let seed = std::env::var("FT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(7u64);
    eprintln!("seed {seed} (set FT_SEED to replay)");
    create_kind(s, "A", 512, 512, 64, "random", 1);
    create_kind(s, "B", 512, 512, 64, "random", 2);
    create_kind(s, "S", 384, 384, 64, "spd", 3);
    create_kind(s, "D", 384, 384, 64, "diag-dominant", 4);
    let cases: [(&str, Vec<&str>, usize); 4] = [
        ("C", vec!["matmul", "A", "B"], 64),
        // The two-level bag: kills land mid-row, and the row's next holder
        // goes on from its first block not committed.
        ("R", vec!["matmul", "A", "B", "--order", "two-level"], 64),
        ("L", vec!["cholesky", "S", "--variant", "multi-step-1", "--flag-timeout-ms", "500"], 21),
        ("U", vec!["lu", "D", "--schedule", "bags"], 0),
    ];
    let mut served = ReadSources::default();
    let mut products = Vec::new();
    for (k, (out, args, total)) in cases.into_iter().enumerate() {
        let mut outs = Vec::new();
        for cached in [false, true] {
            let name = format!("{out}-{cached}");
            let mut full = args.clone();
            full.extend(["--out", name.as_str()]);
            let job = env.submit(&full);
            let start = Instant::now();
            let (kills, mib) = if cached { (10, 64) } else { (0, 0) };
            let made = run_slaves_with_kill_points_by(
                |i, extra| cached_slave(s, &format!("s{k}-{i}"), mib, extra, None),
                3,
                kills,
                seed + k as u64,
                || {
                    assert!(start.elapsed() < Duration::from_secs(180), "job {job} stalled");
                    env.ended(job)
                },
            );
            env.wait_ended(job, Duration::from_secs(30));
            assert!(made.len() >= kills, "{out}: only {} kills landed", made.len());
            let total = if total == 0 { env.done(job).len() } else { total };
            let sources = each_task_once(&env, job, total);
            if cached && out == "R" {
                let resumed = env.done(job).iter().filter(|(_, d)| d.attempts > 0).count();
                assert!(resumed > 0, "no row went back to the bag mid-way and was finished by another slave");
            }
            if cached {
                served.peers += sources.peers;
                served.cache += sources.cache;
            }
            env.verify(job);
            outs.push(env.export_bytes(&name));
        }
        assert!(outs[0] == outs[1], "{out}: the result with caches and kills differs from the one without");
        products.push(outs.swap_remove(0));
    }
    assert!(products[0] == products[1], "the two-level bag's product differs from the single bag's");
    assert!(served.cache + served.peers > 0, "no read came from a cache or a peer: {served:?}");
}

/// Test 2 of the issue: A cached version replaced by another commit is never served: the
/// next read under a lock gets the new version from the node, and only an
/// unchanged version comes from the cache.
#[test]
fn a_cached_block_overwritten_by_another_commit_is_never_served_stale() {
    let env = start();
    let s = env.s().to_owned();
    create_kind(&s, "M", 128, 128, 64, "random", 9);
    env.rt.block_on(async {
        let options = ConnectOptions { local: false, ..ConnectOptions::default() };
        let reader = Client::connect_with(&s, &options).await.unwrap();
        let cache = std::sync::Arc::new(BlockCache::new(64 << 20, false, Duration::from_secs(1), None));
        assert!(reader.attach_block_cache(cache.clone()), "a TCP client takes a cache");
        let writer = Client::connect_with(&s, &options).await.unwrap();
        let m = reader.matrix_by_name("M").await.unwrap().id;
        let session = reader.open_session("reader").await.unwrap();
        let wsession = writer.open_session("writer").await.unwrap();
        let read = || async {
            let a = session.begin().await.unwrap();
            let b = a.get_block(m, 1, 0).await.unwrap();
            a.commit().await.unwrap();
            b
        };
        let first = read().await;
        let after_first = cache.read_bytes();
        assert_eq!(after_first.store, 64 * 64 * 8, "the first read is the node's");
        let again = read().await;
        assert_eq!(again.data, first.data);
        let after_again = cache.read_bytes().since(&after_first);
        assert_eq!((after_again.store, after_again.cache), (0, 64 * 64 * 8), "an unchanged version moves no payload");
        // Another action commits a new version while the reader holds the old.
        for round in 1..=3 {
            let new = BlockData { rows: 64, cols: 64, data: (0..64 * 64).map(|x| (x * round) as f64 + 0.5).collect() };
            let w = wsession.begin().await.unwrap();
            w.put_block(m, 1, 0, new.clone()).await.unwrap();
            w.commit().await.unwrap();
            let before = cache.read_bytes();
            let got = read().await;
            assert_eq!(got.data, new.data, "round {round}: the read after the commit is the new version");
            assert_ne!(got.data, first.data);
            let moved = cache.read_bytes().since(&before);
            assert_eq!((moved.store, moved.cache), (64 * 64 * 8, 0), "round {round}: the new version came from the node");
        }
    });
}

/// Locality-aware dequeue: a slave whose cache holds a multiply task's
/// inputs is handed that task first; a client without a cache takes the
/// bag in order.
#[test]
fn a_dequeue_hands_a_slave_the_tasks_whose_inputs_its_cache_holds() {
    let env = start();
    let s = env.s().to_owned();
    create_kind(&s, "A", 128, 128, 64, "random", 1);
    create_kind(&s, "B", 128, 128, 64, "random", 2);
    let job = env.submit(&["matmul", "A", "B", "--out", "C"]);
    let bag = format!("{job}/matmul");
    env.rt.block_on(async {
        let options = ConnectOptions { local: false, ..ConnectOptions::default() };
        let near = Client::connect_with(&s, &options).await.unwrap();
        let cache = std::sync::Arc::new(BlockCache::new(64 << 20, true, Duration::from_secs(1), None));
        assert!(near.attach_block_cache(cache.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let _serving = cache.serve_peers(listener, addr, None, Default::default());
        let (a, b) = (near.matrix_by_name("A").await.unwrap().id, near.matrix_by_name("B").await.unwrap().id);
        let session = near.open_session("near").await.unwrap();
        let read = |blocks: Vec<(Uuid, u32, u32)>| {
            let session = &session;
            async move {
                let act = session.begin().await.unwrap();
                for (m, i, j) in blocks {
                    act.get_block(m, i, j).await.unwrap();
                }
                act.commit().await.unwrap();
            }
        };
        // The bag's order is (0,0), (0,1), (1,1), (1,0) (serpentine).
        // The cache holds A's second block row: a task of C's second row.
        read(vec![(a, 1, 0), (a, 1, 1)]).await;
        let act = session.begin().await.unwrap();
        assert_eq!(matmul_task(&act, &bag).await, (1, 1), "half the inputs held, the earliest such task");
        // Now also B's first block column: the task that reads only held blocks.
        read(vec![(b, 0, 0), (b, 1, 0)]).await;
        assert_eq!(matmul_task(&act, &bag).await, (1, 0), "every input held");
        // Without a cache, the bag's order.
        let plain = Client::connect_with(&s, &options).await.unwrap();
        let other = plain.open_session("plain").await.unwrap().begin().await.unwrap();
        assert_eq!(matmul_task(&other, &bag).await, (0, 0));
        // Lost work first: a task back from an aborted action at the head of
        // the bag goes before the ones the near slave holds.
        act.abort().await.unwrap();
        other.abort().await.unwrap();
        let again = session.begin().await.unwrap();
        assert_eq!(matmul_task(&again, &bag).await, (0, 0), "the returned head first");
        assert_eq!(matmul_task(&again, &bag).await, (1, 0), "then by locality again");
    });
}

/// Dequeues a multiply task: its block of C.
async fn matmul_task(act: &store_client::Action, bag: &str) -> (u32, u32) {
    let store_client::Dequeue::Task(t) = act.dequeue(bag, Duration::ZERO).await.unwrap() else { panic!("a task") };
    let v: serde_json::Value = serde_json::from_slice(&t.payload).unwrap();
    (v["i"].as_u64().unwrap() as u32, v["j"].as_u64().unwrap() as u32)
}

/// A slave that read every input of one job (`--job`) and stays up as a
/// peer, then a second job run by another slave alone.
struct PeerRun {
    env: Env,
    peer: Child,
    reader_log: std::path::PathBuf,
}

fn peer_scenario(hook: &str) -> (PeerRun, ReadSources) {
    let env = start();
    let s = env.s().to_owned();
    create_kind(&s, "A", 512, 512, 128, "random", 1);
    create_kind(&s, "B", 512, 512, 128, "random", 2);
    let first = env.submit(&["matmul", "A", "B", "--out", "C1"]);
    let peer = cached_slave(&s, "peer", 256, &["--job", &first.to_string(), "--peer-hook", hook], None);
    env.wait_ended(first, Duration::from_secs(120));
    let second = env.submit(&["matmul", "A", "B", "--out", "C2"]);
    let reader_log = env.dir.path().join("reader.log");
    let mut reader = cached_slave(&s, "reader", 256, &["--job", &second.to_string(), "--peer-timeout-ms", "1000"], Some(&reader_log));
    env.wait_ended(second, Duration::from_secs(120));
    kill_child_ref(&mut reader);
    let sources = each_task_once(&env, second, 16);
    env.verify(second);
    assert!(env.export_bytes("C1") == env.export_bytes("C2"), "{hook}: the second job's product differs from the first's");
    (PeerRun { env, peer, reader_log }, sources)
}

fn kill_child_ref(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Slave-to-slave transfer works: the second job's inputs come from the
/// peer, each block about once from the store at most.
#[test]
fn a_slave_reads_the_blocks_a_peer_holds_from_the_peer() {
    let (mut run, sources) = peer_scenario("none");
    eprintln!("{sources:?}");
    assert!(sources.peers > 0, "no read came from the peer: {sources:?}");
    assert_eq!(sources.store, 0, "every input was the peer's: {sources:?}");
    kill_child_ref(&mut run.peer);
}

/// Test 3 of the issue: A peer SIGKILLed halfway through its first transfer: the reader
/// falls back to the store and the job is exact.
#[test]
fn a_peer_killed_mid_transfer_sends_the_reader_to_the_store() {
    let (mut run, sources) = peer_scenario("kill-mid-transfer");
    let status = run.peer.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(nix::libc::SIGKILL), "the peer killed itself mid-transfer: {status}");
    assert!(sources.store > 0, "the reads after the kill came from the store: {sources:?}");
    let _ = &run.env;
}

/// Test 3 of the issue: A peer SIGSTOPped halfway through its first transfer: the reader
/// gives up on it after its timeout, reads from the store, the job is
/// exact.
#[test]
fn a_peer_stopped_mid_transfer_sends_the_reader_to_the_store_after_its_timeout() {
    let (mut run, sources) = peer_scenario("stop-mid-transfer");
    let state = std::fs::read_to_string(format!("/proc/{}/stat", run.peer.id())).unwrap();
    let state = state.rsplit_once(')').unwrap().1.split_whitespace().next().unwrap().to_owned();
    assert_eq!(state, "T", "the peer is stopped");
    assert!(sources.store > 0, "{sources:?}");
    let log = std::fs::read_to_string(&run.reader_log).unwrap();
    assert!(log.contains("did not answer within"), "the reader timed out on the peer: {log}");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.peer.id() as i32), nix::sys::signal::Signal::SIGCONT);
    kill_child_ref(&mut run.peer);
}

/// Test 4 of the issue: A peer that flips a byte of what it sends: the reader detects it,
/// takes every such block from the store, and never uses a peer's bytes.
#[test]
fn a_peer_sending_corrupt_bytes_is_detected_and_the_block_comes_from_the_store() {
    let (mut run, sources) = peer_scenario("corrupt");
    assert_eq!(sources.peers, 0, "no damaged block was used: {sources:?}");
    assert!(sources.store > 0, "{sources:?}");
    let log = std::fs::read_to_string(&run.reader_log).unwrap();
    assert!(log.contains("damaged; not trusted for that version again"), "the reader named the damage: {log}");
    // Each damaged version was asked of the peer once at most: the node
    // forgets the peer for it and the reader distrusts it.
    let damaged = log.matches("damaged; not trusted").count();
    assert!(damaged <= 32, "{damaged} damaged transfers for 32 input blocks (A and B, 4×4 blocks each)");
    kill_child_ref(&mut run.peer);
}

fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Test 5 of the issue: The cache stays within its bound through a job whose data is more
/// than ten times the cache: the cached slave's peak RSS is an uncached
/// slave's in the same kind of job plus at most the cache.
#[test]
fn cache_memory_stays_within_its_bound_through_a_job_ten_times_larger() {
    let env = start();
    let s = env.s().to_owned();
    // Three matrices of 8 MiB (n = 1024): 24 MiB of data, reads of
    // 2·8³ blocks of 128 KiB = 128 MiB, against a cache of 2 MiB.
    create_kind(&s, "A", 1024, 1024, 128, "random", 1);
    create_kind(&s, "B", 1024, 1024, 128, "random", 2);
    let mut peaks = Vec::new();
    for (k, mib) in [0u32, 2].into_iter().enumerate() {
        let job = env.submit(&["matmul", "A", "B", "--out", &format!("C{k}")]);
        let mut c = cached_slave(&s, &format!("s{k}"), mib, &["--job", &job.to_string()], None);
        env.wait_ended(job, Duration::from_secs(180));
        peaks.push(peak_rss(c.id()));
        kill_child_ref(&mut c);
        each_task_once(&env, job, 64);
    }
    eprintln!("peak RSS without a cache {} MiB, with a 2 MiB cache {} MiB", peaks[0] >> 20, peaks[1] >> 20);
    let slack = 2 << 20;
    assert!(peaks[1] <= peaks[0] + (2 << 20) + slack, "peak RSS {} with a 2 MiB cache against {} without", peaks[1], peaks[0]);
}
