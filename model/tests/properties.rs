//! Property tests over random n, b, s (issue 6, test 2): bounds are ordered,
//! `T_s` does not grow with `s`, and the data volumes are those of the
//! tasks' real reads and writes, enumerated here task by task (and, in
//! `bench/tests/model_volumes.rs`, counted from the apps' own tasks).

use std::collections::BTreeSet;

use model::{block_widths, predict, App, Options, Params, Piecewise, Variant};
use proptest::prelude::*;

/// Bytes read and written by the tasks of `app`, enumerated from the
/// algorithms as the thesis writes them (Figs. 2.5, 2.7, 5.28, B.1): each
/// task reads each distinct input block once and writes its output blocks.
/// Returns (tasks, gets, get bytes, puts, put bytes).
fn enumerate(app: App, n: u64, b: u64) -> (u64, u64, f64, u64, f64) {
    let w = block_widths(n, b);
    let p = w.len();
    let size = |i: usize, j: usize| 8.0 * w[i] * w[j];
    let mut out = (0u64, 0u64, 0.0, 0u64, 0.0);
    let mut task = |reads: BTreeSet<(char, usize, usize)>, writes: &[(usize, usize)]| {
        out.0 += 1;
        for &(_, i, j) in &reads {
            out.1 += 1;
            out.2 += size(i, j);
        }
        for &(i, j) in writes {
            out.3 += 1;
            out.4 += size(i, j);
        }
    };
    match app {
        App::Matmul => {
            for i in 0..p {
                for j in 0..p {
                    let reads = (0..p).flat_map(|k| [('A', i, k), ('B', k, j)]).collect();
                    task(reads, &[(i, j)]);
                }
            }
        }
        App::Cholesky(_) => {
            for j in 0..p {
                for i in j..p {
                    let mut reads: BTreeSet<_> = [('A', i, j)].into();
                    for k in 0..j {
                        reads.insert(('G', i, k));
                        reads.insert(('G', j, k));
                    }
                    if i > j {
                        reads.insert(('G', j, j));
                    }
                    task(reads, &[(i, j)]);
                }
            }
        }
        App::Lu { pivot } => {
            assert!(!pivot, "pivoting volumes are checked against (5.26)-(5.28) instead");
            for k in 0..p {
                for i in k..p {
                    let mut reads: BTreeSet<_> = [('A', i, k)].into();
                    for j in 0..k {
                        reads.insert(('L', i, j));
                        reads.insert(('U', j, k));
                    }
                    task(reads, &[(i, k)]);
                }
                let col: Vec<_> = (k..p).map(|i| (i, k)).collect();
                task(col.iter().map(|&(i, k)| ('X', i, k)).collect(), &col);
                for j in k + 1..p {
                    let mut reads: BTreeSet<_> = [('A', k, j), ('L', k, k)].into();
                    for i in 0..k {
                        reads.insert(('L', k, i));
                        reads.insert(('U', i, j));
                    }
                    task(reads, &[(k, j)]);
                }
            }
        }
        App::Raytrace => unreachable!(),
    }
    out
}

fn params_strategy() -> impl Strategy<Value = Params> {
    (0.1f64..10.0, 0.1f64..10.0, 0.1f64..10.0, 0.1f64..10.0).prop_map(|(kp, kc, kg, ku)| {
        let f = Params::thesis_fast();
        let sc = |x: Piecewise, k: f64| Piecewise::new(x.bandwidth * k, x.threshold);
        Params { multiply: sc(f.multiply, kp), network: sc(f.network, kc), disk_get: sc(f.disk_get, kg), disk_put: sc(f.disk_put, ku), ..f }
    })
}

fn options_strategy() -> impl Strategy<Value = Options> {
    (any::<bool>(), any::<bool>(), 1u64..=3, any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(server, slave, v, slave_reads, syrk, lu_parallel_solves, simulate_dag, simulate_steps)| Options {
            server_double_buffer: server,
            slave_overlap: slave,
            store_nodes: v,
            slave_reads,
            diagonal_syrk: syrk,
            lu_parallel_solves,
            simulate_dag,
            simulate_steps,
            ..Options::default()
        },
    )
}

/// `n` and `b` with at most 40 blocks per side (to keep the graph walks short).
fn problem() -> impl Strategy<Value = (u64, u64)> {
    (1u64..=3000, 1u64..=40).prop_map(|(n, p)| (n, n.div_ceil(p.min(n))))
}

const EPS: f64 = 1e-9;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bounds_are_ordered_and_ts_does_not_grow((n, b) in problem(), s in 1u64..64, params in params_strategy(), options in options_strategy()) {
        for app in App::ALL {
            let at = |s: u64| predict(app, n, b, &params, &Options { slaves: s, ..options.clone() }).unwrap();
            let (x, y) = (at(s), at(s + 1));
            for pr in [&x, &y] {
                prop_assert!(pr.t_inf.lwr <= pr.t_inf.upr * (1.0 + EPS), "{app} T∞ {:?}", pr.t_inf);
                prop_assert!(pr.t_s.lwr <= pr.t_s.upr * (1.0 + EPS), "{app} s={} T_s {:?}", pr.slaves, pr.t_s);
                prop_assert!(pr.t_s.lwr <= pr.predicted * (1.0 + EPS) && pr.predicted <= pr.t_s.upr.max(pr.t_s.lwr) * (1.0 + EPS), "{app} s={} predicted {} outside {:?}", pr.slaves, pr.predicted, pr.t_s);
                prop_assert!(pr.t_s.lwr >= pr.t1 / pr.slaves as f64 * (1.0 - EPS), "{app}: lwr{{T_s}} < T1/s");
                prop_assert!(pr.t_s.lwr >= pr.t_inf.lwr * (1.0 - EPS), "{app}: lwr{{T_s}} < lwr{{T∞}}");
                prop_assert!(pr.t_s.upr <= pr.t1 * (1.0 + EPS) || options.slave_overlap, "{app}: upr{{T_s}} > T1");
                prop_assert!(pr.recovery.average <= pr.recovery.worst * (1.0 + EPS) + 1e-12, "{app}: {:?}", pr.recovery);
            }
            prop_assert!(y.t_s.lwr <= x.t_s.lwr * (1.0 + EPS), "{app} lwr grew: s={s} {} -> {}", x.t_s.lwr, y.t_s.lwr);
            prop_assert!(y.t_s.upr <= x.t_s.upr * (1.0 + EPS), "{app} upr grew: s={s} {} -> {}", x.t_s.upr, y.t_s.upr);
            // One slave: the bounds close on T1 (without slave overlap).
            if !options.slave_overlap {
                let one = at(1);
                prop_assert!((one.t_s.lwr - one.t1).abs() <= EPS * one.t1 && (one.t_s.upr - one.t1).abs() <= EPS * one.t1, "{app}: {:?} vs {}", one.t_s, one.t1);
            }
        }
    }

    #[test]
    fn volumes_are_the_tasks_reads_and_writes((n, b) in problem()) {
        let params = Params::thesis_fast();
        for app in [App::Matmul, App::Cholesky(Variant::SingleBag), App::Cholesky(Variant::Dag), App::Lu { pivot: false }] {
            let v = predict(app, n, b, &params, &Options::default()).unwrap().volumes;
            let (tasks, gets, get_bytes, puts, put_bytes) = enumerate(app, n, b);
            prop_assert_eq!(v.n_tasks, tasks, "{} tasks", app);
            prop_assert_eq!(v.n_gets, gets, "{} gets", app);
            prop_assert_eq!(v.n_puts, puts, "{} puts", app);
            prop_assert!((v.get_bytes - get_bytes).abs() <= 1e-9 * get_bytes.max(1.0), "{} get bytes {} vs {}", app, v.get_bytes, get_bytes);
            prop_assert!((v.put_bytes - put_bytes).abs() <= 1e-9 * put_bytes.max(1.0), "{} put bytes {} vs {}", app, v.put_bytes, put_bytes);
        }
        // Pivoting adds Σ_k p(2p−2k+1) = p³ reads and Σ_k p(p−k+1) = p²(p+1)/2 writes (5.26, 5.27).
        let p = n.div_ceil(b);
        let (a, c) = (
            predict(App::Lu { pivot: false }, n, b, &params, &Options::default()).unwrap().volumes,
            predict(App::Lu { pivot: true }, n, b, &params, &Options::default()).unwrap().volumes,
        );
        let extra_gets: u64 = (1..=p).map(|k| p * (2 * p - 2 * k + 1)).sum();
        let extra_puts: u64 = (1..=p).map(|k| p * (p - k + 1)).sum();
        prop_assert_eq!(c.n_gets - a.n_gets, extra_gets);
        prop_assert_eq!(c.n_puts - a.n_puts, extra_puts);
        // Ray tracing writes every pixel once, 24 bytes each.
        let r = predict(App::Raytrace, n, b, &params, &Options::default()).unwrap().volumes;
        prop_assert_eq!(r.put_bytes, 24.0 * (n * n) as f64);
        prop_assert_eq!(r.n_tasks, p);
    }

    #[test]
    fn recommended_block_fits_the_budget(n in 100u64..20_000, s in 1u64..32, mib in 8u64..512) {
        let budget = (mib as f64) * 1024.0 * 1024.0 * s as f64;
        let o = Options::with_slaves(s);
        if let Ok(r) = model::recommend(App::Matmul, n, budget, model::MemoryLayout::NoCache, &Params::thesis_fast(), &o) {
            prop_assert!(r.b as f64 <= r.b_max);
            prop_assert!(r.prediction.memory_per_slave * s as f64 <= budget * (1.0 + 1e-9));
        }
    }
}

/// The dag Cholesky's dependency releases are the tasks' reads of blocks
/// another task wrote (`G`, not the input `A`), enumerated as above.
#[test]
fn dag_releases_are_the_reads_of_written_blocks() {
    for p in 1u64..20 {
        let mut g_reads = 0u64;
        for j in 0..p {
            for i in j..p {
                let mut reads = BTreeSet::new();
                for k in 0..j {
                    reads.insert((i, k));
                    reads.insert((j, k));
                }
                if i > j {
                    reads.insert((j, j));
                }
                g_reads += reads.len() as u64;
            }
        }
        assert_eq!(model::cholesky::dag_releases(p), g_reads, "p={p}");
    }
}
