//! Counters of what the node did since it started, for the dashboard and
//! `/metrics` (`master serve --http`): commits and their latency, aborts,
//! orphaned tasks, lock waits, block bytes. Relaxed atomics bumped on the
//! paths that do the work; nothing here takes the node's mutex, and a
//! reader sees each counter at some recent value (they are not one
//! consistent cut, which no scrape needs).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use store_client::proto;

/// Upper bounds (seconds) of the commit-latency buckets; a last, open
/// bucket takes the rest. A commit is one synced batch: from about a
/// millisecond on a fast disk to seconds on a loaded one.
pub(crate) const COMMIT_BOUNDS_S: [f64; 12] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0];

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Top-level commits made durable.
    pub(crate) commits: AtomicU64,
    /// Top-level commits whose batch failed (the action aborted).
    pub(crate) commits_failed: AtomicU64,
    /// Per bucket of [`COMMIT_BOUNDS_S`], then the open one: not cumulative.
    commit_buckets: [AtomicU64; COMMIT_BOUNDS_S.len() + 1],
    commit_us: AtomicU64,
    /// Actions aborted by their client (a task that failed, a deadlock).
    pub(crate) aborts: AtomicU64,
    /// Queue elements handed back because their session ended (a slave
    /// died or was cut off) while its action held them.
    pub(crate) tasks_orphaned: AtomicU64,
    /// Of those, the elements moved to a dead-letter bag.
    pub(crate) tasks_dead_lettered: AtomicU64,
    /// Sessions the node ended on a lost connection or a lapsed lease (a
    /// slave killed or cut off), not those their client closed.
    pub(crate) sessions_lost: AtomicU64,
    /// Lock requests that had to wait, and those that timed out waiting.
    pub(crate) lock_waits: AtomicU64,
    pub(crate) lock_timeouts: AtomicU64,
    /// Dequeues that found no element free and waited for one.
    pub(crate) dequeue_waits: AtomicU64,
    /// Payload bytes of the blocks read (gets under an action or of the
    /// committed state, whichever transport) and written (puts staged).
    pub(crate) block_bytes_read: AtomicU64,
    pub(crate) block_bytes_written: AtomicU64,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn commit_took(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = COMMIT_BOUNDS_S.iter().position(|&b| s <= b).unwrap_or(COMMIT_BOUNDS_S.len());
        self.commit_buckets[i].fetch_add(1, Relaxed);
        self.commit_us.fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// The counters in their wire form; the caller fills in the gauges
    /// (sessions, disk, caches) it reads elsewhere.
    pub(crate) fn snapshot(&self) -> proto::NodeMetrics {
        proto::NodeMetrics {
            commits: self.commits.load(Relaxed),
            commits_failed: self.commits_failed.load(Relaxed),
            commit_bounds_s: COMMIT_BOUNDS_S.to_vec(),
            commit_buckets: self.commit_buckets.iter().map(|b| b.load(Relaxed)).collect(),
            commit_seconds_sum: self.commit_us.load(Relaxed) as f64 / 1e6,
            aborts: self.aborts.load(Relaxed),
            tasks_orphaned: self.tasks_orphaned.load(Relaxed),
            tasks_dead_lettered: self.tasks_dead_lettered.load(Relaxed),
            sessions_lost: self.sessions_lost.load(Relaxed),
            lock_waits: self.lock_waits.load(Relaxed),
            lock_timeouts: self.lock_timeouts.load(Relaxed),
            dequeue_waits: self.dequeue_waits.load(Relaxed),
            block_bytes_read: self.block_bytes_read.load(Relaxed),
            block_bytes_written: self.block_bytes_written.load(Relaxed),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_lands_in_the_first_bucket_that_holds_it() {
        let m = Metrics::default();
        m.commit_took(Duration::from_micros(300));
        m.commit_took(Duration::from_millis(1));
        m.commit_took(Duration::from_secs(60));
        let s = m.snapshot();
        assert_eq!(s.commit_buckets[0], 1);
        assert_eq!(s.commit_buckets[1], 1, "a bound is inclusive, as Prometheus's `le`");
        assert_eq!(*s.commit_buckets.last().unwrap(), 1, "past the last bound: the open bucket");
        assert_eq!(s.commit_buckets.len(), s.commit_bounds_s.len() + 1);
        assert!((s.commit_seconds_sum - 60.0013).abs() < 1e-9);
    }
}
