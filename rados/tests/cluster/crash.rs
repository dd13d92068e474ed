//! The version protocol of a store on RADOS, with a real process SIGKILLed
//! at random points: write the new version's object under a fresh name,
//! commit (the pointer made durable; here a file renamed into place, in
//! the node RocksDB's synced batch), then delete the replaced version's
//! object. Wherever the kill lands (mid-write of a multi-piece object,
//! between write and commit, between commit and delete), recovery's sweep
//! leaves exactly the objects the pointers name, each whole.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::TestCluster;
use ftbag_rados::{Cluster, ClusterOptions, VersionObjects};
use store_client::block::{self, BlockHeader};
use uuid::Uuid;

const BLOCKS: u64 = 6;
const PREFIX: &str = "crash.";

/// A version's value from its seed. Every seventh is 66 MiB, written in
/// two pieces, so some kills land between them.
fn block_value(seed: u64) -> Vec<u8> {
    let cols = if seed % 7 == 3 { 8448 } else { 128 };
    let payload: Vec<u8> = (0..1024 * cols).flat_map(|i| ((i ^ seed) as f64).to_le_bytes()).collect();
    let header = BlockHeader { rows: 1024, cols: cols as u32, checksum: block::checksum(&payload) };
    [&header.encode()[..], &payload].concat()
}

/// The committed pointers: block → (version, seed), and how many commits.
fn load(path: &Path) -> (BTreeMap<u64, (Uuid, u64)>, u64) {
    let Ok(text) = std::fs::read_to_string(path) else { return (BTreeMap::new(), 0) };
    let mut lines = text.lines();
    let commits = lines.next().unwrap().parse().unwrap();
    let pointers = lines
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].parse().unwrap(), (Uuid::parse_str(f[1]).unwrap(), f[2].parse().unwrap()))
        })
        .collect();
    (pointers, commits)
}

/// Commits: the new pointers durable in one step (write, fsync, rename).
fn store(path: &Path, pointers: &BTreeMap<u64, (Uuid, u64)>, commits: u64) {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).unwrap();
    writeln!(f, "{commits}").unwrap();
    for (b, (v, s)) in pointers {
        writeln!(f, "{b} {v} {s}").unwrap();
    }
    f.sync_all().unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn versions(conf: &Path) -> VersionObjects {
    let cluster = Cluster::connect(ClusterOptions::new(conf)).unwrap();
    VersionObjects::new(cluster.pool("ftbag").unwrap(), PREFIX)
}

/// The writer the test kills: runs only when the test below starts it.
#[test]
#[ignore = "a child process of a_writer_killed_anywhere_leaves_no_orphan_and_no_torn_version"]
fn child_writer() {
    let (Ok(conf), Ok(dir)) = (std::env::var("FTBAG_CEPH_CONF"), std::env::var("FTBAG_RADOS_CHILD_DIR")) else { return };
    let path = PathBuf::from(dir).join("pointers");
    let objects = versions(Path::new(&conf));
    let (mut pointers, mut commits) = load(&path);
    let mut seed = commits * 1000 + 1_000_000 * u64::from(std::process::id());
    loop {
        seed += 1;
        let b = seed % BLOCKS;
        let id = Uuid::new_v4();
        objects.put(id, &block_value(seed)).unwrap();
        let replaced = pointers.insert(b, (id, seed));
        commits += 1;
        store(&path, &pointers, commits);
        if let Some((old, _)) = replaced {
            objects.delete(&[old]).unwrap();
        }
        if commits % 5 == 0 {
            println!("commits {commits}");
        }
    }
}

#[test]
fn a_writer_killed_anywhere_leaves_no_orphan_and_no_torn_version() {
    let Some(c) = TestCluster::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pointers");
    let objects = versions(&c.conf);
    let mut total_removed = 0;
    for round in 0..4u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash::child_writer", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("FTBAG_CEPH_CONF", &c.conf)
            .env("FTBAG_RADOS_CHILD_DIR", dir.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (_, start) = load(&path);
        let deadline = Instant::now() + Duration::from_secs(120);
        // At least a few commits, then a kill at a moment that drifts
        // across the write–commit–delete cycle from round to round.
        while load(&path).1 < start + 4 {
            assert!(Instant::now() < deadline, "the writer made no progress");
            assert!(child.try_wait().unwrap().is_none(), "the writer exited by itself");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(97 * round + 11));
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();

        // Recovery: every pointer's version whole, then the sweep.
        let (pointers, commits) = load(&path);
        for (v, seed) in pointers.values() {
            assert!(objects.get(*v).unwrap() == block_value(*seed), "committed version {v} damaged");
        }
        let keep: HashSet<Uuid> = pointers.values().map(|p| p.0).collect();
        let swept = objects.sweep(&keep).unwrap();
        total_removed += swept.removed;
        assert_eq!(swept.kept, keep.len(), "a committed version's object is missing");
        let left: HashSet<Uuid> = objects.versions().unwrap().into_iter().collect();
        assert_eq!(left, keep, "objects left that no pointer names, after {commits} commits");
        eprintln!("round {round}: {commits} commits, {} orphan(s) swept", swept.removed);
    }
    eprintln!("{total_removed} orphan(s) swept in all");
    let (pointers, _) = load(&path);
    objects.delete(&pointers.values().map(|p| p.0).collect::<Vec<_>>()).unwrap();
}
