//! Checks of results, read block by block through a [`BlockSource`] so the
//! master can verify through the store without holding whole matrices
//! (except [`matmul_vs_dgemm`], meant for small n).

use crate::block::{Block, BlockId, MatrixMeta};
use crate::kernels;

/// Where verification reads blocks and small objects from (the store
/// client, or [`crate::mem::MemStore`]).
pub trait BlockSource {
    /// The source's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Reads one block.
    fn read_block(&mut self, id: BlockId) -> Result<Block, Self::Error>;
    /// Reads one small object (`None` if absent).
    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, Self::Error>;
}

/// Why a check could not be carried out (a failed check is not an error: it
/// is a large residual in the report).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError<E: std::error::Error + Send + Sync + 'static> {
    /// The source failed.
    #[error("reading the result: {0}")]
    Source(#[source] E),
    /// A block has the wrong shape.
    #[error("block {id} is {}x{}, expected {}x{}", .got.0, .got.1, .expected.0, .expected.1)]
    BadBlock {
        /// The block.
        id: BlockId,
        /// Expected `(rows, cols)`.
        expected: (usize, usize),
        /// Read `(rows, cols)`.
        got: (usize, usize),
    },
    /// The matrices do not fit together.
    #[error("shapes do not match: {0}")]
    Shape(String),
    /// A small object (pivots) is missing or malformed.
    #[error("small object {key}: {reason}")]
    BadSmall {
        /// Its key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

pub(crate) fn read<S: BlockSource>(src: &mut S, m: &MatrixMeta, i: u32, j: u32) -> Result<Block, VerifyError<S::Error>> {
    let id = m.block_id(i, j);
    let b = src.read_block(id).map_err(VerifyError::Source)?;
    let expected = m.block_shape(i, j);
    if (b.rows, b.cols) != expected || b.data.len() != b.rows * b.cols {
        return Err(VerifyError::BadBlock { id, expected, got: (b.rows, b.cols) });
    }
    Ok(b)
}

fn dense<S: BlockSource>(src: &mut S, m: &MatrixMeta) -> Result<Block, VerifyError<S::Error>> {
    let n = m.n_rows as usize;
    let mut out = Block::zeros(n, m.n_cols as usize);
    for id in m.blocks() {
        let b = read(src, m, id.i, id.j)?;
        let (r0, c0) = (m.row_offset(id.i) as usize, m.col_offset(id.j) as usize);
        for c in 0..b.cols {
            out.data[r0 + (c0 + c) * n..r0 + (c0 + c) * n + b.rows].copy_from_slice(&b.data[c * b.rows..(c + 1) * b.rows]);
        }
    }
    Ok(out)
}

/// Result of comparing a product with in-core dgemm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulCheck {
    /// `‖C − A·B‖_F / (‖A‖_F·‖B‖_F)`.
    pub rel_residual: f64,
    /// Largest absolute entry difference.
    pub max_abs_diff: f64,
    /// The tolerance on `rel_residual`: `4·k·ε` (k the inner dimension; the
    /// standard dgemm error bound, doubled for the two computations).
    pub tolerance: f64,
}

impl MatmulCheck {
    /// Whether the residual is within the tolerance.
    pub fn passed(&self) -> bool {
        self.rel_residual <= self.tolerance
    }
}

/// Compares `C` with an in-core dgemm of `A·B`. Holds all three matrices in
/// memory: for small n only.
pub fn matmul_vs_dgemm<S: BlockSource>(
    src: &mut S,
    a: &MatrixMeta,
    b: &MatrixMeta,
    c: &MatrixMeta,
) -> Result<MatmulCheck, VerifyError<S::Error>> {
    check_product_shapes(a, b, c)?;
    let (da, db, dc) = (dense(src, a)?, dense(src, b)?, dense(src, c)?);
    let mut r = Block::zeros(dc.rows, dc.cols);
    kernels::gemm(1.0, &da, false, &db, false, 0.0, &mut r);
    let mut ss = 0.0f64;
    let mut max = 0.0f64;
    for (x, y) in r.data.iter().zip(&dc.data) {
        ss += (x - y) * (x - y);
        max = max.max((x - y).abs());
    }
    let denom = (da.sum_sq() * db.sum_sq()).sqrt();
    Ok(MatmulCheck {
        rel_residual: if denom > 0.0 { ss.sqrt() / denom } else { ss.sqrt() },
        max_abs_diff: max,
        tolerance: 4.0 * a.n_cols as f64 * f64::EPSILON,
    })
}

fn check_product_shapes<E: std::error::Error + Send + Sync + 'static>(
    a: &MatrixMeta,
    b: &MatrixMeta,
    c: &MatrixMeta,
) -> Result<(), VerifyError<E>> {
    if a.n_cols != b.n_rows || c.n_rows != a.n_rows || c.n_cols != b.n_cols || a.block != b.block || c.block != a.block {
        return Err(VerifyError::Shape(format!(
            "A {}x{} b={}, B {}x{} b={}, C {}x{} b={}",
            a.n_rows, a.n_cols, a.block, b.n_rows, b.n_cols, b.block, c.n_rows, c.n_cols, c.block
        )));
    }
    Ok(())
}

/// Result of a Freivalds check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FreivaldsCheck {
    /// Largest over the rounds of `‖A(Bx) − Cx‖₂ / (‖A‖_F·‖B‖_F·‖x‖₂)`.
    pub rel_residual: f64,
    /// Tolerance on `rel_residual`: `4·k·ε`. A correctly computed C
    /// (`|C − AB| ≤ γ_k|A||B|`) stays below it.
    pub tolerance: f64,
    /// Rounds run (independent random ±1 vectors).
    pub rounds: u32,
    /// Probability that a C differing from A·B (by more than the rounding
    /// bound) passes all rounds: at most `2^-rounds` (Freivalds' bound for
    /// ±1 vectors).
    pub miss_probability: f64,
}

impl FreivaldsCheck {
    /// Whether the residual is within the tolerance.
    pub fn passed(&self) -> bool {
        self.rel_residual <= self.tolerance
    }
}

/// Freivalds' check of `C = A·B`, block by block: `y = Bx`, `z = Ay`,
/// `w = Cx` with seeded random ±1 vectors; one block and three vectors of
/// length n in memory. Reads every block of A, B and C once per round.
pub fn freivalds<S: BlockSource>(
    src: &mut S,
    a: &MatrixMeta,
    b: &MatrixMeta,
    c: &MatrixMeta,
    seed: u64,
    rounds: u32,
) -> Result<FreivaldsCheck, VerifyError<S::Error>> {
    use rand::{Rng, SeedableRng};
    check_product_shapes(a, b, c)?;
    let rounds = rounds.max(1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut worst = 0.0f64;
    let (mut na, mut nb) = (0.0f64, 0.0f64);
    for round in 0..rounds {
        let x: Vec<f64> = (0..b.n_cols).map(|_| if rng.gen::<bool>() { 1.0 } else { -1.0 }).collect();
        let (y, sb) = matvec(src, b, &x)?;
        let (z, sa) = matvec(src, a, &y)?;
        let (w, _) = matvec(src, c, &x)?;
        if round == 0 {
            na = sa.sqrt();
            nb = sb.sqrt();
        }
        let diff: f64 = z.iter().zip(&w).map(|(p, q)| (p - q) * (p - q)).sum::<f64>().sqrt();
        let xn = (x.len() as f64).sqrt();
        let denom = na * nb * xn;
        let r = if denom > 0.0 { diff / denom } else { diff };
        // f64::max drops NaN: a NaN anywhere in C must fail the check.
        worst = if r.is_nan() { f64::INFINITY } else { worst.max(r) };
    }
    Ok(FreivaldsCheck {
        rel_residual: worst,
        tolerance: 4.0 * a.n_cols as f64 * f64::EPSILON,
        rounds,
        miss_probability: 0.5f64.powi(rounds as i32),
    })
}

// y = M x, block by block; also returns ‖M‖_F².
fn matvec<S: BlockSource>(src: &mut S, m: &MatrixMeta, x: &[f64]) -> Result<(Vec<f64>, f64), VerifyError<S::Error>> {
    let mut y = vec![0.0; m.n_rows as usize];
    let mut ss = 0.0;
    for id in m.blocks() {
        let blk = read(src, m, id.i, id.j)?;
        ss += blk.sum_sq();
        let (r0, c0) = (m.row_offset(id.i) as usize, m.col_offset(id.j) as usize);
        for c in 0..blk.cols {
            let xc = x[c0 + c];
            let col = &blk.data[c * blk.rows..(c + 1) * blk.rows];
            for (yr, v) in y[r0..r0 + blk.rows].iter_mut().zip(col) {
                *yr += v * xc;
            }
        }
    }
    Ok((y, ss))
}

/// The pass mark for the factorisation residuals, `1e-13 · n` (the
/// acceptance criterion of the Cholesky/LU issue). Compare with
/// `res <= residual_bound(n)`: a NaN residual then fails.
pub fn residual_bound(n: u64) -> f64 {
    1e-13 * n as f64
}

/// Cholesky residual `‖A − L·Lᵀ‖_F / ‖A‖_F` (NaN if L holds NaN), block by block (three blocks in
/// memory; reads O(p³) blocks). `A` is taken as symmetric: only its lower
/// blocks are read, and off-diagonal blocks count twice.
pub fn cholesky_residual<S: BlockSource>(src: &mut S, a: &MatrixMeta, l: &MatrixMeta) -> Result<f64, VerifyError<S::Error>> {
    if a.n_rows != a.n_cols || (l.n_rows, l.n_cols, l.block) != (a.n_rows, a.n_cols, a.block) {
        return Err(VerifyError::Shape(format!("A {}x{} b={}, L {}x{} b={}", a.n_rows, a.n_cols, a.block, l.n_rows, l.n_cols, l.block)));
    }
    let p = a.block_rows();
    let (mut num, mut den) = (0.0, 0.0);
    for j in 0..p {
        for i in j..p {
            let mut r = read(src, a, i, j)?;
            let w = if i == j { 1.0 } else { 2.0 };
            den += w * r.sum_sq();
            for k in 0..=j {
                let lik = read(src, l, i, k)?;
                let ljk = read(src, l, j, k)?;
                kernels::gemm(-1.0, &lik, false, &ljk, true, 1.0, &mut r);
            }
            num += w * r.sum_sq();
        }
    }
    Ok(if den > 0.0 { (num / den).sqrt() } else { num.sqrt() })
}

/// LU residual `‖P·A − L·U‖_F / ‖A‖_F` with `L` unit lower and `U` upper
/// packed in `lu`; `perm[r]` is the row of A that is row r of P·A (identity
/// when `None`). Holds one block column of A (n×b) plus three blocks.
pub fn lu_residual<S: BlockSource>(
    src: &mut S,
    a: &MatrixMeta,
    lu: &MatrixMeta,
    perm: Option<&[u64]>,
) -> Result<f64, VerifyError<S::Error>> {
    let n = a.n_rows as usize;
    if a.n_rows != a.n_cols || (lu.n_rows, lu.n_cols, lu.block) != (a.n_rows, a.n_cols, a.block) {
        return Err(VerifyError::Shape(format!(
            "A {}x{} b={}, LU {}x{} b={}",
            a.n_rows, a.n_cols, a.block, lu.n_rows, lu.n_cols, lu.block
        )));
    }
    if let Some(p) = perm {
        if p.len() != n || p.iter().any(|&r| r as usize >= n) {
            return Err(VerifyError::Shape(format!("permutation of length {} for n={n}", p.len())));
        }
    }
    let p = a.block_rows();
    let (mut num, mut den) = (0.0, 0.0);
    for jb in 0..p {
        // The block column of A, gathered so P can pick rows from any block.
        let mut col = Block::zeros(n, a.block_shape(0, jb).1);
        for ib in 0..p {
            let blk = read(src, a, ib, jb)?;
            den += blk.sum_sq();
            let r0 = a.row_offset(ib) as usize;
            for c in 0..blk.cols {
                for r in 0..blk.rows {
                    col.set(r0 + r, c, blk.get(r, c));
                }
            }
        }
        for ib in 0..p {
            let (rows, cols) = a.block_shape(ib, jb);
            let r0 = a.row_offset(ib) as usize;
            let mut r = Block::zeros(rows, cols);
            for c in 0..cols {
                for rr in 0..rows {
                    let g = r0 + rr;
                    let src_row = perm.map_or(g, |pp| pp[g] as usize);
                    r.set(rr, c, col.get(src_row, c));
                }
            }
            for k in 0..=ib.min(jb) {
                let mut lk = read(src, lu, ib, k)?;
                let mut uk = read(src, lu, k, jb)?;
                if k == ib {
                    unit_lower(&mut lk);
                }
                if k == jb {
                    upper(&mut uk);
                }
                kernels::gemm(-1.0, &lk, false, &uk, false, 1.0, &mut r);
            }
            num += r.sum_sq();
        }
    }
    Ok(if den > 0.0 { (num / den).sqrt() } else { num.sqrt() })
}

/// Keeps the strict lower triangle and puts ones on the diagonal.
pub(crate) fn unit_lower(b: &mut Block) {
    for c in 0..b.cols {
        for r in 0..b.rows.min(c + 1) {
            b.set(r, c, if r == c { 1.0 } else { 0.0 });
        }
    }
}

/// Keeps the upper triangle (diagonal included).
pub(crate) fn upper(b: &mut Block) {
    for c in 0..b.cols {
        for r in c + 1..b.rows {
            b.set(r, c, 0.0);
        }
    }
}
