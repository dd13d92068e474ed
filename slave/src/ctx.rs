//! `apps::ctx::TaskCtx` over the store: every call is a request inside the
//! task's atomic action. Runs on a blocking thread (the kernels are long
//! BLAS calls) and drives the async client with `Handle::block_on`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apps::block::{Block, BlockId};
use apps::ctx::{CtxError, TaskCtx};
use store_client::{Action, BlockData, Client, StoreError};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// Bytes of blocks fetched (or written behind) ahead of the task, and at
/// least one block, two of blocks up to this size
/// ([`LargestBlock::blocks_ahead`]). One block of more than 2 MiB: the
/// slave holds at most four blocks (a matmul's accumulator, the current
/// pair, the next block), the memory bound. A local get (the node
/// passes the version file; the slave reads it) takes about 10 ms for 32 MiB against 300 ms
/// of dgemm per pair, so one block ahead hides every transfer but the
/// first of each pair. Smaller blocks go several ahead: a 512 KiB get in a
/// job takes 0.1–0.15 ms, mostly round trip, against 0.7 ms of dgemm, and
/// with one ahead the second block of every pair (and every read while the
/// last task's put was in flight) waited for its whole get (LU, n = 4096,
/// b = 256, one slave: 0.41 s of 1.77 waiting for reads).
pub(crate) const PREFETCH_BYTES: usize = 2 << 20;

/// See [`LargestBlock::blocks_ahead`].
fn blocks_ahead(largest: usize) -> usize {
    if largest == 0 || largest > PREFETCH_BYTES {
        1
    } else {
        (PREFETCH_BYTES / largest).max(2)
    }
}

/// Longest pause between two polls of a flag that no running task
/// produces ([`TaskCtx::await_flag`]); it is looked for again once the
/// producer has been dequeued again (after a crash, a lease later).
const MAX_FLAG_POLL: Duration = Duration::from_millis(100);

pub(crate) struct StoreCtx<'a> {
    pub(crate) rt: Handle,
    pub(crate) client: &'a Client,
    pub(crate) action: &'a Action,
    pub(crate) job: Uuid,
    pub(crate) prefetch: Prefetch,
    pub(crate) writes: Writes,
    /// Where the task's time went besides its kernels (the debug timeline).
    pub(crate) waits: ReadWaits,
}

/// Time a task spent waiting for its block reads: those a prefetch had
/// started, and those read in the open (none was running: the budget was
/// taken by a write behind, or the read was not announced); and for its
/// small reads (flags, a dag's dependency counters), each a round trip.
#[derive(Default, Debug)]
pub(crate) struct ReadWaits {
    pub(crate) prefetched: u32,
    pub(crate) prefetched_wait: Duration,
    pub(crate) in_open: u32,
    pub(crate) in_open_wait: Duration,
    pub(crate) small: u32,
    pub(crate) small_wait: Duration,
    /// Time in `write_block` (the copy of the block, the put's spawn).
    pub(crate) write_calls: Duration,
    /// The wait of the task's first block read, of either kind: it starts
    /// with the task, behind the previous task's ending (LU n = 8192,
    /// b = 256, one slave: 0.46 s of the job's 0.97 s of read waits,
    /// although every block was prefetched).
    pub(crate) first_wait: Duration,
}

impl ReadWaits {
    fn count(&mut self, prefetched: bool, waited: Duration) {
        if self.prefetched + self.in_open == 0 {
            self.first_wait = waited;
        }
        let (n, total) =
            if prefetched { (&mut self.prefetched, &mut self.prefetched_wait) } else { (&mut self.in_open, &mut self.in_open_wait) };
        *n += 1;
        *total += waited;
    }
}

/// A task's writes that run on the runtime while the task goes on
/// (write-behind): block puts (the block travels and the node syncs its
/// file while the slave computes the rest of the task, or the next task),
/// small-object writes and enqueues (a dag task's dependency releases are a
/// read, a write and maybe an enqueue per successor, and only the reads
/// need an answer: waiting for each write and enqueue made a Cholesky or
/// LU dag task at b = 256 about 20 gRPC round trips long; `strace`). The
/// action must not commit before every one of them succeeded
/// ([`Writes::finish`]).
pub(crate) struct Writes {
    running: Vec<(Target, JoinHandle<Result<(), StoreError>>)>,
    /// Blocks whose put has not finished, this task's and the previous
    /// task's (shared by the slave's tasks): they count against the
    /// prefetch budget, so a slave never holds more blocks than without
    /// write-behind.
    in_flight: Arc<PutsInFlight>,
    /// What the prefetch budget is counted in (shared by the slave's
    /// tasks).
    largest_block: Arc<LargestBlock>,
}

/// Bytes of the largest block the slave has read or written in its
/// current job. The largest, so that a job's larger blocks hold the
/// prefetch to fewer ahead from the first one moved; per job, so that a
/// job of small blocks after one of large blocks streams as many ahead as
/// its own blocks allow. (Kept over the slave's life, a Cholesky at
/// b = 1024 left the LU at b = 256 after it one block ahead instead of
/// four: LU n = 8192, one slave, waited 1.69 ms per multiply task for
/// reads the prefetch should have hidden, against 0.86 ms.)
#[derive(Debug, Default)]
pub(crate) struct LargestBlock(AtomicUsize);

impl LargestBlock {
    /// A new job starts: its blocks may be of any size.
    pub(crate) fn new_job(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    fn moved(&self, bytes: usize) {
        self.0.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Blocks the prefetch budget allows ahead: [`PREFETCH_BYTES`] of the
    /// largest block moved, and two of blocks no larger than it (one
    /// ahead, the second block of every pair waited for its whole get:
    /// LU n = 8192, b = 512, one slave, 0.9–1.04 s of a 9.5–10.0 s run
    /// waiting for reads, 0.47–0.51 s of 9.27–9.48 two ahead); one of
    /// larger blocks, or before any. (`model::Options::blocks_ahead`.)
    fn blocks_ahead(&self) -> usize {
        blocks_ahead(self.0.load(Ordering::Relaxed))
    }
}

/// What a write-behind writes: a later read or write of the same target
/// waits for it ([`Writes::settle`]).
#[derive(PartialEq)]
enum Target {
    Block(BlockId),
    /// The small objects one request writes.
    Small(Vec<String>),
    /// An enqueue: nothing reads it back before the commit.
    Queue,
}

impl Writes {
    pub(crate) fn new(in_flight: Arc<PutsInFlight>, largest_block: Arc<LargestBlock>) -> Self {
        Writes { running: Vec::new(), in_flight, largest_block }
    }

    fn moved(&self, block: &BlockData) {
        self.largest_block.moved(block.data.len() * 8);
    }

    /// Waits for every write; the first failure is returned (the action
    /// must then abort: some of the task's writes are not in the store).
    pub(crate) async fn finish(self) -> Result<(), StoreError> {
        let mut first = Ok(());
        for (_, h) in self.running {
            let r = h.await.unwrap_or_else(|e| Err(write_task_failed(e)));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Before a task takes another block buffer (a put, or a read the
    /// prefetch budget does not count): while the slave has as many block
    /// puts running as it may hold blocks ahead (two at least), waits for
    /// this task's oldest, or for the previous task's. A task that writes
    /// faster than the node takes its blocks (a tournament LU's swaps copy
    /// rows and compute nothing) otherwise held every block it had written,
    /// and one that reads for update while the previous task's last puts
    /// still run held those besides its own: slaves peaked at six 32 MiB
    /// blocks, against five in every other task.
    fn make_room(&mut self, rt: &Handle) -> Result<(), CtxError> {
        let most = self.largest_block.blocks_ahead().max(2);
        while self.in_flight.load() >= most {
            let Some(pos) = self.running.iter().position(|(t, _)| matches!(t, Target::Block(_))) else {
                self.in_flight.wait_below(rt, most);
                return Ok(());
            };
            let (_, h) = self.running.remove(pos);
            rt.block_on(h).unwrap_or_else(|e| Err(write_task_failed(e))).map_err(ctx_error)?;
        }
        Ok(())
    }

    /// Waits for the put of block `id`, if one runs.
    fn settle_block(&mut self, rt: &Handle, id: BlockId) -> Result<(), CtxError> {
        self.settle(rt, |t| *t == Target::Block(id))
    }

    /// Waits for the write of small object `key`, if one runs.
    fn settle_small(&mut self, rt: &Handle, key: &str) -> Result<(), CtxError> {
        self.settle(rt, |t| matches!(t, Target::Small(keys) if keys.iter().any(|k| k == key)))
    }

    /// Waits for the writes whose target is `hit`: read-your-own-writes,
    /// and two writes of one target reach the node in order.
    fn settle(&mut self, rt: &Handle, hit: impl Fn(&Target) -> bool) -> Result<(), CtxError> {
        while let Some(pos) = self.running.iter().position(|(t, _)| hit(t)) {
            let (_, h) = self.running.remove(pos);
            rt.block_on(h).unwrap_or_else(|e| Err(write_task_failed(e))).map_err(ctx_error)?;
        }
        Ok(())
    }
}

/// A write's runtime task that panicked or was cancelled.
fn write_task_failed(e: tokio::task::JoinError) -> StoreError {
    StoreError::StoreUnavailable { what: format!("write-behind task failed: {e}") }
}

/// Block puts not yet finished, over the slave's tasks (the previous
/// task's ending included), with a wake-up as each ends.
#[derive(Debug, Default)]
pub(crate) struct PutsInFlight {
    count: AtomicUsize,
    ended: tokio::sync::Notify,
}

/// How long a task waits for another task's puts before it goes on anyway
/// (one of them might wait for a lock this task holds; the lock's timeout
/// would end it, but a task need not wait that long to hold one block
/// more).
const OTHERS_PUTS_WAIT: Duration = Duration::from_secs(5);

impl PutsInFlight {
    fn load(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn started(self: &Arc<Self>) -> InFlight {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// Waits (on the task's thread) until fewer than `most` puts run, or
    /// [`OTHERS_PUTS_WAIT`] passed.
    fn wait_below(&self, rt: &Handle, most: usize) {
        let deadline = tokio::time::Instant::now() + OTHERS_PUTS_WAIT;
        loop {
            // Created before the count is read: a put ending in between
            // still wakes it.
            let ended = self.ended.notified();
            if self.load() < most {
                return;
            }
            if rt.block_on(async { tokio::time::timeout_at(deadline, ended).await }).is_err() {
                tracing::debug!(running = self.load(), "went on beside other tasks' puts");
                return;
            }
        }
    }
}

/// Counts a put out when it ends, however it ends.
struct InFlight(Arc<PutsInFlight>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// The task's announced reads ([`TaskCtx::prefetch`]): those not yet
/// started, and the transfers [`PREFETCH_BYTES`] allows running on the runtime
/// (under the task's own action, so they take the same read locks the task
/// would take a little later).
#[derive(Default)]
pub(crate) struct Prefetch {
    queued: VecDeque<BlockId>,
    running: VecDeque<(BlockId, JoinHandle<Result<BlockData, StoreError>>)>,
}

impl Drop for Prefetch {
    // A task that fails midway must not leave transfers holding memory.
    fn drop(&mut self) {
        for (_, h) in &self.running {
            h.abort();
        }
    }
}

impl StoreCtx<'_> {
    /// Reads `key` in a nested action, waiting on its producer's lock;
    /// keeps the read (and its lock) only if the flag is there.
    async fn wait_for_producer(&self, key: &str) -> Result<bool, StoreError> {
        let nested = self.action.begin_nested().await?;
        match nested.read_small(key, false).await {
            Ok(Some(_)) => nested.commit().await.map(|()| true),
            Ok(None) => nested.abort().await.map(|()| false),
            // The node gave up waiting (its lock timeout, or a deadlock
            // victim): look again after the pause.
            Err(StoreError::LockTimeout { .. } | StoreError::Deadlock { .. }) => {
                let _ = nested.abort().await;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Starts `write` of the small objects `keys` behind the task, once
    /// any earlier write of one of them has settled (their order on the
    /// node is the task's).
    fn write_smalls_behind(
        &mut self,
        keys: Vec<String>,
        write: impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
    ) -> Result<(), CtxError> {
        for key in &keys {
            self.writes.settle_small(&self.rt, key)?;
        }
        let h = self.rt.spawn(write);
        self.writes.running.push((Target::Small(keys), h));
        Ok(())
    }

    /// A small read (`write`: under a write lock, to update it next),
    /// timed for the debug timeline.
    fn read_small_as(&mut self, key: &str, write: bool) -> Result<Option<Vec<u8>>, CtxError> {
        self.writes.settle_small(&self.rt, key)?;
        let started = Instant::now();
        let value = self.rt.block_on(self.action.read_small(key, write)).map_err(ctx_error);
        self.waits.small += 1;
        self.waits.small_wait += started.elapsed();
        value
    }

    fn top_up(&mut self) {
        let ahead = self.writes.largest_block.blocks_ahead();
        while self.prefetch.running.len() + self.writes.in_flight.load() < ahead {
            let Some(id) = self.prefetch.queued.pop_front() else {
                break;
            };
            let reader = self.action.block_reader();
            let h = self.rt.spawn(async move { reader.get_block(id.matrix.0, id.i, id.j).await });
            self.prefetch.running.push_back((id, h));
        }
    }
}

pub(crate) fn ctx_error(e: StoreError) -> CtxError {
    match e {
        StoreError::NotFound { what } => CtxError::NotFound { what },
        e => {
            let retryable = e.is_retryable();
            CtxError::Store { source: Box::new(e), retryable }
        }
    }
}

impl TaskCtx for StoreCtx<'_> {
    fn job(&self) -> Uuid {
        self.job
    }

    fn read_block(&mut self, id: BlockId) -> Result<Block, CtxError> {
        self.writes.settle_block(&self.rt, id)?;
        // A block read out of the announced order (or never announced) is
        // fetched directly; the announced ones keep streaming.
        self.top_up();
        let started = Instant::now();
        let running = self.prefetch.running.iter().position(|(r, _)| *r == id);
        let b = if let Some(pos) = running {
            let (_, h) = self.prefetch.running.remove(pos).expect("position is in range");
            self.top_up();
            self.rt
                .block_on(h)
                .map_err(|e| ctx_error(StoreError::StoreUnavailable { what: format!("prefetch task failed: {e}") }))?
                .map_err(ctx_error)?
        } else {
            if let Some(pos) = self.prefetch.queued.iter().position(|q| *q == id) {
                self.prefetch.queued.remove(pos);
            }
            self.writes.make_room(&self.rt)?;
            self.rt.block_on(self.action.get_block(id.matrix.0, id.i, id.j)).map_err(ctx_error)?
        };
        self.waits.count(running.is_some(), started.elapsed());
        self.writes.moved(&b);
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn prefetch(&mut self, ids: &[BlockId]) -> Result<(), CtxError> {
        self.prefetch.queued.extend(ids.iter().copied());
        self.top_up();
        Ok(())
    }

    fn read_block_for_update(&mut self, id: BlockId) -> Result<Block, CtxError> {
        self.writes.settle_block(&self.rt, id)?;
        self.writes.make_room(&self.rt)?;
        let started = Instant::now();
        let b = self.rt.block_on(self.action.get_block_for_update(id.matrix.0, id.i, id.j)).map_err(ctx_error)?;
        self.waits.count(false, started.elapsed());
        self.writes.moved(&b);
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn write_block(&mut self, id: BlockId, block: &Block) -> Result<(), CtxError> {
        self.write_block_owned(id, block.clone())
    }

    fn write_block_owned(&mut self, id: BlockId, block: Block) -> Result<(), CtxError> {
        let started = Instant::now();
        self.writes.settle_block(&self.rt, id)?;
        self.writes.make_room(&self.rt)?;
        let data = BlockData { rows: block.rows, cols: block.cols, data: block.data };
        self.writes.moved(&data);
        let writer = self.action.block_writer();
        let guard = self.writes.in_flight.started();
        let h = self.rt.spawn(async move {
            let _guard = guard;
            writer.put_block(id.matrix.0, id.i, id.j, data).await
        });
        self.writes.running.push((Target::Block(id), h));
        self.waits.write_calls += started.elapsed();
        Ok(())
    }

    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError> {
        self.read_small_as(key, false)
    }

    fn read_small_for_update(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError> {
        self.read_small_as(key, true)
    }

    /// One request for all of them (a dag task's dependency releases: one
    /// round trip each took 0.13 ms in a job, 177 ms of a 947 ms Cholesky
    /// at b = 256).
    fn read_smalls_for_update(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, CtxError> {
        for key in keys {
            self.writes.settle_small(&self.rt, key)?;
        }
        let started = Instant::now();
        let values = self.rt.block_on(self.action.read_smalls(keys, true)).map_err(ctx_error);
        self.waits.small += 1;
        self.waits.small_wait += started.elapsed();
        values
    }

    /// Written behind, like a block: the action commits only after it
    /// succeeded ([`Writes::finish`]).
    fn write_small(&mut self, key: &str, value: &[u8]) -> Result<(), CtxError> {
        let write = self.action.write_small(key, value);
        self.write_smalls_behind(vec![key.to_owned()], write)
    }

    /// Written behind in one request ([`TaskCtx::write_smalls`]).
    fn write_smalls(&mut self, items: &[(String, Vec<u8>)]) -> Result<(), CtxError> {
        let write = self.action.write_smalls(items);
        self.write_smalls_behind(items.iter().map(|(k, _)| k.clone()).collect(), write)
    }

    /// Waits for a flag (single-bag Cholesky). A committed flag is found by
    /// a peek without a lock, then read under a read lock. An absent one's
    /// producer, if it runs, holds the flag's write lock from its start
    /// (see `apps::cholesky`), so a read in a nested action waits on that
    /// lock and returns when the producer commits: no polling, no latency.
    /// If the flag is still absent (the producer died and its action was
    /// aborted, or none has started), the nested action is aborted, which
    /// drops its read lock so that it never holds up the next producer,
    /// and the wait polls with back-off until `timeout`. A zero `timeout`
    /// only looks.
    fn await_flag(&mut self, key: &str, timeout: Duration) -> Result<bool, CtxError> {
        self.writes.settle_small(&self.rt, key)?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            if self.rt.block_on(self.client.peek_small(key)).map_err(ctx_error)?.is_some() {
                return Ok(self.read_small(key)?.is_some());
            }
            if timeout.is_zero() {
                return Ok(false);
            }
            if self.rt.block_on(self.wait_for_producer(key)).map_err(ctx_error)? {
                return Ok(true);
            }
            if start.elapsed() >= timeout {
                return Ok(false);
            }
            std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
            pause = (pause * 2).min(MAX_FLAG_POLL);
        }
    }

    /// Enqueued behind the task, like a small write; the element is
    /// pending until the commit anyway.
    fn enqueue(&mut self, bag: &str, task: &[u8]) -> Result<(), CtxError> {
        let h = self.rt.spawn(self.action.enqueue(bag, task));
        self.writes.running.push((Target::Queue, h));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::PutsInFlight;
    use std::sync::Arc;

    /// A task waiting for room finds it only once another task's put ended.
    #[test]
    fn a_task_waits_for_other_tasks_puts() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let puts = Arc::new(PutsInFlight::default());
        let (first, second) = (puts.started(), puts.started());
        // The "previous task's" first put ends a little later, on the runtime.
        rt.spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(first);
        });
        puts.wait_below(rt.handle(), 2);
        assert_eq!(puts.load(), 1, "went on while two puts ran");
        drop(second);
        assert_eq!(puts.load(), 0);
        puts.wait_below(rt.handle(), 1);
    }

    /// The model predicts this slave's overlap from its prefetch budget.
    #[test]
    fn the_model_knows_the_prefetch_budget() {
        assert_eq!(super::PREFETCH_BYTES as f64, model::SLAVE_PREFETCH_BYTES);
        let model = model::Options { slave_prefetch_bytes: model::SLAVE_PREFETCH_BYTES, ..model::Options::default() };
        for b in [16usize, 100, 256, 300, 362, 363, 512, 513, 1024, 2048] {
            assert_eq!(super::blocks_ahead(8 * b * b) as u64, model.blocks_ahead(b as u64), "b = {b}");
        }
    }

    /// The first block read's wait is kept apart, whichever kind it was.
    #[test]
    fn the_first_read_s_wait_is_kept_apart() {
        use std::time::Duration;
        let mut waits = super::ReadWaits::default();
        waits.count(false, Duration::from_micros(700));
        waits.count(true, Duration::from_micros(20));
        waits.count(true, Duration::from_micros(30));
        assert_eq!(waits.first_wait, Duration::from_micros(700));
        assert_eq!((waits.prefetched, waits.in_open), (2, 1));
        assert_eq!(waits.prefetched_wait, Duration::from_micros(50));
    }

    /// A job's blocks set its own prefetch depth, whatever the job before
    /// it moved.
    #[test]
    fn a_job_of_small_blocks_after_large_ones_streams_several_ahead() {
        let largest = super::LargestBlock::default();
        assert_eq!(largest.blocks_ahead(), 1, "nothing moved yet");
        let small = 256 * 256 * 8;
        largest.moved(1024 * 1024 * 8);
        largest.moved(small);
        assert_eq!(largest.blocks_ahead(), 1, "the job's largest block counts");
        largest.new_job();
        largest.moved(small);
        assert_eq!(largest.blocks_ahead(), super::PREFETCH_BYTES / small);
        assert!(largest.blocks_ahead() > 1);
    }
}
