//! A real store node inside the bench process, for `bench queue` and
//! `bench blocks`: `store::start` on 127.0.0.1:0 with a fresh data
//! directory, on its own tokio runtime (its own threads). Clients still
//! reach it over gRPC on loopback, as slaves reach `master serve`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

pub(crate) struct InProcess {
    rt: tokio::runtime::Runtime,
    running: Option<store::Running>,
    addr: String,
    // Last field: removed after the node has stopped.
    dir: tempfile::TempDir,
}

impl InProcess {
    /// Starts a node on a fresh directory under `parent` (the system temp
    /// directory if `None`); the directory is removed when this is dropped.
    pub(crate) fn start(parent: Option<&Path>) -> anyhow::Result<InProcess> {
        Self::start_on(parent, None)
    }

    /// [`InProcess::start`], with the node's threads on `cpus` only (all
    /// if `None`).
    pub(crate) fn start_on(parent: Option<&Path>, cpus: Option<Vec<usize>>) -> anyhow::Result<InProcess> {
        let mut b = tempfile::Builder::new();
        b.prefix("bench-store-");
        let dir = match parent {
            Some(p) => b.tempdir_in(p),
            None => b.tempdir(),
        }
        .context("creating the store node's data directory")?;
        let mut rt = tokio::runtime::Builder::new_multi_thread();
        rt.worker_threads(2).thread_name("store-node").enable_all();
        if let Some(cpus) = cpus {
            // Every thread the runtime starts, its blocking pool's too.
            rt.on_thread_start(move || {
                if let Err(e) = pin_to(&cpus) {
                    tracing::warn!("store node thread not pinned: {e}");
                }
            });
        }
        let rt = rt.build()?;
        let mut n = InProcess { rt, running: None, addr: String::new(), dir };
        n.open()?;
        Ok(n)
    }

    fn open(&mut self) -> anyhow::Result<()> {
        let config = store::Config::new(self.dir.path().to_owned(), "127.0.0.1:0".parse().expect("valid address"));
        // After a restart the old instance's last tasks (session streams,
        // the aborted reaper) may still hold RocksDB's LOCK for a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        let running = loop {
            match self.rt.block_on(store::start(config.clone())) {
                Ok(r) => break r,
                Err(store::ServeError::Open { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e).context("starting the in-process store node"),
            }
        };
        self.addr = running.addr().to_string();
        self.running = Some(running);
        Ok(())
    }

    pub(crate) fn addr(&self) -> String {
        self.addr.clone()
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// Shuts the node down (which flushes memtables into SST and blob
    /// files) and opens it again on the same directory: afterwards every
    /// block is read from blob files, none from a memtable. Clients must
    /// reconnect (the address changes).
    pub(crate) fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(r) = self.running.take() {
            self.rt.block_on(r.shutdown()).context("stopping the in-process store node")?;
        }
        self.open()
    }

    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        if let Some(r) = self.running.take() {
            self.rt.block_on(r.shutdown()).context("stopping the in-process store node")?;
        }
        Ok(())
    }
}

/// The 1-minute load average from /proc/loadavg (`None` where unreadable).
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Pins the calling thread to `cpus`.
pub(crate) fn pin_to(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; the calls only read and
    // write it and this thread's own affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
