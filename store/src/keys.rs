//! What the lock manager locks and what an action holds tentatively.

use std::fmt;

use uuid::Uuid;

/// A block: `(matrix, i, j)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BlockKey {
    pub(crate) matrix: Uuid,
    pub(crate) i: u32,
    pub(crate) j: u32,
}

impl BlockKey {
    /// The RocksDB key of the block's current-version pointer.
    pub(crate) fn pointer(&self) -> Vec<u8> {
        [&b"B"[..], self.matrix.as_bytes(), &self.i.to_be_bytes(), &self.j.to_be_bytes()].concat()
    }
}

impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block ({}, {}) of matrix {}", self.i, self.j, self.matrix)
    }
}

/// Anything an action can lock.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ObjKey {
    Small(String),
    Block(BlockKey),
}

impl fmt::Debug for ObjKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjKey::Small(k) => write!(f, "object {k:?}"),
            ObjKey::Block(b) => b.fmt(f),
        }
    }
}

/// The new state of an object, kept with the action until top-level commit.
/// Blocks are staged in RocksDB already; the action only holds the version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tentative {
    Small(Vec<u8>),
    Deleted,
    Block(Uuid),
}

impl Tentative {
    pub(crate) fn staged_version(&self) -> Option<Uuid> {
        match self {
            Tentative::Block(v) => Some(*v),
            _ => None,
        }
    }
}
