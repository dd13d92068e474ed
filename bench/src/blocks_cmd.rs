//! `bench blocks`: block put and get throughput through the store node,
//! as a ratio to writing and reading the same bytes with a plain file on
//! the same filesystem in the same run.
//!
//! For each block side b, K blocks of b×b f64 (about `--mib` MiB in all):
//! - raw put: append each block to one file, `fdatasync` after each (one
//!   sync per block, as the store syncs once per commit; the strictest
//!   file baseline: no per-block file creation, no directory sync);
//! - store put: per block `begin; put_block; commit` (commit = one synced
//!   RocksDB batch) from one client over loopback gRPC;
//! - raw put with two syncs: the raw put plus, per block, 64 bytes appended
//!   to a second file and `fdatasync`ed: the floor for any store that makes
//!   a block durable and then a record naming it (this one: the version
//!   file, then the commit's RocksDB batch), reported beside the ratio;
//! - both puts twice: of new blocks (a fresh matrix; raw: a truncated
//!   file), then over the blocks just written (raw: the same file
//!   rewritten in place), since the node overwrites the files of replaced
//!   versions and a job's puts are mostly overwrites;
//! - then the node is restarted (shutdown flushes the memtables), so every
//!   store read comes from its block version files on disk;
//! - gets, twice: **warm** (both sides read through the page cache, as just
//!   written) and **cold** (`/proc/sys/vm/drop_caches` before each side's
//!   pass; on a VM the host may still cache, so "cold" is the guest's view).
//!   raw get: `pread` each block into a fresh `Vec<f64>`; store get: one
//!   action, `get_blocks` of `--batch` blocks at a time under read locks
//!   (on the node's machine one round trip per batch, whose reply passes
//!   the blocks' files), each block read and its checksum checked by the
//!   client into the fresh `Vec<f64>` it returns; and again with one
//!   `get_block` per block (`blocks.get_one_ratio`: a round trip each, the
//!   latency a task that needs one block at a time sees).
//!
//! The client runs its operations as tasks on a runtime of one worker, as
//! a slave's prefetches and puts do. (Driving them with `block_on` from
//! the main thread cost a thread wake-up per reply: 81 µs per get of a
//! 512-byte block against 49 µs.)
//!
//! Timers cover only the operations (not building the data). Each side
//! runs `reps` times, alternating with the other, and keeps its best pass:
//! the machine is shared, and the best pass is the least disturbed one.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use store_client::{BlockData, Client};

use crate::report::Figure;
use crate::store_node::InProcess;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run, under a minute (less data per size, one pass per side).
    #[arg(long)]
    quick: bool,
    /// Block sides b (blocks of b×b f64).
    #[arg(long, value_delimiter = ',', default_value = "256,1024,2048")]
    sizes: Vec<u32>,
    /// Data per block size and pass, MiB (default 512, quick 96); at
    /// least 2 blocks.
    #[arg(long)]
    mib: Option<usize>,
    /// Passes per side and operation; the best is kept (default 2, quick 1).
    #[arg(long)]
    reps: Option<usize>,
    /// Skip the cold-cache reads (they need root to write
    /// /proc/sys/vm/drop_caches, and slow down everything else on the machine).
    #[arg(long)]
    no_cold: bool,
    /// Directory on the disk to measure: the store's data and the raw file
    /// go in fresh subdirectories of it (default: the system temp directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// How blocks travel: the data plane's Unix socket (what a client on
    /// the node's machine uses; puts' payloads through a pipe beside it),
    /// the same with puts' payloads through the socket itself
    /// (`unix-socket`, to compare), its TCP port (what a remote client
    /// uses), or the gRPC stream RPCs.
    #[arg(long, value_enum, default_value_t = Via::Unix)]
    via: Via,
    /// Most blocks per `get_blocks` in the store's get passes (1..=64);
    /// a batch also holds at most 8 MiB of blocks, so b ≥ 1024 gets one
    /// block at a time.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    batch: u32,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Via {
    Unix,
    /// The Unix socket, puts through the socket itself rather than the
    /// connection's pipe.
    UnixSocket,
    Tcp,
    Grpc,
}

impl Via {
    async fn connect(self, addr: &str) -> anyhow::Result<Client> {
        let c = Client::connect(addr, None).await?;
        Ok(match self {
            Via::Unix => c,
            Via::UnixSocket => c.puts_through_socket().await?,
            Via::Tcp => c.blocks_over_tcp().await?,
            Via::Grpc => c.blocks_over_grpc(),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Via::Unix => "unix",
            Via::UnixSocket => "unix-socket",
            Via::Tcp => "tcp",
            Via::Grpc => "grpc",
        }
    }
}

/// Most bytes of blocks one batched get returns. A batch saves round
/// trips, worth it for small blocks only (one per 8 MiB is under 1 % of
/// reading them), and every block it holds is a buffer of its own: fresh
/// buffers cost page faults that reusing one buffer does not (b = 1024 in
/// batches of 16: 0.51 of raw, against 0.62 one at a time).
const BATCH_BYTES: usize = 8 << 20;

const TARGET_PUT: f64 = 0.5;
const TARGET_GET: f64 = 0.6;
const MIB: f64 = (1 << 20) as f64;

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    // This process is both the store node and its client: tune malloc as
    // `master serve` and `slave` do, so the figure is the deployed one.
    // The raw side runs in the same process with the same allocator.
    store_client::reuse_block_buffers();
    let mib = args.mib.unwrap_or(if args.quick { 96 } else { 512 });
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 2 }).max(1);
    let mut node = InProcess::start(args.dir.as_deref())?;
    let raw_dir = match &args.dir {
        Some(d) => tempfile::Builder::new().prefix("bench-raw-").tempdir_in(d),
        None => tempfile::Builder::new().prefix("bench-raw-").tempdir(),
    }
    .context("creating the raw file's directory")?;
    let cold = !args.no_cold && drop_caches().is_ok();
    if !args.no_cold && !cold {
        eprintln!("blocks bench: cannot write /proc/sys/vm/drop_caches (not root?): cold reads skipped");
    }
    eprintln!(
        "blocks bench: store data {}, raw file in {}, {mib} MiB per size, best of {reps}",
        node.data_dir().display(),
        raw_dir.path().display()
    );
    // The client side runs as a slave's does: tasks on a runtime of one
    // worker, which also polls the sockets (a future driven by `block_on`
    // from another thread pays a thread wake-up per reply).
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let run_id = std::process::id();
    for &b in &args.sizes {
        if b == 0 || b > store::MAX_BLOCK {
            bail!("--sizes: a block side must be in 1..={}", store::MAX_BLOCK);
        }
        let block_bytes = b as usize * b as usize * 8;
        let k = (mib << 20).div_ceil(block_bytes).max(2);
        let total = (k * block_bytes) as f64;
        let batch = (BATCH_BYTES / block_bytes).clamp(1, args.batch as usize) as u32;
        let data: std::sync::Arc<[f64]> = block_data(b as usize).into();
        let raw_path = raw_dir.path().join(format!("raw-{b}.bin"));

        // ---- puts: new blocks, then overwrites; sides alternating ----
        let mut puts = [Puts::new(Written::New), Puts::new(Written::Over)];
        let mut matrix = None;
        for rep in 0..reps {
            if rep > 0 {
                // A fresh start keeps no recycled versions: the next new
                // blocks go into new files only.
                node.restart()?;
            }
            let client = rt.block_on(args.via.connect(&node.addr()))?;
            if let Some(old) = matrix.take() {
                rt.block_on(client.delete_matrix(old))?;
            }
            let m = rt.block_on(client.create_matrix(&format!("bench-blocks-{run_id}-{b}-{rep}"), b as u64, b as u64 * k as u64, b))?;
            for p in &mut puts {
                p.raw = p.raw.min(raw_write(&raw_path, &data, k, p.written, None)?);
                let record = raw_dir.path().join("record.log");
                p.raw_two_syncs = p.raw_two_syncs.min(raw_write(&raw_path, &data, k, p.written, Some(&record))?);
                p.store = p.store.min(on_worker(&rt, store_write(client.clone(), m.id, b, data.clone(), k))?);
            }
            matrix = Some(m.id);
        }
        let m_id = matrix.expect("at least one pass");
        node.restart()?;
        let client = rt.block_on(args.via.connect(&node.addr()))?;

        // ---- gets: warm (page cache) then cold ----
        let mut gets = Vec::new();
        let mut caches = vec!["warm"];
        if cold {
            caches.push("cold");
        }
        for cache in caches {
            let (mut raw_get, mut store_get, mut store_get_one) = (Duration::MAX, Duration::MAX, Duration::MAX);
            // With batches of one block the batched pass is the one-by-one pass.
            let batches = if batch > 1 { vec![batch, 1] } else { vec![batch] };
            for _ in 0..reps {
                if cache == "warm" {
                    // Bring both sides fully into the page cache first.
                    raw_read(&raw_path, b as usize, k)?;
                    on_worker(&rt, store_read(client.clone(), m_id, b, k, batch))?;
                } else {
                    drop_caches()?;
                }
                raw_get = raw_get.min(raw_read(&raw_path, b as usize, k)?);
                for &per in &batches {
                    if cache == "cold" {
                        drop_caches()?;
                    }
                    let t = on_worker(&rt, store_read(client.clone(), m_id, b, k, per))?;
                    let best = if per == batch { &mut store_get } else { &mut store_get_one };
                    *best = (*best).min(t);
                }
            }
            if batch == 1 {
                store_get_one = store_get;
            }
            gets.push((cache, raw_get, store_get, store_get_one));
        }
        drop(client);
        std::fs::remove_file(&raw_path).ok();

        // The machine may be shared: the 1-minute load average says how
        // much else ran while this size was measured.
        let load = crate::store_node::load_average();
        let rate = |d: Duration| total / MIB / d.as_secs_f64();
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        let r1 = |x: f64| (x * 10.0).round() / 10.0;
        let common = |v: Vec<(&'static str, serde_json::Value)>| {
            let mut e = vec![
                ("b", json!(b)),
                ("blocks", json!(k)),
                ("mib", json!(r1(total / MIB))),
                ("loadavg", json!(load)),
                ("via", json!(args.via.name())),
            ];
            e.extend(v);
            e
        };
        for p in &puts {
            let (blocks_were, what) = match p.written {
                Written::New => {
                    ("new", "store: begin+put_block+commit(synced) per new block; raw: append+fdatasync per block to a truncated file")
                }
                Written::Over => (
                    "overwritten",
                    "store: begin+put_block+commit(synced) per block written before; raw: overwrite in place+fdatasync per block",
                ),
            };
            Figure {
                name: "blocks.put_ratio",
                value: r2(rate(p.store) / rate(p.raw)),
                unit: "ratio",
                target: Some(TARGET_PUT),
                extra: common(vec![
                    ("blocks_were", json!(blocks_were)),
                    ("store_mib_s", json!(r1(rate(p.store)))),
                    ("raw_mib_s", json!(r1(rate(p.raw)))),
                    ("raw_two_syncs_mib_s", json!(r1(rate(p.raw_two_syncs)))),
                    ("what", json!(what)),
                ]),
            }
            .print();
        }
        for (cache, raw_get, store_get, store_get_one) in gets {
            let source = if cache == "warm" {
                "both from the page cache (store: block version files)"
            } else {
                "both after drop_caches (store: block version files from disk)"
            };
            for (name, batch, store_get) in [("blocks.get_ratio", batch, store_get), ("blocks.get_one_ratio", 1, store_get_one)] {
                Figure {
                    name,
                    value: r2(rate(store_get) / rate(raw_get)),
                    unit: "ratio",
                    target: Some(TARGET_GET),
                    extra: common(vec![
                        ("cache", json!(cache)),
                        ("batch", json!(batch)),
                        ("store_mib_s", json!(r1(rate(store_get)))),
                        ("raw_mib_s", json!(r1(rate(raw_get)))),
                        ("what", json!(source)),
                    ]),
                }
                .print();
            }
        }
    }
    drop(rt);
    node.stop()
}

/// A block of distinct values (nothing compresses or dedups).
fn block_data(b: usize) -> Vec<f64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..b * b)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

fn as_bytes(v: &[f64]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Whether a put pass writes blocks for the first time or over blocks
/// written before (a job's usual case: Cholesky and LU update every block
/// in place many times, a multiply accumulates into C).
#[derive(Clone, Copy)]
enum Written {
    New,
    Over,
}

/// The best times of a put pass on each side.
struct Puts {
    written: Written,
    raw: Duration,
    /// The raw pass with a second synced write per block, of a commit
    /// record's size to another file: what any store that makes a block
    /// durable and then a pointer to it must at least pay.
    raw_two_syncs: Duration,
    store: Duration,
}

impl Puts {
    fn new(written: Written) -> Puts {
        Puts { written, raw: Duration::MAX, raw_two_syncs: Duration::MAX, store: Duration::MAX }
    }
}

/// Writes k blocks to the file from its start, `fdatasync` after each:
/// appended to the file truncated first (new blocks) or over its old
/// bytes in place (overwrites); with `record`, then also appends 64 bytes
/// to that file and `fdatasync`s it, per block. Returns the time.
fn raw_write(path: &Path, data: &[f64], k: usize, written: Written, record: Option<&Path>) -> anyhow::Result<Duration> {
    let mut f = OpenOptions::new().create(true).write(true).truncate(matches!(written, Written::New)).open(path)?;
    f.sync_all()?;
    let mut log = match record {
        Some(r) => Some(OpenOptions::new().create(true).append(true).open(r)?),
        None => None,
    };
    let mut t = Duration::ZERO;
    for _ in 0..k {
        let t0 = Instant::now();
        f.write_all(as_bytes(data))?;
        f.sync_data()?;
        if let Some(log) = &mut log {
            log.write_all(&[0x5a; 64])?;
            log.sync_data()?;
        }
        t += t0.elapsed();
    }
    Ok(t)
}

/// Reads the k blocks back, each into a fresh `Vec<f64>`; returns the time.
fn raw_read(path: &Path, b: usize, k: usize) -> anyhow::Result<Duration> {
    let f = File::open(path)?;
    let len = b * b * 8;
    let mut sum = 0.0;
    let t0 = Instant::now();
    for j in 0..k {
        let mut v = vec![0f64; b * b];
        f.read_exact_at(bytemuck::cast_slice_mut(&mut v), (j * len) as u64)?;
        sum += v[v.len() / 2];
    }
    let t = t0.elapsed();
    std::hint::black_box(sum);
    Ok(t)
}

/// Runs `f` as a task of `rt`'s worker and waits for it.
fn on_worker<F>(rt: &tokio::runtime::Runtime, f: F) -> anyhow::Result<Duration>
where
    F: std::future::Future<Output = anyhow::Result<Duration>> + Send + 'static,
{
    rt.block_on(rt.spawn(f))?
}

/// Writes blocks (0, j), each in its own committed action; returns the time
/// of the operations only (the copy of the input block is outside it).
async fn store_write(client: Client, matrix: uuid::Uuid, b: u32, data: std::sync::Arc<[f64]>, k: usize) -> anyhow::Result<Duration> {
    let session = client.open_session("bench-blocks").await?;
    let mut t = Duration::ZERO;
    for j in 0..k {
        let block = BlockData { rows: b as usize, cols: b as usize, data: data.to_vec() };
        let t0 = Instant::now();
        let action = session.begin().await?;
        action.put_block(matrix, 0, j as u32, block).await?;
        action.commit().await?;
        t += t0.elapsed();
    }
    Ok(t)
}

/// Reads blocks (0, j) inside one action under read locks, `batch` to a
/// request (1: `get_block` each); returns the time.
async fn store_read(client: Client, matrix: uuid::Uuid, b: u32, k: usize, batch: u32) -> anyhow::Result<Duration> {
    let session = client.open_session("bench-blocks").await?;
    let t0 = Instant::now();
    let action = session.begin().await?;
    let mut sum = 0.0;
    let ids: Vec<(u32, u32)> = (0..k as u32).map(|j| (0, j)).collect();
    for chunk in ids.chunks(batch as usize) {
        let blocks =
            if batch == 1 { vec![action.get_block(matrix, 0, chunk[0].1).await?] } else { action.get_blocks(matrix, chunk).await? };
        for (block, (_, j)) in blocks.iter().zip(chunk) {
            if block.rows != b as usize || block.cols != b as usize {
                bail!("block (0, {j}) came back {}x{}", block.rows, block.cols);
            }
            sum += block.data[block.data.len() / 2];
        }
    }
    action.commit().await?;
    let t = t0.elapsed();
    std::hint::black_box(sum);
    Ok(t)
}

/// Writes dirty pages back, then drops the page cache (and dentries and
/// inodes), so the next read comes from the disk.
fn drop_caches() -> anyhow::Result<()> {
    let ok = std::process::Command::new("sync").status().context("running sync")?.success();
    if !ok {
        bail!("sync failed");
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").context("writing /proc/sys/vm/drop_caches")?;
    Ok(())
}
