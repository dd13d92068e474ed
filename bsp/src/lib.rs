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

/// Entry points for the fuzz targets (`fuzz/targets/bsp.rs`) and their
/// corpus replay: what a BSP process decodes from a peer's bytes. Not an
/// API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::wire::frame::{Header, HEADER_LEN};
    use crate::wire::handshake::Hello;

    /// Decodes a frame header from the first bytes, against a small and
    /// the largest maximum length; what decodes encodes back the same.
    pub fn frame_header(data: &[u8]) {
        let Some(b) = data.get(..HEADER_LEN) else { return };
        let b: &[u8; HEADER_LEN] = b.try_into().expect("HEADER_LEN bytes");
        for max in [1 << 20, u32::MAX] {
            if let Ok(h) = Header::decode(b, max) {
                assert!(h.len <= max);
                assert_eq!(Header::decode(&h.encode(), max).ok(), Some(h));
            }
        }
    }

    /// Reads a hello from the bytes as from a socket: a hello or a
    /// protocol error, never a panic or a read past them.
    pub fn hello(data: &[u8]) {
        let mut r = data;
        if let Ok(h) = Hello::read_from(&mut r, "fuzz") {
            let used = data.len() - r.len();
            assert_eq!(h.encode(), data[..used]);
        }
    }
}
