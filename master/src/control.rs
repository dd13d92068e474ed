//! Job control: `master cancel`, `master retry`, and what a running job
//! holds (its matrices may not be removed or replaced under it).
//!
//! A job's end is a small object under `jobstate/<id>/` (see
//! `job_record`); slaves read the job's failure flag at every task's
//! start and skip every job with an end. So a cancel writes a failure
//! record beside its cancel record (slaves stop at their next task) and
//! drains its bags in actions; a retry moves the dead-lettered tasks back
//! and removes the end records in one action.

use std::time::Duration;

use anyhow::Context;
use apps::job::JobSpec;
use job_record::{self as record, Cancelled, Failure, JobRecord};
use store_client::{Client, Dequeue};
use uuid::Uuid;

use crate::jobs::{all_jobs, job_status};

/// The matrices a job reads (`false`) and writes (`true`).
pub(crate) fn job_matrices(spec: &JobSpec) -> Vec<(Uuid, bool)> {
    match spec {
        JobSpec::Matmul { a, b, c, .. } => vec![(a.id.0, false), (b.id.0, false), (c.id.0, true)],
        JobSpec::Cholesky { a, l, .. } => vec![(a.id.0, false), (l.id.0, true)],
        JobSpec::Lu { a, lu, .. } => vec![(a.id.0, false), (lu.id.0, true)],
        JobSpec::Raytrace { .. } => vec![],
    }
}

/// Why a matrix may not be removed or replaced.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InUseError {
    #[error(
        "matrix {matrix:?} is {} by job {job}, which is still running: wait for it (`master wait {job}`), cancel it (`master cancel {job}`), or give --force",
        if *.writes { "written" } else { "read" }
    )]
    ByRunningJob { matrix: String, job: Uuid, writes: bool },
}

/// Whether an end is recorded for each job: the ids under `jobstate/`.
async fn ended_jobs(client: &Client) -> anyhow::Result<std::collections::HashSet<Uuid>> {
    Ok(client
        .scan_small(record::JOB_STATE_PREFIX, 0)
        .await?
        .into_iter()
        .filter_map(|(k, _)| Uuid::try_parse(k.strip_prefix(record::JOB_STATE_PREFIX)?.split_once('/')?.0).ok())
        .collect())
}

/// `InUseError` if a job that has not ended reads or writes matrix `id`.
pub(crate) async fn check_not_in_use(client: &Client, id: Uuid, name: &str) -> anyhow::Result<()> {
    let ended = ended_jobs(client).await?;
    for job in all_jobs(client).await? {
        if ended.contains(&job.id()) {
            continue;
        }
        if let Some(&(_, writes)) = job_matrices(&job.spec).iter().find(|(m, _)| *m == id) {
            return Err(InUseError::ByRunningJob { matrix: name.to_owned(), job: job.id(), writes }.into());
        }
    }
    Ok(())
}

/// Why each matrix written by a job that did not succeed is incomplete:
/// the latest such job's state ("output of failed job …").
pub(crate) async fn unfinished_outputs(client: &Client) -> anyhow::Result<std::collections::HashMap<Uuid, String>> {
    let ended = ended_jobs(client).await?;
    let mut out = std::collections::HashMap::new();
    // Oldest first: a later job writing the same matrix says last.
    for job in all_jobs(client).await? {
        let outputs: Vec<Uuid> = job_matrices(&job.spec).into_iter().filter(|&(_, w)| w).map(|(m, _)| m).collect();
        if outputs.is_empty() {
            continue;
        }
        let state = if ended.contains(&job.id()) { end_state(client, &job).await? } else { "running" };
        for m in outputs {
            match state {
                "succeeded" => out.remove(&m),
                other => out.insert(m, format!("output of {other} job {}", job.id())),
            };
        }
    }
    Ok(out)
}

/// The state of a job with an end record, from its end records and its
/// bags' dead letters: what `JobStatus::state` says, without reading every
/// task record (a listing of matrices would read them for every job).
async fn end_state(client: &Client, job: &JobRecord) -> anyhow::Result<&'static str> {
    let id = job.id();
    if client.peek_small(&record::cancelled_key(id)).await?.is_some() {
        return Ok("cancelled");
    }
    if client.peek_small(&record::failed_key(id)).await?.is_some() {
        return Ok("failed");
    }
    for bag in &job.bags {
        if client.bag_stats(bag).await?.dead > 0 {
            return Ok("failed");
        }
    }
    Ok("succeeded")
}

/// Elements taken from a bag per action while draining.
const DRAIN_PER_ACTION: usize = 256;
/// How long a cancel waits for the tasks slaves hold to end (they commit
/// or abort at their task's end; a dag's commit may enqueue more).
const DRAIN_PATIENCE: Duration = Duration::from_secs(60);

/// `master cancel JOB`: the job is recorded cancelled (slaves stop taking
/// its tasks at their next task), its bags are drained, and its outputs
/// removed or left marked incomplete.
pub(crate) async fn cancel(client: &Client, id: Uuid, remove_outputs: bool) -> anyhow::Result<usize> {
    let s = job_status(client, id).await?;
    match s.state() {
        "succeeded" => anyhow::bail!("job {id} has already succeeded; nothing to cancel"),
        "cancelled" => anyhow::bail!("job {id} is already cancelled"),
        _ => {}
    }
    let session = client.open_session("master cancel").await?;
    let a = session.begin().await?;
    let failed = a.read_small(&record::failed_key(id), true).await?;
    if failed.is_none() {
        let f = Failure {
            reason: "cancelled".into(),
            bag: String::new(),
            task: String::new(),
            slave: "master cancel".into(),
            at_ms: record::now_ms(),
        };
        a.write_small(&record::failed_key(id), &serde_json::to_vec(&f)?).await?;
    }
    let c = Cancelled { at_ms: record::now_ms(), outputs_removed: remove_outputs };
    a.write_small(&record::cancelled_key(id), &serde_json::to_vec(&c)?).await?;
    a.commit().await?;
    let drained = drain(&session, &s.record).await?;
    if remove_outputs {
        for (m, _) in job_matrices(&s.record.spec).into_iter().filter(|&(_, w)| w) {
            match client.delete_matrix(m).await {
                Ok(()) | Err(store_client::StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e).context("removing the job's output"),
            }
        }
    }
    Ok(drained)
}

/// Takes every element out of the job's bags (and their dead letters),
/// committing every [`DRAIN_PER_ACTION`]; waits for the elements slaves
/// hold. Returns how many it took.
async fn drain(session: &store_client::Session, job: &JobRecord) -> anyhow::Result<usize> {
    let deadline = tokio::time::Instant::now() + DRAIN_PATIENCE;
    let mut n = 0;
    let bags = job.bags.iter().flat_map(|b| [b.clone(), store::dead_letter_bag(b)]);
    for bag in bags {
        loop {
            let a = session.begin().await?;
            let mut took = 0;
            let mut empty = false;
            while took < DRAIN_PER_ACTION {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match a.dequeue(&bag, left.min(Duration::from_secs(1))).await? {
                    Dequeue::Task(_) => took += 1,
                    Dequeue::Empty => {
                        empty = true;
                        break;
                    }
                    // Held by slaves' running tasks: commit what was taken
                    // (so their next commits are not kept waiting), wait on.
                    Dequeue::NoneAvailable => break,
                }
            }
            a.commit().await?;
            n += took;
            if empty {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("job {}: tasks of bag {bag} still held by slaves after {DRAIN_PATIENCE:?}", job.id());
            }
        }
    }
    Ok(n)
}

/// `master retry JOB`: its dead-lettered tasks go back to their bags and
/// its failure and end records are removed, in one action: the job runs
/// again where it stopped. Returns how many tasks went back.
pub(crate) async fn retry(client: &Client, id: Uuid) -> anyhow::Result<usize> {
    let s = job_status(client, id).await?;
    match s.state() {
        "succeeded" => anyhow::bail!("job {id} has succeeded; nothing to retry"),
        "cancelled" => anyhow::bail!("job {id} was cancelled; submit it again instead"),
        "running" if s.n_dead() == 0 => anyhow::bail!("job {id} is running and has no dead-lettered task; nothing to retry"),
        _ => {}
    }
    let session = client.open_session("master retry").await?;
    let a = session.begin().await?;
    let mut n = 0;
    for bag in &s.record.bags {
        let dead = store::dead_letter_bag(bag);
        while let Dequeue::Task(t) = a.dequeue(&dead, Duration::ZERO).await? {
            a.enqueue(bag, &t.payload).await?;
            n += 1;
        }
    }
    for key in [record::failed_key(id), record::finished_key(id)] {
        if a.read_small(&key, true).await?.is_some() {
            a.delete_small(&key).await?;
        }
    }
    // Idle slaves watch the submit counter: they see the job again at once.
    let submitted = record::submitted_count(a.read_small(record::SUBMITTED_KEY, true).await?.as_deref());
    a.write_small(record::SUBMITTED_KEY, &(submitted + 1).to_le_bytes()).await?;
    a.commit().await?;
    Ok(n)
}
