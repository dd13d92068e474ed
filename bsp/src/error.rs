//! Errors of the transport. One enum, with a classification method, because
//! every operation can meet the same group-level failures (a lost peer, an
//! abort) and callers only need to tell "retry the superstep elsewhere" from
//! "this program is wrong".

use std::io;

/// Everything that can go wrong in a BSP group.
#[derive(Debug, thiserror::Error)]
pub enum BspError {
    /// A peer's connection closed, failed, or went silent past the peer
    /// timeout. The group cannot continue; every survivor sees this.
    #[error("peer {pid} lost: {reason}")]
    PeerLost { pid: usize, reason: String },
    /// Some process called `abort`.
    #[error("process {pid} aborted the group: {message}")]
    Aborted { pid: usize, message: String },
    /// A peer (or a foreign client) sent bytes that are not our protocol.
    #[error("protocol error from {from}: {detail}")]
    Protocol { from: String, detail: String },
    /// The shared token did not match.
    #[error("authentication failed for {from}")]
    Auth { from: String },
    /// The group could not be formed in time.
    #[error("group setup failed: {0}")]
    Setup(String),
    /// A DRMA operation named an area that is not registered (yet).
    #[error("area {area} is not registered on process {pid}")]
    NotRegistered { pid: usize, area: u32 },
    /// A DRMA operation ran past the end of an area.
    #[error("access [{offset}, {offset}+{len}) outside area {area} of {size} bytes on process {pid}")]
    OutOfBounds { pid: usize, area: u32, offset: u64, len: u64, size: u64 },
    /// A process id outside `0..nprocs`.
    #[error("process id {pid} out of range (nprocs = {nprocs})")]
    BadPid { pid: usize, nprocs: usize },
    /// A tag whose length differs from the current tag size.
    #[error("tag of {got} bytes, tag size is {want}")]
    BadTag { got: usize, want: usize },
    /// A bad configuration (missing token, bad environment).
    #[error("configuration: {0}")]
    Config(String),
    /// The progress thread has stopped (after an earlier failure).
    #[error("transport closed")]
    Closed,
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

impl BspError {
    /// True when the failure is the group's (a peer died, someone aborted, the
    /// network failed) rather than a bug in this program: the layer above may
    /// re-form a group and retry the work.
    pub fn is_retryable(&self) -> bool {
        matches!(self, BspError::PeerLost { .. } | BspError::Aborted { .. } | BspError::Closed | BspError::Io(_) | BspError::Setup(_))
    }
}

pub type Result<T, E = BspError> = std::result::Result<T, E>;
