//! The librados C calls this crate uses, declared by hand from
//! `rados/librados.h` (Ceph 16.2). A dozen calls do not justify bindgen's
//! libclang at build time, and the `ceph` crate brings a JSON command layer
//! and its own error type for the same dozen calls.

use libc::{c_char, c_int, c_void, size_t, time_t};

pub(crate) type RadosT = *mut c_void;
pub(crate) type IoctxT = *mut c_void;
pub(crate) type ListCtxT = *mut c_void;
pub(crate) type WriteOpT = *mut c_void;

/// `LIBRADOS_OPERATION_FULL_TRY`: send a write even when the pool or the
/// cluster is full, for the OSD to refuse it (`ENOSPC`, `EDQUOT`) instead
/// of librados holding it until there is room.
pub(crate) const OPERATION_FULL_TRY: c_int = 64;
/// `LIBRADOS_OPERATION_FULL_FORCE`: a delete goes through on a full
/// cluster (it is how room is made).
pub(crate) const OPERATION_FULL_FORCE: c_int = 128;

/// `struct rados_cluster_stat_t`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct ClusterStatT {
    pub(crate) kb: u64,
    pub(crate) kb_used: u64,
    pub(crate) kb_avail: u64,
    pub(crate) num_objects: u64,
}

#[link(name = "rados")]
extern "C" {
    pub(crate) fn rados_create(cluster: *mut RadosT, id: *const c_char) -> c_int;
    pub(crate) fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int;
    pub(crate) fn rados_conf_set(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int;
    pub(crate) fn rados_connect(cluster: RadosT) -> c_int;
    pub(crate) fn rados_shutdown(cluster: RadosT);
    pub(crate) fn rados_cluster_stat(cluster: RadosT, result: *mut ClusterStatT) -> c_int;
    pub(crate) fn rados_pool_lookup(cluster: RadosT, pool: *const c_char) -> i64;
    pub(crate) fn rados_ioctx_create(cluster: RadosT, pool: *const c_char, io: *mut IoctxT) -> c_int;
    pub(crate) fn rados_ioctx_destroy(io: IoctxT);
    pub(crate) fn rados_create_write_op() -> WriteOpT;
    pub(crate) fn rados_release_write_op(op: WriteOpT);
    pub(crate) fn rados_write_op_write_full(op: WriteOpT, buf: *const c_char, len: size_t);
    pub(crate) fn rados_write_op_write(op: WriteOpT, buf: *const c_char, len: size_t, off: u64);
    pub(crate) fn rados_write_op_remove(op: WriteOpT);
    pub(crate) fn rados_write_op_operate(op: WriteOpT, io: IoctxT, oid: *const c_char, mtime: *mut time_t, flags: c_int) -> c_int;
    pub(crate) fn rados_read(io: IoctxT, oid: *const c_char, buf: *mut c_char, len: size_t, off: u64) -> c_int;
    pub(crate) fn rados_stat(io: IoctxT, oid: *const c_char, psize: *mut u64, pmtime: *mut time_t) -> c_int;
    pub(crate) fn rados_nobjects_list_open(io: IoctxT, ctx: *mut ListCtxT) -> c_int;
    pub(crate) fn rados_nobjects_list_next(
        ctx: ListCtxT,
        entry: *mut *const c_char,
        key: *mut *const c_char,
        nspace: *mut *const c_char,
    ) -> c_int;
    pub(crate) fn rados_nobjects_list_close(ctx: ListCtxT);
}
