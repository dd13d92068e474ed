//! Kernels slowed by kernels on other cores (extension).
//!
//! The thesis's slaves each had a workstation. Slaves on the cores of one
//! machine share its caches, its memory bandwidth and the power budget
//! that sets its clocks (on a virtual machine, also whatever the host's
//! threads behind its virtual cores share), so a kernel's time alone is
//! not its time while other slaves compute. `bench params` measures the
//! ratio directly: `k` processes, as `k` slaves are, run copies of a
//! kernel at once, and each copy's time is set against one copy's alone. The model multiplies a
//! kernel's time by the factor for the number of slaves computing at that
//! moment, on top of the cores' time-sharing ([`crate::SharedCpu`]),
//! which counts only threads waiting for a core.

use serde::{Deserialize, Serialize};

use crate::error::ParamsError;

/// Measured `[k, factor]` points by increasing `k`: with `k` copies
/// running at once, each takes `factor` times its time alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Corun {
    /// Block kernels (dgemm at b = 512 stands for them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<[f64; 2]>,
    /// The ray tracer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ray: Vec<[f64; 2]>,
}

impl Corun {
    /// The factor for `k` copies of the block kernels (`ray`: of the ray
    /// tracer): linear between the measured counts, the last one's beyond
    /// them, and 1 for one copy or none measured. Never below 1: a copy is
    /// not faster for company, and a measured ratio under 1 is noise.
    pub fn factor(&self, ray: bool, k: u64) -> f64 {
        let points = if ray { &self.ray } else { &self.kernels };
        let k = k as f64;
        if k <= 1.0 || points.is_empty() {
            return 1.0;
        }
        let at = match points.iter().position(|p| p[0] >= k) {
            None => points[points.len() - 1][1],
            Some(0) => points[0][1],
            Some(i) => {
                let ([k0, f0], [k1, f1]) = (points[i - 1], points[i]);
                f0 + (f1 - f0) * (k - k0) / (k1 - k0)
            }
        };
        at.max(1.0)
    }

    /// `Invalid` unless each curve's counts increase from at least 1 and
    /// its factors are finite and > 0.
    pub(crate) fn validate(&self) -> Result<(), ParamsError> {
        for (name, points) in [("corun.kernels", &self.kernels), ("corun.ray", &self.ray)] {
            crate::curves::validate_points(name, points)?;
            if let Some(&[k, _]) = points.first().filter(|p| p[0] < 1.0) {
                return Err(ParamsError::Invalid { name: name.into(), value: k, reason: "counts must be >= 1" });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> Corun {
        Corun { kernels: vec![[1.0, 1.0], [2.0, 1.1], [4.0, 1.3]], ray: vec![[1.0, 1.0], [2.0, 1.5]] }
    }

    #[test]
    fn one_copy_or_no_points_costs_nothing_more() {
        assert_eq!(measured().factor(false, 1), 1.0);
        assert_eq!(Corun::default().factor(true, 8), 1.0);
    }

    #[test]
    fn between_counts_it_is_linear_and_beyond_them_the_last() {
        let c = measured();
        assert!((c.factor(false, 2) - 1.1).abs() < 1e-12);
        assert!((c.factor(false, 3) - 1.2).abs() < 1e-12);
        assert!((c.factor(false, 16) - 1.3).abs() < 1e-12);
        assert!((c.factor(true, 4) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn a_ratio_under_one_is_taken_as_one() {
        let c = Corun { kernels: vec![[1.0, 1.0], [2.0, 0.97]], ray: vec![] };
        assert_eq!(c.factor(false, 2), 1.0);
    }

    #[test]
    fn counts_out_of_order_or_factors_not_positive_are_refused() {
        assert!(measured().validate().is_ok());
        assert!(Corun { kernels: vec![[2.0, 1.0], [1.0, 1.0]], ray: vec![] }.validate().is_err());
        assert!(Corun { kernels: vec![], ray: vec![[2.0, 0.0]] }.validate().is_err());
        assert!(Corun { kernels: vec![[0.0, 1.0]], ray: vec![] }.validate().is_err());
        assert!(Corun { kernels: vec![[0.5, 1.0], [2.0, 1.1]], ray: vec![] }.validate().is_err(), "fewer than one copy");
    }
}
