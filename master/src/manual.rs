//! `master completions SHELL` and `master man --out DIR`: shell
//! completions and man pages generated from the command line's own
//! definition, so they never drift from `--help`.

use std::path::PathBuf;

use crate::out::outln;

#[derive(clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for; e.g. `master completions bash >
    /// /etc/bash_completion.d/master`.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub(crate) struct ManArgs {
    /// Directory to write the pages into (created if missing): master.1
    /// and one page per subcommand (master-serve.1, …).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Writes the completion script for `cmd` to stdout (through `out.rs`,
/// so a closed stdout ends quietly with 141, as everywhere).
pub(crate) fn completions(args: CompletionsArgs, mut cmd: clap::Command) {
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut script);
    crate::out::stdout(format_args!("{}", String::from_utf8_lossy(&script)));
}

/// Writes a man page per (visible) command into `args.out`.
pub(crate) fn man(args: ManArgs, cmd: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    clap_mangen::generate_to(cmd, &args.out)?;
    outln!("man pages written to {} (try `man -l {}/master.1`)", args.out.display(), args.out.display());
    Ok(())
}
