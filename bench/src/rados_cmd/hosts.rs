//! `bench rados --hosts`: the store-link-bound multiply across namespace
//! hosts (`netns`, every link shaped to `--rate`), with its blocks in the
//! store node's files (every block through the store host's one link)
//! and then in a Ceph pool on v = 1, 2, 3… OSD hosts of their own, which
//! the slaves read and write themselves (`master serve --blocks rados`,
//! `slave --ceph-conf`); slave caching off throughout, so that every read
//! goes to storage. Hosts: 0 the store node (and the Ceph monitor),
//! 1..=S the slaves (the CLI on S), then the OSD hosts.
//!
//! The model's figure for each point is the source's store-bandwidth
//! bound (`003…` §5.2, §5.4) with v storage hosts: a task reads its 2p
//! input blocks and writes one, so at link rate B per storage host the
//! multiply runs at most at v·B·2b³p / (2p·8b²) = v·B·b/8 flop/s, reads
//! being the bound direction; capped by the slaves' compute rate, which
//! the run measures as the job's kernel time.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;

use crate::cluster::{on_host, Cluster, ClusterConfig, HostsPlacement, Placement};
use crate::report::Figure;

pub(super) struct Spec<'a> {
    pub(super) n: u64,
    pub(super) b: u32,
    pub(super) slaves: usize,
    pub(super) osd_hosts: &'a [usize],
    pub(super) rate: &'a str,
    pub(super) base: &'a Path,
}

fn script() -> anyhow::Result<std::path::PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh");
    anyhow::ensure!(here.exists(), "{} is missing (run from the source tree)", here.display());
    Ok(here)
}

/// A throwaway Ceph cluster on namespace hosts, stopped on drop.
struct Ceph {
    dir: tempfile::TempDir,
}

impl Ceph {
    fn start(placement: &HostsPlacement, osd_hosts: std::ops::Range<usize>, base: &Path) -> anyhow::Result<Ceph> {
        let dir = tempfile::Builder::new().prefix("ceph-").tempdir_in(base).context("the Ceph cluster's directory")?;
        let hosts = &placement.hosts;
        let mut cmd = Command::new("bash");
        cmd.arg(script()?).arg("start").arg(dir.path());
        cmd.args(["--owner", &std::process::id().to_string(), "--mon-at", &format!("{}:{}", hosts.ns_name(0), hosts.addr(0))]);
        for h in osd_hosts {
            cmd.args(["--osd-at", &format!("{}:{}", hosts.ns_name(h), hosts.addr(h))]);
        }
        let out = cmd.output().context("running ceph-cluster.sh")?;
        let ceph = Ceph { dir };
        if !out.status.success() {
            bail!("ceph-cluster.sh start: {}", String::from_utf8_lossy(&out.stderr));
        }
        // Enough placement groups that the blocks spread evenly over the OSDs.
        let out = Command::new("bash").arg(script()?).arg("pool").arg(ceph.dir.path()).args(["blocks", "1", "128"]).output()?;
        if !out.status.success() {
            bail!("ceph-cluster.sh pool: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(ceph)
    }

    fn conf(&self) -> String {
        self.dir.path().join("ceph.conf").to_string_lossy().into_owned()
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        if let Ok(s) = script() {
            let _ = Command::new("bash").arg(s).arg("stop").arg(self.dir.path()).status();
        }
    }
}

/// One multiply across hosts: GFLOP/s, seconds, bytes per link, kernel
/// seconds (all slaves).
struct Point {
    gflops: f64,
    seconds: f64,
    links: Vec<netns::LinkBytes>,
}

fn multiply(spec: &Spec, placement: &HostsPlacement, serve_args: Vec<String>, slave_args: Vec<String>) -> anyhow::Result<Point> {
    on_host(&placement.hosts, placement.cli_host, || {
        let c = Cluster::start(ClusterConfig {
            slaves: spec.slaves,
            base_dir: Some(spec.base.to_owned()),
            placement: Placement::Hosts(placement.clone()),
            serve_args,
            slave_args,
            ..ClusterConfig::default()
        })?;
        c.create_matrix("A", spec.n, spec.b, "random", 1)?;
        c.create_matrix("B", spec.n, spec.b, "random", 2)?;
        let before = c.snapshot();
        let job = c.run_job(&["matmul", "A", "B", "--out", "C"], Duration::from_secs(3600))?;
        let after = c.snapshot();
        anyhow::ensure!(job.ok(), "the multiply failed: {}", job.failure.clone().unwrap_or_default());
        let (ok, line) = c.verify(job.id)?;
        anyhow::ensure!(ok, "the multiply's result: {line}");
        eprintln!("  {:.2} GFLOP/s in {:.1} s ({line})", job.gflops(), job.seconds);
        Ok(Point { gflops: job.gflops(), seconds: job.seconds, links: before.links_since(&after) })
    })
}

fn link_json(links: &[netns::LinkBytes], secs: f64) -> serde_json::Value {
    json!(links
        .iter()
        .enumerate()
        .map(|(h, l)| json!({"host": h, "tx_bytes": l.tx, "rx_bytes": l.rx, "tx_mbit_s": l.tx as f64 * 8.0 / secs / 1e6}))
        .collect::<Vec<_>>())
}

/// The model's bound: v storage links at `rate_bps` bits/s, reads the
/// bound direction.
fn model_gflops(v: usize, rate_bps: f64, b: u32) -> f64 {
    v as f64 * rate_bps / 8.0 * f64::from(b) / 8.0 / 1e9
}

pub(super) fn run(spec: &Spec) -> anyhow::Result<()> {
    let rate_bps = if spec.rate == "none" {
        f64::INFINITY
    } else {
        spec.rate.parse::<netns::Rate>().with_context(|| format!("--rate {}", spec.rate))?.as_bits_per_sec() as f64
    };
    let common = |v: usize| {
        vec![
            ("n", json!(spec.n)),
            ("b", json!(spec.b)),
            ("slaves", json!(spec.slaves)),
            ("osd_hosts", json!(v)),
            ("rate", json!(spec.rate)),
        ]
    };
    eprintln!("across hosts: blocks in the store node's files, {} slaves, caching off", spec.slaves);
    let local = {
        let mut placement = HostsPlacement::create(1 + spec.slaves, spec.rate)?;
        placement.cli_host = spec.slaves;
        multiply(spec, &placement, Vec::new(), vec!["--cache-mib".into(), "0".into()])?
    };
    let model_local = model_gflops(1, rate_bps, spec.b);
    let mut extra = common(0);
    extra.extend([
        ("model_gflops", json!(model_local)),
        ("seconds", json!(local.seconds)),
        ("links", link_json(&local.links, local.seconds)),
    ]);
    Figure { name: "rados_hosts.local.gflops", value: local.gflops, unit: "GFLOP/s", target: None, extra }.print();
    // For comparison: the same blocks in files, with the slaves' block
    // caches and peer transfer on (not available with a pool).
    let cached = {
        let mut placement = HostsPlacement::create(1 + spec.slaves, spec.rate)?;
        placement.cli_host = spec.slaves;
        multiply(spec, &placement, Vec::new(), Vec::new())?
    };
    let mut extra = common(0);
    extra.extend([("seconds", json!(cached.seconds)), ("links", link_json(&cached.links, cached.seconds))]);
    Figure { name: "rados_hosts.local_cached.gflops", value: cached.gflops, unit: "GFLOP/s", target: None, extra }.print();
    for &v in spec.osd_hosts {
        eprintln!("across hosts: blocks in a pool on {v} OSD host(s), slaves reading it themselves");
        let mut placement = HostsPlacement::create(1 + spec.slaves + v, spec.rate)?;
        placement.cli_host = spec.slaves;
        placement.last_slave_host = spec.slaves;
        let ceph = Ceph::start(&placement, 1 + spec.slaves..1 + spec.slaves + v, spec.base)?;
        let conf = ceph.conf();
        let serve = ["--blocks", "rados", "--pool", "blocks", "--ceph-conf", &conf].map(String::from).to_vec();
        let slave = ["--ceph-conf", &conf, "--cache-mib", "0"].map(String::from).to_vec();
        let p = multiply(spec, &placement, serve, slave)?;
        drop(ceph);
        let model = model_gflops(v, rate_bps, spec.b);
        let mut extra = common(v);
        extra.extend([
            ("model_gflops", json!(model)),
            ("vs_model", json!(p.gflops / model)),
            ("seconds", json!(p.seconds)),
            ("links", link_json(&p.links, p.seconds)),
        ]);
        Figure { name: &format!("rados_hosts.osd{v}.gflops"), value: p.gflops, unit: "GFLOP/s", target: None, extra }.print();
        let target = (v == 3).then_some(2.5);
        let extra = vec![("local_gflops", json!(local.gflops)), ("model_ratio", json!(model / model_local))];
        Figure { name: &format!("rados_hosts.osd{v}.vs_local"), value: p.gflops / local.gflops, unit: "x", target, extra }.print();
    }
    Ok(())
}
