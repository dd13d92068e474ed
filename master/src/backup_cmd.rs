//! `master backup DIR`: a consistent copy of a serving store node, taken
//! by the node (a RocksDB checkpoint and the block versions it names,
//! `store/src/backup.rs`) while jobs run. `master serve --data DIR`
//! restores it.

use anyhow::Context;

use crate::out::outln;
use crate::store_args::StoreArgs;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A directory on the store node's machine that does not exist yet
    /// (its parent does). On the store's filesystem the block files are
    /// hard-linked (no bytes copied), elsewhere copied. A relative path is
    /// taken from this command's working directory.
    dir: std::path::PathBuf,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let dir = std::path::absolute(&args.dir).with_context(|| format!("backup directory {}", args.dir.display()))?;
    let dir = dir.to_str().with_context(|| format!("backup directory {}: not UTF-8", dir.display()))?;
    let client = args.store.connect().await?;
    let b = client.backup(dir).await.with_context(|| format!("backing up the store at {} into {dir}", client.addr()))?;
    if args.json {
        let v = serde_json::json!({
            "dir": dir,
            "versions": b.n_versions,
            "bytes_linked": b.bytes_linked,
            "bytes_copied": b.bytes_copied,
            "db_bytes": b.db_bytes,
            "seconds": b.seconds,
        });
        outln!("{v}");
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    outln!("backup of {} in {dir}: {:.2} s", client.addr(), b.seconds);
    outln!("  block versions  {} ({:.2} GiB linked, {:.2} GiB copied)", b.n_versions, gib(b.bytes_linked), gib(b.bytes_copied));
    outln!("  RocksDB         {:.1} MiB", b.db_bytes as f64 / (1u64 << 20) as f64);
    outln!("restore: master serve --data {dir}");
    Ok(())
}
