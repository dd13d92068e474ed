//! Blocked matrix multiply `C = A·B`, one task per C block (thesis §3.8.1,
//! eqs. 3.12–3.17, Table 3.3).

use crate::options::{MatmulCaching, Options};
use crate::params::ELEMENT_BYTES;
use crate::primitives::Primitives;
use crate::schedule::{Bounds, Step, TaskCost};
use crate::volumes::Volumes;

/// Block reads from slave memory (`N₁`), server memory (`N₂`) and disk
/// (`N₃`), and the extra memory needed (`m₁` per slave, `m₂` at the server),
/// Table 3.3.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadCounts {
    /// Reads satisfied in slave memory.
    pub n1: f64,
    /// Reads satisfied in server memory.
    pub n2: f64,
    /// Reads from disk.
    pub n3: f64,
    /// Extra slave memory, bytes.
    pub m1: f64,
    /// Extra server memory, bytes.
    pub m2: f64,
}

/// Table 3.3 for `p` blocks per side, block width `b`, `s` slaves.
pub fn read_counts(caching: MatmulCaching, p: u64, b: u64, s: u64) -> ReadCounts {
    let (p, b, s) = (p as f64, b as f64, s.max(1) as f64);
    let n = p * b;
    let p3 = p * p * p;
    let zero = ReadCounts { n1: 0.0, n2: 0.0, n3: 0.0, m1: 0.0, m2: 0.0 };
    match caching {
        MatmulCaching::None => ReadCounts { n3: 2.0 * p3, ..zero },
        MatmulCaching::ServerBlockOfA => ReadCounts { n2: p3 / s * (s - 1.0), n3: p3 / s * (s + 1.0), m2: ELEMENT_BYTES * b * b, ..zero },
        MatmulCaching::ServerBlockRow => {
            ReadCounts { n2: p * p * (p - 1.0), n3: p * p * (p + 1.0), m2: ELEMENT_BYTES * n * b * (1.0 + s), ..zero }
        }
        MatmulCaching::ServerAll => ReadCounts { n2: 2.0 * p * p * (p - 1.0), n3: 2.0 * p * p, m2: 2.0 * ELEMENT_BYTES * n * n, ..zero },
        MatmulCaching::SlaveBlocks { c } => {
            let c = (c as f64).min(p);
            ReadCounts { n1: c * p * (p - 1.0), n3: p * (2.0 * p * p - c * p + c), m1: ELEMENT_BYTES * c * b * b, ..zero }
        }
        MatmulCaching::SlaveBlockRow => ReadCounts { n1: p * p * (p - 1.0), n3: p * p * (p + 1.0), m1: ELEMENT_BYTES * n * b, ..zero },
        MatmulCaching::SlaveAll => ReadCounts {
            // p²(2p−1−s) is Table 3.3's count; it needs s ≤ 2p−1.
            n1: (p * p * (2.0 * p - 1.0 - s)).max(0.0),
            n3: (p * p * (1.0 + s)).min(2.0 * p3),
            m1: ELEMENT_BYTES * n * (n + b),
            ..zero
        },
    }
}

/// `T₁ = p²(2p·tget + tput + p(tmult + tadd))` (3.12), no caching.
pub fn t1_eq_3_12(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p * p * (2.0 * p * t.tget + t.tput + p * (t.tmult + t.tadd))
}

/// `lwr{T∞} = max{T₁/p², p²(2p·tget + tput)}` (3.13).
pub fn lwr_inf_eq_3_13(t: &Primitives, p: u64) -> f64 {
    let pf = p as f64;
    (t1_eq_3_12(t, p) / (pf * pf)).max(pf * pf * (2.0 * pf * t.tget + t.tput))
}

/// `upr{T∞} = p²(2p·tget + tput) + p(tmult + tadd)` (3.14).
pub fn upr_inf_eq_3_14(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p * p * (2.0 * p * t.tget + t.tput) + p * (t.tmult + t.tadd)
}

/// `T₁ = N₁tget1 + N₂tget2 + N₃tget3 + p²(tput + p(tmult + tadd))` (3.15),
/// with `tget1 = 0`, `tget2 = tget_cached`, `tget3 = tget`.
pub fn t1_eq_3_15(t: &Primitives, p: u64, rc: &ReadCounts) -> f64 {
    let pf = p as f64;
    rc.n2 * t.tget_cached + rc.n3 * t.tget + pf * pf * (t.tput + pf * (t.tmult + t.tadd))
}

/// (3.16)–(3.17), lost in the extracted text, by analogy with (3.13)–(3.14)
/// and (5.6): `lwr{T∞} = max{N₂tget2 + N₃tget3 + p²tput, T₁/p²}`,
/// `upr{T∞} = N₂tget2 + N₃tget3 + p²tput + p(tmult + tadd)`.
pub fn bounds_inf_eq_3_16_17(t: &Primitives, p: u64, rc: &ReadCounts) -> Bounds {
    let pf = p as f64;
    let comm = rc.n2 * t.tget_cached + rc.n3 * t.tget + pf * pf * t.tput;
    Bounds { lwr: comm.max(t1_eq_3_15(t, p, rc) / (pf * pf)), upr: comm + pf * (t.tmult + t.tadd) }
}

/// The single bag: `p²` identical tasks with the reads of Table 3.3 shared
/// out evenly.
pub fn steps(t: &Primitives, p: u64, b: u64, options: &Options) -> Vec<Step> {
    let rc = read_counts(options.matmul_caching, p, b, options.slaves);
    let pf = p as f64;
    let tasks = pf * pf;
    let cost = TaskCost {
        disk: (rc.n3 * t.tdget + rc.n2 * t.tdget_cached) / tasks + t.tdput,
        net: (rc.n2 + rc.n3) / tasks * t.tcom_read + t.tcom,
        // A(i,1) and B(1,j) before the first multiply.
        comp: pf * (t.tmult + t.tadd) + 2.0 * t.tlead_extra,
        put: t.tdput + t.tcom,
        put_net: t.tcom,
        tail: t.tmult + t.tadd,
        at_slave: (rc.n2 + rc.n3) / tasks * t.tcom_at_slave,
        lead: 2.0 * t.tget,
    };
    let mut step = Step::default();
    step.push(p * p, cost);
    vec![step]
}

/// Tasks, reads and writes. Edge blocks are counted at their real size.
pub fn volumes(n: u64, b: u64, caching: MatmulCaching, s: u64) -> Volumes {
    let p = n.div_ceil(b);
    let nf = n as f64;
    // Task (i,j) reads A(i,k) and B(k,j) for every k: Σ_ijk (w_i w_k + w_k w_j)
    // = 2p·n² elements when nothing is cached.
    let all_reads = 2.0 * p as f64 * nf * nf;
    let rc = read_counts(caching, p, b, s);
    let remote = (rc.n2 + rc.n3) / (rc.n1 + rc.n2 + rc.n3);
    Volumes {
        n_tasks: p * p,
        input_bytes: 2.0 * ELEMENT_BYTES * nf * nf,
        n_gets: (rc.n2 + rc.n3).round() as u64,
        get_bytes: ELEMENT_BYTES * all_reads * remote,
        n_puts: p * p,
        put_bytes: ELEMENT_BYTES * nf * nf,
    }
}

/// Flop count `2n³`.
pub fn flops(n: u64) -> f64 {
    2.0 * (n as f64).powi(3)
}

/// Memory per slave: three blocks for a block dot product (§5.3,
/// `m = 3·8b²`), twice with slave overlap, plus Table 3.3's `m₁`.
pub fn memory_per_slave(n: u64, b: u64, options: &Options) -> f64 {
    let p = n.div_ceil(b);
    let base = 3.0 * ELEMENT_BYTES * (b * b) as f64;
    let k = if options.slave_overlap { 2.0 } else { 1.0 };
    k * base + read_counts(options.matmul_caching, p, b, options.slaves).m1
}
