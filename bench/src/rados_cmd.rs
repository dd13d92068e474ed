//! `bench rados` (feature `rados`): block versions as objects of a Ceph
//! pool against the same blocks as version files on this host's disk, in
//! one run: what the `rados` block backend (issue 48) pays or gains per
//! block before the store node is in the path.
//!
//! For each block side b and each client count c, K blocks of b×b f64
//! (about `--mib` MiB in all) are split over c threads:
//! - local put: one file per block in `--dir`, written and `fdatasync`ed
//!   (a version file as the node writes it, without its RocksDB batch);
//! - rados put: `VersionObjects::put` (checked, written whole; acknowledged
//!   once every replica has it);
//! - gets: each block read whole and its checksum checked, local files
//!   through the page cache (as just written; caches are not dropped, the
//!   machine is shared), objects from the OSDs (BlueStore reads past the
//!   page cache, from its own cache or the disk).
//!
//! The figures are aggregate MB/s of payload and the ratio rados / local.
//!
//! Start a cluster first: `scripts/ceph-cluster.sh start DIR --osds N`
//! and `scripts/ceph-cluster.sh pool DIR ftbag 1`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use ftbag_rados::{Cluster, ClusterOptions, VersionObjects};
use serde_json::json;
use store_client::block::{self, BlockHeader};
use uuid::Uuid;

use crate::report::Figure;

mod hosts;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The cluster's configuration (not with --osd-hosts).
    #[arg(long, default_value = "/etc/ceph/ceph.conf")]
    ceph_conf: PathBuf,
    /// The pool the objects go to (left as it was found).
    #[arg(long, default_value = "ftbag")]
    pool: String,
    /// Where the local version files go (a temporary directory under it).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// Block sides.
    #[arg(long, value_delimiter = ',', default_value = "256,512,1024")]
    sides: Vec<u32>,
    /// Client threads.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    clients: Vec<usize>,
    /// Payload per (side, clients) point.
    #[arg(long, default_value_t = 512)]
    mib: u64,
    /// Also a multiply of n = N with blocks of B (`N:B`), run on a store
    /// node with its blocks in files and on one with them in the pool
    /// (`master serve --blocks rados`, slaves reading it themselves), one
    /// after the other in this run. Needs master and slave built with
    /// their `rados` feature beside this binary.
    #[arg(long, value_name = "N:B")]
    matmul: Option<String>,
    /// Slaves of the multiply.
    #[arg(long, default_value_t = 2)]
    slaves: usize,
    /// Instead of the above: the multiply of --matmul across namespace
    /// hosts (root), blocks in the store node's files, then in a pool on
    /// each count of OSD hosts given here (its own cluster each time,
    /// started on those hosts; --ceph-conf is not used), slave caching
    /// off. Hosts: the store node, --slaves slave hosts, the OSD hosts.
    #[arg(long, value_delimiter = ',', value_name = "V,...")]
    osd_hosts: Vec<usize>,
    /// Each host's link rate both ways (`none`: unshaped), with --osd-hosts.
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// b = 512, 1 and 4 clients, 128 MiB; a multiply of n = 1024, b = 256.
    #[arg(long)]
    quick: bool,
}

fn block_value(b: u32, seed: u64) -> Vec<u8> {
    let payload: Vec<u8> = (0..u64::from(b) * u64::from(b)).flat_map(|i| ((i ^ seed) as f64).to_le_bytes()).collect();
    let header = BlockHeader { rows: b, cols: b, checksum: block::checksum(&payload) };
    [&header.encode()[..], &payload].concat()
}

fn check(value: &[u8]) -> anyhow::Result<()> {
    let (header, payload) = block::decode(value, &|| "a local version".into())?;
    anyhow::ensure!(block::checksum_matches(&header, payload), "a local version does not match its checksum");
    Ok(())
}

/// Runs `f(thread, ids)` on `clients` threads, each its share of `ids`;
/// returns the seconds for all.
fn timed(clients: usize, ids: &[Uuid], f: impl Fn(&[Uuid]) -> anyhow::Result<()> + Sync) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let share = ids.len().div_ceil(clients);
    std::thread::scope(|s| {
        let handles: Vec<_> = ids.chunks(share).map(|part| s.spawn(|| f(part))).collect();
        handles.into_iter().try_for_each(|h| h.join().expect("a bench thread panicked"))
    })?;
    Ok(t0.elapsed().as_secs_f64())
}

fn local_path(dir: &Path, id: Uuid) -> PathBuf {
    dir.join(id.simple().to_string())
}

pub(crate) fn run(mut args: Args) -> anyhow::Result<()> {
    if args.quick {
        (args.sides, args.clients, args.mib) = (vec![512], vec![1, 4], 128);
        args.matmul.get_or_insert_with(|| "1024:256".into());
    }
    if !args.osd_hosts.is_empty() {
        let (n, b) = matmul_size(args.matmul.as_deref().unwrap_or("4096:512"))?;
        let base = tempfile::Builder::new().prefix("ftbag-bench-rados-").tempdir_in(&args.dir).context("a working directory")?;
        let spec = hosts::Spec { n, b, slaves: args.slaves, osd_hosts: &args.osd_hosts, rate: &args.rate, base: base.path() };
        return hosts::run(&spec);
    }
    let cluster = Cluster::connect(ClusterOptions::new(&args.ceph_conf))?;
    let objects = Arc::new(VersionObjects::new(cluster.pool(&args.pool)?, format!("bench.{}.", Uuid::new_v4().simple())));
    let dir = tempfile::Builder::new().prefix("ftbag-bench-rados-").tempdir_in(&args.dir).context("local version dir")?;
    for &b in &args.sides {
        let bytes = 8 * u64::from(b) * u64::from(b);
        let k = ((args.mib << 20) / bytes).max(4) as usize;
        let values: Vec<Vec<u8>> = (0..8).map(|s| block_value(b, s)).collect();
        for &c in &args.clients {
            let ids: Vec<Uuid> = (0..k).map(|_| Uuid::new_v4()).collect();
            let value_of = |id: &Uuid| &values[(id.as_u128() % 8) as usize];
            let mb = (k as u64 * bytes) as f64 / 1e6;
            let local_put = timed(c, &ids, |part| {
                for id in part {
                    let mut f = std::fs::File::create(local_path(dir.path(), *id))?;
                    f.write_all(value_of(id))?;
                    f.sync_data()?;
                }
                Ok(())
            })?;
            let rados_put = timed(c, &ids, |part| part.iter().try_for_each(|id| objects.put(*id, value_of(id)).map_err(Into::into)))?;
            let local_get = timed(c, &ids, |part| part.iter().try_for_each(|id| check(&std::fs::read(local_path(dir.path(), *id))?)))?;
            let rados_get = timed(c, &ids, |part| {
                for id in part {
                    anyhow::ensure!(&objects.get(*id)? == value_of(id), "object {id} read back different");
                }
                Ok(())
            })?;
            for id in &ids {
                std::fs::remove_file(local_path(dir.path(), *id))?;
            }
            objects.delete(&ids)?;
            for (op, local, rados) in [("put", local_put, rados_put), ("get", local_get, rados_get)] {
                let extra = || vec![("b", json!(b)), ("clients", json!(c)), ("blocks", json!(k))];
                for (side, secs) in [("local", local), ("rados", rados)] {
                    Figure { name: &format!("rados.{op}.{side}"), value: mb / secs, unit: "MB/s", target: None, extra: extra() }.print();
                }
                Figure { name: &format!("rados.{op}.ratio"), value: local / rados, unit: "x", target: None, extra: extra() }.print();
            }
        }
    }
    if let Some(spec) = &args.matmul {
        matmul_on_both(&args, spec)?;
    }
    Ok(())
}

fn matmul_size(spec: &str) -> anyhow::Result<(u64, u32)> {
    let (n, b) = spec.split_once(':').context("--matmul takes N:B")?;
    Ok((n.parse().context("--matmul's N")?, b.parse().context("--matmul's B")?))
}

/// The same multiply with blocks in the node's files and in the pool.
fn matmul_on_both(args: &Args, spec: &str) -> anyhow::Result<()> {
    use crate::cluster::{Cluster as Nodes, ClusterConfig};
    let (n, b) = matmul_size(spec)?;
    let conf = args.ceph_conf.to_string_lossy().into_owned();
    let mut gflops = Vec::new();
    for backend in ["local", "rados"] {
        let mut config = ClusterConfig { slaves: args.slaves, base_dir: Some(args.dir.clone()), ..ClusterConfig::default() };
        if backend == "rados" {
            config.serve_args = ["--blocks", "rados", "--pool", &args.pool, "--ceph-conf", &conf].map(String::from).to_vec();
            config.slave_args = vec!["--ceph-conf".into(), conf.clone()];
        }
        let c = Nodes::start(config)?;
        c.create_matrix("A", n, b, "random", 1)?;
        c.create_matrix("B", n, b, "random", 2)?;
        let job = c.run_job(&["matmul", "A", "B", "--out", "C"], std::time::Duration::from_secs(3600))?;
        anyhow::ensure!(job.ok(), "the {backend} multiply failed: {}", job.failure.clone().unwrap_or_default());
        let (ok, line) = c.verify(job.id)?;
        anyhow::ensure!(ok, "the {backend} multiply's result: {line}");
        for name in ["A", "B", "C"] {
            c.remove_matrix(name);
        }
        let extra = vec![("n", json!(n)), ("b", json!(b)), ("slaves", json!(args.slaves)), ("seconds", json!(job.seconds))];
        Figure { name: &format!("rados.matmul.{backend}"), value: job.gflops(), unit: "GFLOP/s", target: None, extra }.print();
        gflops.push(job.gflops());
    }
    let extra = vec![("n", json!(n)), ("b", json!(b)), ("slaves", json!(args.slaves))];
    Figure { name: "rados.matmul.ratio", value: gflops[1] / gflops[0], unit: "x", target: None, extra }.print();
    Ok(())
}
