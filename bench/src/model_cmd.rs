//! Placeholder: filled in by its owner.

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Reduced run, under a minute.
    #[arg(long)]
    quick: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let _ = args.quick;
    anyhow::bail!("not built yet")
}
