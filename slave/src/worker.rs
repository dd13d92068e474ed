//! The slave loop (DESIGN §6, `003…` Fig. 2.3), with reconnection: a slave
//! outlives store-node restarts.

use std::time::{Duration, Instant};

use apps::job::{run_task, ErrorClass};
use store_client::{Action, Client, Dequeue, Session, StoreError, Task};
use uuid::Uuid;

use crate::ctx::StoreCtx;
use crate::record::{self, Failure, JobRecord, TaskDone};

/// How a slave runs.
#[derive(Clone, Debug)]
pub struct SlaveConfig {
    pub store: String,
    pub token: Option<String>,
    pub name: String,
    /// Exit when no job is running instead of waiting for the next one.
    pub exit_when_idle: bool,
    /// Work only on this job.
    pub job: Option<Uuid>,
    /// How long one blocking dequeue waits on the node.
    pub dequeue_wait: Duration,
}

/// Runs the slave until it is idle (with `exit_when_idle`) or killed.
pub async fn run(config: SlaveConfig) -> Result<(), StoreError> {
    let mut slave = Slave::connect(config).await?;
    loop {
        match slave.work().await {
            Ok(Idle::Exit) => return Ok(()),
            // A new job is seen within this: it is most of a small job's
            // start latency (the model's `job_latency`).
            Ok(Idle::Wait) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(Idle::Again) => {}
            Err(e) if e.needs_reconnect() || !slave.session.is_alive() => {
                tracing::warn!("lost the store node ({e}); reconnecting");
                slave.reconnect().await?;
            }
            Err(e) if e.is_retryable() => tracing::info!("retrying after: {e}"),
            Err(e) => return Err(e),
        }
    }
}

enum Idle {
    Exit,
    /// Nothing to do: look again shortly.
    Wait,
    /// A job just ended: look for the next one at once.
    Again,
}

struct Slave {
    config: SlaveConfig,
    client: Client,
    session: Session,
}

impl Slave {
    async fn connect(config: SlaveConfig) -> Result<Slave, StoreError> {
        let client = Client::connect_retrying(&config.store, config.token.as_deref(), None).await?;
        let session = client.open_session(&config.name).await?;
        tracing::info!(session = session.id(), "slave {} connected to {}", config.name, config.store);
        Ok(Slave { config, client, session })
    }

    async fn reconnect(&mut self) -> Result<(), StoreError> {
        loop {
            match Slave::connect(self.config.clone()).await {
                Ok(s) => {
                    *self = s;
                    return Ok(());
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!("store node not back yet: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs the oldest unfinished job to the end of its last bag.
    async fn work(&mut self) -> Result<Idle, StoreError> {
        let Some(job) = self.next_job().await? else {
            return Ok(if self.config.exit_when_idle { Idle::Exit } else { Idle::Wait });
        };
        let id = job.id();
        tracing::info!(%id, app = job.spec.app_name(), "working on job");
        for (index, bag) in job.bags.iter().enumerate() {
            loop {
                if self.client.peek_small(&record::failed_key(id)).await?.is_some() {
                    return Ok(Idle::Wait);
                }
                let action = self.session.begin().await?;
                match action.dequeue(bag, self.config.dequeue_wait).await {
                    Ok(Dequeue::Empty) => {
                        action.abort().await?;
                        break;
                    }
                    Ok(Dequeue::NoneAvailable) => action.abort().await?,
                    Ok(Dequeue::Task(task)) => self.run_one(&job, index, action, task).await?,
                    Err(e) => {
                        let _ = action.abort().await;
                        return Err(e);
                    }
                }
            }
        }
        self.mark_finished(id).await?;
        Ok(Idle::Again)
    }

    async fn next_job(&self) -> Result<Option<JobRecord>, StoreError> {
        let mut jobs: Vec<JobRecord> = self
            .client
            .scan_small("job/", 0)
            .await?
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
            .filter(|j: &JobRecord| self.config.job.is_none_or(|only| only == j.id()))
            .collect();
        jobs.sort_by_key(|j| j.submitted_ms);
        for job in jobs {
            let id = job.id();
            if self.client.peek_small(&record::finished_key(id)).await?.is_none()
                && self.client.peek_small(&record::failed_key(id)).await?.is_none()
            {
                return Ok(Some(job));
            }
        }
        Ok(None)
    }

    /// One task in one top-level action: compute on a blocking thread (the
    /// session's heartbeats go on meanwhile), record it done, commit.
    async fn run_one(&self, job: &JobRecord, bag_index: usize, action: Action, task: Task) -> Result<(), StoreError> {
        let started = Instant::now();
        let rt = tokio::runtime::Handle::current();
        let (client, spec) = (self.client.clone(), job.spec.clone());
        let (outcome, action, task) = tokio::task::spawn_blocking(move || {
            let mut ctx = StoreCtx { rt, client: &client, action: &action, job: spec.job(), prefetch: Default::default() };
            let tries = task.attempts + task.returns;
            let outcome = run_task(&spec, &task.payload, tries, &mut ctx);
            // Ends any prefetch the task announced but never read, before
            // the action commits or aborts.
            drop(ctx);
            (outcome, action, task)
        })
        .await
        .map_err(|e| StoreError::StoreUnavailable { what: format!("task thread failed: {e}") })?;
        let id = job.id();
        match outcome {
            Ok(outcome) => {
                let key = record::done_key(id, bag_index, task.seq);
                let before = action.read_small(&key, true).await?;
                let count = before.and_then(|v| serde_json::from_slice::<TaskDone>(&v).ok()).map_or(0, |d| d.count);
                let done = TaskDone {
                    count: count + 1,
                    flops: outcome.flops,
                    slave: self.config.name.clone(),
                    attempts: task.attempts,
                    finished_ms: record::now_ms(),
                    compute_ms: started.elapsed().as_millis() as u64,
                };
                action.write_small(&key, &serde_json::to_vec(&done).expect("plain struct")).await?;
                match action.commit().await {
                    Ok(()) => Ok(()),
                    Err(e @ StoreError::ActionAborted { .. }) => {
                        tracing::warn!("task {} of {} not committed: {e}", task.seq, task.bag);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => match e.class() {
                ErrorClass::Retry | ErrorClass::Requeue => {
                    tracing::info!("task {} of {} goes back to the bag: {e}", task.seq, task.bag);
                    let _ = action.abort().await;
                    Ok(())
                }
                ErrorClass::JobFatal => {
                    tracing::error!("job {id} fails: {e}");
                    let failure = Failure {
                        reason: e.to_string(),
                        bag: task.bag.clone(),
                        task: String::from_utf8_lossy(&task.payload).into_owned(),
                        slave: self.config.name.clone(),
                        at_ms: record::now_ms(),
                    };
                    action.abort().await?;
                    // Recorded in an action of its own, so no partial output
                    // of the failed task is ever committed.
                    let a = self.session.begin().await?;
                    a.write_small(&record::failed_key(id), &serde_json::to_vec(&failure).expect("plain struct")).await?;
                    a.commit().await
                }
            },
        }
    }

    async fn mark_finished(&self, id: Uuid) -> Result<(), StoreError> {
        let a = self.session.begin().await?;
        let key = record::finished_key(id);
        if a.read_small(&key, true).await?.is_none() {
            a.write_small(&key, &record::now_ms().to_le_bytes()).await?;
            tracing::info!(%id, "job finished: every bag is empty");
        }
        a.commit().await
    }
}
