//! `master job log JOB`: what happened to a job's tasks. Which slave
//! committed each task and when, after how many orphanings (a slave that
//! died holding it), the tasks given up (dead-lettered), the runs that
//! failed and sent their task back (with the message), and the job's
//! failure.

use anyhow::Context;
use job_record::{self as record, TaskDone, TaskFailure};
use store_client::Client;
use uuid::Uuid;

use crate::jobs::{failure_line, job_status};
use crate::out::outln;

/// One committed task, from its done record and its key.
struct Committed {
    bag: usize,
    seq: u64,
    done: TaskDone,
}

pub(crate) async fn log(client: &Client, id: Uuid, json: bool) -> anyhow::Result<()> {
    let s = job_status(client, id).await?;
    let mut committed = Vec::new();
    for (k, v) in client.scan_small(&record::done_prefix(id), 0).await? {
        // done/<id>/<bag index>/<seq>
        let mut parts = k.rsplit('/');
        let seq = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let bag = parts.next().and_then(|p| p.parse().ok()).unwrap_or(usize::MAX);
        committed.push(Committed { bag, seq, done: serde_json::from_slice(&v).context("unreadable task record")? });
    }
    committed.sort_by_key(|c| c.done.finished_ms);
    let mut failures = Vec::new();
    for (_, v) in client.scan_small(&record::task_failure_prefix(id), 0).await? {
        failures.push(serde_json::from_slice::<TaskFailure>(&v).context("unreadable task failure")?);
    }
    let mut dead = Vec::new();
    for bag in &s.record.bags {
        for t in client.list_bag(&store::dead_letter_bag(bag)).await? {
            dead.push((bag.clone(), t));
        }
    }
    let t0 = s.record.submitted_ms;
    let since = |ms: u64| ms.saturating_sub(t0) as f64 / 1e3;
    let bag_name = |i: usize| s.record.bags.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
    if json {
        let v = serde_json::json!({
            "id": id.to_string(),
            "state": s.state(),
            "committed": committed.iter().map(|c| serde_json::json!({
                "bag": bag_name(c.bag), "seq": c.seq, "slave": c.done.slave, "attempts": c.done.attempts,
                "count": c.done.count, "at_s": since(c.done.finished_ms), "compute_ms": c.done.compute_ms,
            })).collect::<Vec<_>>(),
            "dead_lettered": dead.iter().map(|(b, t)| serde_json::json!({
                "bag": b, "seq": t.seq, "task": String::from_utf8_lossy(&t.payload), "attempts": t.attempts,
            })).collect::<Vec<_>>(),
            "failed_runs": failures.iter().map(|f| serde_json::json!({
                "bag": f.bag, "seq": f.seq, "task": f.task, "slave": f.slave, "attempts": f.attempts,
                "at_s": since(f.at_ms), "message": f.message,
            })).collect::<Vec<_>>(),
            "failure": (s.state() == "failed").then(|| failure_line(&s)),
        });
        outln!("{v}");
        return Ok(());
    }
    outln!(
        "job {id}  {}  {}  {}/{} tasks committed, {} after an orphaning, {} dead-lettered, {} failed run(s)",
        s.record.spec.app_name(),
        s.state(),
        s.n_done(),
        s.record.total_tasks(),
        s.n_redone(),
        dead.len(),
        failures.len()
    );
    if !committed.is_empty() {
        outln!("committed, in order (seconds since the submit):");
        outln!("  {:>9}  {:<24} {:>6}  {:<20} {:>8} {:>11}", "at s", "bag", "task", "slave", "attempts", "compute ms");
        for c in &committed {
            let bag = bag_name(c.bag);
            let bag = bag.rsplit_once('/').map_or(bag.as_str(), |(_, last)| last).to_owned();
            outln!(
                "  {:>9.3}  {:<24} {:>6}  {:<20} {:>8} {:>11}",
                since(c.done.finished_ms),
                bag,
                c.seq,
                c.done.slave,
                c.done.attempts,
                c.done.compute_ms
            );
        }
    }
    if !dead.is_empty() {
        outln!("dead-lettered (given up after repeated slave deaths; `master retry {id}` runs them again):");
        for (bag, t) in &dead {
            outln!("  bag {bag} task {} ({}) after {} orphaning(s)", t.seq, String::from_utf8_lossy(&t.payload), t.attempts);
        }
    }
    if !failures.is_empty() {
        outln!("failed runs (the task went back to its bag):");
        for f in &failures {
            outln!("  {:>9.3}  {}  bag {} task {} ({}): {}", since(f.at_ms), f.slave, f.bag, f.seq, f.task, f.message);
        }
    }
    match s.state() {
        "failed" => outln!("{}", failure_line(&s)),
        "cancelled" => outln!("cancelled by `master cancel`"),
        _ => {}
    }
    Ok(())
}
