//! What the dashboard and `/metrics` show, read once a second from the
//! node the way `master status`, `master slaves` and `master node` read
//! it (job records through `jobs::job_status`, the sessions, the node's
//! metrics), and kept as one [`Snapshot`] that every request answers from:
//! however many pages and scrapers look, the node is read once a second.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use job_record as record;
use serde::Serialize;
use store_client::{Client, NodeMetrics};
use uuid::Uuid;

use crate::jobs::{self, JobStatus};

/// How often the node is read.
pub(super) const PERIOD: Duration = Duration::from_secs(1);
/// Samples of the charts kept: ten minutes at [`PERIOD`].
const HISTORY: usize = 600;
/// A slave's recent rate: its tasks committed in this window.
const RATE_WINDOW_MS: u64 = 30_000;
/// Jobs listed on the page (the newest); `/metrics` counts them all.
const JOBS_SHOWN: usize = 20;

/// One job's figures for `/metrics`, by app.
#[derive(Clone, Debug)]
pub(super) struct JobFigures {
    pub(super) id: Uuid,
    pub(super) app: &'static str,
    pub(super) state: &'static str,
    pub(super) total: usize,
    pub(super) done: usize,
    pub(super) redone: usize,
    /// Runs that ended without committing: orphaned ones (counted in
    /// their task's committed record) and failed ones (their records).
    pub(super) aborted: u64,
    pub(super) running: u64,
    pub(super) waiting: u64,
    pub(super) dead: u64,
    pub(super) flops: f64,
}

/// A job as the page and `/metrics` see it.
#[derive(Clone, Debug)]
struct JobView {
    figures: JobFigures,
    /// `master status --json`'s object, with `tasks_aborted` added.
    json: serde_json::Value,
}

/// A slave (a session not of the master) as the page lists it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct SlaveView {
    session: u64,
    name: String,
    host: String,
    age_s: f64,
    since_heartbeat_ms: u64,
    /// The task its actions hold, said as "app job-prefix what #seq".
    task: Option<String>,
    /// Its tasks committed and GFLOP/s over the last [`RATE_WINDOW_MS`]
    /// (or its life, if shorter).
    recent_tasks: usize,
    recent_gflops: f64,
}

/// One point of the charts: rates over the period before `t_ms`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct Sample {
    t_ms: u64,
    gflops: f64,
    tasks_per_s: f64,
    read_bytes_per_s: f64,
    written_bytes_per_s: f64,
}

/// Everything one read of the node found.
#[derive(Clone, Debug, Default, Serialize)]
pub(super) struct Snapshot {
    pub(super) at_ms: u64,
    /// Why the last read failed, if it did (the figures are the read before).
    pub(super) error: Option<String>,
    jobs: Vec<serde_json::Value>,
    pub(super) slaves: Vec<SlaveView>,
    node: serde_json::Value,
    history: Vec<Sample>,
    #[serde(skip)]
    pub(super) figures: Vec<JobFigures>,
    #[serde(skip)]
    pub(super) metrics: NodeMetrics,
}

/// The totals a chart's rates come from.
#[derive(Clone, Copy)]
struct Totals {
    t_ms: u64,
    flops: f64,
    tasks: usize,
    read: u64,
    written: u64,
}

/// Reads the node and keeps what does not change: the views of ended jobs.
pub(super) struct Collector {
    client: Client,
    tls: bool,
    ended: HashMap<Uuid, JobView>,
    rates: Rates,
}

/// The charts' points and the totals the next one starts from.
#[derive(Default)]
struct Rates {
    history: VecDeque<Sample>,
    last: Option<Totals>,
}

impl Collector {
    pub(super) fn new(client: Client, tls: bool) -> Collector {
        Collector { client, tls, ended: HashMap::new(), rates: Rates::default() }
    }

    /// One read; on failure the previous snapshot is kept with the reason.
    pub(super) async fn next(&mut self, previous: &Snapshot) -> Snapshot {
        match self.read().await {
            Ok(s) => s,
            Err(e) => Snapshot { at_ms: record::now_ms(), error: Some(format!("{e:#}")), ..previous.clone() },
        }
    }

    async fn read(&mut self) -> anyhow::Result<Snapshot> {
        let now = record::now_ms();
        let sessions = self.client.list_sessions().await?;
        let metrics = self.client.node_metrics().await?;
        let n_slaves = sessions.iter().filter(|s| is_slave(&s.client_name)).count();
        let mut views = Vec::new();
        let mut recent: HashMap<String, (usize, f64)> = HashMap::new();
        for record in jobs::all_jobs(&self.client).await? {
            let id = record.id();
            if let Some(v) = self.ended.get(&id) {
                views.push(v.clone());
                continue;
            }
            let status = jobs::job_status(&self.client, id).await?;
            for d in status.done.iter().filter(|d| d.finished_ms + RATE_WINDOW_MS >= now) {
                let r = recent.entry(d.slave.clone()).or_default();
                r.0 += 1;
                r.1 += d.flops;
            }
            let n_failed_runs = self.client.scan_small(&record::task_failure_prefix(id), 0).await?.len() as u64;
            let view = job_view(&status, n_slaves, n_failed_runs);
            // A failed job may run again (`master retry`); these stay as they are.
            if matches!(status.state(), "succeeded" | "cancelled") {
                self.ended.insert(id, view.clone());
            }
            views.push(view);
        }
        let apps: HashMap<Uuid, &'static str> = views.iter().map(|v| (v.figures.id, v.figures.app)).collect();
        let slaves = sessions
            .iter()
            .filter(|s| is_slave(&s.client_name))
            .map(|s| {
                let (n, flops) = recent.get(&s.client_name).copied().unwrap_or_default();
                SlaveView {
                    session: s.session,
                    name: s.client_name.clone(),
                    host: crate::host_of(&s.peer).to_owned(),
                    age_s: s.age_ms as f64 / 1e3,
                    since_heartbeat_ms: s.since_heartbeat_ms,
                    task: s.tasks.first().map(|t| task_line(t, &apps)),
                    recent_tasks: n,
                    // Over the window, or the slave's life if shorter.
                    recent_gflops: flops / (RATE_WINDOW_MS.min(s.age_ms).max(1) as f64 / 1e3) / 1e9,
                }
            })
            .collect();
        let totals = Totals {
            t_ms: now,
            flops: views.iter().map(|v| v.figures.flops).sum(),
            tasks: views.iter().map(|v| v.figures.done).sum(),
            read: metrics.block_bytes_read,
            written: metrics.block_bytes_written,
        };
        self.rates.sample(totals);
        let figures: Vec<JobFigures> = views.iter().map(|v| v.figures.clone()).collect();
        let shown = views.iter().rev().take(JOBS_SHOWN).map(|v| v.json.clone()).collect();
        Ok(Snapshot {
            at_ms: now,
            error: None,
            jobs: shown,
            slaves,
            node: node_json(&metrics, self.tls, sessions.len()),
            history: self.rates.history.iter().copied().collect(),
            figures,
            metrics,
        })
    }
}

impl Rates {
    /// Adds the rates since the last read to the history.
    fn sample(&mut self, now: Totals) {
        if let Some(last) = self.last.filter(|l| now.t_ms > l.t_ms) {
            let dt = (now.t_ms - last.t_ms) as f64 / 1e3;
            self.history.push_back(Sample {
                t_ms: now.t_ms,
                gflops: (now.flops - last.flops).max(0.0) / dt / 1e9,
                tasks_per_s: now.tasks.saturating_sub(last.tasks) as f64 / dt,
                read_bytes_per_s: now.read.saturating_sub(last.read) as f64 / dt,
                written_bytes_per_s: now.written.saturating_sub(last.written) as f64 / dt,
            });
            if self.history.len() > HISTORY {
                self.history.pop_front();
            }
        }
        self.last = Some(now);
    }
}

/// A session of a slave, not of a `master` command (as `master status` counts them).
fn is_slave(client_name: &str) -> bool {
    !client_name.starts_with("master")
}

fn job_view(s: &JobStatus, n_slaves: usize, n_failed_runs: u64) -> JobView {
    let orphaned: u64 = s.done.iter().map(|d| u64::from(d.attempts)).sum();
    let figures = JobFigures {
        id: s.record.id(),
        app: s.record.spec.app_name(),
        state: s.state(),
        total: s.record.total_tasks(),
        done: s.n_done(),
        redone: s.n_redone(),
        aborted: orphaned + n_failed_runs,
        running: s.per_bag.iter().map(|b| b.running).sum(),
        waiting: s.per_bag.iter().map(|b| b.waiting).sum(),
        dead: s.n_dead(),
        flops: s.flops_done(),
    };
    let mut json = jobs::status_json(s, Some(n_slaves));
    json["tasks_aborted"] = figures.aborted.into();
    JobView { figures, json }
}

/// "matmul 1a2b3c4d tasks #17" for a held element "JOB/what#seq".
fn task_line(held: &str, apps: &HashMap<Uuid, &'static str>) -> String {
    let (bag, seq) = held.rsplit_once('#').unwrap_or((held, ""));
    let Some((job, what)) = bag.split_once('/') else { return held.to_owned() };
    let app = job.parse::<Uuid>().ok().and_then(|id| apps.get(&id).copied()).unwrap_or("job");
    format!("{app} {} {what} #{seq}", &job[..job.len().min(8)])
}

fn node_json(m: &NodeMetrics, tls: bool, sessions: usize) -> serde_json::Value {
    serde_json::json!({
        "tls": tls,
        "sessions": sessions,
        "commits": m.commits,
        "commit_mean_ms": if m.commits > 0 { m.commit_seconds_sum / m.commits as f64 * 1e3 } else { 0.0 },
        "aborts": m.aborts,
        "tasks_orphaned": m.tasks_orphaned,
        "tasks_dead_lettered": m.tasks_dead_lettered,
        "sessions_lost": m.sessions_lost,
        "lock_waits": m.lock_waits,
        "block_bytes_read": m.block_bytes_read,
        "block_bytes_written": m.block_bytes_written,
        "disk_free_bytes": m.disk_free_bytes,
        "disk_total_bytes": m.disk_total_bytes,
        "rocksdb_sst_bytes": m.rocksdb_sst_bytes,
        "matrix_bytes": m.matrix_bytes,
        "block_cache_bytes": m.block_cache_bytes,
        "block_cache_capacity_bytes": m.block_cache_capacity_bytes,
        "open_block_files": m.open_block_files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_element_names_its_app_and_job() {
        let id = Uuid::new_v4();
        let apps = HashMap::from([(id, "matmul")]);
        assert_eq!(task_line(&format!("{id}/tasks#17"), &apps), format!("matmul {} tasks #17", &id.to_string()[..8]));
        assert_eq!(task_line("other#3", &apps), "other#3");
    }

    #[test]
    fn rates_come_from_the_totals_between_reads() {
        let mut r = Rates::default();
        r.sample(Totals { t_ms: 1_000, flops: 0.0, tasks: 0, read: 0, written: 0 });
        assert!(r.history.is_empty(), "one read has no rate yet");
        r.sample(Totals { t_ms: 3_000, flops: 4e9, tasks: 10, read: 2 << 20, written: 1 << 20 });
        let s = r.history[0];
        assert_eq!((s.gflops, s.tasks_per_s), (2.0, 5.0));
        assert_eq!((s.read_bytes_per_s, s.written_bytes_per_s), ((1 << 20) as f64, (1 << 19) as f64));
    }
}
