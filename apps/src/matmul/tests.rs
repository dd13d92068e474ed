use crate::block::MatrixMeta;
use crate::generate::MatrixKind;
use crate::job::{output_shapes, plan, AppRequest, JobSpec, PlanError};
use crate::mem::{run_plan, MemStore};
use crate::verify::{freivalds, matmul_vs_dgemm};

fn run(m: u64, k: u64, n: u64, b: u32, seed: u64) -> (MemStore, MatrixMeta, MatrixMeta, MatrixMeta, crate::mem::RunReport) {
    let a = MatrixMeta::new("A", m, k, b);
    let bm = MatrixMeta::new("B", k, n, b);
    let shape = output_shapes(&AppRequest::Matmul { a: &a, b: &bm }).unwrap()[0];
    let c = MatrixMeta::new("C", shape.n_rows, shape.n_cols, shape.block);
    let mut store = MemStore::new();
    store.generate(&a, MatrixKind::Random, seed);
    store.generate(&bm, MatrixKind::Random, seed + 1);
    let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a: a.clone(), b: bm.clone(), c: c.clone() };
    let p = plan(&spec).unwrap();
    let report = run_plan(&mut store, &spec, &p).unwrap();
    (store, a, bm, c, report)
}

#[test]
fn matches_incore_dgemm_across_block_boundaries() {
    for n in [255u64, 256, 257] {
        let (mut store, a, b, c, report) = run(n, n, n, 64, n);
        let chk = matmul_vs_dgemm(&mut store, &a, &b, &c).unwrap();
        assert!(chk.passed(), "n={n} seed={n}: {chk:?}");
        let p = c.block_rows() as u64;
        let tot = report.totals();
        // 2p block reads per task, one write: the source's 2p³ reads.
        assert_eq!(tot.block_reads, 2 * p * p * p, "n={n}");
        assert_eq!(tot.block_writes, p * p);
        assert_eq!((tot.prefetched, tot.prefetch_misses), (tot.block_reads, 0));
    }
}

#[test]
fn plan_is_serpentine_and_covers_every_block_once() {
    use super::MatmulTask;
    use crate::job::decode_task;
    for (m, n, b) in [(64u64, 64u64, 8u32), (40, 24, 8), (24, 41, 8), (8, 8, 8), (8, 30, 8), (30, 8, 8)] {
        let a = MatrixMeta::new("A", m, 16, b);
        let bm = MatrixMeta::new("B", 16, n, b);
        let c = MatrixMeta::new("C", m, n, b);
        let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a, b: bm, c: c.clone() };
        let p = plan(&spec).unwrap();
        assert_eq!(p.bags.len(), 1);
        let tasks: Vec<MatmulTask> = p.bags[0].tasks.iter().map(|t| decode_task(t).unwrap()).collect();
        let (rows, cols) = (c.block_rows(), c.block_cols());
        assert_eq!(tasks.len(), (rows * cols) as usize, "m={m} n={n}");
        let mut seen = std::collections::HashSet::new();
        for t in &tasks {
            assert!(c.contains(t.i, t.j) && seen.insert((t.i, t.j)), "m={m} n={n}: {t:?} outside C or twice");
        }
        // Row by row; within a row, left to right on even rows and right to
        // left on odd ones, so consecutive rows meet at the same column.
        for (i, row) in tasks.chunks(cols as usize).enumerate() {
            let js: Vec<u32> = row
                .iter()
                .map(|t| {
                    assert_eq!(t.i, i as u32, "m={m} n={n}");
                    t.j
                })
                .collect();
            let expect: Vec<u32> = if i % 2 == 0 { (0..cols).collect() } else { (0..cols).rev().collect() };
            assert_eq!(js, expect, "m={m} n={n} row {i}");
        }
    }
}

#[test]
fn rectangular_and_freivalds() {
    let (mut store, a, b, c, _) = run(130, 70, 45, 32, 9);
    assert!(matmul_vs_dgemm(&mut store, &a, &b, &c).unwrap().passed());
    let f = freivalds(&mut store, &a, &b, &c, 1, 3).unwrap();
    assert!(f.passed(), "{f:?}");
    assert_eq!(f.miss_probability, 0.125);
    // A single wrong entry is caught.
    let id = c.block_id(1, 0);
    store.blocks.get_mut(&id).unwrap().data[5] += 1e-6;
    assert!(!freivalds(&mut store, &a, &b, &c, 2, 3).unwrap().passed());
    assert!(!matmul_vs_dgemm(&mut store, &a, &b, &c).unwrap().passed());
    store.blocks.get_mut(&id).unwrap().data[5] = f64::NAN;
    assert!(!freivalds(&mut store, &a, &b, &c, 2, 3).unwrap().passed());
    assert!(!matmul_vs_dgemm(&mut store, &a, &b, &c).unwrap().passed());
}

#[test]
fn incompatible_shapes_are_refused() {
    let a = MatrixMeta::new("A", 10, 20, 8);
    let b = MatrixMeta::new("B", 21, 5, 8);
    assert!(matches!(output_shapes(&AppRequest::Matmul { a: &a, b: &b }), Err(PlanError::IncompatibleShapes { .. })));
    let b = MatrixMeta::new("B", 20, 5, 4);
    assert!(matches!(output_shapes(&AppRequest::Matmul { a: &a, b: &b }), Err(PlanError::BlockMismatch { .. })));
    let b = MatrixMeta::new("B", 20, 5, 8);
    let c = MatrixMeta::new("C", 10, 6, 8);
    let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a, b, c };
    assert!(matches!(plan(&spec), Err(PlanError::OutputShape { .. })));
    let huge = MatrixMeta::new("H", 1 << 40, 1 << 40, 1024);
    assert!(matches!(output_shapes(&AppRequest::Matmul { a: &huge, b: &huge }), Err(PlanError::TooLarge { .. })));
    let z = MatrixMeta::new("Z", 0, 5, 8);
    assert!(matches!(output_shapes(&AppRequest::Matmul { a: &z, b: &z }), Err(PlanError::Empty { .. })));
}

#[test]
fn bad_task_and_missing_block_are_typed() {
    use crate::job::{run_task, ErrorClass, TaskError};
    use crate::mem::MemCtx;
    let a = MatrixMeta::new("A", 10, 10, 8);
    let b = MatrixMeta::new("B", 10, 10, 8);
    let c = MatrixMeta::new("C", 10, 10, 8);
    let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a, b, c };
    let store = MemStore::new();
    let mut ctx = MemCtx::new(&store, spec.job());
    let e = run_task(&spec, b"garbage", 0, &mut ctx).unwrap_err();
    assert!(matches!(e, TaskError::BadTask { .. }));
    assert_eq!(e.class(), ErrorClass::JobFatal);
    let e = run_task(&spec, br#"{"i":9,"j":0}"#, 0, &mut ctx).unwrap_err();
    assert!(matches!(e, TaskError::BadTask { .. }));
    let e = run_task(&spec, br#"{"i":0,"j":0}"#, 0, &mut ctx).unwrap_err();
    assert!(matches!(e, TaskError::Ctx(_)));
}

#[test]
fn spec_round_trips_through_json() {
    let spec = JobSpec::Matmul {
        job: uuid::Uuid::new_v4(),
        a: MatrixMeta::new("A", 3, 4, 2),
        b: MatrixMeta::new("B", 4, 5, 2),
        c: MatrixMeta::new("C", 3, 5, 2),
    };
    let s = serde_json::to_string(&spec).unwrap();
    assert_eq!(serde_json::from_str::<JobSpec>(&s).unwrap(), spec);
    assert_eq!(crate::job::flops(&spec), 120.0);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_shape_matches_dgemm(m in 1u64..90, k in 1u64..90, n in 1u64..90, b in 1u32..40, seed in 0u64..1000) {
            let (mut store, a, bm, c, _) = run(m, k, n, b, seed);
            let chk = matmul_vs_dgemm(&mut store, &a, &bm, &c).unwrap();
            prop_assert!(chk.passed(), "{:?}", chk);
        }
    }
}
