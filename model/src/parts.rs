//! Where a predicted run's time goes (extension): the prediction split by
//! taking its costs away in turn, so that it can be set beside a measured
//! run's task records (time in kernels, waiting for blocks, starting).
//! The thesis compared only totals; a total within 10 % can hide two
//! errors that cancel, and a miss does not say which cost is wrong.

use crate::params::Params;
use crate::predict::{predict, App};
use crate::{ModelError, Options};

/// A prediction split in three. Each part is what the prediction loses
/// when that part's costs go, the per-task costs first, so the parts add
/// up to the prediction. A part can be slightly negative: the schedule
/// and the shared cores do not add up linearly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Parts {
    /// With every transfer free and no per-task costs: the kernels, their
    /// slow-down on shared cores, and the slaves' idle time in the
    /// schedule (barriers, the dag's chain).
    pub compute: f64,
    /// What block and pixel transfers add: reads not hidden behind
    /// compute, puts that a barrier or a successor waits for, the store's
    /// CPU for each get.
    pub transfers: f64,
    /// What the per-task costs add last: each task's round trips,
    /// wake-up and start behind the previous ending, release requests,
    /// the barriers' protocol, the CPU of each task's requests and the
    /// job's start and finish latency.
    pub task_costs: f64,
}

/// [`predict`]'s point prediction for the same run, split into [`Parts`].
pub fn parts(app: App, n: u64, b: u64, params: &Params, options: &Options) -> Result<Parts, ModelError> {
    let total = predict(app, n, b, params, options)?.predicted;
    let no_task_costs = params.without_task_costs();
    let with_transfers = predict(app, n, b, &no_task_costs, options)?.predicted;
    let compute_only = no_task_costs.with_free_transfers();
    let compute = predict(app, n, b, &compute_only, options)?.predicted;
    Ok(Parts { compute, transfers: with_transfers - compute, task_costs: total - with_transfers })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Piecewise;

    /// The parts add up to the prediction; with no per-task costs in the
    /// parameters that part is zero, with free transfers the transfer
    /// part is; each grows with its own cost.
    #[test]
    fn the_parts_add_up_and_follow_their_costs() {
        let (n, b) = (1200u64, 300u64);
        let opts = Options { write_behind: true, slave_overlap: true, ..Options::with_slaves(2) };
        let thesis = Params::thesis_fast();
        let with_tasks = Params { task_overhead: Some(0.002), task_wake: Some(0.001), job_latency: Some(0.05), ..thesis.clone() };
        for app in [App::Matmul, App::Lu { pivot: false }, App::Cholesky(crate::Variant::Dag), App::Raytrace] {
            let p = parts(app, n, b, &with_tasks, &opts).unwrap();
            let total = predict(app, n, b, &with_tasks, &opts).unwrap().predicted;
            assert!((p.compute + p.transfers + p.task_costs - total).abs() < 1e-9 * total, "{app}: {p:?} vs {total}");
            assert!(p.task_costs >= 0.05, "{app}: the job latency at least: {p:?}");
            let none = parts(app, n, b, &thesis, &opts).unwrap();
            assert!(none.task_costs.abs() < 1e-12, "{app}: {none:?}");
            assert!((none.compute - p.compute).abs() < 1e-9 * p.compute, "{app}: compute does not depend on task costs");
            let slow_disk =
                Params { disk_get: Piecewise::new(thesis.disk_get.bandwidth / 4.0, thesis.disk_get.threshold), ..thesis.clone() };
            let slow = parts(app, n, b, &slow_disk, &opts).unwrap();
            if app != App::Raytrace {
                assert!(slow.transfers > none.transfers, "{app}: slower reads, a larger transfer part: {slow:?} vs {none:?}");
            }
            assert!((slow.compute - none.compute).abs() < 1e-9 * none.compute, "{app}");
        }
    }
}
