//! The one error type of the store's API, and its round trip through a
//! gRPC status: the node encodes an `ErrorDetail` into the status details,
//! the client decodes it back into the same variant.

use prost::Message;
use tonic::{Code, Status};

use crate::proto::{ErrorDetail, ErrorKind};

/// Everything that can go wrong talking to a store node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The action was aborted (its session died, it was aborted, or the
    /// node restarted) or has ended: nothing more can happen in it.
    #[error("action {action} was aborted or is no longer running")]
    ActionAborted { action: u64 },
    #[error("action {action} timed out waiting for a lock on {what}")]
    LockTimeout { action: u64, what: String },
    #[error("action {action} would deadlock waiting for {what}")]
    Deadlock { action: u64, what: String },
    #[error("not found: {what}")]
    NotFound { what: String },
    #[error("already exists: {what}")]
    AlreadyExists { what: String },
    /// A stored or transferred value failed its checksum or header check.
    #[error("corrupt: {what}")]
    Corrupt { what: String },
    #[error("invalid argument: {what}")]
    InvalidArgument { what: String },
    /// The request does not fit the action's state (e.g. committing with
    /// nested actions still running, reading an overwrite-locked object).
    #[error("action {action}: {what}")]
    ActionState { action: u64, what: String },
    #[error("the store's disk is full: {what}")]
    StorageFull { what: String },
    #[error("storage error: {what}")]
    Storage { what: String },
    #[error("unauthenticated: {what}")]
    Unauthenticated { what: String },
    /// The session's lease lapsed or the node restarted: open a new one.
    #[error("session {session} has expired")]
    SessionExpired { session: u64 },
    #[error("the store node is shutting down")]
    ShuttingDown,
    /// The node cannot be reached (connection refused, reset, timed out).
    #[error("store node unavailable: {what}")]
    StoreUnavailable { what: String },
    /// Client and node are of different builds: their data-plane wire
    /// versions differ. Retrying cannot help.
    #[error("client and store node are of different builds (data-plane wire version {client} here, {node} at the node): run the same build on both")]
    IncompatibleBuild { client: u16, node: u16 },
}

impl StoreError {
    /// Whether redoing the whole top-level action (after reconnecting, for
    /// `StoreUnavailable` and `SessionExpired`) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::ActionAborted { .. }
                | StoreError::LockTimeout { .. }
                | StoreError::Deadlock { .. }
                | StoreError::SessionExpired { .. }
                | StoreError::ShuttingDown
                | StoreError::StoreUnavailable { .. }
        )
    }

    /// Whether the connection or session must be re-established first.
    pub fn needs_reconnect(&self) -> bool {
        matches!(self, StoreError::SessionExpired { .. } | StoreError::ShuttingDown | StoreError::StoreUnavailable { .. })
    }

    fn parts(&self) -> (Code, ErrorKind, String, u64) {
        use StoreError::*;
        match self {
            ActionAborted { action } => (Code::Aborted, ErrorKind::ActionAborted, String::new(), *action),
            LockTimeout { action, what } => (Code::DeadlineExceeded, ErrorKind::LockTimeout, what.clone(), *action),
            Deadlock { action, what } => (Code::Aborted, ErrorKind::Deadlock, what.clone(), *action),
            NotFound { what } => (Code::NotFound, ErrorKind::NotFound, what.clone(), 0),
            AlreadyExists { what } => (Code::AlreadyExists, ErrorKind::AlreadyExists, what.clone(), 0),
            Corrupt { what } => (Code::DataLoss, ErrorKind::Corrupt, what.clone(), 0),
            InvalidArgument { what } => (Code::InvalidArgument, ErrorKind::InvalidArgument, what.clone(), 0),
            ActionState { action, what } => (Code::FailedPrecondition, ErrorKind::ActionState, what.clone(), *action),
            StorageFull { what } => (Code::ResourceExhausted, ErrorKind::StorageFull, what.clone(), 0),
            Storage { what } => (Code::Internal, ErrorKind::Storage, what.clone(), 0),
            Unauthenticated { what } => (Code::Unauthenticated, ErrorKind::Unauthenticated, what.clone(), 0),
            SessionExpired { session } => (Code::Aborted, ErrorKind::SessionExpired, String::new(), *session),
            ShuttingDown => (Code::Unavailable, ErrorKind::ShuttingDown, String::new(), 0),
            StoreUnavailable { what } => (Code::Unavailable, ErrorKind::Unknown, what.clone(), 0),
            IncompatibleBuild { client, node } => {
                (Code::FailedPrecondition, ErrorKind::IncompatibleBuild, String::new(), (u64::from(*client) << 16) | u64::from(*node))
            }
        }
    }

    /// The status a node answers with.
    pub fn to_status(&self) -> Status {
        let (code, kind, what, id) = self.parts();
        let detail = ErrorDetail { kind: kind as i32, what, id };
        Status::with_details(code, self.to_string(), detail.encode_to_vec().into())
    }

    /// The typed detail alone, as the block data plane carries it.
    pub fn to_detail(&self) -> Vec<u8> {
        let (_, kind, what, id) = self.parts();
        ErrorDetail { kind: kind as i32, what, id }.encode_to_vec()
    }

    /// Rebuilds an error sent by [`StoreError::to_detail`]; bytes that are
    /// not one are a protocol failure, reported as the node being unusable.
    pub fn from_detail(bytes: &[u8]) -> StoreError {
        match ErrorDetail::decode(bytes) {
            Ok(d) => Self::from_parts(d).unwrap_or_else(|what| StoreError::StoreUnavailable { what }),
            Err(e) => StoreError::StoreUnavailable { what: format!("unreadable error detail from the node: {e}") },
        }
    }

    /// Rebuilds the error from a status. A status without our detail came
    /// from the transport (or a foreign server) and is classified by code.
    pub fn from_status(status: &Status) -> StoreError {
        let Ok(d) = ErrorDetail::decode(status.details()) else { return Self::from_transport(status) };
        Self::from_parts(d).unwrap_or_else(|_| Self::from_transport(status))
    }

    /// The variant a detail names; `Err` (with a description) for an
    /// unknown kind, which the caller classifies by its own means.
    fn from_parts(d: ErrorDetail) -> Result<StoreError, String> {
        use StoreError::*;
        let what = d.what;
        let id = d.id;
        Ok(match ErrorKind::try_from(d.kind).unwrap_or(ErrorKind::Unknown) {
            ErrorKind::ActionAborted => ActionAborted { action: id },
            ErrorKind::LockTimeout => LockTimeout { action: id, what },
            ErrorKind::Deadlock => Deadlock { action: id, what },
            ErrorKind::NotFound => NotFound { what },
            ErrorKind::AlreadyExists => AlreadyExists { what },
            ErrorKind::Corrupt => Corrupt { what },
            ErrorKind::InvalidArgument => InvalidArgument { what },
            ErrorKind::ActionState => ActionState { action: id, what },
            ErrorKind::StorageFull => StorageFull { what },
            ErrorKind::Storage => Storage { what },
            ErrorKind::Unauthenticated => Unauthenticated { what },
            ErrorKind::SessionExpired => SessionExpired { session: id },
            ErrorKind::ShuttingDown => ShuttingDown,
            ErrorKind::IncompatibleBuild => IncompatibleBuild { client: (id >> 16) as u16, node: id as u16 },
            ErrorKind::Unknown => return Err(format!("an error of unknown kind {}: {what}", d.kind)),
        })
    }

    fn from_transport(status: &Status) -> StoreError {
        let what = format!("{:?}: {}", status.code(), status.message());
        match status.code() {
            Code::Unauthenticated => StoreError::Unauthenticated { what },
            Code::InvalidArgument | Code::OutOfRange => StoreError::InvalidArgument { what },
            Code::NotFound => StoreError::NotFound { what },
            _ => StoreError::StoreUnavailable { what },
        }
    }
}

impl From<Status> for StoreError {
    fn from(status: Status) -> Self {
        StoreError::from_status(&status)
    }
}

impl From<tonic::transport::Error> for StoreError {
    fn from(e: tonic::transport::Error) -> Self {
        StoreError::StoreUnavailable { what: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_survives_the_status_round_trip() {
        let all = [
            StoreError::ActionAborted { action: 7 },
            StoreError::LockTimeout { action: 7, what: "block".into() },
            StoreError::Deadlock { action: 3, what: "x".into() },
            StoreError::NotFound { what: "matrix A".into() },
            StoreError::AlreadyExists { what: "A".into() },
            StoreError::Corrupt { what: "block (1, 2)".into() },
            StoreError::InvalidArgument { what: "rows".into() },
            StoreError::ActionState { action: 4, what: "children".into() },
            StoreError::StorageFull { what: "ENOSPC".into() },
            StoreError::Storage { what: "io".into() },
            StoreError::Unauthenticated { what: "token".into() },
            StoreError::SessionExpired { session: 9 },
            StoreError::ShuttingDown,
            StoreError::IncompatibleBuild { client: 9, node: 8 },
        ];
        for e in all {
            assert_eq!(StoreError::from_status(&e.to_status()), e);
        }
    }

    #[test]
    fn a_bare_transport_status_is_unavailable() {
        let e = StoreError::from_status(&Status::unavailable("connection refused"));
        assert!(matches!(e, StoreError::StoreUnavailable { .. }));
        assert!(e.is_retryable());
    }
}
