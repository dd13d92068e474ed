//! `apps::ctx::TaskCtx` over the store: every call is a request inside the
//! task's atomic action. Runs on a blocking thread (the kernels are long
//! BLAS calls) and drives the async client with `Handle::block_on`.

use std::time::{Duration, Instant};

use apps::block::{Block, BlockId};
use apps::ctx::{CtxError, TaskCtx};
use store_client::{Action, BlockData, Client, StoreError};
use tokio::runtime::Handle;
use uuid::Uuid;

pub(crate) struct StoreCtx<'a> {
    pub(crate) rt: Handle,
    pub(crate) client: &'a Client,
    pub(crate) action: &'a Action,
    pub(crate) job: Uuid,
}

pub(crate) fn ctx_error(e: StoreError) -> CtxError {
    match e {
        StoreError::NotFound { what } => CtxError::NotFound { what },
        e => {
            let retryable = e.is_retryable();
            CtxError::Store { source: Box::new(e), retryable }
        }
    }
}

impl TaskCtx for StoreCtx<'_> {
    fn job(&self) -> Uuid {
        self.job
    }

    fn read_block(&mut self, id: BlockId) -> Result<Block, CtxError> {
        let b = self.rt.block_on(self.action.get_block(id.matrix.0, id.i, id.j)).map_err(ctx_error)?;
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn read_block_for_update(&mut self, id: BlockId) -> Result<Block, CtxError> {
        let b = self.rt.block_on(self.action.get_block_for_update(id.matrix.0, id.i, id.j)).map_err(ctx_error)?;
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn write_block(&mut self, id: BlockId, block: &Block) -> Result<(), CtxError> {
        let data = BlockData { rows: block.rows, cols: block.cols, data: block.data.clone() };
        self.rt.block_on(self.action.put_block(id.matrix.0, id.i, id.j, data)).map_err(ctx_error)
    }

    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError> {
        self.rt.block_on(self.action.read_small(key, false)).map_err(ctx_error)
    }

    fn read_small_for_update(&mut self, key: &str) -> Result<Option<Vec<u8>>, CtxError> {
        self.rt.block_on(self.action.read_small(key, true)).map_err(ctx_error)
    }

    fn write_small(&mut self, key: &str, value: &[u8]) -> Result<(), CtxError> {
        self.rt.block_on(self.action.write_small(key, value)).map_err(ctx_error)
    }

    /// Polls the committed state without a lock (a writer holding the flag
    /// would otherwise make us wait on its lock for the whole task), with
    /// back-off; once the flag exists, reads it under a read lock.
    fn await_flag(&mut self, key: &str, timeout: Duration) -> Result<bool, CtxError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            if self.rt.block_on(self.client.peek_small(key)).map_err(ctx_error)?.is_some() {
                return Ok(self.read_small(key)?.is_some());
            }
            if start.elapsed() >= timeout {
                return Ok(false);
            }
            std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    fn enqueue(&mut self, bag: &str, task: &[u8]) -> Result<(), CtxError> {
        self.rt.block_on(self.action.enqueue(bag, task)).map_err(ctx_error)
    }
}
