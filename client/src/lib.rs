//! The store node's wire protocol and the client library that slaves, the
//! master CLI and benchmarks use.
//!
//! Errors are one enum, [`StoreError`], that survives the wire: the node
//! puts a typed detail in every gRPC status and the client rebuilds the same
//! variant, so a slave can tell `LockTimeout`, `Deadlock`, `ActionAborted`,
//! `NotFound`, `Corrupt` and `StoreUnavailable` apart.
//!
//! ```no_run
//! # async fn demo() -> Result<(), store_client::StoreError> {
//! use std::time::Duration;
//! use store_client::{Client, Dequeue};
//! let client = Client::connect("127.0.0.1:7070", None).await?;
//! let session = client.open_session("worker-1").await?;
//! let action = session.begin().await?;
//! if let Dequeue::Task(task) = action.dequeue("work", Duration::from_secs(1)).await? {
//!     action.write_small(&format!("done/{}", task.seq), b"1").await?;
//! }
//! action.commit().await?; // durable when this returns
//! # Ok(()) }
//! ```

pub mod block;
pub mod cache;
mod client;
mod connect;
pub mod dataplane;
mod error;
mod metrics;
pub mod objects;
mod tls;

/// Generated protobuf types and gRPC stubs; the node's RPC layer uses them
/// directly, everyone else goes through [`Client`].
#[allow(unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("store.v1");
}

pub use client::{
    Action, BagStats, BlockData, BlockReader, BlockWriter, Client, Dequeue, MatrixInfo, NodeBackup, NodeStats, Session, SessionInfo, Task,
    CHUNK_BYTES, MAX_FRAME_BYTES, MAX_MESSAGE_BYTES,
};
#[cfg(feature = "cli")]
pub use connect::{config_path, load_config_file, ConnectArgs};
pub use connect::{host_identity, BlocksOver, ConnectOptions};
pub use error::StoreError;
pub use metrics::NodeMetrics;
pub use tls::{ClientTls, ServerTls};

/// The default address of a store node.
pub const DEFAULT_STORE_ADDR: &str = "127.0.0.1:7070";
