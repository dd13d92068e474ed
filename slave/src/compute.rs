//! The thread a slave's tasks compute on, and its scheduling class.
//!
//! A task's kernels keep a core busy for milliseconds while the slave's
//! I/O runtime and the store node need that core for short bursts: the
//! previous task's ending (puts, record, commit), prefetches, heartbeats.
//! On an ordinary thread a burst gets the core within microseconds (14 µs
//! at the median with both vCPUs of the test VM computing) but then shares
//! it with the kernel: a dag Cholesky's endings took about twice as long
//! in jobs as alone (`bench/VALIDATION.md`).
//!
//! `slave --compute idle` runs the kernels as `SCHED_IDLE`: they give way
//! at once to any other thread that wakes, the owner's programs on a
//! shared workstation included. Measured on that VM, old and new slaves
//! alternating against one node, n = 4096 (`PERFORMANCE.md`): the dag
//! Cholesky's endings at b = 256 went from 1.3–2.2 ms to 0.7–1.2 ms and
//! its jobs and the dag LU's got 3–10 % faster; but a multiply at b = 256
//! with two slaves got 6 % slower and a one-slave Cholesky at b = 512 5 %
//! slower (the scheduler balances `SCHED_IDLE` threads by a weight of 3
//! against the node's 1024), and in two `bench validate` grids run back to
//! back no job was faster with `idle`. So `normal` is the default, and
//! `idle` is for slaves that must not disturb a workstation's owner.
//!
//! One thread for the slave's lifetime, not the blocking pool's: a thread
//! cannot leave `SCHED_IDLE` again without privilege, and the pool runs
//! other blocking work too.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;

/// How a slave's compute thread is scheduled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputePriority {
    /// The kernels share the cores as ordinary threads.
    #[default]
    Normal,
    /// `SCHED_IDLE`: the kernels run on whatever the node, the slave's own
    /// I/O and every other program leave of the core.
    Idle,
}

type Job = Box<dyn FnOnce() + Send>;

/// The slave's compute thread: runs one closure at a time, in order.
pub struct ComputeThread {
    jobs: mpsc::Sender<Job>,
}

/// The compute thread ended the closure without an answer: it panicked.
#[derive(Debug, thiserror::Error)]
#[error("the task's computation panicked")]
pub struct ComputePanicked;

impl ComputeThread {
    /// Starts the thread, inside `runtime`'s context as the blocking
    /// pool's threads are (a task may drop or spawn runtime tasks). Where
    /// the kernel refuses the class (not Linux), the thread stays ordinary
    /// and says so in the log.
    pub fn start(priority: ComputePriority, runtime: tokio::runtime::Handle) -> std::io::Result<ComputeThread> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new().name("compute".into()).spawn(move || {
            let _in_runtime = runtime.enter();
            if priority == ComputePriority::Idle {
                if let Err(e) = set_idle() {
                    tracing::warn!("compute thread stays an ordinary thread: SCHED_IDLE refused ({e})");
                }
            }
            // Ends when the slave drops its sender.
            for job in queue {
                // A panic drops the job's answer channel, which is how its
                // caller hears of it; the thread goes on with the next.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
            }
        })?;
        Ok(ComputeThread { jobs })
    }

    /// Runs `f` on the compute thread and waits for its answer without
    /// holding the async worker.
    pub async fn run<R, F>(&self, f: F) -> Result<R, ComputePanicked>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = answer.send(f());
        });
        // The thread lives as long as `self` does: a send fails only after
        // it died, which `catch_unwind` prevents.
        self.jobs.send(job).map_err(|_| ComputePanicked)?;
        answered.await.map_err(|_| ComputePanicked)
    }
}

fn set_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system call on the calling thread (pid 0) with a valid
    // parameter; changing to SCHED_IDLE needs no privilege.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy.
    fn current_policy() -> i32 {
        // SAFETY: reads the calling thread's own policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[tokio::test]
    async fn closures_run_in_order_on_one_thread_of_the_chosen_class() {
        let idle = ComputeThread::start(ComputePriority::Idle, tokio::runtime::Handle::current()).unwrap();
        let (a, pa) = idle.run(|| (std::thread::current().id(), current_policy())).await.unwrap();
        let (b, pb) = idle.run(|| (std::thread::current().id(), current_policy())).await.unwrap();
        assert_eq!(a, b, "one thread for every task");
        assert_ne!(a, std::thread::current().id());
        assert_eq!((pa, pb), (libc::SCHED_IDLE, libc::SCHED_IDLE));
        assert!(idle.run(|| tokio::runtime::Handle::try_current().is_ok()).await.unwrap(), "in the runtime's context");

        let normal = ComputeThread::start(ComputePriority::Normal, tokio::runtime::Handle::current()).unwrap();
        assert_eq!(normal.run(current_policy).await.unwrap(), libc::SCHED_OTHER);
    }

    #[tokio::test]
    async fn a_panic_is_an_error_and_the_thread_goes_on() {
        let t = ComputeThread::start(ComputePriority::Normal, tokio::runtime::Handle::current()).unwrap();
        assert!(t.run(|| -> u32 { panic!("kernel bug") }).await.is_err());
        assert_eq!(t.run(|| 7).await.unwrap(), 7);
    }
}
