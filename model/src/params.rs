//! Machine parameters (thesis §4.8.3, Table 4.5), each piecewise linear.
//!
//! A parameter is a bandwidth plus a threshold. Above the threshold the cost
//! of an operation is `size / bandwidth`; below it the bandwidth is taken as
//! proportional to the size, so the cost is that of the threshold,
//! `threshold / bandwidth` (thesis §4.8.3, "Model Parameters").
//!
//! Units are SI throughout: rates in flop/s or bytes/s, thresholds in flop
//! or bytes, MB = 10⁶ bytes (the thesis's asymptotic rates, 163, 58 and
//! 641 Mflop/s, reproduce only with MB = 10⁶).
//!
//! A parameter file (TOML) names the four thesis parameters and, optionally,
//! separate kernel rates, cached store rates and the BSP `g`, `l`:
//!
//! ```
//! let text = r#"
//!     name = "my cluster, measured by bench params"
//!     multiply = { bandwidth = 2.0e10, threshold = 1.0e6 }   # P, flop/s : flop
//!     solve    = { bandwidth = 1.5e10, threshold = 1.0e6 }   # optional
//!     factor   = { bandwidth = 1.0e10, threshold = 1.0e6 }   # optional
//!     network  = { bandwidth = 1.2e9,  threshold = 65536 }   # C, bytes/s : bytes
//!     disk_get = { bandwidth = 5.0e8,  threshold = 65536 }   # Dget, cold
//!     disk_get_cached = { bandwidth = 4.0e9 }                # optional
//!     disk_put = { bandwidth = 3.0e8,  threshold = 65536 }   # Dput, synced
//!     bsp = { g = 1.0e-9, l = 2.0e-5 }                       # optional
//! "#;
//! let p = model::Params::from_toml_str(text).unwrap();
//! assert_eq!(p.add_rate(), p.multiply); // add/sub default to P
//! ```

use serde::{Deserialize, Serialize};

use crate::corun::Corun;
use crate::curves::{Kernel, KernelCurves};
use crate::error::ParamsError;

/// One piecewise-linear parameter: `cost(x) = max(x, threshold) / bandwidth`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Piecewise {
    /// Units per second (flop/s or bytes/s).
    pub bandwidth: f64,
    /// Units (flop or bytes) below which the cost is constant.
    #[serde(default)]
    pub threshold: f64,
}

impl Piecewise {
    /// A bandwidth with a threshold.
    pub const fn new(bandwidth: f64, threshold: f64) -> Self {
        Self { bandwidth, threshold }
    }

    /// Seconds to process `units` (flop or bytes).
    pub fn cost(&self, units: f64) -> f64 {
        units.max(self.threshold) / self.bandwidth
    }

    fn validate(&self, name: &str) -> Result<(), ParamsError> {
        if !(self.bandwidth.is_finite() && self.bandwidth > 0.0) {
            return Err(ParamsError::Invalid {
                name: format!("{name}.bandwidth"),
                value: self.bandwidth,
                reason: "must be finite and > 0",
            });
        }
        if !(self.threshold.is_finite() && self.threshold >= 0.0) {
            return Err(ParamsError::Invalid {
                name: format!("{name}.threshold"),
                value: self.threshold,
                reason: "must be finite and >= 0",
            });
        }
        Ok(())
    }
}

/// BSP cost parameters of the transport (DESIGN §8), optional: when present
/// and selected in [`crate::Options::use_bsp`], a block transfer over the
/// network costs `l + g·bytes` instead of `bytes / C`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bsp {
    /// Seconds per byte of an h-relation (the BSP `g`, here per byte).
    pub g: f64,
    /// Seconds of barrier latency (the BSP `l`).
    pub l: f64,
}

/// The parameter file: one machine (or cluster) described for the model.
///
/// `P` is the block multiply rate; the thesis takes it for every block
/// operation (§4.8.3). This implementation lets the solve, factor and
/// add/subtract kernels have their own rates (a measuring command can fill
/// them); when absent they default to `P`, which is the thesis's model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Free text: where these numbers come from.
    #[serde(default)]
    pub name: String,
    /// `P`: block multiply rate (flop/s : flop), eq. (4.1).
    pub multiply: Piecewise,
    /// Triangular-solve rate; `P` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solve: Option<Piecewise>,
    /// Block factorisation (Cholesky, LU) rate; `P` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<Piecewise>,
    /// Block add/subtract rate (eq. 4.2); `P` if absent. The thesis measured
    /// add/sub far slower than multiply (1.6 Mflop/s on the HP710, 4.5 on the
    /// Pentium, §4.8.1) but modelled them at `P`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<Piecewise>,
    /// `C`: network bandwidth store node <-> slave (bytes/s : bytes), eq. (4.3).
    pub network: Piecewise,
    /// `Dget`: store read rate from disk, cold (bytes/s : bytes).
    pub disk_get: Piecewise,
    /// Store read rate when the block is in the store node's memory (level 2
    /// of §3.5). Absent: a cache read is free, as in the thesis (§4.8.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_get_cached: Option<Piecewise>,
    /// `Dput`: store write rate, durable (bytes/s : bytes).
    pub disk_put: Piecewise,
    /// Store write rate when writes are absorbed by memory (not synced).
    /// Used only with [`crate::Options::cached_puts`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_put_cached: Option<Piecewise>,
    /// Store write rate for a block written over an older version of it
    /// (extension): the store overwrites a replaced version's file in
    /// place, which costs less than a new file. Absent: `disk_put`. Used
    /// for LU's in-place updates ([`crate::Options::lu_parallel_solves`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_put_overwrite: Option<Piecewise>,
    /// Extension: a whole block read by a slave on the store node's
    /// machine, which the node answers with the version file's descriptor
    /// and the slave reads and checksums itself (bytes/s : bytes), from
    /// the store's memory. It replaces `C` for reads with
    /// [`crate::Options::slave_reads`]: no bytes cross a socket, and `C`
    /// (a loopback TCP stream) charged a 512 KiB read 0.17 ms and an
    /// 8 MiB one 2.8 ms where such reads took 0.09 and 1.45 ms. Absent: `C`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_get: Option<Piecewise>,
    /// Extension: `local_get` made while a put and commit of a block of
    /// the same size are in flight at the store node (bytes/s : bytes), as
    /// a slave's first reads of a task are while its previous task's
    /// ending goes on behind (write-behind). Charged for the reads a task's
    /// first kernel waits for ([`crate::schedule::TaskCost::lead`]) with
    /// [`crate::Options::prefetch_within_task`]. On this VM a 512 KiB get
    /// took 0.18–0.20 ms so, against 0.08–0.11 ms on a quiet node; LU's
    /// two-block solve tasks waited 0.19 ms per block in a job. Absent:
    /// `local_get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_get_behind: Option<Piecewise>,
    /// BSP `g` and `l` of the transport, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bsp: Option<Bsp>,
    /// Ray tracing: pixels rendered per second by one slave (scene
    /// dependent). Absent: the thesis's "balls" scene on the HP710,
    /// 512² pixels in 1130 s (§4.8.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_pixel_rate: Option<f64>,
    /// Ray tracing (extension): the relative cost of equal horizontal
    /// bands of the image, top to bottom; a task's rows cost their bands'
    /// share of `ray_pixel_rate`'s average ("balls" at 1024², 8 tasks: the
    /// top one costs a quarter of the average, the fifth 1.4 times it).
    /// Absent: every row costs the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_profile: Option<Vec<f64>>,
    /// Extension: seconds every task pays whatever its blocks: the slave's
    /// begin, dequeue, task-done record and commit round trips and the
    /// store's synced commit (measured by `bench params` as an empty task).
    /// The thesis folded this into the thresholds of `Dget`/`Dput`; with
    /// today's fast kernels and small blocks it is a visible share of a
    /// task. Charged half at the store (serialised, [`crate::schedule::TaskCost::disk`])
    /// and half at the slave, see [`crate::schedule::Step::with_task_overhead`].
    /// Absent: 0, the thesis's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_overhead: Option<f64>,
    /// Extension: seconds more a task's round trips take when the slave and
    /// the store node idled through the previous task's compute, as they do
    /// in a job (measured by `bench params`: an empty task after a 5 ms
    /// pause, less `task_overhead`). On this VM a waking thread's CPU may
    /// have halted, and waking it is the host's work: the first call after
    /// a kernel took 0.7–1.0 ms in a matmul job (b = 256), the next ones
    /// 0.2 ms. Latency, not the store's work: charged at the slave.
    /// Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_wake: Option<f64>,
    /// Extension: seconds more a task's start (its begin and dequeue
    /// beside its failure-flag read) takes while the previous task's
    /// ending (a put of this many bytes sent as the task wrote it, its
    /// record and commit) runs behind it, as it does under write-behind:
    /// measured `[bytes, seconds]` points by increasing bytes, from `bench
    /// params` against
    /// the same start with nothing behind it, interpolated as the kernel
    /// curves are ([`crate::curves`]). On this VM 0.07–0.10 ms with a
    /// block of up to 128 KiB behind, 0.19 ms at 512 KiB, 0.41 ms at 2 MiB
    /// and 1.3 ms at 8 MiB: the node and the slave's runtime move the block's bytes on
    /// the two cores the start needs. A fixed part plus a rate, which one
    /// piecewise-linear parameter cannot follow (fitted, it was half the
    /// measured cost at 512 KiB and twice it at 8 MiB). Charged at the
    /// slave per task, with [`crate::Options::write_behind`]. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_start_behind: Option<Vec<[f64; 2]>>,
    /// Extension: seconds of a task's whole ending under write-behind, from
    /// its last kernel to its commit answered: the put of a block of this
    /// many bytes, the done record read and written, the synced commit,
    /// each a round trip after the last. Measured `[bytes, seconds]` points
    /// by increasing bytes (`bench params`, the mean of endings started
    /// after a pause, a task start beside each), interpolated as
    /// [`Params::task_start_behind`]. The dag Cholesky's successors wait
    /// for it, and its counter locks are held through it: composed from the
    /// put rate and half the empty task's round trips it was 0.4 ms at
    /// 512 KiB, where jobs measured 1.0 ms (median) to 1.3 ms (mean), one
    /// slave, n = 4096, b = 256. Absent: that composition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_ending: Option<Vec<[f64; 2]>>,
    /// Extension: slave seconds of a dag Cholesky task's release request
    /// (its successors' counters read under their write locks in one round
    /// trip from the task's thread, their new values written behind),
    /// measured by `bench params`. Absent: [`crate::DAG_RELEASE_SHARE`] of
    /// `task_overhead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dag_release: Option<f64>,
    /// Extension: seconds more a release request takes per successor's
    /// counter it names (each locked, read, and written back), measured by
    /// `bench params` from requests of two sizes; with it, `dag_release`
    /// is the request's fixed part. A dag task names one counter per
    /// successor, `p − 1 − j` in column `j`: 10 on average at n = 4096,
    /// b = 256, 21 at n = 8192, where the release read took 0.49–0.69 ms
    /// against 0.24 (one slave, per task). Absent: 0, every request
    /// costs `dag_release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dag_release_per_counter: Option<f64>,
    /// Extension: seconds from a job's submission until its first task
    /// starts and after its last commit until the job is recorded finished
    /// (idle slaves look for new jobs every 10 ms; the last slave writes the finished
    /// record). Added once to every time the model predicts. Measured by
    /// `bench params` as the run time of a job of one empty task. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_latency: Option<f64>,
    /// Extension: seconds from starting a slave process until it has
    /// committed its first task (process start, connection, session,
    /// dequeue): what a replacement for a failed slave takes before it
    /// works. Measured by `bench params`. Absent: 0, the thesis's recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slave_start: Option<f64>,
    /// Extension: CPU seconds the store node spends on each task's
    /// requests (begin, dequeue, done record, commit), beyond its block
    /// transfers. With [`crate::SharedCpu`] it is the store's share of the
    /// cores along with its transfers: with no core spare it is taken from
    /// the slaves' kernels. Measured by `bench params` as the store
    /// process's CPU over jobs of many empty tasks. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_cpu_per_task: Option<f64>,
    /// Extension: CPU seconds the store node spends on each block get it
    /// serves from memory (its lock, the version file found and passed).
    /// With [`crate::SharedCpu`] it loads the cores as
    /// [`Params::store_cpu_per_task`] does, once per block read; not a
    /// latency, since a slave's measured get (`local_get`) already holds
    /// the node's part. Measured by `bench params` as the store process's
    /// CPU over thousands of gets (0.024–0.039 ms here). Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_cpu_per_get: Option<f64>,
    /// Extension: CPU seconds a slave spends on each task beyond its
    /// kernels and reads (its side of begin, dequeue, record and commit,
    /// its runtime's wake-ups). Like [`Params::store_cpu_per_task`] it
    /// loads the cores beside the kernels. Measured by `bench params` as
    /// the slave processes' CPU over the same jobs. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slave_cpu_per_task: Option<f64>,
    /// Extension: the kernels' measured times by size
    /// ([`crate::curves`]); when a kernel has a curve, it is used instead
    /// of its piecewise rate. Absent: the thesis's piecewise rates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelCurves>,
    /// Extension: how many times longer a kernel takes while other slaves
    /// compute on the machine's other cores ([`crate::corun`]). Applied
    /// with [`crate::SharedCpu`], one machine's cores. Absent: 1, each
    /// core as fast as one alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corun: Option<Corun>,
    /// Extension: seconds a block transfer across hosts takes beyond its
    /// bytes at `C` (the request's round trip and the reply's framing),
    /// for slaves on other hosts ([`crate::Options::remote_slaves`]). It
    /// is latency, not link time: the link carries other slaves' bytes
    /// meanwhile, so it is priced at the store's side of a transfer, not
    /// in `C`. Measured by `bench params --hosts` as one get's time less
    /// its bytes at the streaming rate. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_latency: Option<f64>,
}

/// MB as the thesis uses it: 10⁶ bytes.
pub const MB: f64 = 1e6;
/// Mflop as the thesis uses it: 10⁶ flop.
pub const MFLOP: f64 = 1e6;
/// Bytes per matrix element (f64).
pub const ELEMENT_BYTES: f64 = 8.0;
/// Bytes per ray-traced pixel (3 doubles, thesis §2.5 / Table 4.2).
pub const PIXEL_BYTES: f64 = 24.0;
/// Bytes per pixel this implementation stores (8-bit RGB).
pub const IMPLEMENTATION_PIXEL_BYTES: f64 = 3.0;

/// [`crate::Options::slave_overlap_share`] of this implementation's slave
/// with blocks of 1 MiB and more: it fetches one block ahead while a
/// matmul or factorisation update reads its blocks in pairs, so the second
/// block of each pair is read with nothing to overlap it.
pub const ONE_BLOCK_AHEAD_OF_PAIRS: f64 = 0.5;
/// [`crate::Options::slave_prefetch_bytes`] of this implementation's slave
/// (`slave::ctx::PREFETCH_BYTES`): smaller blocks go several ahead.
pub const SLAVE_PREFETCH_BYTES: f64 = (2 << 20) as f64;
/// Pixel rate of the thesis's ray tracer: 512² pixels of "balls" in 1130 s
/// on an HP710 (§4.8.2).
pub const THESIS_RAY_PIXEL_RATE: f64 = 512.0 * 512.0 / 1130.0;

fn mflops(rate: f64, threshold_ops: f64) -> Piecewise {
    Piecewise::new(rate * MFLOP, threshold_ops)
}

fn mbs(rate: f64, threshold_mb: f64) -> Piecewise {
    Piecewise::new(rate * MB, threshold_mb * MB)
}

impl Params {
    /// Thesis Table 4.5, **fast** configuration (Pentium 133, Fast Ethernet,
    /// IBM disk): P 27 Mflop/s : 30³, C 4.6 MB/s : 0.25 MB, Dget 2.8 : 0.11,
    /// Dput 2.8 : 0.11. All kernels at `P`.
    pub fn thesis_fast() -> Self {
        Self {
            name: "thesis Table 4.5 fast (P5/133, Fast Ethernet, IBM disk)".into(),
            multiply: mflops(27.0, 27_000.0),
            solve: None,
            factor: None,
            add: None,
            network: mbs(4.6, 0.25),
            disk_get: mbs(2.8, 0.11),
            disk_get_cached: None,
            disk_put: mbs(2.8, 0.11),
            disk_put_cached: None,
            disk_put_overwrite: None,
            local_get: None,
            local_get_behind: None,
            bsp: None,
            ray_pixel_rate: None,
            ray_profile: None,
            task_overhead: None,
            task_wake: None,
            task_start_behind: None,
            task_ending: None,
            dag_release: None,
            dag_release_per_counter: None,
            job_latency: None,
            slave_start: None,
            store_cpu_per_task: None,
            store_cpu_per_get: None,
            slave_cpu_per_task: None,
            kernels: None,
            corun: None,
            network_latency: None,
        }
    }

    /// Thesis Table 4.5, **HP** configuration (HP710/730, 10 Mbit Ethernet):
    /// P 30 Mflop/s : 30³, C 1 MB/s : 0.05 MB, Dget 1.6 : 0, Dput 1.6 : 0.3.
    pub fn thesis_hp() -> Self {
        Self {
            name: "thesis Table 4.5 HP (HP710/730, 10 Mbit Ethernet)".into(),
            multiply: mflops(30.0, 27_000.0),
            network: mbs(1.0, 0.05),
            disk_get: mbs(1.6, 0.0),
            disk_put: mbs(1.6, 0.3),
            ..Self::thesis_fast()
        }
    }

    /// Thesis Table 4.5, **ATM** configuration (P5/133, ATM, RAID-0 store
    /// node): P 27 : 30³, C 9.0 : 0.11, Dget 5.5 : 0.3, Dput 2.4 : 0.3.
    pub fn thesis_atm() -> Self {
        Self {
            name: "thesis Table 4.5 ATM (P5/133, ATM switch, RAID-0)".into(),
            network: mbs(9.0, 0.11),
            disk_get: mbs(5.5, 0.3),
            disk_put: mbs(2.4, 0.3),
            ..Self::thesis_fast()
        }
    }

    /// The same set with the add/subtract kernel at its own rate
    /// (flop/s, no threshold): the thesis measured 1.6 Mflop/s on the HP710
    /// and 4.5 Mflop/s on the Pentium (§4.8.1).
    pub fn with_add_rate(mut self, flops: f64) -> Self {
        self.add = Some(Piecewise::new(flops, 0.0));
        self
    }

    /// Solve rate, `P` when not given.
    pub fn solve_rate(&self) -> Piecewise {
        self.solve.unwrap_or(self.multiply)
    }

    /// Factorisation rate, `P` when not given.
    pub fn factor_rate(&self) -> Piecewise {
        self.factor.unwrap_or(self.multiply)
    }

    /// Add/subtract rate, `P` when not given.
    pub fn add_rate(&self) -> Piecewise {
        self.add.unwrap_or(self.multiply)
    }

    /// Seconds `kernel` takes for `flop`: from its measured curve if there
    /// is one, else from its piecewise rate (dsyrk at `P`, dgetrf at the
    /// factor rate).
    pub fn kernel_time(&self, kernel: Kernel, flop: f64) -> f64 {
        if let Some(curve) = self.kernels.as_ref().map(|k| k.of(kernel)).filter(|c| !c.is_empty()) {
            return crate::curves::interpolate(curve, flop);
        }
        let rate = match kernel {
            // Measured files before LU's solves were swept: Cholesky's solve.
            Kernel::LuSolve => return self.kernel_time(Kernel::Solve, flop),
            // Files from before the transposed dgemm was swept: dgemm's.
            Kernel::MultiplyTransposed => return self.kernel_time(Kernel::Multiply, flop),
            Kernel::Multiply | Kernel::Syrk => self.multiply,
            Kernel::Solve => self.solve_rate(),
            Kernel::Factor | Kernel::Lu => self.factor_rate(),
        };
        rate.cost(flop)
    }

    /// Ray tracing pixel rate, the thesis's when not given.
    pub fn ray_rate(&self) -> f64 {
        self.ray_pixel_rate.unwrap_or(THESIS_RAY_PIXEL_RATE)
    }

    /// The cost of rows `first..first + rows` of a `side`-row image
    /// relative to the image's average row, from [`Params::ray_profile`]
    /// (each band stands for an equal share of the rows); 1 without one.
    pub fn ray_rows_weight(&self, first: u64, rows: u64, side: u64) -> f64 {
        let Some(bands) = self.ray_profile.as_deref().filter(|b| !b.is_empty() && rows > 0 && side > 0) else { return 1.0 };
        let k = bands.len() as f64;
        let mean = bands.iter().sum::<f64>() / k;
        // The rows as a span of band units, integrated band by band.
        let (lo, hi) = (first as f64 / side as f64 * k, ((first + rows) as f64 / side as f64 * k).min(k));
        let covered: f64 = bands.iter().enumerate().map(|(i, &w)| w * (hi.min(i as f64 + 1.0) - lo.max(i as f64)).max(0.0)).sum();
        if hi > lo {
            covered / (hi - lo) / mean
        } else {
            1.0
        }
    }

    /// The same machine without this implementation's per-task costs
    /// (extensions): no request round trips, wake-ups, starts behind
    /// endings, release requests, per-task CPU, nor the job's latency, as
    /// the thesis's model has none.
    pub fn without_task_costs(&self) -> Params {
        Params {
            task_overhead: None,
            task_wake: None,
            task_start_behind: None,
            task_ending: None,
            dag_release: None,
            dag_release_per_counter: None,
            job_latency: None,
            store_cpu_per_task: None,
            slave_cpu_per_task: None,
            ..self.clone()
        }
    }

    /// The same machine with every block and pixel transfer free: no
    /// network, disk or local get costs, nor the store's CPU per get.
    pub fn with_free_transfers(&self) -> Params {
        const FREE: Piecewise = Piecewise { bandwidth: 1e30, threshold: 0.0 };
        Params {
            network: FREE,
            disk_get: FREE,
            disk_get_cached: None,
            disk_put: FREE,
            disk_put_cached: None,
            disk_put_overwrite: None,
            local_get: None,
            local_get_behind: None,
            store_cpu_per_get: None,
            network_latency: None,
            ..self.clone()
        }
    }

    /// Checks every rate and threshold.
    pub fn validate(&self) -> Result<(), ParamsError> {
        self.multiply.validate("multiply")?;
        for (name, p) in [
            ("solve", self.solve),
            ("factor", self.factor),
            ("add", self.add),
            ("disk_get_cached", self.disk_get_cached),
            ("disk_put_cached", self.disk_put_cached),
            ("disk_put_overwrite", self.disk_put_overwrite),
            ("local_get", self.local_get),
            ("local_get_behind", self.local_get_behind),
        ] {
            if let Some(p) = p {
                p.validate(name)?;
            }
        }
        self.network.validate("network")?;
        self.disk_get.validate("disk_get")?;
        self.disk_put.validate("disk_put")?;
        if let Some(bsp) = self.bsp {
            for (name, v) in [("bsp.g", bsp.g), ("bsp.l", bsp.l)] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(ParamsError::Invalid { name: name.into(), value: v, reason: "must be finite and >= 0" });
                }
            }
        }
        for (name, v) in [
            ("task_overhead", self.task_overhead),
            ("task_wake", self.task_wake),
            ("dag_release", self.dag_release),
            ("dag_release_per_counter", self.dag_release_per_counter),
            ("job_latency", self.job_latency),
            ("slave_start", self.slave_start),
            ("store_cpu_per_task", self.store_cpu_per_task),
            ("store_cpu_per_get", self.store_cpu_per_get),
            ("slave_cpu_per_task", self.slave_cpu_per_task),
        ] {
            let Some(t) = v else { continue };
            if !(t.is_finite() && t >= 0.0) {
                return Err(ParamsError::Invalid { name: name.into(), value: t, reason: "must be finite and >= 0" });
            }
        }
        if let Some(k) = &self.kernels {
            k.validate()?;
        }
        if let Some(c) = &self.corun {
            c.validate()?;
        }
        if let Some(points) = &self.task_ending {
            crate::curves::validate_points("task_ending", points)?;
        }
        if let Some(points) = &self.task_start_behind {
            crate::curves::validate_points("task_start_behind", points)?;
        }
        for &w in self.ray_profile.iter().flatten() {
            if !(w.is_finite() && w > 0.0) {
                return Err(ParamsError::Invalid {
                    name: "ray_profile".into(),
                    value: w,
                    reason: "every band's cost must be finite and > 0",
                });
            }
        }
        if let Some(r) = self.ray_pixel_rate {
            if !(r.is_finite() && r > 0.0) {
                return Err(ParamsError::Invalid { name: "ray_pixel_rate".into(), value: r, reason: "must be finite and > 0" });
            }
        }
        Ok(())
    }

    /// Parses and validates a TOML parameter file's text.
    pub fn from_toml_str(text: &str) -> Result<Self, ParamsError> {
        let params: Self = toml::from_str(text)?;
        params.validate()?;
        Ok(params)
    }

    /// Writes the parameter set as TOML.
    pub fn to_toml_string(&self) -> Result<String, ParamsError> {
        Ok(toml::to_string_pretty(self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rays_rows_cost_their_bands_share() {
        let mut p = Params::thesis_fast();
        assert_eq!(p.ray_rows_weight(0, 10, 100), 1.0, "no profile: every row the same");
        // Two bands, the top one a third of the bottom one's cost.
        p.ray_profile = Some(vec![1.0, 3.0]);
        assert!((p.ray_rows_weight(0, 50, 100) - 0.5).abs() < 1e-12);
        assert!((p.ray_rows_weight(50, 50, 100) - 1.5).abs() < 1e-12);
        // A span across both: a quarter of it in the top band.
        assert!((p.ray_rows_weight(25, 50, 100) - 1.0).abs() < 1e-12);
        assert!((p.ray_rows_weight(40, 20, 100) - 1.0).abs() < 1e-12);
        assert!((p.ray_rows_weight(0, 100, 100) - 1.0).abs() < 1e-12);
        // The whole image costs its rows at the average rate, however split.
        p.ray_profile = Some(vec![0.2, 0.9, 1.4, 1.1, 0.7]);
        for grain in [1u64, 7, 33, 100, 1000] {
            let total: f64 = (0..1000u64.div_ceil(grain))
                .map(|k| p.ray_rows_weight(k * grain, grain.min(1000 - k * grain), 1000) * grain.min(1000 - k * grain) as f64)
                .sum();
            assert!((total - 1000.0).abs() < 1e-6, "grain {grain}: {total}");
        }
        p.ray_profile = Some(vec![1.0, -1.0]);
        assert!(p.validate().is_err());
    }

    #[test]
    fn below_threshold_costs_the_threshold() {
        let p = Piecewise::new(2.0, 10.0);
        assert_eq!(p.cost(1.0), 5.0);
        assert_eq!(p.cost(10.0), 5.0);
        assert_eq!(p.cost(20.0), 10.0);
    }

    #[test]
    fn toml_round_trip_keeps_every_field() {
        let mut p = Params::thesis_hp().with_add_rate(1.6e6);
        p.bsp = Some(Bsp { g: 1e-9, l: 1e-5 });
        p.disk_get_cached = Some(Piecewise::new(1e9, 0.0));
        p.task_overhead = Some(2.5e-3);
        p.job_latency = Some(0.2);
        p.ray_profile = Some(vec![0.5, 1.5]);
        let text = p.to_toml_string().unwrap();
        assert_eq!(Params::from_toml_str(&text).unwrap(), p);
    }

    #[test]
    fn minimal_file_defaults_kernels_to_p() {
        let text = r#"
            multiply = { bandwidth = 1e9, threshold = 0 }
            network = { bandwidth = 1e9 }
            disk_get = { bandwidth = 5e8 }
            disk_put = { bandwidth = 2e8 }
        "#;
        let p = Params::from_toml_str(text).unwrap();
        assert_eq!(p.solve_rate(), p.multiply);
        assert_eq!(p.add_rate(), p.multiply);
        assert!(p.bsp.is_none());
    }

    #[test]
    fn rejects_zero_bandwidth() {
        let text = r#"
            multiply = { bandwidth = 0 }
            network = { bandwidth = 1e9 }
            disk_get = { bandwidth = 5e8 }
            disk_put = { bandwidth = 2e8 }
        "#;
        match Params::from_toml_str(text) {
            Err(ParamsError::Invalid { name, .. }) => assert_eq!(name, "multiply.bandwidth"),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }
}
