//! The stateless slave (DESIGN §6).
//!
//! A slave loops: begin a top-level action, dequeue a task from the current
//! bag of the oldest running job, run it with [`apps::job::run_task`]
//! against the store (read locks on inputs, overwrite locks on outputs),
//! record it done, commit. `Empty` moves on to the next bag; `NoneAvailable`
//! waits in a blocking dequeue. Killed at any instruction, it loses nothing:
//! its action aborts and the task goes back to the bag, first in line.

pub mod compute;
pub mod core_wait;
mod ctx;
pub mod gang;
pub mod kill_point;
mod worker;

// The schema the master writes and slaves follow (`job-record`).
use job_record as record;

pub use worker::{run, start_task, FlagRead, SlaveConfig, Taken};
