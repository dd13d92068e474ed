//! A memory cgroup around a benchmark's processes (`bench ooc --mem-cap`):
//! the store node and slaves of one cluster, or one Dask run, under one
//! limit that counts their page cache as well as their own memory, so a
//! job whose matrices are larger than the limit really runs out of core.
//!
//! cgroup v1 (`memory.limit_in_bytes`, `memory.max_usage_in_bytes`) where
//! the memory controller is mounted on its own hierarchy, v2
//! (`memory.max`, `memory.peak`) where it sits in the unified one.
//! Processes join at spawn ([`Joiner::join_on_spawn`]: the child writes
//! itself into `cgroup.procs` between fork and exec, so everything it
//! ever maps is charged to the group). The group is removed when the
//! [`MemCgroup`] drops, a panic's unwinding included; groups left by a
//! killed bench are removed by the next one.
//!
//! ```ignore
//! let g = MemCgroup::create("ooc-capped", Some(2 << 30))?;   // needs root
//! let mut cmd = Command::new("slave");
//! g.joiner().join_on_spawn(&mut cmd);
//! let child = cmd.spawn()?;
//! g.reset_peak()?;
//! // … the job …
//! println!("peak {} bytes, {} OOM kills", g.peak()?, g.oom_kills()?);
//! // drop(g) after the children are gone: the directory is removed.
//! ```

use std::ffi::CString;
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Every group this module makes is named `PREFIX-<pid>-<label>`.
const PREFIX: &str = "ftbag-bench";

/// Why a memory cgroup could not be made or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupError {
    /// Creating cgroups needs root (effective uid 0).
    #[error("a memory cgroup needs root (running as uid {uid})")]
    NotRoot { uid: u32 },
    /// Neither a v1 memory hierarchy nor a v2 one with the memory controller.
    #[error("no memory cgroup controller: neither {v1} nor a cgroup2 mount with `memory` in cgroup.controllers")]
    NoMemoryController { v1: PathBuf },
    #[error("creating the cgroup {path}: {source}")]
    Create { path: PathBuf, source: std::io::Error },
    #[error("writing {value:?} to {path}: {source}")]
    Write { path: PathBuf, value: String, source: std::io::Error },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} holds {text:?}, not a number")]
    Parse { path: PathBuf, text: String },
}

impl CgroupError {
    /// The machine cannot cap memory at all (as opposed to a failure of
    /// one call): the bench says `skipped:` rather than failing.
    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(self, CgroupError::NotRoot { .. } | CgroupError::NoMemoryController { .. })
    }
}

/// Which cgroup interface the memory controller has here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// The names of one version's files.
impl Version {
    fn limit_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    fn peak_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        }
    }

    fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }
}

/// Where the memory controller is mounted, and how: found from the
/// standard mount points (`mount_root` is `/sys/fs/cgroup` outside tests).
pub(crate) fn locate(mount_root: &Path) -> Result<(Version, PathBuf), CgroupError> {
    let v1 = mount_root.join("memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return Ok((Version::V1, v1));
    }
    // A pure v2 system mounts the unified hierarchy at the root; a hybrid
    // one under `unified` (with the memory controller usually on v1).
    for dir in [mount_root.to_owned(), mount_root.join("unified")] {
        let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            return Ok((Version::V2, dir));
        }
    }
    Err(CgroupError::NoMemoryController { v1 })
}

/// Parses a size: bytes, or with a binary suffix `K`, `M`, `G`, `T`
/// (optionally `iB` or `B` after it, any case): `2G` = `2GiB` = 2³¹.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits_end);
    let value: f64 = number.parse().map_err(|_| format!("{text:?}: not a size (e.g. 2G, 512M, 1073741824)"))?;
    let shift = match suffix.trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        other => return Err(format!("{text:?}: unknown unit {other:?} (K, M, G, T)")),
    };
    let bytes = value * (1u64 << shift) as f64;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{text:?}: out of range"));
    }
    Ok(bytes as u64)
}

/// Puts spawned children into a [`MemCgroup`] (its `cgroup.procs`); a
/// child spawned after the group is gone fails to start.
#[derive(Clone, Debug)]
pub(crate) struct Joiner {
    procs: std::sync::Arc<CString>,
}

impl Joiner {
    /// Has `cmd`'s child join the group between fork and exec.
    pub(crate) fn join_on_spawn(&self, cmd: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: the closure runs in the child after fork; it only makes
        // the async-signal-safe calls open, write and close, on memory
        // allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            });
        }
    }
}

/// One memory cgroup, removed on drop.
#[derive(Debug)]
pub(crate) struct MemCgroup {
    version: Version,
    /// The group's directory.
    path: PathBuf,
    /// `cgroup.procs` as a C string, for the child between fork and exec.
    procs: std::sync::Arc<CString>,
    /// v2: the open `memory.peak` a reset was written to; reads through it
    /// give the peak since that reset.
    peak_fd: Option<std::fs::File>,
}

impl MemCgroup {
    /// Creates the group `ftbag-bench-<pid>-<label>` with `limit` bytes
    /// (`None`: no limit, to measure an uncapped run the same way).
    pub(crate) fn create(label: &str, limit: Option<u64>) -> Result<MemCgroup, CgroupError> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(CgroupError::NotRoot { uid });
        }
        let (version, root) = locate(Path::new("/sys/fs/cgroup"))?;
        remove_stale(&root);
        if version == Version::V2 {
            // A child group gets the controller only if its parent hands
            // it down; the root may do so whatever processes it holds.
            let control = root.join("cgroup.subtree_control");
            write(&control, "+memory")?;
        }
        let path = root.join(format!("{PREFIX}-{}-{label}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CgroupError::Create { path, source }),
        }
        let procs = CString::new(path.join("cgroup.procs").as_os_str().as_bytes()).expect("a path from a format has no NUL");
        let g = MemCgroup { version, path, procs: std::sync::Arc::new(procs), peak_fd: None };
        g.set_limit(limit)?;
        Ok(g)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the limit (`None`: none). Lowering it below the usage makes
    /// the kernel reclaim the group's page cache down to it.
    pub(crate) fn set_limit(&self, limit: Option<u64>) -> Result<(), CgroupError> {
        let value = match (limit, self.version) {
            (Some(b), _) => b.to_string(),
            (None, Version::V1) => "-1".to_owned(),
            (None, Version::V2) => "max".to_owned(),
        };
        write(&self.path.join(self.version.limit_file()), &value)
    }

    /// A handle that puts children into the group, for whoever spawns them.
    pub(crate) fn joiner(&self) -> Joiner {
        Joiner { procs: self.procs.clone() }
    }

    /// The processes in the group now.
    pub(crate) fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let path = self.path.join("cgroup.procs");
        let text = std::fs::read_to_string(&path).map_err(|source| CgroupError::Read { path, source })?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Memory charged to the group now (its processes and page cache).
    pub(crate) fn usage(&self) -> Result<u64, CgroupError> {
        read_u64(&self.path.join(self.version.usage_file()))
    }

    /// Starts the peak over from now. v1 resets the group's counter; v2
    /// (`memory.peak`, kernels from 6.12) resets what the file descriptor
    /// written to reads, so it is kept open for [`MemCgroup::peak`].
    pub(crate) fn reset_peak(&mut self) -> Result<(), CgroupError> {
        let path = self.path.join(self.version.peak_file());
        match self.version {
            Version::V1 => write(&path, "0"),
            Version::V2 => {
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|source| CgroupError::Read { path: path.clone(), source })?;
                f.write_all(b"reset\n").map_err(|source| CgroupError::Write { path, value: "reset".into(), source })?;
                self.peak_fd = Some(f);
                Ok(())
            }
        }
    }

    /// The most memory the group held since it was made or since
    /// [`MemCgroup::reset_peak`].
    pub(crate) fn peak(&mut self) -> Result<u64, CgroupError> {
        let path = self.path.join(self.version.peak_file());
        match &mut self.peak_fd {
            Some(f) => {
                let mut text = String::new();
                f.rewind().and_then(|_| f.read_to_string(&mut text)).map_err(|source| CgroupError::Read { path: path.clone(), source })?;
                parse_u64(&path, &text)
            }
            None => read_u64(&path),
        }
    }

    /// Processes the kernel's OOM killer ended in the group so far
    /// (v1 `memory.oom_control`, v2 `memory.events`: `oom_kill`).
    pub(crate) fn oom_kills(&self) -> Result<u64, CgroupError> {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        Ok(self.keyed(file, "oom_kill")?.unwrap_or(0))
    }

    /// A counter of `memory.stat` (e.g. `workingset_refault_file`, page
    /// cache read back soon after it was dropped; `pgmajfault`); `None`
    /// where this kernel has no such line.
    pub(crate) fn stat(&self, key: &str) -> Result<Option<u64>, CgroupError> {
        self.keyed("memory.stat", key)
    }

    fn keyed(&self, file: &str, key: &str) -> Result<Option<u64>, CgroupError> {
        let path = self.path.join(file);
        let text = std::fs::read_to_string(&path).map_err(|source| CgroupError::Read { path, source })?;
        Ok(keyed_value(&text, key))
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        self.peak_fd = None;
        // The owner kills its processes first; a straggler (or a zombie
        // not reaped yet) keeps the directory busy for a moment. Whatever
        // is left after that goes to the parent group rather than die
        // here: this group is the bench's, its processes are not.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() >= deadline => {
                    tracing::warn!("cgroup {} left behind: {e}", self.path.display());
                    return;
                }
                Err(_) => {
                    if let (Ok(pids), Some(parent)) = (self.pids(), self.path.parent()) {
                        for pid in pids {
                            let _ = std::fs::write(parent.join("cgroup.procs"), pid.to_string());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

/// Removes empty groups a killed bench left (its pid no longer running).
fn remove_stale(root: &Path) {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|r| r.strip_prefix('-')) else { continue };
        let owner: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
        if owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            // Fails, harmlessly, while processes are still inside.
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::Write { path: path.to_owned(), value: value.to_owned(), source })
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let text = std::fs::read_to_string(path).map_err(|source| CgroupError::Read { path: path.to_owned(), source })?;
    parse_u64(path, &text)
}

fn parse_u64(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim().parse().map_err(|_| CgroupError::Parse { path: path.to_owned(), text: text.trim().to_owned() })
}

/// The value on the line `key VALUE` of a flat keyed file.
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut parts = l.split_whitespace();
        (parts.next() == Some(key)).then(|| parts.next()?.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KB"), Ok(64 << 10));
        assert!(parse_size("2X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn keyed_files_give_their_counters() {
        let stat = "cache 123\nrss 4\nworkingset_refault_file 77\n";
        assert_eq!(keyed_value(stat, "workingset_refault_file"), Some(77));
        assert_eq!(keyed_value(stat, "rss"), Some(4));
        assert_eq!(keyed_value(stat, "rss_huge"), None);
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed_value(oom, "oom_kill"), Some(2));
    }

    #[test]
    fn the_controller_is_found_where_each_version_mounts_it() {
        let d = tempfile::tempdir().unwrap();
        let missing = locate(d.path()).unwrap_err();
        assert!(missing.is_unavailable(), "{missing}");
        // Hybrid: v2 mounted under `unified` without the memory controller.
        std::fs::create_dir(d.path().join("unified")).unwrap();
        std::fs::write(d.path().join("unified/cgroup.controllers"), "hugetlb\n").unwrap();
        assert!(locate(d.path()).is_err());
        std::fs::write(d.path().join("unified/cgroup.controllers"), "cpu io memory pids\n").unwrap();
        assert_eq!(locate(d.path()).unwrap(), (Version::V2, d.path().join("unified")));
        // v1's own hierarchy wins where both are there.
        std::fs::create_dir(d.path().join("memory")).unwrap();
        std::fs::write(d.path().join("memory/memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(locate(d.path()).unwrap(), (Version::V1, d.path().join("memory")));
    }

    /// A real group where this process may make one (root, a memory
    /// controller): a child joins at spawn, the peak and the limit read
    /// back, and the directory is gone after drop.
    #[test]
    fn a_child_joins_at_spawn_and_the_group_goes_at_drop() {
        let g = match MemCgroup::create("unit-test", Some(256 << 20)) {
            Ok(g) => g,
            Err(e) if e.is_unavailable() => {
                let _ = writeln!(std::io::stdout().lock(), "skipped: {e}");
                let _ = writeln!(std::io::stderr().lock(), "skipped: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let path = g.path().to_owned();
        let limit = std::fs::read_to_string(path.join(g.version.limit_file())).unwrap();
        assert_eq!(limit.trim(), (256u64 << 20).to_string());
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        g.joiner().join_on_spawn(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        assert_eq!(g.pids().unwrap(), vec![child.id()]);
        g.usage().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(g.oom_kills().unwrap(), 0);
        drop(g);
        assert!(!path.exists(), "{} is still there", path.display());
    }
}
