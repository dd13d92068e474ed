//! Allocator tuning for processes that move multi-MiB blocks.

extern "C" {
    // glibc's malloc tuning (store nodes, slaves and benches run on Linux
    // with glibc).
    fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
}

/// Keeps block buffers in one reused heap. glibc serves every allocation of
/// 32 MiB or more (a b = 2048 block) with a fresh mmap: each block read then
/// page-faulted and zeroed 8192 pages and unmapped them again, about a
/// quarter of the store node's CPU under a multiply and a large share of a
/// slave's besides dgemm. One arena, so a buffer freed on one thread is
/// reused by the next read on any other and the peak RSS stays near the
/// blocks actually held. Call first thing in `main`, before any block
/// buffer exists.
pub fn reuse_block_buffers() {
    const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
    const M_MMAP_MAX: std::ffi::c_int = -4;
    const M_ARENA_MAX: std::ffi::c_int = -8;
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        mallopt(M_ARENA_MAX, 1);
        mallopt(M_MMAP_MAX, 0);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
}
