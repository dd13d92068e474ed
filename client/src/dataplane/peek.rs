//! Blocks the node peeks for a reader along a line (`wire::Peek`): the
//! client's record of them per connection, and its counts of how their
//! gets went.

use std::sync::atomic::{AtomicU64, Ordering};

use uuid::Uuid;

use super::wire;

/// A block the node peeked ([`wire::Peek`]) and its file.
pub(super) struct Peeked {
    pub(super) matrix: Uuid,
    pub(super) peek: wire::Peek,
    pub(super) file: std::fs::File,
}

/// The blocks a connection's node peeked, the latest of each matrix it
/// reads along a line, for at most [`PEEKED_MATRICES`] matrices (as the
/// node follows as many lines per connection).
#[derive(Default)]
pub struct Peeks(Vec<Peeked>);

const PEEKED_MATRICES: usize = 4;

impl Peeks {
    /// Takes `matrix`'s peeked block: it, if it is block (`i`, `j`); in any
    /// case the get that follows brings the next one.
    pub(super) fn take(&mut self, matrix: Uuid, i: u32, j: u32) -> Option<Peeked> {
        let at = self.0.iter().position(|p| p.matrix == matrix)?;
        Some(self.0.remove(at)).filter(|p| (p.peek.i, p.peek.j) == (i, j))
    }

    pub(super) fn put(&mut self, peeked: Peeked) {
        self.0.retain(|p| p.matrix != peeked.matrix);
        if self.0.len() == PEEKED_MATRICES {
            self.0.remove(0);
        }
        self.0.push(peeked);
    }
}

/// How the gets of peeked blocks ([`wire::Peek`]) went: read while the
/// node took the lock and kept (the version locked had the stamp read), or
/// read again from the reply's file.
#[derive(Debug, Default)]
pub(super) struct PeekCounts {
    kept: AtomicU64,
    read_again: AtomicU64,
}

impl PeekCounts {
    /// Counts a get of a peeked block: `kept` what it read early, or not.
    pub(super) fn count(&self, kept: bool) {
        let c = if kept { &self.kept } else { &self.read_again };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> PeekedGets {
        PeekedGets { kept: self.kept.load(Ordering::Relaxed), read_again: self.read_again.load(Ordering::Relaxed) }
    }
}

/// Gets of blocks the node had peeked, by how they went (see
/// [`wire::Peek`]); for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeekedGets {
    /// The block read while its lock was taken was the version locked.
    pub kept: u64,
    /// It was not (replaced since the peek, or unreadable): the block
    /// was read again from the file the reply passed.
    pub read_again: u64,
}

/// The CPU this thread runs on, if the kernel says (and it fits the
/// wire's 16 bits).
pub fn current_cpu() -> Option<u16> {
    // SAFETY: a plain call with no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    u16::try_from(cpu).ok().filter(|&c| c < u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockHeader;
    use wire::LocalEntry;

    #[test]
    fn a_peeked_block_is_taken_once_by_its_get_and_one_is_kept_per_matrix() {
        let peeked = |matrix: Uuid, j: u32| {
            let entry = LocalEntry { header: BlockHeader { rows: 1, cols: 1, checksum: 0 }, cached: true, stamp: 0 };
            Peeked { matrix, peek: wire::Peek { i: 0, j, entry }, file: tempfile::tempfile().unwrap() }
        };
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut peeks = Peeks::default();
        peeks.put(peeked(a, 2));
        peeks.put(peeked(b, 7));
        assert!(peeks.take(a, 0, 3).is_none(), "another block of a");
        assert!(peeks.take(a, 0, 2).is_none(), "a's peek went with the get of another block");
        assert_eq!(peeks.take(b, 0, 7).map(|p| p.peek.j), Some(7));
        assert!(peeks.take(b, 0, 7).is_none(), "taken once");
        // A newer peek of a matrix replaces its older one.
        peeks.put(peeked(a, 4));
        peeks.put(peeked(a, 5));
        assert_eq!(peeks.0.len(), 1);
        assert_eq!(peeks.take(a, 0, 5).map(|p| p.peek.j), Some(5));
        // At most four matrices; the oldest goes.
        let ms: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        for &m in &ms {
            peeks.put(peeked(m, 1));
        }
        assert_eq!(peeks.0.len(), PEEKED_MATRICES);
        assert!(peeks.take(ms[0], 0, 1).is_none());
        assert!(peeks.take(ms[4], 0, 1).is_some());
    }
}
