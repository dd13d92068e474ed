//! The `--store` / `--token` pair every client subcommand takes.

use std::time::Duration;

use store_client::Client;

#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StoreArgs {
    /// Address of the store node.
    #[arg(long, env = "STORE_ADDR", default_value = store_client::DEFAULT_STORE_ADDR)]
    pub(crate) store: String,
    /// Shared cluster token, if the store node requires one.
    #[arg(long, env = "STORE_TOKEN")]
    pub(crate) token: Option<String>,
    /// Seconds to keep retrying while the store node is unreachable.
    #[arg(long, default_value_t = 30)]
    pub(crate) patience_s: u64,
}

impl StoreArgs {
    pub(crate) async fn connect(&self) -> anyhow::Result<Client> {
        Client::connect_retrying(&self.store, self.token.as_deref(), Some(Duration::from_secs(self.patience_s)))
            .await
            .map_err(|e| anyhow::anyhow!("{e} (is `master serve` running at {}?)", self.store))
    }
}
