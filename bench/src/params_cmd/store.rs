//! The store's figures through a real node: `Dget` cold and cached,
//! `Dput`, local gets, the loopback network, gets behind puts.

use super::*;

/// Everything measured through the store node and the loopback.
pub(super) struct StoreSweep {
    pub(super) network: Vec<Point>,
    pub(super) hot_get: Vec<Point>,
    /// Cached reads while a put and commit run ([`gets_behind_puts`]).
    pub(super) get_behind: Vec<Point>,
    pub(super) cold_get: Vec<Point>,
    pub(super) put: Vec<Point>,
    /// Puts over a block's older version.
    pub(super) put_over: Vec<Point>,
    pub(super) commit_small: f64,
    pub(super) per_task: TaskCosts,
    /// Task starts behind an ending, beyond quiet ones ([`task_starts_behind_endings`]).
    pub(super) start_behind: Vec<Point>,
    /// The endings themselves, whole ([`task_starts_behind_endings`]).
    pub(super) endings: Vec<Point>,
}

/// Evicts every file under `dir` from the page cache (after syncing it):
/// the next read comes from the disk, as a store node's first read after a
/// reboot, without needing root to drop all caches.
pub(super) fn evict(dir: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            evict(&path)?;
            continue;
        }
        let Ok(f) = std::fs::File::open(&path) else { continue };
        let _ = f.sync_all();
        // SAFETY: a valid open descriptor; fadvise only drops clean pages.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    Ok(())
}

/// A round trip over loopback TCP: 8-byte request, `bytes` back.
pub(super) async fn loopback(sizes: &[usize], reps: usize) -> anyhow::Result<Vec<Point>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let max = *sizes.iter().max().unwrap_or(&1);
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let buf = vec![7u8; max];
        let mut req = [0u8; 8];
        while s.read_exact(&mut req).await.is_ok() {
            let n = u64::from_le_bytes(req) as usize;
            s.write_all(&buf[..n.min(max)]).await?;
        }
        anyhow::Ok(())
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let mut buf = vec![0u8; max];
    let mut out = Vec::new();
    for &n in sizes {
        let mut times = Vec::new();
        for _ in 0..reps + 1 {
            let t = Instant::now();
            c.write_all(&(n as u64).to_le_bytes()).await?;
            c.read_exact(&mut buf[..n]).await?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.remove(0);
        out.push(Point { units: n as f64, secs: median(&mut times) });
    }
    drop(c);
    let _ = server.await;
    Ok(out)
}

/// The idle time before each timed put of the store sweep.
pub(super) const PUT_PAUSE: Duration = Duration::from_millis(5);

/// The store sweep through `node`, a cluster of a store node and no
/// slaves: warm, then (the node killed, its files evicted, the node
/// restarted) cold.
pub(super) fn sweep_store(node: &mut Cluster, blocks: &[usize], quick: bool) -> anyhow::Result<StoreSweep> {
    let bytes: Vec<usize> = blocks.iter().map(|b| 8 * b * b).collect();
    let network = node.with_client(|_| loopback(&bytes, if quick { 5 } else { 15 }))?;
    let warm = node.with_client(|client| sweep_warm(client, blocks, quick))?;
    // Cold: a fresh node (empty block cache) over files out of the page
    // cache. Killed, not stopped: the blocks are in their synced version
    // files, and its recovery replays the commits' log.
    node.kill_store()?;
    evict(node.dir())?;
    node.restart_store()?;
    let cold_get = node.with_client(|client| async move { read_all(&client, &warm.matrices, 1).await })?;
    Ok(StoreSweep { network, cold_get, ..warm.sweep })
}

/// The store node's CPU seconds per block get (`Params::store_cpu_per_get`):
/// the node process's CPU over thousands of gets of cached blocks, 256 to
/// an action (each block once, so each get takes its lock), divided by
/// the gets (the actions' begins and commits, about 4 % of it, left in).
/// Small blocks: a local get's node work does not grow with the block
/// (the slave reads the file), and they keep the run short.
pub(super) fn store_cpu_per_get(node: &Cluster, quick: bool) -> anyhow::Result<f64> {
    const B: usize = 32;
    const G: u32 = 16;
    // The CPU is read in clock ticks (10 ms): 4096 gets make about 0.1-0.2 s
    // of it, 2048 (quick) half.
    let rounds = if quick { 8 } else { 16 };
    let name = format!("bench-params-cpu-per-get-{}", std::process::id());
    let m = node.with_client(|c| async move { filled_matrix(&c, &name, B, G).await })?;
    let gets = |rounds: u32| {
        node.with_client(|c| async move {
            let session = c.open_session("bench-params-cpu-per-get").await?;
            for _ in 0..rounds {
                let a = session.begin().await?;
                for i in 0..G {
                    for j in 0..G {
                        a.get_block(m, i, j).await?;
                    }
                }
                a.commit().await?;
            }
            anyhow::Ok(())
        })
    };
    // Warm: the files opened and cached.
    gets(1)?;
    let before = node.snapshot().store.cpu_s;
    gets(rounds)?;
    let cpu = node.snapshot().store.cpu_s - before;
    node.with_client(|c| async move { Ok(c.delete_matrix(m).await?) })?;
    Ok(cpu / f64::from(rounds * G * G))
}

/// The store sweep's part on a warm node; `matrices` for the cold reads.
pub(super) struct Warm {
    pub(super) sweep: StoreSweep,
    pub(super) matrices: Vec<(usize, uuid::Uuid, u32)>,
}

pub(super) async fn sweep_warm(client: Client, blocks: &[usize], quick: bool) -> anyhow::Result<Warm> {
    let bytes: Vec<usize> = blocks.iter().map(|b| 8 * b * b).collect();
    let session = client.open_session("bench-params").await?;
    let mut matrices = Vec::new();
    let mut put = Vec::new();
    let mut put_over = Vec::new();
    let mut commit_small = Vec::new();
    for &b in blocks {
        // Enough blocks for a steady median, at most ~64 MB per size.
        let budget = if quick { 16e6 } else { 64e6 };
        // At least 9, so one slow put (a node's first of a size) is not
        // the median of 4.
        let g = (((budget / (8.0 * (b * b) as f64)).sqrt().floor() as u32).clamp(3, 12)) as u64;
        let m = client.create_matrix(&format!("bench-params-{b}"), g * b as u64, g * b as u64, b as u32).await?;
        let mut times = Vec::new();
        for i in 0..g as u32 {
            for j in 0..g as u32 {
                // A job's slaves put one block per task, with the disk idle
                // while they compute; back to back, a VM's disk runs at its
                // sustained rate (n = 4096, b = 1024: 8–17 ms per put and
                // commit back to back, 3–9 ms in a dag Cholesky's tasks).
                tokio::time::sleep(PUT_PAUSE).await;
                times.push(timed_put(&session, m.id, i, j, random_block(b, (i * 100 + j) as u64)).await?);
                let t = Instant::now();
                let a = session.begin().await?;
                a.write_small(&format!("bench-params/commit/{b}/{i}/{j}"), &[0u8; 8]).await?;
                a.commit().await?;
                commit_small.push(t.elapsed().as_secs_f64());
            }
        }
        put.push((b, median(&mut times)));
        // The same blocks again: each put now writes over the version it
        // replaces, as LU's in-place updates do (the node recycles the
        // replaced version's file).
        let mut times = Vec::new();
        for i in 0..g as u32 {
            for j in 0..g as u32 {
                tokio::time::sleep(PUT_PAUSE).await;
                times.push(timed_put(&session, m.id, i, j, random_block(b, (i * 100 + j + 7) as u64)).await?);
            }
        }
        put_over.push((b, median(&mut times)));
        matrices.push((b, m.id, g as u32));
    }
    let commit_small = median(&mut commit_small);
    let minus_commit = |v: &[(usize, f64)]| -> Vec<Point> {
        bytes.iter().zip(v).map(|(&n, &(_, t))| Point { units: n as f64, secs: (t - commit_small).max(1e-7) }).collect()
    };
    let (put, put_over) = (minus_commit(&put), minus_commit(&put_over));

    // Per-task costs: what a slave's loop pays around an empty task.
    let per_task = task_costs(&session, quick).await?;

    // Cached reads: a first pass warms the caches, the second is timed.
    let _ = read_all(&client, &matrices, 1).await?;
    let hot_get = read_all(&client, &matrices, 1).await?;
    let get_behind = gets_behind_puts(&client, &matrices).await?;
    let (start_behind, endings) = task_starts_behind_endings(&client, &matrices).await?;
    let sweep = StoreSweep {
        network: Vec::new(),
        hot_get,
        get_behind,
        cold_get: Vec::new(),
        put,
        put_over,
        commit_small,
        per_task,
        start_behind,
        endings,
    };
    Ok(Warm { sweep, matrices })
}

/// Every block of each matrix read `passes` times, one get per action;
/// per block size, the median seconds of a get.
pub(crate) async fn read_all(client: &Client, matrices: &[(usize, uuid::Uuid, u32)], passes: usize) -> anyhow::Result<Vec<Point>> {
    let session = client.open_session("bench-params-read").await?;
    let mut out = Vec::new();
    for &(b, id, g) in matrices {
        let mut times = Vec::new();
        for _ in 0..passes {
            for i in 0..g {
                for j in 0..g {
                    let a = session.begin().await?;
                    // Timed inside a task of the runtime, as a slave's
                    // prefetch runs: from the caller's thread (`block_on`)
                    // each reply would also pay that thread's wake-up.
                    let (a, blk, secs) = tokio::spawn(async move {
                        let t = Instant::now();
                        let blk = a.get_block(id, i, j).await;
                        let secs = t.elapsed().as_secs_f64();
                        (a, blk, secs)
                    })
                    .await?;
                    let blk = blk?;
                    times.push(secs);
                    anyhow::ensure!(blk.data.len() == b * b, "block of {} values, want {}", blk.data.len(), b * b);
                    a.commit().await?;
                }
            }
        }
        out.push(Point { units: (8 * b * b) as f64, secs: median(&mut times) });
    }
    Ok(out)
}

/// A cached read and a read behind a task's ending (`Params::local_get`
/// and `local_get_behind`) at blocks of side `b`, measured again through
/// a running node for `bench validate` before each block size, as
/// [`endings_now`]. They drift more than a point's error allows: the fit
/// of `local_get` read 6.6, 8.2, 8.6 and 10.2 GB/s in four `bench
/// params` runs of one day (at b = 256 the 6.6 one predicts the one-slave
/// dag Cholesky at n = 4096 6.4 % slower than the 10.2 one), and a b × b
/// point reads only b × b blocks. Returns `(local get, behind an ending)`.
pub(crate) async fn gets_now(client: &Client, b: usize) -> anyhow::Result<(Point, Point)> {
    // 16 blocks, as for the endings; each read in three passes (a first
    // one untimed, to warm the caches), and once behind an ending.
    let g = 4u32;
    let m = filled_matrix(client, &format!("bench-gets-now-{}-{b}", std::process::id()), b, g).await?;
    let matrices = [(b, m, g)];
    let measured = async {
        read_all(client, &matrices, 1).await?;
        let cached = read_all(client, &matrices, 2).await?;
        let behind = gets_behind_puts(client, &matrices).await?;
        anyhow::Ok((cached[0], behind[0]))
    }
    .await;
    client.delete_matrix(m).await?;
    measured
}

/// A new matrix `name` of `g × g` blocks of side `b`, each put (with its
/// own commit) from random values; its id.
pub(crate) async fn filled_matrix(client: &Client, name: &str, b: usize, g: u32) -> anyhow::Result<uuid::Uuid> {
    let side = u64::from(g) * b as u64;
    let m = client.create_matrix(name, side, side, b as u32).await?;
    let session = client.open_session("bench-fill").await?;
    for i in 0..g {
        for j in 0..g {
            timed_put(&session, m.id, i, j, random_block(b, u64::from(i * 100 + j))).await?;
        }
    }
    Ok(m.id)
}

/// Cached reads as a slave's task thread makes its first ones under
/// write-behind (`Params::local_get_behind`): from a blocking thread
/// through `Handle::block_on`, each while a put and commit of another
/// block of the same size (the previous task's ending) run on the
/// runtime, started just before. Per block size, the median seconds.
pub(super) async fn gets_behind_puts(client: &Client, matrices: &[(usize, uuid::Uuid, u32)]) -> anyhow::Result<Vec<Point>> {
    let session = std::sync::Arc::new(client.open_session("bench-params-read-behind").await?);
    let rt = tokio::runtime::Handle::current();
    let mut out = Vec::new();
    for &(b, id, g) in matrices {
        let (session, rt) = (session.clone(), rt.clone());
        let mut times = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<f64>> {
            let mut times = Vec::new();
            for i in 0..g {
                for j in 0..g {
                    // The ending writes a block this read does not lock.
                    let (wi, wj) = ((i + 1) % g, j);
                    let block = random_block(b, (i * 100 + j + 13) as u64);
                    let ending = rt.spawn(task_ending(session.clone(), id, (wi, wj), block, None));
                    let a = rt.block_on(session.begin())?;
                    let t = Instant::now();
                    let blk = rt.block_on(a.get_block(id, i, j))?;
                    times.push(t.elapsed().as_secs_f64());
                    anyhow::ensure!(blk.data.len() == b * b, "block of {} values, want {}", blk.data.len(), b * b);
                    rt.block_on(a.commit())?;
                    rt.block_on(ending)??;
                }
            }
            Ok(times)
        })
        .await??;
        out.push(Point { units: (8 * b * b) as f64, secs: median(&mut times) });
    }
    Ok(out)
}
