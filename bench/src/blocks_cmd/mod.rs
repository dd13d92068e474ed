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
//! Timers cover only the operations (not building the data). The puts and
//! the warm gets run `reps` passes, each cut into 16 chunks of blocks that
//! the sides take in turns (raw, then store; store first every other
//! chunk): each chunk gives a pair of times measured under the same host
//! conditions, and a figure is the **median of its pairs' ratios**, with
//! their quartiles beside it (`paired`). The ratio of each side's best
//! whole pass is printed too (`best_pass_ratio`), and so are the best
//! passes' rates. The cold gets still run whole passes (a chunk cannot
//! be made cold for one side alone) and report the best pass of each side.

mod hosts;
mod paired;
mod raw;

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use store_client::{Action, BlockData, Client, Session};

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
    /// Passes per operation (default 2, quick 1). Each pass of puts and
    /// warm gets is cut into 16 chunks the sides take in turns; the cold
    /// gets keep each side's best whole pass.
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
    /// Run the client (and the raw side) on the first CPU only and the
    /// in-process store node's threads on the others, as a store node with
    /// cores of its own runs. Without it the kernel places them: one that
    /// packs a woken thread onto the CPU of its waker (this project's VM
    /// does) runs a get's node side and client side one after the other
    /// on one CPU. Needs two CPUs or more.
    #[arg(long)]
    pin: bool,
    /// Measure across two network-namespace hosts instead (needs root): a
    /// `master serve` node on host 0, this client on host 1, blocks over
    /// the TCP data plane, without and with TLS (the cost of TLS), at each
    /// of --rates. Uses --sizes (quick: 1024), --mib (default 256, quick
    /// 64), --reps, --batch, --dir.
    #[arg(long)]
    hosts: bool,
    /// With --hosts: the link rates to measure at (tc tbf both ways;
    /// "none": unshaped). No delay is applied (no netem here).
    #[arg(long, value_delimiter = ',', default_value = "none,1gbit", requires = "hosts")]
    rates: Vec<String>,
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
    if args.hosts {
        return hosts::run(&args);
    }
    // This process is both the store node and its client: tune malloc as
    // `master serve` and `slave` do, so the figure is the deployed one.
    // The raw side runs in the same process with the same allocator.
    block_alloc::reuse_block_buffers();
    let mib = args.mib.unwrap_or(if args.quick { 96 } else { 512 });
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 2 }).max(1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.pin && cpus < 2 {
        bail!("--pin needs two CPUs or more; this process may use {cpus}");
    }
    let node_cpus: Option<Vec<usize>> = args.pin.then(|| (1..cpus).collect());
    let mut node = InProcess::start_on(args.dir.as_deref(), node_cpus)?;
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
        "blocks bench: store data {}, raw file in {}, {mib} MiB per size, {reps} passes of {CHUNKS_PER_PASS} paired chunks",
        node.data_dir().display(),
        raw_dir.path().display()
    );
    // The client side runs as a slave's does: tasks on a runtime of one
    // worker, which also polls the sockets (a future driven by `block_on`
    // from another thread pays a thread wake-up per reply).
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(1).enable_all();
    if args.pin {
        crate::store_node::pin_to(&[0]).context("pinning the client to CPU 0")?;
        rt.on_thread_start(|| {
            let _ = crate::store_node::pin_to(&[0]);
        });
    }
    let rt = rt.build()?;
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
        let chunks = paired::chunk_ranges(k, CHUNKS_PER_PASS);
        let raw_path = raw_dir.path().join(format!("raw-{b}.bin"));
        let raw2_path = raw_dir.path().join(format!("raw-two-syncs-{b}.bin"));
        let record_path = raw_dir.path().join("record.log");

        // ---- puts: new blocks, then overwrites; chunks alternating ----
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
            let session = rt.block_on(client.open_session("bench-blocks"))?;
            for p in &mut puts {
                let mut raw = raw::Writer::open(&raw_path, p.written, None)?;
                let mut raw2 = raw::Writer::open(&raw2_path, p.written, Some(&record_path))?;
                for (c, range) in chunks.iter().enumerate() {
                    let mut t = [Duration::ZERO; 3];
                    for side in turns(c) {
                        t[side] = match side {
                            RAW => raw.write(&data, range.len())?,
                            RAW_TWO_SYNCS => raw2.write(&data, range.len())?,
                            _ => on_worker(&rt, store_write(session.clone(), m.id, b, data.clone(), range.clone()))?,
                        };
                    }
                    p.sides.chunk(t);
                }
                p.sides.end_pass();
            }
            matrix = Some(m.id);
        }
        let m_id = matrix.expect("at least one pass");
        std::fs::remove_file(&raw2_path).ok();
        node.restart()?;
        let client = rt.block_on(args.via.connect(&node.addr()))?;
        let session = rt.block_on(client.open_session("bench-blocks"))?;
        // With batches of one block the batched pass is the one-by-one pass.
        let batches = if batch > 1 { vec![batch, 1] } else { vec![batch] };

        // ---- warm gets: chunks alternating, as the puts ----
        // Bring both sides fully into the page cache first.
        raw::read(&raw_path, b as usize, 0..k)?;
        let peeks_before = client.peeked_gets();
        let all = Reads { matrix: m_id, b, blocks: 0..k, batch };
        on_worker(&rt, store_read(std::sync::Arc::new(rt.block_on(session.begin())?), all.clone()))?;
        let mut warm = Sides::new();
        for _ in 0..reps {
            // One action per pass, as a slave's task reads under one: its
            // begin and commit (two round trips per pass) are outside the
            // chunks' timers.
            let action = std::sync::Arc::new(rt.block_on(session.begin())?);
            for (c, range) in chunks.iter().enumerate() {
                let mut t = [Duration::ZERO; 3];
                for side in turns(c) {
                    t[side] = match side {
                        RAW => raw::read(&raw_path, b as usize, range.clone())?,
                        s if s <= batches.len() => {
                            let reads = Reads { matrix: m_id, b, blocks: range.clone(), batch: batches[s - 1] };
                            on_worker(&rt, store_read(action.clone(), reads))?
                        }
                        _ => Duration::ZERO,
                    };
                }
                if batch == 1 {
                    t[GET_ONE] = t[GET_BATCHED];
                }
                warm.chunk(t);
            }
            finish(&rt, action)?;
            warm.end_pass();
        }
        // How the one-by-one gets' peeked blocks went (`wire::Peek`).
        let peeks_since = |before: store_client::dataplane::PeekedGets| {
            let now = client.peeked_gets();
            json!({"kept": now.kept - before.kept, "read_again": now.read_again - before.read_again})
        };
        let mut gets = vec![("warm", warm, peeks_since(peeks_before))];

        // ---- cold gets: whole passes after drop_caches (a chunk could not
        // be made cold without dropping the other side's cache too) ----
        if cold {
            let peeks_before = client.peeked_gets();
            let mut g = Sides::new();
            for _ in 0..reps {
                drop_caches()?;
                g.best[RAW] = g.best[RAW].min(raw::read(&raw_path, b as usize, 0..k)?);
                for &per in &batches {
                    drop_caches()?;
                    let action = std::sync::Arc::new(rt.block_on(session.begin())?);
                    let t = on_worker(&rt, store_read(action.clone(), Reads { batch: per, ..all.clone() }))?;
                    finish(&rt, action)?;
                    let side = if per == batch { GET_BATCHED } else { GET_ONE };
                    g.best[side] = g.best[side].min(t);
                }
            }
            if batch == 1 {
                g.best[GET_ONE] = g.best[GET_BATCHED];
            }
            gets.push(("cold", g, peeks_since(peeks_before)));
        }
        drop(session);
        drop(client);
        std::fs::remove_file(&raw_path).ok();

        // The machine may be shared: the 1-minute load average says how
        // much else ran while this size was measured.
        let load = crate::store_node::load_average();
        let rate = |d: Duration| total / MIB / d.as_secs_f64();
        let common = |v: Vec<(&'static str, serde_json::Value)>| {
            let mut e = vec![
                ("b", json!(b)),
                ("blocks", json!(k)),
                ("mib", json!(r1(total / MIB))),
                ("loadavg", json!(load)),
                ("via", json!(args.via.name())),
                ("pinned", json!(args.pin)),
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
            let sides = &p.sides;
            let floor = paired::paired_ratio(&sides.chunks[RAW], &sides.chunks[RAW_TWO_SYNCS]).map(|r| r2(r.median));
            let mut extra = vec![
                ("blocks_were", json!(blocks_were)),
                ("store_mib_s", json!(r1(rate(sides.best[PUT_STORE])))),
                ("raw_mib_s", json!(r1(rate(sides.best[RAW])))),
                ("raw_two_syncs_mib_s", json!(r1(rate(sides.best[RAW_TWO_SYNCS])))),
                ("raw_two_syncs_ratio", json!(floor)),
            ];
            extra.push(("what", json!(what)));
            figure("blocks.put_ratio", sides, PUT_STORE, TARGET_PUT, common(extra));
        }
        for (cache, g, peeks) in &gets {
            let source = if *cache == "warm" {
                "both from the page cache (store: block version files)"
            } else {
                "both after drop_caches (store: block version files from disk)"
            };
            for (name, batch, side) in [("blocks.get_ratio", batch, GET_BATCHED), ("blocks.get_one_ratio", 1, GET_ONE)] {
                let mut extra = vec![
                    ("cache", json!(cache)),
                    ("batch", json!(batch)),
                    ("store_mib_s", json!(r1(rate(g.best[side])))),
                    ("raw_mib_s", json!(r1(rate(g.best[RAW])))),
                ];
                if side == GET_ONE {
                    extra.push(("peeked", peeks.clone()));
                }
                extra.push(("what", json!(source)));
                figure(name, g, side, TARGET_GET, common(extra));
            }
        }
    }
    drop(rt);
    node.stop()
}

/// Chunks per pass, each side's pass cut into this many stretches that the
/// sides take in turns (see `paired`).
const CHUNKS_PER_PASS: usize = 16;

/// The order in which the sides ([`RAW`] and the two others of its pass)
/// run chunk `c`:
/// reversed every other chunk, so that no side always runs right after
/// another side's sync or in its cache's wake.
fn turns(c: usize) -> [usize; 3] {
    if c.is_multiple_of(2) {
        [0, 1, 2]
    } else {
        [2, 1, 0]
    }
}

fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Prints one ratio figure of `store` (a side of `sides`) against the raw
/// side: the median of the paired chunks, with their spread, where the
/// sides took turns by chunk; else the best whole pass of each side. The
/// ratio of best passes is printed beside it either way.
fn figure(name: &str, sides: &Sides, store: usize, target: f64, mut extra: Vec<(&str, serde_json::Value)>) {
    let best_pass = sides.best[RAW].as_secs_f64() / sides.best[store].as_secs_f64();
    let value = match paired::paired_ratio(&sides.chunks[RAW], &sides.chunks[store]) {
        Some(p) => {
            extra.extend([
                ("method", json!("median of paired chunks")),
                ("pairs", json!(p.pairs)),
                ("pair_p25", json!(r2(p.p25))),
                ("pair_p75", json!(r2(p.p75))),
            ]);
            p.median
        }
        None => {
            extra.push(("method", json!("best pass of each side")));
            best_pass
        }
    };
    extra.push(("best_pass_ratio", json!(r2(best_pass))));
    Figure { name, value: r2(value), unit: "ratio", target: Some(target), extra }.print();
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

/// Whether a put pass writes blocks for the first time or over blocks
/// written before (a job's usual case: Cholesky and LU update every block
/// in place many times, a multiply accumulates into C).
#[derive(Clone, Copy)]
enum Written {
    New,
    Over,
}

/// The sides of a pass, as [`turns`] orders them: the raw file; then a put
/// pass's raw file with a second synced record and its store, or a get
/// pass's store batched and store one block a request.
const RAW: usize = 0;
const RAW_TWO_SYNCS: usize = 1;
const PUT_STORE: usize = 2;
const GET_BATCHED: usize = 1;
const GET_ONE: usize = 2;

/// Three sides' times: each chunk's, over every pass, and each side's
/// best whole pass (cold gets fill only the best passes).
struct Sides {
    chunks: [Vec<Duration>; 3],
    best: [Duration; 3],
    pass: [Duration; 3],
}

impl Sides {
    fn new() -> Sides {
        Sides { chunks: Default::default(), best: [Duration::MAX; 3], pass: [Duration::ZERO; 3] }
    }

    /// One chunk's times on the three sides.
    fn chunk(&mut self, t: [Duration; 3]) {
        for (side, t) in t.into_iter().enumerate() {
            self.chunks[side].push(t);
            self.pass[side] += t;
        }
    }

    /// Ends a pass: each side keeps its best.
    fn end_pass(&mut self) {
        for side in 0..3 {
            self.best[side] = self.best[side].min(self.pass[side]);
        }
        self.pass = [Duration::ZERO; 3];
    }
}

/// A put pass's sides, for new blocks or overwrites.
struct Puts {
    written: Written,
    sides: Sides,
}

impl Puts {
    fn new(written: Written) -> Puts {
        Puts { written, sides: Sides::new() }
    }
}

/// Runs `f` as a task of `rt`'s worker and waits for it.
fn on_worker<F>(rt: &tokio::runtime::Runtime, f: F) -> anyhow::Result<Duration>
where
    F: std::future::Future<Output = anyhow::Result<Duration>> + Send + 'static,
{
    rt.block_on(rt.spawn(f))?
}

/// Writes blocks (0, j) for j in `blocks`, each in its own committed
/// action; returns the time of the operations only (the copy of the input
/// block is outside it).
async fn store_write(
    session: Session,
    matrix: uuid::Uuid,
    b: u32,
    data: std::sync::Arc<[f64]>,
    blocks: std::ops::Range<usize>,
) -> anyhow::Result<Duration> {
    let mut t = Duration::ZERO;
    for j in blocks {
        let block = BlockData { rows: b as usize, cols: b as usize, data: data.to_vec() };
        let t0 = Instant::now();
        let action = session.begin().await?;
        action.put_block(matrix, 0, j as u32, block).await?;
        action.commit().await?;
        t += t0.elapsed();
    }
    Ok(t)
}

/// Which blocks a store read pass takes, and how many to a request.
#[derive(Clone)]
struct Reads {
    matrix: uuid::Uuid,
    b: u32,
    blocks: std::ops::Range<usize>,
    /// Blocks per `get_blocks` (1: `get_block` each).
    batch: u32,
}

/// Reads blocks (0, j) under `action`'s read locks; returns the time.
async fn store_read(action: std::sync::Arc<Action>, r: Reads) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let mut sum = 0.0;
    let ids: Vec<(u32, u32)> = r.blocks.map(|j| (0, j as u32)).collect();
    for chunk in ids.chunks(r.batch as usize) {
        let blocks =
            if r.batch == 1 { vec![action.get_block(r.matrix, 0, chunk[0].1).await?] } else { action.get_blocks(r.matrix, chunk).await? };
        for (block, (_, j)) in blocks.iter().zip(chunk) {
            if block.rows != r.b as usize || block.cols != r.b as usize {
                bail!("block (0, {j}) came back {}x{}", block.rows, block.cols);
            }
            sum += block.data[block.data.len() / 2];
        }
    }
    let t = t0.elapsed();
    std::hint::black_box(sum);
    Ok(t)
}

/// Commits a read pass's action once its reads are done.
fn finish(rt: &tokio::runtime::Runtime, action: std::sync::Arc<Action>) -> anyhow::Result<()> {
    let action = std::sync::Arc::into_inner(action).context("a read pass still holds its action")?;
    Ok(rt.block_on(action.commit())?)
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
