//! Every app under simulated kills and out-of-order execution gives
//! bit-identical results to a clean in-order run, each task committed once.

use crate::block::MatrixMeta;
use crate::generate::MatrixKind;
use crate::job::{plan, CholeskyVariant, JobSpec, LuSchedule, PivotRule};
use crate::mem::{run_plan, run_plan_chaos, MemStore};
use std::collections::HashSet;

fn check(spec: &JobSpec, input: &MemStore, seed: u64) -> crate::mem::ChaosReport {
    let pl = plan(spec).unwrap();
    let mut clean = input.clone();
    let clean_run = run_plan(&mut clean, spec, &pl).unwrap();
    assert_eq!(clean_run.totals().prefetch_misses, 0, "{}", spec.app_name());
    let mut chaos = input.clone();
    let rep = run_plan_chaos(&mut chaos, spec, &pl, seed, 4, 0.3, 200).unwrap_or_else(|e| panic!("seed={seed}: {e}"));
    assert!(rep.killed > 0, "seed={seed}");
    assert_eq!(chaos.blocks, clean.blocks, "{} seed={seed}", spec.app_name());
    assert_eq!(chaos.small, clean.small, "{} seed={seed}", spec.app_name());
    // Exactly once: as many commits as the clean run, no task twice.
    assert_eq!(rep.run.tasks.len(), clean_run.tasks.len());
    let distinct: HashSet<(&str, &[u8])> = rep.run.tasks.iter().map(|t| (t.bag.as_str(), t.task.as_slice())).collect();
    assert_eq!(distinct.len(), rep.run.tasks.len());
    rep
}

#[test]
fn matmul_under_kills() {
    let a = MatrixMeta::new("A", 150, 100, 32);
    let b = MatrixMeta::new("B", 100, 90, 32);
    let c = MatrixMeta::new("C", 150, 90, 32);
    let mut s = MemStore::new();
    s.generate(&a, MatrixKind::Random, 1);
    s.generate(&b, MatrixKind::Random, 2);
    let _ = check(&JobSpec::Matmul { job: uuid::Uuid::new_v4(), a, b, c }, &s, 11);
}

#[test]
fn cholesky_variants_under_kills_and_reordering() {
    for (n, v) in
        [CholeskyVariant::SingleBag, CholeskyVariant::MultiStep1, CholeskyVariant::MultiStep2, CholeskyVariant::Dag].into_iter().enumerate()
    {
        let a = MatrixMeta::new("A", 161, 161, 32);
        let l = MatrixMeta::new("L", 161, 161, 32);
        let mut s = MemStore::new();
        s.generate(&a, MatrixKind::Spd, 3);
        let spec = JobSpec::Cholesky { job: uuid::Uuid::new_v4(), a, l, variant: v, flag_timeout_ms: 1 };
        let rep = check(&spec, &s, 20 + n as u64);
        if v == CholeskyVariant::SingleBag {
            // Out-of-order picks met missing flags, timed out and went back.
            assert!(rep.requeued > 0);
        }
    }
}

#[test]
fn lu_under_kills() {
    let cases = [
        (false, LuSchedule::Bags, MatrixKind::DiagDominant, PivotRule::Partial),
        (false, LuSchedule::Dag, MatrixKind::DiagDominant, PivotRule::Partial),
        (true, LuSchedule::Bags, MatrixKind::Random, PivotRule::Partial),
        (true, LuSchedule::Dag, MatrixKind::Random, PivotRule::Tournament),
    ];
    for (seed, (pivot, schedule, kind, pivot_rule)) in cases.into_iter().enumerate() {
        let a = MatrixMeta::new("A", 161, 161, 32);
        let lu = MatrixMeta::new("LU", 161, 161, 32);
        let mut s = MemStore::new();
        s.generate(&a, kind, 4);
        let _ = check(&JobSpec::Lu { job: uuid::Uuid::new_v4(), a, lu, pivot, schedule, pivot_rule }, &s, 30 + seed as u64);
    }
}

#[test]
fn raytrace_under_kills() {
    let params = crate::raytrace::RenderParams { level: 2, width: 40, height: 33, grain: 3, samples: 2 };
    let _ = check(&JobSpec::Raytrace { job: uuid::Uuid::new_v4(), name: "i".into(), params }, &MemStore::new(), 40);
}
