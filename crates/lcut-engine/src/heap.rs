//! How the process's allocator treats the prefill's large buffers.
//!
//! A prefill chunk's products allocate and free buffers of several MiB every
//! layer (16 MB for a 1B model's MLP over 512 tokens). glibc gives such
//! buffers back to the kernel on free and faults them in again on the next
//! product: a 1B prefill bench took 1.3 million page faults and spent a
//! tenth to a fifth of its CPU time in the kernel. [`keep_freed_buffers`]
//! keeps them in the heap instead (faults 4x fewer, kernel time 2.1 s ->
//! 0.6 s, TTFT 4-15% lower), for the `lcut` binary and for the Python
//! module, at the cost of up to [`HEAP_KEPT`] bytes of freed memory held at
//! the heap's top.

/// Heap buffers up to this size come from the heap rather than a mapping
/// of their own (64 MiB: an 8B model's MLP output over a 512-token chunk is
/// 29 MB).
pub const HEAP_BUFFERS_UP_TO: usize = 64 << 20;

/// Free memory at the heap's top kept for the next allocation, not handed
/// back to the kernel.
pub const HEAP_KEPT: usize = 256 << 20;

/// The environment variable that, set to `0`, leaves the allocator's own
/// thresholds in place.
pub const KEEP_FREED_BUFFERS_VAR: &str = "LCUT_KEEP_FREED_BUFFERS";

/// Tell glibc's allocator to serve buffers up to [`HEAP_BUFFERS_UP_TO`]
/// from its heap and to keep up to [`HEAP_KEPT`] free at the heap's top;
/// returns whether it was told. Does nothing (false) on other allocators
/// and platforms, or where `LCUT_KEEP_FREED_BUFFERS=0`. The setting is the
/// whole process's: call it where lcut owns the process or where its host
/// accepts that (the Python module calls it when imported).
#[allow(unsafe_code)]
pub fn keep_freed_buffers() -> bool {
    if std::env::var(KEEP_FREED_BUFFERS_VAR).is_ok_and(|v| v.trim() == "0") {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets the allocator's thresholds; glibc takes
        // its own lock, so other threads may be allocating. Both values fit
        // an int (asserted below).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_BUFFERS_UP_TO as libc::c_int) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_KEPT as libc::c_int) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// Hand the heap's free memory back to the kernel (glibc's `malloc_trim`),
/// below [`HEAP_KEPT`] too: for after a one-off build whose transient
/// buffers would otherwise stay resident for the whole run (a 262k-token
/// GGUF vocabulary's tokenizer). Returns whether memory was released; does
/// nothing (false) on other allocators and platforms.
#[allow(unsafe_code)]
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only returns free pages of the heap to the
        // kernel; glibc takes its own lock.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

// an 8B model's MLP output over a 512-token chunk (f32) fits the heap, and
// both thresholds fit mallopt's int
const _: () = assert!(HEAP_BUFFERS_UP_TO >= 14336 * 512 * 4);
const _: () = assert!(HEAP_KEPT >= HEAP_BUFFERS_UP_TO && HEAP_KEPT <= i32::MAX as usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_takes_both_thresholds() {
        let asked = std::env::var(KEEP_FREED_BUFFERS_VAR).map_or(true, |v| v.trim() != "0");
        let glibc = cfg!(all(target_os = "linux", target_env = "gnu"));
        assert_eq!(keep_freed_buffers(), asked && glibc);
    }
}
