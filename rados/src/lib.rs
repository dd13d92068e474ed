//! Block versions as objects of a Ceph RADOS pool (issue 48).
//!
//! [`Cluster`] and [`Pool`] bind the librados calls the store needs
//! (connect, whole-object write and read, stat, remove, listing); every
//! failure is a typed [`RadosError`]. [`VersionObjects`] is the block
//! versions' layer over a pool: one immutable object per version, named by
//! the version's id under a prefix, read back with the block format's
//! checksum checked, and swept against the ids a store still names (what
//! `BlockFiles::sweep` does for version files).
//!
//! Everything that touches librados is behind the `rados` feature, so a
//! workspace build without Ceph installed links nothing of it.

#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "rados")]
mod cluster;
mod error;
#[cfg(feature = "rados")]
mod ffi;
#[cfg(feature = "rados")]
mod objects;
#[cfg(feature = "rados")]
mod versions;

#[cfg(feature = "cli")]
pub use cli::CephArgs;
#[cfg(feature = "rados")]
pub use cluster::{Cluster, ClusterOptions, ClusterSpace, Pool};
pub use error::RadosError;
#[cfg(feature = "rados")]
pub use objects::{connector, store_error};
#[cfg(feature = "rados")]
pub use versions::{Swept, VersionObjects};
