//! Per-task costs through a real node: empty tasks, dag releases, task
//! endings and starts behind them.

use super::*;

/// Puts `block` as block `(i, j)` of `matrix` in an action of its own;
/// returns the seconds of begin, put and commit.
pub(super) async fn timed_put(session: &store_client::Session, matrix: uuid::Uuid, i: u32, j: u32, block: Block) -> anyhow::Result<f64> {
    let t = Instant::now();
    let a = session.begin().await?;
    a.put_block(matrix, i, j, BlockData { rows: block.rows, cols: block.cols, data: block.data }).await?;
    a.commit().await?;
    Ok(t.elapsed().as_secs_f64())
}

/// Runs `n` empty tasks through `bag` as a slave's loop does (begin,
/// dequeue, a done record, commit), each after `pause`; returns their times.
pub(super) async fn empty_tasks(session: &store_client::Session, bag: &str, n: usize, pause: Duration) -> anyhow::Result<Vec<f64>> {
    let a = session.begin().await?;
    for k in 0..n {
        a.enqueue(bag, &(k as u64).to_le_bytes()).await?;
    }
    a.commit().await?;
    let mut times = Vec::with_capacity(n);
    loop {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let t = Instant::now();
        let a = session.begin().await?;
        let Dequeue::Task(task) = a.dequeue(bag, Duration::ZERO).await? else {
            a.abort().await?;
            return Ok(times);
        };
        a.write_small(&format!("{bag}/done/{}", task.seq), &[1u8; 64]).await?;
        a.commit().await?;
        times.push(t.elapsed().as_secs_f64());
    }
}

/// Counters the measured release requests name, few and many: a dag
/// Cholesky task names one per successor, 10 on average at p = 16
/// (n = 4096, b = 256: 1,360 releases by 135 tasks) and 21 at p = 32. The
/// two sizes give the request's fixed part and its cost per counter.
pub(super) const RELEASE_COUNTERS: [usize; 2] = [4, 32];

/// Release requests as a dag Cholesky task makes them after its kernels,
/// from its blocking thread: `counters` successors' counters
/// read under their write locks in one request (waited for) and written
/// back behind in another (not waited for). Returns the time of each of `n`.
pub(super) async fn dag_releases(session: &store_client::Session, n: usize, counters: usize) -> anyhow::Result<Vec<f64>> {
    let keys = move |r: usize| -> Vec<String> { (0..counters).map(|k| format!("bench-params/counter/{counters}/{r}/{k}")).collect() };
    let a = session.begin().await?;
    for r in 0..n {
        for key in keys(r) {
            a.write_small(&key, &2u32.to_le_bytes()).await?;
        }
    }
    a.commit().await?;
    let a = session.begin().await?;
    let rt = tokio::runtime::Handle::current();
    let (a, times) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut times = Vec::with_capacity(n);
        let mut behind = Vec::with_capacity(n);
        for r in 0..n {
            let keys = keys(r);
            let t = Instant::now();
            let values = rt.block_on(a.read_smalls(&keys, true))?;
            for (key, v) in keys.iter().zip(&values) {
                anyhow::ensure!(v.as_deref() == Some(&2u32.to_le_bytes()[..]), "counter {key} read back as {v:?}");
            }
            let written: Vec<(String, Vec<u8>)> = keys.iter().map(|k| (k.clone(), 1u32.to_le_bytes().to_vec())).collect();
            behind.push(rt.spawn(a.write_smalls(&written)));
            times.push(t.elapsed().as_secs_f64());
        }
        for h in behind {
            rt.block_on(h)??;
        }
        Ok((a, times))
    })
    .await??;
    a.commit().await?;
    Ok(times)
}

/// A slave's costs per task beyond its blocks and kernels (seconds).
pub(crate) struct TaskCosts {
    /// The round trips of an empty task (`Params::task_overhead`).
    pub(crate) overhead: f64,
    /// What they take more after a kernel's worth of idling (`task_wake`).
    pub(crate) wake: f64,
    /// One dag Cholesky task's release request, its fixed part
    /// (`dag_release`) ...
    pub(crate) release: f64,
    /// ... and what it takes more per counter (`dag_release_per_counter`).
    pub(crate) release_per_counter: f64,
}

/// The per-task costs through `session`'s node, as `bench params`
/// measures them.
pub(super) async fn task_costs(session: &store_client::Session, quick: bool) -> anyhow::Result<TaskCosts> {
    let n_tasks = if quick { 50 } else { 200 };
    let overhead = median(&mut empty_tasks(session, "bench-params/overhead", n_tasks, Duration::ZERO).await?);
    // The same after a pause as long as a small task's compute, with the
    // client and the node idle meanwhile: what a slave's first round trips
    // after a kernel pay.
    let mut after_idle = empty_tasks(session, "bench-params/overhead-after-idle", n_tasks / 2, IDLE_BEFORE_TASK).await?;
    let wake = (median(&mut after_idle) - overhead).max(0.0);
    let [few, many] = RELEASE_COUNTERS;
    let t_few = median(&mut dag_releases(session, n_tasks, few).await?);
    let t_many = median(&mut dag_releases(session, n_tasks, many).await?);
    // Noise must not make either part negative.
    let release_per_counter = ((t_many - t_few) / (many - few) as f64).max(0.0);
    let release = (t_few - few as f64 * release_per_counter).max(0.0);
    Ok(TaskCosts { overhead, wake, release, release_per_counter })
}

/// The per-task costs measured again through a running node, as `bench
/// validate` does before each point: on this host they drift as the
/// kernels do (overhead and wake together 0.47, 0.98 and 1.0 ms in three
/// `bench params` runs within an hour), and a job pays them per task.
pub(crate) async fn task_costs_now(client: &Client, quick: bool) -> anyhow::Result<TaskCosts> {
    let session = client.open_session("bench-task-costs").await?;
    task_costs(&session, quick).await
}

/// A task's ending and a task start behind it, at blocks of side `b`,
/// measured again through a running node as `bench params` measures them
/// ([`task_starts_behind_endings`]), for `bench validate` before each
/// block size: they follow the disk's sync latency, which drifts here as
/// the kernels do (the mean ending at 512 KiB read 0.74, 0.91 and 1.09 ms
/// in three `bench params` runs within a day), and a dag task's
/// successors wait for its ending. Returns `(start behind, ending)`.
///
/// The matrix is filled first, so that every timed put replaces an older
/// version of its block, as a job's and `bench params`' do: a block's
/// first version costs a put far more (fresh pages and extents), and
/// endings timed on those would price every job's too high.
pub(crate) async fn endings_now(client: &Client, b: usize) -> anyhow::Result<(Point, Point)> {
    // 16 blocks, each then overwritten twice.
    let g = 4u32;
    let id = filled_matrix(client, &format!("bench-endings-now-{}-{b}", std::process::id()), b, g).await?;
    let measured = task_starts_behind_endings(client, &[(b, id, g)]).await;
    client.delete_matrix(id).await?;
    let (starts, endings) = measured?;
    Ok((starts[0], endings[0]))
}

/// A task's ending as a slave runs it behind its next task: a put of
/// `block` at `at`, the task's done record if given, the commit.
pub(super) async fn task_ending(
    session: std::sync::Arc<store_client::Session>,
    matrix: uuid::Uuid,
    at: (u32, u32),
    block: Block,
    record: Option<String>,
) -> Result<(), store_client::StoreError> {
    let a = session.begin().await?;
    a.put_block(matrix, at.0, at.1, BlockData { rows: block.rows, cols: block.cols, data: block.data }).await?;
    if let Some(key) = record {
        a.write_small(&key, &[1u8; 64]).await?;
    }
    a.commit().await
}

/// Task starts as a slave makes them under write-behind
/// (`Params::task_start_behind`; `slave::start_task`), timed while the
/// previous task's ending runs (`ending_behind`: its put sent as the task
/// wrote its block, then behind the start the done record written and
/// the commit), and alternately with nothing behind them. Per block size, the median start
/// behind an ending less the median quiet one (at least a microsecond:
/// noise must not make a rate negative); and the endings' own time, from
/// the task's hand-back to their commit answered (`Params::task_ending`):
/// the mean, as a job pays every ending's whole time where it waits for
/// them (their tail is long: 1.0 ms median, 1.3 ms mean at 512 KiB in a
/// Cholesky job).
pub(super) async fn task_starts_behind_endings(
    client: &Client,
    matrices: &[(usize, uuid::Uuid, u32)],
) -> anyhow::Result<(Vec<Point>, Vec<Point>)> {
    let session = std::sync::Arc::new(client.open_session("bench-params-start-behind").await?);
    let (mut out, mut endings) = (Vec::new(), Vec::new());
    for &(b, id, g) in matrices {
        let bag = format!("bench-params/start-behind/{b}");
        // At least 32 of each kind: a size of few blocks gave one
        // median of 9 that was half its neighbours'.
        let n = (2 * g * g).max(64);
        let a = session.begin().await?;
        for k in 0..n {
            a.enqueue(&bag, &k.to_le_bytes()).await?;
        }
        a.commit().await?;
        let (mut quiet, mut behind, mut ended) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..n {
            // As after a task's kernels: the node and the client idle.
            tokio::time::sleep(PUT_PAUSE).await;
            let ending = if k % 2 == 1 {
                let at = ((k / 2) % g, (k / 2 / g) % g);
                let record = format!("bench-params/start-behind/done/{b}/{k}");
                Some(ending_behind(session.clone(), id, at, random_block(b, k as u64), record).await?)
            } else {
                None
            };
            let t = Instant::now();
            let ((failed, _), taken) = slave::start_task(client, &session, "bench-params/start-behind/failed", &bag, t).await;
            let (a, _, task) = taken?;
            anyhow::ensure!(failed?.is_none(), "no failure flag was written");
            let Dequeue::Task(_) = task? else { anyhow::bail!("bag {bag} ran dry") };
            let took = t.elapsed().as_secs_f64();
            a.commit().await?;
            match ending {
                Some(e) => {
                    ended.push(e.await??);
                    behind.push(took);
                }
                None => quiet.push(took),
            }
        }
        out.push(Point { units: (8 * b * b) as f64, secs: (median(&mut behind) - median(&mut quiet)).max(1e-6) });
        endings.push(Point { units: (8 * b * b) as f64, secs: ended.iter().sum::<f64>() / ended.len().max(1) as f64 });
    }
    Ok((out, endings))
}

/// A task's ending as a slave runs it (`slave::worker`): the done record
/// read for update first (the slave reads it as the task starts), the
/// block's put sent from the task's thread as it writes the block, the
/// thread handing back to the runtime, then, spawned beside the slave's
/// next start, the put awaited, the done record written, the commit.
/// The spawned part answers its seconds from the hand-back, as a task
/// record's `prev_ending_us` counts them.
pub(super) async fn ending_behind(
    session: std::sync::Arc<store_client::Session>,
    matrix: uuid::Uuid,
    at: (u32, u32),
    block: Block,
    record: String,
) -> anyhow::Result<tokio::task::JoinHandle<Result<f64, store_client::StoreError>>> {
    let a = session.begin().await?;
    a.read_small(&record, true).await?;
    let writer = a.block_writer();
    let data = BlockData { rows: block.rows, cols: block.cols, data: block.data };
    let put = tokio::spawn(async move { writer.put_block(matrix, at.0, at.1, data).await });
    tokio::task::spawn_blocking(|| ()).await?;
    let t = Instant::now();
    Ok(tokio::spawn(async move {
        put.await.map_err(|e| store_client::StoreError::StoreUnavailable { what: format!("put task failed: {e}") })??;
        a.write_small(&record, &[1u8; 64]).await?;
        a.commit().await?;
        Ok(t.elapsed().as_secs_f64())
    }))
}
