//! `model`: the performance model of the fault-tolerant bag-of-tasks
//! system, after J. A. Smith, *Fault-Tolerant Parallel Applications Using a
//! Network of Workstations*, PhD thesis, Newcastle, 1997, ch. 3, §4.8,
//! ch. 5, App. A and B. A pure library: no I/O except (de)serialising the
//! parameter file.
//!
//! * [`Params`]: the machine, each parameter piecewise linear (bandwidth
//!   and threshold): block multiply rate `P` (and optional solve, factor,
//!   add rates), network `C`, store read/write `Dget`/`Dput`, cold and
//!   cached, optional BSP `g`, `l`. Table 4.5's sets are
//!   [`Params::thesis_fast`], [`Params::thesis_hp`], [`Params::thesis_atm`].
//! * [`Primitives`]: block operation times, eqs. 4.1–4.3 and 5.21–5.22.
//! * [`predict`]: `T₁`, `lwr/upr{T∞}`, `lwr/upr{T_s}`, tasks, data volumes,
//!   memory per slave and recovery for every application: [`matmul`]
//!   (3.12–3.17, Table 3.3), [`cholesky`] single-bag, multi-step(1),
//!   multi-step(2) (3.18–3.25, A.6–A.15, Table 3.4) and a dependency-driven
//!   variant, [`lu`] with and without pivoting (5.26–5.31, B.1–B.9),
//!   [`raytrace`] (Table 4.4); [`recovery`] (§3.6).
//! * [`dataparallel`]: the data-parallel multiply against the bag of tasks
//!   (§5.6, 5.21–5.25) and the BSP engine this implementation runs.
//! * [`sweep`]: block size for a memory budget (5.2–5.5, 5.7–5.17) and
//!   sweeps over `b` and `s`.
//!
//! Extensions beyond the thesis, all off in [`Options::default`]: server
//! double buffering and slave overlap (§5.5 as options of every app), the
//! store node sharing the slaves' CPUs ([`SharedCpu`]), BSP `g`/`l` for the
//! network cost, cached puts, per-task ray-tracing overheads, an upper
//! bound on `T_s` for `s < N`, the dag Cholesky variant (its point
//! prediction a simulated run of its task graph, [`simulate`]), write-behind,
//! slaves that read blocks from the store's files themselves
//! ([`Options::slave_reads`]: not the store's serialised time, but CPU all
//! the same), dsyrk diagonal updates ([`Options::diagonal_syrk`]), and
//! kernels timed from measured curves by size ([`curves`], when the
//! parameter file has them). The dag's critical path runs at the one-slave
//! CPU slow-down.
//!
//! # Example
//!
//! ```
//! use model::{predict, App, Options, Params};
//!
//! // Thesis Table 4.3: 3000² multiply, b = 300, one slave, "fast":
//! // measured 2984 s.
//! let p = predict(App::Matmul, 3000, 300, &Params::thesis_fast(), &Options::default()).unwrap();
//! assert!((p.t1 - 2984.0).abs() / 2984.0 < 0.05);
//! assert_eq!(p.volumes.n_tasks, 100);
//! assert_eq!((p.volumes.get_bytes / 1e6).round(), 1440.0);
//!
//! // Four slaves: the prediction is lwr{T_s} >= T₁/4.
//! let p4 = predict(App::Matmul, 3000, 300, &Params::thesis_fast(), &Options::with_slaves(4)).unwrap();
//! assert!(p4.predicted >= p.t1 / 4.0 && p4.t_s.lwr <= p4.t_s.upr);
//! ```

pub mod checkpoint;
pub mod cholesky;
pub mod corun;
pub mod curves;
pub mod dataparallel;
mod error;
pub mod lu;
pub mod matmul;
mod options;
mod params;
mod parts;
mod predict;
mod primitives;
pub mod raytrace;
pub mod recovery;
pub mod schedule;
pub mod simulate;
pub mod sweep;
mod volumes;

pub use cholesky::Variant;
pub use corun::Corun;
pub use curves::{Kernel, KernelCurves};
pub use error::{ModelError, ParamsError};
pub use options::{CholeskyCaching, MatmulCaching, Options, Preset, SharedCpu, ENDING_THREADS};
pub use params::{
    Bsp, Params, Piecewise, ELEMENT_BYTES, IMPLEMENTATION_PIXEL_BYTES, MB, MFLOP, ONE_BLOCK_AHEAD_OF_PAIRS, PIXEL_BYTES,
    SLAVE_PREFETCH_BYTES, THESIS_RAY_PIXEL_RATE,
};
pub use parts::{parts, Parts};
pub use predict::{predict, App, Prediction, BARRIER_SHARE, DAG_RELEASE_SHARE, TASK_OVERHEAD_STORE_SHARE};
pub use primitives::Primitives;
pub use recovery::{Held, Recovery};
pub use schedule::Bounds;
pub use sweep::{max_block, recommend, MemoryLayout, Recommendation};
pub use volumes::{block_widths, Volumes};
