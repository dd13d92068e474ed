use super::*;
use crate::generate::MatrixKind;
use crate::job::{plan, JobSpec, LuSchedule};
use crate::mem::{run_plan, MemStore, RunError};
use crate::verify::lu_residual;

fn run(n: u64, b: u32, seed: u64, pivot: bool, kind: MatrixKind) -> (MemStore, JobSpec, MatrixMeta, MatrixMeta) {
    run_on(n, b, seed, pivot, kind, LuSchedule::Bags)
}

fn run_on(n: u64, b: u32, seed: u64, pivot: bool, kind: MatrixKind, schedule: LuSchedule) -> (MemStore, JobSpec, MatrixMeta, MatrixMeta) {
    let a = MatrixMeta::new("A", n, n, b);
    let lu = MatrixMeta::new("LU", n, n, b);
    let mut store = MemStore::new();
    store.generate(&a, kind, seed);
    let spec = JobSpec::Lu { job: uuid::Uuid::new_v4(), a: a.clone(), lu: lu.clone(), pivot, schedule, pivot_rule: Default::default() };
    (store, spec, a, lu)
}

#[test]
fn crout_without_pivoting() {
    for n in [255u64, 256, 257] {
        let (mut store, spec, a, lu) = run(n, 64, n, false, MatrixKind::DiagDominant);
        let pl = plan(&spec).unwrap();
        let p = a.block_rows() as usize;
        assert_eq!(pl.bags.len(), 3 * p - 1);
        run_plan(&mut store, &spec, &pl).unwrap();
        let res = lu_residual(&mut store, &a, &lu, None).unwrap();
        assert!(res <= 1e-13 * n as f64, "n={n} seed={n}: {res}");
        // Against an in-core LU without pivoting of the whole matrix.
        let nn = n as usize;
        let mut d = Block { rows: nn, cols: nn, data: store.to_dense(&a).unwrap() };
        kernels::lu_nopiv(&mut d).unwrap();
        let got = store.to_dense(&lu).unwrap();
        let diff: f64 = got.iter().zip(&d.data).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
        assert!(diff / d.sum_sq().sqrt() <= 1e-13 * n as f64, "n={n}: {diff}");
    }
}

#[test]
fn partial_pivoting() {
    for (n, schedule) in [255u64, 256, 257, 64, 40].into_iter().flat_map(|n| [(n, LuSchedule::Bags), (n, LuSchedule::Dag)]) {
        let (mut store, spec, a, lu) = run_on(n, 64, n + 100, true, MatrixKind::Random, schedule);
        let pl = plan(&spec).unwrap();
        run_plan(&mut store, &spec, &pl).unwrap();
        let perm = permutation(&mut store, spec.job(), &lu).unwrap();
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        assert_ne!(perm, sorted, "random input should need interchanges");
        let res = lu_residual(&mut store, &a, &lu, Some(&perm)).unwrap();
        assert!(res <= 1e-13 * n as f64, "n={n} {schedule:?} seed={}: {res}", n + 100);
        // Partial pivoting keeps every multiplier at most 1 in magnitude.
        let d = store.to_dense(&lu).unwrap();
        let nn = n as usize;
        for c in 0..nn {
            for r in c + 1..nn {
                assert!(d[r + c * nn].abs() <= 1.0 + 1e-12, "L({r},{c})");
            }
        }
        // Same pivots and factors as in-core LAPACK dgetrf on the whole matrix.
        let mut full = Block { rows: nn, cols: nn, data: store.to_dense(&a).unwrap() };
        let (ipiv, res) = kernels::getrf(&mut full);
        res.unwrap();
        let mut want: Vec<u64> = (0..n).collect();
        for (r, &g) in ipiv.iter().enumerate() {
            want.swap(r, g);
        }
        assert_eq!(perm, want, "n={n} {schedule:?}");
        let diff: f64 = d.iter().zip(&full.data).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
        assert!(diff / full.sum_sq().sqrt() <= 1e-12 * n as f64, "n={n} {schedule:?}: {diff}");
    }
}

#[test]
fn singular_names_the_block() {
    for (pivot, schedule) in [(false, LuSchedule::Bags), (false, LuSchedule::Dag), (true, LuSchedule::Bags), (true, LuSchedule::Dag)] {
        let (mut store, spec, a, _) = run_on(200, 64, 5, pivot, MatrixKind::DiagDominant, schedule);
        // Global column 70 = block column 1, column 6 within it: all zero.
        for i in 0..a.block_rows() {
            let blk = store.blocks.get_mut(&a.block_id(i, 1)).unwrap();
            for r in 0..blk.rows {
                blk.set(r, 6, 0.0);
            }
        }
        let pl = plan(&spec).unwrap();
        match run_plan(&mut store, &spec, &pl) {
            Err(RunError::Task { source: TaskError::Singular { i: 1, j: 1, row: 6 }, .. }) => {}
            other => panic!("pivot={pivot} {schedule:?}: {other:?}"),
        }
    }
}

#[test]
fn shapes_and_descriptors() {
    let a = MatrixMeta::new("A", 10, 12, 4);
    let lu = MatrixMeta::new("LU", 10, 12, 4);
    let spec = JobSpec::Lu { job: uuid::Uuid::new_v4(), a, lu, pivot: false, schedule: LuSchedule::Bags, pivot_rule: Default::default() };
    assert!(matches!(plan(&spec), Err(PlanError::NotSquare { .. })));
    let (store, spec, ..) = run(20, 8, 1, false, MatrixKind::DiagDominant);
    let mut ctx = crate::mem::MemCtx::new(&store, spec.job());
    for t in [LuTask::Panel { k: 0 }, LuTask::SolveU { k: 1, j: 1 }, LuTask::Mult { i: 0, k: 1 }] {
        let r = crate::job::run_task(&spec, &job::encode_task(&t), 0, &mut ctx);
        assert!(matches!(r, Err(TaskError::BadTask { .. })), "{t:?}");
    }
}

fn lu_spec(a: &MatrixMeta, lu: &MatrixMeta, pivot: bool, schedule: LuSchedule) -> JobSpec {
    JobSpec::Lu { job: uuid::Uuid::new_v4(), a: a.clone(), lu: lu.clone(), pivot, schedule, pivot_rule: Default::default() }
}

#[test]
fn dag_schedule_is_bit_identical_to_the_bags() {
    for n in [255u64, 256, 257, 64, 40] {
        let (mut bags, spec, a, lu) = run(n, 64, n + 7, false, MatrixKind::DiagDominant);
        let mut dag = bags.clone();
        run_plan(&mut bags, &spec, &plan(&spec).unwrap()).unwrap();
        let dspec = lu_spec(&a, &lu, false, LuSchedule::Dag);
        let dplan = plan(&dspec).unwrap();
        assert_eq!(dplan.bags.len(), 1);
        let report = run_plan(&mut dag, &dspec, &dplan).unwrap();
        // Every task of the bags ran once, from the one bag.
        let p = a.block_rows() as usize;
        let bag_tasks: usize = plan(&spec).unwrap().bags.iter().map(|b| b.tasks.len()).sum();
        assert_eq!(report.tasks.len(), bag_tasks, "n={n} p={p}");
        assert_eq!(dag.to_dense(&lu).unwrap(), bags.to_dense(&lu).unwrap(), "n={n}: dag and bags differ");
        let res = lu_residual(&mut dag, &a, &lu, None).unwrap();
        assert!(res <= 1e-13 * n as f64, "n={n}: {res}");
        // Multiplies and U solves announced every block they read, in order.
        let tot = report.tasks.iter().fold((0, 0), |acc, t| (acc.0 + t.stats.prefetched, acc.1 + t.stats.prefetch_misses));
        assert!(tot.0 > 0 || p == 1, "n={n}: nothing announced");
        assert_eq!(tot.1, 0, "n={n}: reads out of the announced order");
        // Each task releases its successors before it writes its block.
        assert_eq!(report.totals().small_reads_behind_puts, 0, "n={n}: a release waited behind a put");
    }
}

/// Every task a dag's task releases is one of its tasks, and each task is
/// released exactly as many times as its counter says.
pub(super) fn check_counters(p: u32, all: &[LuTask], successors: impl Fn(u32, LuTask) -> Vec<LuTask>, n_deps: impl Fn(LuTask) -> u32) {
    let mut count = std::collections::HashMap::new();
    for t in all {
        for s in successors(p, *t) {
            assert!(all.contains(&s), "p={p}: {t:?} releases {s:?}, not a task");
            *count.entry(s).or_insert(0u32) += 1;
        }
    }
    for t in all {
        assert_eq!(count.get(t).copied().unwrap_or(0), n_deps(*t), "p={p}: {t:?}");
    }
}

#[test]
fn dag_counters_match_the_producers() {
    for p in 1u32..9 {
        let n = u64::from(p) * 8;
        let a = MatrixMeta::new("A", n, n, 8);
        let lu = MatrixMeta::new("LU", n, n, 8);
        let spec = lu_spec(&a, &lu, false, LuSchedule::Dag);
        let pl = plan(&spec).unwrap();
        let all: Vec<LuTask> = (0..p)
            .flat_map(|k| {
                (k..p)
                    .map(move |i| LuTask::Mult { i, k })
                    .chain([LuTask::Factor { k }])
                    .chain((k + 1..p).map(move |i| LuTask::SolveL { i, k }))
                    .chain((k + 1..p).map(move |j| LuTask::SolveU { k, j }))
            })
            .collect();
        check_counters(p, &all, successors, n_deps);
        // The bag starts with exactly the tasks no other task feeds; every
        // other task has its counter.
        let ready: Vec<LuTask> = pl.bags[0].tasks.iter().map(|t| serde_json::from_slice(t).unwrap()).collect();
        assert_eq!(ready, all.iter().copied().filter(|t| n_deps(*t) == 0).collect::<Vec<_>>());
        assert_eq!(pl.initial_small.len(), all.len() - ready.len());
    }
}

#[test]
fn each_schedule_refuses_the_others_tasks() {
    let (store, _, a, lu) = run(64, 16, 1, false, MatrixKind::DiagDominant);
    let cases = [
        (false, LuSchedule::Dag, LuTask::Panel { k: 0 }),
        (false, LuSchedule::Dag, LuTask::Update { k: 0, j: 1 }),
        (false, LuSchedule::Bags, LuTask::LeftSwap { m: 0 }),
        (true, LuSchedule::Bags, LuTask::Update { k: 0, j: 1 }),
        (true, LuSchedule::Dag, LuTask::Swap { k: 0, j: 1 }),
        (true, LuSchedule::Dag, LuTask::Copy { i: 0, j: 0 }),
        (true, LuSchedule::Dag, LuTask::Mult { i: 1, k: 1 }),
        (true, LuSchedule::Dag, LuTask::Factor { k: 0 }),
        (true, LuSchedule::Dag, LuTask::LeftSwap { m: 3 }),
        (true, LuSchedule::Dag, LuTask::Update { k: 1, j: 1 }),
    ];
    for (pivot, schedule, t) in cases {
        let spec = lu_spec(&a, &lu, pivot, schedule);
        let mut ctx = crate::mem::MemCtx::new(&store, spec.job());
        let r = crate::job::run_task(&spec, &job::encode_task(&t), 0, &mut ctx);
        assert!(matches!(r, Err(TaskError::BadTask { .. })), "pivot={pivot} {schedule:?} {t:?}: {r:?}");
    }
}

#[test]
fn pivoted_dag_counters_match_the_producers() {
    for p in 1u32..10 {
        let n = u64::from(p) * 8;
        let a = MatrixMeta::new("A", n, n, 8);
        let lu = MatrixMeta::new("LU", n, n, 8);
        let pl = plan(&lu_spec(&a, &lu, true, LuSchedule::Dag)).unwrap();
        let all = right_looking::tasks(p);
        assert_eq!(all.len() as u32, p + p * (p - 1) / 2, "p={p}");
        check_counters(p, &all, right_looking::successors, right_looking::n_deps);
        let ready: Vec<LuTask> = pl.bags[0].tasks.iter().map(|t| serde_json::from_slice(t).unwrap()).collect();
        assert_eq!(ready, vec![LuTask::Panel { k: 0 }]);
        assert_eq!(pl.initial_small.len(), all.len() - 1);
        // The left swaps run after the dag, one per column with a panel right of it.
        assert_eq!(pl.bags.len(), if p > 1 { 2 } else { 1 });
        if p > 1 {
            assert_eq!(pl.bags[1].tasks.len() as u32, p - 1);
        }
    }
}

#[test]
fn pivoted_dag_reads_each_column_once_per_step() {
    // The bags rewrite a column per panel in swap tasks; the right-looking
    // dag folds the interchanges into the update that reads the column anyway.
    let (mut bags, spec, a, lu) = run(256, 32, 3, true, MatrixKind::Random);
    let mut dag = bags.clone();
    let r_bags = run_plan(&mut bags, &spec, &plan(&spec).unwrap()).unwrap();
    let dspec = lu_spec(&a, &lu, true, LuSchedule::Dag);
    let r_dag = run_plan(&mut dag, &dspec, &plan(&dspec).unwrap()).unwrap();
    let (d, b) = (r_dag.totals(), r_bags.totals());
    assert!(d.block_reads < b.block_reads, "dag reads {} blocks, bags {}", d.block_reads, b.block_reads);
    assert!(d.block_writes < b.block_writes, "dag writes {} blocks, bags {}", d.block_writes, b.block_writes);
    assert_eq!(d.prefetch_misses, 0, "reads out of the announced order");
    assert_eq!(d.small_reads_behind_puts, 0, "a release waited behind a put");
}
