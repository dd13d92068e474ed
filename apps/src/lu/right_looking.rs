//! LU with partial pivoting on the `dag` schedule: right-looking, so that a
//! panel's interchanges, the `U` solve and the update of a block column
//! are one task that reads and writes the column once (the source's
//! left-looking order needs a swap task per panel and column, rewriting
//! every column `p` times, and a barrier after every panel).
//!
//! Tasks and dependencies (`p` block columns):
//! - `Panel{k}`: needs `Update{k−1,k}` (panel 0 reads A and needs nothing);
//! - `Update{k,j}`, `j > k`: needs `Panel{k}` and `Update{k−1,j}`;
//! - then, in a second bag, `LeftSwap{m}` for `m < p−1`: the interchanges
//!   of panels `m+1..p` applied to the `L` blocks of column `m`. Every
//!   update that reads column `m`'s `L` has committed by then (the last
//!   panel depends on all of them through the chain of panels).
//!
//! The panel of `k + 1` is released by the update of column `k + 1` alone,
//! so it runs beside the rest of step `k`'s updates (lookahead).

use super::{interchange_rows, interchanges, LuTask};
use crate::block::{Block, BlockId, MatrixMeta};
use crate::ctx::TaskCtx;
use crate::job::{self, Plan, PlannedBag, TaskError};
use crate::kernels;
use std::collections::BTreeMap;

/// The dag's tasks in bag order: step by step, each panel first.
pub(super) fn tasks(p: u32) -> Vec<LuTask> {
    (0..p).flat_map(|k| std::iter::once(LuTask::Panel { k }).chain((k + 1..p).map(move |j| LuTask::Update { k, j }))).collect()
}

/// Number of tasks whose commit a task waits for.
pub(super) fn n_deps(t: LuTask) -> u32 {
    match t {
        LuTask::Panel { k } => u32::from(k > 0),
        LuTask::Update { k, .. } => 1 + u32::from(k > 0),
        _ => 0,
    }
}

/// The tasks `t`'s commit counts down, sorted (one lock order for
/// concurrent releasers). The update of column `k + 1` releases the next
/// panel; the bag is FIFO, so it comes first among a panel's releases.
pub(super) fn successors(p: u32, t: LuTask) -> Vec<LuTask> {
    match t {
        LuTask::Panel { k } => (k + 1..p).map(|j| LuTask::Update { k, j }).collect(),
        LuTask::Update { k, j } if j == k + 1 => vec![LuTask::Panel { k: j }],
        LuTask::Update { k, j } => vec![LuTask::Update { k: k + 1, j }],
        _ => Vec::new(),
    }
}

pub(super) fn plan(job: uuid::Uuid, p: u32) -> Plan {
    let all = tasks(p);
    let mut plan = Plan::default();
    let ready = all.iter().filter(|t| n_deps(**t) == 0).map(job::encode_task).collect();
    plan.bags.push(PlannedBag { name: super::dag_bag(job), tasks: ready, inputs: Vec::new() });
    let left: Vec<LuTask> = (0..p.saturating_sub(1)).map(|m| LuTask::LeftSwap { m }).collect();
    if !left.is_empty() {
        plan.bags.push(PlannedBag {
            name: job::bag_name(job, "lu/left-swap"),
            tasks: left.iter().map(job::encode_task).collect(),
            inputs: Vec::new(),
        });
    }
    plan.initial_small =
        all.iter().filter(|t| n_deps(**t) > 0).map(|t| (super::counter_key(job, *t), n_deps(*t).to_le_bytes().to_vec())).collect();
    plan
}

/// `Update{k,j}`: column `j` from block row `k` down (A's for `k = 0`),
/// panel `k`'s interchanges applied, `U(k,j) = L(k,k)⁻¹·X(k,j)`, then
/// `X(i,j) −= L(i,k)·U(k,j)` for `i > k`. Holds the column, `p − k`
/// blocks, and one `L` block at a time. Writes each block as it is done
/// (its put overlaps the next multiply) but the last, which it returns
/// with the flops for the caller to write after the task's releases.
pub(super) fn update(
    job: uuid::Uuid,
    a: &MatrixMeta,
    lu: &MatrixMeta,
    k: u32,
    j: u32,
    ctx: &mut dyn TaskCtx,
) -> Result<(f64, (BlockId, Block)), TaskError> {
    let p = lu.block_rows();
    let mut ids = Vec::new();
    if k == 0 {
        ids.extend((0..p).map(|t| a.block_id(t, j)));
    }
    ids.extend((k..p).map(|i| lu.block_id(i, k)));
    ctx.prefetch(&ids)?;
    let mut column: BTreeMap<u32, Block> = BTreeMap::new();
    for t in k..p {
        let blk = if k == 0 { job::read_checked(ctx, a, t, j)? } else { job::read_for_update(ctx, lu, t, j)? };
        column.insert(t, blk);
    }
    let swaps = interchanges(job, lu, k, ctx)?;
    interchange_rows(&mut column, u64::from(lu.block), &swaps);
    let mut u = column.remove(&k).expect("block row k was read");
    let d = job::read_checked(ctx, lu, k, k)?;
    kernels::trsm_left_lower_unit(&d, &mut u);
    let mut flops = (u.rows * u.rows * u.cols) as f64;
    drop(d);
    let u_id = lu.block_id(k, j);
    if k + 1 == p {
        return Ok((flops, (u_id, u)));
    }
    ctx.write_block(u_id, &u)?;
    // Each X(i,j) −= L(i,k)·U(k,j) costs 2·rows·cols·u.rows flops.
    flops += (k + 1..p).map(|i| 2.0 * (column[&i].rows * column[&i].cols * u.rows) as f64).sum::<f64>();
    for i in k + 1..p - 1 {
        let x = multiply_below(ctx, lu, &mut column, &u, k, i)?;
        ctx.write_block(lu.block_id(i, j), &x)?;
    }
    let x = multiply_below(ctx, lu, &mut column, &u, k, p - 1)?;
    Ok((flops, (lu.block_id(p - 1, j), x)))
}

/// `X(i,j) −= L(i,k)·U(k,j)`, taking `X(i,j)` out of `column`.
fn multiply_below(
    ctx: &mut dyn TaskCtx,
    lu: &MatrixMeta,
    column: &mut BTreeMap<u32, Block>,
    u: &Block,
    k: u32,
    i: u32,
) -> Result<Block, TaskError> {
    let l = job::read_checked(ctx, lu, i, k)?;
    let mut x = column.remove(&i).expect("block rows below k were read");
    kernels::gemm(-1.0, &l, false, u, false, 1.0, &mut x);
    Ok(x)
}
