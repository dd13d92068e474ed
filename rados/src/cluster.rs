//! A connected cluster handle and pool handles.

use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::RadosError;
use crate::ffi;

/// Writes and reads go in pieces of this size: the OSDs refuse a single
/// write op above `osd_max_write_size` (90 MiB by default), and a block of
/// b = 4096 is 128 MiB.
const PIECE: usize = 64 << 20;

/// How to reach a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// A ceph.conf naming the monitors (and, usually, the keyring).
    pub conf: PathBuf,
    /// The client's name without `client.`.
    pub user: String,
    /// A keyring to use instead of the one the configuration names.
    pub keyring: Option<PathBuf>,
    /// The limit on connecting and on each monitor or OSD operation.
    /// librados waits for ever by default when the daemons are gone; a
    /// store node must answer its clients instead.
    pub timeout: Duration,
}

impl ClusterOptions {
    pub fn new(conf: impl Into<PathBuf>) -> ClusterOptions {
        ClusterOptions { conf: conf.into(), user: "admin".into(), keyring: None, timeout: Duration::from_secs(20) }
    }
}

/// The cluster's raw space, as `ceph df` shows it.
#[derive(Clone, Copy, Debug)]
pub struct ClusterSpace {
    pub bytes: u64,
    pub used_bytes: u64,
    pub avail_bytes: u64,
    pub objects: u64,
}

/// A connected librados handle. Shut down when the last [`Pool`] and the
/// last `Arc` go.
#[derive(Debug)]
pub struct Cluster {
    handle: ffi::RadosT,
    options: ClusterOptions,
}

// librados handles are thread-safe for everything this crate calls (its
// documentation: "the C API is thread-safe" for I/O on a handle and its
// I/O contexts; only per-context settings like snapshots and namespaces,
// which this crate never changes, are not).
unsafe impl Send for Cluster {}
unsafe impl Sync for Cluster {}

fn c_string(s: &str) -> Result<CString, RadosError> {
    CString::new(s).map_err(|_| RadosError::Name(s.to_owned()))
}

impl Cluster {
    /// Connects, or says why not: a configuration that cannot be read, no
    /// monitor within the timeout, a refused key.
    pub fn connect(options: ClusterOptions) -> Result<Arc<Cluster>, RadosError> {
        let conf = options.conf.clone();
        let user = c_string(&options.user)?;
        let mut handle: ffi::RadosT = ptr::null_mut();
        let r = unsafe { ffi::rados_create(&mut handle, user.as_ptr()) };
        if r < 0 {
            return Err(RadosError::Connect { conf, errno: -r });
        }
        // Owned from here: dropped (shut down) on every error below.
        let cluster = Cluster { handle, options };
        if !cluster.options.conf.is_file() {
            return Err(RadosError::Config { conf, errno: libc::ENOENT });
        }
        let path = c_string(&conf.to_string_lossy())?;
        let r = unsafe { ffi::rados_conf_read_file(cluster.handle, path.as_ptr()) };
        if r < 0 {
            return Err(RadosError::Config { conf, errno: -r });
        }
        let secs = cluster.options.timeout.as_secs().max(1).to_string();
        for option in ["client_mount_timeout", "rados_mon_op_timeout", "rados_osd_op_timeout"] {
            cluster.set(option, &secs)?;
        }
        if let Some(keyring) = &cluster.options.keyring {
            cluster.set("keyring", &keyring.to_string_lossy())?;
        }
        let r = unsafe { ffi::rados_connect(cluster.handle) };
        if r < 0 {
            let errno = -r;
            return Err(match errno {
                libc::ETIMEDOUT => RadosError::Unreachable { conf, timeout: cluster.options.timeout },
                libc::EACCES | libc::EPERM | libc::EKEYREJECTED | libc::ENOENT => {
                    RadosError::Auth { conf, user: cluster.options.user.clone(), errno }
                }
                _ => RadosError::Connect { conf, errno },
            });
        }
        Ok(Arc::new(cluster))
    }

    fn set(&self, option: &str, value: &str) -> Result<(), RadosError> {
        let (o, v) = (c_string(option)?, c_string(value)?);
        let r = unsafe { ffi::rados_conf_set(self.handle, o.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(RadosError::Option { option: option.into(), value: value.into(), errno: -r });
        }
        Ok(())
    }

    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// The cluster's raw space (all pools, all replicas). The monitors
    /// have it from the manager: zeros in a cluster without a `ceph-mgr`.
    pub fn space(&self) -> Result<ClusterSpace, RadosError> {
        let mut s = ffi::ClusterStatT::default();
        let r = unsafe { ffi::rados_cluster_stat(self.handle, &mut s) };
        if r < 0 {
            return Err(self.mon_error(-r));
        }
        Ok(ClusterSpace { bytes: s.kb << 10, used_bytes: s.kb_used << 10, avail_bytes: s.kb_avail << 10, objects: s.num_objects })
    }

    fn mon_error(&self, errno: i32) -> RadosError {
        if errno == libc::ETIMEDOUT {
            RadosError::Unreachable { conf: self.options.conf.clone(), timeout: self.options.timeout }
        } else {
            RadosError::Connect { conf: self.options.conf.clone(), errno }
        }
    }

    /// A handle on pool `name`; [`RadosError::NoPool`] if there is none.
    pub fn pool(self: &Arc<Self>, name: &str) -> Result<Pool, RadosError> {
        let c = c_string(name)?;
        let id = unsafe { ffi::rados_pool_lookup(self.handle, c.as_ptr()) };
        if id == -i64::from(libc::ENOENT) {
            return Err(RadosError::NoPool { pool: name.into() });
        }
        if id < 0 {
            return Err(self.mon_error(-id as i32));
        }
        let mut io: ffi::IoctxT = ptr::null_mut();
        let r = unsafe { ffi::rados_ioctx_create(self.handle, c.as_ptr(), &mut io) };
        if r == -libc::ENOENT {
            return Err(RadosError::NoPool { pool: name.into() });
        }
        if r < 0 {
            return Err(self.mon_error(-r));
        }
        Ok(Pool { io, name: name.into(), cluster: Arc::clone(self) })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        unsafe { ffi::rados_shutdown(self.handle) }
    }
}

/// An I/O context on one pool.
#[derive(Debug)]
pub struct Pool {
    io: ffi::IoctxT,
    name: String,
    // Declared last: the context is destroyed before the cluster shuts down.
    cluster: Arc<Cluster>,
}

// See `Cluster`: I/O on a context is thread-safe in librados.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        unsafe { ffi::rados_ioctx_destroy(self.io) }
    }
}

impl Pool {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    fn error(&self, op: &'static str, object: &str, errno: i32) -> RadosError {
        let (pool, object) = (self.name.clone(), object.to_owned());
        match errno {
            libc::ENOENT => RadosError::NotFound { pool, object },
            libc::ENOSPC | libc::EDQUOT => RadosError::Full { op, pool, object, errno },
            libc::ETIMEDOUT => RadosError::Timeout { op, pool, object, timeout: self.cluster.options.timeout },
            _ => RadosError::Io { op, pool, object, errno },
        }
    }

    /// Runs one write operation built by `build` on `object`, with `flags`.
    fn write_op(&self, object: &str, flags: libc::c_int, build: impl FnOnce(ffi::WriteOpT)) -> Result<(), i32> {
        let oid = c_string(object).map_err(|_| libc::EINVAL)?;
        let op = unsafe { ffi::rados_create_write_op() };
        if op.is_null() {
            return Err(libc::ENOMEM);
        }
        build(op);
        let r = unsafe { ffi::rados_write_op_operate(op, self.io, oid.as_ptr(), ptr::null_mut(), flags) };
        unsafe { ffi::rados_release_write_op(op) };
        if r < 0 {
            Err(-r)
        } else {
            Ok(())
        }
    }

    /// Writes `object` whole, replacing what it held. A value larger than
    /// one write op goes in pieces: the first replaces, the rest extend.
    /// Not atomic across pieces, which is why versions are written once
    /// under a fresh name and named by a pointer only after this returns.
    /// A full pool or cluster refuses it at once ([`RadosError::Full`]):
    /// librados would otherwise hold the write until there is room.
    pub fn write_full(&self, object: &str, value: &[u8]) -> Result<(), RadosError> {
        self.write_parts(object, &[value])
    }

    /// [`Pool::write_full`] of the parts one after the other, without
    /// joining them in memory.
    pub fn write_parts(&self, object: &str, parts: &[&[u8]]) -> Result<(), RadosError> {
        let _ = c_string(object)?;
        let mut off = 0u64;
        let pieces = parts.iter().flat_map(|part| if part.is_empty() { [].chunks(1) } else { part.chunks(PIECE) });
        let mut wrote_any = false;
        for piece in pieces {
            let first = !wrote_any;
            let r = self.write_op(object, ffi::OPERATION_FULL_TRY, |op| unsafe {
                if first {
                    ffi::rados_write_op_write_full(op, piece.as_ptr().cast(), piece.len());
                } else {
                    ffi::rados_write_op_write(op, piece.as_ptr().cast(), piece.len(), off);
                }
            });
            r.map_err(|errno| self.error("write", object, errno))?;
            off += piece.len() as u64;
            wrote_any = true;
        }
        if !wrote_any {
            // An empty object is still written, replacing what was there.
            self.write_op(object, ffi::OPERATION_FULL_TRY, |op| unsafe { ffi::rados_write_op_write_full(op, [].as_ptr(), 0) })
                .map_err(|errno| self.error("write", object, errno))?;
        }
        Ok(())
    }

    /// The object's size, or `None` if it does not exist.
    pub fn size(&self, object: &str) -> Result<Option<u64>, RadosError> {
        let oid = c_string(object)?;
        let (mut size, mut mtime) = (0u64, 0 as libc::time_t);
        let r = unsafe { ffi::rados_stat(self.io, oid.as_ptr(), &mut size, &mut mtime) };
        match r {
            0 => Ok(Some(size)),
            r if r == -libc::ENOENT => Ok(None),
            r => Err(self.error("stat", object, -r)),
        }
    }

    /// Reads the whole object ([`RadosError::NotFound`] if there is none).
    pub fn read(&self, object: &str) -> Result<Vec<u8>, RadosError> {
        let size = self.size(object)?.ok_or_else(|| self.error("read", object, libc::ENOENT))?;
        let size = usize::try_from(size).map_err(|_| self.error("read", object, libc::EFBIG))?;
        let mut value = vec![0u8; size];
        self.read_into(object, &mut value)?;
        Ok(value)
    }

    /// Fills `buf` from the object's start; an object shorter than `buf`
    /// is an error (a version is read whole, its length known).
    pub fn read_into(&self, object: &str, buf: &mut [u8]) -> Result<(), RadosError> {
        self.read_at(object, 0, buf)
    }

    /// Fills `buf` from the object at `at`; an object that ends before
    /// `buf` is full is an error.
    pub fn read_at(&self, object: &str, at: u64, buf: &mut [u8]) -> Result<(), RadosError> {
        let oid = c_string(object)?;
        let mut off = 0;
        while off < buf.len() {
            let len = (buf.len() - off).min(PIECE);
            let r = unsafe { ffi::rados_read(self.io, oid.as_ptr(), buf[off..].as_mut_ptr().cast(), len, at + off as u64) };
            if r < 0 {
                return Err(self.error("read", object, -r));
            }
            if r == 0 {
                return Err(RadosError::Corrupt {
                    pool: self.name.clone(),
                    object: object.into(),
                    why: format!("{} bytes long, {} expected", at + off as u64, at + buf.len() as u64),
                });
            }
            off += r as usize;
        }
        Ok(())
    }

    /// Removes the object; `false` if there was none. Goes through on a
    /// full cluster, where deleting is how room is made.
    pub fn remove(&self, object: &str) -> Result<bool, RadosError> {
        let _ = c_string(object)?;
        match self.write_op(object, ffi::OPERATION_FULL_FORCE, |op| unsafe { ffi::rados_write_op_remove(op) }) {
            Ok(()) => Ok(true),
            Err(libc::ENOENT) => Ok(false),
            Err(errno) => Err(self.error("remove", object, errno)),
        }
    }

    /// Every object's name in the pool's default namespace.
    pub fn list(&self) -> Result<Vec<String>, RadosError> {
        let mut ctx: ffi::ListCtxT = ptr::null_mut();
        let r = unsafe { ffi::rados_nobjects_list_open(self.io, &mut ctx) };
        if r < 0 {
            return Err(self.error("list", "*", -r));
        }
        let mut names = Vec::new();
        let result = loop {
            let mut entry: *const libc::c_char = ptr::null();
            let r = unsafe { ffi::rados_nobjects_list_next(ctx, &mut entry, ptr::null_mut(), ptr::null_mut()) };
            if r == -libc::ENOENT {
                break Ok(names);
            }
            if r < 0 {
                break Err(self.error("list", "*", -r));
            }
            // Valid until the next call on `ctx`: copied at once.
            names.push(unsafe { CStr::from_ptr(entry) }.to_string_lossy().into_owned());
        };
        unsafe { ffi::rados_nobjects_list_close(ctx) };
        result
    }
}
