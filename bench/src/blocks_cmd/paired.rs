//! Ratios from paired chunks: the store and the raw file take turns on
//! short stretches of the same work, so that both sides of each pair run
//! under the same host conditions.
//!
//! On a shared VM the host's speed moves by tens of percent over seconds.
//! With whole passes per side (half a second to seconds each), a slow
//! spell lands on one side only and moves the ratio by as much; with
//! chunks of a few tens of milliseconds, alternating, it lands on both
//! sides of the pairs it covers. Each pair gives a ratio; the figure is
//! their median, and the quartiles say how far the pairs spread.

use std::time::Duration;

/// The distribution of the pairs' ratios `raw time / store time` (the
/// store's rate as a fraction of the raw file's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PairedRatio {
    pub(crate) pairs: usize,
    pub(crate) p25: f64,
    pub(crate) median: f64,
    pub(crate) p75: f64,
}

/// Pairs `raw[i]` with `store[i]` (the same chunk of blocks on each side).
/// `None` without pairs; zero durations (a clock that did not move) are
/// skipped rather than turned into infinite ratios.
pub(crate) fn paired_ratio(raw: &[Duration], store: &[Duration]) -> Option<PairedRatio> {
    assert_eq!(raw.len(), store.len(), "every chunk is timed on both sides");
    let mut ratios: Vec<f64> =
        raw.iter().zip(store).filter(|(r, s)| !r.is_zero() && !s.is_zero()).map(|(r, s)| r.as_secs_f64() / s.as_secs_f64()).collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    Some(PairedRatio { pairs: ratios.len(), p25: quantile(&ratios, 0.25), median: quantile(&ratios, 0.5), p75: quantile(&ratios, 0.75) })
}

/// Linear interpolation between the closest ranks of sorted `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    let pos = q * (xs.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
}

/// How many blocks each chunk holds: the k blocks of a pass cut into
/// `chunks` stretches (the last may be shorter), at least one block each.
pub(crate) fn chunk_ranges(k: usize, chunks: usize) -> Vec<std::ops::Range<usize>> {
    let per = k.div_ceil(chunks.max(1)).max(1);
    (0..k).step_by(per).map(|start| start..(start + per).min(k)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn a_slow_spell_on_both_sides_of_a_pair_leaves_its_ratio_alone() {
        // The store takes twice the raw time in every pair; pairs 2 and 3
        // ran in a spell where everything took three times as long.
        let raw = ms(&[10, 10, 30, 30, 10]);
        let store = ms(&[20, 20, 60, 60, 20]);
        let r = paired_ratio(&raw, &store).unwrap();
        assert_eq!(r, PairedRatio { pairs: 5, p25: 0.5, median: 0.5, p75: 0.5 });
    }

    #[test]
    fn the_median_and_quartiles_interpolate_between_ranks() {
        let raw = ms(&[10, 10, 10, 10]);
        let store = ms(&[10, 20, 40, 50]); // ratios 1, 0.5, 0.25, 0.2
        let r = paired_ratio(&raw, &store).unwrap();
        assert_eq!(r.pairs, 4);
        assert!((r.median - 0.375).abs() < 1e-12, "{r:?}");
        assert!((r.p25 - 0.2375).abs() < 1e-12, "{r:?}");
        assert!((r.p75 - 0.625).abs() < 1e-12, "{r:?}");
    }

    #[test]
    fn no_pairs_and_unmoved_clocks_give_no_ratio() {
        assert_eq!(paired_ratio(&[], &[]), None);
        assert_eq!(paired_ratio(&ms(&[0]), &ms(&[5])), None);
    }

    #[test]
    fn chunks_cover_every_block_once() {
        assert_eq!(chunk_ranges(10, 4), vec![0..3, 3..6, 6..9, 9..10]);
        assert_eq!(chunk_ranges(2, 16), vec![0..1, 1..2]);
        assert_eq!(chunk_ranges(1024, 16).len(), 16);
        assert!(chunk_ranges(1024, 16).iter().all(|r| r.len() == 64));
    }
}
