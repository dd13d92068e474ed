//! Block primitives (thesis Table 3.2, eqs. 4.1–4.3, non-square 5.21–5.22).

use crate::curves::Kernel;
use crate::error::ModelError;
use crate::options::Options;
use crate::params::{Params, ELEMENT_BYTES};

/// Times of the block operations for one block shape, in seconds.
///
/// Transfers are split into their disk (`td*`) and network (`tcom`) parts
/// so that the overlapped forms of §5.5 can use them; `tget = tdget + tcom`
/// and `tput = tdput + tcom` as in §5.5.1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Primitives {
    /// Disk part of reading a block at the store (cold).
    pub tdget: f64,
    /// Store part of reading a block held in the store node's memory
    /// (0 unless `Params::disk_get_cached` is given, as in the thesis).
    pub tdget_cached: f64,
    /// Disk part of writing a block.
    pub tdput: f64,
    /// Disk part of writing a block over an older version of it
    /// (`Params::disk_put_overwrite`; `tdput` without it, or with
    /// [`Options::cached_puts`]).
    pub tdput_over: f64,
    /// Network part of moving one block between store and slave.
    pub tcom: f64,
    /// Network part of a read: `tcom`, or with [`Options::slave_reads`]
    /// the slave's own read of the version file (`Params::local_get`, if
    /// measured).
    pub tcom_read: f64,
    /// Of a read's `tcom_read`, what the slave does itself and the store
    /// node does not serialise: `tcom_read` with [`Options::slave_reads`],
    /// else 0.
    pub tcom_at_slave: f64,
    /// `tget = 8b₁b₂(1/Dget + 1/C)` (4.3, 5.22), with `tcom_read` for `1/C`.
    pub tget: f64,
    /// A read served from the store node's memory: `tdget_cached + tcom_read`.
    pub tget_cached: f64,
    /// What a read a task's first kernel waits for (extension, a
    /// [`crate::schedule::TaskCost::lead`] read) costs beyond `tget`: with
    /// [`Options::prefetch_within_task`] and [`Options::slave_reads`],
    /// `Params::local_get_behind` less `local_get`, at most `local_get`
    /// again, else 0. The cap: the read shares the cores with the ending
    /// (processor sharing of two takes at most twice as long). `bench
    /// params`' get starts with the ending's whole transfer and measured
    /// 2.7 times a quiet get at 8 MiB; LU's solve tasks, n = 4096,
    /// b = 1024, waited 1.7–1.9 times in a job (2.0–2.5 at b = 256). The
    /// slave's time: the task's costs charge it as compute.
    pub tlead_extra: f64,
    /// `tput = 8b₁b₂(1/Dput + 1/C)` (4.3, 5.22).
    pub tput: f64,
    /// `tmult = 2b₁²b₂/P` (4.1, 5.21).
    pub tmult: f64,
    /// `tmult` for Cholesky's update, whose dgemm takes its second operand
    /// transposed ([`Kernel::MultiplyTransposed`]; extension): the model's
    /// Cholesky uses it as its `tmult`.
    pub tmult_transposed: f64,
    /// `tadd = tsub = b₁b₂/P` (4.2, 5.21).
    pub tadd: f64,
    /// `tsolve = b³/P` (4.1), square blocks only.
    pub tsolve: f64,
    /// LU's solves, `b³` flop at LU's dtrsm variants ([`Kernel::LuSolve`]);
    /// `tsolve` unless that curve was measured.
    pub tsolve_lu: f64,
    /// `tchol = b³/(3P)` (4.1), square blocks only.
    pub tchol: f64,
    /// `tlu = 2b³/(3P)`: the thesis leaves `tlu` unstated; this is the LU
    /// flop count of a b×b block at `P` (consistent with `tchol`), or the
    /// measured dgetrf curve.
    pub tlu: f64,
    /// Cholesky's update of a diagonal block by one block of its row:
    /// `tmult` in the thesis (A.11), a dsyrk of `b³` flop with
    /// [`Options::diagonal_syrk`] (extension).
    pub tdiag_update: f64,
}

impl Primitives {
    /// Square `b×b` blocks (eqs. 4.1–4.3).
    pub fn square(params: &Params, b: u64, options: &Options) -> Result<Self, ModelError> {
        Self::rect(params, b, b, options)
    }

    /// `b₁×b₂` blocks (eqs. 5.21–5.22). `tsolve`, `tchol`, `tlu` use `b₁`.
    pub fn rect(params: &Params, b1: u64, b2: u64, options: &Options) -> Result<Self, ModelError> {
        params.validate()?;
        let (x, y) = (b1 as f64, b2 as f64);
        let bytes = ELEMENT_BYTES * x * y;
        let tcom = if options.use_bsp {
            let bsp = params.bsp.ok_or(ModelError::MissingParameter { option: "use_bsp", parameter: "bsp" })?;
            bsp.l + bsp.g * bytes
        } else {
            params.network.cost(bytes)
        };
        let tcom_read = match params.local_get {
            Some(local) if options.slave_reads && !options.use_bsp => local.cost(bytes),
            _ => tcom,
        };
        // Across hosts each transfer's round trip is latency at the
        // store's side of it, beside the link's time (`Params::network_latency`).
        let latency = if options.remote_slaves { params.network_latency.unwrap_or(0.0).max(0.0) } else { 0.0 };
        let tdget = params.disk_get.cost(bytes) + latency;
        let tdget_cached = params.disk_get_cached.map_or(0.0, |d| d.cost(bytes)) + latency;
        let tdput = latency
            + if options.cached_puts {
                params
                    .disk_put_cached
                    .ok_or(ModelError::MissingParameter { option: "cached_puts", parameter: "disk_put_cached" })?
                    .cost(bytes)
            } else {
                params.disk_put.cost(bytes)
            };
        let tdput_over = match params.disk_put_overwrite {
            Some(d) if !options.cached_puts => d.cost(bytes) + latency,
            _ => tdput,
        };
        let cube = x * x * x;
        Ok(Self {
            tdget,
            tdget_cached,
            tdput,
            tdput_over,
            tcom,
            tcom_read,
            tcom_at_slave: if options.slave_reads { tcom_read } else { 0.0 },
            tget: tdget + tcom_read,
            tget_cached: tdget_cached + tcom_read,
            tlead_extra: match params.local_get_behind {
                Some(behind) if options.prefetch_within_task && options.slave_reads && !options.use_bsp => {
                    (behind.cost(bytes) - tcom_read).clamp(0.0, tcom_read)
                }
                _ => 0.0,
            },
            tput: tdput + tcom,
            tmult: params.kernel_time(Kernel::Multiply, 2.0 * x * x * y),
            tmult_transposed: params.kernel_time(Kernel::MultiplyTransposed, 2.0 * x * x * y),
            tadd: if options.fused_update { 0.0 } else { params.add_rate().cost(x * y) },
            tsolve: params.kernel_time(Kernel::Solve, cube),
            tsolve_lu: params.kernel_time(Kernel::LuSolve, cube),
            tchol: params.kernel_time(Kernel::Factor, cube / 3.0),
            tlu: params.kernel_time(Kernel::Lu, 2.0 * cube / 3.0),
            tdiag_update: if options.diagonal_syrk {
                params.kernel_time(Kernel::Syrk, x * x * y)
            } else {
                params.kernel_time(Kernel::Multiply, 2.0 * x * x * y)
            },
        })
    }

    /// `tsub`, equal to `tadd` (4.2).
    pub fn tsub(&self) -> f64 {
        self.tadd
    }

    /// What writing a block over its older version saves on a new one.
    pub fn overwrite_saving(&self) -> f64 {
        self.tdput - self.tdput_over
    }

    /// The same primitives with every compute kernel `factor` times slower
    /// (the store node sharing the slaves' CPUs, [`crate::SharedCpu`]).
    pub fn slowed(&self, factor: f64) -> Self {
        Self {
            tmult: self.tmult * factor,
            tmult_transposed: self.tmult_transposed * factor,
            tadd: self.tadd * factor,
            tsolve: self.tsolve * factor,
            tsolve_lu: self.tsolve_lu * factor,
            tchol: self.tchol * factor,
            tlu: self.tlu * factor,
            tdiag_update: self.tdiag_update * factor,
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digest §3.7: with Table 4.5 "fast", b = 300 gives tget ≈ 0.414 s and
    /// tmult ≈ 2.0 s.
    #[test]
    fn fast_b300_matches_the_digest_recomputation() {
        let t = Primitives::square(&Params::thesis_fast(), 300, &Options::default()).unwrap();
        assert!((t.tget - 0.414).abs() < 0.001, "tget {}", t.tget);
        assert!((t.tmult - 2.0).abs() < 1e-9);
        assert!((t.tsolve - 1.0).abs() < 1e-9);
        assert!((t.tchol - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn small_blocks_pay_the_thresholds() {
        // HP: Dput threshold 0.3 MB at 1.6 MB/s => a put never costs less
        // than 0.1875 s on disk; C threshold 0.05 MB at 1 MB/s => 0.05 s.
        let t = Primitives::square(&Params::thesis_hp(), 10, &Options::default()).unwrap();
        assert!((t.tdput - 0.1875).abs() < 1e-12);
        assert!((t.tcom - 0.05).abs() < 1e-12);
        // P threshold 30³ flop at 30 Mflop/s.
        assert!((t.tmult - 27_000.0 / 30e6).abs() < 1e-15);
    }

    #[test]
    fn rect_blocks_follow_5_21() {
        let p = Params::thesis_fast();
        let t = Primitives::rect(&p, 200, 800, &Options::default()).unwrap();
        assert!((t.tmult - 2.0 * 200.0 * 200.0 * 800.0 / 27e6).abs() < 1e-12);
        assert!((t.tadd - 200.0 * 800.0 / 27e6).abs() < 1e-12);
    }

    #[test]
    fn measured_kernel_curves_replace_the_piecewise_rates() {
        let b = 512.0f64;
        let cube = b * b * b;
        let mut params = Params::thesis_fast();
        let piecewise = Primitives::square(&params, 512, &Options::default()).unwrap();
        params.kernels = Some(crate::KernelCurves {
            multiply: vec![[2.0 * cube / 8.0, 1e-3], [2.0 * cube, 6e-3]],
            solve: vec![[cube, 5e-3]],
            syrk: vec![[cube, 3.5e-3]],
            ..Default::default()
        });
        let t = Primitives::square(&params, 512, &Options::default()).unwrap();
        assert_eq!(t.tmult, 6e-3);
        assert_eq!(t.tsolve, 5e-3);
        // No curve of LU's solves: Cholesky's solve stands in; with one, its own.
        assert_eq!(t.tsolve_lu, 5e-3);
        params.kernels.as_mut().unwrap().lu_solve = vec![[cube, 7e-3]];
        assert_eq!(Primitives::square(&params, 512, &Options::default()).unwrap().tsolve_lu, 7e-3);
        // No factor curve: the piecewise rate stays.
        assert_eq!(t.tchol, piecewise.tchol);
        // The thesis's diagonal update is a multiply; this implementation's a dsyrk.
        assert_eq!(t.tdiag_update, t.tmult);
        let syrk = Primitives::square(&params, 512, &Options { diagonal_syrk: true, ..Options::default() }).unwrap();
        assert_eq!(syrk.tdiag_update, 3.5e-3);
        // Without a curve dsyrk runs at P: half a multiply's flop.
        params.kernels = None;
        let half = Primitives::square(&params, 512, &Options { diagonal_syrk: true, ..Options::default() }).unwrap();
        assert!((half.tdiag_update - half.tmult / 2.0).abs() < 1e-12);
    }

    /// A slave on the store node's machine reads a block itself: with the
    /// measured local read, reads stop paying `C`; puts still do.
    #[test]
    fn local_reads_replace_the_network_for_reads_only() {
        let mut params = Params::thesis_fast();
        params.local_get = Some(crate::Piecewise::new(1e9, 0.0));
        let bytes = 8.0 * 300.0 * 300.0;
        let local = Options { slave_reads: true, ..Options::default() };
        let t = Primitives::square(&params, 300, &local).unwrap();
        assert!((t.tcom_read - bytes / 1e9).abs() < 1e-12);
        assert_eq!((t.tcom_at_slave, t.tget), (t.tcom_read, t.tdget + t.tcom_read));
        assert_eq!(t.tput, t.tdput + t.tcom);
        assert!(t.tcom > 10.0 * t.tcom_read);
        // Without slave reads (or without the parameter) reads pay C.
        let remote = Primitives::square(&params, 300, &Options::default()).unwrap();
        assert_eq!((remote.tcom_read, remote.tcom_at_slave), (remote.tcom, 0.0));
        params.local_get = None;
        let unmeasured = Primitives::square(&params, 300, &local).unwrap();
        assert_eq!(unmeasured.tcom_read, unmeasured.tcom);
    }

    /// A lead read behind the previous task's ending costs what
    /// `local_get_behind` measures beyond `local_get`, only for a slave
    /// that prefetches within its task and reads blocks itself.
    #[test]
    fn lead_reads_pay_the_read_behind_a_put() {
        let mut params = Params::thesis_fast();
        params.local_get = Some(crate::Piecewise::new(1e9, 0.0));
        params.local_get_behind = Some(crate::Piecewise::new(0.8e9, 0.0));
        let bytes = 8.0 * 300.0 * 300.0;
        let this = Options { slave_reads: true, prefetch_within_task: true, ..Options::default() };
        let t = Primitives::square(&params, 300, &this).unwrap();
        assert!((t.tlead_extra - (bytes / 0.8e9 - bytes / 1e9)).abs() < 1e-12, "{}", t.tlead_extra);
        // At most the quiet read again.
        params.local_get_behind = Some(crate::Piecewise::new(0.25e9, 0.0));
        let capped = Primitives::square(&params, 300, &this).unwrap();
        assert!((capped.tlead_extra - bytes / 1e9).abs() < 1e-12, "{}", capped.tlead_extra);
        params.local_get_behind = Some(crate::Piecewise::new(0.8e9, 0.0));
        for other in [Options { prefetch_within_task: false, ..this.clone() }, Options { slave_reads: false, ..this.clone() }] {
            assert_eq!(Primitives::square(&params, 300, &other).unwrap().tlead_extra, 0.0);
        }
        params.local_get_behind = None;
        assert_eq!(Primitives::square(&params, 300, &this).unwrap().tlead_extra, 0.0);
    }

    #[test]
    fn bsp_needs_parameters() {
        let o = Options { use_bsp: true, ..Options::default() };
        assert!(matches!(Primitives::square(&Params::thesis_fast(), 100, &o), Err(ModelError::MissingParameter { .. })));
    }
}
