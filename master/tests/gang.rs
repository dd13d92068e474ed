//! Data-parallel multiply over the BSP transport (issue 49), with real
//! processes on loopback: a `master serve`, slaves that gang-schedule the
//! ranks from the bag, seeded SIGKILLs inside supersteps, a rank SIGSTOPped
//! past its lease before a commit, fewer slaves than ranks, and foreign
//! bytes on a rank's BSP port. Results are compared bit for bit with the
//! bag-of-tasks multiply of the same matrices (each C block adds its terms
//! in the same order with the same dgemm), and every superstep is
//! committed once per rank.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use job_record::gang as keys;
use job_record::{self as record};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::*;
use uuid::Uuid;

/// The shared store-node harness, with what the gang tests read besides.
struct Env(support::cluster::Cluster);

impl std::ops::Deref for Env {
    type Target = support::cluster::Cluster;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Env {
    fn start() -> Env {
        // Every kill orphans a rank task: far more than the default three
        // per task may land on one rank.
        Env(support::cluster::Cluster::start(&["--attempt-limit", "1000"]))
    }

    fn scan(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.rt.block_on(self.client.scan_small(prefix, 0)).unwrap()
    }

    /// As `Cluster::wait_ended`, saying the gang's status when it fails.
    fn wait_ended(&self, job: Uuid, limit: Duration) {
        let start = Instant::now();
        while !self.ended(job) {
            assert!(start.elapsed() < limit, "job {job} did not end within {limit:?}: {}", self.status(job));
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(self.peek(&record::failed_key(job)).is_none(), "job {job} failed: {}", self.status(job));
    }

    fn status(&self, job: Uuid) -> String {
        let out = master(self.s(), &["status", &job.to_string()]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn status_json(&self, job: Uuid) -> serde_json::Value {
        serde_json::from_str(&master_ok(self.s(), &["status", &job.to_string(), "--json"])).unwrap()
    }

    /// The reference: the bag-of-tasks multiply of the same matrices.
    fn by_bag(&self, a: &str, b: &str, out: &str) -> Vec<u8> {
        let job = self.submit(&["matmul", a, b, "--out", out]);
        let slaves: Vec<Child> = (0..2).map(|k| gang_slave(self.s(), &format!("bag-{k}"), &[], None)).collect();
        self.wait_ended(job, Duration::from_secs(120));
        slaves.into_iter().for_each(kill_child);
        self.export_bytes(out)
    }

    /// Each rank committed each superstep at most once, and every rank
    /// committed the last one.
    fn each_superstep_once(&self, job: Uuid, ranks: u32, supersteps: u32) {
        let commits = self.scan(&keys::ckpt_prefix(job));
        assert!(!commits.is_empty(), "no checkpoints recorded");
        for (k, v) in &commits {
            assert_eq!(keys::counter(Some(v)), 1, "{k} committed {} times", keys::counter(Some(v)));
        }
        for r in 0..ranks {
            let c: keys::Checkpoint = serde_json::from_slice(&self.peek(&keys::step_key(job, r)).unwrap()).unwrap();
            assert_eq!(c.step, supersteps, "rank {r}");
        }
    }

    /// The slave names holding each rank now (live or not).
    fn holders(&self, job: Uuid) -> Vec<keys::Holder> {
        self.scan(&keys::holder_prefix(job)).into_iter().map(|(_, v)| serde_json::from_slice(&v).unwrap()).collect()
    }

    fn formations(&self, job: Uuid) -> u64 {
        keys::counter(self.peek(&keys::formations_key(job)).as_deref())
    }
}

/// A slave; its log to `log` when given. BSP peers that go silent are lost
/// after 3 s (the node's lease is 3 s too).
fn gang_slave(store: &str, name: &str, extra: &[&str], log: Option<&std::path::Path>) -> Child {
    let mut cmd = Command::new(slave_exe());
    cmd.args(["--store", store, "--name", name, "--dequeue-wait-ms", "200"])
        .args(extra)
        .env("BSP_PEER_TIMEOUT_MS", "3000")
        .stdout(Stdio::null());
    match log {
        Some(log) => cmd.env("RUST_LOG", "slave=info,bsp=warn").stderr(std::fs::File::create(log).unwrap()),
        None if std::env::var_os("FT_VERBOSE").is_some() => cmd.env("RUST_LOG", "slave=info").stderr(Stdio::inherit()),
        None => cmd.env("RUST_LOG", "warn").stderr(Stdio::null()),
    };
    dies_with_test(&mut cmd).spawn().expect("spawn slave")
}

fn gang_submit(env: &Env, a: &str, b: &str, out: &str, ranks: u32, every: u32, wait_ms: u64) -> Uuid {
    let (r, e, w) = (ranks.to_string(), every.to_string(), wait_ms.to_string());
    env.submit(&["matmul", a, b, "--out", out, "--engine", "bsp", "--ranks", &r, "--checkpoint-every", &e, "--gang-wait-ms", &w])
}

fn seed() -> u64 {
    let seed = std::env::var("FT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(49u64);
    eprintln!("seed {seed} (set FT_SEED to replay)");
    seed
}

/// Test 1: the data-parallel multiply of shapes that straddle block
/// boundaries gives the bag of tasks' bits, and `master verify` (an
/// independent check against dgemm) passes; the model chooses the
/// checkpoint interval.
#[test]
fn bsp_multiply_matches_the_bag_of_tasks_bit_for_bit() {
    let env = Env::start();
    let s = env.s();
    create_kind(s, "A", 300, 260, 64, "random", 1);
    create_kind(s, "B", 260, 200, 64, "random", 2);
    let want = env.by_bag("A", "B", "Cbag");
    let job = env.submit(&["matmul", "A", "B", "--out", "C", "--engine", "bsp", "--ranks", "3"]);
    let slaves: Vec<Child> = (0..3).map(|k| gang_slave(s, &format!("s{k}"), &[], None)).collect();
    env.wait_ended(job, Duration::from_secs(120));
    assert!(env.export_bytes("C") == want, "the data-parallel C differs from the bag of tasks'");
    let out = master(s, &["verify", &job.to_string()]);
    assert!(out.status.success(), "verify: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    env.each_superstep_once(job, 3, 5);
    let st = env.status_json(job);
    assert_eq!(st["state"], "succeeded");
    assert_eq!(st["tasks_done"], 3, "one record per rank");
    assert_eq!(st["gang"]["formations"], 1, "{st}");
    assert!(env.status(job).contains("gang: 3 ranks"));
    slaves.into_iter().for_each(kill_child);
}

/// Test 2: ranks SIGKILLed right after a superstep's communication, at
/// seeded supersteps, three times in one job: the gang re-forms each
/// time, resumes from the checkpoints, gives the clean run's bits, and
/// commits no superstep twice.
#[test]
fn ranks_killed_mid_superstep_give_the_clean_bits_and_commit_each_superstep_once() {
    use rand::{Rng, SeedableRng};
    let env = Env::start();
    let s = env.s();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed());
    // 20 supersteps (620 / 32, the last one short), 3 ranks.
    create_kind(s, "A", 200, 620, 32, "random", 3);
    create_kind(s, "B", 620, 150, 32, "random", 4);
    let want = env.by_bag("A", "B", "Cbag");
    let job = gang_submit(&env, "A", "B", "C", 3, 2, 5000);
    // Kill points in rising supersteps, each past the last: a resumed gang
    // starts at or before the previous one.
    let mut points: Vec<u32> = Vec::new();
    let mut at = 1;
    for _ in 0..3 {
        at = rng.gen_range(at..at + 5);
        points.push(at);
        at += 1;
    }
    eprintln!("kill points: supersteps {points:?}");
    let mut killers: Vec<(Child, u32)> = Vec::new();
    let mut plain: Vec<Child> = Vec::new();
    let mut next = points.iter().rev().copied().collect::<Vec<u32>>();
    let fault = |p: u32| format!("kill:{p}");
    let first = next.pop().unwrap();
    killers.push((gang_slave(s, "k0", &["--gang-fault", &fault(first)], None), first));
    plain.push(gang_slave(s, "p0", &[], None));
    plain.push(gang_slave(s, "p1", &[], None));
    let mut fired = Vec::new();
    let started = Instant::now();
    while !env.ended(job) {
        assert!(started.elapsed() < Duration::from_secs(240), "job did not end: {}", env.status(job));
        let mut k = 0;
        while k < killers.len() {
            if let Some(st) = killers[k].0.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                let (_, p) = killers.remove(k);
                assert_eq!(st.signal(), Some(nix::libc::SIGKILL), "a slave ended on its own: {st}");
                fired.push(p);
                // Its replacement carries the next kill point.
                match next.pop() {
                    Some(p) => killers.push((gang_slave(s, &format!("k{}", fired.len()), &["--gang-fault", &fault(p)], None), p)),
                    None => plain.push(gang_slave(s, &format!("p{}", plain.len()), &[], None)),
                }
            } else {
                k += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    env.wait_ended(job, Duration::from_secs(1));
    assert_eq!(fired, points, "every kill point fired, in order");
    assert!(env.export_bytes("C") == want, "the result differs from the clean bits");
    env.each_superstep_once(job, 3, 20);
    let st = env.status_json(job);
    assert_eq!(st["gang"]["double_commits"], 0);
    assert!(env.formations(job) >= 4, "{} formations for 3 kills", env.formations(job));
    killers.into_iter().for_each(|(c, _)| kill_child(c));
    plain.into_iter().for_each(kill_child);
}

/// Test 3: a rank SIGSTOPped right before a commit, past its lease: the
/// gang re-forms without it (the spare slave takes its rank); resumed, its
/// late commit is refused; the result is exact.
#[test]
fn a_rank_stopped_past_its_lease_is_fenced_and_the_result_exact() {
    let env = Env::start();
    let s = env.s();
    create_kind(s, "A", 160, 320, 32, "random", 5);
    create_kind(s, "B", 320, 100, 32, "random", 6);
    let want = env.by_bag("A", "B", "Cbag");
    let job = gang_submit(&env, "A", "B", "C", 2, 1, 5000);
    let log = env.dir.path().join("stopped.log");
    let stopped = gang_slave(s, "stopped", &["--gang-fault", "stop:3"], Some(&log));
    // It takes a rank before the others start (it would stop as a rank only).
    let held = wait_for(Duration::from_secs(30), || env.holders(job).iter().any(|h| h.slave == "stopped").then_some(()));
    assert!(held.is_some(), "the slave to stop never took a rank");
    let others: Vec<Child> = (0..2).map(|k| gang_slave(s, &format!("s{k}"), &[], None)).collect();
    // The stop point: the process stops itself.
    let is_stopped = || std::fs::read_to_string(format!("/proc/{}/stat", stopped.id())).is_ok_and(|st| st.split(' ').nth(2) == Some("T"));
    assert!(wait_for(Duration::from_secs(60), || is_stopped().then_some(())).is_some(), "the rank never stopped");
    // The gang re-forms without it and the job ends.
    env.wait_ended(job, Duration::from_secs(120));
    assert!(env.formations(job) >= 2);
    assert!(env.holders(job).iter().all(|h| h.slave != "stopped"));
    kill(Pid::from_raw(stopped.id() as i32), Signal::SIGCONT).unwrap();
    let refused = wait_for(Duration::from_secs(30), || {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        l.contains("checkpoint refused").then_some(l)
    });
    assert!(refused.is_some(), "the late commit was not refused: {}", std::fs::read_to_string(&log).unwrap_or_default());
    assert!(env.export_bytes("C") == want, "the result differs from the clean bits");
    env.each_superstep_once(job, 2, 10);
    kill_child(stopped);
    others.into_iter().for_each(kill_child);
}

/// Test 4: fewer live slaves than ranks: the job waits and `master status`
/// says so; it completes once a slave joins. No slave is held: ranks go
/// back after the wait, and a plain job submitted behind runs meanwhile.
#[test]
fn fewer_slaves_than_ranks_waits_visibly_and_completes_when_one_joins() {
    let env = Env::start();
    let s = env.s();
    create_kind(s, "A", 130, 130, 32, "random", 7);
    create_kind(s, "B", 130, 130, 32, "random", 8);
    let want = env.by_bag("A", "B", "Cbag");
    let job = gang_submit(&env, "A", "B", "C", 3, 0, 1000);
    let mut slaves: Vec<Child> = (0..2).map(|k| gang_slave(s, &format!("s{k}"), &[], None)).collect();
    let waiting = wait_for(Duration::from_secs(30), || {
        let st = env.status(job);
        st.contains("waiting for slaves").then_some(st)
    });
    assert!(waiting.is_some(), "status never said it waits: {}", env.status(job));
    // A bag-of-tasks job behind it runs on the two slaves.
    let plain = env.submit(&["matmul", "A", "B", "--out", "Cplain"]);
    env.wait_ended(plain, Duration::from_secs(60));
    assert!(!env.ended(job));
    assert_eq!(env.formations(job), 0, "no gang of 3 can have formed");
    slaves.push(gang_slave(s, "s2", &[], None));
    env.wait_ended(job, Duration::from_secs(120));
    assert!(env.export_bytes("C") == want);
    env.each_superstep_once(job, 3, 5);
    slaves.into_iter().for_each(kill_child);
}

/// Test 5: garbage, a silent connection and a BSP hello with the wrong
/// token on a waiting rank's BSP port do not stop its gang forming.
#[test]
fn garbage_and_a_wrong_token_on_a_ranks_port_do_not_break_the_gang() {
    use std::io::Write;
    let env = Env::start();
    let s = env.s();
    create_kind(s, "A", 100, 100, 32, "random", 9);
    create_kind(s, "B", 100, 100, 32, "random", 10);
    let want = env.by_bag("A", "B", "Cbag");
    let job = gang_submit(&env, "A", "B", "C", 2, 0, 60_000);
    let first = gang_slave(s, "first", &[], None);
    let holder = wait_for(Duration::from_secs(30), || env.holders(job).into_iter().next()).expect("no rank held");
    eprintln!("rank held by {} at {}", holder.slave, holder.addr);
    let mut garbage = std::net::TcpStream::connect(&holder.addr).unwrap();
    garbage.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64)).unwrap();
    let _silent = std::net::TcpStream::connect(&holder.addr).unwrap();
    let closed = std::net::TcpStream::connect(&holder.addr).unwrap();
    drop(closed);
    // A real BSP process with the wrong token, as the peer of the other
    // rank: its hello is refused.
    let addr = holder.addr.clone();
    let intruder = std::thread::spawn(move || {
        let ep = bsp::Endpoint::bind("127.0.0.1:0").unwrap();
        let mine = ep.local_addr().to_string();
        let mut cfg = bsp::Config::new("not the token");
        cfg.setup_timeout = Duration::from_secs(3);
        // It claims the higher pid, so it connects to the rank.
        bsp::Bsp::connect(ep, &[addr, mine], 1, cfg).map(|_| ())
    });
    assert!(intruder.join().unwrap().is_err(), "a group formed with the wrong token");
    let second = gang_slave(s, "second", &[], None);
    env.wait_ended(job, Duration::from_secs(120));
    assert!(env.export_bytes("C") == want);
    assert_eq!(env.formations(job), 1, "the gang formed at the first try");
    kill_child(first);
    kill_child(second);
}
