//! `bench ooc matmul --hosts N --engine bsp,scalapack`: ScaLAPACK's
//! `pdgemm` (Debian's `libscalapack-openmpi-dev`, over OpenMPI's TCP
//! transport), in core, one MPI rank on each slave host of the same
//! namespace hosts and links as the data-parallel engine. The driver
//! (`bench/scalapack/pdgemm.c`) is compiled here with `mpicc`; `mpirun`
//! runs on host 0 and starts its daemons on the other hosts through an rsh
//! agent, a script that runs the command under `ip netns exec` of the host
//! the address names.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::cluster::HostsPlacement;

const DRIVER: &str = include_str!("../../scalapack/pdgemm.c");
const PACKAGES: [&str; 3] = ["openmpi-bin", "libopenmpi-dev", "libscalapack-openmpi-dev"];

/// One `pdgemm` run: rank 0's line (`n`, `nb`, `p`, `grid`, `seconds` of
/// the fastest rep, `gflops`) and the bytes each host's link carried over
/// the whole `mpirun` (start-up and every rep).
pub(super) struct Run {
    pub(super) result: Value,
    pub(super) links: Vec<netns::LinkBytes>,
}

fn compile(dir: &Path) -> anyhow::Result<PathBuf> {
    let src = dir.join("pdgemm.c");
    std::fs::write(&src, DRIVER)?;
    let exe = dir.join("pdgemm");
    let build = || Command::new("mpicc").args(["-O2", "-o"]).arg(&exe).arg(&src).args(["-lscalapack-openmpi", "-lopenblas"]).status();
    if build().map(|s| s.success()).unwrap_or(false) {
        return Ok(exe);
    }
    eprintln!("  ScaLAPACK or mpicc missing: installing {}", PACKAGES.join(" "));
    let install =
        || Command::new("apt-get").args(["install", "-y", "-qq"]).args(PACKAGES).env("DEBIAN_FRONTEND", "noninteractive").status();
    if !install()?.success() {
        Command::new("apt-get").args(["update", "-qq"]).status()?;
        if !install()?.success() {
            bail!("could not install {}", PACKAGES.join(" "));
        }
    }
    if !build()?.success() {
        bail!("mpicc could not build the pdgemm driver");
    }
    Ok(exe)
}

/// The rsh agent: `agent ADDR COMMAND…` runs COMMAND in ADDR's namespace.
fn agent(dir: &Path, placement: &HostsPlacement) -> anyhow::Result<PathBuf> {
    let hosts = &placement.hosts;
    let cases: String = (0..hosts.hosts()).map(|i| format!("  {}) ns={};;\n", hosts.addr(i), hosts.ns_name(i))).collect();
    let script = format!(
        "#!/bin/sh\n# mpirun's rsh agent across namespace hosts (written by bench ooc).\nhost=\"$1\"; shift\ncase \"$host\" in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 1;;\nesac\nexec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n"
    );
    let path = dir.join("rsh-agent.sh");
    std::fs::write(&path, script)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// `pdgemm` of order `n`, blocks `nb`, on hosts `1..=ranks`, best of `reps`.
pub(super) fn run(placement: &HostsPlacement, ranks: usize, n: u64, nb: u32, reps: usize, base: &Path) -> anyhow::Result<Run> {
    let dir = base.join(format!("scalapack-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = compile(&dir)?;
    let agent = agent(&dir, placement)?;
    let hosts = &placement.hosts;
    let addrs: Vec<String> = (1..=ranks).map(|h| hosts.addr(h).to_string()).collect();
    let links = || (0..hosts.hosts()).map(|i| hosts.link_bytes(i)).collect::<Result<Vec<_>, _>>();
    let before = links()?;
    let out = hosts
        .command(0, "mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &ranks.to_string(), "--host", &addrs.join(",")])
        .args(["--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0"])
        .args(["-x", "OPENBLAS_NUM_THREADS=1"])
        .arg(&exe)
        .args([n.to_string(), nb.to_string(), reps.to_string()])
        .output()
        .context("running mpirun on host 0")?;
    let after = links()?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        bail!("mpirun of pdgemm failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with('{')).context("pdgemm printed no result")?;
    let links =
        before.iter().zip(&after).map(|(a, b)| netns::LinkBytes { rx: b.rx.saturating_sub(a.rx), tx: b.tx.saturating_sub(a.tx) }).collect();
    Ok(Run { result: serde_json::from_str(line)?, links })
}
