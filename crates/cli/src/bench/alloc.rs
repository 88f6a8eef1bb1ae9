//! A counting global allocator for `bench lookup`'s bytes-per-dentry measurement.
//!
//! It wraps the system allocator. While [`enable`]d it adds the size of every allocation to a
//! live-bytes counter and subtracts the size of every deallocation (and the size change of every
//! reallocation); while disabled it only pays one relaxed atomic load per call. Next to the
//! requested sizes it counts the allocator's footprint: glibc's usable size of each block plus
//! its 8-byte chunk header (what the blocks really take: a 10-byte name takes a 32-byte chunk).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);
static FOOT: AtomicI64 = AtomicI64::new(0);

/// glibc's chunk header per block (64-bit).
const CHUNK_HEADER: i64 = 8;

/// The footprint of the block at `p` (its usable size and chunk header).
fn footprint(p: *mut u8) -> i64 {
    // SAFETY: `p` is a live block from `System` (glibc malloc, memalign or realloc).
    let n = unsafe { libc::malloc_usable_size(p.cast()) };
    n as i64 + CHUNK_HEADER
}

pub struct Counting;

#[global_allocator]
static GLOBAL: Counting = Counting;

#[inline]
fn count(delta: i64) {
    if ENABLED.load(Ordering::Relaxed) {
        LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

#[inline]
fn count_foot(delta: impl FnOnce() -> i64) {
    if ENABLED.load(Ordering::Relaxed) {
        FOOT.fetch_add(delta(), Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the same arguments and returns its result
// unchanged; the counting has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours (non-zero-size layout guaranteed by the caller).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
            count_foot(|| footprint(p));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
            count_foot(|| footprint(p));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_foot(|| -footprint(ptr));
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = if ENABLED.load(Ordering::Relaxed) {
            footprint(ptr)
        } else {
            0
        };
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`; the caller
        // guarantees `new_size` is valid for `layout.align()`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as i64 - layout.size() as i64);
            count_foot(|| footprint(p) - before);
        }
        p
    }
}

/// Start counting (the counter keeps its value).
pub fn enable() {
    ENABLED.store(true, Ordering::SeqCst);
}

/// Stop counting.
pub fn disable() {
    ENABLED.store(false, Ordering::SeqCst);
}

/// Bytes allocated minus bytes freed while counting was enabled.
pub fn live() -> i64 {
    LIVE.load(Ordering::SeqCst)
}

/// The same in allocator footprint (usable size + chunk header of each block).
pub fn footprint_live() -> i64 {
    FOOT.load(Ordering::SeqCst)
}
