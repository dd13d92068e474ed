//! Ray tracing as a bag of tasks (`003…` §4.3): the "balls" sphereflake
//! scene, one task per grain of `k` scanlines, each grain written as its
//! own small object (RGB8 bytes, row-major, top row first).
//!
//! Every pixel is computed from its coordinates alone, in plain f64 with no
//! threads and no randomness, so the assembled image is byte-identical
//! whatever the number of slaves, the order of tasks or the kills.

mod render;
mod scene;
mod vec3;

pub use scene::n_spheres;

use crate::ctx::TaskCtx;
use crate::job::{self, Plan, PlanError, PlannedBag, TaskError, TaskOutcome};
use crate::verify::{BlockSource, VerifyError};
use serde::{Deserialize, Serialize};

/// Largest sphereflake level accepted (`9^7` spheres is already 4.8 M).
pub const MAX_LEVEL: u32 = 6;
/// Largest image side accepted.
pub const MAX_SIDE: u32 = 16_384;

/// Scene, image size and grain of a ray-tracing job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderParams {
    /// Sphereflake recursion level (0 = a single sphere), at most [`MAX_LEVEL`].
    pub level: u32,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Scanlines per task (the last grain may be shorter).
    pub grain: u32,
    /// Anti-aliasing: `samples × samples` rays per pixel on a regular grid
    /// (deterministic; 1 = one ray through the pixel centre). Cost grows
    /// with its square, which is how a benchmark makes a render take long.
    #[serde(default = "one")]
    pub samples: u32,
}

fn one() -> u32 {
    1
}

/// Largest `samples` accepted.
pub const MAX_SAMPLES: u32 = 16;

impl RenderParams {
    /// Checks the ranges.
    pub fn check(&self) -> Result<(), PlanError> {
        let bad = |reason: String| Err(PlanError::BadImage { reason });
        if self.width == 0 || self.height == 0 || self.width > MAX_SIDE || self.height > MAX_SIDE {
            return bad(format!("size {}x{} outside 1..={MAX_SIDE}", self.width, self.height));
        }
        if self.grain == 0 {
            return bad("grain must be at least 1 scanline".into());
        }
        if self.samples == 0 || self.samples > MAX_SAMPLES {
            return bad(format!("samples {} outside 1..={MAX_SAMPLES}", self.samples));
        }
        if self.level > MAX_LEVEL {
            return bad(format!("level {} above {MAX_LEVEL}", self.level));
        }
        Ok(())
    }

    /// The grains, as `(first, last)` scanlines (inclusive), top to bottom.
    pub fn grains(&self) -> Vec<(u32, u32)> {
        let g = self.grain.max(1);
        (0..self.height.div_ceil(g)).map(|n| (n * g, ((n + 1) * g).min(self.height) - 1)).collect()
    }
}

/// Task descriptor: scanlines `first..=last` (the source's bag entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrainTask {
    /// First scanline.
    pub first: u32,
    /// Last scanline (inclusive).
    pub last: u32,
}

/// Key of the grain starting at scanline `first`.
pub fn grain_key(job: uuid::Uuid, first: u32) -> String {
    format!("{job}/rt/{first}")
}

pub(crate) fn plan(job: uuid::Uuid, p: &RenderParams) -> Result<Plan, PlanError> {
    p.check()?;
    let tasks = p.grains().into_iter().map(|(first, last)| job::encode_task(&GrainTask { first, last })).collect();
    Ok(Plan { bags: vec![PlannedBag { name: job::bag_name(job, "raytrace"), tasks, inputs: Vec::new() }], initial_small: vec![] })
}

pub(crate) fn run(job: uuid::Uuid, p: &RenderParams, task: &[u8], ctx: &mut dyn TaskCtx) -> Result<TaskOutcome, TaskError> {
    let t: GrainTask = job::decode_task(task)?;
    if t.first > t.last || t.last >= p.height {
        return Err(TaskError::BadTask { reason: format!("scanlines {}..={} of {}", t.first, t.last, p.height) });
    }
    // Building the scene costs O(9^level), far below rendering a grain.
    let rgb = scene::balls(p.level).render_rows(p.width, p.height, p.samples, t.first, t.last);
    ctx.write_small(&grain_key(job, t.first), &rgb)?;
    Ok(TaskOutcome { flops: 0.0 })
}

/// Renders the whole image in one pass (the reference the task-by-task
/// image must equal byte for byte). RGB8, row-major, top row first.
pub fn render(p: &RenderParams) -> Result<Vec<u8>, PlanError> {
    p.check()?;
    Ok(scene::balls(p.level).render_rows(p.width, p.height, p.samples, 0, p.height - 1))
}

/// Renders scanlines `first..=last` of the image alone, as a task of a
/// grain of those rows does (RGB8, top row first).
pub fn render_rows(p: &RenderParams, first: u32, last: u32) -> Result<Vec<u8>, PlanError> {
    p.check()?;
    if first > last || last >= p.height {
        return Err(PlanError::BadImage { reason: format!("scanlines {first}..={last} of {}", p.height) });
    }
    Ok(scene::balls(p.level).render_rows(p.width, p.height, p.samples, first, last))
}

/// Gathers the grains of a finished job into one RGB8 image.
pub fn assemble<S: BlockSource>(src: &mut S, job: uuid::Uuid, p: &RenderParams) -> Result<Vec<u8>, VerifyError<S::Error>> {
    p.check().map_err(|e| VerifyError::Shape(e.to_string()))?;
    let mut out = Vec::with_capacity(p.width as usize * p.height as usize * 3);
    for (first, last) in p.grains() {
        let key = grain_key(job, first);
        let g = src
            .read_small(&key)
            .map_err(VerifyError::Source)?
            .ok_or_else(|| VerifyError::BadSmall { key: key.clone(), reason: "missing".into() })?;
        let want = (last - first + 1) as usize * p.width as usize * 3;
        if g.len() != want {
            return Err(VerifyError::BadSmall { key, reason: format!("{} bytes, want {want}", g.len()) });
        }
        out.extend_from_slice(&g);
    }
    Ok(out)
}

/// Encodes an RGB8 image as PNG.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, image::ImageError> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::write_buffer_with_format(&mut out, rgb, width, height, image::ExtendedColorType::Rgb8, image::ImageFormat::Png)?;
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests;
