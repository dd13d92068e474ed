//! Ray tracing: one task per grain of `k` scanlines, each grain its own
//! object, no dependencies and (almost) no input (thesis §4.8.2, Table 4.4).

use crate::options::Options;
use crate::params::Params;
use crate::schedule::{Step, TaskCost};
use crate::volumes::Volumes;

/// The figures of Table 4.4 for `n_tasks` tasks of `tcomp` compute and
/// `tput` output each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RayBounds {
    /// `T₁ = N(Tcomp + Tput)` (3.1).
    pub t1: f64,
    /// The store bound `N·Tput` (3.3): Table 4.4's "T∞ lwr" column.
    pub comm: f64,
    /// `lwr{T∞} = max{T₁/N, N·Tput}` (3.6).
    pub lwr_inf: f64,
    /// `upr{T∞} = N·Tput + Tcomp` (3.7).
    pub upr_inf: f64,
    /// `1 + Tcomp/Tput`: Table 4.4's `upr{S̄∞}` column.
    pub speedup_comm_limit: f64,
    /// `upr{S̄∞} = min{N, 1 + Tcomp/Tput}` (§3.2).
    pub upr_speedup: f64,
}

/// Table 4.4's derivation.
pub fn bounds(n_tasks: u64, tcomp: f64, tput: f64) -> RayBounds {
    let n = n_tasks as f64;
    let t1 = n * (tcomp + tput);
    let comm = n * tput;
    let limit = 1.0 + tcomp / tput;
    RayBounds { t1, comm, lwr_inf: (t1 / n).max(comm), upr_inf: comm + tcomp, speedup_comm_limit: limit, upr_speedup: limit.min(n) }
}

/// Rows of each task: grains of `grain` rows, the last one shorter.
fn grains(rows: u64, grain: u64) -> impl Iterator<Item = u64> {
    (0..rows.div_ceil(grain)).map(move |i| (rows - i * grain).min(grain))
}

/// One step of all tasks for an `side × side` image with `grain` rows per
/// task; compute from `Params::ray_rate`, output through the store (disk,
/// unless `Options::pixels_in_commit`, and network), plus
/// `Options::raytrace_task_overhead` per task.
pub fn steps(params: &Params, side: u64, grain: u64, options: &Options, slowdown: f64) -> Vec<Step> {
    let mut st = Step::default();
    for (k, rows) in grains(side, grain).enumerate() {
        let bytes = options.pixel_bytes * (rows * side) as f64;
        // In the bag's order, top to bottom, each grain at its rows' cost.
        let weight = params.ray_rows_weight(k as u64 * grain, rows, side);
        let disk = if options.pixels_in_commit { 0.0 } else { params.disk_put.cost(bytes) };
        let net = params.network.cost(bytes);
        st.push(
            1,
            TaskCost {
                disk,
                net,
                comp: slowdown * weight * (rows * side) as f64 / params.ray_rate() + options.raytrace_task_overhead,
                put: disk + net,
                put_net: net,
                tail: 0.0,
                at_slave: 0.0,
                lead: 0.0,
            },
        );
    }
    vec![st]
}

/// Tasks and output; the input (the scene) is negligible.
pub fn volumes(side: u64, grain: u64, options: &Options) -> Volumes {
    let n = side.div_ceil(grain);
    Volumes { n_tasks: n, input_bytes: 0.0, n_gets: 0, get_bytes: 0.0, n_puts: n, put_bytes: options.pixel_bytes * (side * side) as f64 }
}

/// Memory per slave: one grain of output (twice with slave overlap).
pub fn memory_per_slave(side: u64, grain: u64, options: &Options) -> f64 {
    let k = if options.slave_overlap { 2.0 } else { 1.0 };
    k * options.pixel_bytes * (grain.min(side) * side) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Overlap;

    /// A grain's pixels in its commit cost their transfer and no disk
    /// write; written behind, the grain's output leaves its slave's time
    /// altogether, and only the store's busy time keeps it.
    #[test]
    fn pixels_in_the_commit_cost_no_disk_write_and_go_behind_the_next_grain() {
        let params = crate::Params::thesis_fast();
        let (side, grain) = (512u64, 8u64);
        let bytes = 3.0 * (grain * side) as f64;
        let own = Options { pixel_bytes: 3.0, ..Options::default() };
        let in_commit = Options { pixels_in_commit: true, ..own.clone() };
        let task = |o: &Options| steps(&params, side, grain, o, 1.0)[0].classes[0].cost;
        let (a, b) = (task(&own), task(&in_commit));
        assert_eq!(a.disk, params.disk_put.cost(bytes));
        assert!(a.disk > 0.0);
        assert_eq!((b.disk, b.net, b.put), (0.0, params.network.cost(bytes), params.network.cost(bytes)));
        assert_eq!(a.comp, b.comp);
        let st = &steps(&params, side, grain, &in_commit, 1.0)[0];
        let compute: f64 = st.classes.iter().map(|c| c.count as f64 * c.cost.comp).sum();
        let behind = Overlap { slave: true, write_behind: true, ..Overlap::NONE };
        assert!((st.t1(behind) - compute).abs() < 1e-12, "written behind: {} against compute {compute}", st.t1(behind));
        assert!(st.t1(Overlap::NONE) > compute, "in the foreground the transfer counts");
        assert!(st.store_busy(behind) > 0.0);
    }

    /// Unequal rows leave T₁ alone and make two slaves' run longer than an
    /// even split: the bag hands out grains top to bottom.
    #[test]
    fn unequal_rows_keep_t1_and_lengthen_a_parallel_run() {
        let even = crate::Params::thesis_fast();
        let skewed = crate::Params { ray_profile: Some(vec![0.2, 0.8, 1.1, 1.0, 1.4, 1.2, 1.0, 1.3]), ..even.clone() };
        let o = Options::default();
        let (a, b) = (&steps(&even, 1024, 128, &o, 1.0)[0], &steps(&skewed, 1024, 128, &o, 1.0)[0]);
        assert!((a.t1(Overlap::NONE) - b.t1(Overlap::NONE)).abs() < 1e-9 * a.t1(Overlap::NONE));
        let (ra, rb) = (a.simulated(2, Overlap::NONE), b.simulated(2, Overlap::NONE));
        assert!(rb > ra * 1.03, "skewed rows {rb} against even {ra}");
    }
}
