//! `bench blocks --hosts`: the cost of TLS on block throughput across a
//! network-namespace link. Two hosts (`netns`): a `master serve` node on
//! host 0 (fixed ports, a token), this bench's client on a thread moved
//! into host 1, so every block crosses the link over the TCP data plane.
//! The node runs twice, without and with TLS (certificates made by
//! `master certs`, the client trusting their CA), at each link rate of
//! `--rates` ("none": unshaped). Puts are `begin; put_block; commit`
//! (synced) per block, as in the one-host figure; gets are `get_blocks`
//! under one action, `--batch` blocks (at most 8 MiB) a request. Each
//! figure is the best of `reps` passes, as MiB/s, and TLS's over
//! plaintext's.
//!
//! The node and the client share this machine's cores, so where the link
//! is not the limit the figure includes both ends' CPU, TLS's included.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use store_client::{Client, ClientTls, ConnectOptions};

use super::{block_data, on_worker, r1, r2, store_read, store_write, Args, Reads, BATCH_BYTES, MIB};
use crate::cluster::{bin_dir, on_host, spawn_node, DATA_PORT, GRPC_PORT};
use crate::report::Figure;

const TOKEN: &str = "bench-blocks-hosts";

/// Best put and get rates of one block size, MiB/s.
struct Rates {
    b: u32,
    blocks: usize,
    put: f64,
    get: f64,
}

pub(super) fn run(args: &Args) -> anyhow::Result<()> {
    block_alloc::reuse_block_buffers();
    let bin = bin_dir()?;
    let mib = args.mib.unwrap_or(if args.quick { 64 } else { 256 });
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 2 }).max(1);
    let sizes = if args.quick { vec![1024] } else { args.sizes.clone() };
    let base = match &args.dir {
        Some(d) => d.clone(),
        None => crate::cluster::default_base_dir()?,
    };
    let dir = tempfile::Builder::new().prefix("blocks-hosts-").tempdir_in(&base)?;
    eprintln!(
        "blocks across hosts: node on host 0, client on host 1, TCP data plane, {mib} MiB per size, best of {reps}, rates {:?} \
         (no delay applied: no netem); node and client share this machine's cores",
        args.rates
    );
    for rate in &args.rates {
        let mut spec = netns::Spec::hosts(2);
        if rate != "none" {
            spec = spec.rate(rate.parse().with_context(|| format!("--rates {rate}"))?);
        }
        let hosts = netns::Cluster::create(spec).context("creating the namespace hosts (needs root)")?;
        let ip = hosts.addr(0);
        let certs = dir.path().join(format!("certs-{rate}"));
        let out = std::process::Command::new(bin.join("master"))
            .args(["certs", "--host", &ip.to_string(), "--out"])
            .arg(&certs)
            .output()
            .context("running master certs")?;
        if !out.status.success() {
            bail!("master certs failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut by_tls = Vec::new();
        for tls in [false, true] {
            let name = format!("{rate}-{}", if tls { "tls" } else { "plain" });
            let log = dir.path().join(format!("store-{name}.log"));
            let mut cmd = hosts.command(0, bin.join("master"));
            cmd.args(["serve", "--data"])
                .arg(dir.path().join(format!("store-{name}")))
                .args(["--listen", &format!("{ip}:{GRPC_PORT}"), "--data-listen", &format!("{ip}:{DATA_PORT}")])
                .env("STORE_TOKEN", TOKEN)
                .stderr(std::fs::File::create(&log)?);
            if tls {
                cmd.arg("--tls-cert").arg(certs.join("node.pem")).arg("--tls-key").arg(certs.join("node-key.pem"));
            }
            let (mut node, addr) = spawn_node(cmd, &log)?;
            let ca = tls.then(|| certs.join("ca.pem"));
            eprintln!("  {rate}, {}: node at {addr}", if tls { "TLS" } else { "plaintext" });
            let r = on_host(&hosts, 1, || measure(&addr, ca.as_deref(), &sizes, mib, reps, args.batch));
            let _ = node.kill();
            let _ = node.wait();
            by_tls.push(r?);
        }
        let load = crate::store_node::load_average();
        for (plain, tls) in by_tls[0].iter().zip(&by_tls[1]) {
            for (op, p, t) in [("put", plain.put, tls.put), ("get", plain.get, tls.get)] {
                let what = if op == "put" { "begin+put_block+commit(synced) per block" } else { "get_blocks under one action" };
                Figure {
                    name: &format!("blocks.hosts_tls_{op}_ratio"),
                    value: r2(t / p),
                    unit: "ratio",
                    target: None,
                    extra: vec![
                        ("rate", json!(rate)),
                        ("b", json!(plain.b)),
                        ("blocks", json!(plain.blocks)),
                        ("plain_mib_s", json!(r1(p))),
                        ("tls_mib_s", json!(r1(t))),
                        ("what", json!(what)),
                        ("delay", json!("none (no netem)")),
                        ("loadavg", json!(load)),
                    ],
                }
                .print();
            }
        }
    }
    Ok(())
}

/// On the calling thread's host: a client of the node at `addr` (TLS when
/// `ca` is given) puts and gets each size's blocks; best rates.
fn measure(addr: &str, ca: Option<&Path>, sizes: &[u32], mib: usize, reps: usize, batch: u32) -> anyhow::Result<Vec<Rates>> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let tls = ca.map(|ca| ClientTls::from_files(ca, None, None)).transpose()?;
    let options = ConnectOptions { token: Some(TOKEN.into()), tls, ..ConnectOptions::default() };
    let client = rt.block_on(Client::connect_with_retrying(addr, &options, Some(Duration::from_secs(30))))?;
    let session = rt.block_on(client.open_session("bench-blocks-hosts"))?;
    let mut out = Vec::new();
    for &b in sizes {
        let block_bytes = b as usize * b as usize * 8;
        let k = (mib << 20).div_ceil(block_bytes).max(2);
        let total = (k * block_bytes) as f64 / MIB;
        let per = (BATCH_BYTES / block_bytes).clamp(1, batch as usize) as u32;
        let data: Arc<[f64]> = block_data(b as usize).into();
        let m = rt.block_on(client.create_matrix(&format!("bench-blocks-hosts-{b}"), b as u64, b as u64 * k as u64, b))?;
        let (mut put, mut get) = (Duration::MAX, Duration::MAX);
        for _ in 0..reps {
            put = put.min(on_worker(&rt, store_write(session.clone(), m.id, b, data.clone(), 0..k))?);
            let action = Arc::new(rt.block_on(session.begin())?);
            get = get.min(on_worker(&rt, store_read(action.clone(), Reads { matrix: m.id, b, blocks: 0..k, batch: per }))?);
            super::finish(&rt, action)?;
        }
        rt.block_on(client.delete_matrix(m.id))?;
        let r = Rates { b, blocks: k, put: total / put.as_secs_f64(), get: total / get.as_secs_f64() };
        eprintln!("    b = {b}: put {:.1} MiB/s, get {:.1} MiB/s", r.put, r.get);
        out.push(r);
    }
    Ok(out)
}
