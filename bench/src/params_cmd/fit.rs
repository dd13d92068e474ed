//! Fitting measured sweeps to the model's piecewise form, and small
//! helpers over measured points.

use super::*;

/// One measured point of a sweep: work (flop or bytes) and seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Point {
    pub(crate) units: f64,
    pub(crate) secs: f64,
}

/// Least-squares fit of `max(x, th)/bw` to the points, on log time (every
/// size weighs the same whatever its duration). For each candidate
/// threshold the best bandwidth is closed-form (mean of the log ratios); the
/// threshold with the least residual wins.
pub(crate) fn fit(points: &[Point]) -> Piecewise {
    let pts: Vec<Point> = points.iter().copied().filter(|p| p.units > 0.0 && p.secs > 0.0).collect();
    if pts.is_empty() {
        return Piecewise::new(1.0, 0.0);
    }
    let lo = pts.iter().map(|p| p.units).fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|p| p.units).fold(0.0, f64::max);
    let mut candidates = vec![0.0];
    let steps = 80;
    for k in 0..=steps {
        // From a quarter of the smallest size to the largest, geometrically.
        candidates.push(lo / 4.0 * (hi / (lo / 4.0)).powf(k as f64 / steps as f64));
    }
    // The measured sizes too: a kink at a swept size is then found exactly,
    // not one grid step off (which also skews the bandwidth).
    candidates.extend(pts.iter().map(|p| p.units));
    let mut best = (f64::INFINITY, Piecewise::new(1.0, 0.0));
    for th in candidates {
        let logs: Vec<f64> = pts.iter().map(|p| (p.units.max(th) / p.secs).ln()).collect();
        let log_bw = logs.iter().sum::<f64>() / logs.len() as f64;
        let res: f64 = logs.iter().map(|l| (l - log_bw).powi(2)).sum();
        // Prefer the smaller threshold on (near) ties: no kink unless the data asks.
        if res < best.0 * (1.0 - 1e-9) {
            best = (res, Piecewise::new(log_bw.exp(), th));
        }
    }
    best.1
}

/// The points a fit uses: those at or above `min_units` (blocks smaller
/// than that are not worth running: the per-task overhead dwarfs them, and
/// kernels there do not follow one bandwidth), without anomalies: a point
/// slower than a larger size of the same sweep (e.g. a small gRPC reply
/// caught by a delayed ACK) is printed and left out.
pub(crate) fn fit_range(points: &[Point], min_units: f64, what: &str) -> Piecewise {
    let mut kept = Vec::new();
    for (k, p) in points.iter().enumerate() {
        if p.units < min_units {
            continue;
        }
        if points[k + 1..].iter().any(|q| q.units > p.units && q.secs < p.secs) {
            eprintln!("{what}: {:.0} units took {:.3} ms, more than a larger size: left out of the fit", p.units, p.secs * 1e3);
            continue;
        }
        kept.push(*p);
    }
    fit(if kept.is_empty() { points } else { &kept })
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// `curve` with `p`, measured again, in place of its point at the same
/// size (`model::curves::merge`).
pub(crate) fn merged(curve: Option<&[[f64; 2]]>, p: Point) -> Option<Vec<[f64; 2]>> {
    Some(model::curves::merge(curve.unwrap_or(&[]), &[[p.units, p.secs]]))
}

/// A measured curve's milliseconds at `units`, for printing beside a
/// figure measured again ("-" without the curve).
pub(crate) fn ms_at(curve: Option<&[[f64; 2]]>, units: f64) -> String {
    curve.filter(|c| !c.is_empty()).map_or("-".to_owned(), |c| format!("{:.3}", model::curves::interpolate(c, units) * 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_piecewise_parameter() {
        let truth = Piecewise::new(2e9, 1e6);
        let pts: Vec<Point> = [1e4, 1e5, 1e6, 4e6, 1.6e7, 6.4e7].iter().map(|&x| Point { units: x, secs: truth.cost(x) }).collect();
        let f = fit(&pts);
        assert!((f.bandwidth / 2e9 - 1.0).abs() < 1e-6, "{f:?}");
        // The grid of candidate thresholds is geometric: within a step.
        assert!((f.threshold / 1e6 - 1.0).abs() < 0.15, "{f:?}");
    }

    #[test]
    fn fit_without_a_kink_has_no_threshold() {
        let pts: Vec<Point> = [1e3, 1e4, 1e5].iter().map(|&x| Point { units: x, secs: x / 5e8 }).collect();
        let f = fit(&pts);
        assert_eq!(f.threshold, 0.0);
        assert!((f.bandwidth / 5e8 - 1.0).abs() < 1e-9);
    }
}
