//! The step machinery against the thesis's closed forms: the sums over
//! tasks must give the printed equations, so a slip in either shows.

use model::schedule::Bounds;
use model::{cholesky, lu, matmul, predict, App, CholeskyCaching, MatmulCaching, Options, Params, Piecewise, Primitives, Variant};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

fn param_sets() -> Vec<Params> {
    vec![Params::thesis_fast(), Params::thesis_hp(), Params::thesis_atm().with_add_rate(4.5e6)]
}

/// Unlimited slaves, the thesis's organisation otherwise: the runs whose
/// `T∞` the closed forms give.
fn inf() -> Options {
    Options { slaves: u64::MAX, ..Options::default() }
}

fn run(app: App, p: u64, b: u64, params: &Params, o: &Options) -> (f64, Bounds) {
    let pr = predict(app, p * b, b, params, o).unwrap();
    (pr.t1, pr.t_inf)
}

#[test]
fn matmul_is_3_12_to_3_17() {
    for params in param_sets() {
        for p in 1..=25 {
            let b = 120;
            let t = Primitives::square(&params, b, &Options::default()).unwrap();
            let (t1, inf) = run(App::Matmul, p, b, &params, &Options::default());
            assert!(close(t1, matmul::t1_eq_3_12(&t, p)), "3.12 p={p}");
            assert!(close(inf.lwr, matmul::lwr_inf_eq_3_13(&t, p)), "3.13 p={p}");
            assert!(close(inf.upr, matmul::upr_inf_eq_3_14(&t, p)), "3.14 p={p}");
            for caching in [MatmulCaching::ServerBlockRow, MatmulCaching::ServerAll, MatmulCaching::SlaveBlockRow] {
                let o = Options { matmul_caching: caching, ..Options::default() };
                let rc = matmul::read_counts(caching, p, b, 1);
                let (t1, inf) = run(App::Matmul, p, b, &params, &o);
                assert!(close(t1, matmul::t1_eq_3_15(&t, p, &rc)), "3.15 {caching:?} p={p}");
                let want = matmul::bounds_inf_eq_3_16_17(&t, p, &rc);
                assert!(close(inf.lwr, want.lwr) && close(inf.upr, want.upr), "3.16/17 {caching:?} p={p}");
            }
        }
    }
}

/// Table 3.3: every organisation reads `2p³` blocks in all (§3.8.1, "the
/// total number of reads is proportional to p³").
#[test]
fn table_3_3_reads_add_up_to_2p3() {
    for p in 1..=20u64 {
        for caching in [
            MatmulCaching::None,
            MatmulCaching::ServerBlockOfA,
            MatmulCaching::ServerBlockRow,
            MatmulCaching::ServerAll,
            MatmulCaching::SlaveBlocks { c: p / 2 },
            MatmulCaching::SlaveBlockRow,
        ] {
            let rc = matmul::read_counts(caching, p, 100, 3.min(p));
            assert!(close(rc.n1 + rc.n2 + rc.n3, 2.0 * (p * p * p) as f64), "{caching:?} p={p}");
        }
    }
}

#[test]
fn cholesky_is_3_18_and_appendix_a() {
    for params in param_sets() {
        for p in 1..=30 {
            let b = 150;
            let t = Primitives::square(&params, b, &Options::default()).unwrap();
            for v in [Variant::SingleBag, Variant::MultiStep1, Variant::MultiStep2, Variant::Dag] {
                let (t1, inf) = run(App::Cholesky(v), p, b, &params, &Options::default());
                assert!(close(t1, cholesky::t1_eq_3_18(&t, p)), "3.18 {v:?} p={p}");
                assert!(inf.lwr <= inf.upr * (1.0 + 1e-12), "{v:?} p={p}: {inf:?}");
            }
            let (_, ms1) = run(App::Cholesky(Variant::MultiStep1), p, b, &params, &inf());
            assert!(close(ms1.upr, cholesky::multi_step1_upr_inf_eq_a15(&t, p)), "A.15 p={p}");
            assert!(ms1.lwr >= cholesky::multi_step1_lwr_inf_eq_a14(&t, p) * (1.0 - 1e-12), "A.14 p={p}");
            let (_, sb) = run(App::Cholesky(Variant::SingleBag), p, b, &params, &inf());
            assert!(sb.lwr >= cholesky::single_bag_lwr_inf(&t, p) * (1.0 - 1e-12), "A.7 p={p}");
            assert!(sb.upr <= cholesky::single_bag_upr_inf_eq_3_20(&t, p) * (1.0 + 1e-12), "A.10 p={p}");
            // (5.1): A.14's first term minus A.10 is (p−1)/2((p−2)(tmult+tsub) − 2tsolve).
            let pf = p as f64;
            let first = cholesky::tcomm(&t, p) + pf / 2.0 * (pf - 1.0) * (t.tmult + t.tsub()) + pf * t.tchol;
            let diff = first - cholesky::single_bag_upr_inf_eq_3_20(&t, p);
            let want = (pf - 1.0) / 2.0 * ((pf - 2.0) * (t.tmult + t.tsub()) - 2.0 * t.tsolve);
            assert!((diff - want).abs() < 1e-9 * first, "5.1 p={p}");
        }
    }
}

/// (3.24): multi-step(1) `lwr{T_s} = Σ T(j,j)₁ + Σ_j max{Σ_i(2j·tget+tput),
/// (1/s)Σ_i T(i,j)₁, T(i,j)₁}`, written out from A.11 and A.12.
#[test]
fn multi_step1_lwr_ts_is_3_24() {
    let params = Params::thesis_fast();
    let b = 300;
    let t = Primitives::square(&params, b, &Options::default()).unwrap();
    for p in [1u64, 2, 5, 16] {
        for s in [1u64, 2, 3, 7, 100] {
            let (pf, sf) = (p as f64, s as f64);
            let mut want = 0.0;
            for j in 1..=p {
                let jf = j as f64;
                want += jf * t.tget + (jf - 1.0) * (t.tmult + t.tsub()) + t.tchol + t.tput;
                if j < p {
                    let tij = 2.0 * jf * t.tget + (jf - 1.0) * (t.tmult + t.tsub()) + t.tsolve + t.tput;
                    let comm = (pf - jf) * (2.0 * jf * t.tget + t.tput);
                    want += comm.max((pf - jf) * tij / sf).max(tij);
                }
            }
            let pr = predict(App::Cholesky(Variant::MultiStep1), p * b, b, &params, &Options::with_slaves(s)).unwrap();
            assert!(close(pr.t_s.lwr, want), "p={p} s={s}: {} vs {want}", pr.t_s.lwr);
        }
    }
}

#[test]
fn lu_is_5_28_to_5_31_and_appendix_b() {
    for params in param_sets() {
        for p in 1..=30 {
            let b = 100;
            let t = Primitives::square(&params, b, &Options::default()).unwrap();
            assert!(close(lu::t1_piv_eq_b5(&t, p), lu::t1_nopiv_eq_5_29(&t, p) + lu::tpiv_eq_5_28(&t, p)), "B.5 p={p}");
            for pivot in [false, true] {
                let (t1, _) = run(App::Lu { pivot }, p, b, &params, &Options::default());
                let want = if pivot { lu::t1_piv_eq_b5(&t, p) } else { lu::t1_nopiv_eq_5_29(&t, p) };
                assert!(close(t1, want), "T1 pivot={pivot} p={p}: {t1} vs {want}");
                let (_, inf) = run(App::Lu { pivot }, p, b, &params, &inf());
                assert!(close(inf.upr, lu::upr_inf_eq_5_31(&t, p, pivot)), "5.31/B.9 pivot={pivot} p={p}");
                assert!(inf.lwr >= lu::lwr_inf_eq_5_30(&t, p, pivot) * (1.0 - 1e-12), "5.30/B.7 pivot={pivot} p={p}");
            }
        }
    }
}

/// Table 3.4 with (3.26) and (3.27), single-bag, with a store cache read
/// rate so that cached reads are not free.
#[test]
fn cholesky_caching_is_3_26_and_3_27() {
    let mut params = Params::thesis_fast();
    params.disk_get_cached = Some(Piecewise::new(50e6, 0.0));
    let b = 200;
    let t = Primitives::square(&params, b, &Options::default()).unwrap();
    for p in 1..=20 {
        for caching in [CholeskyCaching::None, CholeskyCaching::ServerBlockRow, CholeskyCaching::ServerAll] {
            let (n2, n3, _) = cholesky::read_counts_table_3_4(caching, p, p * b, b, 1);
            // Table 3.4: every organisation reads (p/6)(p+1)(2p+1) blocks in all.
            let pf = p as f64;
            assert!(close(n2 + n3, pf / 6.0 * (pf + 1.0) * (2.0 * pf + 1.0)), "{caching:?} p={p}");
            let o = Options { cholesky_caching: caching, ..Options::default() };
            let (t1, _) = run(App::Cholesky(Variant::SingleBag), p, b, &params, &o);
            assert!(close(t1, cholesky::t1_eq_3_26(&t, p, n2, n3)), "3.26 {caching:?} p={p}");
            let (_, inf) = run(App::Cholesky(Variant::SingleBag), p, b, &params, &Options { slaves: u64::MAX, ..o });
            assert!(inf.lwr >= cholesky::lwr_inf_eq_3_27(&t, p, n2, n3) * (1.0 - 1e-12), "3.27 {caching:?} p={p}");
        }
    }
}

/// Server double buffering, (5.6): `lwr{T∞} = max{max{(N₂+N₃+p²)tcom,
/// N₃tdget + p²tdput}, T₁/p²}`; single-slave time unchanged.
#[test]
fn server_double_buffering_is_5_6() {
    let params = Params::thesis_atm();
    let b = 500;
    let t = Primitives::square(&params, b, &Options::default()).unwrap();
    for p in 1..=20u64 {
        for caching in [MatmulCaching::None, MatmulCaching::ServerBlockRow] {
            let o = Options { matmul_caching: caching, server_double_buffer: true, ..Options::default() };
            let rc = matmul::read_counts(caching, p, b, 1);
            let pf = p as f64;
            let t1 = matmul::t1_eq_3_15(&t, p, &rc);
            let want = ((rc.n2 + rc.n3 + pf * pf) * t.tcom).max(rc.n3 * t.tdget + pf * pf * t.tdput).max(t1 / (pf * pf));
            let (got_t1, inf) = run(App::Matmul, p, b, &params, &o);
            assert!(close(got_t1, t1), "T1 unchanged p={p}");
            assert!(close(inf.lwr, want), "5.6 {caching:?} p={p}: {} vs {want}", inf.lwr);
        }
    }
}

/// Slave multithreading (§5.5.2): for multiply
/// `T₁ = max{N₂tget2 + N₃tget3 + p²tput, p³(tmult + tadd)}` (for p ≥ 2, where
/// no single task dominates).
#[test]
fn slave_overlap_t1_is_section_5_5_2() {
    for params in param_sets() {
        let b = 300;
        let t = Primitives::square(&params, b, &Options::default()).unwrap();
        for p in 2..=20u64 {
            let pf = p as f64;
            let rc = matmul::read_counts(MatmulCaching::None, p, b, 1);
            let want = (rc.n3 * t.tget + pf * pf * t.tput).max(pf * pf * pf * (t.tmult + t.tadd));
            let o = Options { slave_overlap: true, ..Options::default() };
            let (t1, _) = run(App::Matmul, p, b, &params, &o);
            assert!(close(t1, want), "p={p}: {t1} vs {want}");
        }
    }
}

/// Partial slave overlap (extension): a share `f` of the transfers hides
/// behind compute, the rest adds: `max(comp, f·io) + (1 − f)·io`, between
/// §5.5.2's full overlap (f = 1) and none (f = 0).
#[test]
fn partial_slave_overlap_lies_between_none_and_full() {
    for params in param_sets() {
        let b = 300;
        let t = Primitives::square(&params, b, &Options::default()).unwrap();
        for p in 2..=12u64 {
            let pf = p as f64;
            let rc = matmul::read_counts(MatmulCaching::None, p, b, 1);
            let io = rc.n3 * t.tget + pf * pf * t.tput;
            let comp = pf * pf * pf * (t.tmult + t.tadd);
            for f in [0.0, 0.5, 1.0] {
                let o = Options { slave_overlap: true, slave_overlap_share: f, ..Options::default() };
                let (t1, _) = run(App::Matmul, p, b, &params, &o);
                let want = comp.max(f * io) + (1.0 - f) * io;
                assert!(close(t1, want), "p={p} f={f}: {t1} vs {want}");
            }
            let none = run(App::Matmul, p, b, &params, &Options::default()).0;
            let o = Options { slave_overlap: true, slave_overlap_share: 0.0, ..Options::default() };
            assert!(close(run(App::Matmul, p, b, &params, &o).0, none), "p={p}: share 0 is no overlap");
        }
    }
}

/// §5.2: "In the case of the ATM configuration ... the limiting bandwidth is
/// twice that for a single node ... The asymptotic performance for block
/// size 750 is then 641 Mflop/s": two store nodes halve the store's busy
/// time.
#[test]
fn atm_two_store_nodes_give_641_mflops() {
    let o = Options { slaves: u64::MAX, store_nodes: 2, ..Options::default() };
    let pr = predict(App::Matmul, 750 * 400, 750, &Params::thesis_atm(), &o).unwrap();
    let rate = pr.flops / pr.t_inf.lwr / 1e6;
    assert!((rate - 641.0).abs() / 641.0 < 0.01, "{rate}");
}

/// The shared-CPU extension slows compute by (s + store share)/cores once
/// the slaves and the store outnumber the cores, and leaves transfers
/// alone. The store's share is the fraction of the predicted run it is
/// busy, so the run is a fixed point: with the store busy `W` seconds and
/// `s` slaves on `c` cores, `T = (W + k·TCOMP)/s` where
/// `k = (s + W/T)/c`, the positive root of
/// `s·c·T² − (c·W + s·TCOMP)·T − W·TCOMP = 0`.
#[test]
fn shared_cpu_slows_compute_only() {
    let params = Params::thesis_fast();
    let plain = predict(App::Matmul, 3000, 300, &params, &Options::with_slaves(4)).unwrap();
    let o = Options { shared_cpu: Some(model::SharedCpu { cores: 2, store_share: 1.0 }), ..Options::with_slaves(4) };
    let shared = predict(App::Matmul, 3000, 300, &params, &o).unwrap();
    let t = Primitives::square(&params, 300, &Options::default()).unwrap();
    let comp = 1000.0 * (t.tmult + t.tadd);
    let io = plain.t1 - comp;
    // One slave with the store on 2 cores: no slow-down.
    assert!(close(shared.t1, plain.t1));
    // Four slaves + store on 2 cores. The store is the thesis's bottleneck
    // here (`W` is the unshared lower bound): spread over its own bound it
    // would be busy all the time and compute 2.5 times slower.
    assert!(close(plain.t_inf.lwr, io));
    let (s, c) = (4.0, 2.0);
    let (qa, qb, qc) = (s * c, -(c * io + s * comp), -io * comp);
    let run = (-qb + (qb * qb - 4.0 * qa * qc).sqrt()) / (2.0 * qa);
    assert!((shared.t_s.lwr - run).abs() < 1e-3 * run, "{} vs {run}", shared.t_s.lwr);
    let slowdown = (s + io / run) / c;
    assert!(slowdown > 2.0 && slowdown < 2.5, "{slowdown}");
    assert!(close(run, (io + slowdown * comp) / s));
}
