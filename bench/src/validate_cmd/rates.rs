//! The rates a validation run predicts with: timed now, beside the grid,
//! and the typical of several timings.

use super::*;

/// The rates a point's work runs at, measured now by `bench params`' own
/// code: the ray rate at this image's size, or the kernels at this block
/// size (over the file's points of that size) and the per-task costs.
pub(super) fn rates_now(
    cluster: &Cluster,
    case: &Case,
    b: u64,
    params: &Params,
    quick: bool,
    across_hosts: bool,
) -> anyhow::Result<Params> {
    Ok(if case.model == App::Raytrace {
        let ray = crate::params_cmd::ray_rate(case.n as u32, quick)?;
        eprintln!("ray rate now {:.0} pixel/s (parameter file {:.0})", ray.pixels_per_s, params.ray_rate());
        Params { ray_pixel_rate: Some(ray.pixels_per_s), ray_profile: Some(ray.profile), ..params.clone() }
    } else {
        let kernels = crate::params_cmd::kernels_now(b as usize, quick);
        let file = params.kernels.clone().unwrap_or_default();
        let gemm = |c: &model::KernelCurves| {
            let flop = 2.0 * (b as f64).powi(3);
            c.multiply.iter().find(|p| (p[0] - flop).abs() < 1e-6 * flop).map_or(f64::NAN, |p| flop / p[1] / 1e9)
        };
        eprintln!("kernels now at b = {b}: gemm {:.1} Gflop/s (parameter file {:.1})", gemm(&kernels), gemm(&file));
        let costs = cluster.with_client(|c| async move { crate::params_cmd::task_costs_now(&c, quick).await })?;
        let (start_behind, ending) = cluster.with_client(|c| async move { crate::params_cmd::endings_now(&c, b as usize).await })?;
        eprintln!(
            "task ending now at b = {b}: {:.3} ms, a start behind it {:.3} ms more (parameter file {}, {})",
            ending.secs * 1e3,
            start_behind.secs * 1e3,
            crate::params_cmd::ms_at(params.task_ending.as_deref(), ending.units),
            crate::params_cmd::ms_at(params.task_start_behind.as_deref(), ending.units)
        );
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.3}", v * 1e3));
        eprintln!(
            "per task now: overhead {:.3} ms, wake {:.3} ms, dag release {:.3} ms + {:.4} per counter (parameter file {}, {}, {} + {})",
            costs.overhead * 1e3,
            costs.wake * 1e3,
            costs.release * 1e3,
            costs.release_per_counter * 1e3,
            ms(params.task_overhead),
            ms(params.task_wake),
            ms(params.dag_release),
            ms(params.dag_release_per_counter)
        );
        let now = Params {
            kernels: Some(file.with_points_of(&kernels)),
            task_overhead: Some(costs.overhead),
            task_wake: Some(costs.wake),
            dag_release: Some(costs.release),
            dag_release_per_counter: Some(costs.release_per_counter),
            task_ending: crate::params_cmd::merged(params.task_ending.as_deref(), ending),
            task_start_behind: crate::params_cmd::merged(params.task_start_behind.as_deref(), start_behind),
            ..params.clone()
        };
        if across_hosts {
            // Every block crosses the link: `C` and a get's latency now.
            let link = cluster.with_client(|c| async move { crate::link_rate::link_now(&c, b as usize).await })?;
            eprintln!(
                "link now at b = {b}: {:.1} MB/s streaming, one get {:.3} ms, {:.3} ms beyond its bytes (parameter file {:.1} MB/s, {})",
                link.rate / 1e6,
                link.single * 1e3,
                link.latency * 1e3,
                params.network.bandwidth / 1e6,
                params.network_latency.map_or("-".to_owned(), |l| format!("{:.3} ms", l * 1e3))
            );
            Params { network: model::Piecewise::new(link.rate, 0.0), network_latency: Some(link.latency), ..now }
        } else {
            let (get, get_behind) = cluster.with_client(|c| async move { crate::params_cmd::gets_now(&c, b as usize).await })?;
            let file_ms = |p: Option<model::Piecewise>| p.map_or("-".to_owned(), |p| format!("{:.3}", p.cost(get.units) * 1e3));
            eprintln!(
                "block get now at b = {b}: {:.3} ms, behind an ending {:.3} ms (parameter file {}, {})",
                get.secs * 1e3,
                get_behind.secs * 1e3,
                file_ms(params.local_get),
                file_ms(params.local_get_behind)
            );
            // Through the point measured: the point reads only blocks of this size.
            let through = |p: crate::params_cmd::Point| Some(model::Piecewise::new(p.units / p.secs, 0.0));
            Params { local_get: through(get), local_get_behind: through(get_behind), ..now }
        }
    })
}

/// Each rate at the median of several timings of it (kernel points and
/// per-task costs point by point; the ray rate with the band profile of
/// the timing it came from): the machine's typical rates, which one timing
/// the host disturbed does not move.
pub(super) fn typical_rates(timings: &[Params]) -> Params {
    let scalar = |f: fn(&Params) -> Option<f64>| {
        let mut v: Vec<f64> = timings.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| model::curves::median(&mut v))
    };
    let curve = |f: fn(&Params) -> Option<&Vec<[f64; 2]>>| {
        let v: Vec<&[[f64; 2]]> = timings.iter().filter_map(f).map(Vec::as_slice).collect();
        (!v.is_empty()).then(|| model::curves::median_of(&v))
    };
    // A transfer rate whole (bandwidth and threshold) from the timing with
    // the median bandwidth.
    let transfer = |f: fn(&Params) -> Option<model::Piecewise>| {
        let mut v: Vec<model::Piecewise> = timings.iter().filter_map(f).collect();
        v.sort_by(|x, y| x.bandwidth.total_cmp(&y.bandwidth));
        v.get(v.len() / 2).copied()
    };
    let kernels: Vec<&model::KernelCurves> = timings.iter().filter_map(|t| t.kernels.as_ref()).collect();
    let mut by_ray: Vec<(f64, &Params)> = timings.iter().filter_map(|t| Some((t.ray_pixel_rate?, t))).collect();
    by_ray.sort_by(|x, y| x.0.total_cmp(&y.0));
    let ray = by_ray.get(by_ray.len() / 2).map_or(&timings[0], |r| r.1);
    Params {
        kernels: (!kernels.is_empty()).then(|| model::KernelCurves::median_of(&kernels)),
        task_overhead: scalar(|t| t.task_overhead),
        task_wake: scalar(|t| t.task_wake),
        dag_release: scalar(|t| t.dag_release),
        dag_release_per_counter: scalar(|t| t.dag_release_per_counter),
        task_ending: curve(|t| t.task_ending.as_ref()),
        task_start_behind: curve(|t| t.task_start_behind.as_ref()),
        local_get: transfer(|t| t.local_get),
        local_get_behind: transfer(|t| t.local_get_behind),
        network: transfer(|t| Some(t.network)).unwrap_or(timings[0].network),
        network_latency: scalar(|t| t.network_latency),
        ray_pixel_rate: ray.ray_pixel_rate,
        ray_profile: ray.ray_profile.clone(),
        ..timings[0].clone()
    }
}
