//! Deterministic matrix generation, block by block.
//!
//! Each block is drawn from its own ChaCha stream seeded by `(seed, i, j)`,
//! so any block can be generated alone (inside the store, in any order, on
//! any machine) and the result never depends on the order. Symmetric kinds
//! draw only lower blocks and transpose them for the upper ones, so the two
//! triangles agree exactly.

use crate::block::{Block, MatrixMeta};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// What kind of matrix to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MatrixKind {
    /// Entries uniform in `[-1, 1)`.
    Random,
    /// Symmetric, entries uniform in `[-1, 1)`, plus `n·I`: strictly
    /// diagonally dominant with a positive diagonal, hence positive definite.
    Spd,
    /// Entries uniform in `[-1, 1)` plus `n·I` (`n = max(rows, cols)`):
    /// strictly diagonally dominant, so LU without pivoting is stable.
    DiagDominant,
}

impl std::str::FromStr for MatrixKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(MatrixKind::Random),
            "spd" => Ok(MatrixKind::Spd),
            "diag-dominant" => Ok(MatrixKind::DiagDominant),
            other => Err(format!("unknown matrix kind {other:?} (random, spd, diag-dominant)")),
        }
    }
}

fn stream(seed: u64, i: u32, j: u32) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..12].copy_from_slice(&i.to_le_bytes());
    key[12..16].copy_from_slice(&j.to_le_bytes());
    key[16..24].copy_from_slice(b"apps-gen");
    ChaCha8Rng::from_seed(key)
}

fn raw(seed: u64, i: u32, j: u32, rows: usize, cols: usize) -> Block {
    let mut rng = stream(seed, i, j);
    let data = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
    Block { rows, cols, data }
}

/// Block `(i, j)` of a matrix of the given kind; `(0×0)` outside the grid.
pub fn generate_block(kind: MatrixKind, seed: u64, meta: &MatrixMeta, i: u32, j: u32) -> Block {
    let (rows, cols) = meta.block_shape(i, j);
    let n = meta.n_rows.max(meta.n_cols) as f64;
    let mut blk = match kind {
        MatrixKind::Random | MatrixKind::DiagDominant => raw(seed, i, j, rows, cols),
        MatrixKind::Spd if i > j => raw(seed, i, j, rows, cols),
        MatrixKind::Spd if i < j => {
            let (r, c) = meta.block_shape(j, i);
            raw(seed, j, i, r, c).transposed()
        }
        MatrixKind::Spd => {
            // Diagonal block: keep the lower triangle and mirror it.
            let mut b = raw(seed, i, i, rows, cols);
            for c in 0..cols {
                for r in 0..c.min(rows) {
                    let v = b.get(c, r);
                    b.set(r, c, v);
                }
            }
            b
        }
    };
    if kind != MatrixKind::Random {
        let (r0, c0) = (meta.row_offset(i), meta.col_offset(j));
        for r in 0..rows {
            let g = r0 + r as u64;
            if g >= c0 && g < c0 + cols as u64 {
                let c = (g - c0) as usize;
                let v = blk.get(r, c) + n;
                blk.set(r, c, v);
            }
        }
    }
    blk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spd_blocks_agree_across_the_diagonal() {
        let m = MatrixMeta::new("s", 150, 150, 64);
        for i in 0..m.block_rows() {
            for j in 0..m.block_cols() {
                let b = generate_block(MatrixKind::Spd, 7, &m, i, j);
                let t = generate_block(MatrixKind::Spd, 7, &m, j, i).transposed();
                assert_eq!(b, t, "({i},{j})");
                assert_eq!((b.rows, b.cols), m.block_shape(i, j));
            }
        }
        let d = generate_block(MatrixKind::Spd, 7, &m, 2, 2);
        assert!(d.get(0, 0) > 149.0);
    }

    #[test]
    fn deterministic_and_seed_dependent() {
        let m = MatrixMeta::new("r", 100, 70, 32);
        let a = generate_block(MatrixKind::Random, 1, &m, 1, 2);
        assert_eq!(a, generate_block(MatrixKind::Random, 1, &m, 1, 2));
        assert_ne!(a, generate_block(MatrixKind::Random, 2, &m, 1, 2));
        assert_ne!(a, generate_block(MatrixKind::Random, 1, &m, 2, 1));
    }
}
