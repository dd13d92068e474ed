//! Measured kernel times by size (extension).
//!
//! The thesis's kernels ran at one rate above a small threshold, which the
//! piecewise-linear form `max(x, threshold)/bandwidth` captures. Today's
//! BLAS kernels keep speeding up with the block size over the whole range
//! jobs use: single-threaded dtrsm here ran 24 GFlop/s at b = 128 and 39.5
//! at b = 1024, so one bandwidth fitted over that range made a b = 1024
//! solve 24 % too slow, and every b = 1024 Cholesky and LU prediction
//! 15–19 % too slow on one slave. `bench params` therefore also keeps the
//! measured points of its kernel sweep; a kernel's time is interpolated
//! from them (linearly in log time over log size), at the nearest end
//! point's rate outside them. Without curves the piecewise form is used,
//! as in the thesis.

use serde::{Deserialize, Serialize};

use crate::error::ParamsError;

/// A compute kernel of the block primitives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `C += A·B` (dgemm): `2b³` flop.
    Multiply,
    /// Triangular solve (dtrsm): `b³` flop.
    Solve,
    /// Cholesky factor of a block (dpotrf): `b³/3` flop.
    Factor,
    /// LU factor of a block (dgetrf): `2b³/3` flop.
    Lu,
    /// Symmetric rank-b update of a diagonal block (dsyrk): `b³` flop.
    Syrk,
    /// LU's triangular solves (dtrsm right-upper for `L`, left-lower-unit
    /// for `U`, half each): `b³` flop. Without a curve, [`Kernel::Solve`]'s.
    LuSolve,
    /// Cholesky's update `C −= A·Bᵀ` (dgemm, second operand transposed):
    /// `2b³` flop. 2–4 % slower than [`Kernel::Multiply`] at b = 256 and
    /// 512 on this VM's OpenBLAS. Without a curve, [`Kernel::Multiply`]'s.
    MultiplyTransposed,
}

/// Measured `[flop, seconds]` points per kernel, by increasing flop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelCurves {
    /// dgemm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multiply: Vec<[f64; 2]>,
    /// dtrsm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub solve: Vec<[f64; 2]>,
    /// dpotrf.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub factor: Vec<[f64; 2]>,
    /// dgetrf.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lu: Vec<[f64; 2]>,
    /// dsyrk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syrk: Vec<[f64; 2]>,
    /// LU's two dtrsm variants, the mean of their times. Cholesky's variant
    /// (`solve`) ran 22 Gflop/s at b = 256 here, LU's left-lower-unit 15.5.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lu_solve: Vec<[f64; 2]>,
    /// Cholesky's dgemm with the second operand transposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multiply_transposed: Vec<[f64; 2]>,
}

impl KernelCurves {
    /// The curve of `k`; empty if it was not measured.
    pub fn of(&self, k: Kernel) -> &[[f64; 2]] {
        match k {
            Kernel::Multiply => &self.multiply,
            Kernel::Solve => &self.solve,
            Kernel::Factor => &self.factor,
            Kernel::Lu => &self.lu,
            Kernel::Syrk => &self.syrk,
            Kernel::LuSolve => &self.lu_solve,
            Kernel::MultiplyTransposed => &self.multiply_transposed,
        }
    }

    /// These curves with `newer`'s points in them: a point of `newer` at a
    /// flop count of these replaces it, others go in in order. (`bench
    /// validate` times the kernels again at a job's block size just
    /// before it runs, the host's rates drift.)
    pub fn with_points_of(&self, newer: &KernelCurves) -> KernelCurves {
        KernelCurves {
            multiply: merge(&self.multiply, &newer.multiply),
            solve: merge(&self.solve, &newer.solve),
            factor: merge(&self.factor, &newer.factor),
            lu: merge(&self.lu, &newer.lu),
            syrk: merge(&self.syrk, &newer.syrk),
            lu_solve: merge(&self.lu_solve, &newer.lu_solve),
            multiply_transposed: merge(&self.multiply_transposed, &newer.multiply_transposed),
        }
    }

    /// Several timings' curves, each kernel's point by point at the median
    /// ([`median_of`]).
    pub fn median_of(timings: &[&KernelCurves]) -> KernelCurves {
        let of = |k: Kernel| median_of(&timings.iter().map(|t| t.of(k)).collect::<Vec<_>>());
        KernelCurves {
            multiply: of(Kernel::Multiply),
            solve: of(Kernel::Solve),
            factor: of(Kernel::Factor),
            lu: of(Kernel::Lu),
            syrk: of(Kernel::Syrk),
            lu_solve: of(Kernel::LuSolve),
            multiply_transposed: of(Kernel::MultiplyTransposed),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ParamsError> {
        for (name, k) in [
            ("multiply", Kernel::Multiply),
            ("solve", Kernel::Solve),
            ("factor", Kernel::Factor),
            ("lu", Kernel::Lu),
            ("syrk", Kernel::Syrk),
            ("lu_solve", Kernel::LuSolve),
            ("multiply_transposed", Kernel::MultiplyTransposed),
        ] {
            validate_points(&format!("kernels.{name}"), self.of(k))?;
        }
        Ok(())
    }
}

/// `Invalid` unless every point's size and seconds are finite and > 0
/// and the sizes increase: what [`interpolate`] needs.
pub(crate) fn validate_points(name: &str, curve: &[[f64; 2]]) -> Result<(), ParamsError> {
    for (i, &[x, t]) in curve.iter().enumerate() {
        let bad = |value: f64, reason: &'static str| ParamsError::Invalid { name: format!("{name}[{i}]"), value, reason };
        if !(x.is_finite() && x > 0.0) {
            return Err(bad(x, "size must be finite and > 0"));
        }
        if !(t.is_finite() && t > 0.0) {
            return Err(bad(t, "seconds must be finite and > 0"));
        }
        if i > 0 && x <= curve[i - 1][0] {
            return Err(bad(x, "points must be in increasing size"));
        }
    }
    Ok(())
}

/// Flop counts of one block size, computed the same way twice.
/// A measured `[size, seconds]` curve with `new`'s points in it: a point of
/// `new` at a size of `old` replaces it, others go in in order.
pub fn merge(old: &[[f64; 2]], new: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let mut out: Vec<[f64; 2]> = old.iter().filter(|o| !new.iter().any(|n| same_flop(n[0], o[0]))).copied().collect();
    out.extend_from_slice(new);
    out.sort_by(|a, b| a[0].total_cmp(&b[0]));
    out
}

/// Every size any of `curves` timed, in order, at the median of the
/// seconds the curves that timed it have (the mean of the middle two for
/// an even count): several timings' typical rate, which one disturbed
/// timing does not move.
pub fn median_of(curves: &[&[[f64; 2]]]) -> Vec<[f64; 2]> {
    let sizes = curves.iter().fold(Vec::new(), |acc, c| merge(&acc, c));
    sizes
        .into_iter()
        .map(|[x, _]| {
            let mut secs: Vec<f64> = curves.iter().filter_map(|c| c.iter().find(|q| same_flop(q[0], x))).map(|q| q[1]).collect();
            [x, median(&mut secs)]
        })
        .collect()
}

/// The median of a non-empty list (the mean of the middle two for an even
/// count).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn same_flop(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// Seconds for `flop` (or bytes, on the per-task curves) on a validated,
/// non-empty curve.
pub fn interpolate(curve: &[[f64; 2]], flop: f64) -> f64 {
    let (first, last) = (curve[0], curve[curve.len() - 1]);
    if flop <= first[0] {
        return first[1] * flop / first[0];
    }
    if flop >= last[0] {
        return last[1] * flop / last[0];
    }
    let i = curve.partition_point(|p| p[0] <= flop).clamp(1, curve.len() - 1);
    let ([x0, t0], [x1, t1]) = (curve[i - 1], curve[i]);
    let w = (flop.ln() - x0.ln()) / (x1.ln() - x0.ln());
    (t0.ln() + w * (t1.ln() - t0.ln())).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_hit_exactly_and_ends_keep_their_rate() {
        let c = [[1e6, 1e-4], [8e6, 4e-4], [64e6, 1.6e-3]];
        for [x, t] in c {
            assert!((interpolate(&c, x) / t - 1.0).abs() < 1e-12);
        }
        // Between points: log-log, so a power law between them is exact.
        let mid = interpolate(&c, 2.828_427_124_746_19e6);
        assert!((mid / 2e-4 - 1.0).abs() < 1e-9, "{mid}");
        // Beyond the last point: its rate (4e10 flop/s).
        assert!((interpolate(&c, 128e6) - 3.2e-3).abs() < 1e-15);
        // Below the first: its rate (1e10 flop/s).
        assert!((interpolate(&c, 5e5) - 5e-5).abs() < 1e-15);
    }

    #[test]
    fn newer_points_replace_those_of_their_size_and_others_stay() {
        let file = KernelCurves { multiply: vec![[1e6, 1e-4], [8e6, 4e-4]], solve: vec![[1e6, 2e-4]], ..KernelCurves::default() };
        let now = KernelCurves { multiply: vec![[8e6, 3e-4], [2e6, 1.5e-4]], ..KernelCurves::default() };
        let merged = file.with_points_of(&now);
        assert_eq!(merged.multiply, vec![[1e6, 1e-4], [2e6, 1.5e-4], [8e6, 3e-4]]);
        assert_eq!(merged.solve, file.solve);
        assert!(merged.validate().is_ok());
    }

    #[test]
    fn the_median_of_timings_keeps_every_size_and_ignores_one_outlier() {
        let a = [[1.0, 2.0], [4.0, 3.0]];
        let b = [[1.0, 9.0], [2.0, 9.0], [4.0, 5.0]];
        let c = [[1.0, 2.2], [4.0, 3.2]];
        assert_eq!(median_of(&[&a, &b, &c]), vec![[1.0, 2.2], [2.0, 9.0], [4.0, 3.2]]);
        assert_eq!(median_of(&[&a, &b]), vec![[1.0, 5.5], [2.0, 9.0], [4.0, 4.0]], "two: their mean");
        assert_eq!(median_of(&[&a]), a.to_vec());
    }

    #[test]
    fn bad_curves_are_refused() {
        let mut k = KernelCurves { solve: vec![[1e6, 1e-4], [1e6, 2e-4]], ..KernelCurves::default() };
        assert!(matches!(k.validate(), Err(ParamsError::Invalid { .. })));
        k.solve = vec![[1e6, -1.0]];
        assert!(k.validate().is_err());
        k.solve = vec![[1e6, 1e-4], [2e6, 1.5e-4]];
        assert!(k.validate().is_ok());
    }
}
