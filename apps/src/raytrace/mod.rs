//! Ray tracing (in progress).
use crate::ctx::TaskCtx;
use crate::job::{Plan, PlanError, TaskError, TaskOutcome};
use serde::{Deserialize, Serialize};

/// Scene, image size and grain of a ray-tracing job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RenderParams {
    /// Sphereflake recursion level.
    pub level: u32,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Scanlines per task.
    pub grain: u32,
}

impl RenderParams {
    pub(crate) fn check(&self) -> Result<(), PlanError> {
        Err(PlanError::BadImage { reason: "raytrace not implemented yet".into() })
    }
}

pub(crate) fn plan(_job: uuid::Uuid, p: &RenderParams) -> Result<Plan, PlanError> {
    p.check().map(|_| Plan::default())
}

pub(crate) fn run(_job: uuid::Uuid, _p: &RenderParams, _task: &[u8], _ctx: &mut dyn TaskCtx) -> Result<TaskOutcome, TaskError> {
    Err(TaskError::BadTask { reason: "raytrace not implemented yet".into() })
}
