//! `bench raytrace`: the "balls" sphereflake rendered by slaves, one task
//! per grain of scanlines, against a single-process render of the same
//! image (`apps::raytrace::render` in this process, one thread).
//!
//! The render is made long enough to measure by supersampling: unless
//! `--samples` is given, a one-sample render is timed first and the
//! samples per pixel chosen so the reference takes about `--target-s`.

use std::time::{Duration, Instant};

use anyhow::bail;
use apps::raytrace::{render, RenderParams, MAX_SAMPLES};
use serde_json::json;

use crate::cluster::{Cluster, ClusterConfig};
use crate::report::Figure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run under a minute (256×256, level 3, grains 1 and 8).
    #[arg(long)]
    quick: bool,
    /// Sphereflake recursion level.
    #[arg(long, default_value_t = 4)]
    level: u32,
    /// Image side in pixels (side × side).
    #[arg(long, default_value_t = 1024)]
    side: u32,
    /// Anti-aliasing samples per pixel side (default: calibrated to --target-s).
    #[arg(long)]
    samples: Option<u32>,
    /// Seconds the single-process render should take when calibrating.
    #[arg(long, default_value_t = 60.0)]
    target_s: f64,
    /// Grains (scanlines per task) to run with the slaves.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    grains: Vec<u32>,
    /// Slave processes.
    #[arg(long, default_value_t = 2)]
    slaves: usize,
    /// Also check each image byte for byte (`master verify` renders it once more).
    #[arg(long)]
    verify: bool,
}

pub(crate) fn run(mut args: Args) -> anyhow::Result<()> {
    if args.quick {
        args.side = 256;
        args.level = 3;
        args.target_s = 4.0;
        args.grains = vec![1, 8];
    }
    let params = |samples: u32, grain: u32| RenderParams { level: args.level, width: args.side, height: args.side, grain, samples };
    let samples = match args.samples {
        Some(s) => s,
        None => {
            let t = Instant::now();
            render(&params(1, 1))?;
            let one = t.elapsed().as_secs_f64();
            // Cost grows with samples².
            let s = ((args.target_s / one.max(1e-3)).sqrt().round() as u32).clamp(1, MAX_SAMPLES);
            eprintln!("calibration: one sample per pixel takes {one:.2} s; using {s}×{s} samples");
            s
        }
    };
    eprintln!("single-process render: {0}×{0}, level {1}, {samples}×{samples} samples", args.side, args.level);
    let t = Instant::now();
    render(&params(samples, 1))?;
    let single = t.elapsed().as_secs_f64();
    eprintln!("  {single:.1} s");
    let c = Cluster::start(ClusterConfig { slaves: args.slaves, cache_mib: 256, ..ClusterConfig::default() })?;
    let mut figs = Vec::new();
    for &g in &args.grains {
        let (side, level, s, gs) = (args.side.to_string(), args.level.to_string(), samples.to_string(), g.to_string());
        let out = format!("balls-g{g}");
        let submit = ["raytrace", "--level", &level, "--width", &side, "--height", &side, "--grain", &gs, "--samples", &s, "--out", &out];
        let r = c.run_job(&submit, Duration::from_secs(3600))?;
        if !r.ok() {
            bail!("ray-tracing job at grain {g} failed: {}", r.failure.unwrap_or_default());
        }
        let mut extra = vec![
            ("grain", json!(g)),
            ("slaves", json!(args.slaves)),
            ("tasks", json!(r.tasks)),
            ("seconds", json!((r.seconds * 1000.0).round() / 1000.0)),
            ("single_seconds", json!((single * 1000.0).round() / 1000.0)),
            ("side", json!(args.side)),
            ("level", json!(args.level)),
            ("samples", json!(samples)),
            ("ideal", json!(args.slaves)),
        ];
        if args.verify {
            let (ok, line) = c.verify(r.id)?;
            eprintln!("  verify: {line}");
            extra.push(("verified", json!(ok)));
        }
        let speedup = single / r.seconds;
        eprintln!("  grain {g}: {} tasks in {:.1} s, speedup {speedup:.2}", r.tasks, r.seconds);
        figs.push((format!("raytrace_speedup_grain{g}"), speedup, extra));
    }
    drop(c);
    eprintln!("(2 cores shared with other work: times are noisy)");
    for (name, v, extra) in figs {
        Figure { name: &name, value: (v * 1000.0).round() / 1000.0, unit: "x", target: None, extra }.print();
    }
    Ok(())
}
