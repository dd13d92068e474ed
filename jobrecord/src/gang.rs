//! Gang-scheduled (data-parallel) jobs: a job of `P` ranks is one bag of
//! `P` rank tasks; the slaves that hold all of them form a BSP group.
//! The small objects that coordinate a gang, all under `gang/<job>/`:
//!
//! ```text
//! gang/<id>/rank/<r>         Holder (JSON): who holds rank r now, its BSP
//!                            endpoint and a random nonce. Written when a
//!                            slave dequeues the rank; removed when it gives
//!                            the rank back. Checkpoints are fenced on it.
//! gang/<id>/step/<r>         Checkpoint (JSON): supersteps of rank r whose
//!                            output is committed (its C blocks hold them)
//! gang/<id>/ckpt/<r>/<step>  u32 LE: how many times rank r committed that
//!                            superstep (must stay 1)
//! gang/<id>/formations       u64 LE: groups formed so far (first included)
//! gang/<id>/live             Live (JSON): the group's superstep now, best
//!                            effort, for `master status`
//! ```

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How a gang job runs, in its [`crate::JobRecord`]. `ranks` is fixed for
/// the job's life: a gang re-forms with the same `P` (the rank tasks and
/// the data they own are cut at submit), from whichever slaves are alive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GangSpec {
    /// Ranks (`P`): rank tasks in the job's one bag.
    pub ranks: u32,
    /// Supersteps between checkpoints; 0 lets each formed group choose from
    /// the model (Young's interval from its measured superstep and write
    /// times and `mtbf_s`).
    pub checkpoint_every: u32,
    /// Mean time between rank failures the interval is chosen for, seconds.
    pub mtbf_s: f64,
    /// How long a rank waits for the rest of its gang before it gives its
    /// rank task back, milliseconds.
    pub wait_ms: u64,
}

/// A rank task's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTask {
    pub rank: u32,
}

/// Who holds a rank, and where its BSP endpoint listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Random per holding: a stale holder's commits are refused by it.
    pub nonce: u64,
    /// `host:port` of its BSP endpoint.
    pub addr: String,
    /// Its store session (alive while it holds the rank).
    pub session: u64,
    pub slave: String,
    pub since_ms: u64,
}

/// A rank's committed progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Supersteps whose output is in the store (0: none).
    pub step: u32,
    /// The nonce of the holder that committed it.
    pub nonce: u64,
    /// Which formation committed it (1-based).
    pub formation: u64,
    pub at_ms: u64,
}

/// The running group, as rank 0 last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Live {
    pub formation: u64,
    /// The superstep being computed.
    pub superstep: u32,
    pub supersteps: u32,
    /// The checkpoint interval the group chose.
    pub interval: u32,
    /// Wall seconds per superstep, the mean so far in this formation.
    pub step_s: f64,
    pub at_ms: u64,
}

pub fn prefix(job: Uuid) -> String {
    format!("gang/{job}/")
}

pub fn holder_prefix(job: Uuid) -> String {
    format!("gang/{job}/rank/")
}

pub fn holder_key(job: Uuid, rank: u32) -> String {
    format!("gang/{job}/rank/{rank:05}")
}

pub fn step_prefix(job: Uuid) -> String {
    format!("gang/{job}/step/")
}

pub fn step_key(job: Uuid, rank: u32) -> String {
    format!("gang/{job}/step/{rank:05}")
}

pub fn ckpt_prefix(job: Uuid) -> String {
    format!("gang/{job}/ckpt/")
}

pub fn ckpt_key(job: Uuid, rank: u32, step: u32) -> String {
    format!("gang/{job}/ckpt/{rank:05}/{step:08}")
}

pub fn formations_key(job: Uuid) -> String {
    format!("gang/{job}/formations")
}

pub fn live_key(job: Uuid) -> String {
    format!("gang/{job}/live")
}

/// The rank of a holder key (`…/rank/<r>`).
pub fn rank_of_key(key: &str) -> Option<u32> {
    key.rsplit('/').next()?.parse().ok()
}

/// A little-endian u64 counter's value (absent or short: 0).
pub fn counter(value: Option<&[u8]>) -> u64 {
    value.and_then(|v| v.get(..8)).and_then(|v| v.try_into().ok()).map_or(0, u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_rank_and_parse_back() {
        let job = Uuid::nil();
        let keys: Vec<String> = [10, 2, 1].iter().map(|r| holder_key(job, *r)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted.iter().map(|k| rank_of_key(k).unwrap()).collect::<Vec<_>>(), vec![1, 2, 10]);
        assert!(holder_key(job, 3).starts_with(&holder_prefix(job)));
        assert!(ckpt_key(job, 3, 7).starts_with(&ckpt_prefix(job)));
        assert_eq!(counter(Some(&5u64.to_le_bytes())), 5);
        assert_eq!(counter(None), 0);
    }
}
