//! Which rows a panel's interchanges move, as a task that holds a few
//! blocks needs to know them.
//!
//! A panel's interchanges (LAPACK's `ipiv`: row `r0 + r` swapped with row
//! `piv[r] ≥ r0 + r`, in order, for `r < w`) bring the `w` chosen rows
//! into the diagonal block, in order, and send each row of the diagonal
//! block that was not chosen to a position a chosen row left below it. No
//! other row moves: before swap `r` the rows at `r0 + r..r0 + w` are all
//! rows of the diagonal block (the chosen ones are already above), so
//! every swap sends a row of the diagonal block down or keeps it in the
//! block. So a block column is permuted by reading the diagonal block and
//! the blocks that hold chosen rows, one at a time.

use crate::block::Block;
use std::collections::{BTreeMap, HashMap};

/// The movement of rows a panel's interchanges make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PanelRows {
    /// First row of the diagonal block.
    pub(crate) r0: u64,
    /// `chosen[r]`: the global row that becomes row `r0 + r`.
    pub(crate) chosen: Vec<u64>,
    /// Below the diagonal block: position → the row of the diagonal block
    /// that lands there (every such position held a chosen row).
    pub(crate) moved_down: BTreeMap<u64, u64>,
}

impl PanelRows {
    /// From `ipiv` (global rows, checked: `piv[r] ≥ r0 + r`).
    pub(crate) fn from_ipiv(r0: u64, piv: &[u64]) -> PanelRows {
        let mut at: HashMap<u64, u64> = HashMap::new();
        for (r, &g) in piv.iter().enumerate() {
            let s = r0 + r as u64;
            let (rs, rg) = (*at.get(&s).unwrap_or(&s), *at.get(&g).unwrap_or(&g));
            at.insert(s, rg);
            at.insert(g, rs);
        }
        let w = piv.len() as u64;
        let chosen = (r0..r0 + w).map(|q| *at.get(&q).unwrap_or(&q)).collect();
        let moved_down = at.into_iter().filter(|&(q, row)| q >= r0 + w && q != row).collect();
        PanelRows { r0, chosen, moved_down }
    }

    /// The interchanges (`ipiv`, global) that bring `chosen` into the
    /// diagonal block in order.
    pub(crate) fn ipiv_of(r0: u64, chosen: &[u64]) -> Vec<u64> {
        let mut row_at: HashMap<u64, u64> = HashMap::new();
        let mut pos_of: HashMap<u64, u64> = HashMap::new();
        let mut piv = Vec::with_capacity(chosen.len());
        for (r, &g) in chosen.iter().enumerate() {
            let s = r0 + r as u64;
            let q = *pos_of.get(&g).unwrap_or(&g);
            piv.push(q);
            let (rs, rq) = (*row_at.get(&s).unwrap_or(&s), *row_at.get(&q).unwrap_or(&q));
            row_at.insert(s, rq);
            row_at.insert(q, rs);
            pos_of.insert(rq, s);
            pos_of.insert(rs, q);
        }
        piv
    }

    /// Whether no row moves.
    pub(crate) fn is_identity(&self) -> bool {
        self.moved_down.is_empty() && self.chosen.iter().enumerate().all(|(r, &g)| g == self.r0 + r as u64)
    }

    /// The block rows (side `b`) that hold chosen rows, sorted.
    pub(crate) fn source_blocks(&self, b: u64) -> Vec<u32> {
        let mut t: Vec<u32> = self.chosen.iter().map(|&g| (g / b) as u32).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Within block row `t` (side `b`): `(row of the diagonal block, row in
    /// the block)` for each row of the diagonal block that lands there (the
    /// pairs [`copy_rows`] takes).
    pub(crate) fn landing_in(&self, t: u32, b: u64) -> Vec<(usize, usize)> {
        let first = u64::from(t) * b;
        self.moved_down.range(first..first + b).map(|(&q, &row)| ((row - self.r0) as usize, (q - first) as usize)).collect()
    }
}

impl PanelRows {
    /// The rows of diagonal block `d` (of any block column) that the
    /// interchanges send below it, in the order of their destinations: at
    /// most `w` rows, so a task may hold them beside its blocks instead of
    /// reading `d` again for every block that receives some.
    pub(crate) fn displaced(&self, d: &Block) -> Block {
        let mut out = Block::zeros(self.moved_down.len(), d.cols);
        let pairs: Vec<(usize, usize)> = self.moved_down.values().enumerate().map(|(r, &row)| ((row - self.r0) as usize, r)).collect();
        copy_rows(d, &pairs, &mut out);
        out
    }

    /// Within block row `t` (side `b`): `(row of [`PanelRows::displaced`],
    /// row in the block)` for each displaced row that lands there.
    pub(crate) fn landing_displaced(&self, t: u32, b: u64) -> Vec<(usize, usize)> {
        let first = u64::from(t) * b;
        let before = self.moved_down.range(..first).count();
        self.moved_down.range(first..first + b).enumerate().map(|(e, (&q, _))| (before + e, (q - first) as usize)).collect()
    }
}

/// Copies row `from` of `src` into row `to` of `dst` for each `(from, to)`
/// (same columns). Column by column: a row of a column-major block is one
/// element a column, a page apart at large `b`, so walking rows cost a TLB
/// miss an element; a column's picks stay within its few pages.
pub(crate) fn copy_rows(src: &Block, pairs: &[(usize, usize)], dst: &mut Block) {
    for c in 0..dst.cols {
        let s = &src.data[c * src.rows..(c + 1) * src.rows];
        let d = &mut dst.data[c * dst.rows..(c + 1) * dst.rows];
        for &(from, to) in pairs {
            d[to] = s[from];
        }
    }
}

/// Stacks rows of blocks read one at a time: row `s` of the result is
/// global row `rows[s]`, read from its block row (side `b`) by `read`, each
/// block once, in block order.
pub(crate) fn gather<E>(rows: &[u64], cols: usize, b: u64, mut read: impl FnMut(u32) -> Result<Block, E>) -> Result<Block, E> {
    let mut by_block: BTreeMap<u32, Vec<(usize, usize)>> = BTreeMap::new();
    for (s, &g) in rows.iter().enumerate() {
        by_block.entry((g / b) as u32).or_default().push(((g % b) as usize, s));
    }
    let mut out = Block::zeros(rows.len(), cols);
    for (t, picks) in by_block {
        let blk = read(t)?;
        copy_rows(&blk, &picks, &mut out);
    }
    Ok(out)
}

/// The block rows [`gather`] reads for `rows`, in its order.
pub(crate) fn gather_blocks(rows: &[u64], b: u64) -> Vec<u32> {
    let mut t: Vec<u32> = rows.iter().map(|&g| (g / b) as u32).collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// After dgetrf of stacked rows (`ipiv` local, 0-based): the global rows it
/// chose, in order, at most `w` of them.
pub(crate) fn winners(rows: &[u64], ipiv: &[usize], w: usize) -> Vec<u64> {
    let mut idx: Vec<usize> = (0..rows.len()).collect();
    for (r, &q) in ipiv.iter().enumerate() {
        idx.swap(r, q);
    }
    idx.iter().take(w.min(rows.len())).map(|&s| rows[s]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation `ipiv` makes, applied to row indices directly.
    fn apply(n: u64, r0: u64, piv: &[u64]) -> Vec<u64> {
        let mut rows: Vec<u64> = (0..n).collect();
        for (r, &g) in piv.iter().enumerate() {
            rows.swap((r0 + r as u64) as usize, g as usize);
        }
        rows
    }

    #[test]
    fn ipiv_round_trips_and_only_the_diagonal_block_moves_down() {
        // Chosen rows inside and below the diagonal block (rows 8..12),
        // some in chains (row 9 chosen first moves row 8 to 9's place).
        let (n, r0) = (30u64, 8u64);
        for chosen in [vec![9u64, 20, 8, 29], vec![8, 9, 10, 11], vec![25, 24, 23, 22], vec![11, 10, 27, 8]] {
            let piv = PanelRows::ipiv_of(r0, &chosen);
            let rows = PanelRows::from_ipiv(r0, &piv);
            assert_eq!(rows.chosen, chosen);
            let want = apply(n, r0, &piv);
            for q in r0 + 4..n {
                let got = rows.moved_down.get(&q).copied().unwrap_or(q);
                assert_eq!(got, want[q as usize], "{chosen:?} position {q}");
                if got != q {
                    assert!((r0..r0 + 4).contains(&got), "{chosen:?}: row {got} moved down is not from the diagonal block");
                }
            }
            assert_eq!(rows.is_identity(), chosen == [8, 9, 10, 11]);
        }
    }

    #[test]
    fn landing_and_sources_by_block() {
        let rows = PanelRows::from_ipiv(4, &PanelRows::ipiv_of(4, &[13, 5, 9, 4]));
        assert_eq!(rows.source_blocks(4), vec![1, 2, 3]);
        // Rows 6 and 7 of the diagonal block go where 9 and 13 were.
        let mut landed = rows.landing_in(2, 4);
        landed.extend(rows.landing_in(3, 4));
        landed.sort_unstable();
        assert_eq!(landed.len(), 2);
        assert_eq!(landed.iter().map(|l| l.0).collect::<std::collections::BTreeSet<_>>(), [2usize, 3].into());
    }

    #[test]
    fn displaced_rows_land_where_landing_in_says() {
        let (b, r0) = (4u64, 4u64);
        let rows = PanelRows::from_ipiv(r0, &PanelRows::ipiv_of(r0, &[13, 5, 9, 4]));
        let mut d = Block::zeros(4, 2);
        for r in 0..4 {
            d.set(r, 0, (r0 + r as u64) as f64);
            d.set(r, 1, -(r as f64));
        }
        let moved = rows.displaced(&d);
        assert_eq!(moved.rows, rows.moved_down.len());
        for t in 0..4u32 {
            let mut want = rows.landing_in(t, b);
            let mut got: Vec<(usize, usize)> =
                rows.landing_displaced(t, b).into_iter().map(|(r, q)| (moved.get(r, 0) as usize - r0 as usize, q)).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "block row {t}");
        }
    }

    #[test]
    fn gather_reads_each_block_once_in_order() {
        let b = 3u64;
        let mut read = Vec::new();
        let out = gather::<()>(&[7, 1, 6, 2], 2, b, |t| {
            read.push(t);
            let mut blk = Block::zeros(3, 2);
            for r in 0..3 {
                blk.set(r, 0, (u64::from(t) * b + r as u64) as f64);
                blk.set(r, 1, -1.0);
            }
            Ok(blk)
        })
        .unwrap();
        assert_eq!(read, gather_blocks(&[7, 1, 6, 2], b));
        assert_eq!((0..4).map(|s| out.get(s, 0)).collect::<Vec<_>>(), vec![7.0, 1.0, 6.0, 2.0]);
        assert_eq!(winners(&[7, 1, 6, 2], &[2, 2, 3], 2), vec![6, 7]);
    }
}
