//! The model's task counts and data volumes against the apps' own tasks
//! (issue 6, test 2): each job is planned by `apps::job::plan` and run task
//! by task in memory (`apps::mem::run_plan`), which counts every block the
//! real task code reads and writes, with its size.

use apps::block::MatrixMeta;
use apps::generate::MatrixKind;
use apps::job::{plan, CholeskyVariant, JobSpec, LuSchedule};
use apps::mem::{run_plan, MemStore, TaskStats};
use model::{predict, App, Options, Params, Variant, Volumes};

/// Runs `spec` in memory on inputs generated for `inputs`; returns the
/// number of tasks and the totals of what they touched.
fn run(spec: &JobSpec, inputs: &[(&MatrixMeta, MatrixKind)]) -> (u64, TaskStats) {
    let mut store = MemStore::new();
    for (k, (meta, kind)) in inputs.iter().enumerate() {
        store.generate(meta, *kind, k as u64 + 1);
    }
    let report = run_plan(&mut store, spec, &plan(spec).unwrap()).unwrap();
    (report.tasks.len() as u64, report.totals())
}

fn check(what: &str, v: &Volumes, (tasks, t): (u64, TaskStats)) {
    assert_eq!(v.n_tasks, tasks, "{what}: tasks");
    assert_eq!(v.n_gets, t.block_reads, "{what}: block reads");
    assert_eq!(v.n_puts, t.block_writes, "{what}: block writes");
    assert!((v.get_bytes - t.block_read_bytes as f64).abs() < 0.5, "{what}: read bytes {} vs {}", v.get_bytes, t.block_read_bytes);
    assert!((v.put_bytes - t.block_write_bytes as f64).abs() < 0.5, "{what}: write bytes {} vs {}", v.put_bytes, t.block_write_bytes);
}

/// Sizes with whole and ragged edge blocks, one and several blocks per side.
const PROBLEMS: [(u64, u32); 5] = [(256, 64), (255, 64), (257, 64), (96, 32), (40, 16)];

fn volumes(app: App, n: u64, b: u32, options: &Options) -> Volumes {
    predict(app, n, b as u64, &Params::thesis_fast(), options).unwrap().volumes
}

#[test]
fn matmul_volumes_are_the_tasks_reads_and_writes() {
    for (n, b) in PROBLEMS {
        let (a, bm, c) = (MatrixMeta::new("A", n, n, b), MatrixMeta::new("B", n, n, b), MatrixMeta::new("C", n, n, b));
        let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a: a.clone(), b: bm.clone(), c };
        let got = run(&spec, &[(&a, MatrixKind::Random), (&bm, MatrixKind::Random)]);
        check(&format!("matmul n={n} b={b}"), &volumes(App::Matmul, n, b, &Options::default()), got);
    }
}

#[test]
fn cholesky_volumes_are_the_tasks_reads_and_writes() {
    for (n, b) in PROBLEMS {
        for (app_variant, model_variant) in [(CholeskyVariant::SingleBag, Variant::SingleBag), (CholeskyVariant::Dag, Variant::Dag)] {
            let (a, l) = (MatrixMeta::new("A", n, n, b), MatrixMeta::new("L", n, n, b));
            let spec = JobSpec::Cholesky { job: uuid::Uuid::new_v4(), a: a.clone(), l, variant: app_variant, flag_timeout_ms: 10 };
            let got = run(&spec, &[(&a, MatrixKind::Spd)]);
            let v = volumes(App::Cholesky(model_variant), n, b, &Options::default());
            check(&format!("cholesky {model_variant:?} n={n} b={b}"), &v, got);
        }
    }
}

/// This implementation's LU bags solve the blocks below the diagonal as
/// tasks of their own: the model counts them so with
/// `Options::lu_parallel_solves`, and the thesis's serial factor step
/// without it (a different decomposition, so different counts).
#[test]
fn lu_volumes_are_the_tasks_reads_and_writes() {
    let implementation = Options { lu_parallel_solves: true, ..Options::default() };
    for (n, b) in PROBLEMS {
        let (a, lu) = (MatrixMeta::new("A", n, n, b), MatrixMeta::new("LU", n, n, b));
        let spec = JobSpec::Lu {
            job: uuid::Uuid::new_v4(),
            a: a.clone(),
            lu,
            pivot: false,
            schedule: LuSchedule::Bags,
            pivot_rule: Default::default(),
        };
        let got = run(&spec, &[(&a, MatrixKind::DiagDominant)]);
        check(&format!("lu n={n} b={b}"), &volumes(App::Lu { pivot: false }, n, b, &implementation), got);
        if a.block_rows() > 2 {
            let thesis = volumes(App::Lu { pivot: false }, n, b, &Options::default());
            assert_ne!(thesis.n_tasks, got.0, "n={n} b={b}: the thesis's factor step solves the column itself");
        }
    }
}

/// The model's dag simulation releases the tasks the dag Cholesky's own
/// code releases, in the same order, and waits for as many inputs.
#[test]
fn dag_successors_are_the_apps_own() {
    for p in 1..9u32 {
        for c in 0..p {
            for r in c..p {
                let apps: Vec<(u64, u64)> = apps::cholesky::successors(p, r, c).into_iter().map(|(i, j)| (i as u64, j as u64)).collect();
                assert_eq!(model::cholesky::dag_successors(p as u64, r as u64, c as u64), apps, "p={p} ({r},{c})");
            }
        }
        let t = model::Primitives::square(&Params::thesis_fast(), 100, &Options::default()).unwrap();
        let tasks = model::cholesky::dag_tasks(&t, p as u64, model::schedule::Overlap::NONE, Default::default());
        let inputs = model::simulate::inputs(&tasks);
        let mut k = 0;
        for j in 0..p {
            for i in j..p {
                assert_eq!(inputs[k], apps::cholesky::n_deps(i, j), "p={p} ({i},{j})");
                k += 1;
            }
        }
    }
}
