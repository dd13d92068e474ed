//! The seam between an application task and the store.
//!
//! The slave implements [`TaskCtx`] over the store's client library; tests use
//! [`crate::mem::MemCtx`]. Every call runs inside the task's top-level atomic
//! action: nothing a task writes or enqueues is visible to anyone else until
//! the slave commits, and an abort drops all of it.

use crate::block::{Block, BlockId};
use std::error::Error;
use std::time::Duration;

/// What a task may do to the store, all inside one atomic action.
pub trait TaskCtx {
    /// The job the task belongs to.
    fn job(&self) -> uuid::Uuid;

    /// Reads a block under a read lock.
    fn read_block(&mut self, id: BlockId) -> Result<Block, CtxError>;

    /// A hint: the task will read these blocks next, in this order, with
    /// [`TaskCtx::read_block`]. The slave may take their read locks and start
    /// streaming them so that transfer overlaps compute (it decides how many
    /// to buffer). Only blocks that already exist are listed (never a block
    /// another task may still be writing). The default ignores the hint.
    fn prefetch(&mut self, ids: &[BlockId]) -> Result<(), CtxError> {
        let _ = ids;
        Ok(())
    }

    /// Reads a block that the task will then overwrite in place (the LU
    /// steps). Implement it with a *write* lock, so the later
    /// [`TaskCtx::write_block`] needs no upgrade. The default falls back to
    /// [`TaskCtx::read_block`]; then the store must let an action upgrade its
    /// own read lock to overwrite when it is the only holder.
    fn read_block_for_update(&mut self, id: BlockId) -> Result<Block, CtxError> {
        self.read_block(id)
    }

    /// Writes a whole block under an overwrite lock (its old value is never fetched).
    fn write_block(&mut self, id: BlockId, block: &Block) -> Result<(), CtxError>;

    /// [`TaskCtx::write_block`] of a block the task no longer needs: a
    /// store that writes behind the task takes the buffer itself instead
    /// of a copy, so the block is never held twice (a task holding four
    /// blocks and writing one otherwise holds five for a moment, and a
    /// slave's memory is its peak). The default writes a reference.
    fn write_block_owned(&mut self, id: BlockId, block: Block) -> Result<(), CtxError> {
        self.write_block(id, &block)
    }

    /// Reads a small object (flag, counter, pivots) under a read lock;
    /// `None` when it does not exist.
    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError>;

    /// Reads a small object that the task will then write (a counter it
    /// decrements). Implement it with a *write* lock: two tasks that both
    /// read-lock a counter and then upgrade deadlock each other. The default
    /// falls back to [`TaskCtx::read_small`], which is correct but invites
    /// that deadlock (the store detects it and one task retries).
    fn read_small_for_update(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError> {
        self.read_small(key)
    }

    /// [`TaskCtx::read_small_for_update`] of several keys, locked in the
    /// order given: a store answers them in one round trip (a dag task's
    /// dependency releases). The default reads them one by one.
    fn read_smalls_for_update(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, CtxError> {
        keys.iter().map(|k| self.read_small_for_update(k)).collect()
    }

    /// Writes a small object under a write lock.
    fn write_small(&mut self, key: &str, value: &[u8]) -> Result<(), CtxError>;

    /// [`TaskCtx::write_small`] of several objects, in the order given: a
    /// store takes them in one request (a dag task's counters written
    /// back). The default writes them one by one.
    fn write_smalls(&mut self, items: &[(String, Vec<u8>)]) -> Result<(), CtxError> {
        items.iter().try_for_each(|(key, value)| self.write_small(key, value))
    }

    /// Waits until the small object `key` exists, then read-locks it and
    /// returns `true`; returns `false` if it does not appear within `timeout`.
    fn await_flag(&mut self, key: &str, timeout: Duration) -> Result<bool, CtxError>;

    /// Appends a task to a bag; visible when the action commits.
    fn enqueue(&mut self, bag: &str, task: &[u8]) -> Result<(), CtxError>;
}

/// A failure of the store under a task. Opaque to the applications: they
/// only pass it up; the slave decides with [`CtxError::is_retryable`].
#[derive(Debug, thiserror::Error)]
pub enum CtxError {
    /// The store failed; `retryable` says whether aborting the action and
    /// running the task again may succeed (lock timeout, deadlock, orphaned
    /// action, store unreachable) or not (corrupt block, bad request).
    #[error("store error{}: {source}", if *.retryable { " (retryable)" } else { "" })]
    Store {
        /// The store's own error.
        #[source]
        source: Box<dyn Error + Send + Sync>,
        /// Whether a retry may succeed.
        retryable: bool,
    },
    /// A block or object the task needs does not exist.
    #[error("not found: {what}")]
    NotFound {
        /// What was missing (a block id or a key).
        what: String,
    },
}

impl CtxError {
    /// Whether aborting and running the task again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CtxError::Store { retryable, .. } => *retryable,
            CtxError::NotFound { .. } => false,
        }
    }
}
