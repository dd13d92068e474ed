//! What a store node did since it started and what it holds now
//! ([`crate::Client::node_metrics`]): the figures of `master serve
//! --http`'s dashboard and `/metrics`, in the client's own types.

use crate::proto;

/// A node's counters since it started and its gauges now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeMetrics {
    /// Top-level commits made durable, and those whose batch failed.
    pub commits: u64,
    pub commits_failed: u64,
    /// Commit latency: `(upper bound in seconds, commits)` per bucket, not
    /// cumulative; the last bound is `f64::INFINITY`.
    pub commit_buckets: Vec<(f64, u64)>,
    pub commit_seconds_sum: f64,
    /// Actions aborted by their client (a failed task, a deadlock).
    pub aborts: u64,
    /// Queue elements handed back because their session ended while an
    /// action held them (a slave killed or cut off), and of those the ones
    /// that went to a dead-letter bag.
    pub tasks_orphaned: u64,
    pub tasks_dead_lettered: u64,
    /// Sessions that ended on a lost connection or a lapsed lease (a slave
    /// killed or cut off), not those their client closed.
    pub sessions_lost: u64,
    /// Lock requests that waited, and those that timed out.
    pub lock_waits: u64,
    pub lock_timeouts: u64,
    /// Dequeues that found no element free and waited for one.
    pub dequeue_waits: u64,
    /// Block payload bytes read and written through the node.
    pub block_bytes_read: u64,
    pub block_bytes_written: u64,
    /// Open sessions now.
    pub sessions: u32,
    /// The store's filesystem: free (for the node's user) and in all.
    pub disk_free_bytes: u64,
    pub disk_total_bytes: u64,
    /// RocksDB's table files (small objects, pointers, queues).
    pub rocksdb_sst_bytes: u64,
    /// RocksDB's block cache: in use and its size (`--cache-mib`).
    pub block_cache_bytes: u64,
    pub block_cache_capacity_bytes: u64,
    /// Block version files the node keeps open for reads.
    pub open_block_files: u64,
    /// Bytes of every matrix's blocks (their payloads, as created).
    pub matrix_bytes: u64,
}

impl From<proto::NodeMetrics> for NodeMetrics {
    fn from(m: proto::NodeMetrics) -> NodeMetrics {
        let bounds = m.commit_bounds_s.iter().copied().chain(std::iter::once(f64::INFINITY));
        NodeMetrics {
            commits: m.commits,
            commits_failed: m.commits_failed,
            commit_buckets: bounds.zip(m.commit_buckets.iter().copied()).collect(),
            commit_seconds_sum: m.commit_seconds_sum,
            aborts: m.aborts,
            tasks_orphaned: m.tasks_orphaned,
            tasks_dead_lettered: m.tasks_dead_lettered,
            sessions_lost: m.sessions_lost,
            lock_waits: m.lock_waits,
            lock_timeouts: m.lock_timeouts,
            dequeue_waits: m.dequeue_waits,
            block_bytes_read: m.block_bytes_read,
            block_bytes_written: m.block_bytes_written,
            sessions: m.sessions,
            disk_free_bytes: m.disk_free_bytes,
            disk_total_bytes: m.disk_total_bytes,
            rocksdb_sst_bytes: m.rocksdb_sst_bytes,
            block_cache_bytes: m.block_cache_bytes,
            block_cache_capacity_bytes: m.block_cache_capacity_bytes,
            open_block_files: m.open_block_files,
            matrix_bytes: m.matrix_bytes,
        }
    }
}

impl NodeMetrics {
    /// Commits counted in the buckets (all of them: the last is open).
    pub fn commit_count(&self) -> u64 {
        self.commit_buckets.iter().map(|(_, n)| n).sum()
    }
}
