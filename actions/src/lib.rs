//! Nested atomic actions and their lock manager, with no I/O inside.
//!
//! The store node owns one [`Manager`] behind a mutex and wires it to RocksDB
//! and to the RPC layer; this crate only decides. A lock request that
//! conflicts returns [`Lock::Wait`] (the caller waits for a wake-up and asks
//! again) or fails at once with [`ActionError::Deadlock`]; releases return the
//! actions to wake. Tentative state (`V`, whatever the store keeps for a
//! written object) stays with the action until top-level commit.
//!
//! Semantics (Moss-style nesting, `003…` §2.3, §4.4):
//! - read locks are shared; write and overwrite locks are exclusive; a lock
//!   held by an ancestor never conflicts with its descendants;
//! - a nested commit passes locks and tentative state to the parent; a nested
//!   abort drops the tentative state and releases the locks the action took;
//! - only a top-level commit makes state durable ([`Manager::prepare_commit`]
//!   hands the write set to the store, [`Manager::finish_commit`] releases);
//! - an aborted action is fenced: any later request naming it fails with
//!   [`ActionError::Aborted`].
//!
//! ```
//! use actions::{Manager, LockMode, Lock, SessionId, Lookup};
//! let mut m: Manager<&str, i32> = Manager::new();
//! let s = SessionId(1);
//! let top = m.begin(s, None).unwrap();
//! let child = m.begin(s, Some(top)).unwrap();
//! assert_eq!(m.lock(child, "x", LockMode::Write).unwrap(), Lock::Granted);
//! m.set_tentative(child, "x", 7).unwrap();
//! m.commit_nested(child).unwrap();
//! assert!(matches!(m.lookup(top, &"x").unwrap(), Lookup::Tentative(&7)));
//! let writes = m.prepare_commit(top).unwrap();
//! assert_eq!(writes.writes, vec![("x", 7)]);
//! m.finish_commit(top);
//! ```

mod deadlock;
mod error;
mod ids;
mod manager;

pub use error::ActionError;
pub use ids::{ActionId, SessionId};
pub use manager::{Aborted, CommitSet, Lock, LockMode, Lookup, Manager, NestedCommit};
