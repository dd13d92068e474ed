//! Everything the CLI prints goes through here, so that a reader that goes
//! away (`master jobs | head -1`) ends the process quietly instead of
//! `println!`'s panic (exit 101).
//!
//! On a broken pipe the process exits at once with status 141 (128 +
//! SIGPIPE), as `cat` and `ls` end when they are killed by SIGPIPE: a
//! shell without `pipefail` reports the reader's status, one with it sees
//! that this side's output was cut short. The default disposition of
//! SIGPIPE itself is not restored: the clients write to pipes and sockets
//! of the store node, whose closing must be an error, not a death.

use std::io::Write;

/// Exit status when stdout or stderr was closed under us.
pub(crate) const BROKEN_PIPE_EXIT: i32 = 141;

/// Writes `text` to stdout (no newline added) and flushes it.
pub(crate) fn stdout(text: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(text).and_then(|()| out.flush()) {
        ended(e);
    }
}

/// Writes `text` to stderr (no newline added). A stderr that is gone is
/// ignored unless it is a broken pipe, which ends the process as on stdout.
pub(crate) fn stderr(text: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    if let Err(e) = err.write_fmt(text) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
    }
}

fn ended(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_EXIT);
    }
    // Any other failure to write the answer (a full disk under a
    // redirection) is said on stderr, and the command fails.
    let _ = writeln!(std::io::stderr(), "error: writing to stdout: {e}");
    std::process::exit(1);
}

/// `println!` that ends the process quietly on a broken pipe.
macro_rules! outln {
    () => { $crate::out::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that ends the process quietly on a broken pipe.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, outln};
