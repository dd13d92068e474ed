//! How much slower one slave's kernel runs while other slaves run theirs
//! on the machine's other cores (`model::Corun`).
//!
//! The thesis's workstations had one processor each, so a kernel's rate
//! was the workstation's. Several slaves on one multicore machine share
//! what its cores share: caches, memory bandwidth, the power budget that
//! sets their clocks, and, on a virtual machine, whatever the host's
//! threads behind the virtual cores share: on a 16-core cloud VM each
//! slave rendered a fifth slower with two slaves or more than one slave
//! alone, and a model with the rate timed alone came out short by as much
//! (`PERFORMANCE.md`).
//!
//! Measured as a ratio: `k` processes, as `k` slaves are, run copies of a
//! kernel at once, and a copy's time is set against one copy's alone in
//! the same round. (Threads of one process were tried first: they share
//! its allocator and OpenBLAS's buffer lock, and on a second such VM they
//! put the ray tracer at 1.20 with two copies where its two-slave jobs
//! ran as fast per slave as one.) Rounds alternate the order of the
//! counts, and each count takes the median of its rounds, so that a
//! drift of the host's speed between rounds moves no ratio.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use apps::kernels;

use crate::params_cmd::random_block;

/// Block size of the multiply copies: the grid's middle size.
const GEMM_B: usize = 512;
/// Rows of each ray-tracing copy's band, from the middle of a 1024-wide
/// image: about 8 ms a band here.
const RAY_ROWS: u32 = 4;

/// Which kernel a copy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// dgemm, `C += A·B`, at b = 512: the block kernels.
    Gemm,
    /// The ray tracer on a band of `bench validate`'s scene.
    Ray,
}

/// `bench corun-copy`: one copy, run by `bench params` (not for users).
#[derive(clap::Args)]
pub(crate) struct CopyArgs {
    /// Which kernel to call.
    #[arg(long, value_enum)]
    kind: Kind,
    /// How long to call the kernel once told to start.
    #[arg(long)]
    window_ms: u64,
    /// Block side of the gemm copies.
    #[arg(long, default_value_t = GEMM_B)]
    block: usize,
}

/// The counts of copies measured on a machine of `cores` cores: the
/// powers of two below it, and `cores` itself.
fn copies(cores: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2)).take_while(|&k| k < cores).collect();
    ks.push(cores.max(1));
    ks.dedup();
    ks
}

/// Measures both curves on `cores` cores.
pub(crate) fn measure(cores: usize, quick: bool) -> anyhow::Result<model::Corun> {
    let (rounds, window) = if quick { (2, Duration::from_millis(150)) } else { (5, Duration::from_millis(400)) };
    let ks = copies(cores);
    let exe = std::env::current_exe().context("locating the bench executable")?;
    let spawn = |kind: Kind| CopyProcess::spawn(&exe, kind, GEMM_B, window);
    Ok(model::Corun { kernels: curve(&ks, rounds, || spawn(Kind::Gemm))?, ray: curve(&ks, rounds, || spawn(Kind::Ray))? })
}

/// `[k, factor]` for each `k` of `ks`: the median over `rounds` of a
/// copy's mean time with `k` copies running at once against one copy
/// alone in the same round.
fn curve(ks: &[usize], rounds: usize, spawn: impl Fn() -> anyhow::Result<CopyProcess>) -> anyhow::Result<Vec<[f64; 2]>> {
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); ks.len()];
    let at_once = |k: usize| at_once(k, &spawn);
    for round in 0..rounds {
        let alone = at_once(1)?;
        // Every other round the other way round: what drifts within a
        // round falls on the small and the large counts alike.
        let order: Vec<usize> = if round % 2 == 0 { (0..ks.len()).collect() } else { (0..ks.len()).rev().collect() };
        for i in order {
            let t = if ks[i] == 1 { alone } else { at_once(ks[i])? };
            ratios[i].push(t / alone);
        }
    }
    Ok(ks.iter().zip(&mut ratios).map(|(&k, r)| [k as f64, crate::params_cmd::median(r)]).collect())
}

/// A copy's mean seconds per call with `k` copies running at once.
fn at_once(k: usize, spawn: &impl Fn() -> anyhow::Result<CopyProcess>) -> anyhow::Result<f64> {
    let mut copies = (0..k).map(|_| spawn()).collect::<anyhow::Result<Vec<CopyProcess>>>()?;
    for c in &mut copies {
        c.wait_ready()?;
    }
    for c in &mut copies {
        c.go()?;
    }
    let times = copies.into_iter().map(CopyProcess::seconds_per_call).collect::<anyhow::Result<Vec<f64>>>()?;
    Ok(times.iter().sum::<f64>() / times.len() as f64)
}

/// The multiply rates of `k` processes (a data-parallel job's ranks) at
/// `b×b` blocks: one copy alone and all `k` at once (their sum), flop/s,
/// each the median of `rounds` alternating rounds.
pub(crate) fn gemm_rates(k: usize, b: usize, rounds: usize) -> anyhow::Result<(f64, f64)> {
    let exe = std::env::current_exe().context("locating the bench executable")?;
    // About eight calls of a copy sharing a core at a few GFLOP/s.
    let window = Duration::from_secs_f64((2.0 * (b as f64).powi(3) / 5e9 * 8.0).max(0.4));
    let spawn = || CopyProcess::spawn(&exe, Kind::Gemm, b, window);
    let flop = 2.0 * (b as f64).powi(3);
    let (mut alone, mut together) = (Vec::new(), Vec::new());
    for round in 0..rounds.max(1) {
        let (one, all) = if round % 2 == 0 {
            let one = at_once(1, &spawn)?;
            (one, at_once(k, &spawn)?)
        } else {
            let all = at_once(k, &spawn)?;
            (at_once(1, &spawn)?, all)
        };
        alone.push(flop / one);
        together.push(k as f64 * flop / all);
    }
    Ok((crate::params_cmd::median(&mut alone), crate::params_cmd::median(&mut together)))
}

/// A copy's process: it says `ready` once its kernel has run once, calls
/// it for the window from the `go` it is sent, and answers the mean
/// seconds of the calls that finished inside the window.
struct CopyProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl CopyProcess {
    fn spawn(exe: &std::path::Path, kind: Kind, block: usize, window: Duration) -> anyhow::Result<CopyProcess> {
        let kind = clap::ValueEnum::to_possible_value(&kind).map_or_else(String::new, |v| v.get_name().to_owned());
        let mut child = Command::new(exe)
            .args(["corun-copy", "--kind", &kind, "--window-ms", &window.as_millis().to_string(), "--block", &block.to_string()])
            .env("OPENBLAS_NUM_THREADS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} corun-copy", exe.display()))?;
        let stdin = child.stdin.take().context("copy's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("copy's stdout")?);
        Ok(CopyProcess { child, stdin, stdout })
    }

    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(!line.is_empty(), "a corun copy ended without answering");
        Ok(line.trim().to_owned())
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let line = self.line()?;
        anyhow::ensure!(line == "ready", "a corun copy said {line:?}, not ready");
        Ok(())
    }

    fn go(&mut self) -> anyhow::Result<()> {
        self.stdin.write_all(b"go\n")?;
        Ok(self.stdin.flush()?)
    }

    fn seconds_per_call(mut self) -> anyhow::Result<f64> {
        let line = self.line()?;
        let _ = self.child.wait();
        line.parse().with_context(|| format!("a corun copy answered {line:?}"))
    }
}

/// The copy's side (`bench corun-copy`).
pub(crate) fn run_copy(args: CopyArgs) -> anyhow::Result<()> {
    kernels::set_blas_threads(1);
    let mut op: Box<dyn FnMut()> = match args.kind {
        Kind::Gemm => {
            let n = args.block;
            let (a, b, mut c) = (random_block(n, 1), random_block(n, 2), random_block(n, 3));
            Box::new(move || kernels::gemm(1.0, &a, false, &b, false, 1.0, &mut c))
        }
        Kind::Ray => {
            let p = apps::raytrace::RenderParams {
                level: crate::params_cmd::RAY_LEVEL,
                width: 1024,
                height: 1024,
                grain: 1024,
                samples: crate::params_cmd::RAY_SAMPLES,
            };
            let first = 512 - RAY_ROWS / 2;
            Box::new(move || {
                std::hint::black_box(apps::raytrace::render_rows(&p, first, first + RAY_ROWS - 1).ok());
            })
        }
    };
    // Pages touched, code warm.
    op();
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let window = Duration::from_millis(args.window_ms);
    let (t0, mut calls, mut last) = (Instant::now(), 0u32, Duration::ZERO);
    loop {
        op();
        let now = t0.elapsed();
        if now > window {
            break;
        }
        calls += 1;
        last = now;
    }
    anyhow::ensure!(calls > 0, "one call took longer than the {window:?} window");
    writeln!(out, "{}", last.as_secs_f64() / calls as f64)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_double_up_to_the_cores() {
        assert_eq!(copies(1), vec![1]);
        assert_eq!(copies(2), vec![1, 2]);
        assert_eq!(copies(6), vec![1, 2, 4, 6]);
        assert_eq!(copies(16), vec![1, 2, 4, 8, 16]);
    }
}
