//! librados against a real throwaway cluster: objects whole and in pieces,
//! block versions checked and swept, every bad input named, a full pool,
//! and a writer killed anywhere in the version protocol (`crash.rs`). One
//! binary, so its tests share one cluster.

mod crash;
#[path = "../harness/mod.rs"]
mod harness;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ftbag_rados::{Cluster, ClusterOptions, RadosError, VersionObjects};
use harness::TestCluster;
use store_client::block::{self, BlockHeader};
use uuid::Uuid;

fn block_value(rows: u32, cols: u32, seed: u64) -> Vec<u8> {
    let payload: Vec<u8> = (0..u64::from(rows) * u64::from(cols)).flat_map(|i| ((i ^ seed) as f64).to_le_bytes()).collect();
    let header = BlockHeader { rows, cols, checksum: block::checksum(&payload) };
    [&header.encode()[..], &payload].concat()
}

fn options(c: &TestCluster) -> ClusterOptions {
    let mut o = ClusterOptions::new(&c.conf);
    o.timeout = Duration::from_secs(5);
    o
}

#[test]
fn objects_round_trip_whole_and_in_pieces() {
    let Some(c) = TestCluster::shared() else { return };
    let pool = Cluster::connect(options(c)).unwrap().pool("ftbag").unwrap();
    let small = b"a small object".to_vec();
    pool.write_full("rt.small", &small).unwrap();
    assert_eq!(pool.read("rt.small").unwrap(), small);
    // Larger than one write op (`osd_max_write_size`, 90 MiB): in pieces.
    let big: Vec<u8> = (0..(150u32 << 20) / 4).flat_map(|i| i.wrapping_mul(2654435761).to_le_bytes()).collect();
    pool.write_full("rt.big", &big).unwrap();
    assert_eq!(pool.size("rt.big").unwrap(), Some(big.len() as u64));
    assert!(pool.read("rt.big").unwrap() == big, "150 MiB object read back different");
    // A shorter rewrite replaces it whole.
    pool.write_full("rt.big", &small).unwrap();
    assert_eq!(pool.read("rt.big").unwrap(), small);
    assert!(pool.remove("rt.big").unwrap());
    assert!(!pool.remove("rt.big").unwrap());
    assert!(matches!(pool.read("rt.big"), Err(RadosError::NotFound { .. })));
    assert_eq!(pool.size("rt.big").unwrap(), None);
    assert!(pool.remove("rt.small").unwrap());
}

#[test]
fn versions_are_checked_and_swept_against_what_the_store_names() {
    let Some(c) = TestCluster::shared() else { return };
    let cluster = Cluster::connect(options(c)).unwrap();
    let versions = VersionObjects::new(cluster.pool("ftbag").unwrap(), "sweep-test.");
    let ids: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
    for (k, &id) in ids.iter().enumerate() {
        versions.put(id, &block_value(64, 32, k as u64)).unwrap();
    }
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(versions.get(id).unwrap(), block_value(64, 32, k as u64));
    }
    // A damaged block is refused before it is stored.
    let mut bad = block_value(8, 8, 1);
    bad[block::HEADER_LEN + 3] ^= 1;
    let refused = Uuid::new_v4();
    assert!(matches!(versions.put(refused, &bad), Err(RadosError::Corrupt { .. })));
    assert_eq!(versions.pool().size(&versions.object_name(refused)).unwrap(), None);
    // One damaged in the pool (behind the store's back) is never served.
    versions.pool().write_full(&versions.object_name(ids[0]), &bad).unwrap();
    let e = versions.get(ids[0]).unwrap_err();
    assert!(matches!(e, RadosError::Corrupt { .. }), "{e}");
    // Another store's objects in the same pool are not this one's to sweep.
    versions.pool().write_full("someone-else", b"x").unwrap();
    let keep: HashSet<Uuid> = ids[..5].iter().copied().collect();
    let swept = versions.sweep(&keep).unwrap();
    assert_eq!((swept.kept, swept.removed), (5, 15));
    assert_eq!(versions.versions().unwrap().into_iter().collect::<HashSet<_>>(), keep);
    assert_eq!(versions.pool().read("someone-else").unwrap(), b"x");
    assert_eq!(versions.delete(&ids).unwrap(), 5);
    assert!(versions.versions().unwrap().is_empty());
    versions.pool().remove("someone-else").unwrap();
}

#[test]
fn bad_inputs_are_named_and_the_connection_that_works_keeps_working() {
    let Some(c) = TestCluster::shared() else { return };
    let good = Cluster::connect(options(c)).unwrap();
    let pool = good.pool("ftbag").unwrap();

    // No configuration file.
    let e = Cluster::connect(ClusterOptions::new("/nonexistent/ceph.conf")).unwrap_err();
    assert!(matches!(e, RadosError::Config { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/ceph.conf"), "{e}");

    // Monitors nobody runs: a clear error within the timeout, not a hang.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&c.conf).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead: String = text
        .lines()
        .map(|l| if l.starts_with("mon host") { format!("mon host = v2:127.0.0.1:{port}") } else { l.to_owned() })
        .collect::<Vec<_>>()
        .join("\n");
    let dead_conf = dir.path().join("dead.conf");
    std::fs::write(&dead_conf, dead + "\n").unwrap();
    let mut o = ClusterOptions::new(&dead_conf);
    o.timeout = Duration::from_secs(3);
    let t0 = Instant::now();
    let e = Cluster::connect(o).unwrap_err();
    assert!(matches!(e, RadosError::Unreachable { .. }), "{e}");
    assert!(e.is_unavailable());
    assert!(t0.elapsed() < Duration::from_secs(15), "unreachable cluster took {:?}", t0.elapsed());

    // A key the cluster does not know for the user.
    let keyring = dir.path().join("wrong.keyring");
    let st = std::process::Command::new("ceph-authtool")
        .arg("--create-keyring")
        .arg(&keyring)
        .args(["--gen-key", "-n", "client.admin"])
        .output()
        .unwrap();
    assert!(st.status.success());
    let mut o = options(c);
    o.keyring = Some(keyring.clone());
    let e = Cluster::connect(o).unwrap_err();
    assert!(matches!(e, RadosError::Auth { .. }), "{e}");
    // A user the cluster does not know.
    let mut o = options(c);
    o.user = "nobody".into();
    let e = Cluster::connect(o).unwrap_err();
    assert!(matches!(e, RadosError::Auth { .. }), "{e}");

    // A pool that does not exist.
    let e = good.pool("no-such-pool").unwrap_err();
    assert!(matches!(e, RadosError::NoPool { .. }), "{e}");
    assert!(e.to_string().contains("no-such-pool"), "{e}");

    // None of it touched the connection that works.
    pool.write_full("bad-inputs", b"still here").unwrap();
    assert_eq!(pool.read("bad-inputs").unwrap(), b"still here");
    pool.remove("bad-inputs").unwrap();
    // The space is the manager's figure (zeros without one, as here); the
    // call must still answer.
    good.space().unwrap();
}

/// A full pool (its quota met: the same refusal as a cluster past its
/// full ratio, without filling the host's disk) refuses writes with
/// [`RadosError::Full`] at once, not by hanging; reads and deletes still
/// work, and writes do again once there is room.
#[test]
fn a_full_pool_refuses_writes_by_name_and_still_serves_reads() {
    let Some(c) = TestCluster::shared() else { return };
    let cluster = Cluster::connect(options(c)).unwrap();
    let versions = VersionObjects::new(cluster.pool("quota").unwrap(), "full.");
    c.ceph(&["osd", "pool", "set-quota", "quota", "max_bytes", "4194304"]);
    let mut written = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let e = loop {
        assert!(Instant::now() < deadline, "the quota never took effect");
        let id = Uuid::new_v4();
        let value = block_value(128, 1024, written.len() as u64);
        let t0 = Instant::now();
        match versions.put(id, &value) {
            Ok(()) => written.push((id, value)),
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(3), "a refused write took {:?}", t0.elapsed());
                break e;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(matches!(e, RadosError::Full { .. }), "{e}");
    assert!(e.to_string().contains("is full") && e.to_string().contains("quota exceeded"), "{e}");
    assert!(written.len() >= 4, "only {} MiB went in under a 4 MiB quota", written.len());
    for (id, value) in &written {
        assert_eq!(&versions.get(*id).unwrap(), value);
    }
    c.ceph(&["osd", "pool", "set-quota", "quota", "max_bytes", "0"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = Uuid::new_v4();
    while let Err(e) = versions.put(id, &block_value(8, 8, 0)) {
        assert!(matches!(e, RadosError::Full { .. }), "{e}");
        assert!(Instant::now() < deadline, "writes did not resume once the quota was lifted");
        std::thread::sleep(Duration::from_millis(200));
    }
    written.push((id, Vec::new()));
    assert_eq!(versions.delete(&written.iter().map(|w| w.0).collect::<Vec<_>>()).unwrap(), written.len());
}
