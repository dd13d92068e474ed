//! Gang scheduling through the recoverable queue (issue 49): a
//! data-parallel job of `P` ranks is one bag of `P` rank tasks. A slave
//! that dequeues a rank keeps it dequeued in its action for the whole
//! run, publishes its BSP endpoint as a small object (`job_record::gang`),
//! and waits until all `P` ranks are held by live sessions; then the
//! holders form a BSP group (`bsp::Bsp::connect`) and run the job's
//! supersteps ([`matmul`]). After chosen supersteps each rank commits its
//! output and the superstep in a nested top-level action (`003…` §2.4.7),
//! fenced on its holder record: a rank whose task was taken from it (its
//! lease lapsed while it was stopped) has its late commit refused.
//!
//! Failure: a rank that dies makes `sync` fail with `PeerLost` on every
//! survivor; each aborts its action, its rank task goes back to the bag,
//! and the gang re-forms from whichever slaves dequeue the ranks next,
//! resuming from each rank's last committed superstep. A rank that waits
//! longer than the job's `wait_ms` for its gang gives its task back, so no
//! slave is held for a gang that cannot form. `P` never changes: the rank
//! tasks, and the rows of C each owns, are cut at submit.

pub mod matmul;

use std::time::{Duration, Instant};

use apps::block::{Block, MatrixMeta};
use apps::job::JobSpec;
use bsp::{Bsp, BspError, Config, Endpoint};
use store_client::{Action, BlockData, Client, Session, StoreError, Task};

use crate::record::gang::{self as keys, Checkpoint, GangSpec, Holder, Live, RankTask};
use crate::record::{self, JobRecord, TaskDone};
use matmul::{Interval, Progress, RankStore};

/// Why a rank's run in a group ended without its result.
#[derive(Debug, thiserror::Error)]
pub enum GangError {
    /// The group failed (a peer lost, an abort, the group not formed).
    #[error("BSP group: {0}")]
    Bsp(#[from] BspError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// This slave no longer holds the rank (its lease lapsed and another
    /// slave took it), or the rank's checkpoint moved under it.
    #[error("rank {rank} fenced: {why}")]
    Fenced { rank: u32, why: String },
    /// A peer sent something this algorithm does not expect.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The job cannot run as a gang (wrong app, bad task).
    #[error("gang job: {0}")]
    Job(String),
}

/// Fault tests of gang jobs (`slave --gang-fault`, hidden): where a rank
/// this slave runs SIGKILLs or SIGSTOPs itself, the first time it gets
/// there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GangFault {
    /// `kill:N`: SIGKILL right after superstep N's communication (its
    /// `sync` returned), before its compute and commit.
    KillInSuperstep(u32),
    /// `stop:N`: SIGSTOP right before committing superstep N, so that a
    /// resumed process tries its commit late.
    StopBeforeCheckpoint(u32),
}

impl std::str::FromStr for GangFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (what, n) = s.split_once(':').ok_or_else(|| format!("{s:?}: expected kill:N or stop:N"))?;
        let n: u32 = n.parse().map_err(|_| format!("{n:?} is not a superstep"))?;
        match what {
            "kill" => Ok(GangFault::KillInSuperstep(n)),
            "stop" => Ok(GangFault::StopBeforeCheckpoint(n)),
            _ => Err(format!("{what:?}: expected kill or stop")),
        }
    }
}

/// How a rank task ended for the slave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RankEnd {
    /// Its part is committed and the rank task with it.
    Done,
    /// Given back to the bag (the gang did not form in time, or failed).
    GaveBack,
}

/// What a rank needs of its slave.
pub(crate) struct RankCtx<'a> {
    pub client: &'a Client,
    pub session: &'a Session,
    pub slave: &'a str,
    /// The store's address: the BSP endpoint listens on the interface
    /// that routes to it.
    pub store: &'a str,
    pub token: Option<&'a str>,
    /// Fault tests.
    pub fault: Option<GangFault>,
}

/// How long one group's setup may take once every rank is held.
const SETUP: Duration = Duration::from_secs(10);
/// How often a waiting rank looks at the holders.
const LOOK: Duration = Duration::from_millis(50);

/// Runs the rank task `task` of gang job `job`, dequeued in `action`.
pub(crate) async fn run_rank(
    ctx: &RankCtx<'_>,
    job: &JobRecord,
    gang: &GangSpec,
    action: Action,
    task: Task,
) -> Result<RankEnd, StoreError> {
    let id = job.id();
    let rank = match serde_json::from_slice::<RankTask>(&task.payload) {
        Ok(t) if t.rank < gang.ranks => t.rank,
        _ => {
            action.abort().await?;
            return Err(StoreError::InvalidArgument { what: format!("bad rank task {:?}", String::from_utf8_lossy(&task.payload)) });
        }
    };
    let started = Instant::now();
    let nonce = uuid::Uuid::new_v4().as_u64_pair().0;
    let ip = crate::worker::own_ip(ctx.store).await.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    let ep = match Endpoint::bind((ip, 0)) {
        Ok(ep) => ep,
        Err(e) => {
            tracing::warn!(rank, "no BSP endpoint: {e}");
            action.abort().await?;
            return Ok(RankEnd::GaveBack);
        }
    };
    let me = Holder {
        nonce,
        addr: ep.local_addr().to_string(),
        session: ctx.session.id(),
        slave: ctx.slave.to_owned(),
        since_ms: record::now_ms(),
    };
    if let Err(e) = publish(ctx.session, id, rank, &me).await {
        action.abort().await?;
        return Err(e);
    }
    tracing::info!(%id, rank, addr = %me.addr, "holding rank, waiting for the gang");
    let hosts = match wait_for_gang(ctx, id, gang, Duration::from_millis(gang.wait_ms)).await {
        Ok(Some(h)) => h,
        Ok(None) => {
            tracing::info!(%id, rank, "gang did not form in time: rank goes back");
            give_back(ctx.session, id, rank, nonce, action).await?;
            return Ok(RankEnd::GaveBack);
        }
        Err(e) => {
            give_back(ctx.session, id, rank, nonce, action).await?;
            return Err(e);
        }
    };
    let token = group_token(ctx.token, id, &hosts);
    let addrs: Vec<String> = hosts.iter().map(|h| h.addr.clone()).collect();
    let outcome = run_group(ctx, job, rank, nonce, ep, addrs, token).await;
    match outcome {
        Ok(report) => {
            let key = record::done_key(id, 0, task.seq);
            let finish = async {
                let before = action.read_small(&key, true).await?;
                let count = before.and_then(|v| serde_json::from_slice::<TaskDone>(&v).ok()).map_or(0, |d| d.count) + 1;
                let done = TaskDone {
                    count,
                    flops: report.flops,
                    slave: ctx.slave.to_owned(),
                    attempts: task.attempts,
                    finished_ms: record::now_ms(),
                    compute_ms: started.elapsed().as_millis() as u64,
                    bytes_store: report.read,
                    ..TaskDone::default()
                };
                action.write_small(&key, &serde_json::to_vec(&done).expect("plain struct")).await?;
                action.delete_small(&keys::holder_key(id, rank)).await?;
                action.commit().await
            };
            match finish.await {
                Ok(()) => {
                    tracing::info!(%id, rank, checkpoints = ?report.checkpoints, start = report.start, "rank done");
                    Ok(RankEnd::Done)
                }
                Err(e @ StoreError::ActionAborted { .. }) => {
                    tracing::warn!(%id, rank, "rank's end not committed: {e}");
                    Ok(RankEnd::GaveBack)
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => {
            tracing::warn!(%id, rank, "gang fails, rank goes back: {e}");
            give_back(ctx.session, id, rank, nonce, action).await?;
            match e {
                GangError::Store(e) if !e.is_retryable() && !matches!(e, StoreError::ActionAborted { .. }) => Err(e),
                _ => Ok(RankEnd::GaveBack),
            }
        }
    }
}

/// Writes the holder record of `rank`, in a top-level action of its own.
async fn publish(session: &Session, job: uuid::Uuid, rank: u32, me: &Holder) -> Result<(), StoreError> {
    let a = session.begin().await?;
    let r = async {
        a.write_small(&keys::holder_key(job, rank), &serde_json::to_vec(me).expect("plain struct")).await?;
        Ok(())
    }
    .await;
    match r {
        Ok(()) => a.commit().await,
        Err(e) => {
            let _ = a.abort().await;
            Err(e)
        }
    }
}

/// Removes this holding's record (if still ours) and aborts the rank's
/// action: the rank task goes back to the bag, first in line.
async fn give_back(session: &Session, job: uuid::Uuid, rank: u32, nonce: u64, action: Action) -> Result<(), StoreError> {
    let _ = action.abort().await;
    let cleared = async {
        let a = session.begin().await?;
        let key = keys::holder_key(job, rank);
        let ours =
            a.read_small(&key, true).await?.and_then(|v| serde_json::from_slice::<Holder>(&v).ok()).is_some_and(|h| h.nonce == nonce);
        if ours {
            a.delete_small(&key).await?;
        }
        a.commit().await
    };
    if let Err(e) = cleared.await {
        // A record left behind names a session that is gone or a nonce
        // the next holder replaces: waiting ranks skip it.
        tracing::debug!("holder record not removed: {e}");
    }
    Ok(())
}

/// The gang's holders by rank once all `P` ranks are held by live
/// sessions; `None` after `wait`.
async fn wait_for_gang(ctx: &RankCtx<'_>, job: uuid::Uuid, gang: &GangSpec, wait: Duration) -> Result<Option<Vec<Holder>>, StoreError> {
    let started = Instant::now();
    loop {
        if let Some(h) = live_holders(ctx.client, job, gang.ranks).await?.into_iter().collect::<Option<Vec<Holder>>>() {
            return Ok(Some(h));
        }
        if started.elapsed() >= wait || !ctx.session.is_alive() {
            return Ok(None);
        }
        tokio::time::sleep(LOOK).await;
    }
}

/// Each rank's holder record whose session is alive (`None`: not held).
pub async fn live_holders(client: &Client, job: uuid::Uuid, ranks: u32) -> Result<Vec<Option<Holder>>, StoreError> {
    let alive: std::collections::HashSet<u64> = client.list_sessions().await?.into_iter().map(|s| s.session).collect();
    let mut by_rank: Vec<Option<Holder>> = vec![None; ranks as usize];
    for (k, v) in client.scan_small(&keys::holder_prefix(job), 0).await? {
        let (Some(r), Ok(h)) = (keys::rank_of_key(&k), serde_json::from_slice::<Holder>(&v)) else { continue };
        if let Some(slot) = by_rank.get_mut(r as usize) {
            if alive.contains(&h.session) {
                *slot = Some(h);
            }
        }
    }
    Ok(by_rank)
}

/// The group's token: the cluster's, bound to this job and to exactly
/// this set of holders. A process with another view of the gang (a stale
/// holder, a rank that re-published meanwhile) fails the hello and the
/// group does not form with it.
fn group_token(cluster: Option<&str>, job: uuid::Uuid, hosts: &[Holder]) -> Vec<u8> {
    let mut view = format!("{job}");
    for h in hosts {
        view.push_str(&format!("|{}@{}", h.nonce, h.addr));
    }
    let digest = block_checksum::xxh3_64(view.as_bytes());
    format!("{}:gang:{job}:{digest:016x}", cluster.unwrap_or("ftbag-gang")).into_bytes()
}

/// Forms the group and runs the job's supersteps on a thread of their
/// own (the BSP transport blocks), the store reached through this
/// runtime.
async fn run_group(
    ctx: &RankCtx<'_>,
    job: &JobRecord,
    rank: u32,
    nonce: u64,
    ep: Endpoint,
    hosts: Vec<String>,
    token: Vec<u8>,
) -> Result<matmul::RankReport, GangError> {
    let JobSpec::Matmul { a, b, c, .. } = &job.spec else {
        return Err(GangError::Job(format!("{} has no data-parallel engine", job.spec.app_name())));
    };
    let gang = job.gang.clone().ok_or_else(|| GangError::Job("not a gang job".into()))?;
    let id = job.id();
    let committed: Checkpoint =
        ctx.client.peek_small(&keys::step_key(id, rank)).await?.and_then(|v| serde_json::from_slice(&v).ok()).unwrap_or_default();
    let mut store = StoreRank {
        rt: tokio::runtime::Handle::current(),
        client: ctx.client.clone(),
        session: ctx.session.clone(),
        job: id,
        rank,
        nonce,
        c: c.clone(),
        expected: committed.clone(),
        formation: 0,
        fault: ctx.fault,
    };
    let (a, b, c) = (a.clone(), b.clone(), c.clone());
    let interval = if gang.checkpoint_every > 0 { Interval::Every(gang.checkpoint_every) } else { Interval::Model { mtbf_s: gang.mtbf_s } };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("rank-{rank}"))
        .spawn(move || {
            let run = || -> Result<matmul::RankReport, GangError> {
                let mut cfg = Config::new(token);
                cfg.setup_timeout = SETUP;
                cfg.apply_env()?;
                let mut bsp = Bsp::connect(ep, &hosts, rank as usize, cfg)?;
                tracing::info!(%id, rank, p = hosts.len(), "gang formed");
                if rank == 0 {
                    store.formation = store.bump_formations()?;
                }
                let r = matmul::run(&mut bsp, &mut store, (&a, &b, &c), committed.step, interval);
                if let Err(e) = &r {
                    // Tell the others at once rather than letting them find
                    // out at their next sync's timeout.
                    if !matches!(e, GangError::Bsp(_)) {
                        let _ = bsp.abort(&e.to_string());
                    }
                }
                bsp.end();
                r
            };
            let _ = tx.send(run());
        })
        .map_err(|e| GangError::Job(format!("starting the rank's thread: {e}")))?;
    rx.await.map_err(|_| GangError::Job("the rank's thread panicked".into()))?
}

/// [`RankStore`] over the store node, from the rank's own thread.
struct StoreRank {
    rt: tokio::runtime::Handle,
    client: Client,
    session: Session,
    job: uuid::Uuid,
    rank: u32,
    nonce: u64,
    c: MatrixMeta,
    /// The rank's checkpoint as this holder last saw or wrote it: a commit
    /// that finds another is refused (a stale holder committed meanwhile).
    expected: Checkpoint,
    formation: u64,
    fault: Option<GangFault>,
}

impl StoreRank {
    fn bump_formations(&self) -> Result<u64, GangError> {
        let key = keys::formations_key(self.job);
        self.rt.block_on(async {
            let a = self.session.begin().await?;
            let n = keys::counter(a.read_small(&key, true).await?.as_deref()) + 1;
            a.write_small(&key, &n.to_le_bytes()).await?;
            a.commit().await?;
            Ok(n)
        })
    }

    async fn commit_checkpoint(&self, a: &Action, step: u32, blocks: &[((u32, u32), &Block)]) -> Result<Checkpoint, GangError> {
        let fenced = |why: String| GangError::Fenced { rank: self.rank, why };
        let holder: Option<Holder> =
            a.read_small(&keys::holder_key(self.job, self.rank), false).await?.and_then(|v| serde_json::from_slice(&v).ok());
        if holder.as_ref().map(|h| h.nonce) != Some(self.nonce) {
            return Err(fenced(format!("another slave holds the rank ({:?})", holder.map(|h| h.slave))));
        }
        let step_key = keys::step_key(self.job, self.rank);
        let now: Checkpoint = a.read_small(&step_key, true).await?.and_then(|v| serde_json::from_slice(&v).ok()).unwrap_or_default();
        if now != self.expected || now.step >= step {
            return Err(fenced(format!("checkpoint moved: {} committed, this holder expected {}", now.step, self.expected.step)));
        }
        // The puts go over the data plane together, a few at a time (each
        // holds its block's copy in flight).
        for chunk in blocks.chunks(8) {
            let puts: Vec<_> = chunk
                .iter()
                .map(|((i, j), blk)| {
                    let (writer, m) = (a.block_writer(), self.c.id.0);
                    let data = BlockData { rows: blk.rows, cols: blk.cols, data: blk.data.clone() };
                    let (i, j) = (*i, *j);
                    tokio::spawn(async move { writer.put_block(m, i, j, data).await })
                })
                .collect();
            for p in puts {
                p.await.map_err(|e| GangError::Job(format!("a block put's task failed: {e}")))??;
            }
        }
        let count_key = keys::ckpt_key(self.job, self.rank, step);
        let count = keys::counter(a.read_small(&count_key, true).await?.as_deref()) as u32 + 1;
        a.write_small(&count_key, &u64::from(count).to_le_bytes()).await?;
        let next = Checkpoint { step, nonce: self.nonce, formation: self.formation, at_ms: record::now_ms() };
        a.write_small(&step_key, &serde_json::to_vec(&next).expect("plain struct")).await?;
        Ok(next)
    }
}

impl RankStore for StoreRank {
    fn read_input(&mut self, m: &MatrixMeta, i: u32, j: u32) -> Result<Block, GangError> {
        let b = self.rt.block_on(self.client.read_block_committed(m.id.0, i, j))?;
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn read_output(&mut self, c: &MatrixMeta, i: u32, j: u32) -> Result<Block, GangError> {
        self.read_input(c, i, j)
    }

    fn checkpoint(&mut self, step: u32, blocks: &[((u32, u32), &Block)]) -> Result<(), GangError> {
        if self.fault == Some(GangFault::StopBeforeCheckpoint(step)) {
            self.fault = None;
            tracing::warn!(rank = self.rank, step, "fault point: SIGSTOP before the checkpoint");
            // SAFETY: raise has no preconditions.
            unsafe {
                libc::raise(libc::SIGSTOP);
            }
            tracing::warn!(rank = self.rank, step, "resumed: committing the checkpoint late");
        }
        let rt = self.rt.clone();
        let next = rt.block_on(async {
            let a = self.session.begin().await?;
            match self.commit_checkpoint(&a, step, blocks).await {
                Ok(next) => {
                    a.commit().await?;
                    Ok(next)
                }
                Err(e) => {
                    let _ = a.abort().await;
                    Err(e)
                }
            }
        });
        match next {
            Ok(next) => {
                tracing::info!(job = %self.job, rank = self.rank, step, "checkpoint committed");
                self.expected = next;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(job = %self.job, rank = self.rank, step, "checkpoint refused: {e}");
                Err(e)
            }
        }
    }

    fn progress(&mut self, p: &Progress) {
        let live = Live {
            formation: self.formation,
            superstep: p.superstep,
            supersteps: p.supersteps,
            interval: p.interval,
            step_s: p.step_s,
            at_ms: record::now_ms(),
        };
        let (session, key) = (self.session.clone(), keys::live_key(self.job));
        // Best effort, behind the supersteps: `master status` reads it.
        self.rt.spawn(async move {
            let w = async {
                let a = session.begin().await?;
                a.write_small(&key, &serde_json::to_vec(&live).expect("plain struct")).await?;
                a.commit().await
            };
            if let Err(e) = w.await {
                tracing::debug!("gang progress not written: {e}");
            }
        });
    }

    fn reached(&mut self, k: u32) {
        if self.fault == Some(GangFault::KillInSuperstep(k)) {
            tracing::warn!(rank = self.rank, superstep = k, "kill point: SIGKILL in the superstep");
            // SAFETY: raise has no preconditions.
            unsafe {
                libc::raise(libc::SIGKILL);
            }
        }
    }
}
