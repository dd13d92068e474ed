//! What can go wrong with the cluster, one variant per thing a user fixes
//! differently. librados answers negative errnos; they are kept (`errno`)
//! and shown as the OS's text.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

fn os(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

#[derive(Debug, thiserror::Error)]
pub enum RadosError {
    #[error("cannot use Ceph configuration {}: {}", conf.display(), os(*errno))]
    Config { conf: PathBuf, errno: i32 },
    #[error("Ceph option {option} = {value} refused: {}", os(*errno))]
    Option { option: String, value: String, errno: i32 },
    #[error("cannot reach the monitors of the Ceph cluster of {} within {timeout:?}: are they running and reachable?", conf.display())]
    Unreachable { conf: PathBuf, timeout: Duration },
    #[error("the Ceph cluster of {} refused client.{user}'s key: {}", conf.display(), os(*errno))]
    Auth { conf: PathBuf, user: String, errno: i32 },
    #[error("cannot connect to the Ceph cluster of {}: {}", conf.display(), os(*errno))]
    Connect { conf: PathBuf, errno: i32 },
    #[error("no pool {pool} in the Ceph cluster (create it: ceph osd pool create {pool})")]
    NoPool { pool: String },
    #[error("object {object} of pool {pool} does not exist")]
    NotFound { pool: String, object: String },
    /// `EDQUOT`: the pool's quota is met; `ENOSPC`: the cluster is past
    /// its full ratio.
    #[error("{op} of object {object} refused: pool {pool} or its Ceph cluster is full ({})", os(*errno))]
    Full { op: &'static str, pool: String, object: String, errno: i32 },
    #[error("{op} of object {object} in pool {pool} timed out after {timeout:?}: the OSDs holding it are down or unreachable")]
    Timeout { op: &'static str, pool: String, object: String, timeout: Duration },
    #[error("{op} of object {object} in pool {pool} failed: {}", os(*errno))]
    Io { op: &'static str, pool: String, object: String, errno: i32 },
    #[error("object {object} of pool {pool} is corrupt: {why}")]
    Corrupt { pool: String, object: String, why: String },
    #[error("name {0:?} holds a NUL byte")]
    Name(String),
}

impl RadosError {
    /// Whether the error says the data could not be reached now (and a
    /// retry later may work), as against refused or damaged.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, RadosError::Unreachable { .. } | RadosError::Timeout { .. })
    }
}
