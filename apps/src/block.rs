//! Matrices as grids of blocks, and the block payload itself.
//!
//! A matrix of `n_rows × n_cols` with block size `b` is cut into
//! `ceil(n_rows/b) × ceil(n_cols/b)` blocks; the last block row and column are
//! smaller when `b` does not divide the size. Each block is stored
//! column-major (LAPACK order) so kernels run on it without a copy.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identity of a matrix object in the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct MatrixId(pub uuid::Uuid);

impl fmt::Display for MatrixId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One block of a matrix: block row `i`, block column `j`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct BlockId {
    /// The matrix the block belongs to.
    pub matrix: MatrixId,
    /// Block row.
    pub i: u32,
    /// Block column.
    pub j: u32,
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{},{}]", self.matrix, self.i, self.j)
    }
}

/// Shape and blocking of a matrix object.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct MatrixMeta {
    /// Identity of the matrix.
    pub id: MatrixId,
    /// Human name (as given to `master matrix create`).
    pub name: String,
    /// Number of rows.
    pub n_rows: u64,
    /// Number of columns.
    pub n_cols: u64,
    /// Block size `b`: blocks are `b × b` except at the bottom and right edges.
    pub block: u32,
}

impl MatrixMeta {
    /// A new matrix description with a fresh random id.
    pub fn new(name: impl Into<String>, n_rows: u64, n_cols: u64, block: u32) -> Self {
        MatrixMeta { id: MatrixId(uuid::Uuid::new_v4()), name: name.into(), n_rows, n_cols, block }
    }

    /// Number of block rows (`ceil(n_rows / b)`; 0 when `b` is 0).
    pub fn block_rows(&self) -> u32 {
        div_ceil(self.n_rows, self.block)
    }

    /// Number of block columns (`ceil(n_cols / b)`; 0 when `b` is 0).
    pub fn block_cols(&self) -> u32 {
        div_ceil(self.n_cols, self.block)
    }

    /// `(rows, cols)` of block `(i, j)`; edge blocks are smaller.
    /// Outside the grid the shape is `(0, 0)`.
    pub fn block_shape(&self, i: u32, j: u32) -> (usize, usize) {
        if i >= self.block_rows() || j >= self.block_cols() {
            return (0, 0);
        }
        (extent(self.n_rows, self.block, i), extent(self.n_cols, self.block, j))
    }

    /// Whether `(i, j)` lies inside the block grid.
    pub fn contains(&self, i: u32, j: u32) -> bool {
        i < self.block_rows() && j < self.block_cols()
    }

    /// The id of block `(i, j)` of this matrix.
    pub fn block_id(&self, i: u32, j: u32) -> BlockId {
        BlockId { matrix: self.id, i, j }
    }

    /// Every block of the matrix, column by column (the order a column-major
    /// export streams them in).
    pub fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        let (p, q) = (self.block_rows(), self.block_cols());
        (0..q).flat_map(move |j| (0..p).map(move |i| self.block_id(i, j)))
    }

    /// Global index of the first row of block row `i`.
    pub fn row_offset(&self, i: u32) -> u64 {
        u64::from(i) * u64::from(self.block)
    }

    /// Global index of the first column of block column `j`.
    pub fn col_offset(&self, j: u32) -> u64 {
        u64::from(j) * u64::from(self.block)
    }
}

fn div_ceil(n: u64, b: u32) -> u32 {
    if b == 0 {
        return 0;
    }
    let b = u64::from(b);
    u32::try_from(n.div_ceil(b)).unwrap_or(u32::MAX)
}

fn extent(n: u64, b: u32, i: u32) -> usize {
    let start = u64::from(i) * u64::from(b);
    (n.saturating_sub(start)).min(u64::from(b)) as usize
}

/// A dense block, column-major: element `(r, c)` is `data[r + c * rows]`.
#[derive(Clone, PartialEq, Debug)]
pub struct Block {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// `rows * cols` values, column-major.
    pub data: Vec<f64>,
}

/// A byte payload that is not a whole number of f64 for the expected shape.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("block payload of {len} bytes does not hold {rows}x{cols} f64 values")]
pub struct BlockBytesError {
    /// Length of the payload given.
    pub len: usize,
    /// Expected rows.
    pub rows: usize,
    /// Expected columns.
    pub cols: usize,
}

impl Block {
    /// A block of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Block { rows, cols, data: vec![0.0; rows * cols] }
    }

    /// Element `(r, c)`.
    #[inline]
    pub fn get(&self, r: usize, c: usize) -> f64 {
        self.data[r + c * self.rows]
    }

    /// Sets element `(r, c)`.
    #[inline]
    pub fn set(&mut self, r: usize, c: usize, v: f64) {
        self.data[r + c * self.rows] = v;
    }

    /// The transpose, as a new block.
    pub fn transposed(&self) -> Block {
        let mut t = Block::zeros(self.cols, self.rows);
        for c in 0..self.cols {
            for r in 0..self.rows {
                t.set(c, r, self.get(r, c));
            }
        }
        t
    }

    /// Sum of squares of the elements (for Frobenius norms computed block by block).
    pub fn sum_sq(&self) -> f64 {
        self.data.iter().map(|x| x * x).sum()
    }

    /// The payload: `rows * cols` little-endian f64, column-major, nothing else
    /// (the store adds its own header and checksum).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() * 8);
        for x in &self.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// The same payload as [`Block::to_bytes`], without a copy on
    /// little-endian machines (for writing multi-MiB blocks to the wire).
    pub fn as_le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        #[cfg(target_endian = "little")]
        {
            // SAFETY: u8 has alignment 1 and every byte of an f64 is
            // initialised; the slice covers exactly the Vec's elements and
            // borrows it, so it cannot outlive or alias a mutation.
            let bytes = unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.data.len() * 8) };
            std::borrow::Cow::Borrowed(bytes)
        }
        #[cfg(not(target_endian = "little"))]
        {
            std::borrow::Cow::Owned(self.to_bytes())
        }
    }

    /// Decodes a payload written by [`Block::to_bytes`]; the shape comes from
    /// the matrix's [`MatrixMeta::block_shape`].
    pub fn from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Block, BlockBytesError> {
        if Some(bytes.len()) != rows.checked_mul(cols).and_then(|n| n.checked_mul(8)) {
            return Err(BlockBytesError { len: bytes.len(), rows, cols });
        }
        let data = bytes.chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect();
        Ok(Block { rows, cols, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_blocks_are_smaller() {
        let m = MatrixMeta::new("a", 257, 130, 64);
        assert_eq!((m.block_rows(), m.block_cols()), (5, 3));
        assert_eq!(m.block_shape(4, 2), (1, 2));
        assert_eq!(m.block_shape(0, 0), (64, 64));
        assert_eq!(m.block_shape(5, 0), (0, 0));
        assert_eq!(m.blocks().count(), 15);
        let m = MatrixMeta::new("a", 256, 256, 64);
        assert_eq!(m.block_shape(3, 3), (64, 64));
        assert_eq!(m.block_rows(), 4);
    }

    #[test]
    fn bytes_round_trip() {
        let b = Block { rows: 2, cols: 3, data: vec![1.0, -2.5, 3.0, 0.0, f64::MIN_POSITIVE, 7.0] };
        let bytes = b.to_bytes();
        assert_eq!(bytes.len(), 48);
        assert_eq!(&*b.as_le_bytes(), bytes.as_slice());
        assert_eq!(Block::from_bytes(2, 3, &bytes).unwrap(), b);
        assert!(Block::from_bytes(3, 3, &bytes).is_err());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn blocks_tile_the_matrix(n in 1u64..600, m in 1u64..600, b in 1u32..130) {
            let meta = MatrixMeta::new("p", n, m, b);
            let mut rows = 0u64;
            for i in 0..meta.block_rows() {
                let (r, c) = meta.block_shape(i, 0);
                prop_assert!(r >= 1 && r <= b as usize && c >= 1);
                rows += r as u64;
            }
            prop_assert_eq!(rows, n);
            let cols: u64 = (0..meta.block_cols()).map(|j| meta.block_shape(0, j).1 as u64).sum();
            prop_assert_eq!(cols, m);
            prop_assert_eq!(meta.blocks().count() as u64, u64::from(meta.block_rows()) * u64::from(meta.block_cols()));
        }

        #[test]
        fn payload_round_trips(rows in 0usize..9, cols in 0usize..9, seed in any::<u64>()) {
            let data: Vec<f64> = (0..rows * cols).map(|k| f64::from_bits(seed.rotate_left(k as u32) ^ k as u64)).collect();
            let b = Block { rows, cols, data };
            let back = Block::from_bytes(rows, cols, &b.to_bytes()).unwrap();
            prop_assert_eq!(back.to_bytes(), b.to_bytes());
        }
    }
}
