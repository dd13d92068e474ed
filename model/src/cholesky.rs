//! Left-looking blocked Cholesky `A = G·Gᵀ`, one task per lower block
//! (thesis §3.8.2, eqs. 3.18–3.27, App. A, Table 3.4), in the thesis's three
//! synchronisation variants and a dependency-driven one.

use serde::{Deserialize, Serialize};

use crate::options::{CholeskyCaching, Options};
use crate::params::ELEMENT_BYTES;
use crate::primitives::Primitives;
use crate::schedule::{Bounds, Step, TaskCost};
use crate::volumes::{block_widths, Volumes};

/// How the tasks are synchronised (thesis §2.4.8, Fig. 2.8; DESIGN §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Variant {
    /// One ordered bag, per-block ready flags.
    SingleBag,
    /// `2p−1` bags: each diagonal task alone, then its column's solves.
    MultiStep1,
    /// The diagonal task `(j+1,j+1)` merged with `(j+1,j)`.
    MultiStep2,
    /// Beyond the thesis: a task's commit enqueues the successors whose last
    /// input it produced, so no slave waits on a flag and there are no
    /// barriers. Bounded by the critical path and by `T₁/s`.
    Dag,
}

fn ops(t: &Primitives) -> f64 {
    t.tmult + t.tsub()
}

/// Cost of the diagonal task `(j,j)` (A.11):
/// `j·tget + (j−1)(tmult+tsub) + tchol + tput`, with `tdiag_update` for
/// `tmult` (a dsyrk under [`Options::diagonal_syrk`]).
pub fn diag_task(t: &Primitives, j: u64) -> TaskCost {
    let jf = j as f64;
    // Its block and, to update it, L(j,1) (`apps::cholesky` order).
    let lead = jf.min(2.0);
    TaskCost {
        disk: jf * t.tdget + t.tdput,
        net: jf * t.tcom_read + t.tcom,
        comp: (jf - 1.0) * (t.tdiag_update + t.tsub()) + t.tchol + lead * t.tlead_extra,
        put: t.tdput + t.tcom,
        put_net: t.tcom,
        tail: t.tchol,
        at_slave: jf * t.tcom_at_slave,
        lead: lead * t.tget,
    }
}

/// Cost of an off-diagonal task `(i,j)`, `i > j` (A.12):
/// `2j·tget + (j−1)(tmult+tsub) + tsolve + tput`.
pub fn off_task(t: &Primitives, j: u64) -> TaskCost {
    let jf = j as f64;
    // Its block and a pair to update it, or L(j,j) to solve it.
    let lead = if j > 1 { 3.0 } else { 2.0 };
    TaskCost {
        disk: 2.0 * jf * t.tdget + t.tdput,
        net: 2.0 * jf * t.tcom_read + t.tcom,
        comp: (jf - 1.0) * ops(t) + t.tsolve + lead * t.tlead_extra,
        put: t.tdput + t.tcom,
        put_net: t.tcom,
        tail: t.tsolve,
        at_slave: 2.0 * jf * t.tcom_at_slave,
        lead: lead * t.tget,
    }
}

/// `T₁ = (p/6)(p+1)(2p+1)tget + (p/2)(p+1)tput + (p/6)(p²−1)(tmult+tsub)
/// + (p/2)(p−1)tsolve + p·tchol` (3.18 = A.6 = A.13).
pub fn t1_eq_3_18(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p / 6.0 * (p + 1.0) * (2.0 * p + 1.0) * t.tget
        + p / 2.0 * (p + 1.0) * t.tput
        + p / 6.0 * (p * p - 1.0) * ops(t)
        + p / 2.0 * (p - 1.0) * t.tsolve
        + p * t.tchol
}

/// `Tcomm = (p/6)(p+1)(2p+1)tget + (p/2)(p+1)tput` (App. A.1.2).
pub fn tcomm(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p / 6.0 * (p + 1.0) * (2.0 * p + 1.0) * t.tget + p / 2.0 * (p + 1.0) * t.tput
}

/// Single-bag `lwr{T∞}`: the maximum of `Tcomm`, the average task
/// `T₁/(p(p+1)/2)` (A.7) and the two longest tasks `T(p,p−1)`, `T(p,p)`
/// (App. A.1.2).
pub fn single_bag_lwr_inf(t: &Primitives, p: u64) -> f64 {
    let pf = p as f64;
    let mut lwr = tcomm(t, p).max(t1_eq_3_18(t, p) / (pf * (pf + 1.0) / 2.0));
    lwr = lwr.max(diag_task(t, p).total());
    if p > 1 {
        lwr = lwr.max(off_task(t, p - 1).total());
    }
    lwr
}

/// Single-bag `upr{T∞} = Tcomm + (p−1)(tmult+tsub+tsolve) + p·tchol`
/// (3.20 = A.10).
pub fn single_bag_upr_inf_eq_3_20(t: &Primitives, p: u64) -> f64 {
    let pf = p as f64;
    tcomm(t, p) + (pf - 1.0) * (ops(t) + t.tsolve) + pf * t.tchol
}

/// Multi-step(1) `lwr{T∞}` (A.14), the thesis's relaxed closed form.
pub fn multi_step1_lwr_inf_eq_a14(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    let a = p / 6.0 * (p + 1.0) * (2.0 * p + 1.0) * t.tget + p / 2.0 * (p - 1.0) * ops(t) + p * t.tchol + p / 2.0 * (p + 1.0) * t.tput;
    let b =
        p / 2.0 * (3.0 * p - 1.0) * t.tget + (p - 1.0) * (p - 1.0) * ops(t) + (p - 1.0) * t.tsolve + p * t.tchol + (2.0 * p - 1.0) * t.tput;
    a.max(b)
}

/// Multi-step(1) `upr{T∞} = Tcomm + (p−1)²(tmult+tsub) + p·tchol +
/// (p−1)tsolve` (A.15; the looser (3.23) has `p(p−1)` and `p·tsolve`).
pub fn multi_step1_upr_inf_eq_a15(t: &Primitives, p: u64) -> f64 {
    let pf = p as f64;
    tcomm(t, p) + (pf - 1.0) * (pf - 1.0) * ops(t) + pf * t.tchol + (pf - 1.0) * t.tsolve
}

/// Block reads `(N₂, N₃)` and server memory `m₂` of Table 3.4.
pub fn read_counts_table_3_4(caching: CholeskyCaching, p: u64, n: u64, b: u64, s: u64) -> (f64, f64, f64) {
    let (p, n, b, s) = (p as f64, n as f64, b as f64, s as f64);
    match caching {
        CholeskyCaching::None => (0.0, p / 6.0 * (p + 1.0) * (2.0 * p + 1.0), 0.0),
        CholeskyCaching::ServerBlockRow => (p / 6.0 * (p * p - 1.0), p / 6.0 * (p + 1.0) * (p + 2.0), 16.0 * n * b * s),
        CholeskyCaching::ServerAll => (p / 3.0 * (p * p - 1.0), p / 2.0 * (p + 1.0), 16.0 * n * n),
    }
}

/// The primitives with every read costing the Table 3.4 mix of cached and
/// disk reads: `tdget ← (N₂·tdget_cached + N₃·tdget)/(N₂ + N₃)`.
pub fn with_caching(t: &Primitives, caching: CholeskyCaching, p: u64, n: u64, b: u64, s: u64) -> Primitives {
    let (n2, n3, _) = read_counts_table_3_4(caching, p, n, b, s);
    if n2 + n3 == 0.0 {
        return *t;
    }
    let tdget = (n2 * t.tdget_cached + n3 * t.tdget) / (n2 + n3);
    Primitives { tdget, tget: tdget + t.tcom_read, ..*t }
}

/// `T₁` with cached reads (3.26).
pub fn t1_eq_3_26(t: &Primitives, p: u64, n2: f64, n3: f64) -> f64 {
    let pf = p as f64;
    n2 * t.tget_cached
        + n3 * t.tget
        + pf / 6.0 * (pf * pf - 1.0) * ops(t)
        + pf / 2.0 * (pf - 1.0) * t.tsolve
        + pf * t.tchol
        + pf / 2.0 * (pf + 1.0) * t.tput
}

/// Single-bag `lwr{T∞}` with cached reads (3.27).
pub fn lwr_inf_eq_3_27(t: &Primitives, p: u64, n2: f64, n3: f64) -> f64 {
    let pf = p as f64;
    (n2 * t.tget_cached + n3 * t.tget + pf / 2.0 * (pf + 1.0) * t.tput).max(t1_eq_3_26(t, p, n2, n3) / (pf / 2.0 * (pf + 1.0)))
}

/// Barrier steps of the multi-step variants: multi-step(1) is
/// `T(1,1) | col 1 | T(2,2) | col 2 | …`; multi-step(2) is
/// `T(1,1) | {T(2,1)+T(2,2), T(3..p,1)} | {T(3,2)+T(3,3), T(4..p,2)} | …`
/// (3.24, 3.25; the thesis's (3.25) leaves out the first task `T(1,1)`,
/// which this includes). Single-bag and dag give one step of all tasks.
pub fn steps(t: &Primitives, p: u64, variant: Variant) -> Vec<Step> {
    let mut steps = Vec::new();
    match variant {
        Variant::MultiStep1 => {
            for j in 1..=p {
                steps.push(Step::single(diag_task(t, j)));
                if j < p {
                    let mut col = Step::default();
                    col.push(p - j, off_task(t, j));
                    steps.push(col);
                }
            }
        }
        Variant::MultiStep2 => {
            steps.push(Step::single(diag_task(t, 1)));
            for j in 1..p {
                let (o, d) = (off_task(t, j), diag_task(t, j + 1));
                let mut st = Step::single(TaskCost {
                    disk: o.disk + d.disk,
                    net: o.net + d.net,
                    comp: o.comp + d.comp,
                    put: o.put + d.put,
                    put_net: o.put_net + d.put_net,
                    tail: d.tail,
                    at_slave: o.at_slave + d.at_slave,
                    // The diagonal part reads on while the off part computes.
                    lead: o.lead,
                });
                st.push(p - j - 1, o);
                steps.push(st);
            }
        }
        Variant::SingleBag | Variant::Dag => {
            let mut all = Step::default();
            for j in 1..=p {
                all.push(1, diag_task(t, j));
                all.push(p - j, off_task(t, j));
            }
            steps.push(all);
        }
    }
    steps
}

/// Longest chains of the task graph (`(i,j)` needs `(i,k)`, `(j,k)` for
/// `k < j`, and `(j,j)` if `i > j`): `(whole tasks, compute only)`.
pub fn critical_paths(t: &Primitives, p: u64) -> (f64, f64) {
    (chain_of(t, p, &TaskCost::total), chain_of(t, p, &|c: &TaskCost| c.comp))
}

/// The longest chain of dependent tasks, each weighing `w`.
fn chain_of(t: &Primitives, p: u64, w: &dyn Fn(&TaskCost) -> f64) -> f64 {
    let p = p as usize;
    // row_max[i] = max over k < j of F(i,k), for the current column j.
    let mut row_max = vec![0.0f64; p + 1];
    let mut longest = 0.0f64;
    for j in 1..=p {
        let fjj = w(&diag_task(t, j as u64)) + row_max[j];
        let off = w(&off_task(t, j as u64));
        let mut col = vec![(j, fjj)];
        for (i, rm) in row_max.iter().enumerate().skip(j + 1) {
            col.push((i, off + rm.max(row_max[j]).max(fjj)));
        }
        for (i, f) in col {
            row_max[i] = row_max[i].max(f);
            longest = longest.max(f);
        }
    }
    longest
}

/// Tasks, reads and writes; edge blocks counted at their real size.
/// Multi-step(2) merges `p−1` pairs of tasks; the merged task reads what its
/// two parts read, as in the thesis's counts.
pub fn volumes(n: u64, b: u64, variant: Variant) -> Volumes {
    let w = block_widths(n, b);
    let p = w.len();
    let (mut gets, mut get_el, mut put_el) = (0u64, 0.0, 0.0);
    let mut prefix = 0.0; // Σ_{k<j} w_k
    for j in 0..p {
        for i in j..p {
            put_el += w[i] * w[j];
            get_el += w[i] * w[j] + (w[i] + if i > j { w[j] } else { 0.0 }) * prefix;
            gets += 1 + j as u64 * if i > j { 2 } else { 1 };
            if i > j {
                get_el += w[j] * w[j];
                gets += 1;
            }
        }
        prefix += w[j];
    }
    let pu = p as u64;
    let merged = if variant == Variant::MultiStep2 { pu - 1 } else { 0 };
    Volumes {
        n_tasks: pu * (pu + 1) / 2 - merged,
        input_bytes: ELEMENT_BYTES * put_el,
        n_gets: gets,
        get_bytes: ELEMENT_BYTES * get_el,
        n_puts: pu * (pu + 1) / 2,
        put_bytes: ELEMENT_BYTES * put_el,
    }
}

/// Dependency releases of the dag variant over the whole job: each task
/// decrements one counter per input another task wrote, `j` on the
/// diagonal and `2j + 1` below it (`apps::cholesky::n_deps`).
pub fn dag_releases(p: u64) -> u64 {
    (0..p).map(|j| j + (p - j - 1) * (2 * j + 1)).sum()
}

/// Release requests of the dag variant over the whole job: one from each
/// task whose block another task reads, every task but the last diagonal
/// one (`apps::cholesky::successors`).
pub fn dag_release_requests(p: u64) -> u64 {
    (p * (p + 1) / 2).saturating_sub(1)
}

/// Flop count `n³/3`.
pub fn flops(n: u64) -> f64 {
    (n as f64).powi(3) / 3.0
}

/// Memory per slave: an accumulator and two operand blocks (`3·8b²`), one
/// more for the merged task of multi-step(2), twice with slave overlap.
pub fn memory_per_slave(b: u64, variant: Variant, options: &Options) -> f64 {
    let blocks = if variant == Variant::MultiStep2 { 4.0 } else { 3.0 };
    let k = if options.slave_overlap { 2.0 } else { 1.0 };
    k * blocks * ELEMENT_BYTES * (b * b) as f64
}

/// Bounds with `s` slaves for the variants without barriers.
///
/// Upper bound: `W + TCOMP/s + CPcomp`, where `CPcomp` is the longest chain
/// of compute times. For the dag variant this is a list-scheduling
/// argument: at any instant the store is busy, or every slave computes, or
/// a slave is idle and then a task of the chain that finishes last is
/// computing. For single-bag, whose slaves hold tasks while waiting on
/// flags, the same expression is an estimate, not a proven bound; for
/// `s ≥ N` it is capped by (3.20).
/// The critical path with slave overlap (extension): a task on it waits
/// for its own reads less the share the slave streams while it computes
/// (all its inputs are committed when a dag task starts), but for all of
/// its writes, since its successors wait for its commit, which waits for
/// its puts: write-behind hides nothing on the critical path.
pub fn critical_path_overlapped(t: &Primitives, p: u64, ov: crate::schedule::Overlap) -> f64 {
    if !ov.slave {
        return critical_paths(t, p).0;
    }
    let share = ov.slave_share.clamp(0.0, 1.0);
    let hidden = |c: &TaskCost| share * c.hideable_reads(ov).min(c.comp);
    chain_of(t, p, &|c: &TaskCost| c.total() - hidden(c))
}

/// Per-task costs of the dag variant beyond its blocks and kernels, for
/// [`dag_makespan`] (extension; from `Params::task_overhead` and
/// `Params::task_wake`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DagOverhead {
    /// Slave seconds of every task: its requests' round trips and the
    /// wake-up of its compute thread.
    pub slave: f64,
    /// Store seconds of every task's ending: its synced commit.
    pub ending: f64,
    /// Slave seconds of the task's release request, if it has successors
    /// (their counters read under write locks in one round trip and
    /// written back behind): its fixed part ...
    pub release: f64,
    /// ... and what it takes more per successor.
    pub release_per_counter: f64,
    /// The task's whole ending as measured (`Params::task_ending` at its
    /// block's bytes, with write-behind): replaces its puts and `ending`.
    pub measured_ending: Option<f64>,
}

/// The tasks `(i, j)` (0-based) that read `L(r, c)`, in the order a dag
/// task releases them: column-major (`apps::cholesky::successors`).
pub fn dag_successors(p: u64, r: u64, c: u64) -> Vec<(u64, u64)> {
    let mut s: Vec<(u64, u64)> =
        if r == c { (c + 1..p).map(|i| (i, c)).collect() } else { (c + 1..=r).map(|j| (r, j)).chain((r + 1..p).map(|i| (i, r))).collect() };
    s.sort_unstable_by_key(|&(i, j)| (j, i));
    s
}

/// The dag variant's tasks for [`crate::simulate::makespan`], column-major
/// (`(0,0)`, the only one without inputs, first). A task holds its slave
/// for its kernels, the share of its reads the slave's prefetch does not
/// hide (as on the critical path, [`critical_path_overlapped`]) and its
/// requests, then releases its successors; its puts (with write-behind)
/// and its commit are its ending.
pub fn dag_tasks(t: &Primitives, p: u64, ov: crate::schedule::Overlap, o: DagOverhead) -> Vec<crate::simulate::SimTask> {
    // Column-major: columns before `j` hold p + (p−1) + … + (p−j+1) tasks.
    let index = |(i, j): (u64, u64)| (j * p - j * j.saturating_sub(1) / 2 + (i - j)) as usize;
    (0..p)
        .flat_map(|j| (j..p).map(move |i| (i, j)))
        .map(|(i, j)| {
            let c = if i == j { diag_task(t, j + 1) } else { off_task(t, j + 1) };
            let successors: Vec<usize> = dag_successors(p, i, j).into_iter().map(index).collect();
            crate::simulate::SimTask {
                foreground: c.foreground(ov) + o.slave,
                release: o.release + o.release_per_counter * successors.len() as f64,
                ending: o.measured_ending.unwrap_or(c.put - c.put_in_foreground(ov) + o.ending),
                successors,
            }
        })
        .collect()
}

/// The dag variant run by `s` slaves from its FIFO bag, simulated
/// ([`crate::simulate`]), compute `slowdown(k)` times slower while `k`
/// slaves compute at once: the point prediction between its bounds.
pub fn dag_makespan(t: &Primitives, p: u64, s: u64, ov: crate::schedule::Overlap, o: DagOverhead, slowdown: &dyn Fn(u64) -> f64) -> f64 {
    crate::simulate::makespan(&dag_tasks(t, p, ov, o), s, ov.store_nodes, slowdown)
}

/// `chain_overhead`: seconds each task on the critical path pays beyond
/// its blocks and kernels (its actions, commit and releases; extension):
/// a successor starts only after its producer's commit.
pub(crate) fn graph_bounds(
    t: &Primitives,
    p: u64,
    all: &Step,
    s: u64,
    ov: crate::schedule::Overlap,
    variant: Variant,
    chain_overhead: f64,
) -> Bounds {
    // Every task of the longest chain pays the overhead (it is the same
    // for all), so the chain is the one without it: 2p − 1 tasks.
    let chain_tasks = (2 * p).saturating_sub(1) as f64;
    let cp_total = critical_path_overlapped(t, p, ov) + chain_tasks * chain_overhead;
    let cp_comp = chain_of(t, p, &|c: &TaskCost| c.comp);
    let n = all.n_tasks();
    let t1 = all.t1(ov);
    let s_eff = s.min(n);
    // Single-bag: the store, the parallelism and the longest task
    // (A.7 and App. A.1.2; with no overlap this is at least
    // `single_bag_lwr_inf`). Dag: whole-task dependencies hold, so the
    // critical path is a lower bound too.
    let mut lwr = all.store_busy(ov).max(t1 / s_eff as f64).max(all.longest());
    if variant == Variant::Dag {
        lwr = lwr.max(cp_total);
    }
    let serial = all.io() + all.comp();
    let mut upr = (all.io() + all.comp() / s as f64 + cp_comp).min(serial);
    if variant == Variant::SingleBag && s >= n {
        upr = upr.min(single_bag_upr_inf_eq_3_20(t, p));
    }
    if s >= n {
        upr = upr.min(all.io() + cp_comp);
    }
    Bounds { lwr, upr }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;
    use crate::schedule::Overlap;

    fn prims() -> Primitives {
        Primitives::square(&Params::thesis_fast(), 300, &Options::default()).unwrap()
    }

    /// Fig. 2.6 dependencies for p = 3: the longest chain is
    /// (1,1) -> (2,1) -> (2,2) -> (3,2) -> (3,3); (3,1) runs beside (2,1).
    #[test]
    fn critical_path_of_p3_follows_the_diagonal() {
        let t = prims();
        let want = diag_task(&t, 1).total()
            + off_task(&t, 1).total()
            + diag_task(&t, 2).total()
            + off_task(&t, 2).total()
            + diag_task(&t, 3).total();
        let (cp, cp_comp) = critical_paths(&t, 3);
        assert!((cp - want).abs() < 1e-9, "{cp} vs {want}");
        assert!(cp_comp < cp);
        assert!((critical_paths(&t, 1).0 - diag_task(&t, 1).total()).abs() < 1e-12);
    }

    /// With slave overlap the chain drops the streamed share of each task's
    /// reads, never its writes, and never below its compute chain.
    #[test]
    fn overlapped_critical_path_hides_reads_not_writes() {
        let t = prims();
        let (whole, comp) = critical_paths(&t, 4);
        let none = critical_path_overlapped(&t, 4, Overlap::NONE);
        assert_eq!(none, whole);
        let half = critical_path_overlapped(&t, 4, Overlap { slave: true, slave_share: 0.5, ..Overlap::NONE });
        let all = critical_path_overlapped(&t, 4, Overlap { slave: true, slave_share: 1.0, write_behind: true, ..Overlap::NONE });
        assert!(comp < all && all < half && half < whole, "{comp} {all} {half} {whole}");
        // Each of the 7 tasks on the p=4 chain still pays its put.
        assert!(all >= comp + 7.0 * (t.tdput + t.tcom) - 1e-9, "{all}");
    }

    /// The dag's graph: task `(i, j)` waits for `j` commits on the
    /// diagonal and `2j + 1` below it (A.12's reads of blocks other tasks
    /// write), and the releases are [`dag_releases`].
    #[test]
    fn dag_graph_counts_its_inputs() {
        let t = prims();
        for p in 1..10u64 {
            let tasks = dag_tasks(&t, p, Overlap::NONE, DagOverhead::default());
            assert_eq!(tasks.len() as u64, p * (p + 1) / 2);
            let want: Vec<u32> = (0..p as u32).flat_map(|j| (j..p as u32).map(move |i| if i == j { j } else { 2 * j + 1 })).collect();
            assert_eq!(crate::simulate::inputs(&tasks), want, "p={p}");
            assert_eq!(tasks.iter().map(|t| t.successors.len() as u64).sum::<u64>(), dag_releases(p));
            assert_eq!(tasks.iter().filter(|t| !t.successors.is_empty()).count() as u64, dag_release_requests(p), "p={p}");
        }
    }

    /// Without overlap and overheads the simulation meets the model's
    /// closed forms: one slave runs `T₁`, unboundedly many the critical
    /// path; in between it lies within the bounds.
    #[test]
    fn dag_simulation_meets_t1_and_the_critical_path() {
        let t = prims();
        for p in 1..9u64 {
            let all = steps(&t, p, Variant::Dag).remove(0);
            let t1 = all.t1(Overlap::NONE);
            let one = dag_makespan(&t, p, 1, Overlap::NONE, DagOverhead::default(), &|_| 1.0);
            assert!((one - t1).abs() <= 1e-9 * t1, "p={p}: {one} vs T1 {t1}");
            let many = dag_makespan(&t, p, 1000, Overlap::NONE, DagOverhead::default(), &|_| 1.0);
            let cp = critical_paths(&t, p).0;
            assert!((many - cp).abs() <= 1e-9 * cp, "p={p}: {many} vs cp {cp}");
            for s in 2..5 {
                let b = graph_bounds(&t, p, &all, s, Overlap::NONE, Variant::Dag, 0.0);
                let run = dag_makespan(&t, p, s, Overlap::NONE, DagOverhead::default(), &|_| 1.0);
                assert!(b.lwr <= run * (1.0 + 1e-9) && run <= b.upr * (1.0 + 1e-9), "p={p} s={s}: {run} outside {b:?}");
            }
        }
    }

    /// With write-behind one slave pays the puts and commits its next task
    /// waits for, and no more than all of them.
    #[test]
    fn write_behind_hides_only_the_endings_nobody_waits_for() {
        let t = prims();
        let ov = Overlap { slave: true, slave_share: 0.0, write_behind: true, ..Overlap::NONE };
        let o = DagOverhead { slave: 0.0, ending: 0.01, release: 0.0, release_per_counter: 0.0, measured_ending: None };
        // p = 2 is a chain: every ending is waited for.
        for p in 3..8u64 {
            let tasks = dag_tasks(&t, p, ov, o);
            let fg: f64 = tasks.iter().map(|k| k.foreground).sum();
            let endings: f64 = tasks.iter().map(|k| k.ending).sum();
            let run = dag_makespan(&t, p, 1, ov, o, &|_| 1.0);
            // (0,0)'s successors wait for it, and so does the last commit.
            assert!(run >= fg + tasks[0].ending + tasks.last().unwrap().ending - 1e-9, "p={p}");
            assert!(run < fg + endings, "p={p}: {run} hides nothing");
        }
    }

    /// Multi-step(1) has 2p−1 steps, multi-step(2) p steps (the first
    /// factor task, then one per column with the merged task).
    #[test]
    fn step_structure() {
        let t = prims();
        for p in 1..8u64 {
            let ms1 = steps(&t, p, Variant::MultiStep1);
            assert_eq!(ms1.len() as u64, 2 * p - 1);
            assert_eq!(ms1.iter().map(Step::n_tasks).sum::<u64>(), p * (p + 1) / 2);
            let ms2 = steps(&t, p, Variant::MultiStep2);
            assert_eq!(ms2.len() as u64, p);
            assert_eq!(ms2.iter().map(Step::n_tasks).sum::<u64>(), p * (p + 1) / 2 - (p - 1));
            assert_eq!(volumes(p * 300, 300, Variant::MultiStep2).n_tasks, p * (p + 1) / 2 - (p - 1));
        }
    }
}
