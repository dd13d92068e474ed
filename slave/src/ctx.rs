//! `apps::ctx::TaskCtx` over the store: every call is a request inside the
//! task's atomic action. Runs on a blocking thread (the kernels are long
//! BLAS calls) and drives the async client with `Handle::block_on`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use apps::block::{Block, BlockId};
use apps::ctx::{CtxError, TaskCtx};
use store_client::{Action, BlockData, Client, StoreError};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// Blocks fetched ahead of the task. One: the slave holds at most four
/// blocks (a matmul's accumulator, the current pair, the next block), the
/// issue's memory bound. A local get (the node passes the version file; the
/// slave reads it) takes about 10 ms for 32 MiB against 300 ms of dgemm per
/// pair, so one block ahead already hides every transfer but the first.
const PREFETCH_BLOCKS: usize = 1;

pub(crate) struct StoreCtx<'a> {
    pub(crate) rt: Handle,
    pub(crate) client: &'a Client,
    pub(crate) action: &'a Action,
    pub(crate) job: Uuid,
    pub(crate) prefetch: Prefetch,
}

/// The task's announced reads ([`TaskCtx::prefetch`]): those not yet
/// started, and up to [`PREFETCH_BLOCKS`] transfers running on the runtime
/// (under the task's own action, so they take the same read locks the task
/// would take a little later).
#[derive(Default)]
pub(crate) struct Prefetch {
    queued: VecDeque<BlockId>,
    running: VecDeque<(BlockId, JoinHandle<Result<BlockData, StoreError>>)>,
}

impl Drop for Prefetch {
    // A task that fails midway must not leave transfers holding memory.
    fn drop(&mut self) {
        for (_, h) in &self.running {
            h.abort();
        }
    }
}

impl StoreCtx<'_> {
    fn top_up(&mut self) {
        while self.prefetch.running.len() < PREFETCH_BLOCKS {
            let Some(id) = self.prefetch.queued.pop_front() else {
                break;
            };
            let reader = self.action.block_reader();
            let h = self.rt.spawn(async move { reader.get_block(id.matrix.0, id.i, id.j).await });
            self.prefetch.running.push_back((id, h));
        }
    }
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
        // A block read out of the announced order (or never announced) is
        // fetched directly; the announced ones keep streaming.
        let b = if let Some(pos) = self.prefetch.running.iter().position(|(r, _)| *r == id) {
            let (_, h) = self.prefetch.running.remove(pos).expect("position is in range");
            self.top_up();
            self.rt
                .block_on(h)
                .map_err(|e| ctx_error(StoreError::StoreUnavailable { what: format!("prefetch task failed: {e}") }))?
                .map_err(ctx_error)?
        } else {
            if let Some(pos) = self.prefetch.queued.iter().position(|q| *q == id) {
                self.prefetch.queued.remove(pos);
            }
            self.rt.block_on(self.action.get_block(id.matrix.0, id.i, id.j)).map_err(ctx_error)?
        };
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn prefetch(&mut self, ids: &[BlockId]) -> Result<(), CtxError> {
        self.prefetch.queued.extend(ids.iter().copied());
        self.top_up();
        Ok(())
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
