//! Block matrix multiply `C = A·B` (`003…` §2.5, Fig. 2.5).
//!
//! One task per C block: `c_ij = Σ_k a_ik · b_kj`. A task reads the pairs
//! `A(i,k), B(k,j)` one after the other and accumulates with dgemm, so it
//! holds three blocks at most (the source's `m = 3·8b²`). All tasks are
//! independent: one bag, row by row of `C`.
//!
//! The rows go in serpentine order: odd block rows enumerate their columns
//! from the last back. Each row of `C` reads all of `B`, and when `B` is
//! larger than the page cache a row in the same order as the one before is a
//! cyclic scan that LRU keeps none of: every block comes from disk again.
//! Turned around, a row starts on the columns of `B` the previous row read
//! last, which the cache still holds, so each row after the first reads from
//! disk only about the part of `B` the cache could not keep. With `B` in
//! memory the order changes nothing.

use crate::block::{Block, MatrixMeta};
use crate::ctx::TaskCtx;
use crate::job::{self, OutputShape, Plan, PlanError, PlannedBag, TaskError, TaskOutcome};
use crate::kernels;
use serde::{Deserialize, Serialize};

/// Task descriptor: compute `C(i, j)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatmulTask {
    /// Block row of C.
    pub i: u32,
    /// Block column of C.
    pub j: u32,
}

/// Checks that `A·B` is defined blockwise: inner dimensions and block sizes agree.
pub(crate) fn check_inputs(a: &MatrixMeta, b: &MatrixMeta) -> Result<(), PlanError> {
    job::check_nonempty(a)?;
    job::check_nonempty(b)?;
    if a.n_cols != b.n_rows {
        return Err(PlanError::IncompatibleShapes {
            a_name: a.name.clone(),
            a: (a.n_rows, a.n_cols),
            b_name: b.name.clone(),
            b: (b.n_rows, b.n_cols),
        });
    }
    // Same b on both sides makes A's block columns line up with B's block rows.
    if a.block != b.block {
        return Err(PlanError::BlockMismatch { a_name: a.name.clone(), a_block: a.block, b_name: b.name.clone(), b_block: b.block });
    }
    Ok(())
}

pub(crate) fn check(a: &MatrixMeta, b: &MatrixMeta, c: &MatrixMeta) -> Result<(), PlanError> {
    check_inputs(a, b)?;
    job::check_output(c, OutputShape { n_rows: a.n_rows, n_cols: b.n_cols, block: a.block })?;
    if c.id == a.id || c.id == b.id {
        return Err(PlanError::OutputAliasesInput { name: c.name.clone() });
    }
    Ok(())
}

pub(crate) fn plan(job: uuid::Uuid, a: &MatrixMeta, b: &MatrixMeta, c: &MatrixMeta) -> Result<Plan, PlanError> {
    check(a, b, c)?;
    let order: Vec<MatmulTask> = task_order(c.block_rows(), c.block_cols()).collect();
    let tasks = order.iter().map(job::encode_task).collect();
    // Any order is right: a slave that holds a task's row of A or column
    // of B takes it first (dequeues near a slave's cache).
    let inputs = order.iter().map(|t| (0..a.block_cols()).flat_map(|k| [a.block_id(t.i, k), b.block_id(k, t.j)]).collect()).collect();
    Ok(Plan { bags: vec![PlannedBag { name: job::bag_name(job, "matmul"), tasks, inputs }], initial_small: vec![] })
}

/// The bag's order: block rows of `C` top to bottom, even rows left to
/// right, odd rows right to left (see the module doc).
fn task_order(block_rows: u32, block_cols: u32) -> impl Iterator<Item = MatmulTask> {
    (0..block_rows).flat_map(move |i| (0..block_cols).map(move |c| MatmulTask { i, j: if i % 2 == 0 { c } else { block_cols - 1 - c } }))
}

pub(crate) fn run(a: &MatrixMeta, b: &MatrixMeta, c: &MatrixMeta, task: &[u8], ctx: &mut dyn TaskCtx) -> Result<TaskOutcome, TaskError> {
    let t: MatmulTask = job::decode_task(task)?;
    if !c.contains(t.i, t.j) {
        return Err(TaskError::BadTask { reason: format!("C block ({},{}) outside {}", t.i, t.j, c.name) });
    }
    let (rows, cols) = c.block_shape(t.i, t.j);
    let mut acc = Block::zeros(rows, cols);
    let mut flops = 0.0;
    let order: Vec<_> = (0..a.block_cols()).flat_map(|k| [a.block_id(t.i, k), b.block_id(k, t.j)]).collect();
    ctx.prefetch(&order)?;
    for k in 0..a.block_cols() {
        let ab = job::read_checked(ctx, a, t.i, k)?;
        let bb = job::read_checked(ctx, b, k, t.j)?;
        kernels::gemm(1.0, &ab, false, &bb, false, 1.0, &mut acc);
        flops += 2.0 * (rows * cols * ab.cols) as f64;
    }
    ctx.write_block(c.block_id(t.i, t.j), &acc)?;
    Ok(TaskOutcome { flops })
}

pub mod rows;

#[cfg(test)]
mod tests;
