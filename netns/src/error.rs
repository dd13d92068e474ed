//! What can go wrong making, shaping, cutting or tearing down a cluster.

use std::io;

/// The one line a test prints when it cannot make namespaces. CI greps for
/// it: a test that skipped did not pass.
pub const SKIP_LINE: &str = "skipped: needs root for network namespaces";

/// Errors of [`Cluster`](crate::Cluster)'s operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This process cannot make network namespaces: not root, no `ip` /
    /// `tc` / `bridge` command, or a kernel without them. Tests skip on it
    /// (`skip_unless_root`); `reason` says which.
    #[error("skipped: needs root for network namespaces")]
    NeedsRoot { reason: String },
    /// A cluster has 1 to [`MAX_HOSTS`](crate::MAX_HOSTS) hosts (one /24
    /// each, host addresses from .10).
    #[error("a cluster has 1 to {max} hosts, not {hosts}")]
    HostCount { hosts: usize, max: usize },
    /// Every subnet index is held by a live cluster.
    #[error("all {n} cluster subnets of 10.77.0.0/16 are held by live clusters")]
    NoFreeSubnet { n: usize },
    /// An `ip`, `tc` or `bridge` command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io { what: what.into(), source }
    }

    /// True for [`Error::NeedsRoot`]: the caller should skip, not fail.
    pub fn is_needs_root(&self) -> bool {
        matches!(self, Error::NeedsRoot { .. })
    }
}

/// A rate or delay that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{text}`: {why}")]
pub struct ParseError {
    pub what: &'static str,
    pub text: String,
    pub why: &'static str,
}
