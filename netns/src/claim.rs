//! Which cluster owns which subnet, and the removal of a subnet's
//! namespaces and links.
//!
//! Subnet `s` belongs to whoever holds an exclusive `flock` on
//! `/run/ftbag-netns/subnet-<s>.lock` (the file holds the owner's pid, for
//! people). The kernel drops the lock when its holder's file closes,
//! however the process ends, so a lock that can be taken proves its last
//! owner gone: whatever names of that subnet remain are leftovers. Each
//! `Cluster::create` removes the leftovers of every subnet it can lock, its
//! own first. `flock` locks belong to an open file, so two threads of one
//! process exclude each other as two processes do.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::names::{index_of, SUBNETS};
use crate::sys::{self, NsFd};

const LOCK_DIR: &str = "/run/ftbag-netns";
const NETNS_DIR: &str = "/run/netns";

/// The held lock on one subnet; dropping it releases the subnet.
#[derive(Debug)]
pub(crate) struct Claim {
    pub(crate) index: u8,
    _lock: File,
}

/// Takes the first free subnet (what a dead owner left in it is for
/// [`sweep`] to remove).
pub(crate) fn claim() -> Result<Claim, Error> {
    for index in SUBNETS {
        if let Some(mut lock) = try_lock(index)? {
            let what = format!("write {}", lock_path(index).display());
            lock.set_len(0).and_then(|()| writeln!(lock, "{}", std::process::id())).map_err(|e| Error::io(what, e))?;
            return Ok(Claim { index, _lock: lock });
        }
    }
    Err(Error::NoFreeSubnet { n: SUBNETS.count() })
}

/// Removes the leftovers of every subnet whose lock nobody holds (`mine`
/// is held by the caller, so its leftovers go too).
pub(crate) fn sweep(admin: &NsFd, mine: &Claim) -> Result<(), Error> {
    for (index, names) in leftovers(admin)? {
        if index == mine.index {
            remove(admin, &names)?;
        } else if let Some(_lock) = try_lock(index)? {
            remove(admin, &names)?;
        }
    }
    Ok(())
}

/// The namespaces and links of one subnet.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) namespaces: Vec<String>,
    pub(crate) links: Vec<String>,
}

impl Found {
    pub(crate) fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.links.is_empty()
    }
}

/// Every cluster name present, by subnet.
pub(crate) fn leftovers(admin: &NsFd) -> Result<BTreeMap<u8, Found>, Error> {
    let mut found: BTreeMap<u8, Found> = BTreeMap::new();
    match std::fs::read_dir(NETNS_DIR) {
        Ok(dir) => {
            for name in dir.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
                if let Some(i) = index_of(&name) {
                    found.entry(i).or_default().namespaces.push(name);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("list {NETNS_DIR}"), e)),
    }
    // `ip -o link show`: "5: ftbag3v0@if2: <BROADCAST,…". Asked of `ip`
    // rather than read from /sys/class/net, which shows the namespace
    // sysfs was mounted in, not necessarily the admin one.
    for line in sys::run(admin, "ip", &["-o", "link", "show"], None)?.lines() {
        let Some(name) = line.split(": ").nth(1) else { continue };
        let name = name.split('@').next().unwrap_or(name);
        if let Some(i) = index_of(name) {
            found.entry(i).or_default().links.push(name.to_owned());
        }
    }
    Ok(found)
}

/// SIGKILLs what runs in `found`'s namespaces, then deletes the veths (both
/// ends), the namespaces and the bridge, each whatever became of the
/// others, and checks that none of them is left.
pub(crate) fn remove(admin: &NsFd, found: &Found) -> Result<(), Error> {
    if found.is_empty() {
        return Ok(());
    }
    let paths: Vec<PathBuf> = found.namespaces.iter().map(|n| Path::new(NETNS_DIR).join(n)).collect();
    let still = sys::kill_all_in(&paths.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    if still > 0 {
        eprintln!("netns: {still} process(es) in {:?} survived SIGKILL for 5 s", found.namespaces);
    }
    // Veths first (deleting one end deletes its peer inside the namespace),
    // so no link outlives the call even if something still pins a
    // namespace; bridges last, once no port is left.
    let (bridges, veths): (Vec<&String>, Vec<&String>) = found.links.iter().partition(|l| l.ends_with("br"));
    let mut batch = String::new();
    for l in veths {
        batch += &format!("link del {l}\n");
    }
    for n in &found.namespaces {
        batch += &format!("netns del {n}\n");
    }
    for b in bridges {
        batch += &format!("link del {b}\n");
    }
    // `-force` goes on past a failed line (a name some other sweep removed
    // meanwhile); what counts is what is left afterwards.
    let ran = sys::run(admin, "ip", &["-force", "-batch", "-"], Some(&batch));
    let left: Vec<String> = {
        let now = leftovers(admin)?;
        let alive = |n: &String| now.values().any(|f| f.namespaces.contains(n) || f.links.contains(n));
        found.namespaces.iter().chain(&found.links).filter(|n| alive(n)).cloned().collect()
    };
    match (left.is_empty(), ran) {
        (true, _) => Ok(()),
        (false, Err(e)) => Err(e),
        (false, Ok(_)) => Err(Error::Command {
            command: format!("ip -force -batch - ({batch:?})"),
            status: "exit 0".into(),
            stderr: format!("still present: {left:?}"),
        }),
    }
}

fn lock_path(index: u8) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("subnet-{index}.lock"))
}

/// The lock of subnet `index` if nobody holds it.
fn try_lock(index: u8) -> Result<Option<File>, Error> {
    let path = lock_path(index);
    std::fs::create_dir_all(LOCK_DIR).map_err(|e| Error::io(format!("create {LOCK_DIR}"), e))?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(file));
    }
    match io::Error::last_os_error() {
        e if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        e => Err(Error::io(format!("flock {}", path.display()), e)),
    }
}
