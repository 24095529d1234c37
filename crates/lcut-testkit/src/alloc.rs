//! A global allocator that remembers the largest single allocation, so a
//! damaged-file test can assert that no loader allocates what a header
//! merely claims (a tensor of 2^40 elements, a length of 2^60) before
//! checking it against the file.
//!
//! A test binary opts in with
//! `#[global_allocator] static ALLOC: LargestAlloc = LargestAlloc;` and
//! reads [`largest_allocation`] afterwards. The figure is shared by every
//! test of the binary (tests run on several threads).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, recording the largest size ever asked of it.
pub struct LargestAlloc;

#[allow(unsafe_code)]
// SAFETY: every call is forwarded unchanged to the system allocator; the
// only addition is an atomic maximum, which neither allocates nor panics.
unsafe impl GlobalAlloc for LargestAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The largest single allocation (bytes) made so far in this process, when
/// [`LargestAlloc`] is its global allocator (0 otherwise).
pub fn largest_allocation() -> usize {
    LARGEST.load(Ordering::Relaxed)
}
