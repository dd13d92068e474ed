//! Generic bounds over tasks and barrier steps (thesis §3.2–3.4, §3.7), and
//! the overlapped forms of §5.5.
//!
//! A [`Step`] is a set of tasks that run freely between two barriers. Its
//! bounds are the thesis's, with the longest task where it is known:
//!
//! * `T₁ = TGET + TCOMP + TPUT` (3.8); with slave overlap (§5.5.2)
//!   `max{TCOMP, TGET + TPUT, longest task}`.
//! * `lwr{T_s} = max{W, T₁/min(s, N), longest task}` where `W` is the store's
//!   serialised busy time `TGET + TPUT` (3.9), or with server double
//!   buffering `max{Σ disk, Σ network}` (5.6), divided by the number of store
//!   nodes (§5.4).
//! * `upr{T_s} = min{T₁, W + TCOMP/s + max Tcomp(i)}` for `s < N`, and
//!   `W + max Tcomp(i)` (3.10) for `s ≥ N`. The `s < N` form is an extension:
//!   at any instant the store is busy, or every slave computes (while the bag
//!   is not empty), or the last slave computes (after it empties).
//!
//! Steps separated by barriers add up (3.11). A step that ends at a
//! barrier may also pay, in series, the ending of its last task (extension,
//! [`Step::with_barrier`]).

/// The cost of one task, split by resource.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TaskCost {
    /// Store disk time of the task's reads and writes.
    pub disk: f64,
    /// Network time of the task's reads and writes.
    pub net: f64,
    /// Compute time.
    pub comp: f64,
    /// Of `disk + net`, the task's writes: with write-behind they run
    /// while the slave computes on (extension).
    pub put: f64,
    /// Of `net`, the reads the slave moves itself
    /// ([`crate::Options::slave_reads`]): the slave's time, not serialised
    /// at the store (extension).
    pub at_slave: f64,
    /// Of the reads (`disk + net − put`), those the task's first kernel
    /// needs: a slave that prefetches within its task only
    /// ([`Overlap::lead_in_series`]) waits for them before it computes
    /// anything (extension). LU n = 4096, b = 256, one slave: 0.23 s of a
    /// 1.79 s run waiting for reads, 0.37 ms per two-block solve task.
    pub lead: f64,
    /// Of `net`, the task's writes: on a full-duplex link
    /// ([`Overlap::duplex`]) they travel the other way from its reads.
    pub put_net: f64,
    /// Of `comp`, the task's last kernel: a slave that prefetches within
    /// its task only ([`Overlap::lead_in_series`]) has nothing left to
    /// read while it runs, so no read hides behind it (extension).
    pub tail: f64,
}

impl TaskCost {
    /// Time at the store (serialised): disk plus network.
    pub fn io(&self) -> f64 {
        self.disk + self.net
    }

    /// Whole task on an idle system: `Tget + Tcomp + Tput`.
    pub fn total(&self) -> f64 {
        self.io() + self.comp
    }

    /// The reads the slave's overlap may hide: all of them, or with
    /// [`Overlap::lead_in_series`] all but the lead.
    pub fn hideable_reads(&self, ov: Overlap) -> f64 {
        let reads = self.io() - self.put;
        if ov.lead_in_series {
            (reads - self.lead).max(0.0)
        } else {
            reads
        }
    }
}

/// What tasks' foregrounds ask of the shared resources, as shares of
/// their foreground time (each at most 1 for one slave alone).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    /// Share spent computing.
    pub cpu: f64,
    /// Share of it the store's link carries their reads.
    pub link: f64,
    /// The foreground time the shares are of, seconds.
    pub foreground: f64,
}

impl Demand {
    /// Several demands together, each weighted by its foreground time.
    pub fn of(parts: impl Iterator<Item = Demand>) -> Demand {
        let (mut cpu, mut link, mut foreground) = (0.0, 0.0, 0.0);
        for d in parts {
            cpu += d.cpu * d.foreground;
            link += d.link * d.foreground;
            foreground += d.foreground;
        }
        let f = foreground.max(1e-12);
        Demand { cpu: cpu / f, link: link / f, foreground }
    }
}

/// `count` identical tasks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskClass {
    /// How many.
    pub count: u64,
    /// Cost of each.
    pub cost: TaskCost,
}

/// A lower and an upper bound, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Bounds {
    /// Lower bound.
    pub lwr: f64,
    /// Upper bound.
    pub upr: f64,
}

impl std::ops::Add for Bounds {
    type Output = Bounds;
    fn add(self, o: Bounds) -> Bounds {
        Bounds { lwr: self.lwr + o.lwr, upr: self.upr + o.upr }
    }
}

/// What overlaps what (§5.5) and how many store nodes serve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overlap {
    /// Server double buffering (§5.5.1).
    pub server: bool,
    /// Slave overlap: two threads or prefetching (§5.5.2).
    pub slave: bool,
    /// Share of the transfers the slave overlap hides (1: all, §5.5.2).
    pub slave_share: f64,
    /// Store nodes `v` (≥ 1).
    pub store_nodes: u64,
    /// With `slave`: every write overlaps the slave's later compute
    /// (write-behind), whatever `slave_share` says of its reads.
    pub write_behind: bool,
    /// With `slave`: each task's lead reads ([`TaskCost::lead`]) are in
    /// series, never hidden ([`crate::Options::prefetch_within_task`]).
    pub lead_in_series: bool,
    /// The store's network is a full-duplex link
    /// ([`crate::Options::remote_slaves`]): reads and writes each take
    /// their own direction, and it is busy for the larger of the two.
    pub duplex: bool,
}

impl Overlap {
    /// The thesis's experiments: no overlap, one store node.
    pub const NONE: Overlap = Overlap {
        server: false,
        slave: false,
        slave_share: 1.0,
        store_nodes: 1,
        write_behind: false,
        lead_in_series: false,
        duplex: false,
    };
}

/// Tasks between two barriers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// The tasks, grouped into classes of identical cost.
    pub classes: Vec<TaskClass>,
    /// `Some(protocol)`: the step ends at a barrier whose round trips take
    /// `protocol` seconds ([`Step::with_barrier`]); `None` in the thesis.
    pub barrier: Option<f64>,
}

impl Step {
    /// A step of one task.
    pub fn single(cost: TaskCost) -> Self {
        Self { classes: vec![TaskClass { count: 1, cost }], barrier: None }
    }

    /// Adds `count` tasks of cost `cost`.
    pub fn push(&mut self, count: u64, cost: TaskCost) {
        if count > 0 {
            self.classes.push(TaskClass { count, cost });
        }
    }

    /// Number of tasks.
    pub fn n_tasks(&self) -> u64 {
        self.classes.iter().map(|c| c.count).sum()
    }

    fn sum(&self, f: impl Fn(&TaskCost) -> f64) -> f64 {
        self.classes.iter().map(|c| c.count as f64 * f(&c.cost)).sum()
    }

    fn max(&self, f: impl Fn(&TaskCost) -> f64) -> f64 {
        self.classes.iter().map(|c| f(&c.cost)).fold(0.0, f64::max)
    }

    /// `TCOMP`.
    pub fn comp(&self) -> f64 {
        self.sum(|c| c.comp)
    }

    /// `TGET + TPUT`, serialised at one store node.
    pub fn io(&self) -> f64 {
        self.sum(TaskCost::io)
    }

    /// Longest task `max{Ttask(i)}`.
    pub fn longest(&self) -> f64 {
        self.max(TaskCost::total)
    }

    /// `max{Tcomp(i)}`.
    pub fn longest_comp(&self) -> f64 {
        self.max(|c| c.comp)
    }

    /// The same tasks, each class's cost mapped by `f`.
    fn map_costs(&self, f: impl Fn(TaskCost) -> TaskCost) -> Step {
        Step { classes: self.classes.iter().map(|c| TaskClass { count: c.count, cost: f(c.cost) }).collect(), barrier: self.barrier }
    }

    /// The same tasks with compute `factor` times slower.
    pub fn slowed(&self, factor: f64) -> Step {
        self.map_costs(|c| TaskCost { comp: c.comp * factor, tail: c.tail * factor, ..c })
    }

    /// Extension: every task pays `overhead` seconds beyond its blocks and
    /// kernels (begin, dequeue, task record, commit; `Params::task_overhead`).
    /// The share `store_share` of it is serialised at the store (the commit's
    /// synced batch and the node's handling of each request), so it is
    /// added to `disk`; the rest is the slave's side of the round trips and
    /// runs in parallel with other slaves, so it is added to `comp`.
    pub fn with_task_overhead(&self, overhead: f64, store_share: f64) -> Step {
        let share = store_share.clamp(0.0, 1.0);
        self.map_costs(|c| TaskCost { disk: c.disk + share * overhead, comp: c.comp + (1.0 - share) * overhead, ..c })
    }

    /// Extension: the step ends at a barrier. With write-behind a task's
    /// block puts and its commit run while the slave computes the next
    /// task; the step's last task has no next task in the step, so the
    /// next step waits for `protocol` seconds of round trips (its record
    /// and commit, then the next dequeue finding the bag empty; from the
    /// per-task overhead, [`crate::predict::BARRIER_SHARE`]) and for its
    /// puts, as far as the step's time had them hidden under compute
    /// ([`Step::ending`]).
    pub fn with_barrier(&self, protocol: f64) -> Step {
        Step { barrier: Some(protocol), ..self.clone() }
    }

    /// What the barrier adds in series: its round trips, and the last
    /// task's puts (the largest `put` of the step) where write-behind had
    /// hidden them. A step whose transfers outweigh its compute, or of one
    /// task, has them in its time already.
    pub fn ending(&self, ov: Overlap) -> f64 {
        let Some(protocol) = self.barrier else { return 0.0 };
        let last_put = if ov.slave && ov.write_behind { self.max(|c| c.put) } else { 0.0 };
        protocol + self.tasks_t1_hiding(ov, last_put) - self.tasks_t1_hiding(ov, 0.0)
    }

    /// Extension: every task waits `latency` seconds more at the slave
    /// (`Params::task_wake`): not the store's work, so not serialised.
    pub fn with_slave_latency(&self, latency: f64) -> Step {
        self.map_costs(|c| TaskCost { comp: c.comp + latency.max(0.0), ..c })
    }

    /// Store busy time, a lower bound on the step (3.3, 5.6, §5.4); reads
    /// the slaves move themselves are not the store's.
    pub fn store_busy(&self, ov: Overlap) -> f64 {
        let busy = if ov.server { self.sum(|c| c.disk).max(self.network_busy(ov)) } else { self.sum(|c| c.io() - c.at_slave) };
        busy / ov.store_nodes.max(1) as f64
    }

    /// The store's network busy time: every transfer the store makes, or
    /// on a full-duplex link the larger of its reads and its writes.
    fn network_busy(&self, ov: Overlap) -> f64 {
        if ov.duplex {
            self.sum(|c| c.net - c.put_net - c.at_slave).max(self.sum(|c| c.put_net))
        } else {
            self.sum(|c| c.net - c.at_slave)
        }
    }

    /// The store's disk time (and, with the per-task overhead, its share
    /// of the requests): its CPU when its transfers wait on a link.
    pub fn store_disk(&self) -> f64 {
        self.sum(|c| c.disk)
    }

    /// The step's tasks' foreground time, and of it what they compute and
    /// what their reads (hidden ones too) keep the store's link busy.
    pub fn demand(&self, ov: Overlap) -> Demand {
        let foreground = self.sum(|c| c.foreground(ov));
        Demand {
            cpu: self.comp() / foreground.max(1e-12),
            link: self.sum(|c| c.net - c.put_net - c.at_slave) / foreground.max(1e-12),
            foreground,
        }
    }

    /// Transfers the slaves make themselves ([`TaskCost::at_slave`]).
    pub fn slave_transfers(&self) -> f64 {
        self.sum(|c| c.at_slave)
    }

    /// Single-slave time (3.8), or with slave overlap (§5.5.2)
    /// `max{TCOMP, TGET+TPUT, longest task}`; a partial overlap hides
    /// `slave_share` of the reads, and all of the writes with write-behind.
    pub fn t1(&self, ov: Overlap) -> f64 {
        self.tasks_t1_hiding(ov, 0.0) + self.ending(ov)
    }

    /// [`Step::t1`] without the step's ending, with `unhidden` seconds of
    /// the writes write-behind would hide left in series.
    fn tasks_t1_hiding(&self, ov: Overlap, unhidden: f64) -> f64 {
        if ov.slave {
            let behind = if ov.write_behind { self.sum(|c| c.put) } else { 0.0 };
            let lead = if ov.lead_in_series { self.sum(|c| c.lead) } else { 0.0 };
            if ov.duplex && ov.write_behind {
                // On a full-duplex link the writes go out while the reads
                // come in: behind the whole run, not only its compute.
                let reads = self.io() - behind;
                let hiding = self.sum(|c| c.hiding_compute(ov));
                let hidden = (ov.slave_share.clamp(0.0, 1.0) * (reads - lead).max(0.0)).min(hiding);
                return (self.comp().max(hidden) + (reads - hidden) + unhidden).max(behind).max(self.longest());
            }
            let hidden = (ov.slave_share.clamp(0.0, 1.0) * (self.io() - behind - lead).max(0.0) + behind - unhidden).max(0.0);
            (self.comp().max(hidden) + (self.io() - hidden)).max(self.longest())
        } else {
            self.sum(TaskCost::total)
        }
    }

    /// Bounds on the step's time with `s` slaves (see the module docs).
    pub fn bounds(&self, s: u64, ov: Overlap) -> Bounds {
        let n = self.n_tasks();
        if n == 0 {
            return Bounds::default();
        }
        let s = s.max(1);
        // With slave overlap the thesis also writes T∞ ≥ T₁/(N/2) (§5.5.2),
        // true when two threads share each of N/2 slaves; with more slaves a
        // task may have a slave to itself, so only min(s, N) is used here.
        let busy_slaves = s.min(n);
        let lwr = self.store_busy(ov).max(self.tasks_t1_hiding(ov, 0.0) / busy_slaves as f64).max(self.longest());
        let serial = self.sum(TaskCost::total);
        let upr =
            if s >= n { self.io() + self.longest_comp() } else { (self.io() + self.comp() / s as f64 + self.longest_comp()).min(serial) };
        let ending = self.ending(ov);
        Bounds { lwr: lwr + ending, upr: upr + ending }
    }
}

impl Step {
    /// Extension: the step run from its bag by `s` slaves, simulated task
    /// by task ([`crate::simulate`]), then its barrier's round trips: the
    /// point prediction between the step's bounds. Tasks are indivisible,
    /// so two slaves take two tasks' time over a step of three equal tasks
    /// where `T₁/s` gives one and a half (LU's steps hold `p − k` or
    /// `p − k + 1` tasks, every other one odd). The step's costs carry
    /// their slow-down already, as its bounds' do.
    pub fn simulated(&self, s: u64, ov: Overlap) -> f64 {
        self.simulated_sharing(s, ov, &|_| 1.0)
    }

    /// [`Step::simulated`] from the step's unshared costs, each task's
    /// foreground stretched by `slowdown(k)` while `k` slaves compute at
    /// once on shared cores: the last tasks of a step, once the other
    /// slaves have nothing left in its bag, run alone and at the one-slave
    /// rate (LU, n = 4096, b = 1024, two slaves: steps of 1 to 6 tasks).
    pub fn simulated_sharing(&self, s: u64, ov: Overlap, slowdown: &dyn Fn(u64) -> f64) -> f64 {
        let tasks: Vec<crate::simulate::SimTask> = self
            .classes
            .iter()
            .flat_map(|c| std::iter::repeat_n(c.cost, c.count as usize))
            .map(|c| crate::simulate::SimTask {
                foreground: c.foreground(ov),
                ending: c.put - c.put_in_foreground(ov),
                ..Default::default()
            })
            .collect();
        crate::simulate::makespan(&tasks, s, ov.store_nodes, slowdown) + self.barrier.unwrap_or(0.0)
    }
}

impl TaskCost {
    /// Seconds the task holds its slave with slave overlap: its kernels,
    /// the share of its reads prefetching does not hide, and its writes
    /// unless they are written behind.
    pub fn foreground(&self, ov: Overlap) -> f64 {
        let reads = self.io() - self.put;
        let share = if ov.slave { ov.slave_share.clamp(0.0, 1.0) } else { 0.0 };
        self.comp + reads - share * self.hideable_reads(ov).min(self.hiding_compute(ov)) + self.put_in_foreground(ov)
    }

    /// The compute a read can hide behind: all of it, or with
    /// [`Overlap::lead_in_series`] all but the last kernel.
    pub fn hiding_compute(&self, ov: Overlap) -> f64 {
        if ov.lead_in_series {
            (self.comp - self.tail).max(0.0)
        } else {
            self.comp
        }
    }

    /// The share of [`TaskCost::put`] the slave waits for before its next
    /// task: all of it unless it writes behind.
    pub fn put_in_foreground(&self, ov: Overlap) -> f64 {
        if ov.slave && ov.write_behind {
            0.0
        } else {
            self.put
        }
    }
}

/// Sum of step bounds over barrier-separated steps (3.11).
pub fn steps_bounds(steps: &[Step], s: u64, ov: Overlap) -> Bounds {
    steps.iter().map(|st| st.bounds(s, ov)).fold(Bounds::default(), |a, b| a + b)
}

/// Single-slave time of barrier-separated steps.
pub fn steps_t1(steps: &[Step], ov: Overlap) -> f64 {
    steps.iter().map(|st| st.t1(ov)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(n: u64, get: f64, comp: f64) -> Step {
        let mut s = Step::default();
        s.push(n, TaskCost { disk: get, comp, ..TaskCost::default() });
        s
    }

    #[test]
    fn a_simulated_step_runs_whole_tasks() {
        // Three equal tasks on two slaves: two rounds, not one and a half.
        let st = step(3, 0.0, 1.0);
        assert!((st.bounds(2, Overlap::NONE).lwr - 1.5).abs() < 1e-12);
        assert!((st.simulated(2, Overlap::NONE) - 2.0).abs() < 1e-12);
        // An even split has no tail; more slaves than tasks, one round.
        assert!((step(4, 0.0, 1.0).simulated(2, Overlap::NONE) - 2.0).abs() < 1e-12);
        assert!((st.simulated(8, Overlap::NONE) - 1.0).abs() < 1e-12);
        // The barrier's round trips come after the last task.
        let barrier = st.with_barrier(0.25);
        assert!((barrier.simulated(2, Overlap::NONE) - 2.25).abs() < 1e-12);
    }

    /// On shared cores a step's tail runs at the rate of the slaves still
    /// computing: the third of three tasks on two slaves runs alone.
    #[test]
    fn a_step_s_last_task_runs_alone_at_the_one_slave_rate() {
        let st = step(3, 0.0, 1.0);
        let shared = |k: u64| if k >= 2 { 1.5 } else { 1.0 };
        // Two tasks side by side at 1.5 s each, then one alone at 1 s.
        assert!((st.simulated_sharing(2, Overlap::NONE, &shared) - 2.5).abs() < 1e-12);
        // Every task slowed as if both slaves computed throughout: 3 s.
        let all_slowed = step(3, 0.0, 1.5).simulated(2, Overlap::NONE);
        assert!((all_slowed - 3.0).abs() < 1e-12);
        // An even split has no tail: the same either way.
        let even = step(4, 0.0, 1.0).simulated_sharing(2, Overlap::NONE, &shared);
        assert!((even - step(4, 0.0, 1.5).simulated(2, Overlap::NONE)).abs() < 1e-12);
    }

    #[test]
    fn a_simulated_step_lies_within_its_bounds() {
        let tasks = |n: u64| {
            let mut st = Step::default();
            st.push(n, TaskCost { disk: 0.2, net: 0.1, comp: 1.0 + n as f64 / 10.0, put: 0.1, at_slave: 0.05, ..TaskCost::default() });
            st.push(n / 2, TaskCost { disk: 0.1, comp: 0.4, put: 0.05, ..TaskCost::default() });
            st
        };
        for n in 1..=9 {
            let st = tasks(n);
            // No overlap: one slave is exactly T₁, more lie within the bounds.
            assert!((st.simulated(1, Overlap::NONE) - st.t1(Overlap::NONE)).abs() < 1e-9);
            for s in 2..=4 {
                let b = st.bounds(s, Overlap::NONE);
                let sim = st.simulated(s, Overlap::NONE);
                assert!(sim >= b.lwr - 1e-9 && sim <= b.upr + 1e-9, "n={n} s={s}: {sim} outside {b:?}");
            }
            // This slave's overlap: within a task its prefetch hides reads
            // behind its kernels, which `T₁`'s longest-task floor does not
            // grant (the prediction is clamped to the bounds); one slave
            // takes at most `T₁` and its last written-behind put, and more
            // slaves never take longer.
            let ov = Overlap { slave: true, slave_share: 0.5, write_behind: true, ..Overlap::NONE };
            let times: Vec<f64> = (1..=4).map(|s| st.simulated(s, ov)).collect();
            assert!(times[0] <= st.t1(ov) + 0.1 + 1e-9, "n={n}: {} vs T1 {}", times[0], st.t1(ov));
            assert!(times.windows(2).all(|w| w[1] <= w[0] + 1e-9), "n={n}: {times:?}");
        }
    }

    #[test]
    fn one_slave_is_exactly_t1() {
        let st = step(10, 1.0, 3.0);
        let b = st.bounds(1, Overlap::NONE);
        assert_eq!(b.lwr, 40.0);
        assert_eq!(b.upr, 40.0);
    }

    #[test]
    fn unlimited_slaves_give_3_9_and_3_10() {
        // N = 10 tasks, Tget+Tput = 1, Tcomp = 3:
        // lwr = max{T1/N, N(Tget+Tput)} = max{4, 10}; upr = 10 + 3 (3.6, 3.7).
        let b = step(10, 1.0, 3.0).bounds(1000, Overlap::NONE);
        assert_eq!(b.lwr, 10.0);
        assert_eq!(b.upr, 13.0);
    }

    #[test]
    fn double_buffering_takes_the_larger_of_disk_and_network() {
        let mut st = Step::default();
        st.push(4, TaskCost { disk: 2.0, net: 1.0, ..TaskCost::default() });
        assert_eq!(st.store_busy(Overlap::NONE), 12.0);
        assert_eq!(st.store_busy(Overlap { server: true, ..Overlap::NONE }), 8.0);
    }

    #[test]
    fn a_full_duplex_link_is_busy_for_its_busier_direction() {
        let mut st = Step::default();
        // 3 s on the network a task, 1 s of it its write.
        st.push(4, TaskCost { disk: 0.5, net: 3.0, put: 1.5, put_net: 1.0, ..TaskCost::default() });
        let server = Overlap { server: true, ..Overlap::NONE };
        assert_eq!(st.store_busy(server), 12.0);
        assert_eq!(st.store_busy(Overlap { duplex: true, ..server }), 8.0, "the reads' 2 s a task, the writes beside them");
        let mut writes = Step::default();
        writes.push(4, TaskCost { net: 3.0, put: 3.0, put_net: 2.5, ..TaskCost::default() });
        assert_eq!(writes.store_busy(Overlap { duplex: true, ..server }), 10.0, "the writes' direction, the busier");
    }

    #[test]
    fn demands_are_shares_of_the_foreground_weighted_by_it() {
        let mut st = Step::default();
        // 1 s computing, 3 s reading of which 1 s hidden: 3 s foreground.
        st.push(2, TaskCost { net: 3.0, comp: 1.0, ..TaskCost::default() });
        let ov = Overlap { slave: true, ..Overlap::NONE };
        let d = st.demand(ov);
        assert_eq!(d.foreground, 6.0);
        assert!((d.cpu - 1.0 / 3.0).abs() < 1e-12 && (d.link - 1.0).abs() < 1e-12, "{d:?}");
        let idle = Demand { cpu: 1.0, link: 0.0, foreground: 2.0 };
        let both = Demand::of([d, idle].into_iter());
        assert_eq!(both.foreground, 8.0);
        assert!((both.cpu - 4.0 / 8.0).abs() < 1e-12 && (both.link - 6.0 / 8.0).abs() < 1e-12, "{both:?}");
    }

    #[test]
    fn write_behind_hides_every_write_and_the_share_of_the_reads() {
        let mut st = Step::default();
        // Per task: reads 1.0 s, writes 0.5 s (both in disk), compute 2.0 s.
        st.push(10, TaskCost { disk: 1.5, comp: 2.0, put: 0.5, ..TaskCost::default() });
        let half = Overlap { slave: true, slave_share: 0.5, ..Overlap::NONE };
        // Hidden: half of all 15 s of transfers; 20 + 7.5.
        assert_eq!(st.t1(half), 27.5);
        // Hidden: half of the 10 s of reads and all 5 s of writes; 20 + 5.
        assert_eq!(st.t1(Overlap { write_behind: true, ..half }), 25.0);
        // Without slave overlap nothing is hidden.
        assert_eq!(st.t1(Overlap { write_behind: true, ..Overlap::NONE }), 35.0);
    }

    #[test]
    fn reads_the_slaves_move_are_not_the_stores_busy_time() {
        let mut st = Step::default();
        // Per task: 0.25 s disk, 1.0 s of transfers of which 0.75 s reads the slave moves.
        st.push(8, TaskCost { disk: 0.25, net: 1.0, comp: 0.5, put: 0.25, at_slave: 0.75, ..TaskCost::default() });
        assert_eq!(st.store_busy(Overlap::NONE), 4.0);
        assert_eq!(st.store_busy(Overlap { server: true, ..Overlap::NONE }), 2.0);
        // One slave still waits for its own reads.
        assert_eq!(st.t1(Overlap::NONE), 14.0);
        // Eight slaves: the store no longer bounds the step; each slave's task does.
        assert_eq!(st.bounds(8, Overlap::NONE).lwr, 4.0_f64.max(14.0 / 8.0).max(1.75));
        let without = Step { classes: vec![TaskClass { count: 8, cost: TaskCost { at_slave: 0.0, ..st.classes[0].cost } }], barrier: None };
        assert_eq!(without.bounds(8, Overlap::NONE).lwr, 10.0);
    }

    #[test]
    fn a_barrier_is_paid_in_series_with_the_puts_write_behind_hid() {
        let mut st = Step::default();
        // Per task: reads 1.0 s, writes 0.5 s, compute 2.0 s.
        st.push(10, TaskCost { disk: 1.5, comp: 2.0, put: 0.5, ..TaskCost::default() });
        let behind = Overlap { slave: true, slave_share: 0.5, write_behind: true, ..Overlap::NONE };
        let ended = st.with_barrier(0.25);
        assert_eq!(ended.ending(behind), 0.75);
        assert_eq!(ended.t1(behind), st.t1(behind) + 0.75);
        for s in [1, 2, 5, 10, 100] {
            let (a, b) = (st.bounds(s, behind), ended.bounds(s, behind));
            assert_eq!((b.lwr, b.upr), (a.lwr + 0.75, a.upr + 0.75), "s={s}: in series, not divided among slaves");
        }
        // Without write-behind the puts are in the tasks' time already.
        assert_eq!(ended.ending(Overlap { write_behind: false, ..behind }), 0.25);
        // Nor does a step bound by its transfers hide them, or a step of one task.
        let mut copies = Step::default();
        copies.push(4, TaskCost { disk: 1.5, put: 0.5, ..TaskCost::default() });
        assert_eq!(copies.with_barrier(0.25).ending(behind), 0.25);
        let one = Step::single(TaskCost { disk: 1.5, comp: 2.0, put: 0.5, ..TaskCost::default() });
        assert_eq!(one.with_barrier(0.25).ending(behind), 0.25);
    }

    #[test]
    fn slave_overlap_hides_the_smaller_of_compute_and_transfer() {
        let st = step(10, 1.0, 3.0);
        assert_eq!(st.t1(Overlap { slave: true, ..Overlap::NONE }), 30.0);
    }

    /// A task's lead reads are in series with its kernels when the slave
    /// prefetches within its task only, and hidden like the rest when not.
    #[test]
    fn lead_reads_are_waited_for_in_series() {
        let mut st = Step::default();
        // 1 s of reads, 0.25 s of them before the first kernel, 2 s of kernels.
        st.push(4, TaskCost { disk: 1.0, comp: 2.0, lead: 0.25, ..TaskCost::default() });
        let hiding = Overlap { slave: true, slave_share: 1.0, ..Overlap::NONE };
        let in_series = Overlap { lead_in_series: true, ..hiding };
        assert_eq!(st.t1(hiding), 8.0);
        assert_eq!(st.t1(in_series), 9.0);
        let c = st.classes[0].cost;
        assert_eq!(c.foreground(hiding), 2.0);
        assert_eq!(c.foreground(in_series), 2.25);
        // Without overlap the lead changes nothing.
        assert_eq!(st.t1(Overlap { lead_in_series: true, ..Overlap::NONE }), st.t1(Overlap::NONE));
    }
}
