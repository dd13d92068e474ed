//! `bsp probe -n P [--quick]`: measure l, g, n½ over P local processes and
//! write the parameter file. `bsp run -n P PROGRAM ARGS…`: start P local
//! processes of PROGRAM as one group (each calls `Bsp::from_env`).

use std::time::Duration;

use anyhow::{bail, Context};
use bsp::probe::{self, ProbeOpts};
use bsp::{Bsp, Config, Launcher};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bsp", about = "BSPlib over TCP: launcher and probe")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure l(p), g(p) (cyclic shift and total exchange), n½ and s.
    Probe {
        #[arg(short = 'n', long, default_value_t = 4)]
        nprocs: usize,
        #[arg(long)]
        quick: bool,
        /// Parameter file to write.
        #[arg(long, default_value = "bsp-params.toml")]
        out: String,
    },
    /// Start N local processes of PROGRAM as one group.
    Run {
        #[arg(short = 'n', long)]
        nprocs: usize,
        program: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A process of a group started by `run` or `probe` (internal).
    #[command(hide = true)]
    Worker {
        /// probe | probe-quick | crash-loop
        mode: String,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    match Cli::parse().cmd {
        Cmd::Probe { nprocs, quick, out } => {
            let exe = std::env::current_exe()?.to_string_lossy().into_owned();
            let mode = if quick { "probe-quick" } else { "probe" };
            let job = Launcher::new(nprocs, exe, vec!["worker".into(), mode.into()]).capture_stdout(true).spawn()?;
            let outs = job.wait_output()?;
            for (pid, (st, _)) in outs.iter().enumerate() {
                if !st.success() {
                    bail!("process {pid} failed: {st}");
                }
            }
            let line = outs[0].1.lines().find_map(|l| l.strip_prefix("REPORT ")).context("no report from process 0")?;
            let r: probe::ProbeReport = serde_json::from_str(line)?;
            print_report(&r);
            std::fs::write(&out, r.to_toml()).with_context(|| format!("writing {out}"))?;
            eprintln!("wrote {out}");
            Ok(())
        }
        Cmd::Run { nprocs, program, args } => {
            let job = Launcher::new(nprocs, program, args).spawn()?;
            let st = job.wait()?;
            let bad: Vec<_> = st.iter().enumerate().filter(|(_, s)| !s.success()).collect();
            if !bad.is_empty() {
                bail!("{} of {nprocs} processes failed: {:?}", bad.len(), bad);
            }
            Ok(())
        }
        Cmd::Worker { mode } => worker(&mode),
    }
}

fn print_report(r: &probe::ProbeReport) {
    let line = |name: &str, value: f64, unit: &str, extra: serde_json::Value| {
        let mut m = serde_json::json!({"name": name, "value": value, "unit": unit, "p": r.p});
        if let (Some(o), Some(e)) = (m.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        println!("BENCH {m}");
    };
    line("bsp_s", r.s_flops / 1e6, "Mflop/s", serde_json::json!({}));
    line("bsp_l", r.l_us.mean, "us", serde_json::json!({"sd": r.l_us.sd, "n": r.l_us.n, "flops": r.l_flops()}));
    for f in [&r.shift, &r.total_exchange] {
        let tag = match f.pattern {
            probe::Pattern::CyclicShift => "shift",
            probe::Pattern::TotalExchange => "total_exchange",
        };
        line(
            &format!("bsp_g_{tag}"),
            f.g_us,
            "us/word",
            serde_json::json!({"flops_per_word": r.g_flops(f), "l_fit_us": f.l_us, "n_half_words": f.n_half, "g_at_max_h_us": f.g_at_max_h.mean, "g_at_max_h_sd": f.g_at_max_h.sd, "word_bytes": 8}),
        );
    }
}

fn worker(mode: &str) -> anyhow::Result<()> {
    let cfg = Config::from_env()?;
    let mut bsp = Bsp::from_env(cfg)?;
    match mode {
        "probe" | "probe-quick" => {
            let r = probe::probe(&mut bsp, &ProbeOpts::new(mode == "probe-quick"))?;
            if let Some(r) = r {
                println!("REPORT {}", serde_json::to_string(&r)?);
            }
            bsp.end();
            Ok(())
        }
        "crash-loop" => crash_loop(bsp),
        m => bail!("unknown worker mode {m}"),
    }
}

/// For the crash test: supersteps with traffic forever, reporting progress;
/// on a group error prints it and exits 3.
fn crash_loop(mut bsp: Bsp) -> anyhow::Result<()> {
    use std::io::Write;
    let p = bsp.nprocs();
    let a = bsp.push_reg(64 * 1024);
    let t0 = std::time::Instant::now();
    loop {
        let r = (|| {
            bsp.sync()?;
            let data = vec![bsp.pid() as u8; 64 * 1024];
            bsp.put((bsp.pid() + 1) % p, &data, a, 0)?;
            Ok::<_, bsp::BspError>(())
        })();
        match r {
            Ok(()) => {
                println!("STEP {}", bsp.superstep());
                std::io::stdout().flush()?;
            }
            Err(e) => {
                println!("ERROR retryable={} {e:?}", e.is_retryable());
                std::io::stdout().flush()?;
                std::process::exit(3);
            }
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("crash-loop ran two minutes without an error");
        }
    }
}
