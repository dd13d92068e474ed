//! How long the calling thread waited for a core: Linux's per-thread
//! scheduler statistics (`/proc/thread-self/schedstat`: time on a core,
//! time runnable but waiting in a run queue, slices).
//!
//! A task's thread is runnable from its first kernel to its last, so its
//! run-queue wait is the time other threads (the store node's, the
//! slave's own I/O runtime, another slave's) held the cores it could have
//! computed on. The model's processor sharing predicts none of it while
//! their average load fits beside the kernels; a slave records it per task
//! so that `master status` and `bench validate` show what it came to.

use std::time::Duration;

/// One reading of the calling thread's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSched {
    pub on_core: Duration,
    pub waited: Duration,
}

impl ThreadSched {
    /// The calling thread's counters; `None` where the kernel keeps none
    /// (not Linux, or schedstats not built in).
    pub fn now() -> Option<ThreadSched> {
        parse(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
    }

    /// What happened between `earlier` and `self` (zero where a counter
    /// went backwards, which a thread's never do).
    pub fn since(self, earlier: ThreadSched) -> ThreadSched {
        ThreadSched { on_core: self.on_core.saturating_sub(earlier.on_core), waited: self.waited.saturating_sub(earlier.waited) }
    }
}

/// `"<ns on core> <ns waiting> <slices>"`.
fn parse(line: &str) -> Option<ThreadSched> {
    let mut f = line.split_whitespace().map(|v| v.parse::<u64>().ok());
    let on_core = Duration::from_nanos(f.next()??);
    let waited = Duration::from_nanos(f.next()??);
    Some(ThreadSched { on_core, waited })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_line() {
        let s = parse("1500000 250000 12\n").unwrap();
        assert_eq!(s, ThreadSched { on_core: Duration::from_micros(1500), waited: Duration::from_micros(250) });
        assert_eq!(parse("garbage"), None);
        assert_eq!(parse("12"), None);
    }

    #[test]
    fn a_busy_thread_gains_time_on_a_core() {
        let Some(before) = ThreadSched::now() else { return };
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let d = ThreadSched::now().unwrap().since(before);
        assert!(d.on_core >= Duration::from_millis(5), "{d:?}");
        assert!(d.on_core + d.waited <= started.elapsed() + Duration::from_millis(5), "{d:?}");
    }

    #[test]
    fn counts_do_not_go_backwards() {
        let later = ThreadSched { on_core: Duration::from_millis(1), waited: Duration::ZERO };
        let earlier = ThreadSched { on_core: Duration::from_millis(2), waited: Duration::from_millis(1) };
        assert_eq!(later.since(earlier), ThreadSched::default());
    }
}
