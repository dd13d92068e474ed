//! # bsp: BSPlib for Rust over TCP
//!
//! Bulk-synchronous parallel programs: a group of `p` processes computes in
//! supersteps; communication asked for in a superstep (one-sided `put`/`get`
//! into registered areas, BSMP `send`) is delivered by the `sync` that ends
//! it. The runtime uses the fact that it sees a whole superstep's traffic at
//! the barrier: it combines everything per destination, exchanges counts as
//! the barrier itself, sends in a Latin-square order, and completes by
//! counting (Donaldson 1999; Skillicorn, Hill & McColl 1997).
//!
//! Two layers: `wire` (framed, authenticated TCP connections driven by a
//! progress thread per process, one send budget per process, all-or-nothing
//! sends with back-pressure) and the BSPlib layer ([`Bsp`]). On top:
//! [`collectives`] and the [`probe`] that measures `l`, `g` and `n½`.
//!
//! ```
//! use bsp::{run_threads, Config};
//!
//! // Four processes (threads here; `bsp run -n 4 PROG` starts real ones).
//! let sums = run_threads(4, Config::new("secret"), |bsp| {
//!     let a = bsp.push_reg(8 * bsp.nprocs());
//!     bsp.sync()?; // registration takes effect
//!     let me = bsp.pid() as f64;
//!     for q in 0..bsp.nprocs() {
//!         bsp.put_slice(q, &[me], a, bsp.pid())?; // my pid into slot pid everywhere
//!     }
//!     bsp.sync()?;
//!     Ok(bsp.area_as::<f64>(a).iter().sum::<f64>())
//! })
//! .unwrap();
//! assert!(sums.iter().all(|r| *r.as_ref().unwrap() == 6.0));
//! ```
//!
//! Failures: a peer that dies (or goes silent past `Config::peer_timeout`)
//! makes `sync` return [`BspError::PeerLost`] on every survivor; `abort` makes
//! it return [`BspError::Aborted`]. Both are `is_retryable()`.

mod bsplib;
pub mod collectives;
mod error;
mod group;
pub mod probe;
mod wire;

pub use bsplib::{Area, Bsp, Config, Message, Schedule};
pub use error::{BspError, Result};
pub use group::{run_threads, Job, Launcher};
pub use wire::mesh::Endpoint;
