//! Left-looking blocked Cholesky (in progress).
use crate::block::MatrixMeta;
use crate::ctx::TaskCtx;
use crate::job::{CholeskyVariant, Plan, PlanError, TaskError, TaskOutcome};

/// Default first wait on a ready flag (single-bag), in milliseconds.
pub const DEFAULT_FLAG_TIMEOUT_MS: u64 = 10_000;

pub(crate) fn plan(_job: uuid::Uuid, _a: &MatrixMeta, _l: &MatrixMeta, _v: CholeskyVariant) -> Result<Plan, PlanError> {
    Err(PlanError::BadImage { reason: "cholesky not implemented yet".into() })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    _job: uuid::Uuid,
    _a: &MatrixMeta,
    _l: &MatrixMeta,
    _v: CholeskyVariant,
    _t: u64,
    _task: &[u8],
    _tries: u32,
    _ctx: &mut dyn TaskCtx,
) -> Result<TaskOutcome, TaskError> {
    Err(TaskError::BadTask { reason: "cholesky not implemented yet".into() })
}
