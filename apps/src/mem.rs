//! An in-memory store and executor: [`MemStore`] holds blocks and small
//! objects in hash maps, [`MemCtx`] implements [`TaskCtx`] over it with the
//! same all-or-nothing semantics as the real store (writes and enqueues are
//! buffered and applied only on commit), and [`run_plan`] runs a job's bags
//! in sequence on one thread, counting every block read and write per task.
//!
//! Used by the tests and by the performance model's volume checks.

use crate::block::{Block, BlockId, MatrixMeta};
use crate::ctx::{CtxError, TaskCtx};
use crate::generate::{generate_block, MatrixKind};
use crate::job::{self, JobSpec, Plan, TaskError};
use crate::verify::BlockSource;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Blocks and small objects, in memory.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    /// Every block written so far.
    pub blocks: HashMap<BlockId, Block>,
    /// Every small object.
    pub small: HashMap<String, Vec<u8>>,
}

/// Counts of what one task (or a whole run) touched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskStats {
    /// Block reads.
    pub block_reads: u64,
    /// Block writes.
    pub block_writes: u64,
    /// Bytes of the blocks read (8 per element).
    pub block_read_bytes: u64,
    /// Bytes of the blocks written.
    pub block_write_bytes: u64,
    /// Small-object reads (including flag waits).
    pub small_reads: u64,
    /// Small-object writes.
    pub small_writes: u64,
    /// Enqueues.
    pub enqueues: u64,
    /// Blocks prefetched ([`TaskCtx::prefetch`]).
    pub prefetched: u64,
    /// Reads that broke the order announced by a prefetch hint (must be 0).
    pub prefetch_misses: u64,
    /// Reads of small objects the task made right after it wrote a block
    /// (no block read, so no compute, in between): on a slave that put is
    /// still on its way to the node behind the task (write-behind), and
    /// such a read waited for it (a dag task's release: 0.8 ms against
    /// 0.3, n = 8192, b = 256).
    pub small_reads_behind_puts: u64,
}

impl std::ops::AddAssign for TaskStats {
    fn add_assign(&mut self, o: TaskStats) {
        self.block_reads += o.block_reads;
        self.block_writes += o.block_writes;
        self.block_read_bytes += o.block_read_bytes;
        self.block_write_bytes += o.block_write_bytes;
        self.small_reads += o.small_reads;
        self.small_writes += o.small_writes;
        self.enqueues += o.enqueues;
        self.prefetched += o.prefetched;
        self.prefetch_misses += o.prefetch_misses;
        self.small_reads_behind_puts += o.small_reads_behind_puts;
    }
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Generates every block of `meta`.
    pub fn generate(&mut self, meta: &MatrixMeta, kind: MatrixKind, seed: u64) {
        for id in meta.blocks() {
            self.blocks.insert(id, generate_block(kind, seed, meta, id.i, id.j));
        }
    }

    /// Stores a whole column-major `n_rows × n_cols` matrix, block by block.
    /// Returns `false` (storing nothing) if `data` has the wrong length.
    pub fn insert_dense(&mut self, meta: &MatrixMeta, data: &[f64]) -> bool {
        let (n, m) = (meta.n_rows as usize, meta.n_cols as usize);
        if data.len() != n * m {
            return false;
        }
        for id in meta.blocks() {
            let (rows, cols) = meta.block_shape(id.i, id.j);
            let (r0, c0) = (meta.row_offset(id.i) as usize, meta.col_offset(id.j) as usize);
            let mut b = Block::zeros(rows, cols);
            for c in 0..cols {
                for r in 0..rows {
                    b.set(r, c, data[(r0 + r) + (c0 + c) * n]);
                }
            }
            self.blocks.insert(id, b);
        }
        true
    }

    /// The whole matrix, column-major; `None` if a block is missing or misshapen.
    pub fn to_dense(&self, meta: &MatrixMeta) -> Option<Vec<f64>> {
        let n = meta.n_rows as usize;
        let mut out = vec![0.0; n * meta.n_cols as usize];
        for id in meta.blocks() {
            let b = self.blocks.get(&id)?;
            if (b.rows, b.cols) != meta.block_shape(id.i, id.j) {
                return None;
            }
            let (r0, c0) = (meta.row_offset(id.i) as usize, meta.col_offset(id.j) as usize);
            for c in 0..b.cols {
                for r in 0..b.rows {
                    out[(r0 + r) + (c0 + c) * n] = b.get(r, c);
                }
            }
        }
        Some(out)
    }

    /// Runs one task in its own action: on success its writes, small objects
    /// and enqueues are applied (enqueues are returned, not queued); on error
    /// nothing is.
    pub fn run_one(&mut self, spec: &JobSpec, task: &[u8], tries: u32) -> Result<Committed, TaskError> {
        let mut ctx = MemCtx::new(self, spec.job());
        let out = job::run_task(spec, task, tries, &mut ctx)?;
        let stats = ctx.stats;
        let pending = ctx.into_pending();
        let enqueued = self.apply(pending);
        Ok(Committed { stats, enqueued, flops: out.flops })
    }

    fn apply(&mut self, p: Pending) -> Vec<(String, Vec<u8>)> {
        self.blocks.extend(p.blocks);
        self.small.extend(p.small);
        p.enqueued
    }
}

/// What a committed [`MemStore::run_one`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Committed {
    /// What the task touched.
    pub stats: TaskStats,
    /// `(bag, task)` pairs it enqueued, in order.
    pub enqueued: Vec<(String, Vec<u8>)>,
    /// Its flops.
    pub flops: f64,
}

/// The missing object of a failed [`MemStore`] read.
#[derive(Debug, thiserror::Error)]
#[error("no block {0}")]
pub struct MemMissing(pub BlockId);

impl BlockSource for MemStore {
    type Error = MemMissing;
    fn read_block(&mut self, id: BlockId) -> Result<Block, MemMissing> {
        self.blocks.get(&id).cloned().ok_or(MemMissing(id))
    }
    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, MemMissing> {
        Ok(self.small.get(key).cloned())
    }
}

struct Pending {
    blocks: HashMap<BlockId, Block>,
    small: HashMap<String, Vec<u8>>,
    enqueued: Vec<(String, Vec<u8>)>,
}

/// One task's action over a [`MemStore`]: reads see the task's own pending
/// writes first; nothing reaches the store unless the task succeeds.
pub struct MemCtx<'a> {
    store: &'a MemStore,
    job: uuid::Uuid,
    pending: Pending,
    hint: VecDeque<BlockId>,
    /// The task wrote a block and has not read one since.
    put_just_sent: bool,
    /// What the task has touched so far.
    pub stats: TaskStats,
}

impl<'a> MemCtx<'a> {
    /// A fresh action over `store` for job `job`.
    pub fn new(store: &'a MemStore, job: uuid::Uuid) -> Self {
        MemCtx {
            store,
            job,
            pending: Pending { blocks: HashMap::new(), small: HashMap::new(), enqueued: vec![] },
            hint: VecDeque::new(),
            put_just_sent: false,
            stats: TaskStats::default(),
        }
    }

    fn into_pending(self) -> Pending {
        self.pending
    }

    /// The task's own pending write of a block, else the store's.
    fn block(&self, id: BlockId) -> Result<Block, CtxError> {
        self.pending
            .blocks
            .get(&id)
            .or_else(|| self.store.blocks.get(&id))
            .cloned()
            .ok_or_else(|| CtxError::NotFound { what: id.to_string() })
    }

    fn counted_read(&mut self, id: BlockId) -> Result<Block, CtxError> {
        self.put_just_sent = false;
        let b = self.block(id)?;
        self.stats.block_read_bytes += 8 * (b.rows * b.cols) as u64;
        Ok(b)
    }

    fn small(&self, key: &str) -> Option<Vec<u8>> {
        self.pending.small.get(key).or_else(|| self.store.small.get(key)).cloned()
    }
}

impl TaskCtx for MemCtx<'_> {
    fn job(&self) -> uuid::Uuid {
        self.job
    }
    fn prefetch(&mut self, ids: &[BlockId]) -> Result<(), CtxError> {
        // Keep the hint to check that reads then come in exactly this order,
        // as a streaming slave would deliver them.
        self.stats.prefetched += ids.len() as u64;
        self.hint.extend(ids.iter().copied());
        Ok(())
    }
    fn read_block(&mut self, id: BlockId) -> Result<Block, CtxError> {
        self.stats.block_reads += 1;
        if let Some(want) = self.hint.pop_front() {
            if want != id {
                self.stats.prefetch_misses += 1;
            }
        }
        self.counted_read(id)
    }
    fn read_block_for_update(&mut self, id: BlockId) -> Result<Block, CtxError> {
        // As the slave does: a read for update takes a write lock at once,
        // outside the announced stream, so it does not consume the hint.
        self.stats.block_reads += 1;
        self.counted_read(id)
    }
    fn write_block(&mut self, id: BlockId, block: &Block) -> Result<(), CtxError> {
        self.stats.block_writes += 1;
        self.put_just_sent = true;
        self.stats.block_write_bytes += 8 * (block.rows * block.cols) as u64;
        self.pending.blocks.insert(id, block.clone());
        Ok(())
    }
    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError> {
        self.stats.small_reads += 1;
        if self.put_just_sent {
            self.stats.small_reads_behind_puts += 1;
        }
        Ok(self.small(key))
    }
    fn write_small(&mut self, key: &str, value: &[u8]) -> Result<(), CtxError> {
        self.stats.small_writes += 1;
        self.pending.small.insert(key.to_string(), value.to_vec());
        Ok(())
    }
    fn await_flag(&mut self, key: &str, _timeout: Duration) -> Result<bool, CtxError> {
        // One thread, tasks run in bag order: a flag absent now never appears
        // while we wait, so answer at once (a real store would wait).
        self.stats.small_reads += 1;
        Ok(self.small(key).is_some())
    }
    fn enqueue(&mut self, bag: &str, task: &[u8]) -> Result<(), CtxError> {
        self.stats.enqueues += 1;
        self.pending.enqueued.push((bag.to_string(), task.to_vec()));
        Ok(())
    }
}

/// One committed task of a [`run_plan`] run.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    /// Bag it came from.
    pub bag: String,
    /// Its descriptor.
    pub task: Vec<u8>,
    /// What it touched.
    pub stats: TaskStats,
    /// Its flops.
    pub flops: f64,
}

/// Every task of a run, in commit order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    /// Committed tasks, in order.
    pub tasks: Vec<TaskRecord>,
}

impl RunReport {
    /// Totals over all tasks.
    pub fn totals(&self) -> TaskStats {
        let mut t = TaskStats::default();
        for r in &self.tasks {
            t += r.stats;
        }
        t
    }
}

/// Why [`run_plan`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A task failed; nothing of it was applied.
    #[error("task {task} of bag {bag} failed: {source}")]
    Task {
        /// The bag.
        bag: String,
        /// The descriptor, as text.
        task: String,
        /// Why.
        #[source]
        source: TaskError,
    },
    /// A task enqueued into a bag that is not in the plan (or already done).
    #[error("task enqueued into unknown or finished bag {bag}")]
    UnknownBag {
        /// The bag named.
        bag: String,
    },
}

/// Runs every bag of `plan` in order, one task at a time, each in its own
/// all-or-nothing action, until every bag is empty.
pub fn run_plan(store: &mut MemStore, spec: &JobSpec, plan: &Plan) -> Result<RunReport, RunError> {
    for (k, v) in &plan.initial_small {
        store.small.insert(k.clone(), v.clone());
    }
    let mut report = RunReport::default();
    for bag in &plan.bags {
        let mut queue: VecDeque<Vec<u8>> = bag.tasks.iter().cloned().collect();
        while let Some(task) = queue.pop_front() {
            let Committed { stats, enqueued, flops } = store.run_one(spec, &task, 0).map_err(|source| RunError::Task {
                bag: bag.name.clone(),
                task: String::from_utf8_lossy(&task).into_owned(),
                source,
            })?;
            for (name, t) in enqueued {
                if name == bag.name {
                    queue.push_back(t);
                } else {
                    // Only the current bag may grow: later bags are fixed by the plan.
                    return Err(RunError::UnknownBag { bag: name });
                }
            }
            report.tasks.push(TaskRecord { bag: bag.name.clone(), task, stats, flops });
        }
    }
    Ok(report)
}

/// Counts of a [`run_plan_chaos`] run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChaosReport {
    /// Committed tasks, in commit order.
    pub run: RunReport,
    /// Attempts aborted on purpose (a simulated slave kill).
    pub killed: u64,
    /// Attempts that failed with a requeue- or retry-class error
    /// (e.g. a single-bag flag timeout) and went back to the bag.
    pub requeued: u64,
}

/// Like [`run_plan`], but as many slaves would see it: each step takes a
/// random task among the first `window` of the bag (the ones concurrent
/// slaves could hold), and kills each attempt with probability `p_kill`
/// (its action is dropped, the task returns to its place with one more
/// attempt). Requeue/retry-class errors also return the task. Seeded, so a
/// failure is reproducible. Gives up (returns the last error) if one task
/// fails more than `max_tries` times.
pub fn run_plan_chaos(
    store: &mut MemStore,
    spec: &JobSpec,
    plan: &Plan,
    seed: u64,
    window: usize,
    p_kill: f64,
    max_tries: u32,
) -> Result<ChaosReport, RunError> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (k, v) in &plan.initial_small {
        store.small.insert(k.clone(), v.clone());
    }
    let mut rep = ChaosReport::default();
    for bag in &plan.bags {
        let mut queue: VecDeque<(Vec<u8>, u32)> = bag.tasks.iter().map(|t| (t.clone(), 0)).collect();
        while !queue.is_empty() {
            let pick = rng.gen_range(0..window.max(1).min(queue.len()));
            let (task, tries) = queue.remove(pick).unwrap_or_default();
            let fail = |source| RunError::Task { bag: bag.name.clone(), task: String::from_utf8_lossy(&task).into_owned(), source };
            if rng.gen_bool(p_kill.clamp(0.0, 1.0)) {
                // Killed mid-task: run it to touch the store, then drop the action.
                let mut ctx = MemCtx::new(store, spec.job());
                let _ = job::run_task(spec, &task, tries, &mut ctx);
                rep.killed += 1;
                queue.insert(pick, (task, tries + 1));
                continue;
            }
            match store.run_one(spec, &task, tries) {
                Ok(Committed { stats, enqueued, flops }) => {
                    for (name, t) in enqueued {
                        if name != bag.name {
                            return Err(RunError::UnknownBag { bag: name });
                        }
                        queue.push_back((t, 0));
                    }
                    rep.run.tasks.push(TaskRecord { bag: bag.name.clone(), task, stats, flops });
                }
                Err(e) if e.is_retryable() && tries < max_tries => {
                    rep.requeued += 1;
                    queue.insert(pick, (task, tries + 1));
                }
                Err(e) => return Err(fail(e)),
            }
        }
    }
    Ok(rep)
}
