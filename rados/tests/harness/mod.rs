//! Throwaway Ceph clusters for the tests: `scripts/ceph-cluster.sh` run
//! under a temporary directory, the daemons killed when the cluster is
//! dropped, at the test binary's exit, or (the script's `--owner`) when
//! the test binary dies however it dies.
//!
//! `FTBAG_CEPH_CONF` names a cluster started outside (the tier script may
//! start one for several binaries); it needs a manager and the pools
//! `ftbag` and `quota`.
//! Without root or the Ceph packages a test prints `skipped: <why>`, which
//! scripts/test.sh reports and CI counts as a failure.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

pub struct TestCluster {
    pub conf: PathBuf,
    pub dir: Option<tempfile::TempDir>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh")
}

/// Why a cluster cannot be started here, if it cannot.
pub fn cannot_run() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("the Ceph tests need root (the throwaway cluster's daemons)".into());
    }
    for bin in ["ceph-mon", "ceph-osd", "ceph", "rados"] {
        if !Command::new("sh").args(["-c", &format!("command -v {bin}")]).output().is_ok_and(|o| o.status.success()) {
            return Some(format!("{bin} is not installed (scripts/setup.sh installs Ceph)"));
        }
    }
    None
}

pub fn skip(why: &str) {
    println!("skipped: {why}");
    eprintln!("skipped: {why}");
}

static TO_STOP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn stop_all() {
    let dirs = std::mem::take(&mut *TO_STOP.lock().unwrap_or_else(|e| e.into_inner()));
    for dir in dirs {
        let _ = Command::new("bash").arg(script()).arg("stop").arg(&dir).status();
        // The shared cluster's `TempDir` lives in a static, never dropped.
        let _ = std::fs::remove_dir_all(&dir);
    }
}

impl TestCluster {
    /// Starts a cluster of `osds` OSDs with the given pools (name, copies).
    pub fn start(osds: u32, pools: &[(&str, u32)]) -> TestCluster {
        TestCluster::start_with(osds, false, pools)
    }

    /// With `mgr`, a manager too: pool usage, and so quotas, need it.
    pub fn start_with(osds: u32, mgr: bool, pools: &[(&str, u32)]) -> TestCluster {
        static AT_EXIT: OnceLock<()> = OnceLock::new();
        AT_EXIT.get_or_init(|| unsafe {
            libc::atexit(stop_all);
        });
        let dir = tempfile::Builder::new().prefix("ftbag-ceph-").tempdir().expect("temp dir");
        let t0 = Instant::now();
        TO_STOP.lock().unwrap().push(dir.path().to_owned());
        let out = Command::new("bash")
            .arg(script())
            .args(["start"])
            .arg(dir.path())
            .args(["--osds", &osds.to_string(), "--owner", &std::process::id().to_string()])
            .args(mgr.then_some("--mgr"))
            .output()
            .expect("run ceph-cluster.sh");
        assert!(out.status.success(), "ceph-cluster.sh start failed: {}", String::from_utf8_lossy(&out.stderr));
        for (name, size) in pools {
            let out = Command::new("bash")
                .arg(script())
                .args(["pool"])
                .arg(dir.path())
                .args([name.to_string(), size.to_string()])
                .output()
                .expect("run ceph-cluster.sh");
            assert!(out.status.success(), "pool {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        eprintln!("ceph: {osds} OSD(s) and {} pool(s) ready in {:.1} s", pools.len(), t0.elapsed().as_secs_f64());
        TestCluster { conf: dir.path().join("ceph.conf"), dir: Some(dir) }
    }

    /// The cluster the tests of one binary share: 1 OSD, a manager (the
    /// full-pool test's quota), pools `ftbag` and `quota`.
    /// `None` (after printing `skipped`) where none can run.
    pub fn shared() -> Option<&'static TestCluster> {
        static SHARED: OnceLock<Result<TestCluster, String>> = OnceLock::new();
        let c = SHARED.get_or_init(|| {
            if let Ok(conf) = std::env::var("FTBAG_CEPH_CONF") {
                return Ok(TestCluster { conf: conf.into(), dir: None });
            }
            match cannot_run() {
                Some(why) => Err(why),
                None => Ok(TestCluster::start_with(1, true, &[("ftbag", 1), ("quota", 1)])),
            }
        });
        match c {
            Ok(c) => Some(c),
            Err(why) => {
                skip(why);
                None
            }
        }
    }

    pub fn dir(&self) -> &Path {
        self.conf.parent().unwrap()
    }

    /// Kills daemon `name` (`osd.1`, `mon.a`) with SIGKILL.
    pub fn kill(&self, name: &str) {
        let pid: i32 = std::fs::read_to_string(self.dir().join(format!("run/{name}.pid"))).unwrap().trim().parse().unwrap();
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    /// Runs the `ceph` CLI against this cluster.
    pub fn ceph(&self, args: &[&str]) -> String {
        let out = Command::new("ceph").arg("-c").arg(&self.conf).args(args).output().unwrap();
        assert!(out.status.success(), "ceph {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = Command::new("bash").arg(script()).arg("stop").arg(dir.path()).status();
            TO_STOP.lock().unwrap_or_else(|e| e.into_inner()).retain(|d| d != dir.path());
        }
    }
}
