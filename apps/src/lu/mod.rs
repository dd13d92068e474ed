//! Blocked LU (in progress).
use crate::block::MatrixMeta;
use crate::ctx::TaskCtx;
use crate::job::{Plan, PlanError, TaskError, TaskOutcome};

pub(crate) fn plan(_job: uuid::Uuid, _a: &MatrixMeta, _lu: &MatrixMeta, _pivot: bool) -> Result<Plan, PlanError> {
    Err(PlanError::BadImage { reason: "lu not implemented yet".into() })
}

pub(crate) fn run(_job: uuid::Uuid, _a: &MatrixMeta, _lu: &MatrixMeta, _pivot: bool, _task: &[u8], _ctx: &mut dyn TaskCtx) -> Result<TaskOutcome, TaskError> {
    Err(TaskError::BadTask { reason: "lu not implemented yet".into() })
}
