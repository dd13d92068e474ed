//! The namespace tier: the whole system across network-namespace hosts
//! (`netns`), as on a network of workstations. The store node runs on host
//! 0, slaves and CLI calls on the others, over TCP with the cluster token,
//! on shaped links. Hosts share this machine's filesystem, so each test
//! also checks through the node's per-transport counters that clients on
//! other hosts took the network path and never the node's Unix sockets.
//!
//! Every test needs root (CI runs as root); without it each says
//! `skipped: needs root for network namespaces` and `scripts/test.sh`
//! fails a CI run whose log holds that line.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use job_record::{self as record, TaskDone};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use store_client::{Client, ClientTls, ConnectOptions, NodeStats, StoreError};
use support::{dies_with_test, kill_child, run_slaves_with_kill_points_by, runtime, slave_exe, wait_for, StoreProc};
use uuid::Uuid;

const TOKEN: &str = "namespace-tier-token";
const PORT: u16 = 7070;
const DATA_PORT: u16 = 7071;

fn master_exe() -> &'static str {
    env!("CARGO_BIN_EXE_master")
}

/// A store node on host 0 of `hosts`, and what clients need to reach it.
struct Tier {
    hosts: netns::Cluster,
    dir: tempfile::TempDir,
    store: Option<StoreProc>,
    serve_extra: Vec<String>,
    lease_ms: u64,
    /// Environment of every client process (address, token, TLS).
    env: Vec<(String, String)>,
    rt: tokio::runtime::Runtime,
}

impl Tier {
    /// `n` hosts at `rate`; `None` (the test printed `skipped`) without root.
    ///
    /// The test's own thread moves into the last host, so the checks'
    /// client (and the runtime's threads, made after) are a network client
    /// like any slave.
    fn start(n: usize, rate: Option<&str>) -> Option<Tier> {
        if netns::skip_unless_root() {
            return None;
        }
        let mut spec = netns::Spec::hosts(n);
        if let Some(r) = rate {
            spec = spec.rate(r.parse().expect("a tc rate"));
        }
        let hosts = netns::Cluster::create(spec).unwrap_or_else(|e| panic!("creating {n} namespace hosts: {e}"));
        hosts.enter(n - 1).expect("the test thread into a host");
        let mut t =
            Tier { hosts, dir: tempfile::tempdir().unwrap(), store: None, serve_extra: vec![], lease_ms: 1500, env: vec![], rt: runtime() };
        t.env = vec![("STORE_ADDR".into(), t.addr()), ("STORE_TOKEN".into(), TOKEN.into())];
        Some(t)
    }

    fn addr(&self) -> String {
        format!("{}:{PORT}", self.hosts.addr(0))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `master serve` on host 0 at fixed ports, with the token.
    fn start_store(&mut self) {
        let ip = self.hosts.addr(0);
        let data = self.path("store");
        let mut cmd = self.hosts.command(0, master_exe());
        cmd.args(["serve", "--data", data.to_str().unwrap(), "--token", TOKEN, "--lease-ms", &self.lease_ms.to_string()])
            .args(["--listen", &format!("{ip}:{PORT}"), "--data-listen", &format!("{ip}:{DATA_PORT}")])
            .args(&self.serve_extra);
        self.store = Some(StoreProc::spawn(&mut cmd));
    }

    fn kill_store(&mut self) {
        if let Some(mut s) = self.store.take() {
            s.kill9();
        }
    }

    /// `master ARGS` on `host`.
    fn master(&self, host: usize, args: &[&str]) -> Output {
        self.hosts
            .command(host, master_exe())
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "warn")
            .output()
            .expect("run master")
    }

    fn master_ok(&self, host: usize, args: &[&str]) -> String {
        let out = self.master(host, args);
        assert!(out.status.success(), "master {args:?} on host {host} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A slave on `host`, logging at info level to `<dir>/<name>.log`.
    fn slave(&self, host: usize, name: &str, extra: &[&str]) -> Child {
        dies_with_test(&mut self.hosts.command(host, slave_exe().to_str().unwrap()))
            .args(["--name", name])
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log(name)).unwrap())
            .spawn()
            .expect("spawn slave")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.log"))
    }

    /// A client in this (the test's) thread, on the last host (over TLS
    /// once the clients' environment names the CA).
    fn client(&self) -> Client {
        let ca = self.env.iter().find(|(k, _)| k == "STORE_TLS_CA").map(|(_, v)| ClientTls::from_files(Path::new(v), None, None).unwrap());
        let options = ConnectOptions { token: Some(TOKEN.into()), tls: ca, ..ConnectOptions::default() };
        self.rt.block_on(Client::connect_with_retrying(&self.addr(), &options, Some(Duration::from_secs(30)))).expect("test client")
    }

    fn stats(&self) -> NodeStats {
        self.rt.block_on(self.client().node_stats()).unwrap()
    }

    fn submit(&self, host: usize, args: &[&str]) -> Uuid {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        self.master_ok(host, &full).parse().expect("the job id alone on stdout")
    }

    /// `master wait JOB` on `host`, in the background.
    fn wait_in_background(&self, host: usize, job: Uuid) -> Child {
        dies_with_test(&mut self.hosts.command(host, master_exe()))
            .args(["wait", &job.to_string(), "--patience-s", "60"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn done(&self, client: &Client, job: Uuid) -> Vec<(String, TaskDone)> {
        self.rt
            .block_on(client.scan_small(&record::done_prefix(job), 0))
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, serde_json::from_slice(&v).unwrap()))
            .collect()
    }

    /// Every task of `job` has one done record, committed once.
    fn assert_each_task_once(&self, job: Uuid) -> Vec<(String, TaskDone)> {
        let client = self.client();
        let rec: record::JobRecord =
            serde_json::from_slice(&self.rt.block_on(client.peek_small(&record::job_key(job))).unwrap().expect("job record")).unwrap();
        let done = self.done(&client, job);
        assert_eq!(done.len(), rec.total_tasks(), "job {job}: {} task records of {}", done.len(), rec.total_tasks());
        for (k, d) in &done {
            assert_eq!(d.count, 1, "{k} committed {} times", d.count);
        }
        done
    }

    /// `master verify JOB` on `host` must pass (an in-core computation of
    /// the same result, made by the CLI).
    fn verify_ok(&self, host: usize, job: Uuid) {
        let out = self.master(host, &["verify", &job.to_string()]);
        assert!(out.status.success(), "verify {job}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        // Processes first, then the namespaces (the cluster's own drop).
        self.kill_store();
    }
}

/// Waits for a background `master wait`; it must succeed within `limit`.
fn wait_succeeded(mut child: Child, job: Uuid, limit: Duration) {
    let ok = wait_for(limit, || child.try_wait().unwrap());
    let Some(status) = ok else {
        kill_child(child);
        panic!("job {job} did not end within {limit:?}");
    };
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "job {job} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

fn seed() -> u64 {
    std::env::var("FT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(11)
}

/// No client on another host reached the node through its Unix sockets.
fn assert_network_path_only(t: &Tier) {
    let s = t.stats();
    assert_eq!((s.unix_sessions, s.data_unix_connections), (0, 0), "a client on another host took the node's Unix sockets: {s:?}");
    assert!(s.tcp_sessions > 0 && s.data_tcp_connections > 0, "{s:?}");
}

// ---------------------------------------------------------------------------

/// Every app on 4 hosts (store on host 0, slaves on 1–3), over TCP with the
/// token on 1 Gbit/s links, while slaves die at seeded kill points; each
/// result checked by `master verify`, each task committed once.
#[test]
fn every_app_runs_across_hosts_while_slaves_are_killed() {
    let Some(mut t) = Tier::start(4, Some("1gbit")) else { return };
    t.start_store();
    let (n, b) = ("256", "64");
    for (name, kind, seed) in
        [("A", "random", "1"), ("B", "random", "2"), ("S", "spd", "3"), ("D", "diag-dominant", "4"), ("R", "random", "5")]
    {
        t.master_ok(1, &["matrix", "create", name, "--n", n, "--block", b, "--kind", kind, "--seed", seed]);
    }
    let jobs: Vec<Vec<&str>> = vec![
        vec!["matmul", "A", "B", "--out", "C"],
        vec!["cholesky", "S", "--out", "L1", "--variant", "single-bag"],
        vec!["cholesky", "S", "--out", "L2", "--variant", "multi-step-1"],
        vec!["cholesky", "S", "--out", "L3", "--variant", "multi-step-2"],
        vec!["cholesky", "S", "--out", "L4", "--variant", "dag"],
        vec!["lu", "D", "--out", "LU1"],
        vec!["lu", "R", "--out", "LU2", "--pivot"],
        vec!["raytrace", "--level", "2", "--width", "96", "--height", "64", "--grain", "16", "--out", "balls"],
    ];
    let mut kills = 0;
    for (k, args) in jobs.iter().enumerate() {
        let job = t.submit(1 + k % 3, args);
        let waiter = t.wait_in_background(2, job);
        let mut waiter = Some(waiter);
        let mut ended = false;
        let start = Instant::now();
        let fired = run_slaves_with_kill_points_by(
            |i, extra| t.slave(1 + i % 3, &format!("{}-{k}-{i}", args[0]), extra),
            3,
            2,
            seed() + k as u64,
            || {
                assert!(start.elapsed() < Duration::from_secs(120), "job {args:?} stalled");
                if !ended {
                    ended = waiter.as_mut().unwrap().try_wait().unwrap().is_some();
                }
                ended
            },
        );
        wait_succeeded(waiter.take().unwrap(), job, Duration::from_secs(5));
        kills += fired.len();
        t.verify_ok(3, job);
        let done = t.assert_each_task_once(job);
        eprintln!("{args:?}: {} tasks, kills at {fired:?}", done.len());
    }
    assert!(kills >= jobs.len(), "only {kills} kills landed across {} jobs", jobs.len());
    assert_network_path_only(&t);
}

/// A slave host's link goes down mid-task: its lease lapses, its task is
/// redone elsewhere and the job completes. When the link comes back, the
/// slave's late commit is refused (fenced) and it rejoins as a new session.
#[test]
fn a_partitioned_slave_is_fenced_and_rejoins_as_a_new_session() {
    let Some(mut t) = Tier::start(3, Some("1gbit")) else { return };
    // Long enough that the stop below (a moment, to land the cut mid-task)
    // lets no lease lapse: the cut must be what ends the session.
    t.lease_ms = 4000;
    t.start_store();
    t.master_ok(2, &["matrix", "create", "A", "--n", "256", "--block", "64", "--kind", "random", "--seed", "1"]);
    t.master_ok(2, &["matrix", "create", "B", "--n", "256", "--block", "64", "--kind", "random", "--seed", "2"]);
    // The cut slave freezes after computing its first task, before its
    // writes and commit, so the cut lands mid-task whatever the timing.
    let mut cut = t.slave(1, "cut", &["--stop-at", "computed:1"]);
    let pid = Pid::from_raw(cut.id() as i32);
    let job = t.submit(2, &["matmul", "A", "B", "--out", "C"]);
    let frozen = wait_for(Duration::from_secs(60), || is_stopped(cut.id()).then_some(()));
    assert!(frozen.is_some(), "the slave never reached its stop point");
    let session_before = session_of(&t, "cut");
    t.hosts.cut_link(1).unwrap();
    kill(pid, Signal::SIGCONT).unwrap();
    // It runs on, cut off: its puts and commit are in the cable.
    let waiter = t.wait_in_background(2, job);
    let other = t.slave(2, "other", &[]);
    wait_succeeded(waiter, job, Duration::from_secs(120));
    t.hosts.restore_link(1).unwrap();
    let rejoined = wait_for(Duration::from_secs(60), || session_of(&t, "cut").filter(|s| Some(*s) != session_before));
    assert!(rejoined.is_some(), "the cut slave did not rejoin as a new session (before: {session_before:?})");
    // Its late requests reach the node once the link is back, and are
    // refused: its commit or puts as of an aborted action, or whatever it
    // sent first as of an expired session (typed errors from the node;
    // a transport failure would read "unavailable").
    let fenced = wait_for(Duration::from_secs(60), || {
        let log = std::fs::read_to_string(t.log("cut")).unwrap();
        ["not committed", "goes back to the bag", "has expired", "was aborted"].iter().any(|n| log.contains(n)).then_some(())
    });
    assert!(fenced.is_some(), "the cut slave's late task was not refused:\n{}", std::fs::read_to_string(t.log("cut")).unwrap());
    t.assert_each_task_once(job);
    t.verify_ok(2, job);
    kill_child(other);
    let _ = cut.kill();
    let _ = cut.wait();
    assert_network_path_only(&t);
}

/// Whether process `pid` is stopped (state `T`).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('T')))
        .unwrap_or(false)
}

/// The live session of the slave called `name`, from `master slaves`.
fn session_of(t: &Tier, name: &str) -> Option<u64> {
    let out = t.master(2, &["slaves"]);
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let session = w.next()?.parse().ok()?;
        (w.next()? == name).then_some(session)
    })
}

/// The store host cut off and restored, then the store node SIGKILLed and
/// restarted, both mid-job: slaves on the other hosts reconnect by
/// themselves and the job completes with the right result.
#[test]
fn slaves_ride_through_the_store_host_cut_off_and_the_node_killed() {
    let Some(mut t) = Tier::start(4, Some("1gbit")) else { return };
    t.start_store();
    t.master_ok(1, &["matrix", "create", "S", "--n", "512", "--block", "64", "--kind", "spd", "--seed", "3"]);
    let job = t.submit(1, &["cholesky", "S", "--out", "L", "--variant", "dag"]);
    let slaves: Vec<Child> = (1..4).map(|h| t.slave(h, &format!("s{h}"), &[])).collect();
    // A client of its own each time: the cut ends the connections of the
    // time, the test's too.
    let done = || t.done(&t.client(), job).len();
    let progress = |n: usize| {
        let reached = wait_for(Duration::from_secs(60), || (done() >= n).then_some(()));
        assert!(reached.is_some(), "job {job} stalled before {n} tasks");
    };
    progress(5);
    t.hosts.cut_link(0).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    t.hosts.restore_link(0).unwrap();
    let after_cut = done();
    progress(after_cut + 5);
    t.kill_store();
    t.start_store();
    let waiter = t.wait_in_background(3, job);
    wait_succeeded(waiter, job, Duration::from_secs(180));
    t.verify_ok(1, job);
    t.assert_each_task_once(job);
    slaves.into_iter().for_each(kill_child);
}

/// Where the node uses TLS, slaves with a certificate of their own
/// (`master certs --peer-host`) hand each other blocks over TLS: a second
/// job's inputs come from the first job's slave, none from the store, the
/// product exact. A slave without one says peers are off and reads from
/// the store.
#[test]
fn slaves_hand_each_other_blocks_over_tls_where_the_node_uses_it() {
    let Some(mut t) = Tier::start(4, None) else { return };
    let certs = t.path("certs");
    let (node_ip, peer_ips) = (t.hosts.addr(0).to_string(), format!("{},{}", t.hosts.addr(1), t.hosts.addr(2)));
    let out = Command::new(master_exe())
        .args(["certs", "--out", certs.to_str().unwrap(), "--host", &node_ip, "--peer-host", &peer_ips])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pem = |f: &str| certs.join(f).to_str().unwrap().to_owned();
    t.serve_extra = vec!["--tls-cert".into(), pem("node.pem"), "--tls-key".into(), pem("node-key.pem")];
    t.start_store();
    t.env.push(("STORE_TLS_CA".into(), pem("ca.pem")));
    t.master_ok(1, &["matrix", "create", "A", "--n", "256", "--block", "64", "--seed", "1"]);
    t.master_ok(1, &["matrix", "create", "B", "--n", "256", "--block", "64", "--seed", "2"]);
    let peer_tls = ["--peer-tls-cert".to_owned(), pem("peer.pem"), "--peer-tls-key".to_owned(), pem("peer-key.pem")];
    let run = |host: usize, name: &str, out: &str, tls: bool| {
        let job = t.submit(3, &["matmul", "A", "B", "--out", out]);
        let job_s = job.to_string();
        let mut extra: Vec<&str> = vec!["--job", &job_s];
        if tls {
            extra.extend(peer_tls.iter().map(String::as_str));
        }
        let slave = t.slave(host, name, &extra);
        wait_succeeded(t.wait_in_background(3, job), job, Duration::from_secs(120));
        t.verify_ok(3, job);
        let done = t.assert_each_task_once(job);
        (slave, record::ReadSources::of(done.iter().map(|(_, d)| d)))
    };
    // Host 1 reads every input of the first job and keeps serving them.
    let (peer, first) = run(1, "peer", "C1", true);
    assert!(first.store > 0, "{first:?}");
    let (reader, second) = run(2, "reader", "C2", true);
    assert!(second.peers > 0 && second.store == 0, "every input of the second job from the peer, over TLS: {second:?}");
    // Without a certificate of its own: no peers, and it says so.
    let (plain, third) = run(2, "plain", "C3", false);
    assert!(third.peers == 0 && third.store > 0, "{third:?}");
    let log = std::fs::read_to_string(t.log("plain")).unwrap();
    assert!(log.contains("slave-to-slave transfer is off"), "{log}");
    [peer, reader, plain].into_iter().for_each(kill_child);
}

/// A TLS node with the token: no token, a wrong token, plaintext, and a
/// client that does not trust its certificate are each refused with a clear
/// error on both ports, while a good client keeps working; and serving a
/// LAN address without a token refuses to start.
#[test]
fn the_node_refuses_what_is_not_its_cluster_on_every_port() {
    let Some(mut t) = Tier::start(3, None) else { return };
    let certs = t.path("certs");
    let other = t.path("other-ca");
    let ip = t.hosts.addr(0).to_string();
    for (dir, host) in [(&certs, ip.as_str()), (&other, ip.as_str())] {
        let out = Command::new(master_exe()).args(["certs", "--out", dir.to_str().unwrap(), "--host", host]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let pem = |d: &Path, f: &str| d.join(f).to_str().unwrap().to_owned();
    // Without a token on a LAN address: refused, saying why.
    let open = t
        .hosts
        .command(0, master_exe())
        .args(["serve", "--data", t.path("open").to_str().unwrap(), "--listen", &format!("{ip}:7090")])
        .output()
        .unwrap();
    assert!(!open.status.success() && String::from_utf8_lossy(&open.stderr).contains("without a cluster token"), "{open:?}");

    t.serve_extra = vec!["--tls-cert".into(), pem(&certs, "node.pem"), "--tls-key".into(), pem(&certs, "node-key.pem")];
    t.start_store();
    t.env.push(("STORE_TLS_CA".into(), pem(&certs, "ca.pem")));
    // A good client, on another host, over TLS: a job runs.
    t.master_ok(1, &["matrix", "create", "A", "--n", "128", "--block", "64", "--seed", "1"]);
    let good = t.slave(1, "good", &[]);

    let refused = |env: &[(&str, &str)], needle: &str| {
        let out = t
            .hosts
            .command(2, master_exe())
            .args(["matrix", "list", "--patience-s", "2"])
            .env_clear()
            .env("STORE_ADDR", t.addr())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "expected {needle:?}, got: {err}");
        assert!(!err.contains("is `master serve` running"), "a refusal reads as an outage: {err}");
    };
    let ca = pem(&certs, "ca.pem");
    refused(&[("STORE_TLS_CA", &ca)], "needs the cluster token");
    refused(&[("STORE_TLS_CA", &ca), ("STORE_TOKEN", "wrong")], "wrong cluster token");
    refused(&[("STORE_TOKEN", TOKEN)], "TLS");
    refused(&[("STORE_TLS_CA", &pem(&other, "ca.pem")), ("STORE_TOKEN", TOKEN)], "not trusted");

    // The data plane by itself: a plaintext hello to the TLS port is told
    // so in plaintext; over TLS a missing or wrong token is refused by
    // name; a client of another CA fails its handshake.
    let data = format!("{ip}:{DATA_PORT}");
    let hello = |token: &str| store_client::dataplane::wire::encode_hello(token.as_bytes());
    let answer = t.rt.block_on(data_plane_exchange(&data, None, hello(TOKEN))).unwrap();
    assert!(String::from_utf8_lossy(&answer).contains("requires TLS"), "plaintext hello answered {answer:?}");
    for (token, needle) in [("", "needs the cluster token"), ("wrong", "wrong cluster token")] {
        let answer = t.rt.block_on(data_plane_exchange(&data, Some(&certs.join("ca.pem")), hello(token))).unwrap();
        let e = StoreError::from_detail(&answer[store_client::dataplane::wire::REPLY_LEN..]);
        assert!(matches!(&e, StoreError::Unauthenticated { what } if what.contains(needle)), "{token:?}: {e}");
    }
    let e = t.rt.block_on(data_plane_exchange(&data, Some(&other.join("ca.pem")), hello(TOKEN))).unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    let rt = &t.rt;

    let good_options = |ca: &Path| ConnectOptions {
        token: Some(TOKEN.into()),
        tls: Some(ClientTls::from_files(ca, None, None).unwrap()),
        ..ConnectOptions::default()
    };
    let c = rt.block_on(Client::connect_with(&t.addr(), &good_options(&certs.join("ca.pem")))).expect("a trusting client connects");
    assert!(c.has_data_plane() && !c.blocks_locally());
    let e =
        rt.block_on(Client::connect_with(&t.addr(), &good_options(&other.join("ca.pem")))).err().expect("an untrusting client is refused");
    assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");

    // Blocks larger than a socket's buffers cross TLS whole both ways (a
    // TLS session holds back what it could not send until a flush).
    t.master_ok(1, &["matrix", "create", "Big", "--n", "1024", "--block", "1024", "--kind", "random", "--seed", "9"]);
    let exported = t.path("big.npy");
    t.master_ok(1, &["matrix", "export", "Big", exported.to_str().unwrap()]);
    assert!(std::fs::metadata(&exported).unwrap().len() > 8 << 20, "an 8 MiB block exported over TLS");

    // The node still serves: a job runs to the end over TLS.
    let job = t.submit(1, &["matmul", "A", "A", "--out", "C"]);
    wait_succeeded(t.wait_in_background(1, job), job, Duration::from_secs(60));
    t.verify_ok(1, job);
    let s = rt.block_on(c.node_stats()).unwrap();
    assert!(s.tls && s.refused_connections >= 4, "{s:?}");
    kill_child(good);
}

/// Sends `hello` to a data port, over TLS trusting `ca` if given, and
/// returns all the node answered before it closed; `Err` for a failed TLS
/// handshake.
async fn data_plane_exchange(addr: &str, ca: Option<&Path>, hello: Vec<u8>) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    async fn exchange(mut s: impl AsyncRead + AsyncWrite + Unpin, hello: &[u8]) -> Vec<u8> {
        s.write_all(hello).await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        buf
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let Some(ca) = ca else { return Ok(exchange(tcp, &hello).await) };
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut std::fs::read(ca).unwrap().as_slice()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(addr.rsplit_once(':').unwrap().0.to_owned()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
    Ok(exchange(tls, &hello).await)
}

/// A slave of another build (its wire version simulated) is told the two
/// versions and exits, rather than retrying for ever.
#[test]
fn a_slave_of_another_build_is_told_so() {
    let Some(mut t) = Tier::start(2, None) else { return };
    t.start_store();
    let mut cmd = t.hosts.command(1, slave_exe().to_str().unwrap());
    let other = dies_with_test(&mut cmd)
        .envs(t.env.iter().map(|(k, v)| (k, v)))
        .env("FTBAG_SIMULATE_WIRE_VERSION", "7")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(other.wait_with_output());
    });
    let out = rx.recv_timeout(Duration::from_secs(30)).expect("the slave of another build hung").unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("different builds") && err.contains("version 7"), "{err}");

    // And the data plane answers such a hello in words, not by hanging up.
    let data = format!("{}:{DATA_PORT}", t.hosts.addr(0));
    let mut hello = store_client::dataplane::wire::encode_hello(TOKEN.as_bytes());
    hello[4..6].copy_from_slice(&7u16.to_le_bytes());
    let answer = t.rt.block_on(data_plane_exchange(&data, None, hello)).unwrap();
    let e = StoreError::from_detail(&answer[store_client::dataplane::wire::REPLY_LEN..]);
    assert!(matches!(e, StoreError::IncompatibleBuild { client: 7, .. }), "{e}");
}

/// The local fast path is decided by the node's host, not by a loopback
/// address: a client on host 0 that names the node by its LAN address takes
/// the Unix sockets, one on another host does not, and `--no-local` forces
/// the network path on host 0.
#[test]
fn the_local_path_is_taken_on_the_nodes_host_whatever_its_address() {
    let Some(mut t) = Tier::start(2, None) else { return };
    t.start_store();
    let before = t.stats();
    t.master_ok(0, &["matrix", "list"]);
    let local = t.stats();
    assert_eq!(local.data_unix_connections, before.data_unix_connections + 1, "host 0's client did not take the Unix socket: {local:?}");
    t.master_ok(0, &["matrix", "list", "--no-local"]);
    t.master_ok(1, &["matrix", "list"]);
    let after = t.stats();
    assert_eq!(after.data_unix_connections, local.data_unix_connections, "{after:?}");
    // Two network clients, and the test's own one per `stats`.
    assert!(after.data_tcp_connections >= local.data_tcp_connections + 2, "{after:?}");
    // Blocks over gRPC, for a site that opens one port: no data plane at all.
    t.master_ok(1, &["matrix", "create", "G", "--n", "128", "--block", "64", "--blocks-over", "grpc"]);
    let grpc = t.stats();
    assert_eq!(grpc.data_tcp_connections, after.data_tcp_connections + 1, "only the test's own client's: {grpc:?}");
    let out = t.master_ok(1, &["matrix", "info", "G", "--blocks-over", "grpc"]);
    assert!(out.contains("128"), "{out}");
}
