//! Options: how the run is organised, and the extensions of the thesis's
//! model for this implementation (each off by default, so the default
//! options give the thesis's equations).

use serde::{Deserialize, Serialize};

/// Caching organisations for matrix multiply (thesis Table 3.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MatmulCaching {
    /// 1. No caching: `N₃ = 2p³`.
    #[default]
    None,
    /// 2. One block of A at the server, slaves in step: `N₂ = (p³/s)(s−1)`,
    ///    `N₃ = (p³/s)(s+1)`, `m₂ = 8b²`.
    ServerBlockOfA,
    /// 3. A block row of A at the server (`s ≤ p`): `N₂ = p²(p−1)`,
    ///    `N₃ = p²(p+1)`, `m₂ = 8nb(1+s)` (file-system LRU).
    ServerBlockRow,
    /// 4. Both operands at the server: `N₂ = 2p²(p−1)`, `N₃ = 2p²`, `m₂ = 16n²`.
    ServerAll,
    /// 5. The first `c < p` blocks of each A row at the slave:
    ///    `N₁ = cp(p−1)`, `N₃ = p(2p² − cp + c)`, `m₁ = 8cb²`.
    SlaveBlocks {
        /// Blocks cached per slave.
        c: u64,
    },
    /// 6. A block row of A at the slave: `N₁ = p²(p−1)`, `N₃ = p²(p+1)`, `m₁ = 8nb`.
    SlaveBlockRow,
    /// 7. Everything at the slave: `N₁ = p²(2p−1−s)`, `N₃ = p²(1+s)`,
    ///    `m₁ = 8n(n+b)`.
    SlaveAll,
}

/// Caching organisations for Cholesky (thesis Table 3.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CholeskyCaching {
    /// 1. No caching: `N₃ = (p/6)(p+1)(2p+1)`.
    #[default]
    None,
    /// 2. A block row at the server (`s ≤ p`): `N₂ = (p/6)(p²−1)`,
    ///    `N₃ = (p/6)(p+1)(p+2)`, `m₂ = 16nbs`.
    ServerBlockRow,
    /// 3. Everything at the server: `N₂ = (p/3)(p²−1)`, `N₃ = (p/2)(p+1)`,
    ///    `m₂ = 16n²`.
    ServerAll,
}

/// The store node shares the CPUs of one machine with the slaves
/// (extension: the thesis's store ran on its own workstation). With `s`
/// slaves and a store that keeps `store_share` cores busy, each slave's
/// compute runs `max(1, (s + store_share)/cores)` times slower. `predict`
/// scales `store_share` (the cores the store uses *while serving*) by the
/// fraction of the predicted run the store is busy. A slave's reads overlap its
/// compute only on a spare core ([`SharedCpu::spare_core`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedCpu {
    /// Cores of the machine.
    pub cores: u64,
    /// Cores' worth of CPU the store node uses while serving (e.g. 1.0).
    pub store_share: f64,
}

impl SharedCpu {
    /// Slow-down factor of compute with `slaves` slaves on the machine.
    pub fn slowdown(&self, slaves: u64) -> f64 {
        self.slowdown_of(slaves as f64)
    }

    /// Slow-down factor of compute with `computing` cores' worth of
    /// kernels on the machine (slaves that compute part of the time).
    pub fn slowdown_of(&self, computing: f64) -> f64 {
        ((computing + self.store_share) / self.cores.max(1) as f64).max(1.0)
    }

    /// The share of a slave's prefetched reads that can overlap its compute
    /// with `slaves` slaves on the machine: the cores left once the slaves'
    /// kernels and the store have theirs, at most one. This
    /// implementation's slave reads (and checksums) its blocks on a thread
    /// of its own beside its kernel, so a read hides behind compute only on
    /// a core nobody else computes on; with no such core the read runs in
    /// the kernel's place. Two slaves on two cores hide none; one slave
    /// hides its reads while the store leaves the second core free. (n =
    /// 4096 on two cores, two slaves: Cholesky at b = 256 waited 1.1–1.2 ms
    /// per task for prefetched reads, against 0.55 with one slave; with
    /// this, 24 of this session's 24 grid points were within 10 % of the
    /// better of two `bench validate` runs, mean 2.5 %, against 20, mean
    /// 3.9 %, the two-slave points at b ≤ 512 having been 6–15 % under.)
    pub fn spare_core(&self, slaves: u64) -> f64 {
        (self.cores as f64 - slaves as f64 - self.store_share).clamp(0.0, 1.0)
    }
}

/// How a run is organised. `Options::default()` is the thesis's model with
/// one slave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// `s`, the number of slaves.
    pub slaves: u64,
    /// Matrix multiply caching organisation (Table 3.3).
    pub matmul_caching: MatmulCaching,
    /// Cholesky caching organisation (Table 3.4). The cached share of reads
    /// is spread evenly over the tasks, which gives (3.26) and (3.27) exactly.
    pub cholesky_caching: CholeskyCaching,
    /// Server double buffering (§5.5.1, eq. 5.6): disk and network transfers
    /// of different requests overlap, so the store is busy for
    /// `max(Σ disk, Σ network)` instead of their sum.
    pub server_double_buffer: bool,
    /// Slave overlap (§5.5.2): two threads per slave, or prefetching the
    /// next task's blocks while computing, so one slave's time is
    /// `max(Σ compute, Σ transfers)`; doubles the slave's block memory.
    pub slave_overlap: bool,
    /// With `slave_overlap`: the share of a slave's transfers that overlap
    /// its compute (extension; 1 is §5.5.2's full overlap). A slave that
    /// fetches one block ahead of tasks that read two blocks per kernel
    /// call (a matmul or factorisation update reads a pair) hides one
    /// block of each pair: 0.5 ([`crate::ONE_BLOCK_AHEAD_OF_PAIRS`]).
    #[serde(default = "full_overlap")]
    pub slave_overlap_share: f64,
    /// With `slave_overlap`: bytes of blocks the slave fetches ahead
    /// (extension; 0: one block, whatever its size): as many blocks as
    /// fit, and two of blocks no larger than it, one of larger ones
    /// ([`Options::blocks_ahead`]). Two blocks or more ahead, the second
    /// block of a pair is fetched while the first pair computes, and every
    /// read can overlap: the share is 1 at those block sizes
    /// ([`Options::overlap_share_for`]). This implementation's slave:
    /// [`crate::SLAVE_PREFETCH_BYTES`].
    #[serde(default)]
    pub slave_prefetch_bytes: f64,
    /// With `slave_overlap`: the slave prefetches only the blocks of the
    /// task it holds (extension; this implementation): the reads its first
    /// kernel needs ([`crate::schedule::TaskCost::lead`]) are waited for
    /// in series, whatever the share says. Off: the thesis's two threads
    /// per slave (§5.5.2), where the other thread's compute hides them.
    #[serde(default)]
    pub prefetch_within_task: bool,
    /// Updates accumulate inside the multiply kernel (extension; this
    /// implementation's dgemm and dsyrk with β = ±1): no separate add or
    /// subtract, `tadd = tsub = 0`. The thesis's machine added apart
    /// (4.2), at `P`'s threshold: 0.11 ms per update at b ≤ 1200 with this
    /// VM's parameters, 0.45 s of a 3 s matmul at b = 256.
    #[serde(default)]
    pub fused_update: bool,
    /// With `slave_overlap`: the slave writes behind (extension; this
    /// implementation's slave): a task's block puts run while it and the
    /// next task compute, so every write is hidden, whatever
    /// `slave_overlap_share` says of the reads.
    #[serde(default)]
    pub write_behind: bool,
    /// Slaves on the store node's machine read blocks themselves
    /// (extension; this implementation's local data plane passes the
    /// version file's descriptor): a read's transfer (`C`) is the slave's
    /// time, in parallel over the slaves and on their CPUs, not the store
    /// node's serialised time. Writes still cross the store node.
    #[serde(default)]
    pub slave_reads: bool,
    /// The slaves run on other hosts than the store node's, each behind a
    /// link of `C` (extension; the source's own regime, §4.8.3: slaves
    /// reach the store over a network). Every read and write crosses the
    /// store's link; the link is full duplex, so its busy time is the
    /// larger of the reads' and the writes' bytes at `C`, not their sum;
    /// a transfer waits on the link and takes no core, so it neither
    /// loads the cores the slaves' kernels share nor needs a spare core
    /// to hide behind compute; and each transfer pays
    /// `Params::network_latency` at the store's side.
    #[serde(default)]
    pub remote_slaves: bool,
    /// Cholesky's diagonal task updates its block with dsyrk, `b³` flop
    /// per block of its row, half a multiply's (extension; this
    /// implementation). The thesis charged a multiply (A.11).
    #[serde(default)]
    pub diagonal_syrk: bool,
    /// LU without pivoting factors only the diagonal block in its serial
    /// step, and solves the blocks below it as parallel tasks beside the
    /// `U` solves (extension; this implementation, the improvement the
    /// thesis suggests). The thesis's factor step solved them itself (B.1).
    #[serde(default)]
    pub lu_parallel_solves: bool,
    /// The dag Cholesky's point prediction is its run simulated from the
    /// tasks' costs ([`crate::cholesky::dag_makespan`]) within its bounds,
    /// not its lower bound (extension).
    pub simulate_dag: bool,
    /// The point prediction of barrier-step runs (matmul, single-bag and
    /// multi-step Cholesky, LU, ray tracing) is each step simulated from
    /// its tasks' costs ([`crate::schedule::Step::simulated`]) within the
    /// bounds, not the lower bound (extension).
    #[serde(default)]
    pub simulate_steps: bool,
    /// `v`, the number of store nodes: divides the store's busy time in the
    /// lower bounds (§5.4) and adds buffers in the memory rules (5.7–5.17).
    pub store_nodes: u64,
    /// The store node shares CPUs with the slaves (extension).
    pub shared_cpu: Option<SharedCpu>,
    /// Extension: with [`Options::shared_cpu`], a task's ending (its put,
    /// done record and synced commit, timed alone as
    /// `Params::task_ending`) shares the cores with the slaves' kernels:
    /// in a job it runs beside the next task's kernel, and its threads
    /// ([`ENDING_THREADS`]: the slave's runtime and the node's) take their
    /// turns with every slave's. It takes `max(1, (s + 2) / cores)` times
    /// its time alone. Where the slaves fill the cores (a two-vCPU VM) the
    /// jobs' endings took about twice their time alone; where cores were
    /// spare, or the kernels gave way (`slave --compute idle`), about their
    /// time alone, and this is off there (`bench/VALIDATION.md`).
    #[serde(default)]
    pub ending_shares_cores: bool,
    /// Network transfers cost `l + g·bytes` from the BSP parameters
    /// instead of `bytes / C` (extension; needs `Params::bsp`).
    pub use_bsp: bool,
    /// Puts are absorbed by the store's memory (`Params::disk_put_cached`)
    /// instead of written at `Dput` (extension).
    pub cached_puts: bool,
    /// Seconds added to every ray-tracing task: the thesis measured 0.3 s to
    /// construct each output object and 0.09 s to convert it (§4.8.2), costs
    /// its model omits. 0 by default (the thesis's model).
    pub raytrace_task_overhead: f64,
    /// Extension: each ray-tracing grain's pixels are one small object
    /// written in its task's commit (this implementation: a RocksDB value
    /// in the commit's synced batch), not a stored object of their own:
    /// the grain costs its bytes' transfer to the store and no disk write
    /// beyond the commit, which the per-task overhead prices. Without it
    /// every grain paid `Params::disk_put` as a block's version file and
    /// its `fdatasync` (0.42 ms for a 24 KiB grain here), where the jobs
    /// spent about 0.4 ms a task beyond rendering in all.
    #[serde(default)]
    pub pixels_in_commit: bool,
    /// Bytes of output per ray-traced pixel: the thesis stored 3 doubles
    /// ([`crate::PIXEL_BYTES`], the default); this implementation stores
    /// 8-bit RGB ([`crate::IMPLEMENTATION_PIXEL_BYTES`]).
    pub pixel_bytes: f64,
}

fn full_overlap() -> f64 {
    1.0
}

impl Default for Options {
    fn default() -> Self {
        Self {
            slaves: 1,
            matmul_caching: MatmulCaching::None,
            cholesky_caching: CholeskyCaching::None,
            server_double_buffer: false,
            slave_overlap: false,
            slave_overlap_share: 1.0,
            slave_prefetch_bytes: 0.0,
            prefetch_within_task: false,
            fused_update: false,
            write_behind: false,
            slave_reads: false,
            remote_slaves: false,
            diagonal_syrk: false,
            lu_parallel_solves: false,
            simulate_dag: false,
            simulate_steps: false,
            store_nodes: 1,
            shared_cpu: None,
            ending_shares_cores: false,
            use_bsp: false,
            cached_puts: false,
            raytrace_task_overhead: 0.0,
            pixels_in_commit: false,
            pixel_bytes: crate::PIXEL_BYTES,
        }
    }
}

/// Threads of a task's ending that want a core while it runs: the
/// slave's runtime (the put's bytes, the record, the commit) and the
/// node's thread serving it ([`Options::ending_shares_cores`]).
pub const ENDING_THREADS: f64 = 2.0;

/// The option sets that are used together, by name. Every validated
/// figure was taken with one of them; the switches stay public so that a
/// study can turn one off at a time (`bench model`'s flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// The source thesis's model: its equations and nothing else
    /// ([`Options::default`]).
    Source,
    /// This implementation with the store node and the slaves on one
    /// machine ([`Options::implementation`]).
    ThisImplementation,
    /// This implementation with the slaves on other hosts than the store
    /// node's ([`Options::across_hosts`]).
    ThisImplementationAcrossHosts,
}

impl Preset {
    /// The preset's options with `slaves` slaves; `cores` is the store
    /// node's machine's (unused by [`Preset::Source`]).
    pub fn options(self, slaves: u64, cores: u64) -> Options {
        match self {
            Preset::Source => Options::with_slaves(slaves),
            Preset::ThisImplementation => Options::implementation(slaves, cores),
            Preset::ThisImplementationAcrossHosts => Options::implementation(slaves, cores).across_hosts(),
        }
    }
}

impl Options {
    /// Default options with `s` slaves.
    pub fn with_slaves(slaves: u64) -> Self {
        Self { slaves, ..Self::default() }
    }

    /// This implementation with `slaves` slaves and the store node on one
    /// machine of `cores` cores. Matmul, Cholesky and LU tasks announce
    /// their blocks and the slave prefetches [`crate::SLAVE_PREFETCH_BYTES`]
    /// of them (at least one block) ahead while computing (§5.5.2, within
    /// a task); updates accumulate inside dgemm/dsyrk; every app writes
    /// its output behind the next task, ray tracing's grains too, and a
    /// grain's pixels go in its commit; slaves read version files
    /// themselves; Cholesky's diagonal uses dsyrk; LU solves below the
    /// diagonal in parallel; dags and barrier steps are simulated.
    pub fn implementation(slaves: u64, cores: u64) -> Self {
        Self {
            shared_cpu: Some(SharedCpu { cores, store_share: 1.0 }),
            slave_overlap: true,
            slave_overlap_share: crate::ONE_BLOCK_AHEAD_OF_PAIRS,
            slave_prefetch_bytes: crate::SLAVE_PREFETCH_BYTES,
            prefetch_within_task: true,
            fused_update: true,
            write_behind: true,
            slave_reads: true,
            diagonal_syrk: true,
            lu_parallel_solves: true,
            simulate_dag: true,
            simulate_steps: true,
            pixel_bytes: crate::IMPLEMENTATION_PIXEL_BYTES,
            pixels_in_commit: true,
            ending_shares_cores: true,
            ..Self::with_slaves(slaves)
        }
    }

    /// These options with the slaves on other hosts than the store node's:
    /// every block crosses the store's link ([`Options::remote_slaves`]),
    /// none is read from the node's files, and the node serves many
    /// requests at once, each transfer's link time beside the others' disk
    /// and requests (server double buffering, §5.5.1).
    pub fn across_hosts(self) -> Self {
        Self { remote_slaves: true, slave_reads: false, server_double_buffer: true, ..self }
    }

    /// The share of a slave's reads that overlap its compute with blocks
    /// of `b`×`b`: 1 when it fetches two such blocks ahead or more
    /// ([`Options::blocks_ahead`]), else [`Options::slave_overlap_share`].
    /// Across hosts ([`Options::remote_slaves`]) one block ahead hides half
    /// that: the block fetched ahead starts as the slave asks for the
    /// pair's second block, shares the link with it while the slave waits,
    /// and only its other half arrives behind the kernel.
    pub fn overlap_share_for(&self, b: u64) -> f64 {
        if self.blocks_ahead(b) >= 2 {
            1.0
        } else if self.remote_slaves {
            self.slave_overlap_share / 2.0
        } else {
            self.slave_overlap_share
        }
    }

    /// Blocks of `b`×`b` a slave fetches ahead of its task's reads with
    /// [`Options::slave_prefetch_bytes`]: as many as fit, and at least two
    /// of blocks that fit at all (a pair's second read hidden as well as
    /// its first, for one block of memory no larger than the budget), one
    /// of larger blocks. `slave::ctx` follows the same rule.
    pub fn blocks_ahead(&self, b: u64) -> u64 {
        let block_bytes = crate::ELEMENT_BYTES * (b * b) as f64;
        if block_bytes <= 0.0 || block_bytes > self.slave_prefetch_bytes {
            1
        } else {
            ((self.slave_prefetch_bytes / block_bytes).floor() as u64).max(2)
        }
    }
}
