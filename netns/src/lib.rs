//! Network-namespace "hosts" on one machine, for tests, benchmarks and
//! users (`ftbag-hosts`): a bridge, and per host a network namespace joined
//! to it by a veth pair with an address of its own, links shaped to a rate
//! both ways (`tc tbf`), silent partitions, and processes or threads placed
//! in a host. Several clusters live at once, each on its own /24 of
//! 10.77.0.0/16; dropping one removes it, and making one removes what
//! killed runs left.
//!
//! ```no_run
//! use std::io::Read;
//! use netns::{Cluster, Spec};
//!
//! if netns::skip_unless_root() {
//!     return;
//! }
//! let cluster = Cluster::create(Spec::hosts(2).rate("100mbit".parse().unwrap())).unwrap();
//! // A listener in host 0 (its pid is the program's own)…
//! let mut server = cluster
//!     .command(0, "python3")
//!     .args(["-c", "import socket; s = socket.create_server(('0.0.0.0', 7000)); s.accept()[0].send(b'hi')"])
//!     .spawn()
//!     .unwrap();
//! // …and a client on a thread of this process in host 1.
//! let addr = (cluster.addr(0), 7000);
//! std::thread::scope(|s| {
//!     s.spawn(|| {
//!         cluster.enter(1).unwrap();
//!         let mut reply = String::new();
//!         std::net::TcpStream::connect(addr).unwrap().read_to_string(&mut reply).unwrap();
//!     });
//! });
//! server.wait().unwrap();
//! println!("host 0 sent {} bytes", cluster.link_bytes(0).unwrap().tx);
//! // Dropping `cluster` kills what still runs in it and removes it.
//! ```
//!
//! Needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) and iproute2 (`ip`,
//! `tc`, `bridge`). Without them [`Cluster::create`] returns
//! [`Error::NeedsRoot`], whose message is [`SKIP_LINE`].

mod claim;
mod cluster;
mod error;
mod names;
mod spec;
mod sys;

pub use cluster::{Cluster, LinkBytes};
pub use error::{Error, ParseError, SKIP_LINE};
pub use spec::{parse_delay, Rate, Spec, MAX_HOSTS};

/// For tests: true, after printing [`SKIP_LINE`] to stdout and stderr (and
/// why on stderr, past libtest's capture), where this process cannot make
/// network namespaces. CI fails a run whose output holds that line.
pub fn skip_unless_root() -> bool {
    use std::io::Write;
    let Some(reason) = sys::why_unavailable() else { return false };
    // Through the handles, not `println!`: libtest captures the macros'
    // output of passing tests, and a skip must show.
    let _ = writeln!(std::io::stdout().lock(), "{SKIP_LINE}");
    let _ = writeln!(std::io::stderr().lock(), "{SKIP_LINE}\nnetns: {reason}");
    true
}
