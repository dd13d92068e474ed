//! The slave loop (DESIGN §6, `003…` Fig. 2.3), with reconnection: a slave
//! outlives store-node restarts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apps::job::{run_task, ErrorClass};
use store_client::{Action, Client, ConnectOptions, Dequeue, Session, StoreError, Task};
use uuid::Uuid;

use crate::compute::{ComputePriority, ComputeThread};
use crate::core_wait::ThreadSched;
use crate::ctx::{LargestBlock, StoreCtx, Writes};
use crate::kill_point::{KillPlace, KillPoint, KillSwitch};
use crate::record::{self, Failure, JobRecord, TaskDone};
use store_client::cache::{BlockCache, ReadBytes};

/// How a slave runs.
#[derive(Clone, Debug)]
pub struct SlaveConfig {
    pub store: String,
    /// Token, TLS, network path.
    pub connect: ConnectOptions,
    pub name: String,
    /// Exit when no job is running instead of waiting for the next one.
    pub exit_when_idle: bool,
    /// Work only on this job.
    pub job: Option<Uuid>,
    /// How long one blocking dequeue waits on the node.
    pub dequeue_wait: Duration,
    /// Crash tests: where this slave SIGKILLs itself.
    pub kill_point: Option<KillPoint>,
    /// Fault tests: where this slave SIGSTOPs itself.
    pub stop_point: Option<KillPoint>,
    /// How the compute thread is scheduled beside the slave's I/O and the
    /// store node.
    pub compute: ComputePriority,
    /// The block cache: bytes of payload it may hold (0: no cache).
    pub cache_bytes: usize,
    /// Whether the slave serves its cache to peers and reads from theirs.
    pub peers: bool,
    /// How long a read from a peer may take before it goes to the node.
    pub peer_timeout: Duration,
    /// Crash tests of peer transfers.
    pub peer_hook: store_client::cache::PeerHook,
    /// The certificate and key this slave serves peers with where the node
    /// uses TLS (peers then read over TLS, trusting the node's CA).
    pub peer_tls: Option<store_client::ServerTls>,
    /// Fault tests of gang jobs: where a rank this slave runs kills or
    /// stops itself.
    pub gang_fault: Option<crate::gang::GangFault>,
}

/// Runs the slave until it is idle (with `exit_when_idle`) or killed.
pub async fn run(config: SlaveConfig) -> Result<(), StoreError> {
    // A kill point counts the tasks of this process, and the compute
    // thread lives as long: both outlast reconnections.
    let kill = Arc::new(KillSwitch::new(config.kill_point, config.stop_point));
    let compute = Arc::new(
        ComputeThread::start(config.compute, tokio::runtime::Handle::current())
            .map_err(|e| StoreError::StoreUnavailable { what: format!("starting the compute thread: {e}") })?,
    );
    let cache = start_cache(&config).await;
    let mut slave = Slave::connect(config, kill, compute, cache).await?;
    loop {
        match slave.work().await {
            Ok(Idle::Exit) => return Ok(()),
            Ok(Idle::Wait) => slave.wait_for_a_submit().await,
            Ok(Idle::Again) => {}
            Err(e) if e.needs_reconnect() || !slave.session.is_alive() => {
                tracing::warn!("lost the store node ({e}); reconnecting");
                slave.reconnect().await?;
            }
            Err(e) if e.is_retryable() => tracing::info!("retrying after: {e}"),
            Err(e) => return Err(e),
        }
    }
}

/// The slave's block cache, and its peer server on the address that routes
/// to the store node (the interface other slaves reach this host by), if
/// peers are on. Both outlast reconnections. `None` without a cache.
async fn start_cache(config: &SlaveConfig) -> Option<Arc<BlockCache>> {
    if config.cache_bytes == 0 {
        return None;
    }
    let node_tls = config.connect.tls.clone();
    // A peer must not serve in plaintext what the node serves over TLS:
    // without a certificate of its own, no peers.
    let peers = config.peers && (node_tls.is_none() || config.peer_tls.is_some());
    if config.peers && !peers {
        tracing::warn!(
            "slave-to-slave transfer is off: the node uses TLS and this slave has no certificate to serve peers with \
             (--peer-tls-cert, --peer-tls-key; `master certs --peer-host`)"
        );
    }
    let cache = BlockCache::new(config.cache_bytes, peers, config.peer_timeout, config.connect.token.as_deref());
    let cache = Arc::new(cache.with_peer_tls(node_tls.clone().filter(|_| peers)));
    if peers {
        // TLS to peers exactly where the node uses it: readers connect to
        // peers the way they connect to the node.
        let acceptor = config.peer_tls.as_ref().filter(|_| node_tls.is_some()).map(|t| t.acceptor());
        match own_ip(&config.store).await {
            Some(ip) => match tokio::net::TcpListener::bind((ip, 0)).await {
                Ok(listener) => {
                    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
                    tracing::info!(%addr, "serving cached blocks to peers");
                    cache.serve_peers(listener, addr, acceptor, config.peer_hook);
                }
                Err(e) => tracing::warn!("not serving peers: {e}"),
            },
            None => tracing::warn!("not serving peers: no route to the store node found"),
        }
    }
    Some(cache)
}

/// The address of this host's interface that routes to `store`: a UDP
/// socket's connect picks it without sending anything.
pub(crate) async fn own_ip(store: &str) -> Option<std::net::IpAddr> {
    let target = tokio::net::lookup_host(store).await.ok()?.next()?;
    let bind: std::net::SocketAddr = if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = std::net::UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// How often an idle slave reads the submit counter: a new job is seen
/// within this, by every idle slave alike. (A sleep of 100 ms between two
/// scans of every job record let the second slave of a two-slave run join
/// 10–55 ms after the first: at b = 128 a ray-tracing run of 8 tasks split
/// them 5 and 3.)
const IDLE_LOOK: Duration = Duration::from_millis(10);

/// How long a slave leaves a gang job alone after finding every rank held
/// or giving its rank back: long enough for the other slaves to take the
/// ranks it let go, short enough that a gang re-forms within a second.
const GANG_SKIP: Duration = Duration::from_millis(250);

/// An idle slave scans the jobs at least this often whatever the counter
/// says (a record written by anything but `master submit`).
const IDLE_RESCAN: Duration = Duration::from_secs(1);

enum Idle {
    Exit,
    /// Nothing to do: look again shortly.
    Wait,
    /// A job just ended: look for the next one at once.
    Again,
}

struct Slave {
    config: SlaveConfig,
    client: Client,
    session: Session,
    /// The previous task's ending (its block puts, record, commit), still
    /// running while this slave starts the next task. At most one. It
    /// answers how long it took.
    finishing: Option<tokio::task::JoinHandle<Result<Duration, StoreError>>>,
    /// How long the last ending settled took, for the next task's record
    /// (`TaskDone::prev_ending_us`); cleared at each job's start.
    last_ending: Option<Duration>,
    /// Block puts not yet finished, over both tasks (see `ctx::Writes`).
    in_flight: Arc<crate::ctx::PutsInFlight>,
    largest_block: Arc<LargestBlock>,
    /// The submit counter as read just before the last scan for jobs.
    submitted: u64,
    kill: Arc<KillSwitch>,
    /// Where tasks compute (kept across reconnections, as `kill`).
    compute: Arc<ComputeThread>,
    /// The block cache (kept across reconnections, as `kill`).
    cache: Option<Arc<BlockCache>>,
    /// Gang jobs this slave leaves alone until the instant given: every
    /// rank was held by others, or its gang did not form in time. Ordinary
    /// jobs run meanwhile.
    gang_skip: std::collections::HashMap<Uuid, Instant>,
}

impl Slave {
    async fn connect(
        config: SlaveConfig,
        kill: Arc<KillSwitch>,
        compute: Arc<ComputeThread>,
        cache: Option<Arc<BlockCache>>,
    ) -> Result<Slave, StoreError> {
        let client = Client::connect_with_retrying(&config.store, &config.connect, None).await?;
        if let Some(cache) = &cache {
            if !client.attach_block_cache(cache.clone()) {
                tracing::debug!("no block cache: blocks are not read over TCP");
            }
        }
        let session = client.open_session(&config.name).await?;
        tracing::info!(session = session.id(), "slave {} connected to {}", config.name, config.store);
        Ok(Slave {
            config,
            client,
            session,
            finishing: None,
            last_ending: None,
            in_flight: Arc::default(),
            largest_block: Arc::default(),
            submitted: 0,
            kill,
            compute,
            cache,
            gang_skip: Default::default(),
        })
    }

    async fn reconnect(&mut self) -> Result<(), StoreError> {
        loop {
            match Slave::connect(self.config.clone(), self.kill.clone(), self.compute.clone(), self.cache.clone()).await {
                Ok(s) => {
                    *self = s;
                    return Ok(());
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!("store node not back yet: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs the oldest unfinished job to the end of its last bag.
    async fn work(&mut self) -> Result<Idle, StoreError> {
        // Read before the scan: a submit that the scan misses changes it.
        self.submitted = record::submitted_count(self.client.peek_small(record::SUBMITTED_KEY).await?.as_deref());
        let Some(job) = self.next_job().await? else {
            return Ok(if self.config.exit_when_idle { Idle::Exit } else { Idle::Wait });
        };
        let id = job.id();
        tracing::info!(%id, app = job.spec.app_name(), "working on job");
        self.largest_block.new_job();
        self.last_ending = None;
        for (index, bag) in job.bags.iter().enumerate() {
            loop {
                let asked = Instant::now();
                // A failed job's element goes back to its place with the
                // abort below.
                let ((failed, flag_took), taken) = start_task(&self.client, &self.session, &record::failed_key(id), bag, asked).await;
                let (action, begun, mut next) = taken?;
                let failed = match failed {
                    Ok(flag) => flag.is_some(),
                    Err(e) => {
                        let _ = action.abort().await;
                        return Err(e);
                    }
                };
                if failed {
                    action.abort().await?;
                    // The next job, if one is queued, at once.
                    return Ok(Idle::Again);
                }
                if job.gang.is_some() && matches!(next, Ok(Dequeue::NoneAvailable)) {
                    // Every rank is held by other slaves: this one is not
                    // in the gang and takes ordinary tasks meanwhile.
                    action.abort().await?;
                    self.settle().await?;
                    self.gang_skip.insert(id, Instant::now() + GANG_SKIP);
                    return Ok(Idle::Again);
                }
                if matches!(next, Ok(Dequeue::NoneAvailable)) {
                    // The element held may be our own previous task's, still
                    // committing: let it end before waiting on the node.
                    self.settle().await?;
                    next = action.dequeue(bag, self.config.dequeue_wait).await;
                }
                tracing::trace!(begin_ms = ms(begun), flag_ms = ms(flag_took), dequeue_ms = ms(asked.elapsed() - begun), "dequeued");
                match next {
                    Ok(Dequeue::Empty) => {
                        action.abort().await?;
                        // A task given up after repeated slave deaths left
                        // the bag: the job stops here (the next bag's tasks
                        // would read what it never wrote) until `master
                        // retry` puts it back. It used to be marked
                        // finished, slaves going on to the next bags.
                        let dead = self.client.bag_stats(bag).await?.dead;
                        if dead > 0 {
                            self.settle().await?;
                            tracing::error!(%id, bag, dead, "job stops: dead-lettered tasks");
                            let reason = format!(
                                "{dead} task(s) of bag {bag} dead-lettered after repeated slave deaths (`master retry {id}` runs them again)"
                            );
                            record_job_failure(&self.session, id, reason, bag, "", &self.config.name).await?;
                            return Ok(Idle::Again);
                        }
                        break;
                    }
                    Ok(Dequeue::NoneAvailable) => action.abort().await?,
                    Ok(Dequeue::Task(task)) if job.gang.is_some() => {
                        self.settle().await?;
                        if self.run_rank(&job, action, task).await? == crate::gang::RankEnd::GaveBack {
                            self.gang_skip.insert(id, Instant::now() + GANG_SKIP);
                            return Ok(Idle::Again);
                        }
                    }
                    Ok(Dequeue::Task(task)) => match apps::job::inner_tasks(&job.spec, &task.payload) {
                        Some(inner) => self.run_two_level(&job, index, action, task, inner).await?,
                        None => {
                            self.kill.reached(KillPlace::Dequeued);
                            self.run_one(&job, index, action, task, asked.elapsed()).await?
                        }
                    },
                    Err(e) => {
                        let _ = action.abort().await;
                        return Err(e);
                    }
                }
            }
        }
        self.settle().await?;
        self.mark_finished(id).await?;
        Ok(Idle::Again)
    }

    /// Runs a rank of a gang job (`crate::gang`).
    async fn run_rank(&self, job: &JobRecord, action: Action, task: Task) -> Result<crate::gang::RankEnd, StoreError> {
        let gang = job.gang.as_ref().expect("a gang job");
        let ctx = crate::gang::RankCtx {
            client: &self.client,
            session: &self.session,
            slave: &self.config.name,
            store: &self.config.store,
            token: self.config.connect.token.as_deref(),
            fault: self.config.gang_fault,
        };
        crate::gang::run_rank(&ctx, job, gang, action, task).await
    }

    /// Idles until a job is submitted (the counter moves past what the last
    /// scan saw) or [`IDLE_RESCAN`] has passed. A failed read ends the wait:
    /// the next scan meets the same trouble and says what it is.
    async fn wait_for_a_submit(&self) {
        let started = Instant::now();
        while started.elapsed() < IDLE_RESCAN {
            tokio::time::sleep(IDLE_LOOK).await;
            match self.client.peek_small(record::SUBMITTED_KEY).await {
                Ok(v) if record::submitted_count(v.as_deref()) == self.submitted => {}
                _ => return,
            }
        }
    }

    /// Bytes this slave's reads took from the store, peers and its cache
    /// so far (zero without a cache).
    fn read_bytes(&self) -> ReadBytes {
        self.cache.as_ref().map(|c| c.read_bytes()).unwrap_or_default()
    }

    /// Waits for the previous task's ending. A commit refused because the
    /// action was aborted (fencing) is not an error: the task is redone.
    async fn settle(&mut self) -> Result<(), StoreError> {
        let Some(h) = self.finishing.take() else { return Ok(()) };
        let took = h.await.map_err(|e| StoreError::StoreUnavailable { what: format!("task commit failed: {e}") })??;
        self.last_ending = Some(took);
        Ok(())
    }

    /// The oldest job that has neither finished nor failed. Two scans
    /// whatever the number of jobs the store has seen (a look per job made
    /// an idle slave's poll cost two round trips per finished job).
    async fn next_job(&mut self) -> Result<Option<JobRecord>, StoreError> {
        let now = Instant::now();
        self.gang_skip.retain(|_, until| *until > now);
        let ended: std::collections::HashSet<Uuid> = self
            .client
            .scan_small(record::JOB_STATE_PREFIX, 0)
            .await?
            .into_iter()
            .filter_map(|(k, _)| Uuid::try_parse(k.strip_prefix(record::JOB_STATE_PREFIX)?.split_once('/')?.0).ok())
            .collect();
        let mut jobs: Vec<JobRecord> = self
            .client
            .scan_small("job/", 0)
            .await?
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
            .filter(|j: &JobRecord| self.config.job.is_none_or(|only| only == j.id()))
            .filter(|j: &JobRecord| !ended.contains(&j.id()))
            .filter(|j: &JobRecord| !self.gang_skip.contains_key(&j.id()))
            .collect();
        jobs.sort_by_key(|j| j.submitted_ms);
        Ok(jobs.into_iter().next())
    }

    /// An element of a two-level bag (`apps::matmul::rows`), held by
    /// `outer` while each of its tasks runs in a top-level action of its
    /// own, begun beside it, and commits as it ends. A task whose done
    /// record exists (committed before a crash returned the element) is
    /// skipped. The element leaves the bag only once every task's record
    /// is there; otherwise (a task that went back, a commit refused) the
    /// outer action aborts and the element returns for what is missing.
    async fn run_two_level(
        &mut self,
        job: &JobRecord,
        bag_index: usize,
        outer: Action,
        element: Task,
        inner: Vec<(u64, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        let done = |seq| record::done_key(job.id(), bag_index, seq);
        for (seq, payload) in &inner {
            let asked = Instant::now();
            // Only the element's holder runs its tasks, and an earlier
            // holder's actions ended with its session: committed or never.
            // (Its counts of earlier holders do not say: a store restart
            // forgets them.)
            if self.client.peek_small(&done(*seq)).await?.is_some() {
                continue;
            }
            let action = self.session.begin().await?;
            self.kill.reached(KillPlace::Dequeued);
            let task = Task {
                bag: element.bag.clone(),
                seq: *seq,
                payload: payload.clone(),
                attempts: element.attempts,
                returns: element.returns,
            };
            self.run_one(job, bag_index, action, task, asked.elapsed()).await?;
        }
        self.settle().await?;
        let mut missing = 0;
        for (seq, _) in &inner {
            missing += usize::from(self.client.peek_small(&done(*seq)).await?.is_none());
        }
        if missing > 0 {
            tracing::info!(bag = %element.bag, seq = element.seq, missing, "element goes back to the bag for its tasks not committed");
            return outer.abort().await;
        }
        match outer.commit().await {
            Ok(()) | Err(StoreError::ActionAborted { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One task in one top-level action: compute on the compute thread (the
    /// session's heartbeats go on meanwhile), record it done, commit.
    /// Runs one task; on success its ending (block puts, record, commit)
    /// goes on in the background while the caller dequeues the next task.
    /// `start`: from asking for the task (the begin) to holding it.
    async fn run_one(&mut self, job: &JobRecord, bag_index: usize, action: Action, task: Task, start: Duration) -> Result<(), StoreError> {
        let started = Instant::now();
        let bytes_before = self.read_bytes();
        tracing::debug!(action = action.id(), seq = task.seq, bag = %task.bag, task = %String::from_utf8_lossy(&task.payload), "task starts");
        // The done record, read for update now, beside the task's work: the
        // ending then waits for one round trip fewer. Only this task writes
        // the key, and an abort releases its lock.
        let key = record::done_key(job.id(), bag_index, task.seq);
        let record_before = tokio::spawn(action.read_small_owned(&key, true));
        let rt = tokio::runtime::Handle::current();
        let (client, spec) = (self.client.clone(), job.spec.clone());
        let writes = Writes::new(self.in_flight.clone(), self.largest_block.clone());
        let (outcome, action, task, writes, waits, (kernels, core_wait), ran) = self
            .compute
            .run(move || {
                let ran = Instant::now();
                let mut ctx = StoreCtx {
                    rt,
                    client: &client,
                    action: &action,
                    job: spec.job(),
                    prefetch: Default::default(),
                    writes,
                    waits: Default::default(),
                };
                let tries = task.attempts + task.returns;
                apps::kernels::take_kernel_time();
                // Two reads of a /proc file per task (some µs each, against a
                // task's milliseconds): nothing kept open.
                let sched = ThreadSched::now();
                let outcome = run_task(&spec, &task.payload, tries, &mut ctx);
                let kernels = apps::kernels::take_kernel_time();
                let core_wait = match (ThreadSched::now(), sched) {
                    (Some(after), Some(before)) => after.since(before).waited,
                    _ => Duration::ZERO,
                };
                // Ends any prefetch the task announced but never read, before
                // the action commits or aborts.
                let StoreCtx { writes, waits, .. } = ctx;
                (outcome, action, task, writes, waits, (kernels, core_wait), (ran.duration_since(started), ran.elapsed()))
            })
            .await
            .map_err(|e| StoreError::StoreUnavailable { what: format!("task failed: {e}") })?;
        let id = job.id();
        tracing::debug!(
            action = action.id(),
            ok = outcome.is_ok(),
            ms = ms(started.elapsed()),
            // Into the task thread, and the task's own time there; the
            // rest of `ms` is the way back.
            handoff_ms = ms(ran.0),
            on_thread_ms = ms(ran.1),
            kernel_ms = ms(kernels),
            core_wait_ms = ms(core_wait),
            write_ms = ms(waits.write_calls),
            prefetched = waits.prefetched,
            prefetched_wait_ms = ms(waits.prefetched_wait),
            first_read_wait_ms = ms(waits.first_wait),
            in_open = waits.in_open,
            in_open_wait_ms = ms(waits.in_open_wait),
            small_reads = waits.small,
            small_wait_ms = ms(waits.small_wait),
            "task computed"
        );
        match outcome {
            Ok(outcome) => {
                self.kill.reached(KillPlace::Computed);
                let computed = started.elapsed();
                // Into the task's thread and back: `computed` less the
                // thread's own time.
                let handed = computed.saturating_sub(ran.1);
                // One ending at a time: the slave holds at most one task's
                // unfinished writes besides the running task's.
                let waited = Instant::now();
                self.settle().await?;
                let settled = waited.elapsed();
                let read = self.read_bytes().since(&bytes_before);
                tracing::debug!(ms = settled.as_secs_f64() * 1e3, "previous ending settled");
                let done = TaskDone {
                    count: 0,
                    flops: outcome.flops,
                    slave: self.config.name.clone(),
                    attempts: task.attempts,
                    finished_ms: 0,
                    compute_ms: computed.as_millis() as u64,
                    kernel_us: kernels.as_micros() as u64,
                    core_wait_us: core_wait.as_micros() as u64,
                    block_wait_us: (waits.prefetched_wait + waits.in_open_wait).as_micros() as u64,
                    small_wait_us: waits.small_wait.as_micros() as u64,
                    start_us: start.as_micros() as u64,
                    settle_us: settled.as_micros() as u64,
                    handoff_us: handed.as_micros() as u64,
                    prev_ending_us: self.last_ending.take().map_or(0, |d| d.as_micros() as u64),
                    bytes_store: read.store,
                    bytes_peers: read.peers,
                    bytes_cache: read.cache,
                };
                let ending = Ending {
                    session: self.session.clone(),
                    job: id,
                    action,
                    writes,
                    key,
                    record_before,
                    done,
                    task,
                    kill: self.kill.clone(),
                };
                self.finishing = Some(tokio::spawn(async move {
                    let began = Instant::now();
                    finish_task(ending).await.map(|()| began.elapsed())
                }));
                Ok(())
            }
            Err(e) => match e.class() {
                ErrorClass::Retry | ErrorClass::Requeue => {
                    tracing::info!("task {} of {} goes back to the bag: {e}", task.seq, task.bag);
                    let _ = writes.finish().await;
                    let _ = action.abort().await;
                    // A flag's timeout is the single-bag Cholesky's way of
                    // waiting, not a failure: not logged.
                    if e.class() == ErrorClass::Retry {
                        log_task_failure(&self.session, id, &task, &self.config.name, e.to_string());
                    }
                    Ok(())
                }
                ErrorClass::JobFatal => {
                    tracing::error!("job {id} fails: {e}");
                    let _ = writes.finish().await;
                    action.abort().await?;
                    record_failure(&self.session, id, e.to_string(), &task, &self.config.name).await
                }
            },
        }
    }

    async fn mark_finished(&self, id: Uuid) -> Result<(), StoreError> {
        let a = self.session.begin().await?;
        let key = record::finished_key(id);
        if a.read_small(&key, true).await?.is_none() {
            a.write_small(&key, &record::now_ms().to_le_bytes()).await?;
            tracing::info!(%id, "job finished: every bag is empty");
        }
        a.commit().await
    }
}

/// What the end of a task that computed needs.
struct Ending {
    session: Session,
    job: Uuid,
    action: Action,
    writes: Writes,
    /// Its task record's key, its value before the task (read for update
    /// when the task started), and the record.
    key: String,
    record_before: tokio::task::JoinHandle<Result<Option<Vec<u8>>, StoreError>>,
    done: TaskDone,
    task: Task,
    kill: Arc<KillSwitch>,
}

/// The end of a task that computed: waits for its block puts, records it
/// done (counting earlier commits of the same task, which must not exist),
/// commits. A put that failed aborts the action: the task goes back to the
/// bag whole, as if the slave had died.
async fn finish_task(ending: Ending) -> Result<(), StoreError> {
    let Ending { session, job, action, writes, key, record_before, mut done, task, kill } = ending;
    if let Err(e) = writes.finish().await {
        let _ = action.abort().await;
        if e.is_retryable() || matches!(e, StoreError::ActionAborted { .. }) {
            tracing::info!("task {} of {} goes back to the bag: a block put failed: {e}", task.seq, task.bag);
            log_task_failure(&session, job, &task, &done.slave, format!("block put: {e}"));
            return Ok(());
        }
        // What the task would have met writing in the foreground (a full
        // disk, a refused block): the job fails, saying why.
        tracing::error!("job {job} fails: block put: {e}");
        return record_failure(&session, job, format!("block put: {e}"), &task, &done.slave).await;
    }
    let before = record_before.await.map_err(|e| StoreError::StoreUnavailable { what: format!("done record read failed: {e}") })??;
    done.count = before.and_then(|v| serde_json::from_slice::<TaskDone>(&v).ok()).map_or(0, |d| d.count) + 1;
    done.finished_ms = record::now_ms();
    action.write_small(&key, &serde_json::to_vec(&done).expect("plain struct")).await?;
    kill.reached(KillPlace::BeforeCommit);
    let id = action.id();
    match action.commit().await {
        Ok(()) => {
            // With "task starts" and "task computed", a timeline of where a
            // job's time goes (RUST_LOG=slave=debug).
            tracing::debug!(action = id, "task committed");
            Ok(())
        }
        Err(e @ StoreError::ActionAborted { .. }) => {
            tracing::warn!("task {} of {} not committed: {e}", task.seq, task.bag);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The failure flag's read, with its time.
pub type FlagRead = (Result<Option<Vec<u8>>, StoreError>, Duration);
/// The begun action with the time its begin was answered, and the first
/// dequeue's outcome.
pub type Taken = Result<(Action, Duration, Result<Dequeue, StoreError>), StoreError>;

/// A task's start, one round trip: the session's begin (mostly none: the
/// last commit began it) and the bag's first dequeue, beside the read of
/// the job's failure flag (`failed_key`), not after it. Times count from
/// `asked`. `bench params` times starts with it.
pub async fn start_task(client: &Client, session: &Session, failed_key: &str, bag: &str, asked: Instant) -> (FlagRead, Taken) {
    let take = async {
        let action = session.begin().await?;
        let begun = asked.elapsed();
        let first = action.dequeue(bag, Duration::ZERO).await;
        Ok((action, begun, first))
    };
    tokio::join!(timed(asked, client.peek_small(failed_key)), take)
}

/// Logs a failed run of `task` that sends it back to its bag, for `master
/// job log` (`record::TaskFailure`), in an action of its own on the
/// runtime: best effort (the node may be what failed), and the slave goes
/// on at once.
fn log_task_failure(session: &Session, job: Uuid, task: &Task, slave: &str, message: String) {
    let at_ms = record::now_ms();
    let entry = record::TaskFailure {
        bag: task.bag.clone(),
        seq: task.seq,
        task: String::from_utf8_lossy(&task.payload).into_owned(),
        attempts: task.attempts,
        slave: slave.to_owned(),
        message,
        at_ms,
    };
    let key = record::task_failure_key(job, at_ms, slave, task.seq);
    let session = session.clone();
    tokio::spawn(async move {
        let logged = async {
            let a = session.begin().await?;
            a.write_small(&key, &serde_json::to_vec(&entry).expect("plain struct")).await?;
            a.commit().await
        };
        if let Err(e) = logged.await {
            tracing::debug!("task failure not logged: {e}");
        }
    });
}

/// Records that `task` failed the job, in an action of its own, so no
/// partial output of the failed task is ever committed.
async fn record_failure(session: &Session, job: Uuid, reason: String, task: &Task, slave: &str) -> Result<(), StoreError> {
    record_job_failure(session, job, reason, &task.bag, &String::from_utf8_lossy(&task.payload), slave).await
}

/// Records the job's failure, unless one is recorded already (the first
/// one says why), in an action of its own.
async fn record_job_failure(session: &Session, job: Uuid, reason: String, bag: &str, task: &str, slave: &str) -> Result<(), StoreError> {
    let failure = Failure { reason, bag: bag.to_owned(), task: task.to_owned(), slave: slave.to_owned(), at_ms: record::now_ms() };
    let a = session.begin().await?;
    let key = record::failed_key(job);
    if a.read_small(&key, true).await?.is_none() {
        a.write_small(&key, &serde_json::to_vec(&failure).expect("plain struct")).await?;
    }
    a.commit().await
}

/// Milliseconds to the microsecond, for the debug timeline (a raw f64 of
/// a few nanoseconds printed as `9.5e-5`).
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// A future's output and the time from `since` until it was ready.
async fn timed<T>(since: Instant, f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let r = f.await;
    (r, since.elapsed())
}
