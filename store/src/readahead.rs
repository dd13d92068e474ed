//! Reading ahead of a local client that reads a matrix's blocks in order.
//!
//! A plain file read in order is read ahead by the kernel: the disk is
//! already busy with the next pieces while the reader copies this one. A
//! matrix is a file per block, and each new file starts with no readahead,
//! so a client reading cold blocks one after another along a row waited
//! for each block's disk read in turn. Each data-plane connection keeps,
//! per matrix it reads, where its gets of one block have gone; once two
//! gets in a row stepped along a row or a column and the last found its
//! block not cached, the node hints the blocks ahead on that line
//! (`files::will_need`: reads started, nothing waited for), up to
//! [`AHEAD_BYTES`] past the last block read, each block once, for blocks
//! up to [`MAX_BLOCK_BYTES`]. `bench
//! blocks --sizes 256`, cold gets one block at a time, three alternations:
//! 1,303, 1,328, 1,330 MiB/s (0.49, 0.61, 0.46 of raw) → 1,759, 2,010,
//! 2,047 (0.62, 0.70, 0.73). Gets of many already hint their own files.
//!
//! Hints change nothing a get returns; a hinted block that is replaced
//! before it is read just had a file read for nothing.

use uuid::Uuid;

/// How far past the last block read the hints reach, in payload bytes:
/// 32 blocks at b = 256.
pub(crate) const AHEAD_BYTES: u64 = 16 << 20;
/// Blocks larger than this are not read ahead: reading one file is long
/// enough for the kernel's own readahead of it to keep the disk busy, and
/// starting the next file's read beside it made cold reads slower (`bench
/// blocks --mib 256`, one get a block, two alternations: b = 1024 2,609,
/// 2,550 → 2,027, 1,923 MiB/s; b = 2048 2,883, 2,768 → 2,073, 2,144; b =
/// 512, 2 MiB, mixed: 2,044, 2,114 → 1,748, 2,179).
pub(crate) const MAX_BLOCK_BYTES: u64 = 1 << 20;
/// Matrices a connection's record follows at once (the oldest is dropped):
/// a task reads a few at a time, each along its own line.
const MATRICES: usize = 4;

/// A step from one block to the next on a line: along a row (`j + 1`) or
/// down a column (`i + 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Row,
    Column,
}

impl Step {
    fn of(from: (u32, u32), to: (u32, u32)) -> Option<Step> {
        if to == (from.0, from.1.wrapping_add(1)) {
            Some(Step::Row)
        } else if to == (from.0.wrapping_add(1), from.1) {
            Some(Step::Column)
        } else {
            None
        }
    }

    /// The block `n` steps past `from`, if the indices do not overflow.
    fn ahead(self, from: (u32, u32), n: u32) -> Option<(u32, u32)> {
        match self {
            Step::Row => from.1.checked_add(n).map(|j| (from.0, j)),
            Step::Column => from.0.checked_add(n).map(|i| (i, from.1)),
        }
    }
}

/// Where one matrix's gets on a connection have gone.
#[derive(Debug)]
struct Line {
    matrix: Uuid,
    /// The last block read.
    last: (u32, u32),
    /// The step the last two gets or more have kept to; `None` after a
    /// jump (or the first get).
    step: Option<Step>,
    /// Steps past `last` already hinted.
    hinted: u32,
}

/// A connection's record of its gets, and the hints they call for.
#[derive(Debug, Default)]
pub(crate) struct Readahead {
    lines: Vec<Line>,
}

impl Readahead {
    /// Notes a get of one `block` of `matrix`, `block_bytes` long, whose
    /// file was found `cold` (not cached), and returns the blocks to hint:
    /// none unless the gets so far keep to one step and this one was cold.
    /// The caller skips blocks outside the matrix (the first ends the line).
    pub(crate) fn after_get(&mut self, matrix: Uuid, block: (u32, u32), block_bytes: u64, cold: bool) -> Vec<(u32, u32)> {
        let at = match self.lines.iter().position(|l| l.matrix == matrix) {
            Some(at) => at,
            None => {
                if self.lines.len() == MATRICES {
                    self.lines.remove(0);
                }
                self.lines.push(Line { matrix, last: block, step: None, hinted: 0 });
                self.lines.len() - 1
            }
        };
        let line = &mut self.lines[at];
        // A new line's `last` is this block: no step, as for a jump.
        match Step::of(line.last, block).filter(|s| line.step.is_none_or(|t| t == *s)) {
            Some(s) => {
                line.step = Some(s);
                line.hinted = line.hinted.saturating_sub(1);
            }
            None => {
                line.step = None;
                line.hinted = 0;
            }
        }
        line.last = block;
        let Some(step) = line.step else { return Vec::new() };
        if !cold || block_bytes > MAX_BLOCK_BYTES {
            return Vec::new();
        }
        let ahead = (AHEAD_BYTES / block_bytes.max(1)).clamp(1, u32::MAX as u64) as u32;
        let hints = (line.hinted + 1..=ahead).map_while(|n| step.ahead(block, n)).collect::<Vec<_>>();
        line.hinted = ahead;
        hints
    }

    /// The block one step past the last get of `matrix`, when the gets so
    /// far keep to one step: the block a reader along that line asks for
    /// next (the node peeks it, `dataplane::peek`).
    pub(crate) fn next_on_line(&self, matrix: Uuid) -> Option<(u32, u32)> {
        let line = self.lines.iter().find(|l| l.matrix == matrix)?;
        line.step?.ahead(line.last, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B256: u64 = 256 * 256 * 8;

    fn row(i: u32, js: std::ops::Range<u32>) -> Vec<(u32, u32)> {
        js.map(|j| (i, j)).collect()
    }

    #[test]
    fn cold_gets_along_a_row_hint_the_blocks_ahead_once_each() {
        let m = Uuid::new_v4();
        let mut r = Readahead::default();
        assert!(r.after_get(m, (0, 0), B256, true).is_empty(), "one block is not yet a line");
        let hints = r.after_get(m, (0, 1), B256, true);
        assert_eq!(hints, row(0, 2..34), "32 blocks of 512 KiB: 16 MiB ahead");
        // The next cold get hints only what now comes into reach.
        assert_eq!(r.after_get(m, (0, 2), B256, true), vec![(0, 34)]);
        // Warm: nothing, but the line goes on.
        assert!(r.after_get(m, (0, 3), B256, false).is_empty());
        assert_eq!(r.after_get(m, (0, 4), B256, true), row(0, 35..37));
    }

    #[test]
    fn a_column_reaches_as_far_as_the_bytes_allow_and_large_blocks_not_at_all() {
        let m = Uuid::new_v4();
        let mut r = Readahead::default();
        let mib = 1 << 20;
        r.after_get(m, (5, 3), mib, true);
        assert_eq!(r.after_get(m, (6, 3), mib, true), (7..23).map(|i| (i, 3)).collect::<Vec<_>>());
        assert_eq!(r.after_get(m, (7, 3), mib, true), vec![(23, 3)]);
        let b1024 = 1024 * 1024 * 8;
        let n = Uuid::new_v4();
        for i in 0..4 {
            assert!(r.after_get(n, (i, 0), b1024, true).is_empty(), "an 8 MiB block is read ahead by the kernel");
        }
    }

    #[test]
    fn gets_out_of_order_or_changing_step_hint_nothing() {
        let m = Uuid::new_v4();
        let mut r = Readahead::default();
        for b in [(0, 0), (0, 2), (1, 2), (1, 1), (3, 3), (3, 3)] {
            let hints = r.after_get(m, b, B256, true);
            // (0, 2) → (1, 2) is a step down a column, but a line of one
            // step is a line: only that pair may hint.
            if b == (1, 2) {
                assert_eq!(hints.first(), Some(&(2, 2)));
            } else {
                assert!(hints.is_empty(), "{b:?}: {hints:?}");
            }
        }
    }

    #[test]
    fn the_next_block_on_a_line_is_known_after_one_step_warm_or_cold() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut r = Readahead::default();
        assert_eq!(r.next_on_line(a), None, "nothing read yet");
        r.after_get(a, (2, 5), B256, false);
        assert_eq!(r.next_on_line(a), None, "one block is not a line");
        r.after_get(a, (2, 6), B256, false);
        assert_eq!(r.next_on_line(a), Some((2, 7)));
        r.after_get(b, (0, 0), B256, false);
        r.after_get(b, (1, 0), B256, false);
        assert_eq!(r.next_on_line(b), Some((2, 0)), "down a column");
        assert_eq!(r.next_on_line(a), Some((2, 7)), "a's line is its own");
        r.after_get(a, (4, 4), B256, false);
        assert_eq!(r.next_on_line(a), None, "after a jump");
        r.after_get(b, (u32::MAX - 1, 9), B256, false);
        r.after_get(b, (u32::MAX, 9), B256, false);
        assert_eq!(r.next_on_line(b), None, "past the last index");
    }

    #[test]
    fn each_matrix_keeps_its_own_line() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut r = Readahead::default();
        r.after_get(a, (0, 0), B256, true);
        r.after_get(b, (0, 0), B256, true);
        assert_eq!(r.after_get(a, (0, 1), B256, true).len(), 32);
        assert_eq!(r.after_get(b, (1, 0), B256, true).first(), Some(&(2, 0)));
        // A fifth matrix drops the oldest line.
        for _ in 0..4 {
            r.after_get(Uuid::new_v4(), (0, 0), B256, true);
        }
        assert!(r.after_get(a, (0, 2), B256, true).is_empty(), "a's line was dropped");
    }
}
