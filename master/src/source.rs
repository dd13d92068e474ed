//! Reading the store from synchronous code (apps' checks, exports): a
//! `BlockSource` over the client, driven with `Handle::block_on` on a
//! blocking thread.

use apps::block::{Block, BlockId, MatrixId, MatrixMeta};
use apps::verify::BlockSource;
use store_client::{Client, MatrixInfo, StoreError};
use tokio::runtime::Handle;

pub(crate) struct StoreSource {
    pub(crate) rt: Handle,
    pub(crate) client: Client,
}

impl BlockSource for StoreSource {
    type Error = StoreError;

    fn read_block(&mut self, id: BlockId) -> Result<Block, StoreError> {
        let b = self.rt.block_on(self.client.read_block_committed(id.matrix.0, id.i, id.j))?;
        Ok(Block { rows: b.rows, cols: b.cols, data: b.data })
    }

    fn read_small(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.rt.block_on(self.client.peek_small(key))
    }
}

pub(crate) fn meta(m: &MatrixInfo) -> MatrixMeta {
    MatrixMeta { id: MatrixId(m.id), name: m.name.clone(), n_rows: m.n_rows, n_cols: m.n_cols, block: m.block }
}

/// Runs `f` with a `StoreSource` on a blocking thread.
pub(crate) async fn with_source<T: Send + 'static>(
    client: &Client,
    f: impl FnOnce(&mut StoreSource) -> T + Send + 'static,
) -> anyhow::Result<T> {
    let mut src = StoreSource { rt: Handle::current(), client: client.clone() };
    Ok(tokio::task::spawn_blocking(move || f(&mut src)).await?)
}
