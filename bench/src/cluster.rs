//! A harness that runs the real system as processes, for benchmarks that
//! measure it end to end (`bench ooc`, `bench raytrace`, and later `bench
//! validate` / `bench recovery`).
//!
//! A [`Cluster`] is one `master serve` store node on a fresh data directory
//! plus S `slave` processes (each with `OPENBLAS_NUM_THREADS=1`), all
//! found next to the bench executable. Matrices are created and jobs
//! submitted through the `master` CLI, exactly as a user would; progress is
//! read through the store client (the job records the slaves write), so
//! job times come from the store's own timestamps, not from polling.
//!
//! ```ignore
//! let mut c = Cluster::start(ClusterConfig { slaves: 2, cache_mib: 1024, ..Default::default() })?;
//! c.create_matrix("A", 4096, 512, "random", 1)?;
//! c.create_matrix("B", 4096, 512, "random", 2)?;
//! c.reset_peaks();                         // VmHWM and I/O counters from here on
//! let before = c.snapshot();
//! let job = c.submit(&["matmul", "A", "B", "--out", "C"])?;
//! let r = c.wait(job, Duration::from_secs(600))?;   // JobResult: seconds, GFLOP/s, tasks, redone…
//! let after = c.snapshot();                // per-process peak RSS, bytes read/written
//! c.kill_slave(0)?; c.spawn_slave()?;      // SIGKILL one, start a replacement
//! assert!(c.verify(job)?.0);
//! // drop(c): every process is killed, the data directory removed.
//! ```
//!
//! Everything is blocking: the harness owns a small tokio runtime for its
//! store-client calls, so callers need no async.
//!
//! Where the processes run is one choice, [`Placement`]: all on this host
//! (the node on 127.0.0.1, slaves taking its Unix sockets), or across
//! network-namespace hosts ([`HostsPlacement`]: the node on host 0 at fixed
//! ports with a token, slaves on hosts 1..N-1 round robin, the CLI on the
//! placement's `cli_host`). Across hosts the harness must be started and
//! used from a thread that entered a host ([`on_host`]): its own client,
//! and the runtime threads it makes, are then that host's.

// The API serves several benches; not each uses every part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use job_record::{self as record, JobRecord, TaskDone, TaskTimes};
use store_client::{Client, ConnectOptions};
use uuid::Uuid;

/// How to start a cluster.
#[derive(Clone, Debug)]
pub(crate) struct ClusterConfig {
    /// Slave processes started with the store node.
    pub(crate) slaves: usize,
    /// The store node's RocksDB block cache (`--cache-mib`).
    pub(crate) cache_mib: usize,
    /// Parent of the store's data directory (a fresh temporary directory is
    /// made inside it and removed on drop). Default: `~/.cache/ftbag-bench`,
    /// on the same disk as the rest of the benchmark's files.
    pub(crate) base_dir: Option<PathBuf>,
    /// Extra arguments for `master serve` (e.g. `--lease-ms 1000`).
    pub(crate) serve_args: Vec<String>,
    /// Extra arguments for every `slave` (e.g. `--compute idle`).
    pub(crate) slave_args: Vec<String>,
    /// Where the processes run.
    pub(crate) placement: Placement,
    /// A memory cgroup the store node and every slave join as they start
    /// (`bench ooc --mem-cap`); on one host only.
    pub(crate) cgroup: Option<crate::cgroup::Joiner>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            slaves: 2,
            cache_mib: 1024,
            base_dir: None,
            serve_args: Vec::new(),
            slave_args: Vec::new(),
            placement: Placement::Local,
            cgroup: None,
        }
    }
}

/// Where a cluster's processes run.
#[derive(Clone, Debug, Default)]
pub(crate) enum Placement {
    /// All on this host: the node on 127.0.0.1 (a port the OS picks), and
    /// clients on its host take its Unix sockets.
    #[default]
    Local,
    /// Across network-namespace hosts, over TCP with a token.
    Hosts(HostsPlacement),
}

/// The store node on host 0 (`--listen` [`GRPC_PORT`] and `--data-listen`
/// [`DATA_PORT`] on its address, `--token`), each new slave on the slave
/// host (1..N-1) with the fewest live slaves, `master` calls on `cli_host`.
#[derive(Clone, Debug)]
pub(crate) struct HostsPlacement {
    pub(crate) hosts: Arc<netns::Cluster>,
    pub(crate) token: String,
    pub(crate) cli_host: usize,
    /// Slaves go to hosts 1..=`last_slave_host` (the rest hold other
    /// services, such as storage daemons).
    pub(crate) last_slave_host: usize,
}

/// The node's fixed ports across hosts (what a firewall would open).
pub(crate) const GRPC_PORT: u16 = 7070;
pub(crate) const DATA_PORT: u16 = 7071;

impl HostsPlacement {
    /// The node's gRPC address.
    pub(crate) fn store_addr(&self) -> String {
        format!("{}:{GRPC_PORT}", self.hosts.addr(0))
    }

    /// `n` namespace hosts whose links run at `rate` both ways (`none`:
    /// unshaped), a fresh token, the CLI on the last host.
    pub(crate) fn create(n: usize, rate: &str) -> anyhow::Result<HostsPlacement> {
        anyhow::ensure!(n >= 2, "--hosts {n}: needs at least two hosts, the store node's and a slave's");
        let mut spec = netns::Spec::hosts(n);
        if rate != "none" {
            spec = spec.rate(rate.parse().with_context(|| format!("--rate {rate}"))?);
        }
        let hosts = Arc::new(netns::Cluster::create(spec).context("creating the namespace hosts (needs root)")?);
        let token = rand::Rng::sample_iter(rand::thread_rng(), &rand::distributions::Alphanumeric).take(24).map(char::from).collect();
        Ok(HostsPlacement { hosts, token, cli_host: n - 1, last_slave_host: n - 1 })
    }

    /// The slave host (1..N-1) with the fewest of `live` (the hosts of
    /// the live slaves), the lowest on a tie: a replacement goes where a
    /// slave was lost, and up to N-1 slaves each get a host of their own.
    pub(crate) fn next_slave_host(&self, live: impl Iterator<Item = usize>) -> usize {
        let mut count = vec![0usize; self.hosts.hosts()];
        for h in live {
            count[h] += 1;
        }
        (1..=self.last_slave_host.min(self.hosts.hosts() - 1)).min_by_key(|&h| (count[h], h)).unwrap_or(0)
    }
}

/// Runs `f` on a thread of its own moved into host `host` of `hosts` (for
/// good: the thread ends with `f`), so the sockets it and the threads it
/// starts open are that host's.
pub(crate) fn on_host<T: Send>(hosts: &netns::Cluster, host: usize, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            hosts.enter(host).with_context(|| format!("moving a thread into host {host}"))?;
            f()
        })
        .join()
        .unwrap_or_else(|_| bail!("the thread on host {host} panicked"))
    })
}

extern "C" {
    fn sysconf(name: std::ffi::c_int) -> std::ffi::c_long;
}
const SC_CLK_TCK: std::ffi::c_int = 2;

/// Peak RSS and I/O counters of one process, read from `/proc`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProcStats {
    pub(crate) pid: u32,
    /// VmHWM: peak resident set since start or the last [`Cluster::reset_peaks`].
    pub(crate) peak_rss: u64,
    /// VmRSS now.
    pub(crate) rss: u64,
    /// Bytes the process caused to be read from storage (page-cache hits excluded).
    pub(crate) read_bytes: u64,
    /// Bytes the process caused to be written to storage.
    pub(crate) write_bytes: u64,
    /// CPU time (user + system) so far, seconds: unlike wall time, barely
    /// moved by other work on a shared machine.
    pub(crate) cpu_s: f64,
}

impl ProcStats {
    /// Reads `/proc/PID/status` and `/proc/PID/io`; `None` if the process is gone.
    pub(crate) fn read(pid: u32) -> Option<ProcStats> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
        let field = |text: &str, name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Some(ProcStats {
            pid,
            peak_rss: field(&status, "VmHWM:") * 1024,
            rss: field(&status, "VmRSS:") * 1024,
            read_bytes: field(&io, "read_bytes:"),
            write_bytes: field(&io, "write_bytes:"),
            cpu_s: cpu_seconds(pid),
        })
    }
}

/// CPU seconds (user + system) a process used so far, from
/// `/proc/PID/stat`; 0 if it is gone.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) end with ')';
    // utime and stime are the 14th and 15th fields, in clock ticks.
    let ticks: f64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { sysconf(SC_CLK_TCK) }.max(1) as f64
}

/// The store node's and every live slave's stats at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) store: ProcStats,
    pub(crate) slaves: Vec<ProcStats>,
    /// Bytes received on the loopback interface (whole machine): the
    /// transfer volume between store node and slaves.
    pub(crate) loopback_bytes: u64,
    /// Across hosts: each host's link counters (host 0 is the store's).
    pub(crate) links: Vec<netns::LinkBytes>,
}

impl Snapshot {
    /// Storage bytes read / written by the store node between `self` and `later`.
    pub(crate) fn store_io_since(&self, later: &Snapshot) -> (u64, u64) {
        (later.store.read_bytes.saturating_sub(self.store.read_bytes), later.store.write_bytes.saturating_sub(self.store.write_bytes))
    }

    /// CPU seconds of the store node and of all slaves (by position) between `self` and `later`.
    pub(crate) fn cpu_since(&self, later: &Snapshot) -> (f64, f64) {
        let slaves = |s: &Snapshot| s.slaves.iter().map(|p| p.cpu_s).sum::<f64>();
        (later.store.cpu_s - self.store.cpu_s, slaves(later) - slaves(self))
    }

    pub(crate) fn loopback_since(&self, later: &Snapshot) -> u64 {
        later.loopback_bytes.saturating_sub(self.loopback_bytes)
    }

    /// Across hosts: bytes each host's link carried between `self` and
    /// `later`, as the host saw them (empty on one host).
    pub(crate) fn links_since(&self, later: &Snapshot) -> Vec<netns::LinkBytes> {
        self.links
            .iter()
            .zip(&later.links)
            .map(|(a, b)| netns::LinkBytes { rx: b.rx.saturating_sub(a.rx), tx: b.tx.saturating_sub(a.tx) })
            .collect()
    }
}

/// What a finished job measured.
#[derive(Clone, Debug)]
pub(crate) struct JobResult {
    pub(crate) id: Uuid,
    pub(crate) app: String,
    /// "succeeded" or "failed".
    pub(crate) state: String,
    /// Submit to the store's finished record (the slaves' own timestamps).
    pub(crate) seconds: f64,
    pub(crate) flops: f64,
    pub(crate) tasks: usize,
    /// Tasks whose committed run came after an orphaned one.
    pub(crate) redone: usize,
    /// Tasks committed more than once (must be 0).
    pub(crate) duplicates: usize,
    /// Sum over tasks of dequeue-to-commit time, seconds.
    pub(crate) task_seconds: f64,
    /// Where the tasks' time went (kernels, waits), from their records.
    pub(crate) times: TaskTimes,
    /// Block bytes the tasks read, by where they came from.
    pub(crate) reads: record::ReadSources,
    pub(crate) failure: Option<String>,
}

impl JobResult {
    pub(crate) fn gflops(&self) -> f64 {
        self.flops / self.seconds.max(1e-9) / 1e9
    }

    pub(crate) fn ok(&self) -> bool {
        self.state == "succeeded" && self.duplicates == 0
    }
}

struct SlaveProc {
    name: String,
    child: Child,
    /// Its namespace host; `None` on one host.
    host: Option<usize>,
}

/// A running store node and its slaves. Dropping it kills every process
/// and removes the data directory.
pub(crate) struct Cluster {
    bin: PathBuf,
    rt: tokio::runtime::Runtime,
    client: Client,
    addr: String,
    dir: tempfile::TempDir,
    store: Child,
    config: ClusterConfig,
    slaves: Vec<SlaveProc>,
    /// Slaves stopped with SIGSTOP ([`Cluster::stop_slave`]).
    stopped: Vec<SlaveProc>,
    started: usize,
}

/// The directory holding `master` and `slave`: the bench executable's own.
pub(crate) fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the bench executable")?;
    let dir = exe.parent().context("bench executable has no directory")?.to_owned();
    for name in ["master", "slave"] {
        if !dir.join(name).exists() {
            bail!(
                "{} is missing: build the binaries together with `cargo build --release -p master -p slave -p bench`",
                dir.join(name).display()
            );
        }
    }
    Ok(dir)
}

/// `~/.cache/ftbag-bench` (or `$TMPDIR` without a home): where benchmark
/// data goes by default, created if missing.
pub(crate) fn default_base_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("HOME").map_or_else(std::env::temp_dir, |h| PathBuf::from(h).join(".cache"));
    let dir = base.join("ftbag-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn loopback_rx_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix("lo:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Cluster {
    /// Starts `master serve` on a fresh directory (port chosen by the OS)
    /// and `config.slaves` slaves; returns once the node accepts clients.
    /// Where the processes run.
    pub(crate) fn placement(&self) -> &Placement {
        &self.config.placement
    }

    pub(crate) fn start(config: ClusterConfig) -> anyhow::Result<Cluster> {
        let bin = bin_dir()?;
        let base = match &config.base_dir {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                d.clone()
            }
            None => default_base_dir()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("cluster-")
            .tempdir_in(&base)
            .with_context(|| format!("making the store node's data directory in {}", base.display()))?;
        let (store, addr) = start_store(&bin, dir.path(), &config)?;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let client = rt
            .block_on(connect(&config.placement, &addr, Duration::from_secs(20)))
            .with_context(|| format!("connecting to the store node at {addr}"))?;
        let mut c = Cluster { bin, rt, client, addr, dir, store, config, slaves: Vec::new(), stopped: Vec::new(), started: 0 };
        for _ in 0..c.config.slaves {
            c.spawn_slave()?;
        }
        tracing::info!("cluster: store node on {} (data {}), {} slaves", c.addr, c.dir.path().display(), c.slaves.len());
        Ok(c)
    }

    /// Runs `f` with a client of the store node on the cluster's runtime.
    pub(crate) fn with_client<T, F: std::future::Future<Output = anyhow::Result<T>>>(
        &self,
        f: impl FnOnce(Client) -> F,
    ) -> anyhow::Result<T> {
        self.rt.block_on(f(self.client.clone()))
    }

    /// The store node's address.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The cluster's directory (store data under `store/`, process logs).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts one more slave; returns its index in [`Cluster::slave_pids`].
    pub(crate) fn spawn_slave(&mut self) -> anyhow::Result<usize> {
        self.started += 1;
        let name = format!("slave-{}", self.started);
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log")))?;
        let host = match &self.config.placement {
            Placement::Local => None,
            Placement::Hosts(h) => Some(h.next_slave_host(self.slaves.iter().filter_map(|s| s.host))),
        };
        let mut cmd = process(&self.config.placement, host, &self.bin.join("slave"));
        if let Some(g) = &self.config.cgroup {
            g.join_on_spawn(&mut cmd);
        }
        let child = cmd
            .args(["--store", &self.addr, "--name", &name])
            .args(&self.config.slave_args)
            .env("OPENBLAS_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.join("slave").display()))?;
        self.slaves.push(SlaveProc { name, child, host });
        Ok(self.slaves.len() - 1)
    }

    /// SIGKILLs slave `index` (its action aborts in the store once its
    /// session lapses) and forgets it; returns its pid.
    pub(crate) fn kill_slave(&mut self, index: usize) -> anyhow::Result<u32> {
        if index >= self.slaves.len() {
            bail!("no slave {index} (have {})", self.slaves.len());
        }
        let mut s = self.slaves.remove(index);
        let pid = s.child.id();
        s.child.kill().with_context(|| format!("killing {}", s.name))?;
        let _ = s.child.wait();
        Ok(pid)
    }

    /// SIGSTOPs slave `index` and sets it aside (no longer in
    /// [`Cluster::slave_pids`]) until [`Cluster::resume_slave`]; returns
    /// its pid.
    pub(crate) fn stop_slave(&mut self, index: usize) -> anyhow::Result<u32> {
        if index >= self.slaves.len() {
            bail!("no slave {index} (have {})", self.slaves.len());
        }
        let s = self.slaves.remove(index);
        let pid = s.child.id();
        signal(pid, nix::sys::signal::Signal::SIGSTOP).with_context(|| format!("stopping {}", s.name))?;
        self.stopped.push(s);
        Ok(pid)
    }

    /// SIGCONTs a slave [`Cluster::stop_slave`] stopped; it is a live
    /// slave again.
    pub(crate) fn resume_slave(&mut self, pid: u32) -> anyhow::Result<()> {
        let at = self.stopped.iter().position(|s| s.child.id() == pid).with_context(|| format!("no stopped slave {pid}"))?;
        let s = self.stopped.remove(at);
        signal(pid, nix::sys::signal::Signal::SIGCONT).with_context(|| format!("resuming {}", s.name))?;
        self.slaves.push(s);
        Ok(())
    }

    /// Pids of the live slaves, in start order.
    pub(crate) fn slave_pids(&self) -> Vec<u32> {
        self.slaves.iter().map(|s| s.child.id()).collect()
    }

    pub(crate) fn store_pid(&self) -> u32 {
        self.store.id()
    }

    /// SIGKILLs the store node (slaves keep running and reconnect).
    pub(crate) fn kill_store(&mut self) -> anyhow::Result<()> {
        self.store.kill()?;
        let _ = self.store.wait();
        Ok(())
    }

    /// Restarts the store node on the same data directory and address
    /// (after [`Cluster::kill_store`]); recovery runs as it starts.
    pub(crate) fn restart_store(&mut self) -> anyhow::Result<()> {
        let mut config = self.config.clone();
        if let Placement::Local = config.placement {
            config.serve_args.extend(["--listen".to_owned(), self.addr.clone()]);
        }
        let (store, addr) = start_store(&self.bin, self.dir.path(), &config)?;
        debug_assert_eq!(addr, self.addr);
        self.store = store;
        self.client = self.rt.block_on(connect(&self.config.placement, &self.addr, Duration::from_secs(30)))?;
        Ok(())
    }

    /// Resets the peak RSS (VmHWM) of the store node and every slave, so
    /// the next [`Cluster::snapshot`] shows the peak of what ran since.
    pub(crate) fn reset_peaks(&self) {
        for pid in std::iter::once(self.store.id()).chain(self.slave_pids()) {
            // "5" resets the peak RSS counter (proc(5), clear_refs).
            if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
                tracing::warn!("cannot reset the peak RSS of pid {pid}: {e}");
            }
        }
    }

    /// Peak RSS and I/O counters of every process now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            store: ProcStats::read(self.store.id()).unwrap_or_default(),
            slaves: self.slave_pids().into_iter().filter_map(ProcStats::read).collect(),
            loopback_bytes: loopback_rx_bytes(),
            links: match &self.config.placement {
                Placement::Local => Vec::new(),
                Placement::Hosts(h) => (0..h.hosts.hosts()).map(|i| h.hosts.link_bytes(i).unwrap_or_default()).collect(),
            },
        }
    }

    /// Runs `master ARGS --store ADDR`, returning its stdout; fails with
    /// its stderr if it exits non-zero.
    pub(crate) fn master(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .cli()
            .args(args)
            .args(["--store", &self.addr])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running master {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("master {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A `master` command where the CLI runs (its host, the token).
    fn cli(&self) -> Command {
        let host = match &self.config.placement {
            Placement::Local => None,
            Placement::Hosts(h) => Some(h.cli_host),
        };
        process(&self.config.placement, host, &self.bin.join("master"))
    }

    /// The host of slave `index` (in [`Cluster::slave_pids`]'s order);
    /// `None` on one host.
    pub(crate) fn slave_host(&self, index: usize) -> Option<usize> {
        self.slaves.get(index)?.host
    }

    /// `master matrix create NAME --n N --block B --kind KIND --seed S`.
    pub(crate) fn create_matrix(&self, name: &str, n: u64, block: u32, kind: &str, seed: u64) -> anyhow::Result<()> {
        let (n, b, s) = (n.to_string(), block.to_string(), seed.to_string());
        self.master(&["matrix", "create", name, "--n", &n, "--block", &b, "--kind", kind, "--seed", &s])?;
        Ok(())
    }

    /// `master matrix rm NAME`, ignoring a missing matrix.
    pub(crate) fn remove_matrix(&self, name: &str) {
        if let Err(e) = self.master(&["matrix", "rm", name]) {
            tracing::debug!("{e:#}");
        }
    }

    /// `master submit ARGS…`: returns the job id it prints.
    pub(crate) fn submit(&self, args: &[&str]) -> anyhow::Result<Uuid> {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        let out = self.master(&full)?;
        out.trim().parse().with_context(|| format!("master submit printed {out:?}, not a job id"))
    }

    /// `master verify JOB`: (passed, the line it printed).
    pub(crate) fn verify(&self, job: Uuid) -> anyhow::Result<(bool, String)> {
        let out = self.cli().args(["verify", &job.to_string(), "--store", &self.addr]).stdin(Stdio::null()).output()?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), text.trim().to_owned()))
    }

    /// Waits for the job to end (with a progress bar on stderr), at most
    /// `timeout`; then reads its records. A failed job is a result with
    /// `state == "failed"`, not an error.
    pub(crate) fn wait(&self, job: Uuid, timeout: Duration) -> anyhow::Result<JobResult> {
        self.rt.block_on(wait_job(&self.client, job, timeout))
    }

    /// Waits until at least `fraction` of the job's tasks have committed
    /// (or it ended); returns how many had, of how many. Polls the done
    /// records every 100 ms.
    pub(crate) fn wait_progress(&self, job: Uuid, fraction: f64, timeout: Duration) -> anyhow::Result<(usize, usize)> {
        self.rt.block_on(async {
            let raw = self.client.peek_small(&record::job_key(job)).await?.with_context(|| format!("no job {job}"))?;
            let rec: JobRecord = serde_json::from_slice(&raw).context("unreadable job record")?;
            let total = rec.total_tasks();
            let start = Instant::now();
            loop {
                let done = self.client.scan_small(&record::done_prefix(job), 0).await?.len();
                let ended = self.client.peek_small(&record::finished_key(job)).await?.is_some()
                    || self.client.peek_small(&record::failed_key(job)).await?.is_some();
                if done as f64 >= fraction * total as f64 || ended {
                    return Ok((done, total));
                }
                if start.elapsed() > timeout {
                    bail!("job {job}: {done} of {total} tasks after {:.0} s", timeout.as_secs_f64());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    /// Whether the job has ended (finished or failed), without waiting.
    pub(crate) fn job_ended(&self, job: Uuid) -> anyhow::Result<bool> {
        self.rt.block_on(async {
            Ok(self.client.peek_small(&record::finished_key(job)).await?.is_some()
                || self.client.peek_small(&record::failed_key(job)).await?.is_some())
        })
    }

    /// The number of tasks the job's plan has.
    pub(crate) fn planned_tasks(&self, job: Uuid) -> anyhow::Result<usize> {
        self.rt.block_on(async {
            let raw = self.client.peek_small(&record::job_key(job)).await?.with_context(|| format!("no job {job}"))?;
            let rec: JobRecord = serde_json::from_slice(&raw).context("unreadable job record")?;
            Ok(rec.total_tasks())
        })
    }

    /// Submit, then wait.
    pub(crate) fn run_job(&self, submit_args: &[&str], timeout: Duration) -> anyhow::Result<JobResult> {
        let id = self.submit(submit_args)?;
        self.wait(id, timeout)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in self.slaves.iter_mut().chain(&mut self.stopped) {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        let _ = self.store.kill();
        let _ = self.store.wait();
        keep_logs(self.dir.path());
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) -> nix::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
}

/// With `FTBAG_KEEP_LOGS=DIR`, copies a cluster's process logs (store
/// node, slaves) to a subdirectory of `DIR` before the cluster's directory
/// goes: with `RUST_LOG=slave=debug`, each slave's timeline of its tasks
/// (reads waited for, kernels, commits) for a benchmark's jobs.
fn keep_logs(dir: &Path) {
    let (Some(keep), Some(name)) = (std::env::var_os("FTBAG_KEEP_LOGS"), dir.file_name()) else { return };
    let to = Path::new(&keep).join(name);
    if let Err(e) = std::fs::create_dir_all(&to) {
        tracing::warn!("FTBAG_KEEP_LOGS: creating {}: {e}", to.display());
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|x| x == "log") {
            if let Err(e) = std::fs::copy(entry.path(), to.join(entry.file_name())) {
                tracing::warn!("FTBAG_KEEP_LOGS: copying {}: {e}", entry.path().display());
            }
        }
    }
}

/// `program` in `host` (this host for `None` or [`Placement::Local`]),
/// with the cluster's token across hosts.
fn process(placement: &Placement, host: Option<usize>, program: &Path) -> Command {
    match (placement, host) {
        (Placement::Hosts(h), Some(host)) => {
            let mut cmd = h.hosts.command(host, program);
            cmd.env("STORE_TOKEN", &h.token);
            cmd
        }
        _ => Command::new(program),
    }
}

/// The harness's own client: over loopback on one host; across hosts over
/// TCP with the token (from the calling thread's host).
async fn connect(placement: &Placement, addr: &str, patience: Duration) -> Result<Client, store_client::StoreError> {
    match placement {
        Placement::Local => Client::connect_retrying(addr, None, Some(patience)).await,
        Placement::Hosts(h) => {
            let options = ConnectOptions { token: Some(h.token.clone()), ..ConnectOptions::default() };
            Client::connect_with_retrying(addr, &options, Some(patience)).await
        }
    }
}

/// Starts `master serve` and reads its "listening ADDR" line: on one host
/// at 127.0.0.1 (a port the OS picks, unless `serve_args` names one);
/// across hosts on host 0 at the fixed ports, with the token.
fn start_store(bin: &Path, dir: &Path, config: &ClusterConfig) -> anyhow::Result<(Child, String)> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("store.log"))?;
    let mut cmd = process(&config.placement, Some(0), &bin.join("master"));
    cmd.args(["serve", "--data"]).arg(dir.join("store")).args(["--cache-mib", &config.cache_mib.to_string()]);
    match &config.placement {
        Placement::Local if !config.serve_args.iter().any(|a| a == "--listen") => {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        Placement::Local => {}
        Placement::Hosts(h) => {
            let ip = h.hosts.addr(0);
            cmd.args(["--listen", &format!("{ip}:{GRPC_PORT}"), "--data-listen", &format!("{ip}:{DATA_PORT}")]);
        }
    }
    cmd.args(&config.serve_args).stderr(log);
    if let Some(g) = &config.cgroup {
        g.join_on_spawn(&mut cmd);
    }
    spawn_node(cmd, &dir.join("store.log"))
}

/// Spawns a `master serve` command (its stderr already set) and reads its
/// "listening ADDR" line; `log` is named in the error if it does not start.
pub(crate) fn spawn_node(mut cmd: Command, log: &Path) -> anyhow::Result<(Child, String)> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().context("starting master serve")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next();
        let _ = tx.send(first);
        // Keep draining so the node never blocks on a full pipe.
        for _ in lines {}
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Some(Ok(l))) => l,
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the store node did not start; see {}", log.display());
        }
    };
    let addr = line.strip_prefix("listening ").with_context(|| format!("unexpected first line {line:?} from master serve"))?;
    Ok((child, addr.trim().to_owned()))
}

async fn wait_job(client: &Client, id: Uuid, timeout: Duration) -> anyhow::Result<JobResult> {
    let raw = client.peek_small(&record::job_key(id)).await?.with_context(|| format!("no job {id}"))?;
    let rec: JobRecord = serde_json::from_slice(&raw).context("unreadable job record")?;
    let total = rec.total_tasks() as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} tasks {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(rec.spec.app_name().to_owned());
    let start = Instant::now();
    let mut last_count = Instant::now();
    let (finished, failure) = loop {
        if let Some(v) = client.peek_small(&record::failed_key(id)).await? {
            let f: record::Failure = serde_json::from_slice(&v).context("unreadable failure record")?;
            break (None, Some(f.reason));
        }
        if let Some(v) = client.peek_small(&record::finished_key(id)).await? {
            break (Some(u64::from_le_bytes(v.get(..8).and_then(|s| s.try_into().ok()).unwrap_or([0; 8]))), None);
        }
        if start.elapsed() > timeout {
            bar.finish_and_clear();
            bail!("job {id} still running after {:.0} s", timeout.as_secs_f64());
        }
        // Counting the done records costs a scan: once a second is plenty.
        if last_count.elapsed() > Duration::from_secs(1) {
            let n = client.scan_small(&record::done_prefix(id), 0).await?.len() as u64;
            bar.set_position(n);
            last_count = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    bar.finish_and_clear();
    let done: Vec<TaskDone> =
        client.scan_small(&record::done_prefix(id), 0).await?.into_iter().filter_map(|(_, v)| serde_json::from_slice(&v).ok()).collect();
    let end_ms = finished.unwrap_or_else(record::now_ms);
    Ok(JobResult {
        id,
        app: rec.spec.app_name().to_owned(),
        state: if failure.is_some() { "failed" } else { "succeeded" }.into(),
        seconds: end_ms.saturating_sub(rec.submitted_ms) as f64 / 1e3,
        flops: done.iter().map(|d| d.flops).sum(),
        tasks: done.len(),
        redone: done.iter().filter(|d| d.attempts > 0).count(),
        duplicates: done.iter().filter(|d| d.count != 1).count(),
        task_seconds: done.iter().map(|d| d.compute_ms as f64 / 1e3).sum(),
        times: TaskTimes::of(&done),
        reads: record::ReadSources::of(&done),
        failure,
    })
}
