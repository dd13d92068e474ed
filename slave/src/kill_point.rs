//! Kill points for crash tests: the slave SIGKILLs itself at a named place
//! of its n-th task. A test that kills from outside when the count of
//! committed tasks crosses a threshold lands fewer kills the more loaded
//! the machine is (fresh slaves ran three or four tasks before the test's
//! next look, and short jobs ended before ten kills); a kill point lands
//! inside a task whatever the timing.

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::signal::Signal;

/// Where in a task the slave dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillPlace {
    /// The task is dequeued; nothing computed.
    Dequeued,
    /// The task computed; its block puts may be in flight, nothing is
    /// recorded.
    Computed,
    /// The block puts and the task record are written; the commit is not
    /// sent.
    BeforeCommit,
}

impl KillPlace {
    pub const ALL: [KillPlace; 3] = [KillPlace::Dequeued, KillPlace::Computed, KillPlace::BeforeCommit];

    pub fn name(self) -> &'static str {
        match self {
            KillPlace::Dequeued => "dequeued",
            KillPlace::Computed => "computed",
            KillPlace::BeforeCommit => "before-commit",
        }
    }
}

/// `PLACE:N`: die at `PLACE` of the n-th task that reaches it (from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillPoint {
    pub place: KillPlace,
    pub task: u32,
}

#[derive(Debug, thiserror::Error)]
#[error("kill point {given:?}: want PLACE:N with PLACE one of dequeued, computed, before-commit and N ≥ 1")]
pub struct BadKillPoint {
    given: String,
}

impl FromStr for KillPoint {
    type Err = BadKillPoint;

    fn from_str(s: &str) -> Result<Self, BadKillPoint> {
        let bad = || BadKillPoint { given: s.to_owned() };
        let (place, n) = s.split_once(':').ok_or_else(bad)?;
        let place = KillPlace::ALL.into_iter().find(|p| p.name() == place).ok_or_else(bad)?;
        let task = n.parse().ok().filter(|&n| n >= 1).ok_or_else(bad)?;
        Ok(KillPoint { place, task })
    }
}

impl std::fmt::Display for KillPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.place.name(), self.task)
    }
}

/// A slave's kill and stop points, each with how many tasks reached its
/// place so far.
#[derive(Debug, Default)]
pub(crate) struct KillSwitch {
    armed: Vec<Armed>,
}

#[derive(Debug)]
struct Armed {
    point: KillPoint,
    signal: Signal,
    reached: AtomicU32,
}

impl KillSwitch {
    /// `kill`: SIGKILL there; `stop`: SIGSTOP there (the slave freezes,
    /// heartbeats included, until SIGCONT: a zombie whose lease lapses
    /// and whose late requests the node must fence).
    pub(crate) fn new(kill: Option<KillPoint>, stop: Option<KillPoint>) -> Self {
        let armed = [(kill, Signal::SIGKILL), (stop, Signal::SIGSTOP)]
            .into_iter()
            .filter_map(|(p, signal)| p.map(|point| Armed { point, signal, reached: AtomicU32::new(0) }))
            .collect();
        KillSwitch { armed }
    }

    /// Dies (or stops) here if this is a kill (or stop) point.
    pub(crate) fn reached(&self, place: KillPlace) {
        for a in self.armed.iter().filter(|a| a.point.place == place) {
            if a.reached.fetch_add(1, Ordering::SeqCst) + 1 != a.point.task {
                continue;
            }
            tracing::warn!("{} point {}: {}", if a.signal == Signal::SIGKILL { "kill" } else { "stop" }, a.point, a.signal);
            let _ = nix::sys::signal::raise(a.signal);
            if a.signal == Signal::SIGKILL {
                // SIGKILL cannot be caught; should raise fail, die as abruptly.
                std::process::abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_points_parse_and_print_back() {
        for s in ["dequeued:1", "computed:3", "before-commit:2"] {
            assert_eq!(s.parse::<KillPoint>().unwrap().to_string(), s);
        }
        for s in ["computed", "computed:0", "computed:x", "later:1", ":1"] {
            assert!(s.parse::<KillPoint>().is_err(), "{s} accepted");
        }
    }

    #[test]
    fn a_switch_passes_other_places_and_earlier_tasks() {
        let k = KillSwitch::new(Some(KillPoint { place: KillPlace::Computed, task: 3 }), None);
        k.reached(KillPlace::Computed);
        k.reached(KillPlace::Dequeued);
        k.reached(KillPlace::BeforeCommit);
        k.reached(KillPlace::Computed);
        assert_eq!(k.armed[0].reached.load(Ordering::SeqCst), 2, "only its own place counts");
        KillSwitch::new(None, None).reached(KillPlace::Dequeued);
    }
}
