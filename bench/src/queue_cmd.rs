//! `bench queue`: durable dequeue+commit throughput of empty tasks.
//!
//! A real store node runs in this process (its own tokio runtime, a fresh
//! data directory, gRPC on loopback), so every request crosses the same
//! wire a slave's does. For each client count C, a fresh bag is filled with
//! empty tasks, then C clients, each with its own connection and session,
//! loop `begin; dequeue; commit` until the bag is empty or the round's time
//! is up. Every commit is the store's normal top-level commit: one synced
//! RocksDB batch that deletes the element (RocksDB groups concurrent synced
//! writes behind one fsync).
//!
//! Figures per C: tasks/s, and p50/p99 of the dequeue+commit latency (from
//! sending the dequeue to the commit's acknowledgement; `begin` is left
//! out because a slave overlaps it with nothing either way and it never
//! touches the disk).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde_json::json;
use store_client::{Client, Dequeue};

use crate::report::Figure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run, under a minute (fewer tasks, shorter rounds).
    #[arg(long)]
    quick: bool,
    /// Concurrent client counts, one round each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,8,32")]
    clients: Vec<usize>,
    /// Tasks enqueued before each round (default 20000, quick 4000).
    #[arg(long)]
    tasks: Option<usize>,
    /// Longest a round may run, seconds (default 15, quick 4): rounds end
    /// when the bag is empty or at this limit, whichever is first.
    #[arg(long)]
    round_secs: Option<f64>,
    /// Use a running store node at this address instead of starting one
    /// in-process (it must accept the benchmark's bags).
    #[arg(long, env = "STORE_ADDR")]
    store: Option<String>,
    /// Cluster token for `--store`.
    #[arg(long, env = "STORE_TOKEN")]
    token: Option<String>,
    /// Directory for the in-process node's data (a fresh subdirectory is
    /// made and removed); must be on the disk you want to measure.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

/// Target at 8 clients (issue 2).
const TARGET_TASKS_PER_S: f64 = 5000.0;

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let n_tasks = args.tasks.unwrap_or(if args.quick { 4000 } else { 20_000 });
    let round = Duration::from_secs_f64(args.round_secs.unwrap_or(if args.quick { 4.0 } else { 15.0 }));
    // The node gets its own runtime (its own threads), so the clients'
    // polling does not sit in the node's run queues; on a 2-core machine
    // they still share the CPUs, as a store node and local slaves would.
    let node = match &args.store {
        Some(_) => None,
        None => Some(crate::store_node::InProcess::start(args.data_dir.as_deref())?),
    };
    let addr = match (&args.store, &node) {
        (Some(a), _) => a.clone(),
        (None, Some(n)) => n.addr(),
        (None, None) => unreachable!("one of the two is set"),
    };
    let token = args.token.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let disk = node.as_ref().map(|n| n.data_dir().display().to_string()).unwrap_or_else(|| "remote".into());
    eprintln!("queue bench: store node at {addr} (data {disk}), {n_tasks} tasks per round, rounds ≤ {round:?}");
    let run_id = std::process::id();
    for &c in &args.clients {
        if c == 0 {
            bail!("--clients: a count must be at least 1");
        }
        let bag = format!("bench-queue-{run_id}-c{c}");
        let r = rt.block_on(one_round(&addr, token.as_deref(), &bag, c, n_tasks, round))?;
        // The machine may be shared: the 1-minute load average says how
        // much else ran during the round.
        let load = crate::store_node::load_average();
        let extra = |v: Vec<(&'static str, serde_json::Value)>| {
            let mut e = vec![("clients", json!(c)), ("tasks", json!(r.done)), ("secs", json!(round3(r.secs))), ("loadavg", json!(load))];
            e.extend(v);
            e
        };
        Figure {
            name: "queue.tasks_per_s",
            value: round1(r.done as f64 / r.secs),
            unit: "tasks/s",
            target: (c == 8).then_some(TARGET_TASKS_PER_S),
            extra: extra(vec![]),
        }
        .print();
        for (name, q) in [("queue.latency_p50", 0.5), ("queue.latency_p99", 0.99)] {
            Figure {
                name,
                value: round3(r.latency.value_at_quantile(q) as f64 / 1000.0),
                unit: "ms",
                target: None,
                extra: extra(vec![("what", json!("dequeue+commit, commit synced"))]),
            }
            .print();
        }
    }
    drop(rt);
    if let Some(n) = node {
        n.stop()?;
    }
    Ok(())
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

struct RoundResult {
    done: u64,
    secs: f64,
    /// Microseconds.
    latency: Histogram<u64>,
}

async fn one_round(
    addr: &str,
    token: Option<&str>,
    bag: &str,
    clients: usize,
    n_tasks: usize,
    limit: Duration,
) -> anyhow::Result<RoundResult> {
    fill(addr, token, bag, n_tasks).await?;
    // Connect and open every session before the clock starts.
    let mut sessions = Vec::with_capacity(clients);
    for k in 0..clients {
        let client = Client::connect(addr, token).await.context("connecting a bench client")?;
        sessions.push(client.open_session(&format!("bench-queue-{k}")).await?);
    }
    let start_gate = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut handles = Vec::with_capacity(clients);
    for session in sessions {
        let bag = bag.to_owned();
        let gate = start_gate.clone();
        handles.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
            let mut done = 0u64;
            gate.wait().await;
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline {
                let action = session.begin().await?;
                let t0 = Instant::now();
                match action.dequeue(&bag, Duration::ZERO).await? {
                    Dequeue::Task(_) => {
                        action.commit().await?;
                        h.record(t0.elapsed().as_micros().max(1) as u64).expect("within bounds");
                        done += 1;
                    }
                    // Empty: this round's tasks are all done. (NoneAvailable
                    // cannot last: the holders are committing.)
                    Dequeue::Empty => {
                        action.abort().await?;
                        break;
                    }
                    Dequeue::NoneAvailable => {
                        action.abort().await?;
                        tokio::task::yield_now().await;
                    }
                }
            }
            anyhow::Ok((done, h, Instant::now()))
        }));
    }
    start_gate.wait().await;
    let t0 = Instant::now();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let mut done = 0;
    let mut end = t0;
    for h in handles {
        let (d, hist, finished) = h.await.context("bench client panicked")??;
        done += d;
        latency.add(hist)?;
        end = end.max(finished);
    }
    let secs = end.duration_since(t0).as_secs_f64();
    Ok(RoundResult { done, secs, latency })
}

/// Enqueues `n` empty tasks, 500 per committed action, from 4 concurrent
/// writers (this part is not timed).
async fn fill(addr: &str, token: Option<&str>, bag: &str, n: usize) -> anyhow::Result<()> {
    const PER_ACTION: usize = 500;
    const WRITERS: usize = 4;
    let client = Client::connect(addr, token).await.context("connecting to the store node")?;
    let session = client.open_session("bench-queue-fill").await?;
    let chunks: Vec<usize> = (0..n.div_ceil(PER_ACTION)).map(|i| PER_ACTION.min(n - i * PER_ACTION)).collect();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mine: Vec<usize> = chunks.iter().copied().skip(w).step_by(WRITERS).collect();
        let (session, bag) = (session.clone(), bag.to_owned());
        writers.push(tokio::spawn(async move {
            for k in mine {
                let action = session.begin().await?;
                for _ in 0..k {
                    action.enqueue(&bag, b"").await?;
                }
                action.commit().await?;
            }
            anyhow::Ok(())
        }));
    }
    for w in writers {
        w.await??;
    }
    let stats = client.bag_stats(bag).await?;
    if stats.free as usize != n {
        bail!("bag {bag} has {} free tasks after filling, expected {n}", stats.free);
    }
    Ok(())
}
