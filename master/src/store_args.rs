//! The connection flags every client subcommand takes.

use std::time::Duration;

use store_client::{Client, ConnectArgs, StoreError};

#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StoreArgs {
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// Seconds to keep retrying while the store node is unreachable.
    #[arg(long, default_value_t = 30)]
    pub(crate) patience_s: u64,
}

impl StoreArgs {
    pub(crate) async fn connect(&self) -> anyhow::Result<Client> {
        let options = self.connect.options()?;
        let addr = &self.connect.store;
        Client::connect_with_retrying(addr, &options, Some(Duration::from_secs(self.patience_s))).await.map_err(|e| match e {
            StoreError::StoreUnavailable { .. } => {
                anyhow::anyhow!("{e} (tried for {} s)", self.patience_s)
            }
            e => e.into(),
        })
    }
}
