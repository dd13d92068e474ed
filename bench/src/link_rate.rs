//! The store's link as the model prices it across hosts (`bench params
//! --hosts`, `bench validate --hosts`), measured through a real node from
//! a client on another namespace host:
//! * `C` ([`Link::rate`]): the rate blocks stream at with several gets in
//!   flight, as the slaves' prefetches keep them: the link's payload rate.
//! * `Params::network_latency` ([`Link::latency`]): what one get takes
//!   beyond its bytes at that rate (the request's round trip, the node's
//!   lock and lookup, the reply's framing): latency beside the link's
//!   time, which other slaves' bytes fill meanwhile.

use std::sync::Arc;
use std::time::Instant;

use store_client::Client;

use crate::cluster::{on_host, Cluster, ClusterConfig, HostsPlacement, Placement};
use crate::params_cmd::{filled_matrix, median, read_all};

/// One block size's link figures.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    /// Bytes per second with [`STREAMS`] gets in flight.
    pub(crate) rate: f64,
    /// Seconds of one get beyond `bytes / rate`.
    pub(crate) latency: f64,
    /// Seconds of one get alone (median).
    pub(crate) single: f64,
}

/// Gets in flight at once while the streaming rate is timed.
const STREAMS: usize = 4;

/// The link at blocks of side `b`, through `client`'s node: a matrix of
/// about 24 MB written, read once to warm the node's caches, read one get
/// at a time (the latency), then twice by [`STREAMS`] readers at once (the
/// faster pass is the rate), and removed.
pub(crate) async fn link_now(client: &Client, b: usize) -> anyhow::Result<Link> {
    let bytes = (8 * b * b) as f64;
    let g = ((24e6 / bytes).sqrt().ceil() as u32).clamp(2, 8);
    let name = format!("bench-link-{}-{b}", std::process::id());
    let m = filled_matrix(client, &name, b, g).await?;
    let matrices = [(b, m, g)];
    let measured = async {
        read_all(client, &matrices, 1).await?;
        let single = read_all(client, &matrices, 1).await?[0].secs;
        let mut rate: f64 = 0.0;
        for _ in 0..2 {
            rate = rate.max(streamed(client, m, g, bytes).await?);
        }
        anyhow::Ok(Link { rate, latency: (single - bytes / rate).max(0.0), single })
    }
    .await;
    client.delete_matrix(m).await?;
    measured
}

/// Bytes per second while [`STREAMS`] readers, each in an action of its
/// own, get the matrix's blocks (every block once, at least two per reader).
async fn streamed(client: &Client, m: uuid::Uuid, g: u32, bytes: f64) -> anyhow::Result<f64> {
    let blocks = (g * g) as usize;
    let per_reader = (blocks / STREAMS).max(2);
    let session = Arc::new(client.open_session("bench-link").await?);
    let started = Instant::now();
    let readers: Vec<_> = (0..STREAMS)
        .map(|k| {
            let session = session.clone();
            tokio::spawn(async move {
                let a = session.begin().await?;
                for j in 0..per_reader {
                    let idx = ((k + j * STREAMS) % blocks) as u32;
                    a.get_block(m, idx / g, idx % g).await?;
                }
                a.commit().await?;
                anyhow::Ok(())
            })
        })
        .collect();
    for r in readers {
        r.await??;
    }
    Ok((STREAMS * per_reader) as f64 * bytes / started.elapsed().as_secs_f64())
}

/// The link at each block side of `blocks`, measured from the last of
/// `n_hosts` namespace hosts at `rate` to a store node on host 0 (a fresh
/// cluster of no slaves).
pub(crate) fn measure_across_hosts(n_hosts: usize, rate: &str, blocks: &[usize]) -> anyhow::Result<Vec<Link>> {
    let placement = HostsPlacement::create(n_hosts, rate)?;
    let hosts = placement.hosts.clone();
    on_host(&hosts, placement.cli_host, || {
        let c = Cluster::start(ClusterConfig { slaves: 0, placement: Placement::Hosts(placement.clone()), ..ClusterConfig::default() })?;
        let mut out = Vec::new();
        for &b in blocks {
            let link = c.with_client(|client| async move { link_now(&client, b).await })?;
            eprintln!(
                "link at {rate}, b = {b}: {:.1} MB/s with {STREAMS} gets in flight, one get {:.3} ms ({:.3} ms beyond its bytes)",
                link.rate / 1e6,
                link.single * 1e3,
                link.latency * 1e3
            );
            out.push(link);
        }
        Ok(out)
    })
}

/// The model's `C` and network latency from links at several block
/// sizes: the median rate (a link's rate does not depend on the block),
/// and the median latency.
pub(crate) fn fitted(links: &[Link]) -> (model::Piecewise, f64) {
    let mut rates: Vec<f64> = links.iter().map(|l| l.rate).collect();
    let mut latencies: Vec<f64> = links.iter().map(|l| l.latency).collect();
    (model::Piecewise::new(median(&mut rates), 0.0), median(&mut latencies))
}
