//! How many threads candle's CPU kernels use.
//!
//! candle asks for its thread count on every CPU matrix product, and without
//! `RAYON_NUM_THREADS` in the environment it counts the physical cores by
//! reading and parsing /proc/cpuinfo each time: tens of times per decode
//! step, a sixth of a tiny model's run on a 2-core machine and far more on a
//! server whose /proc/cpuinfo lists many cores. [`pin_thread_count`] fixes
//! the count once.

/// Sets `RAYON_NUM_THREADS` to the number of physical cores unless it is
/// set already; returns the count in force.
///
/// # Safety
///
/// The caller must be the process's only thread (first thing in `main`):
/// changing the environment while another thread may read it is undefined
/// behaviour.
#[allow(unsafe_code)]
pub unsafe fn pin_thread_count() -> usize {
    if let Some(n) = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    let n = num_cpus::get_physical().max(1);
    // SAFETY: the caller guarantees no other thread exists.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    n
}
