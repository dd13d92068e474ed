//! Data-parallel (gang) jobs from the CLI: `master submit matmul … --engine
//! bsp --ranks P` and what `master status` shows of a gang (`slave::gang`
//! runs them; `job_record::gang` is the schema).

use anyhow::{bail, Context};
use apps::job::{JobSpec, PlannedBag};
use job_record::gang::{self as keys, Checkpoint, GangSpec, Live, RankTask};
use job_record::JobRecord;
use store_client::Client;

use crate::out::outln;

/// `master submit matmul --engine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum Engine {
    /// A bag of tasks, one per block of C: any number of slaves, each
    /// reading its blocks from the store.
    #[default]
    Bag,
    /// Data-parallel over the BSP transport: P ranks gang-scheduled from
    /// the bag, block rows of C per rank, B's blocks read once per
    /// superstep and broadcast rank to rank, checkpointed in the store.
    Bsp,
}

/// The data-parallel engine's flags of `master submit matmul`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct GangArgs {
    /// Which engine runs the multiply.
    #[arg(long, value_enum, default_value_t = Engine::Bag)]
    pub(crate) engine: Engine,
    /// --engine bsp: ranks (P), one slave each. P is fixed for the job:
    /// after a failure the gang re-forms with P ranks from whichever
    /// slaves are alive, and waits while fewer than P are.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) ranks: u32,
    /// --engine bsp: supersteps between checkpoints (0: chosen by the
    /// model from the measured superstep and write times and --mtbf-s).
    #[arg(long, default_value_t = 0)]
    pub(crate) checkpoint_every: u32,
    /// --engine bsp: mean seconds between rank failures the checkpoint
    /// interval is chosen for.
    #[arg(long, default_value_t = 3600.0)]
    pub(crate) mtbf_s: f64,
    /// --engine bsp: milliseconds a rank waits for the rest of its gang
    /// before it gives its rank back (and takes other work).
    #[arg(long, default_value_t = 5000)]
    pub(crate) gang_wait_ms: u64,
}

impl GangArgs {
    /// The gang of a submit with these flags (`None`: the bag of tasks).
    pub(crate) fn spec(&self) -> anyhow::Result<Option<GangSpec>> {
        match self.engine {
            Engine::Bag => Ok(None),
            Engine::Bsp => {
                if self.mtbf_s.is_nan() || self.mtbf_s <= 0.0 {
                    bail!("--mtbf-s must be positive");
                }
                Ok(Some(GangSpec {
                    ranks: self.ranks,
                    checkpoint_every: self.checkpoint_every,
                    mtbf_s: self.mtbf_s,
                    wait_ms: self.gang_wait_ms,
                }))
            }
        }
    }
}

/// A gang job's one bag: `P` rank tasks.
pub(crate) fn rank_bag(spec: &JobSpec, gang: &GangSpec) -> anyhow::Result<PlannedBag> {
    if !matches!(spec, JobSpec::Matmul { .. }) {
        bail!("--engine bsp runs matmul only");
    }
    let tasks = (0..gang.ranks).map(|rank| serde_json::to_vec(&RankTask { rank }).expect("plain struct")).collect();
    Ok(PlannedBag { name: format!("{}/ranks", spec.job()), tasks, inputs: Vec::new() })
}

/// What the store says about a gang job now.
pub(crate) struct GangView {
    pub(crate) ranks: u32,
    /// Ranks held by live slaves.
    pub(crate) held: u32,
    pub(crate) formations: u64,
    pub(crate) live: Option<Live>,
    /// Each rank's committed supersteps.
    pub(crate) committed: Vec<u32>,
    /// Superstep commits made more than once (must be zero).
    pub(crate) double_commits: u64,
    pub(crate) last_checkpoint_ms: Option<u64>,
}

impl GangView {
    /// The gang's state in a few words.
    pub(crate) fn state(&self, ended: bool) -> String {
        let least = self.committed.iter().copied().min().unwrap_or(0);
        let steps = self.live.as_ref().map_or(0, |l| l.supersteps);
        if ended {
            "ended".into()
        } else if steps > 0 && least >= steps {
            "committing its ranks".into()
        } else if self.held < self.ranks {
            format!("waiting for slaves: {} of {} ranks held", self.held, self.ranks)
        } else {
            "running".into()
        }
    }
}

pub(crate) async fn view(client: &Client, record: &JobRecord) -> anyhow::Result<Option<GangView>> {
    let Some(gang) = &record.gang else { return Ok(None) };
    let id = record.id();
    // Held: a holder record whose session is alive (a slave that died
    // holding a rank leaves its record; the next holder replaces it).
    let alive: std::collections::HashSet<u64> = client.list_sessions().await?.into_iter().map(|s| s.session).collect();
    let held = client
        .scan_small(&keys::holder_prefix(id), 0)
        .await?
        .iter()
        .filter_map(|(_, v)| serde_json::from_slice::<keys::Holder>(v).ok())
        .filter(|h| alive.contains(&h.session))
        .count() as u32;
    let formations = keys::counter(client.peek_small(&keys::formations_key(id)).await?.as_deref());
    let live =
        client.peek_small(&keys::live_key(id)).await?.map(|v| serde_json::from_slice(&v)).transpose().context("unreadable gang record")?;
    let mut committed = vec![0; gang.ranks as usize];
    let mut last = None;
    for (k, v) in client.scan_small(&keys::step_prefix(id), 0).await? {
        let c: Checkpoint = serde_json::from_slice(&v).context("unreadable checkpoint record")?;
        if let Some(slot) = keys::rank_of_key(&k).and_then(|r| committed.get_mut(r as usize)) {
            *slot = c.step;
            last = last.max(Some(c.at_ms));
        }
    }
    let double_commits =
        client.scan_small(&keys::ckpt_prefix(id), 0).await?.iter().filter(|(_, v)| keys::counter(Some(v)) != 1).count() as u64;
    Ok(Some(GangView { ranks: gang.ranks, held, formations, live, committed, double_commits, last_checkpoint_ms: last }))
}

/// The gang's lines under `master status`.
pub(crate) fn print(v: &GangView, ended: bool) {
    let least = v.committed.iter().copied().min().unwrap_or(0);
    let (step, steps, interval) = v.live.as_ref().map_or((0, 0, 0), |l| (l.superstep, l.supersteps, l.interval));
    outln!("  gang: {} ranks, {}; formations {} (re-formations {})", v.ranks, v.state(ended), v.formations, v.formations.saturating_sub(1));
    let ago =
        v.last_checkpoint_ms.map_or("none".to_string(), |ms| format!("{:.1} s ago", job_record::now_ms().saturating_sub(ms) as f64 / 1e3));
    outln!(
        "  superstep {step}/{steps}, checkpoint every {interval}; last checkpoint {ago}, every rank committed {least} (by rank {:?}){}",
        v.committed,
        if v.double_commits > 0 { format!("; {} superstep(s) committed twice", v.double_commits) } else { String::new() }
    );
}

pub(crate) fn json(v: &GangView, ended: bool) -> serde_json::Value {
    serde_json::json!({
        "ranks": v.ranks,
        "state": v.state(ended),
        "held": v.held,
        "formations": v.formations,
        "reformations": v.formations.saturating_sub(1),
        "superstep": v.live.as_ref().map(|l| l.superstep),
        "supersteps": v.live.as_ref().map(|l| l.supersteps),
        "interval": v.live.as_ref().map(|l| l.interval),
        "step_s": v.live.as_ref().map(|l| l.step_s),
        "committed": v.committed,
        "double_commits": v.double_commits,
        "last_checkpoint_ms": v.last_checkpoint_ms,
    })
}
