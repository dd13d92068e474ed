//! `bench bsp`: the BSP transport's figures.
//!
//! - `l` and `g` (cyclic shift, total exchange) with spread for each p
//!   (`000…` Table 6.2 form), from real processes over loopback TCP.
//! - Total exchange at the largest p under Latin-square, naive and eager
//!   (immediate) sends (`000…` Table 6.8, `002…` Table 3).
//! - Side by side with OpenMPI (installed if missing) on its TCP transport
//!   and its shared-memory transport: barrier, all-to-all, half round trip.
//!
//! Every group is started by re-running this binary as `bench bsp --worker
//! MODE` under `bsp::Launcher`; process 0 prints one `RESULT {json}` line.

use std::process::Command;

use anyhow::{bail, Context};
use bsp::probe::{self, ProbeOpts};
use bsp::{Bsp, Config, Launcher};
use serde_json::{json, Value};

use crate::report::Figure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run, under a minute.
    #[arg(long)]
    quick: bool,
    /// Group sizes.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    p: Vec<usize>,
    /// Doubles per destination in the total exchange (the MPI_Alltoall count).
    #[arg(long, default_value_t = 16384)]
    words: usize,
    /// Skip the OpenMPI comparison.
    #[arg(long)]
    no_mpi: bool,
    /// Label for where the processes ran (loopback, netns…), copied into each figure.
    #[arg(long, default_value = "loopback")]
    net: String,
    /// Internal: run as one process of a group.
    #[arg(long, hide = true)]
    worker: Option<String>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    if let Some(mode) = &args.worker {
        return worker(mode, &args);
    }
    let reps = if args.quick { 5 } else { 20 };
    let mut mpi_side = Vec::new();
    let dir = tempdir()?;
    let mut mpi_exe = None;
    for &p in &args.p {
        let r: probe::ProbeReport = serde_json::from_value(group(p, &args, "probe", &[])?)?;
        print_probe(&r, &args.net);
        // The MPI side runs right after this p's BSP side, so both see the
        // same machine load (others may be building on it).
        // Alternate the two sides `rounds` times and keep each side's median
        // run (by barrier, by throughput separately): on a shared machine the
        // load changes by tens of per cent within a minute.
        let rounds = if args.quick { 1 } else { 3 };
        let mut ms: Vec<probe::MpiLike> = Vec::new();
        let mut mpis: Vec<Vec<Value>> = Vec::new();
        for _ in 0..rounds {
            ms.push(serde_json::from_value(group(p, &args, "mpi-like", &[])?)?);
            let mut mpi = Vec::new();
            if !args.no_mpi {
                if mpi_exe.is_none() {
                    mpi_exe = Some(build_mpi(&dir)?);
                }
                let exe = mpi_exe.as_ref().expect("built");
                for btl in ["tcp,self", "vader,self"] {
                    mpi.push(run_mpi(exe, p, btl, args.words, reps)?);
                }
            }
            mpis.push(mpi);
        }
        let med = |mut xs: Vec<f64>| {
            xs.sort_by(|a, b| a.total_cmp(b));
            xs[xs.len() / 2]
        };
        let pick = |get: &dyn Fn(&probe::MpiLike) -> f64| {
            let m = med(ms.iter().map(get).collect());
            ms.iter().find(|x| get(x) == m).expect("median is a member").clone()
        };
        let mut m = pick(&|x| x.barrier_us.mean);
        m.alltoall_mb_s = pick(&|x| x.alltoall_mb_s.mean).alltoall_mb_s;
        m.half_rtt_us = pick(&|x| x.half_rtt_us.mean).half_rtt_us;
        let mut mpi = Vec::new();
        if !args.no_mpi {
            for i in 0..2 {
                let mut o = serde_json::Map::new();
                for key in ["barrier_us", "alltoall_mb_s", "half_rtt_us"] {
                    o.insert(key.into(), json!(med(mpis.iter().map(|r| r[i][key].as_f64().unwrap_or(f64::NAN)).collect())));
                }
                o.insert("runs".into(), json!(rounds));
                mpi.push(Value::Object(o));
            }
        }
        mpi_side.push((m, mpi));
    }
    schedules_and_mpi(&args, mpi_side)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `l` and `g` figures of one probe report.
fn print_probe(r: &probe::ProbeReport, net: &str) {
    let p = r.p;
    {
        let base = |extra: Vec<(&'static str, Value)>| {
            let mut e = vec![("p", json!(p)), ("net", json!(net))];
            e.extend(extra);
            e
        };
        Figure {
            name: "bsp_l",
            value: r.l_us.mean,
            unit: "us",
            target: None,
            extra: base(vec![
                ("sd", json!(r.l_us.sd)),
                ("samples", json!(r.l_us.n)),
                ("flops", json!(r.l_flops())),
                ("s_mflops", json!(r.s_flops / 1e6)),
            ]),
        }
        .print();
        for (tag, f) in [("shift", &r.shift), ("total_exchange", &r.total_exchange)] {
            let mb_s = 8.0 / f.g_us; // bytes per µs = MB/s per process
            Figure {
                name: &format!("bsp_g_{tag}"),
                value: f.g_us,
                unit: "us/word",
                target: None,
                extra: base(vec![
                    ("word_bytes", json!(8)),
                    ("flops_per_word", json!(r.g_flops(f))),
                    ("mb_s", json!(mb_s)),
                    ("l_fit_us", json!(f.l_us)),
                    ("n_half_words", json!(f.n_half)),
                    ("g_at_max_h_us", json!(f.g_at_max_h.mean)),
                    ("g_at_max_h_sd", json!(f.g_at_max_h.sd)),
                ]),
            }
            .print();
        }
    }
}

fn schedules_and_mpi(args: &Args, mpi_side: Vec<(probe::MpiLike, Vec<Value>)>) -> anyhow::Result<()> {
    // Schedules at the largest p.
    let pmax = *args.p.iter().max().context("no p")?;
    let mut latin = None;
    for sched in ["latin", "naive", "eager"] {
        let v = group(pmax, args, "exchange", &[("BSP_SCHEDULE", sched)])?;
        let st: probe::Stat = serde_json::from_value(v)?;
        let ratio = latin.map(|l: f64| st.mean / l);
        if sched == "latin" {
            latin = Some(st.mean);
        }
        let mut extra = vec![
            ("p", json!(pmax)),
            ("net", json!(args.net)),
            ("words_per_dest", json!(args.words)),
            ("sd", json!(st.sd)),
            ("samples", json!(st.n)),
        ];
        if let Some(r) = ratio {
            extra.push(("ratio_to_latin", json!(r)));
        }
        Figure { name: &format!("bsp_total_exchange_{sched}"), value: st.mean, unit: "us", target: None, extra }.print();
    }

    for (m, mpi) in &mpi_side {
        for ((btl, label), o) in [("tcp,self", "tcp"), ("vader,self", "shm")].into_iter().zip(mpi) {
            let (bar, a2a, hrt) = (
                o["barrier_us"].as_f64().unwrap_or(f64::NAN),
                o["alltoall_mb_s"].as_f64().unwrap_or(f64::NAN),
                o["half_rtt_us"].as_f64().unwrap_or(f64::NAN),
            );
            let e = |extra: Vec<(&'static str, Value)>| {
                let mut v = vec![
                    ("p", json!(m.p)),
                    ("btl", json!(btl)),
                    ("words_per_dest", json!(args.words)),
                    ("median_of_runs", o["runs"].clone()),
                ];
                v.extend(extra);
                v
            };
            Figure { name: &format!("mpi_{label}_barrier"), value: bar, unit: "us", target: None, extra: e(vec![]) }.print();
            Figure { name: &format!("mpi_{label}_alltoall"), value: a2a, unit: "MB/s", target: None, extra: e(vec![]) }.print();
            Figure { name: &format!("mpi_{label}_half_rtt"), value: hrt, unit: "us", target: None, extra: e(vec![]) }.print();
            if label == "tcp" {
                Figure {
                    name: "bsp_barrier",
                    value: m.barrier_us.mean,
                    unit: "us",
                    target: None,
                    extra: e(vec![("sd", json!(m.barrier_us.sd))]),
                }
                .print();
                Figure {
                    name: "bsp_alltoall",
                    value: m.alltoall_mb_s.mean,
                    unit: "MB/s",
                    target: None,
                    extra: e(vec![("sd", json!(m.alltoall_mb_s.sd))]),
                }
                .print();
                Figure {
                    name: "bsp_half_rtt",
                    value: m.half_rtt_us.mean,
                    unit: "us",
                    target: None,
                    extra: e(vec![("sd", json!(m.half_rtt_us.sd))]),
                }
                .print();
            }
            let t = |x| if label == "tcp" { Some(x) } else { None };
            Figure {
                name: &format!("ratio_alltoall_bsp_over_mpi_{label}"),
                value: m.alltoall_mb_s.mean / a2a,
                unit: "x",
                target: t(0.9),
                extra: e(vec![("higher_is_better", json!(true))]),
            }
            .print();
            Figure {
                name: &format!("ratio_barrier_bsp_over_mpi_{label}"),
                value: m.barrier_us.mean / bar,
                unit: "x",
                target: t(1.5),
                extra: e(vec![("higher_is_better", json!(false))]),
            }
            .print();
            Figure {
                name: &format!("ratio_half_rtt_bsp_over_mpi_{label}"),
                value: m.half_rtt_us.mean / hrt,
                unit: "x",
                target: None,
                extra: e(vec![("higher_is_better", json!(false))]),
            }
            .print();
        }
    }
    Ok(())
}

/// Starts a group of `p` workers running `mode`; returns process 0's result.
fn group(p: usize, args: &Args, mode: &str, env: &[(&str, &str)]) -> anyhow::Result<Value> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let mut cmd = vec!["bsp".to_string(), "--worker".into(), mode.into(), "--words".into(), args.words.to_string()];
    if args.quick {
        cmd.push("--quick".into());
    }
    let mut l = Launcher::new(p, exe, cmd).capture_stdout(true);
    for (k, v) in env {
        l = l.env(*k, *v);
    }
    let outs = l.spawn()?.wait_output()?;
    for (pid, (st, _)) in outs.iter().enumerate() {
        if !st.success() {
            bail!("{mode} at p={p}: process {pid} failed ({st})");
        }
    }
    let line = outs[0].1.lines().find_map(|l| l.strip_prefix("RESULT ")).with_context(|| format!("{mode} at p={p}: no result"))?;
    Ok(serde_json::from_str(line)?)
}

fn worker(mode: &str, args: &Args) -> anyhow::Result<()> {
    let mut bsp = Bsp::from_env(Config::from_env()?)?;
    let reps = if args.quick { 5 } else { 20 };
    let out: Option<Value> = match mode {
        "probe" => probe::probe(&mut bsp, &ProbeOpts::new(args.quick))?.map(serde_json::to_value).transpose()?,
        "mpi-like" => probe::mpi_like(&mut bsp, args.words, reps)?.map(serde_json::to_value).transpose()?,
        "exchange" => {
            let t = probe::exchange_time(&mut bsp, args.words, reps)?;
            (bsp.pid() == 0).then(|| serde_json::to_value(probe::Stat::of(&t))).transpose()?
        }
        m => bail!("unknown worker mode {m}"),
    };
    if let Some(v) = out {
        println!("RESULT {v}");
        // Started by `ftbag-hosts run` (crate `netns`) rather than by `group`:
        // print the figures here.
        if std::env::var_os("BSP_HOSTS").is_some() {
            match mode {
                "probe" => print_probe(&serde_json::from_value(v)?, &args.net),
                "exchange" => {
                    let st: probe::Stat = serde_json::from_value(v)?;
                    let sched = std::env::var("BSP_SCHEDULE").unwrap_or_else(|_| "latin".into());
                    Figure {
                        name: &format!("bsp_total_exchange_{sched}"),
                        value: st.mean,
                        unit: "us",
                        target: None,
                        extra: vec![
                            ("p", json!(bsp.nprocs())),
                            ("net", json!(args.net)),
                            ("words_per_dest", json!(args.words)),
                            ("sd", json!(st.sd)),
                        ],
                    }
                    .print();
                }
                _ => {}
            }
        }
    }
    bsp.end();
    Ok(())
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("bench-bsp-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

const MPI_SRC: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
    int words = atoi(argv[1]), reps = atoi(argv[2]);
    double *s = malloc(sizeof(double) * words * size), *r = malloc(sizeof(double) * words * size);
    for (long i = 0; i < (long)words * size; i++) s[i] = i + rank;
    for (int i = 0; i < 50; i++) MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int i = 0; i < reps * 50; i++) MPI_Barrier(MPI_COMM_WORLD);
    double bar = (MPI_Wtime() - t) / (reps * 50) * 1e6;
    MPI_Alltoall(s, words, MPI_DOUBLE, r, words, MPI_DOUBLE, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    for (int i = 0; i < reps; i++) MPI_Alltoall(s, words, MPI_DOUBLE, r, words, MPI_DOUBLE, MPI_COMM_WORLD);
    double a2a_us = (MPI_Wtime() - t) / reps * 1e6;
    double x = 1.0; int n = reps * 40;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    for (int i = 0; i < n; i++) {
        if (rank == 0) { MPI_Send(&x, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD); MPI_Recv(&x, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
        else if (rank == 1) { MPI_Recv(&x, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE); MPI_Send(&x, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD); }
    }
    double hrt = (MPI_Wtime() - t) / n / 2 * 1e6;
    if (rank == 0) printf("{\"barrier_us\": %f, \"alltoall_us\": %f, \"alltoall_mb_s\": %f, \"half_rtt_us\": %f}\n", bar, a2a_us, (double)words * 8 * (size - 1) / a2a_us, hrt);
    MPI_Finalize();
    return 0;
}
"#;

fn have(cmd: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {cmd}")).output().map(|o| o.status.success()).unwrap_or(false)
}

/// Installs OpenMPI from Debian if `mpicc` is missing, compiles the program.
fn build_mpi(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    if !have("mpicc") {
        eprintln!("mpicc missing: installing openmpi-bin libopenmpi-dev");
        let install = || Command::new("apt-get").args(["install", "-y", "openmpi-bin", "libopenmpi-dev"]).status();
        if !install()?.success() {
            Command::new("apt-get").arg("update").status()?;
            if !install()?.success() {
                bail!("could not install OpenMPI");
            }
        }
    }
    let src = dir.join("bench_mpi.c");
    std::fs::write(&src, MPI_SRC)?;
    let exe = dir.join("bench_mpi");
    let st = Command::new("mpicc").args(["-O2", "-o"]).arg(&exe).arg(&src).status()?;
    if !st.success() {
        bail!("mpicc failed");
    }
    Ok(exe)
}

fn run_mpi(exe: &std::path::Path, p: usize, btl: &str, words: usize, reps: usize) -> anyhow::Result<Value> {
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &p.to_string(), "--mca", "btl", btl])
        .arg(exe)
        .args([words.to_string(), reps.to_string()])
        .output()?;
    if !out.status.success() {
        bail!("mpirun -np {p} --mca btl {btl} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let line = s.lines().find(|l| l.starts_with('{')).context("no output from the MPI program")?;
    Ok(serde_json::from_str(line)?)
}
