//! Tournament pivoting against plain-Rust residuals (no code under test),
//! LAPACK's partial pivoting beside it for the growth factor.

use super::*;
use crate::block::Block;
use crate::generate::MatrixKind;
use crate::job::{plan, JobSpec, LuSchedule, PivotRule};
use crate::kernels;
use crate::lu::permutation;
use crate::mem::{run_plan, MemStore, RunError};

/// ‖PA − LU‖_F / (‖A‖_F · n · ε) stays below this on every matrix here
/// (measured at most about 0.05; partial pivoting's is of the same order).
const RESIDUAL_BOUND: f64 = 1.0;

fn spec(a: &MatrixMeta, lu: &MatrixMeta) -> JobSpec {
    JobSpec::Lu {
        job: uuid::Uuid::new_v4(),
        a: a.clone(),
        lu: lu.clone(),
        pivot: true,
        schedule: LuSchedule::Dag,
        pivot_rule: PivotRule::Tournament,
    }
}

/// A small seeded generator (splitmix64), uniform in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Hard {
    Random,
    /// Kahan's matrix (`s^i` on the diagonal, `−c·s^i` right of it) plus
    /// noise of 10⁻³, rows shuffled so that pivoting has to find them again.
    Kahan,
    /// Random, with the last two rows of every block row 1000 times larger:
    /// each leaf's and node's best rows come last.
    LargestLast,
    /// Random plus `n` on the diagonal: no interchange at all.
    DiagDominant,
}

/// Column-major `n × n`.
fn matrix(kind: Hard, n: usize, b: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed);
    let mut d: Vec<f64> = (0..n * n).map(|_| rng.next()).collect();
    match kind {
        Hard::Random => {}
        Hard::DiagDominant => (0..n).for_each(|i| d[i + i * n] += n as f64),
        Hard::LargestLast => {
            for r in (0..n).filter(|r| r % b >= b - 2 || *r + 2 >= n) {
                (0..n).for_each(|c| d[r + c * n] *= 1000.0);
            }
        }
        Hard::Kahan => {
            let (s, c) = (1.2f64.sin(), 1.2f64.cos());
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                let j = ((rng.next() + 1.0) / 2.0 * (i + 1) as f64) as usize;
                order.swap(i, j.min(i));
            }
            for (r, &i) in order.iter().enumerate() {
                for col in 0..n {
                    d[r + col * n] = match col.cmp(&i) {
                        std::cmp::Ordering::Less => 0.0,
                        std::cmp::Ordering::Equal => s.powi(i as i32),
                        std::cmp::Ordering::Greater => -c * s.powi(i as i32),
                    } + 1e-3 * rng.next();
                }
            }
        }
    }
    d
}

/// ‖PA − LU‖_F / (‖A‖_F · n · ε), by a plain triple loop.
fn residual(a: &[f64], lu: &[f64], perm: &[u64], n: usize) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for c in 0..n {
        for r in 0..n {
            let mut s = 0.0;
            for k in 0..=r.min(c) {
                let l = if k == r { 1.0 } else { lu[r + k * n] };
                s += l * lu[k + c * n];
            }
            let want = a[perm[r] as usize + c * n];
            num += (want - s).powi(2);
            den += want * want;
        }
    }
    num.sqrt() / (den.sqrt() * n as f64 * f64::EPSILON)
}

/// max|U| / max|A|.
fn growth(a: &[f64], lu: &[f64], n: usize) -> f64 {
    let max_a = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let max_u = (0..n).flat_map(|c| (0..=c).map(move |r| (r, c))).fold(0.0f64, |m, (r, c)| m.max(lu[r + c * n].abs()));
    max_u / max_a
}

fn factor(kind: Hard, n: u64, b: u32, seed: u64) -> (MemStore, JobSpec, Vec<f64>, crate::mem::RunReport) {
    let a = MatrixMeta::new("A", n, n, b);
    let lu = MatrixMeta::new("LU", n, n, b);
    let dense = matrix(kind, n as usize, b as usize, seed);
    let mut store = MemStore::new();
    assert!(store.insert_dense(&a, &dense));
    let s = spec(&a, &lu);
    let report = run_plan(&mut store, &s, &plan(&s).unwrap()).unwrap_or_else(|e| panic!("{kind:?} n={n} b={b}: {e}"));
    (store, s, dense, report)
}

#[test]
fn residual_and_growth_across_shapes_and_hard_matrices() {
    // p = 1, 2 and 7 block rows, n a multiple of b or not.
    let shapes = [(50u64, 64u32), (64, 64), (100, 64), (219, 32), (224, 32)];
    let kinds = [Hard::Random, Hard::Kahan, Hard::LargestLast, Hard::DiagDominant];
    for (n, b) in shapes {
        for (s, kind) in kinds.into_iter().enumerate() {
            let seed = n * 10 + s as u64;
            let (store, spec, a, report) = factor(kind, n, b, seed);
            let JobSpec::Lu { lu, .. } = &spec else { unreachable!() };
            let perm = permutation(&mut store.clone(), spec.job(), lu).unwrap();
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{kind:?} n={n}: not a permutation");
            let got = store.to_dense(lu).unwrap();
            let nn = n as usize;
            let res = residual(&a, &got, &perm, nn);
            let mut lapack = Block { rows: nn, cols: nn, data: a.clone() };
            let (ipiv, ok) = kernels::getrf(&mut lapack);
            ok.unwrap();
            let mut lperm: Vec<u64> = (0..n).collect();
            for (r, &g) in ipiv.iter().enumerate() {
                lperm.swap(r, g);
            }
            let lres = residual(&a, &lapack.data, &lperm, nn);
            let (g, lg) = (growth(&a, &got, nn), growth(&a, &lapack.data, nn));
            eprintln!("tournament {kind:?} n={n} b={b}: residual {res:.3} (partial {lres:.3}) ·nε, growth {g:.2} (partial {lg:.2})");
            assert!(res <= RESIDUAL_BOUND, "{kind:?} n={n} b={b} seed={seed}: residual {res} nε");
            // CALU's growth is bounded by 2^(b(H+1)−1) in theory and close to
            // partial pivoting's in practice.
            assert!(g <= 10.0 * lg.max(1.0), "{kind:?} n={n} b={b} seed={seed}: growth {g} against partial {lg}");
            if kind == Hard::DiagDominant {
                assert_eq!(perm, (0..n).collect::<Vec<_>>(), "n={n}: a diagonally dominant matrix needs no interchange");
            }
            let t = report.totals();
            assert_eq!(t.prefetch_misses, 0, "{kind:?} n={n}: reads out of the announced order");
            assert_eq!(t.small_reads_behind_puts, 0, "{kind:?} n={n}: a release waited behind a put");
            assert_eq!(report.tasks.len(), n_tasks(lu.block_rows()), "{kind:?} n={n}");
        }
    }
}

#[test]
fn random_input_is_interchanged_and_the_tree_meets_every_block() {
    let (store, spec, _, report) = factor(Hard::Random, 219, 32, 3);
    let JobSpec::Lu { lu, .. } = &spec else { unreachable!() };
    let perm = permutation(&mut store.clone(), spec.job(), lu).unwrap();
    assert_ne!(perm, (0..219).collect::<Vec<_>>());
    // A panel of m > 1 blocks: m − 1 nodes (the root among them); the last, one.
    let picks = report.tasks.iter().filter(|t| matches!(crate::job::decode_task(&t.task), Ok(LuTask::Pick { .. }))).count();
    assert_eq!(picks, (2..=7).map(|m| m - 1).sum::<usize>() + 1);
}

#[test]
fn singular_names_the_block_and_row() {
    let a = MatrixMeta::new("A", 200, 200, 64);
    let lu = MatrixMeta::new("LU", 200, 200, 64);
    let mut store = MemStore::new();
    store.generate(&a, MatrixKind::Random, 5);
    // Global column 70 = block column 1, column 6 within it: all zero.
    for i in 0..a.block_rows() {
        let blk = store.blocks.get_mut(&a.block_id(i, 1)).unwrap();
        for r in 0..blk.rows {
            blk.set(r, 6, 0.0);
        }
    }
    let s = spec(&a, &lu);
    match run_plan(&mut store, &s, &plan(&s).unwrap()) {
        Err(RunError::Task { source: TaskError::Singular { i: 1, j: 1, row: 6 }, .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn counters_match_the_producers() {
    for p in 1u32..12 {
        let all = all_tasks(p);
        crate::lu::tests::check_counters(p, &all, successors, |t| n_deps(p, t));
        let n = u64::from(p) * 8;
        let pl = plan(&spec(&MatrixMeta::new("A", n, n, 8), &MatrixMeta::new("LU", n, n, 8))).unwrap();
        let ready: Vec<LuTask> = pl.bags[0].tasks.iter().map(|t| crate::job::decode_task(t).unwrap()).collect();
        // The first panel's nodes that meet two blocks (or its one block) read A and wait for nothing.
        assert_eq!(ready.len(), if p == 1 { 1 } else { p as usize / 2 }, "p={p}");
        assert!(ready.iter().all(|t| matches!(t, LuTask::Pick { k: 0, level, .. } if *level == u32::from(p > 1))), "p={p}: {ready:?}");
        assert_eq!(pl.initial_small.len(), all.len() - ready.len());
    }
}

/// Every task `t` reaches through successors, `t` included.
fn reach(p: u32, t: LuTask) -> std::collections::HashSet<LuTask> {
    let mut seen = std::collections::HashSet::from([t]);
    let mut todo = vec![t];
    while let Some(t) = todo.pop() {
        todo.extend(successors(p, t).into_iter().filter(|s| seen.insert(*s)));
    }
    seen
}

#[test]
fn a_columns_swaps_follow_its_steps_updates_and_the_panels_in_order() {
    for p in 2u32..9 {
        for m in 0..p - 1 {
            for k in m + 1..p {
                let swap = LuTask::Swap { k, j: m };
                // Step m's updates read L(·,m) in that step's row order.
                for j in m + 1..p {
                    assert!(reach(p, LuTask::Update { k: m, j }).contains(&swap), "p={p}: {swap:?} before Update{{{m},{j}}}");
                }
                let root = LuTask::Pick { k, level: tree::height(p - k), idx: 0 };
                assert!(reach(p, root).contains(&swap), "p={p}: {swap:?} before its panel's pivots");
                if k > m + 1 {
                    assert!(reach(p, LuTask::Swap { k: k - 1, j: m }).contains(&swap), "p={p}: panels out of order");
                }
            }
        }
    }
}

#[test]
fn the_critical_path_ranks_first_and_the_swaps_last() {
    let p = 6;
    let (next_tree, trailing) = (LuTask::Pick { k: 2, level: 0, idx: 1 }, LuTask::Update { k: 1, j: 4 });
    assert!(rank(LuTask::Update { k: 1, j: 2 }) < rank(trailing));
    assert!(rank(next_tree) < rank(trailing), "panel 2's tree ahead of step 1's later updates");
    let last_update = all_tasks(p).into_iter().filter(|t| !matches!(t, LuTask::Swap { .. })).map(rank).max().unwrap();
    assert!(rank(LuTask::Swap { k: 1, j: 0 }) > last_update);
    assert!(rank(LuTask::Swap { k: 1, j: 0 }) < rank(LuTask::Swap { k: 2, j: 0 }));
}

#[test]
fn refuses_other_tasks_and_the_bags_schedule() {
    let a = MatrixMeta::new("A", 64, 64, 16);
    let lu = MatrixMeta::new("LU", 64, 64, 16);
    let mut store = MemStore::new();
    store.generate(&a, MatrixKind::Random, 1);
    let s = spec(&a, &lu);
    for t in [
        LuTask::Panel { k: 0 },
        LuTask::Pick { k: 0, level: 1, idx: 2 },
        LuTask::Pick { k: 4, level: 0, idx: 0 },
        LuTask::Pick { k: 0, level: 0, idx: 1 },
        LuTask::Update { k: 1, j: 1 },
        LuTask::Swap { k: 1, j: 1 },
        LuTask::Swap { k: 4, j: 0 },
        LuTask::LeftSwap { m: 0 },
    ] {
        let mut ctx = crate::mem::MemCtx::new(&store, s.job());
        let r = crate::job::run_task(&s, &crate::job::encode_task(&t), 0, &mut ctx);
        assert!(matches!(r, Err(TaskError::BadTask { .. })), "{t:?}: {r:?}");
    }
    let JobSpec::Lu { job, a, lu, pivot, pivot_rule, .. } = s else { unreachable!() };
    let bags = JobSpec::Lu { job, a, lu, pivot, pivot_rule, schedule: LuSchedule::Bags };
    assert!(matches!(plan(&bags), Err(crate::job::PlanError::Unsupported { .. })));
}
