//! A byte buffer whose start is aligned to a cache line, so that the
//! 32-byte loads of the interleaved kernels never straddle two lines; a
//! model's weights may instead sit on 2 MiB pages ([`AlignedBytes::for_weights`]).

#![allow(unsafe_code)]

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `len` bytes starting on a 64-byte boundary, zero-filled when made.
#[derive(Default)]
pub(crate) struct AlignedBytes {
    storage: Storage,
    len: usize,
}

/// Where the bytes live.
enum Storage {
    /// On the allocator's heap.
    Lines(Vec<Line>),
    /// In a mapping of their own, whose whole 2 MiB pages the kernel is
    /// asked to back with huge pages.
    #[cfg(target_os = "linux")]
    Huge(huge::Mapping),
}

impl Default for Storage {
    fn default() -> Self {
        Self::Lines(Vec::new())
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes")
            .field("len", &self.len)
            .finish()
    }
}

impl Clone for AlignedBytes {
    fn clone(&self) -> Self {
        let mut copy = match self.storage {
            Storage::Lines(_) => Self::zeroed(self.len),
            #[cfg(target_os = "linux")]
            Storage::Huge(_) => Self::for_weights(self.len),
        };
        copy.as_mut_slice().copy_from_slice(self.as_slice());
        copy
    }
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self {
            storage: Storage::Lines(vec![Line([0; 64]); len.div_ceil(64)]),
            len,
        }
    }

    /// `len` zero bytes that a decode step will read end to end, over and
    /// over: from [`huge::MIN_BYTES`] on, a mapping of their own starting on
    /// a 2 MiB boundary, its whole 2 MiB pages advised as huge
    /// (`MADV_HUGEPAGE`), so that streaming a model's weights takes one TLB
    /// entry per 2 MiB instead of 512. Where the kernel declines, the bytes
    /// are still there on ordinary pages.
    pub fn for_weights(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if huge::wanted(len)
            && let Some(map) = huge::Mapping::new(len)
        {
            return Self {
                storage: Storage::Huge(map),
                len,
            };
        }
        Self::zeroed(len)
    }

    /// `len` zero bytes in place of what was held, keeping the allocation.
    pub fn reset(&mut self, len: usize) {
        match &mut self.storage {
            Storage::Lines(lines) => {
                lines.clear();
                lines.resize(len.div_ceil(64), Line([0; 64]));
                self.len = len;
            }
            #[cfg(target_os = "linux")]
            Storage::Huge(map) if len <= map.capacity() => {
                // SAFETY: `len` bytes from the mapping's start are inside it.
                unsafe { std::ptr::write_bytes(map.start(), 0, len) };
                self.len = len;
            }
            #[cfg(target_os = "linux")]
            Storage::Huge(_) => *self = Self::for_weights(len),
        }
    }

    /// `len` bytes of no particular value (zeros or what an earlier use
    /// left), keeping the allocation where it is large enough: for a buffer
    /// about to be written end to end, where [`AlignedBytes::reset`]'s
    /// zeroing would be wasted work.
    pub fn resize(&mut self, len: usize) {
        match &mut self.storage {
            Storage::Lines(lines) => {
                lines.resize(len.div_ceil(64), Line([0; 64]));
                self.len = len;
            }
            #[cfg(target_os = "linux")]
            Storage::Huge(map) if len <= map.capacity() => self.len = len,
            #[cfg(target_os = "linux")]
            Storage::Huge(_) => *self = Self::for_weights(len),
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let start = match &self.storage {
            Storage::Lines(lines) => lines.as_ptr().cast::<u8>(),
            #[cfg(target_os = "linux")]
            Storage::Huge(map) => map.start().cast_const(),
        };
        // SAFETY: either storage holds at least `len` initialised bytes (a
        // `Line` is a plain byte array with no padding; a fresh anonymous
        // mapping reads as zeros), borrowed for the lifetime of `&self`.
        unsafe { std::slice::from_raw_parts(start, self.len) }
    }

    /// The bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let start = match &mut self.storage {
            Storage::Lines(lines) => lines.as_mut_ptr().cast::<u8>(),
            #[cfg(target_os = "linux")]
            Storage::Huge(map) => map.start(),
        };
        // SAFETY: as in `as_slice`, borrowed mutably and exclusively through
        // `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(start, self.len) }
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the bytes sit in a mapping advised for huge pages.
    #[cfg(test)]
    fn on_huge_pages(&self) -> bool {
        match self.storage {
            Storage::Lines(_) => false,
            #[cfg(target_os = "linux")]
            Storage::Huge(_) => true,
        }
    }
}

/// The environment variable that, set to `0`, keeps the weights on the
/// allocator's heap, on ordinary pages (to compare).
pub const HUGE_PAGES_VAR: &str = "LCUT_HUGE_PAGES";

/// Whether `LCUT_HUGE_PAGES=0` keeps the weights on the heap.
pub fn huge_pages_turned_off() -> bool {
    turned_off(std::env::var(HUGE_PAGES_VAR).ok().as_deref())
}

/// Whether the variable's value `var` turns the mappings off.
fn turned_off(var: Option<&str>) -> bool {
    var.is_some_and(|v| v.trim() == "0")
}

/// Bytes of the process's anonymous memory that the kernel holds on huge
/// pages (its `AnonHugePages` count: a loaded model's packed weights, most
/// of it); None where the kernel does not say (not Linux).
pub fn huge_page_bytes() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = text.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Anonymous mappings on 2 MiB boundaries, advised as huge pages.
#[cfg(target_os = "linux")]
pub(crate) mod huge {
    /// A huge page.
    pub const PAGE: usize = 2 << 20;

    /// Buffers from this size on get a mapping of their own (the smallest
    /// that holds one whole huge page wherever it starts is 2 MiB; below 4
    /// MiB the share of ordinary pages left at the end would be large).
    pub const MIN_BYTES: usize = 4 << 20;

    /// Whether a buffer of `len` bytes should get a mapping of its own.
    pub fn wanted(len: usize) -> bool {
        len >= MIN_BYTES && !super::huge_pages_turned_off()
    }

    /// [`wanted`], given the variable's value.
    #[cfg(test)]
    pub(super) fn wanted_with(len: usize, var: Option<&str>) -> bool {
        len >= MIN_BYTES && !super::turned_off(var)
    }

    /// `capacity` zero bytes starting on a 2 MiB boundary.
    pub struct Mapping {
        base: *mut libc::c_void,
        mapped: usize,
        start: *mut u8,
        capacity: usize,
    }

    // SAFETY: the mapping is owned memory like a Vec's, reached only through
    // `AlignedBytes`, whose borrows guard it.
    unsafe impl Send for Mapping {}
    // SAFETY: as above; shared access only reads.
    unsafe impl Sync for Mapping {}

    impl Mapping {
        /// A fresh mapping of `capacity` zero bytes (None where mmap fails).
        /// Only the whole huge pages inside the buffer are advised, so that
        /// no page reaches past its end and the resident memory stays the
        /// buffer's size.
        pub fn new(capacity: usize) -> Option<Self> {
            let mapped = capacity.checked_add(PAGE)?;
            // SAFETY: a private anonymous mapping of `mapped` bytes, owned
            // by the returned value and unmapped on drop.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    mapped,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let offset = (base as usize).next_multiple_of(PAGE) - base as usize;
            // SAFETY: `offset < PAGE`, so `start` and `capacity` bytes after
            // it lie inside the mapping.
            let start = unsafe { base.cast::<u8>().add(offset) };
            let whole = capacity / PAGE * PAGE;
            if whole > 0 {
                // SAFETY: advice on a range of the mapping; a refusal (a
                // kernel without transparent huge pages) leaves ordinary
                // pages, which is still correct.
                let _ = unsafe { libc::madvise(start.cast(), whole, libc::MADV_HUGEPAGE) };
            }
            Some(Self {
                base,
                mapped,
                start,
                capacity,
            })
        }

        /// The first byte.
        pub fn start(&self) -> *mut u8 {
            self.start
        }

        /// Bytes usable from the start.
        pub fn capacity(&self) -> usize {
            self.capacity
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: `base` and `mapped` are this value's own mapping, and
            // no borrow of it outlives the value.
            unsafe { libc::munmap(self.base, self.mapped) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn weights_get_a_mapping_of_their_own_on_a_huge_page_boundary() {
        let len = huge::MIN_BYTES + 12345;
        let mut w = AlignedBytes::for_weights(len);
        if huge::wanted(len) {
            assert!(w.on_huge_pages(), "mmap of {len} bytes failed");
            assert_eq!(w.as_slice().as_ptr() as usize % huge::PAGE, 0);
        }
        assert_eq!(w.len(), len);
        assert!(w.as_slice().iter().all(|&x| x == 0));
        w.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 251) as u8);
        let copy = w.clone();
        assert_eq!(copy.on_huge_pages(), w.on_huge_pages());
        assert_eq!(copy.as_slice(), w.as_slice());
        w.reset(len - 1000);
        assert_eq!(w.len(), len - 1000);
        assert!(w.as_slice().iter().all(|&x| x == 0));
        w.reset(2 * len);
        assert_eq!(w.len(), 2 * len);
        assert!(w.as_slice().iter().all(|&x| x == 0));
        // small buffers stay on the heap
        assert!(!AlignedBytes::for_weights(huge::MIN_BYTES - 1).on_huge_pages());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_variable_turns_the_mappings_off() {
        let big = huge::MIN_BYTES;
        assert!(huge::wanted_with(big, None));
        assert!(huge::wanted_with(big, Some("1")));
        assert!(!huge::wanted_with(big, Some(" 0 ")));
        assert!(!huge::wanted_with(big - 1, None));
        assert!(huge_page_bytes().is_some());
    }

    #[test]
    fn the_bytes_start_on_a_cache_line_and_keep_their_length() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let mut b = AlignedBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice()
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as u8);
            assert!(b.as_slice().iter().enumerate().all(|(i, &x)| x == i as u8));
            b.reset(len / 2);
            assert_eq!(b.len(), len / 2);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    }
}
