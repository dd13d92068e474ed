//! The data-parallel out-of-core multiply `C = A·B` of one BSP group: the
//! source's algorithm (`003…` §5.6, Fig. 5.19), block rows of C over the
//! ranks, B's block rows broadcast a step at a time.
//!
//! Rank `r` of `P` owns C's block rows `i ≡ r (mod P)` (cyclic, so the
//! short edge row costs no rank more than a block row) and, for the
//! broadcast, B's block columns `j ≡ r (mod P)`. Superstep `k` (one per
//! block column of A): each owner reads its blocks of B's row `k` from the
//! store, once, and sends them to every other rank; after the `sync` every
//! rank holds the row, reads its own `A(i, k)` from the store and adds
//! `A(i, k)·B(k, j)` into its C blocks. A block of B crosses the store's
//! link once per superstep instead of once per reader, and A once in all.
//! Chosen over SUMMA's 2-D grid because the ranks are the few slaves of a
//! workstation cluster (P ≤ 8 here): a 1-D layout's broadcast is `(P−1)/P`
//! of a row per rank against SUMMA's two half-size ones, a difference that
//! only pays at large P, and a rank's C rows stay whole blocks the
//! checkpoint writes as they are.
//!
//! Each C block adds its terms in the order `k = 0, 1, …` with dgemm
//! (`beta = 1`) starting from zeros, exactly as the bag of tasks' matmul
//! task does, so both engines give the same bits; a checkpoint stores the
//! partial sums bit for bit, so a resumed run does too.
//!
//! What a rank holds: its C rows (`1/P` of C) and one row of B; A and B
//! stay out of core.

use std::time::{Duration, Instant};

use apps::block::{Block, MatrixMeta};
use apps::kernels;
use bsp::Bsp;

use super::GangError;

/// What a rank does to the store, behind a trait so the algorithm runs
/// over an in-memory store in tests and over the node in slaves.
pub trait RankStore {
    /// A block of A or B (inputs: committed versions, no lock).
    fn read_input(&mut self, m: &MatrixMeta, i: u32, j: u32) -> Result<Block, GangError>;
    /// A committed block of C (a checkpoint's partial sums).
    fn read_output(&mut self, c: &MatrixMeta, i: u32, j: u32) -> Result<Block, GangError>;
    /// Commits this rank's C blocks and that `step` supersteps are in them.
    fn checkpoint(&mut self, step: u32, blocks: &[((u32, u32), &Block)]) -> Result<(), GangError>;
    /// Rank 0 tells where the group is (best effort).
    fn progress(&mut self, _live: &Progress) {}
    /// Every rank, right after superstep `k`'s communication (kill tests).
    fn reached(&mut self, _k: u32) {}
}

/// How the checkpoint interval is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Interval {
    /// Every this many supersteps.
    Every(u32),
    /// From the model after the group's first superstep, for failures
    /// this far apart on average.
    Model { mtbf_s: f64 },
}

/// Where a group is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    pub superstep: u32,
    pub supersteps: u32,
    pub interval: u32,
    pub step_s: f64,
}

/// What one rank did in one group.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankReport {
    /// The superstep the group started at (the least committed).
    pub start: u32,
    pub supersteps: u32,
    pub interval: u32,
    /// Supersteps whose output this rank committed.
    pub checkpoints: Vec<u32>,
    pub flops: f64,
    /// Bytes of B this rank read from the store, and of A, B and C in all.
    pub b_read: u64,
    pub read: u64,
    /// Bytes this rank sent to other ranks.
    pub sent: u64,
    /// Wall time of the supersteps run, seconds.
    pub steps_s: f64,
}

/// C's block rows that rank `r` of `p` owns.
pub fn rows_of(c: &MatrixMeta, p: u32, r: u32) -> Vec<u32> {
    (0..c.block_rows()).filter(|i| i % p == r).collect()
}

/// The rank that reads and broadcasts B's block column `j`.
pub fn b_owner(j: u32, p: u32) -> u32 {
    j % p
}

/// Runs rank `bsp.pid()`'s part of `C = A·B`, resuming after `committed`
/// supersteps (its own checkpoint; 0: none), and commits through `store`
/// at the chosen interval and after the last superstep. Returns after a
/// final barrier that every rank reaches only with its last checkpoint
/// committed.
pub fn run(
    bsp: &mut Bsp,
    store: &mut dyn RankStore,
    (a, b, c): (&MatrixMeta, &MatrixMeta, &MatrixMeta),
    committed: u32,
    interval: Interval,
) -> Result<RankReport, GangError> {
    let (p, r) = (bsp.nprocs() as u32, bsp.pid() as u32);
    let steps = a.block_cols();
    let n = c.block_cols();
    let committed = committed.min(steps);
    // The group starts where its least advanced rank committed; ranks
    // further on only broadcast until the group catches up.
    let old = bsp.set_tagsize(8);
    let start = bsp::collectives::allreduce(bsp, &[f64::from(committed)], f64::min)?[0] as u32;
    let rows = rows_of(c, p, r);
    let mut cs: Vec<Vec<Block>> = Vec::with_capacity(rows.len());
    let mut report_read = 0u64;
    for &i in &rows {
        let mut row = Vec::with_capacity(n as usize);
        for j in 0..n {
            let (h, w) = c.block_shape(i, j);
            let blk = if committed > 0 { store.read_output(c, i, j)? } else { Block::zeros(h, w) };
            if committed > 0 {
                report_read += (blk.data.len() * 8) as u64;
            }
            row.push(blk);
        }
        cs.push(row);
    }
    let mut report = RankReport { start, supersteps: steps, read: report_read, ..RankReport::default() };
    let mut every = match interval {
        Interval::Every(e) => e.max(1),
        Interval::Model { .. } => 0,
    };
    let began = Instant::now();
    for k in start..steps {
        let step_began = Instant::now();
        let mut read_time = Duration::ZERO;
        let mut read_bytes = 0u64;
        let mut row: Vec<Option<Block>> = vec![None; n as usize];
        for j in (0..n).filter(|j| b_owner(*j, p) == r) {
            let t = Instant::now();
            let blk = store.read_input(b, k, j)?;
            read_time += t.elapsed();
            let bytes = blk.as_le_bytes();
            read_bytes += bytes.len() as u64;
            report.b_read += bytes.len() as u64;
            report.read += bytes.len() as u64;
            for q in (0..p).filter(|q| *q != r) {
                bsp.send(q as usize, &u64::from(j).to_le_bytes(), &bytes)?;
                report.sent += bytes.len() as u64;
            }
            drop(bytes);
            row[j as usize] = Some(blk);
        }
        bsp.sync()?;
        store.reached(k);
        while let Some(m) = bsp.take_message() {
            let j = u64::from_le_bytes(m.tag[..8].try_into().expect("tag size 8")) as u32;
            let (h, w) = b.block_shape(k, j);
            let blk = Block::from_bytes(h, w, &m.payload).map_err(|e| GangError::Protocol(format!("B({k},{j}) from a peer: {e}")))?;
            *row.get_mut(j as usize).ok_or_else(|| GangError::Protocol(format!("B column {j} outside the row")))? = Some(blk);
        }
        let row: Vec<Block> = row
            .into_iter()
            .enumerate()
            .map(|(j, b)| b.ok_or_else(|| GangError::Protocol(format!("B({k},{j}) never arrived"))))
            .collect::<Result<_, _>>()?;
        if k >= committed {
            for (x, &i) in rows.iter().enumerate() {
                let t = Instant::now();
                let aik = store.read_input(a, i, k)?;
                read_time += t.elapsed();
                read_bytes += (aik.data.len() * 8) as u64;
                report.read += (aik.data.len() * 8) as u64;
                for (j, bkj) in row.iter().enumerate() {
                    kernels::gemm(1.0, &aik, false, bkj, false, 1.0, &mut cs[x][j]);
                    report.flops += 2.0 * (aik.rows * bkj.cols * aik.cols) as f64;
                }
            }
        }
        let done = k + 1;
        if every == 0 {
            // The model's interval, agreed by every rank from the same
            // figures: the slowest rank's superstep, and its checkpoint's
            // write estimated at its read rate.
            let mine = cs.iter().flatten().map(|b| b.data.len() * 8).sum::<usize>() as f64;
            let rate = if read_time > Duration::ZERO { read_bytes as f64 / read_time.as_secs_f64() } else { f64::INFINITY };
            let est = [step_began.elapsed().as_secs_f64(), mine / rate];
            let worst = bsp::collectives::allreduce(bsp, &est, f64::max)?;
            let Interval::Model { mtbf_s } = interval else { unreachable!("every is 0 only for Model") };
            every = model::checkpoint::interval_steps(worst[0], worst[1], mtbf_s, steps);
            tracing::info!(step_s = worst[0], write_s = worst[1], every, "checkpoint interval chosen");
        }
        if done > committed && (done % every == 0 || done == steps) {
            let blocks: Vec<((u32, u32), &Block)> =
                rows.iter().zip(&cs).flat_map(|(&i, row)| row.iter().enumerate().map(move |(j, blk)| ((i, j as u32), blk))).collect();
            store.checkpoint(done, &blocks)?;
            report.checkpoints.push(done);
        }
        if r == 0 {
            let ran = (done - start) as f64;
            store.progress(&Progress { superstep: done, supersteps: steps, interval: every, step_s: began.elapsed().as_secs_f64() / ran });
        }
    }
    report.steps_s = began.elapsed().as_secs_f64();
    report.interval = every;
    // Nobody leaves before every rank's last checkpoint is in: a rank that
    // dies before this barrier takes the whole group back to the bag.
    bsp.sync()?;
    bsp.set_tagsize(old);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apps::block::BlockId;
    use apps::generate::MatrixKind;
    use apps::job::{plan, JobSpec};
    use apps::mem::{run_plan, MemStore};
    use apps::verify::BlockSource;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// C's committed blocks and each rank's committed superstep, shared by
    /// the ranks (threads) as the store node is by slaves.
    #[derive(Default)]
    struct Shared {
        c: HashMap<(u32, u32), Block>,
        steps: HashMap<u32, u32>,
        commits: HashMap<(u32, u32), u32>,
    }

    struct MemRank {
        inputs: Arc<Mutex<MemStore>>,
        shared: Arc<Mutex<Shared>>,
        rank: u32,
        /// Fail this rank's checkpoint of this superstep (its "death").
        fail_at: Option<u32>,
    }

    impl RankStore for MemRank {
        fn read_input(&mut self, m: &MatrixMeta, i: u32, j: u32) -> Result<Block, GangError> {
            self.inputs.lock().unwrap().read_block(BlockId { matrix: m.id, i, j }).map_err(|e| GangError::Job(e.to_string()))
        }
        fn read_output(&mut self, _c: &MatrixMeta, i: u32, j: u32) -> Result<Block, GangError> {
            self.shared.lock().unwrap().c.get(&(i, j)).cloned().ok_or_else(|| GangError::Job(format!("no C({i},{j})")))
        }
        fn checkpoint(&mut self, step: u32, blocks: &[((u32, u32), &Block)]) -> Result<(), GangError> {
            if self.fail_at == Some(step) {
                return Err(GangError::Fenced { rank: self.rank, why: "test".into() });
            }
            let mut s = self.shared.lock().unwrap();
            for ((i, j), b) in blocks {
                s.c.insert((*i, *j), (*b).clone());
            }
            s.steps.insert(self.rank, step);
            *s.commits.entry((self.rank, step)).or_default() += 1;
            Ok(())
        }
    }

    fn matrices(m: u64, k: u64, n: u64, b: u32) -> (MemStore, MatrixMeta, MatrixMeta, MatrixMeta) {
        let (a, bm, c) = (MatrixMeta::new("A", m, k, b), MatrixMeta::new("B", k, n, b), MatrixMeta::new("C", m, n, b));
        let mut store = MemStore::new();
        store.generate(&a, MatrixKind::Random, 11);
        store.generate(&bm, MatrixKind::Random, 12);
        (store, a, bm, c)
    }

    /// The bag of tasks' result, in memory.
    fn by_bag(store: &MemStore, a: &MatrixMeta, b: &MatrixMeta, c: &MatrixMeta) -> Vec<f64> {
        let mut s = store.clone();
        let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a: a.clone(), b: b.clone(), c: c.clone() };
        run_plan(&mut s, &spec, &plan(&spec).unwrap()).unwrap();
        s.to_dense(c).unwrap()
    }

    fn gang_run(
        p: usize,
        inputs: &Arc<Mutex<MemStore>>,
        shared: &Arc<Mutex<Shared>>,
        (a, b, c): (&MatrixMeta, &MatrixMeta, &MatrixMeta),
        every: u32,
        fail: Option<(u32, u32)>,
    ) -> Vec<Result<RankReport, GangError>> {
        let (inputs, shared, a, b, c) = (inputs.clone(), shared.clone(), a.clone(), b.clone(), c.clone());
        bsp::run_threads(p, bsp::Config::new("test"), move |bsp| {
            let rank = bsp.pid() as u32;
            let committed = shared.lock().unwrap().steps.get(&rank).copied().unwrap_or(0);
            let mut store =
                MemRank { inputs: inputs.clone(), shared: shared.clone(), rank, fail_at: fail.and_then(|(r, s)| (r == rank).then_some(s)) };
            let r = run(bsp, &mut store, (&a, &b, &c), committed, Interval::Every(every));
            if let Err(e) = &r {
                // As a slave does: the others learn at once.
                if !matches!(e, GangError::Bsp(_)) {
                    let _ = bsp.abort(&e.to_string());
                }
            }
            // The threads' closure answers a BspError: ours rides inside.
            Ok(r)
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| Err(GangError::Bsp(e))))
        .collect()
    }

    fn dense(shared: &Arc<Mutex<Shared>>, c: &MatrixMeta) -> Vec<f64> {
        let n = c.n_rows as usize;
        let mut out = vec![0.0; n * c.n_cols as usize];
        let sh = shared.lock().unwrap();
        for id in c.blocks() {
            let blk = &sh.c[&(id.i, id.j)];
            for col in 0..blk.cols {
                for r in 0..blk.rows {
                    out[(c.row_offset(id.i) as usize + r) + (c.col_offset(id.j) as usize + col) * n] = blk.get(r, col);
                }
            }
        }
        out
    }

    #[test]
    fn same_bits_as_the_bag_of_tasks_on_shapes_that_straddle_blocks() {
        for (m, k, n, b, p) in [(70, 50, 45, 16, 3), (33, 97, 20, 32, 2), (10, 10, 10, 16, 4), (129, 65, 31, 32, 3)] {
            let (store, a, bm, c) = matrices(m, k, n, b);
            let want = by_bag(&store, &a, &bm, &c);
            let (inputs, shared) = (Arc::new(Mutex::new(store)), Arc::new(Mutex::new(Shared::default())));
            for r in gang_run(p, &inputs, &shared, (&a, &bm, &c), 2, None) {
                r.unwrap();
            }
            let got = dense(&shared, &c);
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "{m}x{k}x{n} b={b} P={p}: bits differ");
        }
    }

    #[test]
    fn a_group_that_fails_resumes_each_rank_from_its_own_checkpoint() {
        let (store, a, bm, c) = matrices(90, 120, 60, 16);
        let want = by_bag(&store, &a, &bm, &c);
        let (inputs, shared) = (Arc::new(Mutex::new(store)), Arc::new(Mutex::new(Shared::default())));
        // Rank 1 fails to commit superstep 4 (of 8): the others may have
        // committed it; the group fails everywhere.
        let first = gang_run(3, &inputs, &shared, (&a, &bm, &c), 2, Some((1, 4)));
        assert!(first.iter().all(|r| r.is_err()), "every rank sees the group fail");
        assert_eq!(shared.lock().unwrap().steps.get(&1), Some(&2));
        let again = gang_run(3, &inputs, &shared, (&a, &bm, &c), 3, None);
        for r in &again {
            let r = r.as_ref().unwrap();
            assert_eq!(r.start, 2, "the group starts at the least committed superstep");
        }
        let got = dense(&shared, &c);
        assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "bits differ after the resume");
        let sh = shared.lock().unwrap();
        assert!(sh.commits.values().all(|n| *n == 1), "a superstep committed twice: {:?}", sh.commits);
        assert!(sh.steps.values().all(|s| *s == 8));
    }
}
