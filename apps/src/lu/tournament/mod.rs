//! LU with tournament pivoting (CALU: Grigori, Demmel and Xiang, SIAM J.
//! Matrix Anal. Appl. 32, 2011) on the `dag` schedule, right-looking as
//! [`super::right_looking`] is, but no task holds more than four blocks
//! (partial pivoting's panel holds its whole block column, so a slave's
//! memory grows with `n`).
//!
//! Per panel `k` (`m = p − k` blocks from the diagonal down):
//! - a reduction tree of [`LuTask::Pick`] tasks ([`tree`]): each block
//!   proposes its partial pivoting's rows as candidates, which for a block
//!   of at most `b` rows are all of them, so no task factors a block alone;
//!   each node stacks its two children's candidates (at most `2b × b`, read
//!   from the panel's blocks one at a time), factors them with dgetrf and
//!   proposes the rows it chose (a small object of row indices);
//! - the root's chosen rows are the panel's pivots. It records them as
//!   partial pivoting does ([`super::pivots_key`], LAPACK's `ipiv`), takes
//!   `L(k,k)\U(k,k)` from its own factorisation (the top `b` rows of the
//!   stacked rows it factored are the chosen rows, in pivot order, so its
//!   `L₁₁·U₁₁` is their LU without further pivoting) and solves the blocks
//!   below, `L(i,k) = X(i,k)·U(k,k)⁻¹`, one at a time, each with the rows of
//!   the diagonal block that the interchanges send there ([`rows`]).
//! - `Update{k,j}` for `j > k`: the chosen rows of column `j` gathered into
//!   its diagonal block, `U(k,j) = L(k,k)⁻¹·X(k,j)`, then for each block
//!   below, its displaced rows put in place and `X(i,j) −= L(i,k)·U(k,j)`.
//!   The displaced rows (those of the old diagonal block not chosen, at
//!   most `b`) are taken once, as the gather reads the diagonal block, and
//!   held: reading the diagonal block again for every block that receives
//!   some was about a quarter of an update's reads.
//! - `Swap{k,j=m}` for `m < k`: panel `k`'s interchanges applied to the `L`
//!   blocks of column `m`, holding the diagonal block, its replacement and
//!   one other block.
//!
//! Dependencies: a node of panel `k + 1` that reads a block itself waits
//! for `Update{k,k+1}`, and every node for its children that are tasks;
//! `Update{k,j}` for the root of `k` and `Update{k−1,j}`; `Swap{k,j=m}` for
//! the root of `k` and `Swap{k−1,m}`, or, the first swap of a column, for
//! every update of step `m` (they read `L(·,m)` in step `m`'s row order).
//! So the tree of panel `k + 1` runs beside the rest of step `k`'s updates,
//! and the swaps wherever a slave would otherwise wait.
//!
//! The elements are ranked ([`rank`], `queue::ranked`): the critical path
//! (panel `k`'s tree and root, `Update{k,k+1}`, panel `k + 1`'s tree) ahead
//! of the trailing updates released before it, which FIFO put first, and
//! the swaps, which nothing waits for, behind everything else. The first
//! step reads A itself (no copy bag).

use super::{counter_key, dag_bag, decode_pivots, pivots_key, LuTask};
use crate::block::MatrixMeta;
use crate::ctx::TaskCtx;
use crate::job::{self, Plan, PlannedBag, TaskError, TaskOutcome};

mod rows;
mod tasks;
mod tree;

/// Key of the candidates of node `(level, idx)` of panel `k`'s tree:
/// little-endian u64 global rows, in the order the node's dgetrf chose them.
pub fn candidates_key(job: uuid::Uuid, k: u32, level: u32, idx: u32) -> String {
    format!("{job}/lu/cand/{k}/{level}/{idx}")
}

/// The dag's tasks: step by step, each panel's tree, its updates, then
/// its interchanges applied to the columns left of it.
fn all_tasks(p: u32) -> Vec<LuTask> {
    (0..p)
        .flat_map(|k| {
            let tree = tree::tasks(p - k).into_iter().map(move |(level, idx)| LuTask::Pick { k, level, idx });
            tree.chain((k + 1..p).map(move |j| LuTask::Update { k, j })).chain((0..k).map(move |m| LuTask::Swap { k, j: m }))
        })
        .collect()
}

/// The rank of the swaps, behind every other task.
const SWAPS: u32 = 1 << 31;

/// A task's rank in the dag's bag (lowest first): by the column whose
/// panel it brings nearer, and within a column a tree's levels nearer its
/// root first, then updates by step; the swaps last, by panel.
fn rank(t: LuTask) -> u32 {
    let (column, within) = match t {
        LuTask::Pick { k, level, .. } => (k, 64u32.saturating_sub(level)),
        LuTask::Update { k, j } => (j, 128 + k.min(127)),
        LuTask::Swap { k, j: m } => return SWAPS.saturating_add(k.saturating_mul(1 << 16)).saturating_add(m),
        _ => (0, 0),
    };
    column.saturating_mul(256).saturating_add(within)
}

/// The bag element of dag task `t`.
fn element(t: LuTask) -> Vec<u8> {
    queue::ranked(rank(t), &job::encode_task(&t))
}

/// Whether tree task `node` of a panel of `m` blocks reads a block itself
/// (a leaf child, or it is the one leaf).
fn reads_blocks(m: u32, node: tree::Node) -> bool {
    node.0 == 0 || tree::children(m, node).iter().any(|c| c.0 == 0)
}

/// Number of tasks whose commit a task waits for.
fn n_deps(p: u32, t: LuTask) -> u32 {
    match t {
        LuTask::Pick { k, level, idx } => {
            let m = p - k;
            let tasks = if level == 0 { 0 } else { tree::children(m, (level, idx)).iter().filter(|c| c.0 > 0).count() as u32 };
            tasks + u32::from(k > 0 && reads_blocks(m, (level, idx)))
        }
        LuTask::Update { k, .. } => 1 + u32::from(k > 0),
        // The root of `k`, and the swap before it, or step `m`'s updates.
        LuTask::Swap { k, j: m } if k == m + 1 => 1 + (p - 1 - m),
        LuTask::Swap { .. } => 2,
        _ => 0,
    }
}

/// The tasks `t`'s commit counts down, sorted (one lock order for
/// concurrent releasers).
fn successors(p: u32, t: LuTask) -> Vec<LuTask> {
    let mut s = match t {
        LuTask::Pick { k, level, idx } => {
            let m = p - k;
            if (level, idx) == (tree::height(m), 0) {
                (k + 1..p).map(|j| LuTask::Update { k, j }).chain((0..k).map(|m| LuTask::Swap { k, j: m })).collect()
            } else {
                let (level, idx) = tree::parent(m, (level, idx));
                vec![LuTask::Pick { k, level, idx }]
            }
        }
        LuTask::Update { k, j } if j == k + 1 => tree::tasks(p - j)
            .into_iter()
            .filter(|&n| reads_blocks(p - j, n))
            .map(|(level, idx)| LuTask::Pick { k: j, level, idx })
            .chain([LuTask::Swap { k: k + 1, j: k }])
            .collect(),
        LuTask::Update { k, j } => vec![LuTask::Update { k: k + 1, j }, LuTask::Swap { k: k + 1, j: k }],
        LuTask::Swap { k, j: m } if k + 1 < p => vec![LuTask::Swap { k: k + 1, j: m }],
        _ => Vec::new(),
    };
    s.sort_unstable();
    s
}

pub(super) fn plan(job: uuid::Uuid, p: u32) -> Plan {
    let all = all_tasks(p);
    let mut plan = Plan::default();
    let ready = all.iter().filter(|t| n_deps(p, **t) == 0).map(|t| element(*t)).collect();
    plan.bags.push(PlannedBag { name: dag_bag(job), tasks: ready, inputs: Vec::new() });
    plan.initial_small =
        all.iter().filter(|t| n_deps(p, **t) > 0).map(|t| (counter_key(job, *t), n_deps(p, *t).to_le_bytes().to_vec())).collect();
    plan
}

/// Number of tasks of the job, as `master` counts them.
pub fn n_tasks(p: u32) -> usize {
    all_tasks(p).len()
}

pub(super) fn run(job: uuid::Uuid, a: &MatrixMeta, lu: &MatrixMeta, t: LuTask, ctx: &mut dyn TaskCtx) -> Result<TaskOutcome, TaskError> {
    let p = lu.block_rows();
    let bad = || TaskError::BadTask { reason: format!("LU task {t:?} (p={p}, tournament pivoting)") };
    let releases = || -> Vec<job::Release> {
        successors(p, t).iter().map(|s| job::Release { key: counter_key(job, *s), bag: dag_bag(job), task: element(*s) }).collect()
    };
    // Released before the last block is written, as every dag task does
    // (a release sent after a put waits for it); a swap writes every block
    // it reads, so it releases first (all of it commits at once anyway).
    let (flops, last) = match t {
        LuTask::Pick { k, level, idx } if k < p && tree::is_task(p - k, (level, idx)) => tasks::pick(job, a, lu, k, (level, idx), ctx)?,
        LuTask::Update { k, j } if k < j && j < p => tasks::update(job, a, lu, k, j, ctx)?,
        LuTask::Swap { k, j: m } if m < k && k < p => {
            job::release_dependencies(ctx, &releases())?;
            tasks::left_swap(job, lu, k, m, ctx)?;
            return Ok(TaskOutcome { flops: 0.0 });
        }
        _ => return Err(bad()),
    };
    job::release_dependencies(ctx, &releases())?;
    for (id, block) in last {
        ctx.write_block_owned(id, block)?;
    }
    Ok(TaskOutcome { flops })
}

/// Panel `k`'s interchanges.
fn panel_rows(job: uuid::Uuid, lu: &MatrixMeta, k: u32, ctx: &mut dyn TaskCtx) -> Result<rows::PanelRows, TaskError> {
    let key = pivots_key(job, k);
    let raw = ctx.read_small(&key)?.ok_or_else(|| TaskError::BadSmall { key: key.clone(), reason: "missing".into() })?;
    let piv = decode_pivots(&key, &raw, lu, k).map_err(|reason| TaskError::BadSmall { key, reason })?;
    Ok(rows::PanelRows::from_ipiv(lu.row_offset(k), &piv))
}

#[cfg(test)]
mod tests;
