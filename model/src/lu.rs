//! Blocked Crout LU, without and with partial pivoting (thesis §5.7,
//! eqs. 5.26–5.31, App. B, B.1–B.9).
//!
//! Per block column `k` there are three bags with barriers between them: a
//! multiply step (`p−k+1` tasks), a serial factor step (factor the diagonal
//! block, solve the blocks below it and, with pivoting, search and swap
//! rows), and a solve step (`p−k` tasks).
//!
//! With [`Options::lu_parallel_solves`] (this implementation, without
//! pivoting) the factor step only factors the diagonal block, and the
//! solve step also holds the `p−k` solves of the blocks below it, each a
//! task of its own ([`steps_parallel_solves`], [`volumes_parallel_solves`]).

use crate::options::Options;
use crate::params::ELEMENT_BYTES;
use crate::primitives::Primitives;
use crate::schedule::{Step, TaskCost};
use crate::volumes::{block_widths, Volumes};

fn ops(t: &Primitives) -> f64 {
    t.tmult + t.tsub()
}

/// A task of `gets` reads, `lead` of them before its first kernel, and
/// `tail` of its compute its last kernel.
fn task(t: &Primitives, gets: f64, lead: f64, puts: f64, comp: f64, tail: f64) -> TaskCost {
    TaskCost {
        disk: gets * t.tdget + puts * t.tdput,
        net: gets * t.tcom_read + puts * t.tcom,
        comp: comp + lead.min(gets) * t.tlead_extra,
        put: puts * (t.tdput + t.tcom),
        put_net: puts * t.tcom,
        tail: tail.min(comp),
        at_slave: gets * t.tcom_at_slave,
        lead: lead.min(gets) * t.tget,
    }
}

/// Reads before the first kernel of a task that first updates its block
/// (`k > 1`: the block and one pair) or else only reads `alone` blocks.
fn lead_of(k: f64, alone: f64) -> f64 {
    if k > 1.0 {
        3.0
    } else {
        alone
    }
}

/// One task of the `k`th multiply step: `(2k−1)tget + (k−1)(tmult+tsub) + tput` (B.2).
pub fn multiply_task(t: &Primitives, k: u64) -> TaskCost {
    let k = k as f64;
    task(t, 2.0 * k - 1.0, lead_of(k, 1.0), 1.0, (k - 1.0) * ops(t), ops(t))
}

/// The `k`th factor step, one serial task:
/// `Tfactnp(k) = (p−k+1)(tget+tput) + (p−k)tsolve + tlu` (B.1), plus with
/// pivoting `Tpiv(k) = p(2p−2k+1)tget + p(p−k+1)tput` (5.27).
pub fn factor_task(t: &Primitives, p: u64, k: u64, pivot: bool) -> TaskCost {
    let (p, k) = (p as f64, k as f64);
    let (mut gets, mut puts) = (p - k + 1.0, p - k + 1.0);
    if pivot {
        gets += p * (2.0 * p - 2.0 * k + 1.0);
        puts += p * (p - k + 1.0);
    }
    // The diagonal block first: it is factored before anything is solved.
    task(t, gets, 1.0, puts, (p - k) * t.tsolve + t.tlu, if p > k { t.tsolve } else { t.tlu })
}

/// One task of the `k`th solve step: `2k·tget + (k−1)(tmult+tsub) + tsolve + tput` (B.3).
pub fn solve_task(t: &Primitives, k: u64) -> TaskCost {
    let k = k as f64;
    task(t, 2.0 * k, lead_of(k, 2.0), 1.0, (k - 1.0) * ops(t) + t.tsolve, t.tsolve)
}

/// A solve of a block below the diagonal as its own task (extension):
/// reads the block and the factored diagonal block, `tsolve`, writes the block.
pub fn solve_l_task(t: &Primitives) -> TaskCost {
    task(t, 2.0, 2.0, 1.0, t.tsolve_lu, t.tsolve_lu)
}

/// `c` with its one write made over an older version of the block.
fn overwriting(t: &Primitives, c: TaskCost) -> TaskCost {
    let saved = t.overwrite_saving();
    TaskCost { disk: c.disk - saved, put: c.put - saved, ..c }
}

/// Replaced block versions a store node keeps for its next puts to write
/// into (`store/src/files.rs`: at most 64 files and 256 MiB).
pub const RECYCLED_FILES: u64 = 64;
/// See [`RECYCLED_FILES`].
pub const RECYCLED_BYTES: f64 = 256.0 * 1024.0 * 1024.0;

/// How many replaced versions of `b×b` blocks the store keeps at most.
pub fn recycled_capacity(b: u64) -> u64 {
    // A version file is the payload and a 32-byte header.
    let file = ELEMENT_BYTES * (b * b) as f64 + 32.0;
    RECYCLED_FILES.min((RECYCLED_BYTES / file).floor() as u64)
}

/// The `3p−1` barrier steps of this implementation without pivoting
/// ([`Options::lu_parallel_solves`]): multiply (`p−k+1` tasks), factor the
/// diagonal block (one task: a read, `tlu`, a write), solve (`p−k` tasks
/// below the diagonal and `p−k` right of it). The multiply writes each
/// `X(i,k)` first; the factor and the solves below the diagonal write over
/// it in place (`tdput_over`); the solves right of it write `U(k,j)` first.
///
/// Extension: the store keeps each version an in-place write replaces, up
/// to `recycled` of them ([`recycled_capacity`]; 0: none), and writes the
/// next new blocks into them at the overwrite rate. Here a step's new
/// blocks take the versions kept when the step starts, and the versions
/// its in-place writes replace are kept for the later steps: for p = 4, 9
/// of the 16 new blocks (the first multiply's 4 find none).
pub fn steps_parallel_solves(t: &Primitives, p: u64, recycled: u64) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut kept = 0u64;
    // `count` tasks writing a new block each, as many as there are kept
    // versions at the overwrite rate.
    let new_blocks = |step: &mut Step, count: u64, cost: TaskCost, kept: &mut u64| {
        let into_kept = count.min(*kept);
        *kept -= into_kept;
        if into_kept > 0 {
            step.push(into_kept, overwriting(t, cost));
        }
        if count > into_kept {
            step.push(count - into_kept, cost);
        }
    };
    for k in 1..=p {
        let mut mult = Step::default();
        new_blocks(&mut mult, p - k + 1, multiply_task(t, k), &mut kept);
        steps.push(mult);
        steps.push(Step::single(overwriting(t, task(t, 1.0, 1.0, 1.0, t.tlu, t.tlu))));
        kept = (kept + 1).min(recycled);
        if k < p {
            let mut solve = Step::default();
            solve.push(p - k, overwriting(t, solve_l_task(t)));
            let u = solve_task(t, k);
            new_blocks(&mut solve, p - k, TaskCost { comp: u.comp - t.tsolve + t.tsolve_lu, ..u }, &mut kept);
            kept = (kept + p - k).min(recycled);
            steps.push(solve);
        }
    }
    steps
}

/// The `3p−1` barrier steps.
pub fn steps(t: &Primitives, p: u64, pivot: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    for k in 1..=p {
        let mut mult = Step::default();
        mult.push(p - k + 1, multiply_task(t, k));
        steps.push(mult);
        steps.push(Step::single(factor_task(t, p, k, pivot)));
        if k < p {
            let mut solve = Step::default();
            solve.push(p - k, solve_task(t, k));
            steps.push(solve);
        }
    }
    steps
}

/// `TNOPIV₁ = (p/3)(p+1)(2p+1)tget + (p/2)(3p+1)tput
/// + (p/6)(p−1)(2p−1)(tmult+tsub) + p(p−1)tsolve + p·tlu` (5.29 = B.4).
pub fn t1_nopiv_eq_5_29(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p / 3.0 * (p + 1.0) * (2.0 * p + 1.0) * t.tget
        + p / 2.0 * (3.0 * p + 1.0) * t.tput
        + p / 6.0 * (p - 1.0) * (2.0 * p - 1.0) * ops(t)
        + p * (p - 1.0) * t.tsolve
        + p * t.tlu
}

/// `Tpiv₁ = p³tget + (p²/2)(p+1)tput` (5.28).
pub fn tpiv_eq_5_28(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p * p * p * t.tget + p * p / 2.0 * (p + 1.0) * t.tput
}

/// `TPIV₁ = (p/3)(5p²+3p+1)tget + (p/2)(p²+4p+1)tput
/// + (p/6)(p−1)(2p−1)(tmult+tsub) + p(p−1)tsolve + p·tlu` (B.5).
pub fn t1_piv_eq_b5(t: &Primitives, p: u64) -> f64 {
    let p = p as f64;
    p / 3.0 * (5.0 * p * p + 3.0 * p + 1.0) * t.tget
        + p / 2.0 * (p * p + 4.0 * p + 1.0) * t.tput
        + p / 6.0 * (p - 1.0) * (2.0 * p - 1.0) * ops(t)
        + p * (p - 1.0) * t.tsolve
        + p * t.tlu
}

/// `lwr{TNOPIV∞}` (5.30 = B.6), the thesis's relaxed closed form; with
/// pivoting `+ Tpiv₁` (B.7).
pub fn lwr_inf_eq_5_30(t: &Primitives, p: u64, pivot: bool) -> f64 {
    let pf = p as f64;
    let common = pf / 2.0 * (3.0 * pf + 1.0) * t.tput + pf * t.tlu;
    let a = pf / 3.0 * (pf + 1.0) * (2.0 * pf + 1.0) * t.tget + pf / 2.0 * (pf - 1.0) * t.tsolve;
    let b = pf / 2.0 * (5.0 * pf - 1.0) * t.tget + (pf - 1.0) * (pf - 1.0) * ops(t) + 0.5 * (pf - 1.0) * (pf + 2.0) * t.tsolve;
    common + a.max(b) + if pivot { tpiv_eq_5_28(t, p) } else { 0.0 }
}

/// `upr{TNOPIV∞} = (p/3)(p+1)(2p+1)tget + (p/2)(3p+1)tput + (p−1)²(tmult+tsub)
/// + ½(p−1)(p+2)tsolve + p·tlu` (5.31 = B.8); with pivoting `+ Tpiv₁` (B.9;
/// the printed (B.9) has `p(p−1)(tmult+tsub)`, a slip: B.8 + Tpiv₁ gives `(p−1)²`).
pub fn upr_inf_eq_5_31(t: &Primitives, p: u64, pivot: bool) -> f64 {
    let pf = p as f64;
    pf / 3.0 * (pf + 1.0) * (2.0 * pf + 1.0) * t.tget
        + pf / 2.0 * (3.0 * pf + 1.0) * t.tput
        + (pf - 1.0) * (pf - 1.0) * ops(t)
        + 0.5 * (pf - 1.0) * (pf + 2.0) * t.tsolve
        + pf * t.tlu
        + if pivot { tpiv_eq_5_28(t, p) } else { 0.0 }
}

/// Tasks, reads and writes. Block reads and writes of the Crout steps are
/// counted at their real sizes; the pivoting reads and writes (5.26, 5.27)
/// at the average block size `(n/p)²`.
pub fn volumes(n: u64, b: u64, pivot: bool) -> Volumes {
    let mut t = crout_tally(n, b, false);
    if pivot {
        let pf = block_widths(n, b).len() as f64;
        let avg = (n as f64 / pf).powi(2);
        let piv_gets = pf * pf * pf; // Σ_k p(2p−2k+1) = p³
        let piv_puts = pf * pf * (pf + 1.0) / 2.0; // Σ_k p(p−k+1)
        t.gets += piv_gets as u64;
        t.puts += piv_puts as u64;
        t.get_el += piv_gets * avg;
        t.put_el += piv_puts * avg;
    }
    t.volumes(n)
}

/// Tasks, reads and writes of [`steps_parallel_solves`], at the blocks'
/// real sizes.
pub fn volumes_parallel_solves(n: u64, b: u64) -> Volumes {
    crout_tally(n, b, true).volumes(n)
}

/// Counts of tasks, block reads and writes, and their elements.
#[derive(Default)]
struct Tally {
    tasks: u64,
    gets: u64,
    puts: u64,
    get_el: f64,
    put_el: f64,
}

impl Tally {
    /// A task that reads `gets` blocks of `get_el` elements in all and
    /// writes `puts` of `put_el`.
    fn task(&mut self, gets: u64, get_el: f64, puts: u64, put_el: f64) {
        self.tasks += 1;
        self.gets += gets;
        self.get_el += get_el;
        self.puts += puts;
        self.put_el += put_el;
    }

    fn volumes(self, n: u64) -> Volumes {
        let nf = n as f64;
        Volumes {
            n_tasks: self.tasks,
            input_bytes: ELEMENT_BYTES * nf * nf,
            n_gets: self.gets,
            get_bytes: ELEMENT_BYTES * self.get_el,
            n_puts: self.puts,
            put_bytes: ELEMENT_BYTES * self.put_el,
        }
    }
}

/// The Crout steps' tasks: the thesis's serial factor step (the diagonal
/// block and the blocks below it, read and written), or with
/// `parallel_solves` a factor of the diagonal block alone and a task per
/// block below it (that block and the diagonal one in, the block out).
fn crout_tally(n: u64, b: u64, parallel_solves: bool) -> Tally {
    let w = block_widths(n, b);
    let mut t = Tally::default();
    let mut prefix = 0.0; // Σ_{j<k} w_j
    for (k, &wk) in w.iter().enumerate() {
        let diag = wk * wk;
        let kk = k as u64;
        // Multiply step: task (i,k), i >= k, reads A(i,k), L(i,j), U(j,k) for j < k.
        for &wi in &w[k..] {
            t.task(1 + 2 * kk, wi * wk + (wi + wk) * prefix, 1, wi * wk);
        }
        if parallel_solves {
            t.task(1, diag, 1, diag);
            for &wi in &w[k + 1..] {
                t.task(2, wi * wk + diag, 1, wi * wk);
            }
        } else {
            // Factor step: reads and writes X(i,k) for i >= k.
            let col: f64 = w[k..].iter().map(|wi| wi * wk).sum();
            let blocks = (w.len() - k) as u64;
            t.task(blocks, col, blocks, col);
        }
        // Solve step: task (k,j), j > k, reads A(k,j), L(k,i), U(i,j) for i < k, and L(k,k).
        for &wj in &w[k + 1..] {
            t.task(2 + 2 * kk, wk * wj + (wk + wj) * prefix + diag, 1, wk * wj);
        }
        prefix += wk;
    }
    t
}

/// Flop count `2n³/3`.
pub fn flops(n: u64) -> f64 {
    2.0 * (n as f64).powi(3) / 3.0
}

/// Memory per slave: three blocks (an accumulator and two operands; the
/// factor step holds the diagonal block and one below it), twice with
/// slave overlap.
pub fn memory_per_slave(b: u64, options: &Options) -> f64 {
    let k = if options.slave_overlap { 2.0 } else { 1.0 };
    k * 3.0 * ELEMENT_BYTES * (b * b) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{Params, Piecewise};

    fn disk(steps: &[Step]) -> f64 {
        steps.iter().flat_map(|s| s.classes.iter()).map(|c| c.count as f64 * c.cost.disk).sum()
    }

    /// The factor and the solves below the diagonal write over the
    /// multiply's `X(i,k)`: `p + p(p−1)/2` overwrites, each saving
    /// `tdput − tdput_over` of the store's disk time, and nothing else
    /// when the store keeps no replaced versions.
    #[test]
    fn in_place_writes_are_charged_as_overwrites() {
        let base = Params::thesis_fast();
        let faster = Params { disk_put_overwrite: Some(Piecewise::new(base.disk_put.bandwidth * 3.0, 0.0)), ..base.clone() };
        let opts = Options::default();
        for (b, p) in [(300, 1), (300, 4), (500, 7)] {
            let plain = Primitives::square(&base, b, &opts).unwrap();
            assert_eq!(plain.tdput_over, plain.tdput, "without the parameter, an overwrite is a put");
            let over = Primitives::square(&faster, b, &opts).unwrap();
            assert!(over.overwrite_saving() > 0.0);
            let n_over = (p + p * (p - 1) / 2) as f64;
            let want = disk(&steps_parallel_solves(&plain, p, 0)) - n_over * over.overwrite_saving();
            let got = disk(&steps_parallel_solves(&over, p, 0));
            assert!((got - want).abs() < 1e-9 * want, "p = {p}: {got} vs {want}");
            // The source's decomposition (the factor writes the L blocks) is not this one.
            assert_eq!(disk(&steps(&over, p, false)), disk(&steps(&plain, p, false)));
        }
    }

    /// Replaced versions kept by the store take new blocks of later steps:
    /// for p = 4, 9 of the 16 new blocks (worked through in the doc of
    /// [`steps_parallel_solves`]); fewer with a smaller store capacity.
    #[test]
    fn new_blocks_go_into_the_versions_in_place_writes_replaced() {
        let base = Params::thesis_fast();
        let faster = Params { disk_put_overwrite: Some(Piecewise::new(base.disk_put.bandwidth * 3.0, 0.0)), ..base.clone() };
        let t = Primitives::square(&faster, 300, &Options::default()).unwrap();
        let saved =
            |recycled: u64| (disk(&steps_parallel_solves(&t, 4, 0)) - disk(&steps_parallel_solves(&t, 4, recycled))) / t.overwrite_saving();
        assert!((saved(64) - 9.0).abs() < 1e-9, "{}", saved(64));
        assert!(saved(1) > 0.0 && saved(1) < 9.0, "{}", saved(1));
        // The tasks are the same, only their writes' cost moves.
        let count = |st: &[Step]| st.iter().map(Step::n_tasks).sum::<u64>();
        assert_eq!(count(&steps_parallel_solves(&t, 4, 64)), count(&steps_parallel_solves(&t, 4, 0)));
        assert_eq!(recycled_capacity(1024), 31);
        assert_eq!(recycled_capacity(256), 64);
    }
}
