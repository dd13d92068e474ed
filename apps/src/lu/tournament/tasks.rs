//! The bodies of the tournament's tasks. Each holds at most four blocks:
//! blocks are read one at a time, and a block a task will overwrite is read
//! again when needed rather than held.

use super::rows::{copy_rows, gather, gather_blocks, winners, PanelRows};
use super::{candidates_key, panel_rows, tree};
use crate::block::{Block, BlockId, MatrixMeta};
use crate::ctx::TaskCtx;
use crate::job::{self, TaskError};
use crate::kernels;
use crate::lu::{pivots_key, LastWrites};

/// Block column `j` as step `k` finds it: A's own blocks in the first step
/// (nothing has written the output yet), else the output's; `update` when
/// the task overwrites the column (a write lock at the read).
struct Column<'a> {
    m: &'a MatrixMeta,
    j: u32,
    update: bool,
}

impl<'a> Column<'a> {
    fn at_step(a: &'a MatrixMeta, lu: &'a MatrixMeta, k: u32, j: u32, writes: bool) -> Column<'a> {
        if k == 0 {
            Column { m: a, j, update: false }
        } else {
            Column { m: lu, j, update: writes }
        }
    }

    fn read(&self, ctx: &mut dyn TaskCtx, t: u32) -> Result<Block, TaskError> {
        if self.update {
            job::read_for_update(ctx, self.m, t, self.j)
        } else {
            job::read_checked(ctx, self.m, t, self.j)
        }
    }

    /// The block, if its read is a plain one the slave may stream ahead
    /// (a read for update takes its lock at once, outside the stream).
    fn streamed(&self, t: u32) -> Option<BlockId> {
        (!self.update).then(|| self.m.block_id(t, self.j))
    }
}

fn getrf_flops(m: usize, n: usize) -> f64 {
    let (m, n) = (m.max(n) as f64, m.min(n) as f64);
    m * n * n - n * n * n / 3.0
}

fn encode_rows(rows: &[u64]) -> Vec<u8> {
    rows.iter().flat_map(|r| r.to_le_bytes()).collect()
}

/// A child's candidates: global rows of the panel, at most `w`, distinct.
fn read_candidates(ctx: &mut dyn TaskCtx, key: String, lu: &MatrixMeta, k: u32, w: usize) -> Result<Vec<u64>, TaskError> {
    let bad = |reason: String| TaskError::BadSmall { key: key.clone(), reason };
    let raw = ctx.read_small(&key)?.ok_or_else(|| bad("missing".into()))?;
    if raw.len() % 8 != 0 || raw.len() / 8 > w || raw.is_empty() {
        return Err(bad(format!("{} bytes for at most {w} rows", raw.len())));
    }
    let rows: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    let r0 = lu.row_offset(k);
    if let Some(g) = rows.iter().find(|&&g| g < r0 || g >= lu.n_rows) {
        return Err(bad(format!("row {g} outside panel {k}")));
    }
    Ok(rows)
}

/// Node `node` of panel `k`'s tree: stacks its rows (its children's
/// candidates, or the one block when it is alone), factors them with
/// partial pivoting and proposes the rows chosen. The root instead records them as
/// the panel's pivots and factors the panel ([`root`]).
pub(super) fn pick(
    job: uuid::Uuid,
    a: &MatrixMeta,
    lu: &MatrixMeta,
    k: u32,
    node: tree::Node,
    ctx: &mut dyn TaskCtx,
) -> Result<(f64, LastWrites), TaskError> {
    let p = lu.block_rows();
    let m = p - k;
    let is_root = node == (tree::height(m), 0);
    let w = lu.block_shape(k, k).1;
    let b = u64::from(lu.block);
    // The root overwrites every block of the panel it reads.
    let col = Column::at_step(a, lu, k, k, is_root);
    let (rows, mut stacked) = if node.0 == 0 {
        let t = k + node.1;
        ctx.prefetch(&col.streamed(t).into_iter().collect::<Vec<_>>())?;
        let first = lu.row_offset(t);
        let blk = col.read(ctx, t)?;
        ((first..first + blk.rows as u64).collect::<Vec<u64>>(), blk)
    } else {
        let mut rows = Vec::with_capacity(2 * w);
        for (level, idx) in tree::children(m, node) {
            if level == 0 {
                // A leaf: every row of its block.
                let first = lu.row_offset(k + idx);
                rows.extend(first..first + lu.block_shape(k + idx, k).0 as u64);
            } else {
                rows.extend(read_candidates(ctx, candidates_key(job, k, level, idx), lu, k, w)?);
            }
        }
        let ids: Vec<BlockId> = gather_blocks(&rows, b).into_iter().filter_map(|t| col.streamed(t)).collect();
        ctx.prefetch(&ids)?;
        let stacked = gather(&rows, w, b, |t| col.read(ctx, t))?;
        (rows, stacked)
    };
    let (ipiv, res) = kernels::getrf(&mut stacked);
    let flops = getrf_flops(stacked.rows, stacked.cols);
    let chosen = winners(&rows, &ipiv, w);
    if !is_root {
        // A node short of rank still proposes rows; only the root's
        // factorisation decides whether the panel is singular.
        ctx.write_small(&candidates_key(job, k, node.0, node.1), &encode_rows(&chosen))?;
        return Ok((flops, Vec::new()));
    }
    res.map_err(|row| TaskError::Singular { i: k, j: k, row })?;
    if chosen.len() < w {
        return Err(TaskError::Singular { i: k, j: k, row: chosen.len() });
    }
    let (f, last) = root(job, lu, &col, k, chosen, stacked, ctx)?;
    Ok((flops + f, last))
}

/// The root of panel `k`: records the chosen rows as the panel's
/// interchanges, keeps `L(k,k)\U(k,k)` (the top `w` rows of its factored
/// stack) and solves each block below. Returns the diagonal block, to be
/// written last (the solves read the old one for its displaced rows).
fn root(
    job: uuid::Uuid,
    lu: &MatrixMeta,
    col: &Column<'_>,
    k: u32,
    chosen: Vec<u64>,
    stacked: Block,
    ctx: &mut dyn TaskCtx,
) -> Result<(f64, LastWrites), TaskError> {
    let r0 = lu.row_offset(k);
    let w = chosen.len();
    let piv = PanelRows::ipiv_of(r0, &chosen);
    ctx.write_small(&pivots_key(job, k), &encode_rows(&piv))?;
    let rows = PanelRows { r0, chosen, moved_down: PanelRows::from_ipiv(r0, &piv).moved_down };
    let diag = if stacked.rows == w {
        stacked
    } else {
        let mut d = Block::zeros(w, w);
        copy_rows(&stacked, &(0..w).map(|r| (r, r)).collect::<Vec<_>>(), &mut d);
        // Two blocks' worth, not held through the solves below.
        drop(stacked);
        d
    };
    let mut ids: Vec<BlockId> = col.streamed(k).into_iter().collect();
    ids.extend(below_reads(lu, col, k, |_| None));
    ctx.prefetch(&ids)?;
    let moved = rows.displaced(&col.read(ctx, k)?);
    let (flops, mut last) = below(ctx, lu, col, &rows, &moved, k, |_, _, x| {
        kernels::trsm_right_upper(&diag, x);
        Ok((x.rows * x.cols * x.cols) as f64)
    })?;
    last.push((lu.block_id(k, k), diag));
    Ok((flops, last))
}

/// The plain reads [`below`] makes, in order, with `extra(i)` after each
/// block's own.
fn below_reads(lu: &MatrixMeta, col: &Column<'_>, k: u32, extra: impl Fn(u32) -> Option<BlockId>) -> Vec<BlockId> {
    let mut ids = Vec::new();
    for i in k + 1..lu.block_rows() {
        ids.extend(col.streamed(i));
        ids.extend(extra(i));
    }
    ids
}

/// For each block row `i` below `k`: block `(i, j)` with the rows of the
/// diagonal block that the interchanges send there put in place (from
/// `moved`, [`PanelRows::displaced`]), then `op(i, X)`; writes the result
/// to the output, but the last, which it returns (a task's releases go
/// before its last writes). Returns the flops of `op`.
fn below(
    ctx: &mut dyn TaskCtx,
    lu: &MatrixMeta,
    col: &Column<'_>,
    rows: &PanelRows,
    moved: &Block,
    k: u32,
    mut op: impl FnMut(&mut dyn TaskCtx, u32, &mut Block) -> Result<f64, TaskError>,
) -> Result<(f64, LastWrites), TaskError> {
    let b = u64::from(lu.block);
    let mut flops = 0.0;
    let mut last = Vec::new();
    for i in k + 1..lu.block_rows() {
        // The previous block goes before the next is read: it is not held beside it.
        if let Some((id, prev)) = last.pop() {
            ctx.write_block_owned(id, prev)?;
        }
        let mut x = col.read(ctx, i)?;
        copy_rows(moved, &rows.landing_displaced(i, b), &mut x);
        flops += op(ctx, i, &mut x)?;
        last.push((lu.block_id(i, col.j), x));
    }
    Ok((flops, last))
}

/// `Update{k,j}`: panel `k`'s chosen rows of column `j` gathered,
/// `U(k,j) = L(k,k)⁻¹·X(k,j)`, then each block below with its displaced
/// rows, `X(i,j) −= L(i,k)·U(k,j)`. Returns the last block below and
/// `U(k,j)`, to be written last.
pub(super) fn update(
    job: uuid::Uuid,
    a: &MatrixMeta,
    lu: &MatrixMeta,
    k: u32,
    j: u32,
    ctx: &mut dyn TaskCtx,
) -> Result<(f64, LastWrites), TaskError> {
    let rows = panel_rows(job, lu, k, ctx)?;
    let col = Column::at_step(a, lu, k, j, true);
    let b = u64::from(lu.block);
    let cols = lu.block_shape(k, j).1;
    let sources = gather_blocks(&rows.chosen, b);
    // The old diagonal block's displaced rows are taken as the gather
    // reads it, or read after it when it holds no chosen row.
    let diag_gathered = sources.contains(&k);
    let mut ids: Vec<BlockId> = sources.into_iter().filter_map(|t| col.streamed(t)).collect();
    if !diag_gathered {
        ids.extend(col.streamed(k));
    }
    ids.push(lu.block_id(k, k));
    ids.extend(below_reads(lu, &col, k, |i| Some(lu.block_id(i, k))));
    ctx.prefetch(&ids)?;
    let mut moved = None;
    let mut u = gather(&rows.chosen, cols, b, |t| {
        let blk = col.read(ctx, t)?;
        if t == k {
            moved = Some(rows.displaced(&blk));
        }
        Ok::<Block, TaskError>(blk)
    })?;
    let moved = match moved {
        Some(m) => m,
        None => rows.displaced(&col.read(ctx, k)?),
    };
    let d = job::read_checked(ctx, lu, k, k)?;
    kernels::trsm_left_lower_unit(&d, &mut u);
    drop(d);
    let flops = (u.rows * u.rows * u.cols) as f64;
    let (f, mut last) = below(ctx, lu, &col, &rows, &moved, k, |ctx, i, x| {
        let l = job::read_checked(ctx, lu, i, k)?;
        kernels::gemm(-1.0, &l, false, &u, false, 1.0, x);
        Ok(2.0 * (x.rows * x.cols * l.cols) as f64)
    })?;
    last.push((lu.block_id(k, j), u));
    Ok((flops + f, last))
}

/// `Swap{k, m}` (`m < k`): panel `k`'s interchanges applied to the `L`
/// blocks of column `m`: its diagonal block held while each block with
/// chosen rows gives them up and takes the displaced ones, then the new
/// diagonal block written. Panels apply in order, each after the last.
pub(super) fn left_swap(job: uuid::Uuid, lu: &MatrixMeta, k: u32, m: u32, ctx: &mut dyn TaskCtx) -> Result<(), TaskError> {
    let rows = panel_rows(job, lu, k, ctx)?;
    if rows.is_identity() {
        return Ok(());
    }
    let b = u64::from(lu.block);
    let d = job::read_for_update(ctx, lu, k, m)?;
    let mut diag = Block::zeros(d.rows, d.cols);
    let mut blocks = rows.source_blocks(b);
    blocks.extend(rows.moved_down.keys().map(|&q| (q / b) as u32));
    blocks.sort_unstable();
    blocks.dedup();
    for t in blocks {
        let first = lu.row_offset(t);
        let x = if t == k { None } else { Some(job::read_for_update(ctx, lu, t, m)?) };
        let src = x.as_ref().unwrap_or(&d);
        let picks: Vec<(usize, usize)> =
            rows.chosen.iter().enumerate().filter(|(_, &g)| g / b == u64::from(t)).map(|(r, &g)| ((g - first) as usize, r)).collect();
        copy_rows(src, &picks, &mut diag);
        if let Some(mut x) = x {
            copy_rows(&d, &rows.landing_in(t, b), &mut x);
            ctx.write_block_owned(lu.block_id(t, m), x)?;
        }
    }
    drop(d);
    ctx.write_block_owned(lu.block_id(k, m), diag)?;
    Ok(())
}
