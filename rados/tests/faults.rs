//! An OSD SIGKILLed under load, on a cluster of its own (two OSDs): a pool
//! of two copies loses no acknowledged version and takes writes again once
//! the OSD is marked down; a pool of one copy answers reads of what the
//! dead OSD held with a clear error within the timeout, and never serves
//! damaged data.

mod harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ftbag_rados::{Cluster, ClusterOptions, RadosError, VersionObjects};
use harness::TestCluster;
use store_client::block::{self, BlockHeader};
use uuid::Uuid;

fn block_value(seed: u64) -> Vec<u8> {
    // 1 MiB: 128 × 1024 doubles.
    let payload: Vec<u8> = (0..128u64 * 1024).flat_map(|i| ((i ^ seed) as f64).to_le_bytes()).collect();
    let header = BlockHeader { rows: 128, cols: 1024, checksum: block::checksum(&payload) };
    [&header.encode()[..], &payload].concat()
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn an_osd_killed_mid_load_loses_no_acknowledged_version() {
    if let Some(why) = harness::cannot_run() {
        harness::skip(&why);
        return;
    }
    let c = TestCluster::start(2, &[("two", 2), ("one", 1)]);
    let mut o = ClusterOptions::new(&c.conf);
    o.timeout = TIMEOUT;
    let cluster = Cluster::connect(o).unwrap();
    let two = Arc::new(VersionObjects::new(cluster.pool("two").unwrap(), "v."));
    let one = Arc::new(VersionObjects::new(cluster.pool("one").unwrap(), "v."));
    let single: Vec<(Uuid, u64)> = (0..24).map(|k| (Uuid::new_v4(), k)).collect();
    for &(id, seed) in &single {
        one.put(id, &block_value(seed)).unwrap();
    }

    // A writer on the pool of two copies, recording what was acknowledged
    // (and when) while the OSD dies.
    let acked: Arc<Mutex<Vec<(Uuid, u64, Instant)>>> = Arc::default();
    let refused = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (two, acked, refused, stop) = (two.clone(), acked.clone(), refused.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seed = 1000;
            while !stop.load(Ordering::Relaxed) {
                let id = Uuid::new_v4();
                match two.put(id, &block_value(seed)) {
                    Ok(()) => acked.lock().unwrap().push((id, seed, Instant::now())),
                    // Not acknowledged: allowed while the OSD is being
                    // marked down, as long as it is said clearly.
                    Err(e) if e.is_unavailable() => refused.lock().unwrap().push(e.to_string()),
                    Err(e) => panic!("a write failed other than by timing out: {e}"),
                }
                seed += 1;
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let before = acked.lock().unwrap().len();
    assert!(before > 0, "no write went through before the kill");
    let killed = Instant::now();
    c.kill("osd.1");
    // Degraded writes go on once the monitors mark the OSD down.
    let deadline = killed + Duration::from_secs(60);
    while acked.lock().unwrap().iter().filter(|a| a.2 > killed).count() < 10 {
        assert!(Instant::now() < deadline, "writes did not resume within 60 s of the kill");
        std::thread::sleep(Duration::from_millis(100));
    }
    let resumed = acked.lock().unwrap().iter().find(|a| a.2 > killed).unwrap().2 - killed;
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "{} writes acknowledged ({before} before the kill), {} timed out; the first after the kill {:.1} s after it",
        acked.len(),
        refused.lock().unwrap().len(),
        resumed.as_secs_f64()
    );
    for &(id, seed, _) in &acked {
        assert_eq!(two.get(id).unwrap(), block_value(seed), "acknowledged version {id} lost or changed");
    }

    // The pool of one copy: what osd.1 held cannot be read, and says so
    // within the timeout; the rest reads back whole.
    let t0 = Instant::now();
    let reads: Vec<_> = single
        .iter()
        .map(|&(id, seed)| {
            let one = one.clone();
            std::thread::spawn(move || (seed, one.get(id)))
        })
        .collect();
    let (mut ok, mut unavailable) = (0, 0);
    for r in reads {
        match r.join().unwrap() {
            (seed, Ok(value)) => {
                assert_eq!(value, block_value(seed), "a read served different data");
                ok += 1;
            }
            (_, Err(e)) => {
                assert!(matches!(e, RadosError::Timeout { .. }), "unexpected error: {e}");
                assert!(e.to_string().contains("down or unreachable"), "{e}");
                unavailable += 1;
            }
        }
    }
    let took = t0.elapsed();
    eprintln!("pool of one copy: {ok} read, {unavailable} unavailable, in {:.1} s", took.as_secs_f64());
    assert!(unavailable > 0, "no object of the single-copy pool was on the dead OSD");
    assert!(ok > 0, "no object of the single-copy pool was on the live OSD");
    assert!(took < TIMEOUT * 3, "reads of the dead OSD's objects hung: {took:?}");
}
