//! The computation record of a job and the small objects that track it.
//! The master writes them at submit; slaves read them to know what to do
//! (a slave joining mid-run needs nothing else, `003…` §2.4.2).
//!
//! ```text
//! job/<id>                 JobRecord (JSON), written once at submit
//! jobstate/<id>/failed     Failure (JSON): the first job-fatal task error
//! jobstate/<id>/finished   u64 LE: unix ms when a slave found every bag empty
//! jobstate/<id>/cancelled  Cancelled (JSON): `master cancel` (with a failure
//!                          record, so that slaves stop at their next task)
//! jobs/submitted           u64 LE: jobs ever submitted (idle slaves watch it)
//! tasklog/<id>/<ms>-<slave>-<seq>  TaskFailure (JSON): a run of a task that
//!                          failed and sent it back (`master job log`)
//! done/<id>/<seq in bag>@<bag index>   TaskDone (JSON), one per committed task
//! gang/<id>/…              a gang job's coordination ([`gang`])
//! ```

use apps::job::JobSpec;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub mod gang;

/// What a job is and the bags it runs, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    pub bags: Vec<String>,
    pub n_tasks: Vec<usize>,
    pub submitted_ms: u64,
    /// A data-parallel job: its one bag holds rank tasks that run together
    /// as a BSP group (`gang`). Absent: a bag-of-tasks job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<gang::GangSpec>,
}

impl JobRecord {
    pub fn id(&self) -> Uuid {
        self.spec.job()
    }

    pub fn total_tasks(&self) -> usize {
        self.n_tasks.iter().sum()
    }
}

/// Why a job failed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failure {
    pub reason: String,
    pub bag: String,
    pub task: String,
    pub slave: String,
    pub at_ms: u64,
}

/// A job cancelled by the user (`master cancel`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cancelled {
    pub at_ms: u64,
    /// Whether its output matrices were deleted.
    pub outputs_removed: bool,
}

/// A run of a task that failed and sent the task back to its bag (store
/// trouble, a block put refused): the job goes on, and `master job log`
/// says what happened.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskFailure {
    pub bag: String,
    pub seq: u64,
    pub task: String,
    /// Orphanings of the task before this run.
    pub attempts: u32,
    pub slave: String,
    pub message: String,
    pub at_ms: u64,
}

pub fn task_failure_prefix(job: Uuid) -> String {
    format!("tasklog/{job}/")
}

pub fn task_failure_key(job: Uuid, at_ms: u64, slave: &str, seq: u64) -> String {
    format!("tasklog/{job}/{at_ms:015}-{slave}-{seq}")
}

/// One committed task, written in the task's own action: a task committed
/// twice would show `count: 2`.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct TaskDone {
    pub count: u32,
    pub flops: f64,
    pub slave: String,
    /// Orphanings before this run (0: first try).
    pub attempts: u32,
    pub finished_ms: u64,
    pub compute_ms: u64,
    /// Microseconds the task's thread spent in BLAS/LAPACK kernels (absent
    /// in records of slaves before it was kept).
    #[serde(default)]
    pub kernel_us: u64,
    /// Microseconds the task's thread was runnable but waited for a core
    /// (the slave's `core_wait`).
    #[serde(default)]
    pub core_wait_us: u64,
    /// Microseconds the task's thread waited for its block reads
    /// (prefetched or not).
    #[serde(default)]
    pub block_wait_us: u64,
    /// Microseconds it waited for its small reads (flags, a dag's
    /// dependency counters, whose locks another task's commit may hold).
    #[serde(default)]
    pub small_wait_us: u64,
    /// Microseconds from the slave's begin of the task's action to its
    /// dequeue's answer: the round trips before the task, behind the
    /// previous task's ending, and any wait for the bag (a barrier).
    #[serde(default)]
    pub start_us: u64,
    /// Microseconds the slave waited, once this task was computed, for the
    /// previous task's ending (its puts, record and commit, written
    /// behind) to finish before this task's could start: a slave keeps
    /// one ending in flight.
    #[serde(default)]
    pub settle_us: u64,
    /// Microseconds the task took to reach its compute thread and, done
    /// there, to be taken up again by the slave's runtime: a hand-off
    /// that takes tens of microseconds on an idle slave and up to half a
    /// millisecond in jobs, whose runtime is busy with the previous
    /// ending and the prefetches on cores the store node shares.
    #[serde(default)]
    pub handoff_us: u64,
    /// Microseconds the same slave's previous task of this job took to
    /// end (its puts, record and commit, written behind: from its start
    /// to its commit answered); 0 for a slave's first task of a job. A
    /// record cannot hold its own ending, which ends with the commit that
    /// writes it.
    #[serde(default)]
    pub prev_ending_us: u64,
    /// Block payload bytes the task's reads took from the store node,
    /// from peer slaves and from the slave's own cache (0 without a cache:
    /// then every read is the store's).
    #[serde(default)]
    pub bytes_store: u64,
    #[serde(default)]
    pub bytes_peers: u64,
    #[serde(default)]
    pub bytes_cache: u64,
}

/// A job's block reads by where they came from, summed over its task
/// records (the tasks of slaves with a cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadSources {
    pub store: u64,
    pub peers: u64,
    pub cache: u64,
}

impl ReadSources {
    pub fn of<'a>(done: impl IntoIterator<Item = &'a TaskDone>) -> ReadSources {
        done.into_iter().fold(ReadSources::default(), |t, d| ReadSources {
            store: t.store + d.bytes_store,
            peers: t.peers + d.bytes_peers,
            cache: t.cache + d.bytes_cache,
        })
    }

    pub fn total(&self) -> u64 {
        self.store + self.peers + self.cache
    }
}

/// Where committed tasks' time went, summed over their records, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TaskTimes {
    pub kernels: f64,
    pub core_wait: f64,
    pub block_wait: f64,
    pub small_wait: f64,
    /// Begins and dequeues ([`TaskDone::start_us`]).
    pub start: f64,
    /// Waits for the previous task's ending ([`TaskDone::settle_us`]).
    pub settle: f64,
    /// Hand-offs to the compute thread and back ([`TaskDone::handoff_us`]).
    pub handoff: f64,
    /// Endings recorded ([`TaskDone::prev_ending_us`]), their sum in
    /// seconds and how many there are.
    pub endings: f64,
    pub endings_n: u64,
}

impl TaskTimes {
    /// The mean recorded ending, seconds (0 with none).
    pub fn mean_ending(&self) -> f64 {
        if self.endings_n == 0 {
            0.0
        } else {
            self.endings / self.endings_n as f64
        }
    }

    pub fn of<'a>(done: impl IntoIterator<Item = &'a TaskDone>) -> TaskTimes {
        let s = |us: u64| us as f64 / 1e6;
        done.into_iter().fold(TaskTimes::default(), |t, d| TaskTimes {
            kernels: t.kernels + s(d.kernel_us),
            core_wait: t.core_wait + s(d.core_wait_us),
            block_wait: t.block_wait + s(d.block_wait_us),
            small_wait: t.small_wait + s(d.small_wait_us),
            start: t.start + s(d.start_us),
            settle: t.settle + s(d.settle_us),
            handoff: t.handoff + s(d.handoff_us),
            endings: t.endings + s(d.prev_ending_us),
            endings_n: t.endings_n + u64::from(d.prev_ending_us > 0),
        })
    }
}

/// How many jobs were ever submitted: each submit adds one in the action
/// that writes its record, so an idle slave that sees it change knows a
/// new job is there to scan for (one cheap read, not two scans, per look).
pub const SUBMITTED_KEY: &str = "jobs/submitted";

/// The submit counter's value (absent: none submitted yet).
pub fn submitted_count(value: Option<&[u8]>) -> u64 {
    value.and_then(|v| v.try_into().ok()).map_or(0, u64::from_le_bytes)
}

pub fn job_key(id: Uuid) -> String {
    format!("job/{id}")
}

/// Where a job's end is recorded: `jobstate/<id>/finished` or `/failed`.
pub const JOB_STATE_PREFIX: &str = "jobstate/";

pub fn failed_key(id: Uuid) -> String {
    format!("{JOB_STATE_PREFIX}{id}/failed")
}

pub fn finished_key(id: Uuid) -> String {
    format!("{JOB_STATE_PREFIX}{id}/finished")
}

pub fn cancelled_key(id: Uuid) -> String {
    format!("{JOB_STATE_PREFIX}{id}/cancelled")
}

pub fn done_prefix(id: Uuid) -> String {
    format!("done/{id}/")
}

pub fn done_key(id: Uuid, bag_index: usize, seq: u64) -> String {
    format!("done/{id}/{bag_index:04}/{seq:012}")
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_times_sum_the_records_and_read_old_ones_as_zero() {
        let a = TaskDone {
            kernel_us: 1_500_000,
            core_wait_us: 250_000,
            block_wait_us: 10,
            small_wait_us: 20,
            start_us: 300,
            settle_us: 400,
            handoff_us: 500,
            prev_ending_us: 3000,
            ..TaskDone::default()
        };
        let old: TaskDone =
            serde_json::from_str(r#"{"count":1,"flops":2.0,"slave":"s","attempts":0,"finished_ms":1,"compute_ms":3}"#).unwrap();
        let t = TaskTimes::of([&a, &old, &a]);
        assert_eq!(
            t,
            TaskTimes {
                kernels: 3.0,
                core_wait: 0.5,
                block_wait: 20e-6,
                small_wait: 40e-6,
                start: 600e-6,
                settle: 800e-6,
                handoff: 1000e-6,
                endings: 6000e-6,
                endings_n: 2
            }
        );
        assert!((t.mean_ending() - 3e-3).abs() < 1e-12, "the old record has none: not counted");
    }
}
