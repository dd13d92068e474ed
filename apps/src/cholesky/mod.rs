//! Left-looking blocked Cholesky `A = L·Lᵀ` (`003…` §2.6, Figs. 2.6–2.8).
//!
//! Task `(i, j)`, `i ≥ j`, computes block `L(i,j)` exactly once:
//! `S = A(i,j) − Σ_{k<j} L(i,k)·L(j,k)ᵀ`, then `L(j,j) = chol(S)` on the
//! diagonal, else `L(i,j) = S·L(j,j)⁻ᵀ`. Only lower blocks of A are read and
//! only lower blocks of L written (upper triangle of `L(j,j)` zero; blocks
//! above the diagonal are never written, so the master should create them
//! as zeros or treat them as such). A task holds at most four blocks.
//!
//! The variants differ only in how tasks wait for their inputs; see
//! [`CholeskyVariant`].

use crate::block::{Block, MatrixMeta};
use crate::ctx::TaskCtx;
use crate::job::{self, CholeskyVariant, OutputShape, Plan, PlanError, PlannedBag, TaskError, TaskOutcome};
use crate::kernels;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Default first wait on a ready flag (single-bag), in milliseconds.
pub const DEFAULT_FLAG_TIMEOUT_MS: u64 = 10_000;

/// Task descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "kebab-case")]
pub enum CholTask {
    /// Compute `L(i, j)`.
    Block {
        /// Block row.
        i: u32,
        /// Block column.
        j: u32,
    },
    /// Multi-step(2): compute `L(j, j−1)` and then `L(j, j)` in one task.
    Merged {
        /// The diagonal block's index (≥ 1).
        j: u32,
    },
}

/// Key of the ready flag of `L(i, j)` (single-bag).
pub fn flag_key(job: uuid::Uuid, i: u32, j: u32) -> String {
    format!("{job}/chol/ready/{i}/{j}")
}

/// Key of the dependency counter of task `(i, j)` (dag): a little-endian u32.
pub fn counter_key(job: uuid::Uuid, i: u32, j: u32) -> String {
    format!("{job}/chol/deps/{i}/{j}")
}

/// How long single-bag waits on a flag at attempt `tries`: doubling, capped at 64×.
pub fn flag_timeout(base_ms: u64, tries: u32) -> Duration {
    Duration::from_millis(base_ms.saturating_mul(1u64 << tries.min(6)))
}

/// Blocks strictly above the diagonal of `l`, which no task writes: the
/// master should create them as zero blocks when it creates the output
/// (then `l` reads back as the full lower factor with a zero upper triangle).
pub fn upper_zero_blocks(l: &MatrixMeta) -> impl Iterator<Item = crate::block::BlockId> + '_ {
    l.blocks().filter(|id| id.i < id.j)
}

pub(crate) fn check(a: &MatrixMeta, l: &MatrixMeta) -> Result<(), PlanError> {
    job::check_square(a)?;
    job::check_output(l, OutputShape { n_rows: a.n_rows, n_cols: a.n_cols, block: a.block })?;
    if l.id == a.id {
        return Err(PlanError::OutputAliasesInput { name: l.name.clone() });
    }
    Ok(())
}

fn enc(t: CholTask) -> Vec<u8> {
    job::encode_task(&t)
}

/// Number of inputs of task `(i, j)` produced by other tasks: `L(j,k)` for
/// `k<j` on the diagonal; `L(i,k), L(j,k)` for `k<j` and `L(j,j)` below it.
pub fn n_deps(i: u32, j: u32) -> u32 {
    if i == j {
        j
    } else {
        2 * j + 1
    }
}

/// Tasks that read `L(r, c)` (the successors a dag task decrements), in a
/// fixed order, so concurrent tasks lock counters in the same order:
/// column-major, which is also the order they enter the FIFO bag when
/// released together, the left-looking factorisation's critical path
/// (column `j + 1` waits on column `j`) first.
pub fn successors(p: u32, r: u32, c: u32) -> Vec<(u32, u32)> {
    let mut s = Vec::new();
    if r == c {
        s.extend((c + 1..p).map(|i| (i, c)));
    } else {
        // As L(i,k) of tasks (r, j), c < j < r, and of the diagonal (r, r).
        s.extend((c + 1..=r).map(|j| (r, j)));
        // As L(j,k) of tasks (i, r), i > r.
        s.extend((r + 1..p).map(|i| (i, r)));
    }
    s.sort_unstable_by_key(|&(i, j)| (j, i));
    s
}

pub(crate) fn plan(job: uuid::Uuid, a: &MatrixMeta, l: &MatrixMeta, v: CholeskyVariant) -> Result<Plan, PlanError> {
    check(a, l)?;
    let p = a.block_rows();
    let blk = |i, j| enc(CholTask::Block { i, j });
    let mut plan = Plan::default();
    match v {
        CholeskyVariant::SingleBag => {
            // Column-major order: every task's inputs come earlier in the bag,
            // so waiting on flags cannot deadlock.
            let tasks = (0..p).flat_map(|j| (j..p).map(move |i| blk(i, j))).collect();
            plan.bags.push(PlannedBag { name: job::bag_name(job, "cholesky/single-bag"), tasks, inputs: Vec::new() });
        }
        CholeskyVariant::MultiStep1 => {
            for j in 0..p {
                plan.bags.push(PlannedBag {
                    name: job::bag_name(job, &format!("cholesky/diag/{j}")),
                    tasks: vec![blk(j, j)],
                    inputs: Vec::new(),
                });
                if j + 1 < p {
                    let tasks = (j + 1..p).map(|i| blk(i, j)).collect();
                    plan.bags.push(PlannedBag { name: job::bag_name(job, &format!("cholesky/solve/{j}")), tasks, inputs: Vec::new() });
                }
            }
        }
        CholeskyVariant::MultiStep2 => {
            plan.bags.push(PlannedBag { name: job::bag_name(job, "cholesky/step/0"), tasks: vec![blk(0, 0)], inputs: Vec::new() });
            for j in 0..p.saturating_sub(1) {
                // The merged task is on the critical path: first in the bag.
                let mut tasks = vec![enc(CholTask::Merged { j: j + 1 })];
                tasks.extend((j + 2..p).map(|i| blk(i, j)));
                plan.bags.push(PlannedBag { name: job::bag_name(job, &format!("cholesky/step/{}", j + 1)), tasks, inputs: Vec::new() });
            }
        }
        CholeskyVariant::Dag => {
            plan.bags.push(PlannedBag { name: dag_bag(job), tasks: vec![blk(0, 0)], inputs: Vec::new() });
            for j in 0..p {
                for i in j..p {
                    let d = n_deps(i, j);
                    if d > 0 {
                        plan.initial_small.push((counter_key(job, i, j), d.to_le_bytes().to_vec()));
                    }
                }
            }
        }
    }
    Ok(plan)
}

fn dag_bag(job: uuid::Uuid) -> String {
    job::bag_name(job, "cholesky/dag")
}

struct Run<'a> {
    job: uuid::Uuid,
    a: &'a MatrixMeta,
    l: &'a MatrixMeta,
    /// `Some(timeout)` in single-bag: wait on flags before reading L blocks.
    wait: Option<Duration>,
    /// Single-bag: the task's L inputs and how far their flags are known set.
    inputs: Inputs,
    flops: f64,
}

/// The L blocks a single-bag task reads, in its read order: `order[..seen]`
/// have their flags set and were announced to the prefetcher, so they
/// stream while the task computes; `next` is the one read next.
#[derive(Default)]
struct Inputs {
    order: Vec<(u32, u32)>,
    seen: usize,
    next: usize,
}

impl Run<'_> {
    fn read_l(&mut self, ctx: &mut dyn TaskCtx, i: u32, k: u32, local: Option<&(u32, u32, Block)>) -> Result<Block, TaskError> {
        if let Some((li, lk, b)) = local {
            if (*li, *lk) == (i, k) {
                return Ok(b.clone());
            }
        }
        if let Some(t) = self.wait {
            let inp = &mut self.inputs;
            debug_assert_eq!(inp.order.get(inp.next), Some(&(i, k)), "single-bag reads its inputs in order");
            if inp.next >= inp.seen {
                let key = flag_key(self.job, i, k);
                if !ctx.await_flag(&key, t)? {
                    return Err(TaskError::FlagTimeout { key, waited: t });
                }
                inp.seen = inp.next + 1;
            }
            inp.next += 1;
        }
        job::read_checked(ctx, self.l, i, k)
    }

    /// Single-bag: announces the inputs from `seen` on whose flags are
    /// already set, stopping at the first that is not. Prefetches must
    /// follow the read order, and a read lock on a block still being
    /// computed would hold up its writer. Announced inputs stream while
    /// the task computes instead of being read in the open between kernels.
    fn look_ahead(&mut self, ctx: &mut dyn TaskCtx) -> Result<(), TaskError> {
        if self.wait.is_none() {
            return Ok(());
        }
        let inp = &mut self.inputs;
        while let Some(&(r, c)) = inp.order.get(inp.seen) {
            if !ctx.await_flag(&flag_key(self.job, r, c), Duration::ZERO)? {
                break;
            }
            ctx.prefetch(&[self.l.block_id(r, c)])?;
            inp.seen += 1;
        }
        Ok(())
    }

    /// Computes `L(i, j)`; `local` is a block this task already computed.
    fn compute(&mut self, ctx: &mut dyn TaskCtx, i: u32, j: u32, local: Option<&(u32, u32, Block)>) -> Result<Block, TaskError> {
        let mut order = Vec::new();
        for k in 0..j {
            for (r, c) in if i == j { vec![(i, k)] } else { vec![(i, k), (j, k)] } {
                if !matches!(local, Some(l) if (l.0, l.1) == (r, c)) {
                    order.push((r, c));
                }
            }
        }
        if i != j {
            order.push((j, j));
        }
        ctx.prefetch(&[self.a.block_id(i, j)])?;
        if self.wait.is_none() {
            // Without flags every input is already committed: announce them all.
            ctx.prefetch(&order.iter().map(|&(r, c)| self.l.block_id(r, c)).collect::<Vec<_>>())?;
        } else {
            self.inputs = Inputs { order, seen: 0, next: 0 };
            self.look_ahead(ctx)?;
        }
        let mut sum = job::read_checked(ctx, self.a, i, j)?;
        for k in 0..j {
            let lik = self.read_l(ctx, i, k, local)?;
            if i == j {
                self.look_ahead(ctx)?;
                kernels::syrk_lower(-1.0, &lik, 1.0, &mut sum);
                self.flops += (sum.rows * sum.rows * lik.cols) as f64;
            } else {
                let ljk = self.read_l(ctx, j, k, local)?;
                self.look_ahead(ctx)?;
                kernels::gemm(-1.0, &lik, false, &ljk, true, 1.0, &mut sum);
                self.flops += 2.0 * (sum.rows * sum.cols * lik.cols) as f64;
            }
        }
        if i == j {
            kernels::potrf_lower(&mut sum).map_err(|row| TaskError::NotPositiveDefinite { i, j, row: row - 1 })?;
            self.flops += (sum.rows as f64).powi(3) / 3.0;
        } else {
            let ljj = self.read_l(ctx, j, j, local)?;
            kernels::trsm_right_lower_trans(&ljj, &mut sum);
            self.flops += (sum.rows * sum.cols * sum.cols) as f64;
        }
        Ok(sum)
    }

    fn write(&mut self, ctx: &mut dyn TaskCtx, i: u32, j: u32, b: &Block) -> Result<(), TaskError> {
        ctx.write_block(self.l.block_id(i, j), b)?;
        if self.wait.is_some() {
            // Same action as the block: the flag is set exactly when the block is there.
            ctx.write_small(&flag_key(self.job, i, j), &[1])?;
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    job: uuid::Uuid,
    a: &MatrixMeta,
    l: &MatrixMeta,
    v: CholeskyVariant,
    flag_timeout_ms: u64,
    task: &[u8],
    tries: u32,
    ctx: &mut dyn TaskCtx,
) -> Result<TaskOutcome, TaskError> {
    let t: CholTask = job::decode_task(task)?;
    let p = a.block_rows();
    let wait = (v == CholeskyVariant::SingleBag).then(|| flag_timeout(flag_timeout_ms, tries));
    let mut run = Run { job, a, l, wait, inputs: Inputs::default(), flops: 0.0 };
    match t {
        CholTask::Block { i, j } => {
            if i >= p || j > i {
                return Err(TaskError::BadTask {
                    reason: format!("Cholesky block ({i},{j}) outside the lower triangle of {p}x{p} blocks"),
                });
            }
            if run.wait.is_some() {
                // Hold the flag's write lock from the start: a task that
                // waits for this block waits on the lock, not by polling,
                // and wakes when this action commits (slave's await_flag).
                ctx.read_small_for_update(&flag_key(job, i, j))?;
            }
            let b = run.compute(ctx, i, j, None)?;
            // Released before the block is written (one action, so the
            // order is not seen outside it): the put goes to the node
            // behind the task, and the release's read of the counters,
            // sent after it, waited for it. n = 8192, b = 256, one slave:
            // 0.8 ms a task in that read before, 0.3 ms after.
            if v == CholeskyVariant::Dag {
                release_successors(job, p, i, j, ctx)?;
            }
            run.write(ctx, i, j, &b)?;
        }
        CholTask::Merged { j } => {
            if j == 0 || j >= p || v != CholeskyVariant::MultiStep2 {
                return Err(TaskError::BadTask { reason: format!("merged Cholesky task {j} (p={p}, {v:?})") });
            }
            let off = run.compute(ctx, j, j - 1, None)?;
            run.write(ctx, j, j - 1, &off)?;
            let local = (j, j - 1, off);
            let diag = run.compute(ctx, j, j, Some(&local))?;
            run.write(ctx, j, j, &diag)?;
        }
    }
    Ok(TaskOutcome { flops: run.flops })
}

/// Decrements the counters of the tasks that read `L(r, c)` and enqueues
/// those that reach zero, all in the committing task's action.
fn release_successors(job: uuid::Uuid, p: u32, r: u32, c: u32, ctx: &mut dyn TaskCtx) -> Result<(), TaskError> {
    let releases: Vec<job::Release> = successors(p, r, c)
        .into_iter()
        .map(|(i, j)| job::Release { key: counter_key(job, i, j), bag: dag_bag(job), task: enc(CholTask::Block { i, j }) })
        .collect();
    job::release_dependencies(ctx, &releases)
}

#[cfg(test)]
mod tests;
