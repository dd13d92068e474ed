//! Submitting jobs and watching them: `submit`, `wait`, `jobs`, `status`,
//! `verify`, `slaves`. A job is a computation record plus its bags, written
//! in one atomic action: a submit either happened whole or not at all.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use apps::job::{output_shapes, plan, AppRequest, CholeskyVariant, JobSpec, LuSchedule, PivotRule};
use job_record::{self as record, Cancelled, Failure, JobRecord, TaskDone, TaskTimes};
use store_client::Client;
use uuid::Uuid;

use crate::choices::{Pivot, Schedule, Variant};
use crate::out::{errln, outln};
use crate::source::{meta, with_source};
use crate::store_args::StoreArgs;

/// `master submit matmul --order`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum MatmulOrder {
    Nearest,
    Rows,
    TwoLevel,
}

#[derive(clap::Subcommand)]
pub(crate) enum Submit {
    /// C = A·B, one task per block of C.
    Matmul {
        /// Name of the left operand A.
        a: String,
        /// Name of the right operand B (as many rows as A has columns, the same block size).
        b: String,
        /// Name of the output matrix (created).
        #[arg(long)]
        out: String,
        /// Replace the output matrix if one of that name exists (refused
        /// while a running job reads or writes it).
        #[arg(long)]
        force: bool,
        /// Which task a slave takes next. nearest: the one whose blocks of
        /// A and B its cache holds most of (slaves on other hosts than the
        /// store, which cache; others take the bag in order). rows: block
        /// rows of C in order (every other row from its last block back, so
        /// a row starts on the blocks of B the last one read), whatever the
        /// slaves hold. two-level: a slave
        /// takes a whole block row of C and commits its blocks one by one
        /// (a crash loses one block's work; the row goes back to the bag
        /// and the next slave goes on from its first block not committed).
        #[arg(long, value_enum, default_value_t = MatmulOrder::Nearest)]
        order: MatmulOrder,
        #[command(flatten)]
        gang: crate::gang_cmd::GangArgs,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// A = L·Lᵀ (left-looking, lower factor in OUT, upper triangle zero).
    Cholesky {
        /// Name of the symmetric positive definite matrix A (only its lower blocks are read).
        a: String,
        /// Name of the output matrix L (created, A's shape and blocks).
        #[arg(long)]
        out: String,
        /// Replace the output matrix if one of that name exists (refused
        /// while a running job reads or writes it).
        #[arg(long)]
        force: bool,
        /// How the factorisation is split into bags of tasks.
        #[arg(long, value_enum, default_value_t = Variant::Dag)]
        variant: Variant,
        /// single-bag: first wait on a ready flag (ms), doubled per retry.
        #[arg(long)]
        flag_timeout_ms: Option<u64>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// P·A = L·U (packed as LAPACK does in OUT).
    Lu {
        /// Name of the square matrix A.
        a: String,
        /// Name of the output matrix (created, A's shape and blocks): L below the diagonal (unit diagonal implied), U on and above.
        #[arg(long)]
        out: String,
        /// Replace the output matrix if one of that name exists (refused
        /// while a running job reads or writes it).
        #[arg(long)]
        force: bool,
        /// Pivot (otherwise A should be diagonally dominant). `--pivot`
        /// alone is partial pivoting. Choose tournament for matrices whose
        /// block column does not fit a slave's memory (its tasks hold a
        /// few blocks whatever n); partial when LAPACK's exact pivots
        /// matter, or for speed where memory allows.
        #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "partial", value_name = "RULE")]
        pivot: Option<Pivot>,
        /// How the factorisation is split into bags of tasks. Without
        /// --pivot both run the same tasks and give the same bits, the dag
        /// faster (no barriers); with --pivot the dag is right-looking (the
        /// next panel runs beside the step's updates).
        #[arg(long, value_enum, default_value_t = Schedule::Dag)]
        schedule: Schedule,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Ray-trace the "balls" sphereflake, one task per grain of scanlines.
    Raytrace {
        /// Scene (only "balls").
        #[arg(long, default_value = "balls")]
        scene: String,
        /// Sphereflake recursion level.
        #[arg(long, default_value_t = 3)]
        level: u32,
        /// Image width in pixels.
        #[arg(long, default_value_t = 512)]
        width: u32,
        /// Image height in pixels.
        #[arg(long, default_value_t = 512)]
        height: u32,
        /// Scanlines per task.
        #[arg(long, default_value_t = 8)]
        grain: u32,
        /// Anti-aliasing: samples×samples rays per pixel.
        #[arg(long, default_value_t = 1)]
        samples: u32,
        /// Name of the image.
        #[arg(long)]
        out: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

pub(crate) async fn submit(cmd: Submit) -> anyhow::Result<()> {
    let client = match &cmd {
        Submit::Matmul { store, .. } | Submit::Cholesky { store, .. } | Submit::Lu { store, .. } | Submit::Raytrace { store, .. } => {
            store.connect().await?
        }
    };
    let id = match cmd {
        Submit::Matmul { a, b, out, force, gang, order, .. } => match gang.spec()? {
            Some(_) if order != MatmulOrder::Nearest => bail!("--order applies to the bag of tasks, not to a gang (--ranks)"),
            None => submit_matmul(&client, &a, &b, &out, force, order).await?,
            Some(gang) => {
                let a = meta(&client.matrix_by_name(&a).await?);
                let b = meta(&client.matrix_by_name(&b).await?);
                let c = create_output(&client, &out, force, &AppRequest::Matmul { a: &a, b: &b }).await?;
                submit_spec_with(&client, JobSpec::Matmul { job: Uuid::new_v4(), a, b, c }, Some(gang)).await?
            }
        },
        Submit::Cholesky { a, out, force, variant, flag_timeout_ms, .. } => {
            let variant: CholeskyVariant = variant.into();
            let a = meta(&client.matrix_by_name(&a).await?);
            let id = Uuid::new_v4();
            let l = create_output(&client, &out, force, &AppRequest::Cholesky { a: &a }).await?;
            let spec = JobSpec::Cholesky {
                job: id,
                a,
                l,
                variant,
                flag_timeout_ms: flag_timeout_ms.unwrap_or(apps::cholesky::DEFAULT_FLAG_TIMEOUT_MS),
            };
            submit_spec(&client, spec).await?
        }
        Submit::Lu { a, out, force, pivot, schedule, .. } => {
            let schedule: LuSchedule = schedule.into();
            let pivot_rule = pivot.map_or(PivotRule::Partial, PivotRule::from);
            if pivot_rule == PivotRule::Tournament && schedule != LuSchedule::Dag {
                bail!("--pivot tournament runs on the dag schedule only (drop --schedule bags)");
            }
            let a = meta(&client.matrix_by_name(&a).await?);
            let lu = create_output(&client, &out, force, &AppRequest::Lu { a: &a }).await?;
            submit_spec(&client, JobSpec::Lu { job: Uuid::new_v4(), a, lu, pivot: pivot.is_some(), schedule, pivot_rule }).await?
        }
        Submit::Raytrace { scene, level, width, height, grain, samples, out, .. } => {
            if scene != "balls" {
                bail!("unknown scene {scene:?} (only \"balls\")");
            }
            let params = apps::raytrace::RenderParams { level, width, height, grain, samples };
            output_shapes(&AppRequest::Raytrace { params: &params })?;
            submit_spec(&client, JobSpec::Raytrace { job: Uuid::new_v4(), name: out, params }).await?
        }
    };
    outln!("{id}");
    Ok(())
}

pub(crate) async fn submit_matmul(client: &Client, a: &str, b: &str, out: &str, force: bool, order: MatmulOrder) -> anyhow::Result<Uuid> {
    // The store's NotFound names the matrix already.
    let a = meta(&client.matrix_by_name(a).await?);
    let b = meta(&client.matrix_by_name(b).await?);
    let c = create_output(client, out, force, &AppRequest::Matmul { a: &a, b: &b }).await?;
    submit_planned(client, JobSpec::Matmul { job: Uuid::new_v4(), a, b, c }, None, order).await
}

/// Checks the inputs fit, then creates the single output matrix (with
/// `force`, in place of one of that name that no running job uses).
async fn create_output(client: &Client, name: &str, force: bool, req: &AppRequest<'_>) -> anyhow::Result<apps::block::MatrixMeta> {
    let shapes = output_shapes(req)?;
    let s = shapes.first().context("this job has no output matrix")?;
    if force {
        match crate::matrix::remove(client, name, false).await {
            Ok(()) => {}
            Err(e)
                if e.downcast_ref::<store_client::StoreError>().is_some_and(|e| matches!(e, store_client::StoreError::NotFound { .. })) => {
            }
            Err(e) => return Err(e.context(format!("replacing matrix {name:?} (--force)"))),
        }
    }
    let m = client.create_matrix(name, s.n_rows, s.n_cols, s.block).await.map_err(|e| match e {
        store_client::StoreError::AlreadyExists { .. } => anyhow::anyhow!("{e} (give --force to replace it)"),
        e => e.into(),
    })?;
    Ok(meta(&m))
}

/// Writes the computation record, the initial small objects and every task
/// of every bag in one top-level action. If planning fails, the outputs
/// created for it are removed again.
pub(crate) async fn submit_spec(client: &Client, spec: JobSpec) -> anyhow::Result<Uuid> {
    submit_spec_with(client, spec, None).await
}

/// [`submit_spec`], as a gang job of one bag of rank tasks with `gang`.
pub(crate) async fn submit_spec_with(client: &Client, spec: JobSpec, gang: Option<record::gang::GangSpec>) -> anyhow::Result<Uuid> {
    submit_planned(client, spec, gang, MatmulOrder::Nearest).await
}

/// `order` lays out a multiply's tasks (`--order`); other jobs' bags give
/// the queue their inputs where their plan has them, as `Nearest` does.
async fn submit_planned(client: &Client, spec: JobSpec, gang: Option<record::gang::GangSpec>, order: MatmulOrder) -> anyhow::Result<Uuid> {
    let outputs: Vec<Uuid> = match &spec {
        JobSpec::Matmul { c, .. } => vec![c.id.0],
        JobSpec::Cholesky { l, .. } => vec![l.id.0],
        JobSpec::Lu { lu, .. } => vec![lu.id.0],
        JobSpec::Raytrace { .. } => vec![],
    };
    let result = async {
        let mut plan = if order == MatmulOrder::TwoLevel { apps::job::plan_two_level(&spec)? } else { plan(&spec)? };
        if let Some(gang) = &gang {
            plan = apps::job::Plan { bags: vec![crate::gang_cmd::rank_bag(&spec, gang)?], initial_small: vec![] };
        }
        if let JobSpec::Cholesky { l, .. } = &spec {
            // L's upper blocks are zero and no task writes them.
            let ids: Vec<(u32, u32)> = apps::cholesky::upper_zero_blocks(l).map(|b| (b.i, b.j)).collect();
            let bar = crate::progress::bar(false, 0, "");
            crate::matrix::fill(client, &std::sync::Arc::new(l.clone()), ids, &bar, |mm, i, j| {
                let (r, c) = mm.block_shape(i, j);
                Ok(apps::block::Block::zeros(r, c))
            })
            .await?;
        }
        let record = JobRecord {
            bags: plan.bags.iter().map(|b| b.name.clone()).collect(),
            n_tasks: if order == MatmulOrder::TwoLevel { two_level_counts(&spec, &plan) } else { task_counts(&spec, &plan) },
            spec: spec.clone(),
            submitted_ms: record::now_ms(),
            gang,
        };
        let session = client.open_session("master submit").await?;
        let a = session.begin().await?;
        for (k, v) in &plan.initial_small {
            a.write_small(k, v).await?;
        }
        for bag in &plan.bags {
            for (k, t) in bag.tasks.iter().enumerate() {
                let given = bag.inputs.get(k).filter(|_| order == MatmulOrder::Nearest);
                let inputs: Vec<_> = given.map_or(&[][..], Vec::as_slice).iter().map(|b| (b.matrix.0, b.i, b.j)).collect();
                a.enqueue_near(&bag.name, t, &inputs).await?;
            }
        }
        a.write_small(&record::job_key(spec.job()), &serde_json::to_vec(&record)?).await?;
        let submitted = record::submitted_count(a.read_small(record::SUBMITTED_KEY, true).await?.as_deref());
        a.write_small(record::SUBMITTED_KEY, &(submitted + 1).to_le_bytes()).await?;
        a.commit().await?;
        anyhow::Ok(spec.job())
    }
    .await;
    if result.is_err() {
        for id in outputs {
            let _ = client.delete_matrix(id).await;
        }
    }
    result
}

/// How many tasks each bag runs in all: what the plan enqueues, except
/// that a dag's bag (the first) starts with the ready tasks and grows by
/// one task per dependency counter (committing tasks enqueue their
/// successors). A partial-pivoting LU dag has a second, plain bag after it.
fn task_counts(spec: &JobSpec, plan: &apps::job::Plan) -> Vec<usize> {
    let mut counts: Vec<usize> = plan.bags.iter().map(|b| b.tasks.len()).collect();
    if let (JobSpec::Cholesky { variant: CholeskyVariant::Dag, .. } | JobSpec::Lu { schedule: LuSchedule::Dag, .. }, Some(first)) =
        (spec, counts.first_mut())
    {
        *first += plan.initial_small.len();
    }
    counts
}

/// A two-level bag's tasks are its elements' inner tasks.
fn two_level_counts(spec: &JobSpec, plan: &apps::job::Plan) -> Vec<usize> {
    plan.bags.iter().map(|b| b.tasks.iter().map(|t| apps::job::inner_tasks(spec, t).map_or(1, |inner| inner.len())).sum()).collect()
}

/// Everything the store knows about a job's progress.
pub(crate) struct JobStatus {
    pub(crate) record: JobRecord,
    pub(crate) per_bag: Vec<BagProgress>,
    pub(crate) failed: Option<Failure>,
    pub(crate) cancelled: Option<Cancelled>,
    pub(crate) finished_ms: Option<u64>,
    pub(crate) done: Vec<TaskDone>,
}

pub(crate) struct BagProgress {
    pub(crate) name: String,
    pub(crate) total: usize,
    pub(crate) done: usize,
    pub(crate) running: u64,
    pub(crate) waiting: u64,
    pub(crate) dead: u64,
}

impl JobStatus {
    pub(crate) fn n_done(&self) -> usize {
        self.done.len()
    }

    pub(crate) fn flops_done(&self) -> f64 {
        // An empty f64 sum is -0.0, which printed as "-0.00 GFLOP/s".
        self.done.iter().map(|d| d.flops).sum::<f64>() + 0.0
    }

    /// When the job ended (finished, failed, cancelled), if it has.
    pub(crate) fn ended_ms(&self) -> Option<u64> {
        self.finished_ms.or(self.failed.as_ref().map(|f| f.at_ms)).or(self.cancelled.as_ref().map(|c| c.at_ms))
    }

    /// Seconds from its submit to its end, or to now.
    pub(crate) fn elapsed_s(&self) -> f64 {
        self.ended_ms().unwrap_or_else(record::now_ms).saturating_sub(self.record.submitted_ms) as f64 / 1e3
    }

    /// GFLOP/s over its run; `None` for a job whose tasks count no flops.
    pub(crate) fn gflops(&self) -> Option<f64> {
        let f = self.flops_done();
        (f > 0.0).then(|| f / self.elapsed_s().max(1e-9) / 1e9)
    }

    /// Seconds left at the pace so far; `None` unless it runs, some task
    /// is done and a slave is alive (with none, nothing will move).
    pub(crate) fn left_s(&self, slaves: usize) -> Option<f64> {
        let (done, total) = (self.n_done(), self.record.total_tasks());
        (self.state() == "running" && done > 0 && slaves > 0).then(|| self.elapsed_s() * total.saturating_sub(done) as f64 / done as f64)
    }

    /// Where the committed tasks' time went: kernels, waits for a core
    /// (other threads held them: the store node's, the slaves' I/O), for
    /// block reads and for small reads, and from begin to dequeued.
    pub(crate) fn task_times(&self) -> TaskTimes {
        TaskTimes::of(&self.done)
    }

    /// Where the committed tasks' block reads came from (slaves with a
    /// block cache count them).
    pub(crate) fn read_sources(&self) -> job_record::ReadSources {
        job_record::ReadSources::of(&self.done)
    }

    /// Tasks whose committed run came after an orphaned one.
    pub(crate) fn n_redone(&self) -> usize {
        self.done.iter().filter(|d| d.attempts > 0).count()
    }

    /// Tasks committed more than once (must be zero).
    pub(crate) fn n_duplicates(&self) -> usize {
        self.done.iter().filter(|d| d.count != 1).count()
    }

    pub(crate) fn n_dead(&self) -> u64 {
        self.per_bag.iter().map(|b| b.dead).sum()
    }

    /// Marked finished with tasks not committed: a slave took a bag for
    /// empty while it was not. Never expected; said as a failure rather
    /// than leaving a partial result to pass as the job's.
    pub(crate) fn finished_short(&self) -> bool {
        self.finished_ms.is_some() && self.n_done() < self.record.total_tasks()
    }

    pub(crate) fn state(&self) -> &'static str {
        if self.cancelled.is_some() {
            "cancelled"
        } else if self.failed.is_some() || self.n_dead() > 0 || self.finished_short() {
            "failed"
        } else if self.finished_ms.is_some() {
            "succeeded"
        } else {
            "running"
        }
    }
}

pub(crate) async fn job_status(client: &Client, id: Uuid) -> anyhow::Result<JobStatus> {
    let raw = client.peek_small(&record::job_key(id)).await?.with_context(|| format!("no job {id}"))?;
    let record: JobRecord = serde_json::from_slice(&raw).context("unreadable job record")?;
    // The end records before the task records: every task record a slave
    // committed before it marked the job finished is then in the scan
    // (read the other way round, a job that ended in between looked
    // finished short of its last tasks).
    let failed = match client.peek_small(&record::failed_key(id)).await? {
        Some(v) => Some(serde_json::from_slice(&v).context("unreadable failure record")?),
        None => None,
    };
    let cancelled = match client.peek_small(&record::cancelled_key(id)).await? {
        Some(v) => Some(serde_json::from_slice(&v).context("unreadable cancel record")?),
        None => None,
    };
    let finished_ms = client.peek_small(&record::finished_key(id)).await?.map(|v| u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8])));
    let mut done_by_bag: BTreeMap<usize, usize> = BTreeMap::new();
    let mut done = Vec::new();
    for (k, v) in client.scan_small(&record::done_prefix(id), 0).await? {
        let bag: usize = k.rsplit('/').nth(1).and_then(|s| s.parse().ok()).unwrap_or(usize::MAX);
        *done_by_bag.entry(bag).or_default() += 1;
        done.push(serde_json::from_slice::<TaskDone>(&v).context("unreadable task record")?);
    }
    let mut per_bag = Vec::new();
    for (i, name) in record.bags.iter().enumerate() {
        let s = client.bag_stats(name).await?;
        per_bag.push(BagProgress {
            name: name.clone(),
            total: record.n_tasks.get(i).copied().unwrap_or(0),
            done: done_by_bag.get(&i).copied().unwrap_or(0),
            running: s.taken,
            waiting: s.free,
            dead: s.dead,
        });
    }
    Ok(JobStatus { record, per_bag, failed, cancelled, finished_ms, done })
}

pub(crate) async fn all_jobs(client: &Client) -> anyhow::Result<Vec<JobRecord>> {
    let mut jobs: Vec<JobRecord> =
        client.scan_small("job/", 0).await?.into_iter().filter_map(|(_, v)| serde_json::from_slice(&v).ok()).collect();
    jobs.sort_by_key(|j| j.submitted_ms);
    Ok(jobs)
}

/// Resolves "JOB" arguments: a full id, a unique prefix, or "last".
pub(crate) async fn resolve(client: &Client, job: &str) -> anyhow::Result<Uuid> {
    let jobs = all_jobs(client).await?;
    if job == "last" {
        return jobs.last().map(JobRecord::id).context("no jobs yet");
    }
    let hits: Vec<Uuid> = jobs.iter().map(JobRecord::id).filter(|id| id.to_string().starts_with(job)).collect();
    match hits[..] {
        [id] => Ok(id),
        [] => bail!("no job matches {job:?}"),
        _ => bail!("{job:?} matches {} jobs; give more of the id", hits.len()),
    }
}

pub(crate) fn failure_line(s: &JobStatus) -> String {
    match &s.failed {
        Some(f) if f.task.is_empty() => format!("failed: {} (slave {})", f.reason, f.slave),
        Some(f) => format!("failed: {} (task {} of bag {}, slave {})", f.reason, f.task, f.bag, f.slave),
        None if s.n_dead() > 0 => format!(
            "failed: {} task(s) dead-lettered after repeated slave deaths (`master retry {}` runs them again)",
            s.n_dead(),
            s.record.id()
        ),
        None => format!(
            "failed: marked finished with {} of {} tasks committed; its output is incomplete (a store or slave bug: please report it)",
            s.n_done(),
            s.record.total_tasks()
        ),
    }
}

/// How often `wait` looks for the job's end records: two small reads.
const END_POLL: Duration = Duration::from_millis(20);
/// How often `wait` reads the whole status (every task record and bag, for
/// the progress bar and dead-lettered tasks). Read at every poll it would
/// take CPU from the job; read only this often, the end would be seen up
/// to this late (a job seemed to take 0.25 s longer than it did).
const STATUS_POLL: Duration = Duration::from_millis(250);

/// A client that outlives store-node restarts: a call that loses the node
/// connects again (retrying for the user's `--patience-s`) and is made
/// again. For the commands that watch a job for minutes (`wait`, `status
/// --watch`), which a restart of the node used to end with `Broken pipe`
/// or `http2 error` while the job itself went on.
pub(crate) struct Reconnecting {
    store: StoreArgs,
    client: Client,
}

impl Reconnecting {
    pub(crate) async fn connect(store: &StoreArgs) -> anyhow::Result<Reconnecting> {
        Ok(Reconnecting { store: store.clone(), client: store.connect().await? })
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `f` until it succeeds or fails for another reason than a lost
    /// node, or the node stays away past the patience.
    pub(crate) async fn call<T, F, Fut>(&mut self, f: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        loop {
            match f(self.client.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) if lost_the_node(&e) => {
                    tracing::warn!(
                        "lost the store node at {} ({e:#}); reconnecting for up to {} s",
                        self.store.connect.store,
                        self.store.patience_s
                    );
                    self.client = self.store.connect().await.context("the store node did not come back within --patience-s")?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether `e` says the connection to the node was lost (the node
/// stopped, crashed or restarted), not that it refused the request.
fn lost_the_node(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<store_client::StoreError>().is_some_and(store_client::StoreError::needs_reconnect))
}

/// Waits for the job to end; Ok(true) when it succeeded. Rides through
/// restarts of the store node (see [`Reconnecting`]).
pub(crate) async fn wait(conn: &mut Reconnecting, id: Uuid, bar: Option<&indicatif::ProgressBar>) -> anyhow::Result<bool> {
    let mut status_due = tokio::time::Instant::now();
    let mut said = false;
    loop {
        let ended = conn
            .call(|c| async move {
                Ok(c.peek_small(&record::finished_key(id)).await?.is_some() || c.peek_small(&record::failed_key(id)).await?.is_some())
            })
            .await?;
        if ended || tokio::time::Instant::now() >= status_due {
            let s = conn.call(|c| async move { job_status(&c, id).await }).await?;
            if !said {
                tracing::info!("waiting for job {id}");
                said = true;
            }
            if let Some(bar) = bar {
                let n_slaves = conn.call(|c| async move { slaves(&c).await }).await?;
                bar.set_length(s.record.total_tasks() as u64);
                bar.set_position(s.n_done() as u64);
                bar.set_message(watch_line(&s, n_slaves));
            }
            match s.state() {
                "succeeded" => return Ok(true),
                "failed" => {
                    errln!("job {id} {}", failure_line(&s));
                    return Ok(false);
                }
                "cancelled" => {
                    errln!("job {id} was cancelled");
                    return Ok(false);
                }
                _ => status_due = tokio::time::Instant::now() + STATUS_POLL,
            }
        }
        tokio::time::sleep(END_POLL).await;
    }
}

/// The `status --watch` bar's live text: the bag under way and its
/// counts, then the pace.
fn watch_line(s: &JobStatus, slaves: usize) -> String {
    let current = s.per_bag.iter().enumerate().find(|(_, b)| b.done < b.total || b.running + b.waiting > 0);
    let bag = match current {
        Some((i, b)) if s.per_bag.len() > 1 => {
            format!("bag {}/{}: {} running, {} waiting, {} dead", i + 1, s.per_bag.len(), b.running, b.waiting, b.dead)
        }
        Some((_, b)) => format!("{} running, {} waiting, {} dead", b.running, b.waiting, b.dead),
        None => String::new(),
    };
    format!("{bag}{}", pace(s, slaves))
}

/// A job's status as one JSON object (`--json`); `slaves`: the live
/// slaves, when asked.
pub(crate) fn status_json(s: &JobStatus, slaves: Option<usize>) -> serde_json::Value {
    let bags: Vec<_> = s
        .per_bag
        .iter()
        .map(|b| serde_json::json!({"name": b.name, "total": b.total, "done": b.done, "running": b.running, "waiting": b.waiting, "dead": b.dead}))
        .collect();
    let mut v = serde_json::json!({
        "id": s.record.id().to_string(),
        "app": s.record.spec.app_name(),
        "state": s.state(),
        "tasks_total": s.record.total_tasks(),
        "tasks_done": s.n_done(),
        "tasks_redone": s.n_redone(),
        "tasks_dead": s.n_dead(),
        "submitted_ms": s.record.submitted_ms,
        "finished_ms": s.finished_ms,
        "elapsed_s": s.elapsed_s(),
        "gflop": s.flops_done() / 1e9,
        "gflops": s.gflops(),
        "left_s": slaves.and_then(|n| s.left_s(n)),
        "bags": bags,
        "failure": (s.state() == "failed").then(|| failure_line(s)),
        "cancelled": s.cancelled.is_some(),
        "read_bytes": {"store": s.read_sources().store, "peers": s.read_sources().peers, "cache": s.read_sources().cache},
    });
    if let Some(n) = slaves {
        v["slaves"] = n.into();
    }
    v
}

/// The bags `status` lists at most: a pivoted LU with bags has four per
/// block column (70 lines at n/b = 16); the rest are summed up in a line.
const BAG_LINES: usize = 8;

/// Rate, time left and slaves, as `status` and the `--watch` bar say them:
/// no GFLOP/s for a job without flops (ray tracing), no time left unless
/// the job runs and a slave works on it.
fn pace(s: &JobStatus, slaves: usize) -> String {
    let mut out = String::new();
    if let Some(r) = s.gflops() {
        out.push_str(&format!("  {r:.2} GFLOP/s"));
    }
    if let Some(left) = s.left_s(slaves) {
        out.push_str(&format!("  ~{left:.0} s left"));
    }
    if s.state() == "running" && slaves == 0 {
        out.push_str("  no slave alive: nothing runs until one starts");
    } else {
        out.push_str(&format!("  {slaves} slave(s) alive"));
    }
    out
}

/// The bags a status lists: all when few, else those with work left (the
/// current ones first) up to [`BAG_LINES`], and how many are not shown.
fn bags_to_show(s: &JobStatus) -> (Vec<&BagProgress>, usize) {
    if s.per_bag.len() <= BAG_LINES {
        return (s.per_bag.iter().collect(), 0);
    }
    let open = |b: &&BagProgress| b.done < b.total || b.running + b.waiting + b.dead > 0;
    let mut shown: Vec<&BagProgress> = s.per_bag.iter().filter(open).take(BAG_LINES).collect();
    if shown.is_empty() {
        shown = s.per_bag.iter().rev().take(1).collect();
    }
    let hidden = s.per_bag.len() - shown.len();
    (shown, hidden)
}

pub(crate) fn print_status(s: &JobStatus, slaves: usize) {
    let total = s.record.total_tasks();
    outln!(
        "job {}  {}  {}  {}/{} tasks  {:.1} s{}",
        s.record.id(),
        s.record.spec.app_name(),
        s.state(),
        s.n_done(),
        total,
        s.elapsed_s(),
        pace(s, slaves)
    );
    print_task_times(s);
    print_read_sources(s);
    outln!("  {:<60} {:>6} {:>6} {:>8} {:>8} {:>5}", "bag", "total", "done", "running", "waiting", "dead");
    let (shown, hidden) = bags_to_show(s);
    for b in shown {
        outln!("  {:<60} {:>6} {:>6} {:>8} {:>8} {:>5}", b.name, b.total, b.done, b.running, b.waiting, b.dead);
    }
    if hidden > 0 {
        outln!("  … and {hidden} more bag(s) of {} (`--json` lists them all)", s.per_bag.len());
    }
    match s.state() {
        "failed" => outln!("  {}", failure_line(s)),
        "cancelled" => outln!("  cancelled by `master cancel`"),
        _ => {}
    }
}

/// Where the committed tasks' block reads came from, if slaves with a
/// cache ran them.
pub(crate) fn print_read_sources(s: &JobStatus) {
    let r = s.read_sources();
    if r.total() > 0 {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        outln!(
            "  block reads: {:.1} MiB from the store, {:.1} MiB from peer slaves, {:.1} MiB from the slaves' caches",
            mib(r.store),
            mib(r.peers),
            mib(r.cache)
        );
    }
}

/// Where the committed tasks' time went, if their records say (slaves
/// before the records kept it leave nothing to print). Against the
/// kernels' rate alone (`bench params`), a low rate here means the cores
/// were shared.
pub(crate) fn print_task_times(s: &JobStatus) {
    let t = s.task_times();
    if t.kernels > 0.0 {
        outln!(
            "  committed tasks: {:.2} s in kernels ({:.2} GFLOP/s while in them), {:.2} s runnable but waiting for a core",
            t.kernels,
            s.flops_done() / t.kernels / 1e9,
            t.core_wait
        );
        outln!(
            "  and waiting for reads: {:.2} s for blocks, {:.2} s for small objects (flags, dependency counters)",
            t.block_wait,
            t.small_wait
        );
        outln!(
            "  and {:.2} s between the tasks' begins and their dequeues' answers (round trips behind the previous task's ending, waits at barriers)",
            t.start
        );
        outln!(
            "  and {:.2} s, once computed, waiting for the previous task's ending (puts, record, commit: {:.2} ms each on average) to finish",
            t.settle,
            t.mean_ending() * 1e3
        );
        outln!("  and {:.2} s handing the tasks to their compute threads and back", t.handoff);
    }
}

/// `master verify JOB`: checks the result against an independent
/// computation; Ok(true) when it passes.
pub(crate) async fn verify(client: &Client, id: Uuid) -> anyhow::Result<bool> {
    let s = job_status(client, id).await?;
    match s.state() {
        "succeeded" => {}
        "failed" => bail!("job {id} {}; it has no result to verify", failure_line(&s)),
        "cancelled" => bail!("job {id} was cancelled; it has no result to verify"),
        state => bail!(
            "job {id} is {state} ({}/{} tasks); verify it once it has succeeded (`master wait {id}`)",
            s.n_done(),
            s.record.total_tasks()
        ),
    }
    let spec = s.record.spec.clone();
    let report = with_source(client, move |src| -> anyhow::Result<(bool, String)> {
        Ok(match &spec {
            JobSpec::Matmul { a, b, c, .. } => {
                if a.n_rows * a.n_cols + b.n_rows * b.n_cols + c.n_rows * c.n_cols <= 3 * 2048 * 2048 {
                    let r = apps::verify::matmul_vs_dgemm(src, a, b, c)?;
                    (r.passed(), format!("in-core dgemm: ‖C − A·B‖_F/(‖A‖_F‖B‖_F) = {:.3e} (tolerance {:.1e})", r.rel_residual, r.tolerance))
                } else {
                    let r = apps::verify::freivalds(src, a, b, c, 0x5eed, 20)?;
                    (
                        r.passed(),
                        format!(
                            "Freivalds, {} rounds: max ‖A(Bx) − Cx‖/(‖A‖‖B‖‖x‖) = {:.3e} (tolerance {:.1e}); a wrong C passes with probability ≤ {:.1e}",
                            r.rounds, r.rel_residual, r.tolerance, r.miss_probability
                        ),
                    )
                }
            }
            JobSpec::Cholesky { a, l, .. } => {
                let r = apps::verify::cholesky_residual(src, a, l)?;
                let tol = 1e-13 * a.n_rows as f64;
                (r <= tol, format!("‖A − L·Lᵀ‖_F/‖A‖_F = {r:.3e} (tolerance 1e-13·n = {tol:.1e})"))
            }
            JobSpec::Lu { job, a, lu, pivot, .. } => {
                let perm = if *pivot { Some(apps::lu::permutation(src, *job, lu)?) } else { None };
                let r = apps::verify::lu_residual(src, a, lu, perm.as_deref())?;
                let tol = 1e-13 * a.n_rows as f64;
                (r <= tol, format!("‖PA − L·U‖_F/‖A‖_F = {r:.3e} (tolerance 1e-13·n = {tol:.1e})"))
            }
            JobSpec::Raytrace { job, params, .. } => {
                let got = apps::raytrace::assemble(src, *job, params)?;
                let want = apps::raytrace::render(params)?;
                (got == want, format!("image {} bytes, byte-identical to a single-process render: {}", got.len(), got == want))
            }
        })
    })
    .await??;
    if report.0 {
        outln!("verified: {}", report.1);
    } else {
        outln!("verification FAILED: {}", report.1);
        if report.1.contains("NaN") {
            outln!("  the residual is NaN: the input or the result holds NaN or infinite values");
        }
    }
    Ok(report.0)
}

#[derive(clap::Args)]
pub(crate) struct JobArg {
    /// Job id (a unique prefix, or "last").
    pub(crate) job: String,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

pub(crate) async fn slaves(client: &Client) -> anyhow::Result<usize> {
    Ok(client.list_sessions().await?.iter().filter(|s| !s.client_name.starts_with("master")).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(n_tasks: usize, done: usize, finished: bool) -> JobStatus {
        let params = apps::raytrace::RenderParams { level: 0, width: 4, height: n_tasks as u32, grain: 1, samples: 1 };
        let spec = JobSpec::Raytrace { job: Uuid::new_v4(), name: "img".into(), params };
        let record = JobRecord { spec, bags: vec!["b".into()], n_tasks: vec![n_tasks], submitted_ms: 0, gang: None };
        let one = TaskDone { count: 1, slave: "s".into(), finished_ms: 1, compute_ms: 1, ..TaskDone::default() };
        JobStatus { record, per_bag: vec![], failed: None, cancelled: None, finished_ms: finished.then_some(1), done: vec![one; done] }
    }

    #[test]
    fn a_job_marked_finished_short_of_tasks_has_failed_and_says_so() {
        assert_eq!(status(3, 3, true).state(), "succeeded");
        assert_eq!(status(3, 1, false).state(), "running");
        let short = status(3, 1, true);
        assert_eq!(short.state(), "failed");
        assert!(failure_line(&short).contains("1 of 3 tasks committed"), "{}", failure_line(&short));
    }
}
