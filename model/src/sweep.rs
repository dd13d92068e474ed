//! Block size from a memory budget (thesis §5.3, eqs. 5.2–5.5, with the
//! overlapped forms of §5.5, 5.7–5.17) and sweeps over `b` and `s`.

use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::options::Options;
use crate::params::Params;
use crate::predict::{predict, App, Prediction};

/// What is held in memory (thesis §5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryLayout {
    /// No caching: three blocks per slave (5.2).
    NoCache,
    /// A block row cached by each slave (5.3).
    SlaveRow,
    /// A block row cached by the store's file-system LRU cache (5.4, bound form).
    ServerRowLru,
    /// A block row cached at the store on the application's request (5.5).
    ServerRowDirected,
}

impl MemoryLayout {
    fn name(self) -> &'static str {
        match self {
            MemoryLayout::NoCache => "no-cache",
            MemoryLayout::SlaveRow => "slave-row",
            MemoryLayout::ServerRowLru => "server-row-lru",
            MemoryLayout::ServerRowDirected => "server-row-directed",
        }
    }
}

/// Largest block width `b` that fits `total_bytes` of memory over `s`
/// slaves and `v` store nodes. `k = 2` with slave overlap (two threads each
/// holding its blocks), and server double buffering adds `8vb²`:
///
/// * no cache: `M = 24ksb² + 8vb²` — (5.2), (5.7), (5.10), (5.13);
/// * slave row: `M = 8ks(nb + 2b²) + 8vb²` — (5.3), (5.8), (5.11), (5.15);
/// * server row, LRU: `M = 8nb(s/(n/b) + s)k + 24ksb² + 8vb²` — (5.4) in the
///   thesis's bound form; the overlapped forms are this crate's extension;
/// * server row, directed: `M = 32ksb² + 8vb²` — (5.5), (5.9), (5.12), (5.17).
///
/// (The `8vb²` term appears only with server double buffering.)
pub fn max_block(n: u64, s: u64, total_bytes: f64, layout: MemoryLayout, options: &Options) -> Result<f64, ModelError> {
    let (n, s, m) = (n as f64, s.max(1) as f64, total_bytes);
    let k = if options.slave_overlap { 2.0 } else { 1.0 };
    let v = if options.server_double_buffer { options.store_nodes.max(1) as f64 } else { 0.0 };
    // Solve a·b² + c·b = M for b > 0.
    let (a, c) = match layout {
        MemoryLayout::NoCache => (24.0 * k * s + 8.0 * v, 0.0),
        MemoryLayout::SlaveRow => (16.0 * k * s + 8.0 * v, 8.0 * k * s * n),
        MemoryLayout::ServerRowLru => (32.0 * k * s + 8.0 * v, 8.0 * k * s * n),
        MemoryLayout::ServerRowDirected => (32.0 * k * s + 8.0 * v, 0.0),
    };
    let b = (-c + (c * c + 4.0 * a * m).sqrt()) / (2.0 * a);
    if !(b.is_finite() && b >= 1.0) {
        return Err(ModelError::MemoryTooSmall { budget_bytes: m, layout: layout.name() });
    }
    Ok(b.min(n))
}

/// The recommended block for a memory budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// Largest block that fits (§5.3).
    pub b_max: f64,
    /// The block with the least predicted time among those that fit
    /// (ties go to the larger block).
    pub b: u64,
    /// Its prediction.
    pub prediction: Prediction,
}

/// Candidate blocks no wider than `b_max`: `⌊b_max⌋` and the balanced
/// partitions `⌈n/p⌉` for the 16 smallest admissible `p`.
pub fn candidate_blocks(n: u64, b_max: f64) -> Vec<u64> {
    let top = (b_max.floor() as u64).clamp(1, n);
    let p_min = n.div_ceil(top);
    let mut c: Vec<u64> = (p_min..p_min + 16).map(|p| n.div_ceil(p)).filter(|&b| b <= top).collect();
    c.push(top);
    c.sort_unstable();
    c.dedup();
    c
}

/// §5.3: "the largest possible block size is best", limited by memory and
/// by the loss of parallelism; so predict every candidate that fits and
/// keep the fastest.
pub fn recommend(
    app: App,
    n: u64,
    total_bytes: f64,
    layout: MemoryLayout,
    params: &Params,
    options: &Options,
) -> Result<Recommendation, ModelError> {
    let b_max = max_block(n, options.slaves, total_bytes, layout, options)?;
    let mut best: Option<Prediction> = None;
    for b in candidate_blocks(n, b_max) {
        let pr = predict(app, n, b, params, options)?;
        if best.as_ref().is_none_or(|x| pr.predicted <= x.predicted) {
            best = Some(pr);
        }
    }
    let prediction = best.ok_or(ModelError::MemoryTooSmall { budget_bytes: total_bytes, layout: layout.name() })?;
    Ok(Recommendation { b_max, b: prediction.b, prediction })
}

/// Predictions over every `b × s`, row-major in `blocks`.
pub fn sweep(app: App, n: u64, blocks: &[u64], slaves: &[u64], params: &Params, options: &Options) -> Result<Vec<Prediction>, ModelError> {
    let mut out = Vec::with_capacity(blocks.len() * slaves.len());
    for &b in blocks {
        for &s in slaves {
            out.push(predict(app, n, b, params, &Options { slaves: s, ..options.clone() })?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// §5.3: `b = √(m/24)` for one slave of memory m (5.2); 32 MB gives
    /// b ≈ 1154.7.
    #[test]
    fn no_cache_is_5_2() {
        let b = max_block(100_000, 1, 32e6, MemoryLayout::NoCache, &Options::default()).unwrap();
        assert!((b - (32e6f64 / 24.0).sqrt()).abs() < 1e-9);
    }

    /// (5.3): `b = (√(s²n² + sM) − sn)/(4s)`.
    #[test]
    fn slave_row_is_5_3() {
        let (n, s, m) = (15_000.0f64, 5.0f64, 160e6f64);
        let want = ((s * s * n * n + s * m).sqrt() - s * n) / (4.0 * s);
        let b = max_block(15_000, 5, m, MemoryLayout::SlaveRow, &Options::default()).unwrap();
        assert!((b - want).abs() < 1e-6, "{b} vs {want}");
    }

    /// §5.5.2, (5.17): with two threads per slave and server double
    /// buffering on v nodes, `b = √(M/(8(8s+v)))`. The thesis's worked
    /// example (14 slaves, 32 MB each, server row cache): "the block size is
    /// 703" and "approximately 454" tasks. (5.17) gives 703.97 with v = 1
    /// (700.9 with v = 2, though ATM/400 has two store nodes).
    #[test]
    fn combined_overlap_is_5_17_and_gives_703() {
        let o = Options { slave_overlap: true, server_double_buffer: true, store_nodes: 1, ..Options::default() };
        let b = max_block(15_000, 14, 14.0 * 32e6, MemoryLayout::ServerRowDirected, &o).unwrap();
        assert!((b - (14.0f64 * 32e6 / (8.0 * (8.0 * 14.0 + 1.0))).sqrt()).abs() < 1e-9);
        assert_eq!(b.floor() as u64, 703);
        let p = 15_000.0 / b.floor();
        assert!((p * p - 454.0).abs() < 2.0, "tasks {}", p * p);
    }

    #[test]
    fn too_little_memory_is_an_error() {
        assert!(matches!(max_block(1000, 4, 10.0, MemoryLayout::NoCache, &Options::default()), Err(ModelError::MemoryTooSmall { .. })));
    }
}
