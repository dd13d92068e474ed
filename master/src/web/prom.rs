//! `/metrics`: a [`Snapshot`] in Prometheus's text format, encoded by
//! `prometheus-client` (a collector over the snapshot: the figures are
//! the node's and the job records', not counters this process keeps).
//!
//! Counters end in `_total`, durations are in seconds, sizes in bytes.
//! Task counters are by app and come from the job records, so they are
//! durable: they do not restart from zero when the node restarts. The
//! node's own counters (commits, lock waits, block bytes) count since it
//! started.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::collect::Snapshot;

/// The content type of Prometheus's text format, version 0.0.4.
pub(super) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) fn render(snapshot: Arc<Snapshot>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(snapshot)));
    let mut out = String::new();
    // Writing to a String cannot fail; the encoder's `fmt::Error` is only
    // what its writer returns.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

#[derive(Debug)]
struct SnapshotCollector(Arc<Snapshot>);

type Labels = Vec<(&'static str, String)>;

/// A counter (`name` without `_total`, which the encoder adds) of one value.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge<N: EncodeGaugeValue>(e: &mut DescriptorEncoder, name: &str, help: &str, v: N) -> std::fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A metric of one type with a value per label set.
fn family<M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (Labels, M)>,
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        v.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let m = &s.metrics;
        gauge(&mut e, "ftbag_store_up", "1 when the last read of the store node (once a second) succeeded", u64::from(s.error.is_none()))?;

        // By app, from the job records: every app appears once it ran a job.
        let mut by_app: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
        let mut by_state: BTreeMap<&str, u64> = ["running", "succeeded", "failed", "cancelled"].into_iter().map(|k| (k, 0)).collect();
        for j in &s.figures {
            let a = by_app.entry(j.app).or_default();
            a[0] += j.done as u64;
            a[1] += j.aborted;
            a[2] += j.redone as u64;
            *by_state.entry(j.state).or_default() += 1;
        }
        let app_rows =
            |i: usize| by_app.iter().map(move |(app, v)| (vec![("app", app.to_string())], ConstCounter::new(v[i]))).collect::<Vec<_>>();
        family(&mut e, "ftbag_tasks_committed", "Tasks committed, by app (from the job records)", MetricType::Counter, app_rows(0))?;
        family(
            &mut e,
            "ftbag_tasks_aborted",
            "Task runs that ended without committing, by app: orphaned by a slave's death or cut-off, or failed and sent back",
            MetricType::Counter,
            app_rows(1),
        )?;
        family(&mut e, "ftbag_tasks_redone", "Tasks committed after an orphaned run, by app", MetricType::Counter, app_rows(2))?;
        family(
            &mut e,
            "ftbag_jobs",
            "Jobs by state",
            MetricType::Gauge,
            by_state.iter().map(|(state, n)| (vec![("state", state.to_string())], ConstGauge::new(*n as i64))),
        )?;
        // Queue depths of the jobs not ended: an ended job's bags are empty.
        let open: Vec<_> = s.figures.iter().filter(|j| j.state == "running" || j.dead > 0).collect();
        let queue_rows = open.iter().flat_map(|j| {
            let labels = |state: &str| vec![("job", j.id.to_string()), ("app", j.app.to_string()), ("state", state.to_string())];
            [(labels("waiting"), j.waiting), (labels("running"), j.running), (labels("dead"), j.dead)]
                .map(|(l, v)| (l, ConstGauge::new(v as i64)))
        });
        family(
            &mut e,
            "ftbag_queue_tasks",
            "Tasks in a running job's bags: waiting, running (taken) or dead-lettered",
            MetricType::Gauge,
            queue_rows,
        )?;
        family(
            &mut e,
            "ftbag_job_progress_ratio",
            "Fraction of a running job's tasks committed",
            MetricType::Gauge,
            open.iter().map(|j| {
                let ratio = if j.total > 0 { j.done as f64 / j.total as f64 } else { 0.0 };
                (vec![("job", j.id.to_string()), ("app", j.app.to_string())], ConstGauge::new(ratio))
            }),
        )?;

        // The node's own counters, since it started.
        counter(&mut e, "ftbag_commits", "Top-level commits made durable", m.commits)?;
        counter(&mut e, "ftbag_commits_failed", "Top-level commits whose batch failed (the action aborted)", m.commits_failed)?;
        e.encode_descriptor(
            "ftbag_commit_duration_seconds",
            "Top-level commit latency: prepare, synced batch, finish",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(m.commit_seconds_sum, m.commit_count(), &m.commit_buckets, None)?;
        counter(&mut e, "ftbag_actions_aborted", "Actions aborted by their client (a failed task, a deadlock)", m.aborts)?;
        counter(&mut e, "ftbag_tasks_orphaned", "Queue elements handed back because their slave's session ended", m.tasks_orphaned)?;
        counter(&mut e, "ftbag_tasks_dead_lettered", "Orphaned elements moved to a dead-letter bag", m.tasks_dead_lettered)?;
        counter(
            &mut e,
            "ftbag_sessions_lost",
            "Sessions ended by a lost connection or a lapsed lease: a slave killed or cut off, or a client that exited without closing its session",
            m.sessions_lost,
        )?;
        counter(&mut e, "ftbag_lock_waits", "Lock requests that waited for another action", m.lock_waits)?;
        counter(&mut e, "ftbag_lock_timeouts", "Lock requests that timed out waiting", m.lock_timeouts)?;
        counter(&mut e, "ftbag_block_read_bytes", "Block payload bytes read through the node", m.block_bytes_read)?;
        counter(&mut e, "ftbag_block_written_bytes", "Block payload bytes written through the node", m.block_bytes_written)?;

        // Gauges of now.
        gauge(&mut e, "ftbag_sessions", "Open sessions (slaves and other clients)", m.sessions)?;
        gauge(&mut e, "ftbag_slaves", "Open sessions of slaves", s.slaves.len() as u64)?;
        gauge(&mut e, "ftbag_disk_free_bytes", "Free bytes on the store's filesystem (for the node's user)", m.disk_free_bytes)?;
        gauge(&mut e, "ftbag_disk_size_bytes", "Size of the store's filesystem", m.disk_total_bytes)?;
        gauge(&mut e, "ftbag_rocksdb_sst_bytes", "Bytes of RocksDB's table files", m.rocksdb_sst_bytes)?;
        gauge(&mut e, "ftbag_matrix_bytes", "Bytes of every matrix's blocks once written", m.matrix_bytes)?;
        gauge(&mut e, "ftbag_block_cache_bytes", "RocksDB block cache in use", m.block_cache_bytes)?;
        gauge(&mut e, "ftbag_block_cache_capacity_bytes", "RocksDB block cache size (--cache-mib)", m.block_cache_capacity_bytes)?;
        gauge(&mut e, "ftbag_open_block_files", "Block version files kept open for reads", m.open_block_files)?;
        Ok(())
    }
}
