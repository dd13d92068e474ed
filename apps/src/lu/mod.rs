//! Blocked LU (`003…` §5.7, App. B), written in place into the output
//! matrix, packed as LAPACK does (unit-lower `L` strictly below the
//! diagonal, `U` on and above).
//!
//! **Without pivoting** (blocked Crout, for diagonally dominant input), per
//! block column `k`, three bags with barriers between:
//! 1. multiply: `X(i,k) = A(i,k) − Σ_{m<k} L(i,m)·U(m,k)` for `i ≥ k`;
//! 2. factor: `X(k,k) = L(k,k)·U(k,k)` (one task);
//! 3. solve: `L(i,k) = X(i,k)·U(k,k)⁻¹` for `i > k` and
//!    `U(k,j) = L(k,k)⁻¹·(A(k,j) − Σ_{m<k} L(k,m)·U(m,j))` for `j > k`.
//!    (The source did the `L` solves inside the serial factor task; moving
//!    them here is the improvement it suggests.)
//!
//! With the `dag` schedule the same tasks run from one bag without
//! barriers: each task has a dependency counter (the number of its inputs
//! other tasks write, [`n_deps`]); a committing task decrements the
//! counters of the tasks that read its block ([`successors`]) and enqueues
//! those that reach zero, in its own action, as the Cholesky `dag` variant
//! does. The blocks and every task's arithmetic are those of the bags, so
//! the result is bit-identical.
//!
//! **With partial pivoting** (the source analysed it, never built it): a
//! copy bag first (A into the output), then per block column `k`: multiply
//! (as above, on the row-swapped copy), panel (dgetrf of the whole block
//! column below the diagonal, one task, pivots recorded as the small object
//! [`pivots_key`]), swap (one task per other block column applying the
//! panel's interchanges), solve (`U(k,j)` for `j > k`).
//!
//! **With partial pivoting and the `dag` schedule** (right-looking, in
//! [`right_looking`]): per block column `k`, a panel task (as above; panel
//! 0 reads A itself, so there is no copy bag) and one update task per block
//! column `j > k` that applies the panel's interchanges to column `j`,
//! solves `U(k,j)` and updates the blocks below it, holding the column, so
//! a swap costs no extra read or write of the column. The panel of `k + 1`
//! waits only for the update of column `k + 1`, not for the whole step.
//! The interchanges of later panels reach the `L` blocks left of them in a
//! second bag, one task per block column, at the end.
//!
//! **With tournament pivoting** ([`tournament`], dag only): the same
//! right-looking steps, but each panel's pivots are chosen by a reduction
//! tree of tasks over its blocks (CALU), and no task holds more than four
//! blocks. The interchanges are recorded as partial pivoting records
//! them, so [`permutation`] and every check read both alike.

use crate::block::{Block, BlockId, MatrixMeta};
use crate::ctx::TaskCtx;
use crate::job::{self, LuSchedule, OutputShape, PivotRule, Plan, PlanError, PlannedBag, TaskError, TaskOutcome};
use crate::kernels;
use crate::verify::{BlockSource, VerifyError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Task descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "kebab-case")]
pub enum LuTask {
    /// Pivoting: copy `A(i,j)` into the output.
    Copy {
        /// Block row.
        i: u32,
        /// Block column.
        j: u32,
    },
    /// Multiply step: `X(i,k) = A(i,k) − Σ_{m<k} L(i,m)·U(m,k)`.
    Mult {
        /// Block row (≥ k).
        i: u32,
        /// Block column.
        k: u32,
    },
    /// No pivoting: factor the diagonal block in place.
    Factor {
        /// Block column.
        k: u32,
    },
    /// No pivoting: `L(i,k) = X(i,k)·U(k,k)⁻¹`.
    SolveL {
        /// Block row (> k).
        i: u32,
        /// Block column.
        k: u32,
    },
    /// `U(k,j) = L(k,k)⁻¹·(A(k,j) − Σ_{m<k} L(k,m)·U(m,j))`.
    SolveU {
        /// Block row.
        k: u32,
        /// Block column (> k).
        j: u32,
    },
    /// Pivoting: dgetrf of block column `k` from block row `k` down.
    Panel {
        /// Block column.
        k: u32,
    },
    /// Pivoting: apply panel `k`'s interchanges to block column `j ≠ k`.
    Swap {
        /// Panel.
        k: u32,
        /// Block column.
        j: u32,
    },
    /// Pivoting, dag: apply panel `k`'s interchanges to block column `j > k`
    /// (rows from block `k` down), solve `U(k,j)` and update the blocks
    /// below it.
    Update {
        /// Panel.
        k: u32,
        /// Block column (> k).
        j: u32,
    },
    /// Pivoting, dag: apply the interchanges of every panel right of block
    /// column `m` to its `L` blocks.
    LeftSwap {
        /// Block column.
        m: u32,
    },
    /// Tournament pivoting: node `idx` of level `level` of panel `k`'s
    /// reduction tree (level 0: block row `k + idx`); the root also
    /// factors the panel.
    Pick {
        /// Panel.
        k: u32,
        /// Tree level (0: one block).
        level: u32,
        /// Node within its level.
        idx: u32,
    },
}

/// Key of panel `k`'s interchanges: little-endian u64 global row indices,
/// one per column of the panel; row `k·b + r` was swapped with row `piv[r]`
/// (≥ it), in order of `r` (LAPACK's `ipiv`, 0-based and global).
pub fn pivots_key(job: uuid::Uuid, k: u32) -> String {
    format!("{job}/lu/piv/{k}")
}

/// Key of task `t`'s dependency counter (dag): a little-endian u32.
pub fn counter_key(job: uuid::Uuid, t: LuTask) -> String {
    match t {
        LuTask::Mult { i, k } => format!("{job}/lu/deps/mult/{i}/{k}"),
        LuTask::Factor { k } => format!("{job}/lu/deps/factor/{k}"),
        LuTask::SolveL { i, k } => format!("{job}/lu/deps/solve-l/{i}/{k}"),
        LuTask::SolveU { k, j } => format!("{job}/lu/deps/solve-u/{k}/{j}"),
        LuTask::Copy { i, j } => format!("{job}/lu/deps/copy/{i}/{j}"),
        LuTask::Panel { k } => format!("{job}/lu/deps/panel/{k}"),
        LuTask::Swap { k, j } => format!("{job}/lu/deps/swap/{k}/{j}"),
        LuTask::Update { k, j } => format!("{job}/lu/deps/update/{k}/{j}"),
        LuTask::LeftSwap { m } => format!("{job}/lu/deps/left-swap/{m}"),
        LuTask::Pick { k, level, idx } => format!("{job}/lu/deps/pick/{k}/{level}/{idx}"),
    }
}

/// Number of a task's inputs that other tasks write (without pivoting):
/// `L(i,m)` and `U(m,k)` for `m < k` of a multiply; the multiplied diagonal
/// block of a factor; the multiplied block and the factored diagonal of an
/// `L` solve; `L(k,m)`, `U(m,j)` for `m < k` and the factored diagonal of a
/// `U` solve.
pub fn n_deps(t: LuTask) -> u32 {
    match t {
        LuTask::Mult { k, .. } => 2 * k,
        LuTask::Factor { .. } => 1,
        LuTask::SolveL { .. } => 2,
        LuTask::SolveU { k, .. } => 2 * k + 1,
        LuTask::Copy { .. }
        | LuTask::Panel { .. }
        | LuTask::Swap { .. }
        | LuTask::Update { .. }
        | LuTask::LeftSwap { .. }
        | LuTask::Pick { .. } => 0,
    }
}

/// The tasks (without pivoting) that read the block task `t` writes, sorted
/// so that concurrent releasers lock the counters in one order.
pub fn successors(p: u32, t: LuTask) -> Vec<LuTask> {
    let mut s = match t {
        LuTask::Mult { i, k } if i == k => vec![LuTask::Factor { k }],
        LuTask::Mult { i, k } => vec![LuTask::SolveL { i, k }],
        LuTask::Factor { k } => (k + 1..p).map(|i| LuTask::SolveL { i, k }).chain((k + 1..p).map(|j| LuTask::SolveU { k, j })).collect(),
        // L(i,k) is L(i,m) of the multiplies (i, j), k < j ≤ i, and L(k,m)
        // of the U solves (i, j), j > i.
        LuTask::SolveL { i, k } => {
            (k + 1..=i).map(|j| LuTask::Mult { i, k: j }).chain((i + 1..p).map(|j| LuTask::SolveU { k: i, j })).collect()
        }
        // U(k,j) is U(m,k) of the multiplies (i, j), i ≥ j, and U(m,j) of
        // the U solves (m, j), k < m < j.
        LuTask::SolveU { k, j } => (j..p).map(|i| LuTask::Mult { i, k: j }).chain((k + 1..j).map(|m| LuTask::SolveU { k: m, j })).collect(),
        LuTask::Copy { .. }
        | LuTask::Panel { .. }
        | LuTask::Swap { .. }
        | LuTask::Update { .. }
        | LuTask::LeftSwap { .. }
        | LuTask::Pick { .. } => Vec::new(),
    };
    s.sort_unstable();
    s
}

fn dag_bag(job: uuid::Uuid) -> String {
    job::bag_name(job, "lu/dag")
}

pub(crate) fn check(a: &MatrixMeta, lu: &MatrixMeta) -> Result<(), PlanError> {
    job::check_square(a)?;
    job::check_output(lu, OutputShape { n_rows: a.n_rows, n_cols: a.n_cols, block: a.block })?;
    if lu.id == a.id {
        return Err(PlanError::OutputAliasesInput { name: lu.name.clone() });
    }
    Ok(())
}

/// Which factorisation a job runs: the spec's `pivot` flag and its rule in one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pivoting {
    /// No interchanges (diagonally dominant input).
    None,
    /// LAPACK's partial pivoting, a whole block column per panel task.
    Partial,
    /// Tournament pivoting ([`tournament`]).
    Tournament,
}

impl Pivoting {
    /// From a [`crate::job::JobSpec::Lu`]'s `pivot` and `pivot_rule`.
    pub fn of(pivot: bool, rule: PivotRule) -> Pivoting {
        match (pivot, rule) {
            (false, _) => Pivoting::None,
            (true, PivotRule::Partial) => Pivoting::Partial,
            (true, PivotRule::Tournament) => Pivoting::Tournament,
        }
    }
}

pub(crate) fn plan(job: uuid::Uuid, a: &MatrixMeta, lu: &MatrixMeta, pivoting: Pivoting, schedule: LuSchedule) -> Result<Plan, PlanError> {
    check(a, lu)?;
    let p = a.block_rows();
    if pivoting == Pivoting::Tournament {
        if schedule != LuSchedule::Dag {
            return Err(PlanError::Unsupported { reason: "tournament pivoting runs on the dag schedule only".into() });
        }
        return Ok(tournament::plan(job, p));
    }
    let pivot = pivoting == Pivoting::Partial;
    let mut plan = Plan::default();
    if schedule == LuSchedule::Dag && pivot {
        return Ok(right_looking::plan(job, p));
    }
    if schedule == LuSchedule::Dag {
        // Bag order: the order the bags would run them, so the FIFO bag
        // starts with column 0's multiplies and works left to right.
        let tasks: Vec<LuTask> = (0..p)
            .flat_map(|k| {
                let mult = (k..p).map(move |i| LuTask::Mult { i, k });
                let factor = std::iter::once(LuTask::Factor { k });
                let solve_l = (k + 1..p).map(move |i| LuTask::SolveL { i, k });
                let solve_u = (k + 1..p).map(move |j| LuTask::SolveU { k, j });
                mult.chain(factor).chain(solve_l).chain(solve_u)
            })
            .collect();
        let ready = tasks.iter().filter(|t| n_deps(**t) == 0).map(job::encode_task).collect();
        plan.bags.push(PlannedBag { name: dag_bag(job), tasks: ready, inputs: Vec::new() });
        plan.initial_small =
            tasks.iter().filter(|t| n_deps(**t) > 0).map(|t| (counter_key(job, *t), n_deps(*t).to_le_bytes().to_vec())).collect();
        return Ok(plan);
    }
    let mut bag = |name: String, tasks: Vec<LuTask>| {
        if !tasks.is_empty() {
            plan.bags.push(PlannedBag {
                name: job::bag_name(job, &name),
                tasks: tasks.iter().map(job::encode_task).collect(),
                inputs: Vec::new(),
            });
        }
    };
    if pivot {
        bag("lu/copy".into(), (0..p).flat_map(|j| (0..p).map(move |i| LuTask::Copy { i, j })).collect());
    }
    for k in 0..p {
        if !pivot || k > 0 {
            bag(format!("lu/mult/{k}"), (k..p).map(|i| LuTask::Mult { i, k }).collect());
        }
        if pivot {
            bag(format!("lu/panel/{k}"), vec![LuTask::Panel { k }]);
            bag(format!("lu/swap/{k}"), (0..p).filter(|&j| j != k).map(|j| LuTask::Swap { k, j }).collect());
            bag(format!("lu/solve/{k}"), (k + 1..p).map(|j| LuTask::SolveU { k, j }).collect());
        } else {
            bag(format!("lu/factor/{k}"), vec![LuTask::Factor { k }]);
            let mut t: Vec<LuTask> = (k + 1..p).map(|i| LuTask::SolveL { i, k }).collect();
            t.extend((k + 1..p).map(|j| LuTask::SolveU { k, j }));
            bag(format!("lu/solve/{k}"), t);
        }
    }
    Ok(plan)
}

/// The blocks a task writes last, handed back to [`run`] to be written
/// after the task's releases: their puts go to the node behind the task,
/// and a release sent after them waits for them.
pub(super) type LastWrites = Vec<(BlockId, Block)>;

pub(crate) fn run(
    job: uuid::Uuid,
    a: &MatrixMeta,
    lu: &MatrixMeta,
    pivoting: Pivoting,
    schedule: LuSchedule,
    task: &[u8],
    ctx: &mut dyn TaskCtx,
) -> Result<TaskOutcome, TaskError> {
    let t: LuTask = job::decode_task(task)?;
    let p = a.block_rows();
    if pivoting == Pivoting::Tournament {
        if schedule != LuSchedule::Dag {
            return Err(TaskError::BadTask { reason: format!("LU task {t:?}: tournament pivoting on the {schedule:?} schedule") });
        }
        return tournament::run(job, a, lu, t, ctx);
    }
    let pivot = pivoting == Pivoting::Partial;
    let bad = || TaskError::BadTask { reason: format!("LU task {t:?} (p={p}, pivot={pivot}, {schedule:?})") };
    let dag = schedule == LuSchedule::Dag;
    let right_looking = dag && pivot;
    let belongs = match t {
        LuTask::Update { .. } | LuTask::LeftSwap { .. } => right_looking,
        LuTask::Panel { .. } => pivot,
        LuTask::Copy { .. } | LuTask::Swap { .. } => pivot && !dag,
        LuTask::Mult { .. } | LuTask::SolveU { .. } => !right_looking,
        LuTask::Factor { .. } | LuTask::SolveL { .. } => !pivot,
        LuTask::Pick { .. } => false,
    };
    if !belongs {
        return Err(bad());
    }
    // With pivoting the output holds the row-swapped copy of A, so the
    // multiply and solve steps start from it instead of A.
    let src = if pivot { lu } else { a };
    let mut flops = 0.0;
    // The blocks the task writes last, written after its releases (below).
    let written: LastWrites = match t {
        LuTask::Copy { i, j } => {
            if !pivot || i >= p || j >= p {
                return Err(bad());
            }
            let b = job::read_checked(ctx, a, i, j)?;
            vec![(lu.block_id(i, j), b)]
        }
        LuTask::Mult { i, k } => {
            if i >= p || k > i {
                return Err(bad());
            }
            announce(ctx, src, pivot, lu, i, k, k, &[])?;
            let mut x = read_src(ctx, src, pivot, i, k)?;
            flops += update(ctx, lu, i, k, k, &mut x)?;
            vec![(lu.block_id(i, k), x)]
        }
        LuTask::Factor { k } => {
            if pivot || k >= p {
                return Err(bad());
            }
            let mut x = job::read_for_update(ctx, lu, k, k)?;
            kernels::lu_nopiv(&mut x).map_err(|row| TaskError::Singular { i: k, j: k, row })?;
            flops += 2.0 * (x.rows as f64).powi(3) / 3.0;
            vec![(lu.block_id(k, k), x)]
        }
        LuTask::SolveL { i, k } => {
            if pivot || i >= p || k >= i {
                return Err(bad());
            }
            let mut x = job::read_for_update(ctx, lu, i, k)?;
            let d = job::read_checked(ctx, lu, k, k)?;
            kernels::trsm_right_upper(&d, &mut x);
            flops += (x.rows * x.cols * x.cols) as f64;
            vec![(lu.block_id(i, k), x)]
        }
        LuTask::SolveU { k, j } => {
            if j >= p || k >= j {
                return Err(bad());
            }
            announce(ctx, src, pivot, lu, k, j, k, &[lu.block_id(k, k)])?;
            let mut x = read_src(ctx, src, pivot, k, j)?;
            flops += update(ctx, lu, k, j, k, &mut x)?;
            let d = job::read_checked(ctx, lu, k, k)?;
            kernels::trsm_left_lower_unit(&d, &mut x);
            flops += (x.rows * x.rows * x.cols) as f64;
            vec![(lu.block_id(k, j), x)]
        }
        LuTask::Panel { k } => {
            if !pivot || k >= p {
                return Err(bad());
            }
            // Right-looking, panel 0 reads A itself (there is no copy).
            let from = if right_looking && k == 0 { a } else { lu };
            let (f, written) = panel(job, from, lu, k, ctx)?;
            flops += f;
            written
        }
        LuTask::Swap { k, j } => {
            if k >= p || j >= p || j == k {
                return Err(bad());
            }
            swap(job, lu, k..k + 1, j, ctx)?
        }
        LuTask::Update { k, j } => {
            if j >= p || k >= j {
                return Err(bad());
            }
            let (f, last) = right_looking::update(job, a, lu, k, j, ctx)?;
            flops += f;
            vec![last]
        }
        LuTask::LeftSwap { m } => {
            if m + 1 >= p {
                return Err(bad());
            }
            swap(job, lu, m + 1..p, m, ctx)?
        }
        LuTask::Pick { .. } => return Err(bad()),
    };
    let next = if right_looking {
        right_looking::successors(p, t)
    } else if dag {
        successors(p, t)
    } else {
        Vec::new()
    };
    let releases: Vec<job::Release> =
        next.iter().map(|s| job::Release { key: counter_key(job, *s), bag: dag_bag(job), task: job::encode_task(s) }).collect();
    // Released before the block is written: the put goes to the node
    // behind the task (write-behind), and a release sent after it waited
    // for it (see `cholesky::run`).
    job::release_dependencies(ctx, &releases)?;
    for (id, block) in &written {
        ctx.write_block(*id, block)?;
    }
    Ok(TaskOutcome { flops })
}

/// The starting value of a multiply or solve step: A itself without
/// pivoting, or the output's row-swapped copy, which the task overwrites.
fn read_src(ctx: &mut dyn TaskCtx, src: &MatrixMeta, pivot: bool, i: u32, j: u32) -> Result<Block, TaskError> {
    if pivot {
        job::read_for_update(ctx, src, i, j)
    } else {
        job::read_checked(ctx, src, i, j)
    }
}

/// Announces the blocks a multiply or `U` solve reads, in its order: the
/// starting block (when it is a plain read of A), the pairs of [`update`],
/// then `tail`. All are committed before the task runs (the barriers, or
/// the dag's counters, guarantee it), so the slave may stream them while
/// the task computes.
#[allow(clippy::too_many_arguments)]
fn announce(
    ctx: &mut dyn TaskCtx,
    src: &MatrixMeta,
    pivot: bool,
    lu: &MatrixMeta,
    i: u32,
    j: u32,
    upto: u32,
    tail: &[crate::block::BlockId],
) -> Result<(), TaskError> {
    let mut ids = Vec::with_capacity(2 * upto as usize + 1 + tail.len());
    if !pivot {
        ids.push(src.block_id(i, j));
    }
    for m in 0..upto {
        ids.push(lu.block_id(i, m));
        ids.push(lu.block_id(m, j));
    }
    ids.extend_from_slice(tail);
    ctx.prefetch(&ids)?;
    Ok(())
}

/// `x -= Σ_{m<upto} LU(i,m)·LU(m,j)`; returns the flops.
fn update(ctx: &mut dyn TaskCtx, lu: &MatrixMeta, i: u32, j: u32, upto: u32, x: &mut Block) -> Result<f64, TaskError> {
    let mut flops = 0.0;
    for m in 0..upto {
        let l = job::read_checked(ctx, lu, i, m)?;
        let u = job::read_checked(ctx, lu, m, j)?;
        kernels::gemm(-1.0, &l, false, &u, false, 1.0, x);
        flops += 2.0 * (x.rows * x.cols * l.cols) as f64;
    }
    Ok(flops)
}

/// Factors block column `k` (rows from block `k` down) with partial pivoting,
/// reading it from `from` (the output itself, or A for a right-looking
/// first panel); returns the flops and its blocks of `lu`, for the caller
/// to write. Holds the whole panel, `(n − k·b) × b`, in memory.
fn panel(job: uuid::Uuid, from: &MatrixMeta, lu: &MatrixMeta, k: u32, ctx: &mut dyn TaskCtx) -> Result<(f64, LastWrites), TaskError> {
    let p = lu.block_rows();
    let r0 = lu.row_offset(k);
    let rows = (lu.n_rows - r0) as usize;
    let cols = lu.block_shape(k, k).1;
    let mut pan = Block::zeros(rows, cols);
    let from_input = from.id != lu.id;
    if from_input {
        ctx.prefetch(&(k..p).map(|t| from.block_id(t, k)).collect::<Vec<_>>())?;
    }
    for t in k..p {
        let b = if from_input { job::read_checked(ctx, from, t, k)? } else { job::read_for_update(ctx, lu, t, k)? };
        let off = (lu.row_offset(t) - r0) as usize;
        for c in 0..cols {
            pan.data[off + c * rows..off + c * rows + b.rows].copy_from_slice(&b.data[c * b.rows..(c + 1) * b.rows]);
        }
    }
    let (ipiv, res) = kernels::getrf(&mut pan);
    res.map_err(|col| TaskError::Singular { i: k, j: k, row: col })?;
    let mut written = Vec::with_capacity((p - k) as usize);
    for t in k..p {
        let (br, bc) = lu.block_shape(t, k);
        let off = (lu.row_offset(t) - r0) as usize;
        let mut b = Block::zeros(br, bc);
        for c in 0..bc {
            b.data[c * br..(c + 1) * br].copy_from_slice(&pan.data[off + c * rows..off + c * rows + br]);
        }
        written.push((lu.block_id(t, k), b));
    }
    let mut bytes = Vec::with_capacity(ipiv.len() * 8);
    for r in ipiv {
        bytes.extend_from_slice(&(r0 + r as u64).to_le_bytes());
    }
    ctx.write_small(&pivots_key(job, k), &bytes)?;
    let (m, n) = (rows as f64, cols as f64);
    Ok((m * n * n - n * n * n / 3.0, written))
}

fn decode_pivots(key: &str, raw: &[u8], lu: &MatrixMeta, k: u32) -> Result<Vec<u64>, String> {
    let want = lu.block_shape(k, k).1;
    if raw.len() != want * 8 {
        return Err(format!("{} bytes, want {}", raw.len(), want * 8));
    }
    let r0 = lu.row_offset(k);
    let piv: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    for (r, &g) in piv.iter().enumerate() {
        if g < r0 + r as u64 || g >= lu.n_rows {
            return Err(format!("{key}: pivot {g} for row {} out of range", r0 + r as u64));
        }
    }
    Ok(piv)
}

/// Applies the interchanges of `panels`, in order, to block column `j`.
/// Reads only the blocks that hold swapped rows; returns them swapped, for
/// the caller to write.
fn swap(job: uuid::Uuid, lu: &MatrixMeta, panels: std::ops::Range<u32>, j: u32, ctx: &mut dyn TaskCtx) -> Result<LastWrites, TaskError> {
    let b = u64::from(lu.block);
    let mut swaps = Vec::new();
    for k in panels {
        swaps.extend(interchanges(job, lu, k, ctx)?);
    }
    let mut blocks: BTreeMap<u32, Block> = BTreeMap::new();
    for &(s, g) in &swaps {
        for row in [s, g] {
            let t = (row / b) as u32;
            if let std::collections::btree_map::Entry::Vacant(e) = blocks.entry(t) {
                e.insert(job::read_for_update(ctx, lu, t, j)?);
            }
        }
    }
    interchange_rows(&mut blocks, b, &swaps);
    Ok(blocks.into_iter().map(|(t, blk)| (lu.block_id(t, j), blk)).collect())
}

/// Panel `k`'s interchanges as pairs of global rows `(s, g)`, in order,
/// without the rows that stay (see [`pivots_key`]).
fn interchanges(job: uuid::Uuid, lu: &MatrixMeta, k: u32, ctx: &mut dyn TaskCtx) -> Result<Vec<(u64, u64)>, TaskError> {
    let key = pivots_key(job, k);
    let raw = ctx.read_small(&key)?.ok_or_else(|| TaskError::BadSmall { key: key.clone(), reason: "missing".into() })?;
    let piv = decode_pivots(&key, &raw, lu, k).map_err(|reason| TaskError::BadSmall { key: key.clone(), reason })?;
    let r0 = lu.row_offset(k);
    Ok(piv.into_iter().enumerate().map(|(r, g)| (r0 + r as u64, g)).filter(|(s, g)| s != g).collect())
}

/// Swaps global rows `s ↔ g`, pair after pair, in a block column held as
/// blocks by block row (side `b`); every row named must be in `blocks`.
/// Column by column, as LAPACK's dlaswp does: one column of the blocks
/// stays in the cache while every pair is applied to it.
fn interchange_rows(blocks: &mut BTreeMap<u32, Block>, b: u64, swaps: &[(u64, u64)]) {
    let rows: Vec<u32> = blocks.keys().copied().collect();
    let at = |row: u64| {
        let t = (row / b) as u32;
        (rows.binary_search(&t).expect("the block of every swapped row is held"), (row % b) as usize)
    };
    let pairs: Vec<_> = swaps.iter().map(|&(s, g)| (at(s), at(g))).collect();
    let mut column: Vec<&mut Block> = blocks.values_mut().collect();
    let cols = column.first().map_or(0, |x| x.cols);
    for c in 0..cols {
        for &((ts, rs), (tg, rg)) in &pairs {
            let (ls, lg) = (rs + c * column[ts].rows, rg + c * column[tg].rows);
            let v = column[ts].data[ls];
            column[ts].data[ls] = column[tg].data[lg];
            column[tg].data[lg] = v;
        }
    }
}

/// The row permutation of a pivoted LU job: `perm[r]` is the row of A that
/// is row `r` of `P·A` (so `P·A = L·U`). Reads the pivot objects.
pub fn permutation<S: BlockSource>(src: &mut S, job: uuid::Uuid, lu: &MatrixMeta) -> Result<Vec<u64>, VerifyError<S::Error>> {
    let mut perm: Vec<u64> = (0..lu.n_rows).collect();
    for k in 0..lu.block_rows() {
        let key = pivots_key(job, k);
        let raw = src
            .read_small(&key)
            .map_err(VerifyError::Source)?
            .ok_or_else(|| VerifyError::BadSmall { key: key.clone(), reason: "missing".into() })?;
        let piv = decode_pivots(&key, &raw, lu, k).map_err(|reason| VerifyError::BadSmall { key: key.clone(), reason })?;
        let r0 = lu.row_offset(k);
        for (r, &g) in piv.iter().enumerate() {
            perm.swap((r0 + r as u64) as usize, g as usize);
        }
    }
    Ok(perm)
}

mod right_looking;
#[cfg(test)]
mod tests;
pub mod tournament;
