use super::*;
use crate::generate::MatrixKind;
use crate::job::{plan, run_task, ErrorClass, JobSpec};
use crate::mem::{run_plan, MemCtx, MemStore};
use crate::verify::cholesky_residual;

const VARIANTS: [CholeskyVariant; 4] =
    [CholeskyVariant::SingleBag, CholeskyVariant::MultiStep1, CholeskyVariant::MultiStep2, CholeskyVariant::Dag];

fn setup(n: u64, b: u32, seed: u64, v: CholeskyVariant) -> (MemStore, JobSpec, MatrixMeta, MatrixMeta) {
    let a = MatrixMeta::new("A", n, n, b);
    let l = MatrixMeta::new("L", n, n, b);
    let mut store = MemStore::new();
    store.generate(&a, MatrixKind::Spd, seed);
    let spec = JobSpec::Cholesky { job: uuid::Uuid::new_v4(), a: a.clone(), l: l.clone(), variant: v, flag_timeout_ms: 10 };
    (store, spec, a, l)
}

/// In-core LAPACK dpotrf of the whole matrix.
fn incore(store: &MemStore, a: &MatrixMeta) -> Block {
    let n = a.n_rows as usize;
    let mut d = Block { rows: n, cols: n, data: store.to_dense(a).unwrap() };
    kernels::potrf_lower(&mut d).unwrap();
    d
}

#[test]
fn every_variant_factors_across_block_boundaries() {
    for n in [255u64, 256, 257] {
        for v in VARIANTS {
            let (mut store, spec, a, l) = setup(n, 64, n, v);
            let pl = plan(&spec).unwrap();
            let report = run_plan(&mut store, &spec, &pl).unwrap();
            let p = a.block_rows() as usize;
            // Each block of L computed exactly once.
            let writes: u64 = report.totals().block_writes;
            assert_eq!(writes as usize, p * (p + 1) / 2, "n={n} {v:?}");
            // Every variant announces its reads, single-bag those whose
            // flags are set (all of them when tasks run one after another),
            // and reads in the announced order.
            let (announced, misses) = (report.totals().prefetched, report.totals().prefetch_misses);
            assert_eq!(announced, report.totals().block_reads, "n={n} {v:?}: reads not announced");
            assert_eq!(misses, 0, "n={n} {v:?}: reads out of the announced order");
            // A dag task releases its successors before it writes its block.
            assert_eq!(report.totals().small_reads_behind_puts, 0, "n={n} {v:?}: a small read waited behind a put");
            let res = cholesky_residual(&mut store, &a, &l).unwrap();
            assert!(res <= 1e-13 * n as f64, "n={n} {v:?} seed={n}: residual {res}");
            // Fill the never-written upper blocks with zeros and compare with dpotrf.
            for id in upper_zero_blocks(&l) {
                let (r, c) = l.block_shape(id.i, id.j);
                store.blocks.insert(id, Block::zeros(r, c));
            }
            let got = store.to_dense(&l).unwrap();
            let want = incore(&store, &a);
            let diff: f64 = got.iter().zip(&want.data).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
            assert!(diff / want.sum_sq().sqrt() <= 1e-13 * n as f64, "n={n} {v:?}: vs dpotrf {diff}");
        }
    }
}

#[test]
fn bag_structure() {
    let (_, spec, ..) = setup(300, 64, 1, CholeskyVariant::MultiStep1);
    let p = 5;
    assert_eq!(plan(&spec).unwrap().bags.len(), 2 * p - 1);
    let (_, spec, ..) = setup(300, 64, 1, CholeskyVariant::MultiStep2);
    let pl = plan(&spec).unwrap();
    assert_eq!(pl.bags.len(), p);
    assert_eq!(pl.bags.iter().map(|b| b.tasks.len()).sum::<usize>(), 1 + (p - 1) + (p - 1) * (p - 2) / 2);
    let (_, spec, ..) = setup(300, 64, 1, CholeskyVariant::Dag);
    let pl = plan(&spec).unwrap();
    assert_eq!(pl.bags[0].tasks.len(), 1);
    assert_eq!(pl.initial_small.len(), p * (p + 1) / 2 - 1);
    // Counters equal the number of producers that list each task as a successor.
    let mut count = std::collections::HashMap::new();
    for c in 0..p as u32 {
        for r in c..p as u32 {
            for s in successors(p as u32, r, c) {
                *count.entry(s).or_insert(0u32) += 1;
            }
        }
    }
    for c in 0..p as u32 {
        for r in c..p as u32 {
            assert_eq!(count.get(&(r, c)).copied().unwrap_or(0), n_deps(r, c), "({r},{c})");
        }
    }
}

#[test]
fn not_spd_names_the_block() {
    for v in VARIANTS {
        let (mut store, spec, a, _) = setup(200, 64, 3, v);
        // Make the leading minor fail inside diagonal block (2,2).
        let id = a.block_id(2, 2);
        store.blocks.get_mut(&id).unwrap().set(1, 1, -1e9);
        let pl = plan(&spec).unwrap();
        match run_plan(&mut store, &spec, &pl) {
            Err(crate::mem::RunError::Task { source: TaskError::NotPositiveDefinite { i: 2, j: 2, row: 1 }, .. }) => {}
            other => panic!("{v:?}: {other:?}"),
        }
    }
}

#[test]
fn single_bag_times_out_when_a_flag_is_missing() {
    let (store, spec, ..) = setup(200, 64, 4, CholeskyVariant::SingleBag);
    let mut ctx = MemCtx::new(&store, spec.job());
    // Task (1,0) before (0,0) has committed: its flag never appears.
    let e = run_task(&spec, &enc(CholTask::Block { i: 1, j: 0 }), 2, &mut ctx).unwrap_err();
    match &e {
        TaskError::FlagTimeout { waited, .. } => assert_eq!(*waited, Duration::from_millis(40)),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.class(), ErrorClass::Requeue);
    assert_eq!(ctx.stats.block_writes, 0);
}

#[test]
fn bad_descriptors_are_refused() {
    let (store, spec, ..) = setup(200, 64, 4, CholeskyVariant::MultiStep1);
    let mut ctx = MemCtx::new(&store, spec.job());
    for t in [CholTask::Block { i: 0, j: 1 }, CholTask::Block { i: 9, j: 0 }, CholTask::Merged { j: 1 }] {
        assert!(matches!(run_task(&spec, &enc(t), 0, &mut ctx), Err(TaskError::BadTask { .. })), "{t:?}");
    }
}
