//! How often a data-parallel (BSP) job checkpoints at its superstep
//! boundaries: the write cost of a checkpoint against the work a failure
//! loses. The BSP source (`000…`) checkpoints at barriers; the interval is
//! Young's first-order optimum, `τ = √(2·δ·M)` for a checkpoint that costs
//! `δ` seconds and a mean time between failures `M`, rounded to whole
//! supersteps.

/// Expected fraction of the run lost to checkpointing every `interval`
/// supersteps of `step_s` seconds, each checkpoint costing `write_s`, with
/// failures every `mtbf_s` on average: the writes themselves, plus per
/// failure half an interval of work redone and the checkpoint it reloads.
pub fn overhead(interval: u32, step_s: f64, write_s: f64, mtbf_s: f64) -> f64 {
    let span = f64::from(interval.max(1)) * step_s.max(0.0);
    if span <= 0.0 {
        return 0.0;
    }
    let writes = write_s.max(0.0) / span;
    let lost = if mtbf_s > 0.0 && mtbf_s.is_finite() { (span / 2.0 + write_s.max(0.0)) / mtbf_s } else { 0.0 };
    writes + lost
}

/// The checkpoint interval in supersteps, within `1..=supersteps`: Young's
/// `√(2·write_s·mtbf_s)` over the superstep time. With no failures
/// expected (`mtbf_s` infinite or not positive) only the last superstep
/// commits.
pub fn interval_steps(step_s: f64, write_s: f64, mtbf_s: f64, supersteps: u32) -> u32 {
    let supersteps = supersteps.max(1);
    if mtbf_s.is_nan() || mtbf_s <= 0.0 || mtbf_s.is_infinite() {
        return supersteps;
    }
    if step_s <= 0.0 {
        return 1;
    }
    let tau = (2.0 * write_s.max(0.0) * mtbf_s).sqrt();
    let steps = (tau / step_s).round();
    if steps.is_nan() {
        return 1;
    }
    (steps.max(1.0) as u64).min(u64::from(supersteps)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_is_youngs_optimum_in_whole_supersteps() {
        // δ = 0.5 s, M = 400 s: τ = 20 s; 2 s per superstep: 10.
        assert_eq!(interval_steps(2.0, 0.5, 400.0, 64), 10);
        assert_eq!(interval_steps(2.0, 0.5, 400.0, 4), 4, "clamped to the job");
        assert_eq!(interval_steps(100.0, 0.5, 400.0, 64), 1, "at least one superstep");
        assert_eq!(interval_steps(1.0, 0.5, f64::INFINITY, 64), 64, "no failures: commit at the end only");
    }

    #[test]
    fn the_chosen_interval_is_near_the_least_overhead() {
        let (step, write, mtbf) = (0.3, 0.8, 600.0);
        let chosen = interval_steps(step, write, mtbf, 1000);
        let best = (1..=1000).min_by(|a, b| overhead(*a, step, write, mtbf).total_cmp(&overhead(*b, step, write, mtbf))).unwrap();
        let (c, b) = (overhead(chosen, step, write, mtbf), overhead(best, step, write, mtbf));
        assert!(c <= b * 1.02, "chosen {chosen} costs {c}, best {best} costs {b}");
    }
}
