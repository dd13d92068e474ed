//! The slaves' kernels timed over a sweep of block sizes (`P`, solve,
//! factor) and the ray-tracing pixel rate.

use super::*;

/// Median seconds of one call of `op`, repeated until `min_secs` passed
/// (at least 3 calls after one warm-up). `setup` builds each call's input
/// outside the timed part.
pub(super) fn time_kernel<T>(min_secs: f64, mut setup: impl FnMut() -> T, mut op: impl FnMut(&mut T)) -> f64 {
    let mut x = setup();
    op(&mut x);
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || start.elapsed().as_secs_f64() < min_secs {
        CacheEvictor::run_here();
        let mut x = setup();
        let t = Instant::now();
        op(&mut x);
        times.push(t.elapsed().as_secs_f64());
        if times.len() >= 10_000 {
            break;
        }
    }
    median(&mut times)
}

/// Pushes everything out of the CPU caches before each timed call, so
/// that the call's operands are where they are in a job: a slave's
/// kernels run on blocks its reads have just copied from the page cache
/// (the copies in the caches, their sources not), between other blocks,
/// not on operands left in the caches by the previous call. So each
/// kernel's `setup` copies its operands from sources evicted here, as a
/// read does, and the timed call finds the copies warm. (Timing the
/// copies' sources cold instead made dgemm at b = 256 about 15 % slower
/// than in jobs, and the model's errors larger; see `PERFORMANCE.md`.)
pub(super) struct CacheEvictor(Vec<u64>);

impl CacheEvictor {
    /// Twice the largest cache this machine reports, and at least 64 MiB:
    /// a machine with a larger cache than a fixed size would time its
    /// kernels on operands left in it, faster than a job's.
    fn bytes() -> usize {
        let largest = (0..8)
            .filter_map(|i| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size")).ok())
            .filter_map(|size| cache_bytes(&size))
            .max()
            .unwrap_or(0);
        (2 * largest).max(64 << 20)
    }

    fn new() -> Self {
        CacheEvictor(vec![1; Self::bytes() / 8])
    }

    /// Runs this thread's evictor, made on first use (hundreds of MiB on
    /// a large machine: made once, not per kernel timed).
    fn run_here() {
        thread_local! {
            static EVICTOR: std::cell::RefCell<CacheEvictor> = std::cell::RefCell::new(CacheEvictor::new());
        }
        EVICTOR.with(|e| e.borrow_mut().run());
    }

    fn run(&mut self) {
        let mut sum = 0u64;
        for v in self.0.iter_mut().step_by(8) {
            // One word per 64-byte line, read and written.
            *v = v.wrapping_add(1);
            sum = sum.wrapping_add(*v);
        }
        std::hint::black_box(sum);
    }
}

/// A cache size as sysfs writes it (`32768K`, `1M`, a plain count of
/// bytes), in bytes.
pub(super) fn cache_bytes(size: &str) -> Option<usize> {
    let size = size.trim();
    let (digits, unit) = match size.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => size.split_at(at),
        None => (size, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(scale)
}

pub(crate) fn random_block(b: usize, seed: u64) -> Block {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut blk = Block::zeros(b, b);
    for v in blk.data.iter_mut() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *v = ((x >> 11) as f64 / (1u64 << 53) as f64) - 0.5;
    }
    blk
}

/// Diagonally dominant, hence SPD when symmetric: potrf and getrf without
/// pivoting trouble.
pub(super) fn spd_block(b: usize) -> Block {
    let r = random_block(b, 7);
    let mut a = Block::zeros(b, b);
    for i in 0..b {
        for j in 0..b {
            let v = 0.5 * (r.get(i, j) + r.get(j, i));
            a.set(i, j, if i == j { v + b as f64 } else { v });
        }
    }
    a
}

/// Times of the kernels at each block size.
#[derive(Default)]
pub(super) struct KernelSweep {
    pub(super) multiply: Vec<Point>,
    pub(super) solve: Vec<Point>,
    pub(super) factor: Vec<Point>,
    pub(super) lu: Vec<Point>,
    pub(super) syrk: Vec<Point>,
    pub(super) lu_solve: Vec<Point>,
    pub(super) multiply_transposed: Vec<Point>,
}

impl KernelSweep {
    /// The measured points as the model's kernel curves.
    pub(super) fn curves(&self) -> model::KernelCurves {
        let pts = |v: &[Point]| v.iter().map(|p| [p.units, p.secs]).collect();
        model::KernelCurves {
            multiply: pts(&self.multiply),
            solve: pts(&self.solve),
            factor: pts(&self.factor),
            lu: pts(&self.lu),
            syrk: pts(&self.syrk),
            lu_solve: pts(&self.lu_solve),
            multiply_transposed: pts(&self.multiply_transposed),
        }
    }
}

/// The kernels timed again at one block size, as `bench validate` does
/// before each job: the fastest of two short passes.
pub(crate) fn kernels_now(b: usize, quick: bool) -> model::KernelCurves {
    sweep_kernels_best_of(&[b], if quick { 0.03 } else { 0.1 }, 2).curves()
}

/// The kernel sweep `passes` times over; each size keeps its fastest pass.
/// Another process on a shared machine only ever slows a kernel down, and
/// one disturbed pass moved single sizes by 40 % here (b = 256 gemm: 29
/// then 46 Gflop/s in two runs a minute apart).
pub(super) fn sweep_kernels_best_of(sizes: &[usize], min_secs: f64, passes: usize) -> KernelSweep {
    let best = |a: &mut Vec<Point>, b: Vec<Point>| {
        if a.is_empty() {
            *a = b;
        } else {
            for (x, y) in a.iter_mut().zip(b) {
                x.secs = x.secs.min(y.secs);
            }
        }
    };
    let mut k = KernelSweep::default();
    for pass in 0..passes.max(1) {
        eprintln!("kernel sweep, pass {} of {passes}", pass + 1);
        let s = sweep_kernels(sizes, min_secs);
        best(&mut k.multiply, s.multiply);
        best(&mut k.solve, s.solve);
        best(&mut k.factor, s.factor);
        best(&mut k.lu, s.lu);
        best(&mut k.syrk, s.syrk);
        best(&mut k.lu_solve, s.lu_solve);
        best(&mut k.multiply_transposed, s.multiply_transposed);
    }
    k
}

pub(super) fn sweep_kernels(sizes: &[usize], min_secs: f64) -> KernelSweep {
    let mut k = KernelSweep::default();
    for &b in sizes {
        let bf = b as f64;
        let (a, bb) = (random_block(b, 1), random_block(b, 2));
        let spd = spd_block(b);
        let mut l = spd.clone();
        kernels::potrf_lower(&mut l).expect("diagonally dominant block is SPD");
        kernels::zero_strict_upper(&mut l);
        // The multiply task body: C += A·B (dgemm with beta = 1), 2b³ flop.
        let t_mult = time_kernel(
            min_secs,
            || (a.clone(), bb.clone(), random_block(b, 3)),
            |(a, bb, c)| kernels::gemm(1.0, a, false, bb, false, 1.0, c),
        );
        // Cholesky's update: C −= A·Bᵀ, 2b³ flop (2–4 % slower than C += A·B
        // at b = 256 and 512 here: a scratch program, three rounds, 49.1–49.8
        // against 51.2–51.3 Gflop/s at b = 512).
        let t_mult_t = time_kernel(
            min_secs,
            || (a.clone(), bb.clone(), random_block(b, 3)),
            |(a, bb, c)| kernels::gemm(-1.0, a, false, bb, true, 1.0, c),
        );
        // Cholesky's panel: X·Lᵀ = B, b³ flop.
        let t_solve = time_kernel(min_secs, || (l.clone(), random_block(b, 4)), |(l, x)| kernels::trsm_right_lower_trans(l, x));
        // Cholesky's diagonal block: b³/3 flop.
        let t_chol = time_kernel(
            min_secs,
            || spd.clone(),
            |x| {
                let _ = kernels::potrf_lower(x);
            },
        );
        // LU's diagonal block with pivoting: 2b³/3 flop.
        let t_lu = time_kernel(
            min_secs,
            || spd.clone(),
            |x| {
                let _ = kernels::getrf(x);
            },
        );
        // Cholesky's diagonal update: C −= A·Aᵀ, lower triangle, b³ flop.
        let t_syrk = time_kernel(min_secs, || (a.clone(), random_block(b, 5)), |(a, c)| kernels::syrk_lower(-1.0, a, 1.0, c));
        // LU's solves, b³ flop each: L(i,k) = X·U⁻¹ and U(k,j) = L⁻¹·X, with
        // the factored diagonal block; half of LU's solve tasks are each.
        let mut d = spd.clone();
        kernels::lu_nopiv(&mut d).expect("diagonally dominant block");
        let t_solve_l = time_kernel(min_secs, || (d.clone(), random_block(b, 6)), |(d, x)| kernels::trsm_right_upper(d, x));
        let t_solve_u = time_kernel(min_secs, || (d.clone(), random_block(b, 7)), |(d, x)| kernels::trsm_left_lower_unit(d, x));
        let t_lu_solve = 0.5 * (t_solve_l + t_solve_u);
        let cube = bf * bf * bf;
        k.lu_solve.push(Point { units: cube, secs: t_lu_solve });
        k.syrk.push(Point { units: cube, secs: t_syrk });
        k.multiply.push(Point { units: 2.0 * cube, secs: t_mult });
        k.multiply_transposed.push(Point { units: 2.0 * cube, secs: t_mult_t });
        k.solve.push(Point { units: cube, secs: t_solve });
        k.factor.push(Point { units: cube / 3.0, secs: t_chol });
        k.lu.push(Point { units: 2.0 * cube / 3.0, secs: t_lu });
        eprintln!(
            "kernels b={b:>5}: gemm {:>7.2} Gflop/s  gemm A·Bᵀ {:>7.2}  trsm {:>7.2}  potrf {:>7.2}  getrf {:>7.2}  syrk {:>7.2}  LU trsm {:>7.2}",
            2.0 * cube / t_mult / 1e9,
            2.0 * cube / t_mult_t / 1e9,
            cube / t_solve / 1e9,
            cube / 3.0 / t_chol / 1e9,
            2.0 * cube / 3.0 / t_lu / 1e9,
            cube / t_syrk / 1e9,
            cube / t_lu_solve / 1e9
        );
    }
    k
}

/// Pixels per second of one slave rendering the validation scene at
/// `side`² pixels: 32 bands of 4 scanlines spread down the image (an
/// eighth of a 1024² image, 0.2 s), the fastest of three passes. (16 bands
/// of 8 put the validation scene's 1024² image at 1.163–1.180 s where
/// rendering it whole took 1.198–1.236, six times in a row: the rows
/// between them cost more than the rows they sampled. 32 of 4 put it at
/// 1.188–1.206; bands of fewer rows pay more per call.) At the
/// image's own size, because a pixel costs less the finer the image
/// (neighbouring rays take the same paths through the scene, and the
/// branch predictor and caches follow): 384² renders ran at 445–584k
/// pixel/s where 1024² ones ran at 527–644k, pass by pass alternating,
/// and 384² rates predicted the validation's 1024² jobs 7–14 % too slow.
/// (One render of 0.14 s read 258k pixel/s on a machine where the jobs
/// ran at 364k: hence three passes.)
///
/// Also the bands' relative costs, top to bottom (`Params::ray_profile`),
/// from the same pass: the scene's rows are far from equal.
pub(crate) fn ray_rate(side: u32, quick: bool) -> anyhow::Result<RayRate> {
    let (bands, rows, passes) = if quick { (4, 4, 1) } else { (32, 4, 3) };
    let p = apps::raytrace::RenderParams { level: RAY_LEVEL, width: side, height: side, grain: side, samples: RAY_SAMPLES };
    let rows = rows.min(side);
    let firsts: Vec<u32> = (0..bands).map(|k| (side - rows) * k / (bands - 1).max(1)).collect();
    let mut best = RayRate { pixels_per_s: 0.0, profile: Vec::new() };
    for _ in 0..passes {
        let mut times = Vec::with_capacity(firsts.len());
        for &first in &firsts {
            let t = Instant::now();
            let _ = apps::raytrace::render_rows(&p, first, first + rows - 1)?;
            times.push(t.elapsed().as_secs_f64());
        }
        let total: f64 = times.iter().sum();
        let rate = (firsts.len() as u32 * rows * side) as f64 / total;
        if rate > best.pixels_per_s {
            let mean = total / times.len() as f64;
            best = RayRate { pixels_per_s: rate, profile: times.iter().map(|t| t / mean).collect() };
        }
    }
    Ok(best)
}

/// One slave's ray-tracing speed on the validation scene.
pub(crate) struct RayRate {
    /// Pixels per second over the whole image.
    pub(crate) pixels_per_s: f64,
    /// Each sampled band's cost relative to their mean, top to bottom.
    pub(crate) profile: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_bytes("32768K\n"), Some(32 << 20));
        assert_eq!(cache_bytes("300M"), Some(300 << 20));
        assert_eq!(cache_bytes("4096"), Some(4096));
        assert_eq!(cache_bytes("lots"), None);
        assert_eq!(cache_bytes("12Q"), None);
        assert!(CacheEvictor::bytes() >= 64 << 20);
    }
}
