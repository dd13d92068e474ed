//! A list-scheduling simulation of a task graph run from one FIFO bag
//! (extension): the point prediction of the dag Cholesky, which its bounds
//! leave wide.
//!
//! The bounds take the longest of the store's time, `T₁/s` and the
//! critical path. A run pays more than the longest of them: with one slave,
//! each time the next task in the bag needs the block the slave has just
//! computed, it waits for that block's put and commit, which write-behind
//! would otherwise hide (n = 4096, b = 1024: 20–25 ms at each of the
//! chain's steps, 0.70 s measured against 0.62 predicted by the bound).
//! The simulation follows this implementation's slave:
//!
//! * a slave takes the bag's first task when it is free; if the bag is
//!   empty it waits until a commit releases one;
//! * a task occupies its slave for its [`SimTask::foreground`] time
//!   (kernels, the reads prefetching does not hide, its requests),
//!   stretched while other slaves compute beside it on shared cores (the
//!   caller's slow-down for `k` slaves computing at once), then
//!   releases its successors in one request of [`SimTask::release`]
//!   seconds that takes each successor's counter lock in order and holds
//!   it until the task commits: at a counter another task holds, the
//!   request waits for that task's commit;
//! * its ending (block puts and the synced commit, [`SimTask::ending`])
//!   starts with its releases (the slave's puts are under way when it
//!   releases) and runs on behind the slave's next task, serialised at the
//!   store and after the slave's previous ending (one ending at a time);
//!   the task commits once both its releases and its ending are done;
//! * its commit frees its counters and appends each successor whose last
//!   input it was to the bag.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

/// One task of the graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimTask {
    /// Seconds the task holds its slave before its releases.
    pub foreground: f64,
    /// Seconds of its release request (its successors' counters read
    /// under their locks, all in one round trip), if it has successors.
    pub release: f64,
    /// Seconds of its ending at the store, from the end of its foreground.
    pub ending: f64,
    /// Tasks that read what this one writes, in the order it releases them.
    /// A task enters the bag once every task listing it here committed.
    pub successors: Vec<usize>,
}

/// How many tasks list each task as a successor: the commits it waits for.
pub fn inputs(tasks: &[SimTask]) -> Vec<u32> {
    let mut n = vec![0u32; tasks.len()];
    for &succ in tasks.iter().flat_map(|t| &t.successors) {
        n[succ] += 1;
    }
    n
}

#[derive(Clone, Copy, PartialEq)]
enum Event {
    /// A task's commit: its counters are free, its successors may enter
    /// the bag.
    Commit(usize),
    /// A slave's task is at its `next` release.
    Release { slave: usize, task: usize, next: usize },
}

/// An event at a time; the heap's first is the earliest, commits before
/// releases at the same instant (a slave then sees what was committed).
struct At(f64, u64, Event);

impl At {
    fn key(&self) -> (f64, u8, u64) {
        (self.0, matches!(self.2, Event::Release { .. }) as u8, self.1)
    }
}

impl PartialEq for At {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for At {}
impl PartialOrd for At {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for At {
    fn cmp(&self, o: &Self) -> Ordering {
        let (a, b) = (self.key(), o.key());
        // Reversed: `BinaryHeap` pops its greatest.
        b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2))
    }
}

/// The simulation's state: the bag, the slaves, the counters, the store.
struct Run<'a> {
    tasks: &'a [SimTask],
    waiting: Vec<u32>,
    bag: VecDeque<usize>,
    idle: VecDeque<usize>,
    /// Per slave: when its last ending is over.
    ending_done: Vec<f64>,
    /// Per task: when its ending is over.
    ended: Vec<f64>,
    /// Per store node: when it has served every ending sent to it.
    store_free: Vec<f64>,
    /// Per task's counter: the uncommitted task holding its lock.
    holder: Vec<Option<usize>>,
    /// Per task: releases blocked on the counters it holds.
    blocked: Vec<Vec<Event>>,
    events: BinaryHeap<At>,
    seq: u64,
    /// Tasks in their foreground: slave, task, one-slave seconds left.
    computing: Vec<(usize, usize, f64)>,
    slowdown: &'a dyn Fn(u64) -> f64,
}

impl Run<'_> {
    fn push(&mut self, t: f64, e: Event) {
        self.seq += 1;
        self.events.push(At(t, self.seq, e));
    }

    /// Gives the bag's first task to `slave`, or idles it.
    fn take(&mut self, slave: usize) {
        match self.bag.pop_front() {
            Some(task) => self.computing.push((slave, task, self.tasks[task].foreground.max(0.0))),
            None => self.idle.push_back(slave),
        }
    }

    /// Goes on with `task`'s releases from `next` at `now`: waits on a
    /// counter another task holds, or, after the last, ends the task and
    /// frees its slave.
    fn release(&mut self, slave: usize, task: usize, next: usize, now: f64) {
        let t = &self.tasks[task];
        let Some(&counter) = t.successors.get(next) else {
            // The commit follows the releases and the ending.
            self.push(now.max(self.ended[task]), Event::Commit(task));
            self.take(slave);
            return;
        };
        match self.holder[counter] {
            Some(other) if other != task => self.blocked[other].push(Event::Release { slave, task, next }),
            _ => {
                self.holder[counter] = Some(task);
                // One round trip for all the counters, paid at the first.
                let cost = if next == 0 { t.release } else { 0.0 };
                self.push(now + cost, Event::Release { slave, task, next: next + 1 });
            }
        }
    }

    /// Sends `task`'s ending to the least busy store node, after the
    /// slave's previous ending; it runs while the task releases.
    fn end(&mut self, slave: usize, task: usize, now: f64) {
        let node = (0..self.store_free.len()).min_by(|&a, &b| self.store_free[a].total_cmp(&self.store_free[b])).unwrap_or(0);
        let begins = now.max(self.ending_done[slave]).max(self.store_free[node]);
        let ended = begins + self.tasks[task].ending;
        self.store_free[node] = ended;
        self.ending_done[slave] = ended;
        self.ended[task] = ended;
    }

    fn commit(&mut self, task: usize, now: f64) {
        for &succ in &self.tasks[task].successors {
            if self.holder[succ] == Some(task) {
                self.holder[succ] = None;
            }
            self.waiting[succ] = self.waiting[succ].saturating_sub(1);
            if self.waiting[succ] == 0 {
                self.bag.push_back(succ);
            }
        }
        for e in std::mem::take(&mut self.blocked[task]) {
            self.push(now, e);
        }
        while !self.bag.is_empty() {
            let Some(slave) = self.idle.pop_front() else { break };
            self.take(slave);
        }
    }
}

/// Seconds from the first dequeue to the last commit of `tasks` run by
/// `slaves` slaves against `store_nodes` store nodes, a foreground taking
/// `slowdown(k)` times its time while `k` slaves compute at once. Tasks
/// without inputs start in the bag in index order. A task on a cycle
/// (a malformed graph) never starts and is left out.
pub fn makespan(tasks: &[SimTask], slaves: u64, store_nodes: u64, slowdown: &dyn Fn(u64) -> f64) -> f64 {
    let waiting = inputs(tasks);
    let bag = (0..tasks.len()).filter(|&k| waiting[k] == 0).collect();
    let slaves = slaves.clamp(1, tasks.len().max(1) as u64) as usize;
    let mut run = Run {
        tasks,
        waiting,
        bag,
        idle: VecDeque::new(),
        ending_done: vec![0.0; slaves],
        ended: vec![0.0; tasks.len()],
        store_free: vec![0.0; store_nodes.max(1) as usize],
        holder: vec![None; tasks.len()],
        blocked: vec![Vec::new(); tasks.len()],
        events: BinaryHeap::new(),
        seq: 0,
        computing: Vec::new(),
        slowdown,
    };
    for slave in 0..slaves {
        run.take(slave);
    }
    let (mut now, mut last) = (0.0f64, 0.0f64);
    loop {
        // The first foreground to end at the present sharing, if it ends
        // before the next event (ties go to the event: a commit first).
        let rate = 1.0 / (run.slowdown)(run.computing.len() as u64).max(1e-12);
        let first = run.computing.iter().enumerate().min_by(|a, b| a.1 .2.total_cmp(&b.1 .2)).map(|(k, c)| (k, now + c.2 / rate));
        let next_event = run.events.peek().map(|e| e.0);
        let done = match (first, next_event) {
            (Some((k, at)), Some(e)) if at < e => Some((k, at)),
            (Some((k, at)), None) => Some((k, at)),
            _ => None,
        };
        let until = match (done, next_event) {
            (Some((_, at)), _) => at,
            (None, Some(e)) => e,
            (None, None) => break,
        };
        for c in &mut run.computing {
            c.2 = (c.2 - (until - now) * rate).max(0.0);
        }
        now = until;
        if let Some((k, _)) = done {
            let (slave, task, _) = run.computing.swap_remove(k);
            run.end(slave, task, now);
            run.release(slave, task, 0, now);
            continue;
        }
        let At(_, _, event) = run.events.pop().expect("peeked");
        match event {
            Event::Release { slave, task, next } => run.release(slave, task, next, now),
            Event::Commit(task) => {
                last = last.max(now);
                run.commit(task, now);
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slave its own core.
    const ONE: fn(u64) -> f64 = |_| 1.0;

    fn task(foreground: f64, ending: f64, successors: Vec<usize>) -> SimTask {
        SimTask { foreground, release: 0.0, ending, successors }
    }

    /// Independent tasks: one slave runs them back to back, their endings
    /// hidden but the last; two slaves halve the compute.
    #[test]
    fn independent_tasks_hide_all_endings_but_the_last() {
        let tasks: Vec<_> = (0..4).map(|_| task(1.0, 0.25, vec![])).collect();
        assert!((makespan(&tasks, 1, 1, &ONE) - 4.25).abs() < 1e-12);
        // Two: the second pair's endings queue behind each other.
        assert!((makespan(&tasks, 2, 1, &ONE) - 2.5).abs() < 1e-12);
        // Endings longer than the foreground queue at the one store.
        let slow: Vec<_> = (0..4).map(|_| task(1.0, 2.0, vec![])).collect();
        assert!((makespan(&slow, 4, 1, &ONE) - 9.0).abs() < 1e-12);
        assert!((makespan(&slow, 4, 4, &ONE) - 3.0).abs() < 1e-12);
    }

    /// A chain pays every ending: each task waits for its predecessor's
    /// commit, whatever the number of slaves.
    #[test]
    fn a_chain_pays_every_ending() {
        let tasks = vec![task(1.0, 0.5, vec![1]), task(1.0, 0.5, vec![2]), task(1.0, 0.5, vec![])];
        for s in 1..4 {
            assert!((makespan(&tasks, s, 1, &ONE) - 4.5).abs() < 1e-12);
        }
    }

    /// A task with two inputs enters the bag at the later commit, and one
    /// slave runs the other branch meanwhile.
    #[test]
    fn a_join_waits_for_its_last_input() {
        // 0 -> {1, 2} -> 3
        let tasks = vec![task(1.0, 0.1, vec![1, 2]), task(2.0, 0.1, vec![3]), task(1.0, 0.1, vec![3]), task(1.0, 0.1, vec![])];
        // One slave: 0 [0,1], 1 [1.1,3.1], 2 [3.1,4.1] (1 commits 3.2),
        // 2 commits 4.2, 3 [4.2,5.2], commits 5.3.
        assert!((makespan(&tasks, 1, 1, &ONE) - 5.3).abs() < 1e-9, "{}", makespan(&tasks, 1, 1, &ONE));
        // Two: 2 commits at 2.2, 1 at 3.2; 3 runs [3.2, 4.2].
        assert!((makespan(&tasks, 2, 1, &ONE) - 4.3).abs() < 1e-9, "{}", makespan(&tasks, 2, 1, &ONE));
    }

    /// Two tasks that release the same counter: the second waits for the
    /// first's commit, which holds its lock.
    #[test]
    fn a_held_counter_waits_for_its_holders_commit() {
        let mut tasks = vec![task(1.0, 0.5, vec![2]), task(1.2, 0.5, vec![2]), task(1.0, 0.0, vec![])];
        for t in &mut tasks[..2] {
            t.release = 0.1;
        }
        // 0 releases [1, 1.1] while its ending runs [1, 1.5], commits 1.5;
        // 1 reaches its release at 1.2 (ending [1.2, 1.7]), waits to 1.5,
        // releases to 1.6, commits 1.7; 2 runs [1.7, 2.7].
        assert!((makespan(&tasks, 2, 2, &ONE) - 2.7).abs() < 1e-9, "{}", makespan(&tasks, 2, 2, &ONE));
        // Without the shared counter 2 runs after 0's commit, [1.5, 2.5].
        tasks[1].successors.clear();
        assert!((makespan(&tasks, 2, 2, &ONE) - 2.5).abs() < 1e-9, "{}", makespan(&tasks, 2, 2, &ONE));
    }

    /// A task's releases are one request: three successors cost its
    /// `release` once.
    #[test]
    fn a_task_releases_all_its_successors_in_one_request() {
        let mut tasks = vec![task(1.0, 0.0, vec![1, 2, 3]), task(1.0, 0.0, vec![]), task(1.0, 0.0, vec![]), task(1.0, 0.0, vec![])];
        tasks[0].release = 0.1;
        // 0 [0, 1], releases [1, 1.1], commits 1.1; 1, 2, 3 back to back.
        assert!((makespan(&tasks, 1, 1, &ONE) - 4.1).abs() < 1e-9, "{}", makespan(&tasks, 1, 1, &ONE));
        assert!((makespan(&tasks, 3, 1, &ONE) - 2.1).abs() < 1e-9, "{}", makespan(&tasks, 3, 1, &ONE));
    }

    /// Slaves on one core share it: two foregrounds side by side each run
    /// at half speed until the shorter ends.
    #[test]
    fn foregrounds_share_the_cores() {
        let tasks = vec![task(1.0, 0.0, vec![]), task(2.0, 0.0, vec![])];
        let one_core = |k: u64| k.max(1) as f64;
        // Both at half speed to t = 2 (the first's second of work), then
        // the second alone for its last second.
        assert!((makespan(&tasks, 2, 1, &one_core) - 3.0).abs() < 1e-9, "{}", makespan(&tasks, 2, 1, &one_core));
        assert!((makespan(&tasks, 2, 1, &ONE) - 2.0).abs() < 1e-9);
        // One slave: never shared.
        assert!((makespan(&tasks, 1, 1, &one_core) - 3.0).abs() < 1e-9);
    }
}
