//! Jobs: what the master submits, how it is cut into bags of tasks, and how
//! one task runs.
//!
//! Flow: the master calls [`output_shapes`] to create the output matrices,
//! builds a [`JobSpec`] carrying every input and output [`MatrixMeta`], calls
//! [`plan`] and loads the bags and initial small objects into the store. A
//! slave dequeues a task descriptor and calls [`run_task`] inside its atomic
//! action. Task descriptors are small JSON documents.

use crate::block::{Block, BlockId, MatrixMeta};
use crate::ctx::{CtxError, TaskCtx};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A job, as stored in the computation record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "app", rename_all = "kebab-case")]
pub enum JobSpec {
    /// `C = A·B`.
    Matmul {
        /// Job id (scopes bag names and small-object keys).
        job: uuid::Uuid,
        /// Left operand.
        a: MatrixMeta,
        /// Right operand.
        b: MatrixMeta,
        /// Output, `a.n_rows × b.n_cols`, same block size.
        c: MatrixMeta,
    },
    /// `A = L·Lᵀ`, left-looking; `l` gets the lower factor, upper triangle zero.
    Cholesky {
        /// Job id.
        job: uuid::Uuid,
        /// Input, symmetric positive definite (only its lower blocks are read).
        a: MatrixMeta,
        /// Output lower factor, same shape and block as `a`.
        l: MatrixMeta,
        /// How the tasks synchronise.
        variant: CholeskyVariant,
        /// Single-bag only: the first wait on a ready flag, in milliseconds;
        /// attempt `t` waits `flag_timeout_ms · 2^min(t,6)`.
        #[serde(default = "default_flag_timeout_ms")]
        flag_timeout_ms: u64,
    },
    /// `P·A = L·U`; `lu` gets unit-lower `L` and `U` packed as LAPACK does.
    Lu {
        /// Job id.
        job: uuid::Uuid,
        /// Input (square). Without pivoting it should be diagonally dominant.
        a: MatrixMeta,
        /// Output, same shape and block as `a`.
        lu: MatrixMeta,
        /// Pivoting (row interchanges recorded as small objects).
        pivot: bool,
        /// How the tasks synchronise (without pivoting; absent in older records: bags).
        #[serde(default)]
        schedule: LuSchedule,
        /// How pivot rows are chosen when `pivot` is set (absent in older
        /// records: partial pivoting).
        #[serde(default)]
        pivot_rule: PivotRule,
    },
    /// Ray-trace an image; each grain of scanlines becomes a small object.
    Raytrace {
        /// Job id.
        job: uuid::Uuid,
        /// Name of the image (for export).
        name: String,
        /// Scene, size and grain.
        params: crate::raytrace::RenderParams,
    },
}

fn default_flag_timeout_ms() -> u64 {
    crate::cholesky::DEFAULT_FLAG_TIMEOUT_MS
}

/// How Cholesky tasks synchronise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CholeskyVariant {
    /// One bag in column order; tasks wait on per-block ready flags.
    SingleBag,
    /// `2p−1` bags: each column's diagonal factor, then its solves.
    MultiStep1,
    /// `p` bags: the diagonal task of column `j+1` merged with block
    /// `(j+1, j)`, run in the bag of column `j` (it writes two blocks).
    MultiStep2,
    /// One bag that starts with the ready tasks; a committing task decrements
    /// its successors' dependency counters and enqueues those that reach zero.
    Dag,
}

/// How LU tasks without pivoting synchronise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LuSchedule {
    /// The source's three bags per block column (multiply, factor, solve)
    /// with a barrier after each.
    #[default]
    Bags,
    /// One bag that starts with the ready tasks; a committing task
    /// decrements its successors' dependency counters and enqueues those
    /// that reach zero, so no slave waits at a barrier.
    Dag,
}

/// How a pivoted LU chooses its pivot rows. Both record the same
/// interchanges (LAPACK's `ipiv` per panel), so exports and checks are the
/// same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PivotRule {
    /// LAPACK's partial pivoting: dgetrf of each whole block column, in one
    /// task that holds the column.
    #[default]
    Partial,
    /// Tournament pivoting (CALU): each block of a panel proposes rows, a
    /// reduction tree of tasks picks the panel's pivots, and no task holds
    /// more than a few blocks. Dag schedule only.
    Tournament,
}

impl std::str::FromStr for LuSchedule {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        match s {
            "bags" => Ok(LuSchedule::Bags),
            "dag" => Ok(LuSchedule::Dag),
            other => Err(PlanError::UnknownVariant { variant: other.to_string() }),
        }
    }
}

impl std::str::FromStr for CholeskyVariant {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        match s {
            "single-bag" => Ok(CholeskyVariant::SingleBag),
            "multi-step-1" => Ok(CholeskyVariant::MultiStep1),
            "multi-step-2" => Ok(CholeskyVariant::MultiStep2),
            "dag" => Ok(CholeskyVariant::Dag),
            other => Err(PlanError::UnknownVariant { variant: other.to_string() }),
        }
    }
}

impl JobSpec {
    /// The job id.
    pub fn job(&self) -> uuid::Uuid {
        match self {
            JobSpec::Matmul { job, .. } | JobSpec::Cholesky { job, .. } | JobSpec::Lu { job, .. } | JobSpec::Raytrace { job, .. } => *job,
        }
    }

    /// Short name of the application ("matmul", "cholesky", "lu", "raytrace").
    pub fn app_name(&self) -> &'static str {
        match self {
            JobSpec::Matmul { .. } => "matmul",
            JobSpec::Cholesky { .. } => "cholesky",
            JobSpec::Lu { .. } => "lu",
            JobSpec::Raytrace { .. } => "raytrace",
        }
    }
}

/// What the master asks for, before the output objects exist.
#[derive(Clone, Debug)]
pub enum AppRequest<'a> {
    /// `C = A·B`.
    Matmul {
        /// Left operand.
        a: &'a MatrixMeta,
        /// Right operand.
        b: &'a MatrixMeta,
    },
    /// Cholesky of `a`.
    Cholesky {
        /// Input.
        a: &'a MatrixMeta,
    },
    /// LU of `a`.
    Lu {
        /// Input.
        a: &'a MatrixMeta,
    },
    /// A ray-traced image (no matrix outputs; grains are small objects).
    Raytrace {
        /// Scene, size and grain.
        params: &'a crate::raytrace::RenderParams,
    },
}

/// Shape of an output matrix the master must create before planning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputShape {
    /// Rows.
    pub n_rows: u64,
    /// Columns.
    pub n_cols: u64,
    /// Block size.
    pub block: u32,
}

/// The output matrices a job needs (none for ray tracing), or why the inputs
/// do not fit together.
pub fn output_shapes(req: &AppRequest<'_>) -> Result<Vec<OutputShape>, PlanError> {
    match req {
        AppRequest::Matmul { a, b } => {
            crate::matmul::check_inputs(a, b)?;
            Ok(vec![OutputShape { n_rows: a.n_rows, n_cols: b.n_cols, block: a.block }])
        }
        AppRequest::Cholesky { a } | AppRequest::Lu { a } => {
            check_square(a)?;
            Ok(vec![OutputShape { n_rows: a.n_rows, n_cols: a.n_cols, block: a.block }])
        }
        AppRequest::Raytrace { params } => {
            params.check()?;
            Ok(vec![])
        }
    }
}

/// Largest block side accepted (a 16384² block is 2 GiB).
pub const MAX_BLOCK: u32 = 16_384;
/// Largest number of blocks per side accepted (the matmul bag then holds
/// 16 M tasks, the Cholesky flags or counters 8 M small objects).
pub const MAX_GRID: u32 = 4_096;

/// Checks a matrix the master is about to create (or import): non-empty,
/// block size at most [`MAX_BLOCK`], at most [`MAX_GRID`] blocks per side.
pub fn check_matrix(m: &MatrixMeta) -> Result<(), PlanError> {
    check_nonempty(m)
}

/// A matrix must be non-empty with a sane block size and grid.
pub(crate) fn check_nonempty(m: &MatrixMeta) -> Result<(), PlanError> {
    if m.block == 0 || m.n_rows == 0 || m.n_cols == 0 {
        return Err(PlanError::Empty { name: m.name.clone(), n_rows: m.n_rows, n_cols: m.n_cols, block: m.block });
    }
    if m.block > MAX_BLOCK || m.block_rows() > MAX_GRID || m.block_cols() > MAX_GRID {
        return Err(PlanError::TooLarge { name: m.name.clone(), block: m.block, grid: (m.block_rows(), m.block_cols()) });
    }
    Ok(())
}

pub(crate) fn check_square(m: &MatrixMeta) -> Result<(), PlanError> {
    check_nonempty(m)?;
    if m.n_rows != m.n_cols {
        return Err(PlanError::NotSquare { name: m.name.clone(), n_rows: m.n_rows, n_cols: m.n_cols });
    }
    Ok(())
}

/// The output must have exactly the shape [`output_shapes`] gives.
pub(crate) fn check_output(out: &MatrixMeta, want: OutputShape) -> Result<(), PlanError> {
    let got = OutputShape { n_rows: out.n_rows, n_cols: out.n_cols, block: out.block };
    if got != want {
        return Err(PlanError::OutputShape {
            name: out.name.clone(),
            expected: (want.n_rows, want.n_cols, want.block),
            got: (got.n_rows, got.n_cols, got.block),
        });
    }
    Ok(())
}

/// Why a job cannot be planned. Nothing has been created when it is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Inner dimensions of a product differ.
    #[error("incompatible shapes: {a_name} is {}x{} but {b_name} is {}x{}", .a.0, .a.1, .b.0, .b.1)]
    IncompatibleShapes {
        /// Left operand name.
        a_name: String,
        /// Left operand `(rows, cols)`.
        a: (u64, u64),
        /// Right operand name.
        b_name: String,
        /// Right operand `(rows, cols)`.
        b: (u64, u64),
    },
    /// Operands are blocked differently.
    #[error("block sizes differ: {a_name} has b={a_block}, {b_name} has b={b_block}")]
    BlockMismatch {
        /// Left operand name.
        a_name: String,
        /// Its block size.
        a_block: u32,
        /// Right operand name.
        b_name: String,
        /// Its block size.
        b_block: u32,
    },
    /// A factorisation of a non-square matrix.
    #[error("{name} is {n_rows}x{n_cols}, not square")]
    NotSquare {
        /// Matrix name.
        name: String,
        /// Rows.
        n_rows: u64,
        /// Columns.
        n_cols: u64,
    },
    /// An empty matrix or a zero block size.
    #[error("{name} is empty or unblocked ({n_rows}x{n_cols}, b={block})")]
    Empty {
        /// Matrix name.
        name: String,
        /// Rows.
        n_rows: u64,
        /// Columns.
        n_cols: u64,
        /// Block size.
        block: u32,
    },
    /// Block too large or too many blocks per side (see [`MAX_BLOCK`], [`MAX_GRID`]).
    #[error("{name}: block {block} or grid {}x{} blocks too large (max block {MAX_BLOCK}, max grid {MAX_GRID})", .grid.0, .grid.1)]
    TooLarge {
        /// Matrix name.
        name: String,
        /// Its block size.
        block: u32,
        /// Its grid, `(block rows, block cols)`.
        grid: (u32, u32),
    },
    /// The output object does not have the shape the job produces.
    #[error("output {name} is {got:?} (rows, cols, b) but the job produces {expected:?}")]
    OutputShape {
        /// Output name.
        name: String,
        /// `(rows, cols, b)` wanted.
        expected: (u64, u64, u32),
        /// `(rows, cols, b)` given.
        got: (u64, u64, u32),
    },
    /// Output and input are the same object.
    #[error("output {name} must be a different matrix from the inputs")]
    OutputAliasesInput {
        /// Output name.
        name: String,
    },
    /// Image parameters out of range.
    #[error("bad image parameters: {reason}")]
    BadImage {
        /// What is wrong.
        reason: String,
    },
    /// Unknown Cholesky variant or LU schedule name.
    #[error("unknown variant {variant:?} (Cholesky: single-bag, multi-step-1, multi-step-2, dag; LU: bags, dag)")]
    UnknownVariant {
        /// The name given.
        variant: String,
    },
    /// Options that do not go together.
    #[error("unsupported combination: {reason}")]
    Unsupported {
        /// What was asked for and why it cannot be done.
        reason: String,
    },
}

/// One bag of the plan: a name and its task descriptors in dequeue order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedBag {
    /// Queue name, unique to the job (it starts with the job id).
    pub name: String,
    /// Task descriptors (small JSON), in dequeue order.
    pub tasks: Vec<Vec<u8>>,
    /// Per task, the blocks it reads, so that a slave whose cache holds
    /// them is handed it first; empty where the bag's order must hold
    /// (a Cholesky column order, a dag's ready tasks) or nothing is read.
    pub inputs: Vec<Vec<BlockId>>,
}

/// The bags of a job, run one after the other with a barrier between (a bag
/// is done when it is empty), plus the small objects to create first.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Plan {
    /// Bags, in order.
    pub bags: Vec<PlannedBag>,
    /// Small objects to create before the first task (e.g. DAG dependency counters).
    pub initial_small: Vec<(String, Vec<u8>)>,
}

/// Checks that the spec's matrices fit together (what [`plan`] checks first).
pub fn check_spec(spec: &JobSpec) -> Result<(), PlanError> {
    match spec {
        JobSpec::Matmul { a, b, c, .. } => crate::matmul::check(a, b, c),
        JobSpec::Cholesky { a, l, .. } => crate::cholesky::check(a, l),
        JobSpec::Lu { a, lu, .. } => crate::lu::check(a, lu),
        JobSpec::Raytrace { params, .. } => params.check(),
    }
}

/// Cuts a job into bags. Checks every shape first.
pub fn plan(spec: &JobSpec) -> Result<Plan, PlanError> {
    match spec {
        JobSpec::Matmul { job, a, b, c } => crate::matmul::plan(*job, a, b, c),
        JobSpec::Cholesky { job, a, l, variant, .. } => crate::cholesky::plan(*job, a, l, *variant),
        JobSpec::Lu { job, a, lu, pivot, schedule, pivot_rule } => {
            crate::lu::plan(*job, a, lu, crate::lu::Pivoting::of(*pivot, *pivot_rule), *schedule)
        }
        JobSpec::Raytrace { job, params, .. } => crate::raytrace::plan(*job, params),
    }
}

/// Cuts a multiply into the two-level bag (`crate::matmul::rows`): an
/// element per block row of C, whose tasks [`inner_tasks`] lists. Other
/// apps have no such plan.
pub fn plan_two_level(spec: &JobSpec) -> Result<Plan, PlanError> {
    match spec {
        JobSpec::Matmul { job, a, b, c } => crate::matmul::rows::plan(*job, a, b, c),
        other => Err(PlanError::Unsupported { reason: format!("{} has no two-level bag (matmul has)", other.app_name()) }),
    }
}

/// The tasks of a two-level bag's element, each with its number among the
/// job's tasks (its done record's), to run and commit one by one while
/// the element is held; `None` for an ordinary task.
pub fn inner_tasks(spec: &JobSpec, payload: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    match spec {
        JobSpec::Matmul { c, .. } => crate::matmul::rows::inner_tasks(c, payload),
        _ => None,
    }
}

/// What a committed task did (for progress and GFLOP/s).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct TaskOutcome {
    /// Floating-point operations the task performed (0 for ray tracing).
    pub flops: f64,
}

/// Runs one task inside the caller's atomic action. `tries` is how many
/// times this task has been attempted before (0 on the first run); it makes
/// single-bag Cholesky wait longer on flags each time.
pub fn run_task(spec: &JobSpec, task: &[u8], tries: u32, ctx: &mut dyn TaskCtx) -> Result<TaskOutcome, TaskError> {
    // Re-check the shapes (metadata only, cheap): a corrupt or hand-made spec
    // must give a typed error, never hand BLAS mismatched blocks.
    check_spec(spec).map_err(|e| TaskError::BadTask { reason: format!("job spec: {e}") })?;
    match spec {
        JobSpec::Matmul { a, b, c, .. } => crate::matmul::run(a, b, c, task, ctx),
        JobSpec::Cholesky { job, a, l, variant, flag_timeout_ms } => {
            crate::cholesky::run(*job, a, l, *variant, *flag_timeout_ms, task, tries, ctx)
        }
        JobSpec::Lu { job, a, lu, pivot, schedule, pivot_rule } => {
            crate::lu::run(*job, a, lu, crate::lu::Pivoting::of(*pivot, *pivot_rule), *schedule, task, ctx)
        }
        JobSpec::Raytrace { job, params, .. } => crate::raytrace::run(*job, params, task, ctx),
    }
}

/// Floating-point operations of the whole job: `2mnk` for a product, `n³/3`
/// for Cholesky, `2n³/3` for LU, 0 for ray tracing.
pub fn flops(spec: &JobSpec) -> f64 {
    match spec {
        JobSpec::Matmul { a, b, .. } => 2.0 * a.n_rows as f64 * a.n_cols as f64 * b.n_cols as f64,
        JobSpec::Cholesky { a, .. } => (a.n_rows as f64).powi(3) / 3.0,
        JobSpec::Lu { a, .. } => 2.0 * (a.n_rows as f64).powi(3) / 3.0,
        JobSpec::Raytrace { .. } => 0.0,
    }
}

/// Why a task failed. See [`TaskError::class`] for what the slave should do.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The store failed under the task.
    #[error(transparent)]
    Ctx(#[from] CtxError),
    /// A ready flag did not appear in time (single-bag Cholesky).
    #[error("ready flag {key} did not appear within {waited:?}")]
    FlagTimeout {
        /// The flag's key.
        key: String,
        /// How long the task waited.
        waited: Duration,
    },
    /// Cholesky met a block that is not positive definite.
    #[error("matrix is not positive definite: factorising diagonal block ({i},{j}) failed at its row {row}")]
    NotPositiveDefinite {
        /// Block row.
        i: u32,
        /// Block column.
        j: u32,
        /// Row within the block whose leading minor failed (0-based).
        row: usize,
    },
    /// LU met an exactly zero (or non-finite) pivot.
    #[error("matrix is singular: zero pivot in block ({i},{j}) at its row {row}")]
    Singular {
        /// Block row.
        i: u32,
        /// Block column.
        j: u32,
        /// Row within the block (0-based).
        row: usize,
    },
    /// A task descriptor that does not decode or names blocks outside the job.
    #[error("bad task descriptor: {reason}")]
    BadTask {
        /// What is wrong.
        reason: String,
    },
    /// A block read from the store does not have the shape its matrix says.
    #[error("block {id} is {}x{}, expected {}x{}", .got.0, .got.1, .expected.0, .expected.1)]
    BadBlock {
        /// The block.
        id: BlockId,
        /// `(rows, cols)` expected.
        expected: (usize, usize),
        /// `(rows, cols)` read.
        got: (usize, usize),
    },
    /// A small object (counter, pivots) that does not decode.
    #[error("small object {key} is malformed: {reason}")]
    BadSmall {
        /// Its key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// What the slave should do with a failed task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Abort the action and run the task again (store trouble).
    Retry,
    /// Abort the action; the task goes back to the bag for later (flag timeout).
    Requeue,
    /// Abort the action and fail the job with this error as the reason.
    JobFatal,
}

impl TaskError {
    /// What the slave should do.
    pub fn class(&self) -> ErrorClass {
        match self {
            TaskError::Ctx(e) if e.is_retryable() => ErrorClass::Retry,
            TaskError::FlagTimeout { .. } => ErrorClass::Requeue,
            TaskError::Ctx(_)
            | TaskError::NotPositiveDefinite { .. }
            | TaskError::Singular { .. }
            | TaskError::BadTask { .. }
            | TaskError::BadBlock { .. }
            | TaskError::BadSmall { .. } => ErrorClass::JobFatal,
        }
    }

    /// Shorthand: `class() != JobFatal`.
    pub fn is_retryable(&self) -> bool {
        self.class() != ErrorClass::JobFatal
    }
}

/// Reads block `(i, j)` of `m` and checks its shape.
pub(crate) fn read_checked(ctx: &mut dyn TaskCtx, m: &MatrixMeta, i: u32, j: u32) -> Result<Block, TaskError> {
    let id = m.block_id(i, j);
    let blk = ctx.read_block(id)?;
    let expected = m.block_shape(i, j);
    if (blk.rows, blk.cols) != expected || blk.data.len() != blk.rows * blk.cols {
        return Err(TaskError::BadBlock { id, expected, got: (blk.rows, blk.cols) });
    }
    Ok(blk)
}

/// Like [`read_checked`] for a block the task overwrites in place.
pub(crate) fn read_for_update(ctx: &mut dyn TaskCtx, m: &MatrixMeta, i: u32, j: u32) -> Result<Block, TaskError> {
    let id = m.block_id(i, j);
    let blk = ctx.read_block_for_update(id)?;
    let expected = m.block_shape(i, j);
    if (blk.rows, blk.cols) != expected || blk.data.len() != blk.rows * blk.cols {
        return Err(TaskError::BadBlock { id, expected, got: (blk.rows, blk.cols) });
    }
    Ok(blk)
}

/// Decodes a JSON task descriptor. A ranked element (`queue::ranked`)
/// reaches tasks without its rank from the store's bags, but with it from
/// an executor that queues payloads as they are ([`crate::mem`]).
pub(crate) fn decode_task<T: serde::de::DeserializeOwned>(task: &[u8]) -> Result<T, TaskError> {
    serde_json::from_slice(queue::split_rank(task).1).map_err(|e| TaskError::BadTask { reason: e.to_string() })
}

/// Encodes a JSON task descriptor (cannot fail for our plain structs).
pub(crate) fn encode_task<T: Serialize>(t: &T) -> Vec<u8> {
    serde_json::to_vec(t).unwrap_or_default()
}

/// A DAG task whose input the caller's task produced: its dependency
/// counter's key and the element to enqueue on `bag` when that reaches zero.
pub(crate) struct Release {
    pub(crate) key: String,
    pub(crate) bag: String,
    pub(crate) task: Vec<u8>,
}

/// One input of each of these DAG tasks is now committed (in the caller's
/// action): decrements each task's dependency counter (a little-endian
/// u32, write-locked so two releasers serialise; all read in one request,
/// in the order given) and enqueues the task when it reaches zero.
pub(crate) fn release_dependencies(ctx: &mut dyn TaskCtx, releases: &[Release]) -> Result<(), TaskError> {
    if releases.is_empty() {
        return Ok(());
    }
    let keys: Vec<String> = releases.iter().map(|r| r.key.clone()).collect();
    let counters = ctx.read_smalls_for_update(&keys)?;
    let mut written = Vec::with_capacity(releases.len());
    let mut ready = Vec::new();
    for ((r, key), raw) in releases.iter().zip(keys).zip(counters) {
        let bad = |reason: String| TaskError::BadSmall { key: r.key.clone(), reason };
        let raw = raw.ok_or_else(|| bad("missing".into()))?;
        let n = <[u8; 4]>::try_from(raw.as_slice()).map(u32::from_le_bytes).map_err(|_| bad(format!("{} bytes, want 4", raw.len())))?;
        let left = n.checked_sub(1).ok_or_else(|| bad("already zero".into()))?;
        written.push((key, left.to_le_bytes().to_vec()));
        if left == 0 {
            ready.push(r);
        }
    }
    // All written back in one request, as they were read.
    ctx.write_smalls(&written)?;
    for r in ready {
        ctx.enqueue(&r.bag, &r.task)?;
    }
    Ok(())
}

/// Bag name scoped to the job.
pub(crate) fn bag_name(job: uuid::Uuid, what: &str) -> String {
    format!("{job}/{what}")
}
