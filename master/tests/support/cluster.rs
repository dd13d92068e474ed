//! A store node started from the `master` binary, with a client of the
//! test's own for the checks the jobs' tests share: job records, the
//! tasks' done records, the bags a job leaves behind.

use std::time::{Duration, Instant};

use job_record::{self as record, JobRecord, TaskDone};
use store_client::Client;
use uuid::Uuid;

use super::{master, master_ok, runtime, StoreProc};

pub struct Cluster {
    pub store: StoreProc,
    pub dir: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
}

impl Cluster {
    /// A store node (`master serve` with `extra` flags) in a new directory.
    pub fn start(extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreProc::start(&dir.path().join("store"), extra);
        let rt = runtime();
        let client = rt.block_on(Client::connect(&store.addr, None)).unwrap();
        Cluster { store, dir, rt, client }
    }

    /// The node's address, as `--store` takes it.
    pub fn s(&self) -> &str {
        &self.store.addr
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    pub fn submit(&self, args: &[&str]) -> Uuid {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        master_ok(self.s(), &full).parse().unwrap()
    }

    /// `master matrix export NAME` to a `.npy` file, read back.
    pub fn export_bytes(&self, name: &str) -> Vec<u8> {
        let f = self.path(&format!("{name}.npy"));
        master_ok(self.s(), &["matrix", "export", name, f.to_str().unwrap()]);
        std::fs::read(f).unwrap()
    }

    pub fn peek(&self, key: &str) -> Option<Vec<u8>> {
        self.rt.block_on(self.client.peek_small(key)).unwrap()
    }

    pub fn record(&self, job: Uuid) -> JobRecord {
        serde_json::from_slice(&self.peek(&record::job_key(job)).expect("job record")).unwrap()
    }

    /// The job's task records, by key.
    pub fn done(&self, job: Uuid) -> Vec<(String, TaskDone)> {
        self.rt
            .block_on(self.client.scan_small(&record::done_prefix(job), 0))
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, serde_json::from_slice(&v).unwrap()))
            .collect()
    }

    pub fn ended(&self, job: Uuid) -> bool {
        self.peek(&record::finished_key(job)).is_some() || self.peek(&record::failed_key(job)).is_some()
    }

    /// Waits for the job to end, and checks that it did not fail.
    pub fn wait_ended(&self, job: Uuid, limit: Duration) {
        let start = Instant::now();
        while !self.ended(job) {
            assert!(start.elapsed() < limit, "job {job} did not end within {limit:?} ({} tasks done)", self.done(job).len());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(self.peek(&record::failed_key(job)).is_none(), "job {job} failed");
    }

    /// Every task has exactly one done record with count 1, and there are
    /// `expected` tasks (counted by the caller from the shape, not from
    /// the plan).
    pub fn assert_each_task_once(&self, job: Uuid, expected: usize) -> Vec<(String, TaskDone)> {
        let done = self.done(job);
        assert_eq!(done.len(), expected, "job {job}: {} task records, expected {expected}", done.len());
        for (k, d) in &done {
            assert_eq!(d.count, 1, "{k} committed {} times", d.count);
        }
        done
    }

    /// Waits until no element of `job`'s bags is held by an action, then
    /// checks that none went to a dead-letter bag and that none was charged
    /// an attempt: what a job's tasks did not commit is back in its bags.
    pub fn assert_bags_settled(&self, job: Uuid, within: Duration) {
        let bags = self.record(job).bags;
        let stats = |b: &String| self.rt.block_on(self.client.bag_stats(b)).unwrap();
        let start = Instant::now();
        loop {
            let taken: u64 = bags.iter().map(|b| stats(b).taken).sum();
            if taken == 0 {
                break;
            }
            assert!(start.elapsed() < within, "job {job}: {taken} element(s) still held after {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        for b in &bags {
            assert_eq!(stats(b).dead, 0, "{b}: elements in the dead-letter bag");
            for t in self.rt.block_on(self.client.list_bag(b)).unwrap() {
                assert_eq!(t.attempts, 0, "{b}: element {} charged an attempt", t.seq);
            }
        }
    }

    /// `master verify JOB` succeeds.
    pub fn verify(&self, job: Uuid) {
        let out = master(self.s(), &["verify", &job.to_string()]);
        assert!(out.status.success(), "verify {job}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
}
