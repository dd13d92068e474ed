//! Allocator tuning for processes that move multi-MiB blocks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

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

/// Allocations of at least this many bytes are block buffers.
const LARGE: usize = 1 << 20;
const PAGE: usize = 4096;
/// Distinct buffer sizes kept for reuse (block shapes: the full block and
/// the edge blocks of a few matrices); a freed buffer of any other size is
/// unmapped.
const CLASSES: usize = 32;
/// Bytes of freed buffers kept at most: eight 32 MiB blocks, twice what a
/// matmul or Cholesky slave holds at once. Without a bound, pivoted LU kept
/// one buffer of each of its panels' sizes (a block column below the
/// diagonal, a different size at every step): slaves peaked at 1.5–1.6 GiB
/// for an n = 16384, b = 2048 job.
const KEEP_AT_MOST: usize = 256 << 20;

/// A global allocator for a slave: buffers of [`LARGE`] bytes or more (its
/// blocks) are mapped on their own and, when freed, kept for the next
/// buffer of the same size, so a slave that holds four blocks at a time
/// maps four (and those it held at once at its peak), whatever else it
/// allocates. Everything smaller goes to the system allocator.
///
/// With blocks in the general heap (even one that is never trimmed, see
/// [`reuse_block_buffers`]), glibc cut small requests out of a freed
/// 32 MiB chunk, the next block no longer fitted, and the heap grew: one
/// of two slaves doing the same work peaked at 208 MiB, the other at 176.
pub struct BlockAllocator {
    free: Mutex<Free>,
}

/// The kept buffers, by size, and their total; the bytes of block buffers
/// in use, and the most that ever were at once.
struct Free {
    classes: [Class; CLASSES],
    bytes: usize,
    live: usize,
    peak_live: usize,
}

/// Freed buffers of one size, each holding the address of the next in its
/// first word (so that freeing never allocates).
#[derive(Clone, Copy)]
struct Class {
    size: usize,
    head: usize,
}

impl BlockAllocator {
    pub const fn new() -> Self {
        BlockAllocator { free: Mutex::new(Free { classes: [Class { size: 0, head: 0 }; CLASSES], bytes: 0, live: 0, peak_live: 0 }) }
    }

    /// A kept buffer of `size` bytes, if there is one.
    fn take(&self, size: usize) -> Option<*mut u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let class = free.classes.iter_mut().find(|c| c.size == size && c.head != 0)?;
        let ptr = class.head as *mut u8;
        // SAFETY: a kept buffer starts with the address of the next one.
        class.head = unsafe { (ptr as *const usize).read() };
        free.bytes -= size;
        free.live += size;
        Some(ptr)
    }

    /// Makes room for a fresh buffer of `size` bytes (none of that size is
    /// kept): unmaps kept buffers of other sizes, largest first, while the
    /// buffers in use, those kept and the new one would exceed the most
    /// ever in use at once. Kept buffers then never raise the footprint
    /// above the slave's own peak of blocks held: a tournament LU's
    /// 2b × b stack, kept beside its 32 MiB blocks, had put slaves at
    /// 338 MiB of the 192 allowed. A job of one block size never gets
    /// here once its buffers are mapped; the new buffer counts as in use.
    fn make_room(&self, size: usize) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while free.live + free.bytes + size > free.peak_live {
            let Some(class) = free.classes.iter_mut().filter(|c| c.head != 0 && c.size != size).max_by_key(|c| c.size) else {
                break;
            };
            let (ptr, csize) = (class.head as *mut u8, class.size);
            // SAFETY: a kept buffer starts with the address of the next one.
            class.head = unsafe { (ptr as *const usize).read() };
            free.bytes -= csize;
            // SAFETY: a kept buffer is a whole mapping of `csize` bytes, ours.
            unsafe { libc::munmap(ptr as *mut libc::c_void, csize) };
        }
        free.live += size;
        free.peak_live = free.peak_live.max(free.live);
    }

    /// A buffer of `size` bytes is no longer in use.
    fn released(&self, size: usize) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.live = free.live.saturating_sub(size);
    }

    /// Keeps a buffer of `size` bytes; false if there is no room (no
    /// class for its size, or [`KEEP_AT_MOST`] bytes kept already).
    fn keep(&self, ptr: *mut u8, size: usize) -> bool {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.live = free.live.saturating_sub(size);
        if free.bytes + size > KEEP_AT_MOST {
            return false;
        }
        let slot = match free.classes.iter().position(|c| c.size == size) {
            Some(i) => i,
            None => match free.classes.iter().position(|c| c.head == 0) {
                Some(i) => i,
                None => return false,
            },
        };
        free.bytes += size;
        let class = &mut free.classes[slot];
        if class.size != size {
            *class = Class { size, head: 0 };
        }
        // SAFETY: the buffer is ours, at least a page long and page aligned.
        unsafe { (ptr as *mut usize).write(class.head) };
        class.head = ptr as usize;
        true
    }
}

impl Default for BlockAllocator {
    fn default() -> Self {
        Self::new()
    }
}

fn is_block(layout: &Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= PAGE
}

fn mapped_size(layout: &Layout) -> usize {
    layout.size().div_ceil(PAGE) * PAGE
}

// SAFETY: block buffers come from their own page-aligned anonymous
// mappings (page alignment covers every `align <= PAGE`) and go back to the
// free lists or are unmapped by size; everything else is `System`'s.
unsafe impl GlobalAlloc for BlockAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !is_block(&layout) {
            return System.alloc(layout);
        }
        let size = mapped_size(&layout);
        if let Some(ptr) = self.take(size) {
            return ptr;
        }
        self.make_room(size);
        let ptr =
            libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        if ptr == libc::MAP_FAILED {
            self.released(size);
            std::ptr::null_mut()
        } else {
            ptr as *mut u8
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !is_block(&layout) {
            return System.alloc_zeroed(layout);
        }
        let size = mapped_size(&layout);
        if let Some(ptr) = self.take(size) {
            std::ptr::write_bytes(ptr, 0, size);
            return ptr;
        }
        // A fresh anonymous mapping reads as zeros.
        self.alloc(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        if !is_block(&layout) && !is_block(&new_layout) {
            // Growing a small buffer in place, as the system allocator can.
            return System.realloc(ptr, layout, new_size);
        }
        if is_block(&layout) && is_block(&new_layout) && mapped_size(&layout) == mapped_size(&new_layout) {
            return ptr;
        }
        let new = self.alloc(new_layout);
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !is_block(&layout) {
            return System.dealloc(ptr, layout);
        }
        let size = mapped_size(&layout);
        if !self.keep(ptr, size) {
            libc::munmap(ptr as *mut libc::c_void, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_block_is_reused_for_the_same_size_and_zeroed_on_request() {
        let a = BlockAllocator::new();
        let big = Layout::from_size_align(3 << 20, 8).unwrap();
        unsafe {
            let p = a.alloc(big);
            assert!(!p.is_null());
            assert_eq!(p as usize % PAGE, 0);
            std::ptr::write_bytes(p, 0xAB, big.size());
            a.dealloc(p, big);
            // The same size: the same buffer, zeroed when asked.
            let q = a.alloc_zeroed(big);
            assert_eq!(q, p);
            assert!(std::slice::from_raw_parts(q, big.size()).iter().all(|&b| b == 0));
            // Another size while it is held: another buffer.
            let other = Layout::from_size_align(2 << 20, 8).unwrap();
            let r = a.alloc(other);
            assert!(!r.is_null() && r != q);
            std::ptr::write_bytes(r, 1, other.size());
            a.dealloc(q, big);
            a.dealloc(r, other);
            // Two freed of one size come back one after the other.
            let (x, y) = (a.alloc(big), a.alloc(big));
            assert!(x != y && [x, y].contains(&p));
            a.dealloc(x, big);
            a.dealloc(y, big);
            // Growing across the threshold keeps the contents, both ways.
            let small = Layout::from_size_align(4096, 8).unwrap();
            let g = a.alloc(small);
            std::ptr::write_bytes(g, 7, small.size());
            let grown = a.realloc(g, small, big.size());
            assert!(std::slice::from_raw_parts(grown, small.size()).iter().all(|&b| b == 7));
            let shrunk = a.realloc(grown, big, small.size());
            assert!(std::slice::from_raw_parts(shrunk, small.size()).iter().all(|&b| b == 7));
            a.dealloc(shrunk, small);
            // Small allocations are the system's.
            let small = Layout::from_size_align(64, 8).unwrap();
            let s = a.alloc(small);
            assert!(!s.is_null());
            a.dealloc(s, small);
        }
    }

    #[test]
    fn more_sizes_than_classes_are_unmapped_not_lost() {
        let a = BlockAllocator::new();
        let layouts: Vec<Layout> = (0..CLASSES + 4).map(|k| Layout::from_size_align(LARGE + k * PAGE, 8).unwrap()).collect();
        unsafe {
            let ptrs: Vec<*mut u8> = layouts.iter().map(|l| a.alloc(*l)).collect();
            for (p, l) in ptrs.iter().zip(&layouts) {
                a.dealloc(*p, *l);
            }
            // Every class slot holds one size; the rest were unmapped.
            let free = a.free.lock().unwrap();
            assert_eq!(free.classes.iter().filter(|c| c.head != 0).count(), CLASSES);
            assert_eq!(free.bytes, free.classes.iter().map(|c| c.size).sum::<usize>());
        }
    }

    #[test]
    fn no_more_than_the_bound_is_kept() {
        let a = BlockAllocator::new();
        // Panels of a pivoted LU: a different large size at every step.
        let layouts: Vec<Layout> = (1..=8).map(|k| Layout::from_size_align(k * (32 << 20), 8).unwrap()).collect();
        unsafe {
            let ptrs: Vec<*mut u8> = layouts.iter().map(|l| a.alloc(*l)).collect();
            for (p, l) in ptrs.iter().zip(&layouts) {
                a.dealloc(*p, *l);
            }
            let kept = a.free.lock().unwrap().bytes;
            assert!(kept <= KEEP_AT_MOST && kept > 0, "{kept}");
            // Taking one back lowers the count; the reused buffer is the kept one.
            let small = layouts[0];
            let again = a.alloc(small);
            assert_eq!(again, ptrs[0]);
            assert_eq!(a.free.lock().unwrap().bytes, kept - small.size());
            a.dealloc(again, small);
        }
    }

    #[test]
    fn a_kept_buffer_of_another_size_is_unmapped_before_the_peak_would_grow() {
        let a = BlockAllocator::new();
        // A tournament node's 2b x b stack beside b x b blocks.
        let (stack, block) = (Layout::from_size_align(4 << 20, 8).unwrap(), Layout::from_size_align(2 << 20, 8).unwrap());
        unsafe {
            let s = a.alloc(stack);
            let x = a.alloc(block);
            a.dealloc(s, stack);
            a.dealloc(x, block);
            let (bytes, live, peak) = {
                let f = a.free.lock().unwrap();
                (f.bytes, f.live, f.peak_live)
            };
            assert_eq!((bytes, live, peak), (6 << 20, 0, 6 << 20));
            // Blocks only from now on: the first is the kept one, then the
            // stack's buffer goes rather than the footprint growing past 6 MiB.
            let held: Vec<*mut u8> = (0..3).map(|_| a.alloc(block)).collect();
            assert_eq!(held[0], x);
            let f = a.free.lock().unwrap();
            assert_eq!((f.bytes, f.live, f.peak_live), (0, 6 << 20, 6 << 20));
            drop(f);
            // A fourth block raises the peak itself; every block stays kept.
            let more = a.alloc(block);
            for p in held.into_iter().chain([more]) {
                a.dealloc(p, block);
            }
            let f = a.free.lock().unwrap();
            assert_eq!((f.bytes, f.live, f.peak_live), (8 << 20, 0, 8 << 20));
        }
    }
}
