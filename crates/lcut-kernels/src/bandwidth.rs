//! The machine's memory read bandwidth: how fast `threads` threads can
//! stream a buffer far larger than the caches. A decode step reads every
//! weight once (and the K/V it attends to), so bytes per token over this
//! rate bounds tokens per second.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadBandwidth {
    /// Threads that read.
    pub threads: usize,
    /// Bytes read per pass.
    pub bytes: usize,
    /// The best pass, in GB/s (10^9 bytes per second).
    pub gb_per_s: f64,
}

/// Default buffer: 256 MiB, eight times a large L3 cache.
pub const DEFAULT_BYTES: usize = 256 << 20;

/// Read a buffer of `bytes` (at least 1 MiB) `passes` times with `threads`
/// threads (each its own contiguous part) and report the best pass.
pub fn measure_read(bytes: usize, threads: usize, passes: usize) -> ReadBandwidth {
    let threads = threads.max(1);
    let words = (bytes.max(1 << 20) / 8).div_ceil(threads * 64) * threads * 64;
    // touching every page now keeps page faults out of the timed passes
    let buf: Vec<u64> = (0..words as u64).collect();
    let per = words / threads;
    let mut best = Duration::MAX;
    for _ in 0..passes.max(1) {
        let barrier = Barrier::new(threads);
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(per)
                .map(|part| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        let start = Instant::now();
                        std::hint::black_box(sum_words(part));
                        (start, Instant::now())
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let start = spans.iter().map(|s| s.0).min();
        let end = spans.iter().map(|s| s.1).max();
        if let (Some(a), Some(b)) = (start, end) {
            best = best.min(b - a);
        }
    }
    let bytes = words * 8;
    ReadBandwidth {
        threads,
        bytes,
        gb_per_s: bytes as f64 / best.as_secs_f64() / 1e9,
    }
}

/// A wrapping sum over eight independent lanes (the compiler vectorizes it,
/// so the loop is bound by memory, not by additions).
fn sum_words(xs: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(v);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &v| a.wrapping_add(v));
    lanes.iter().fold(tail, |a, &v| a.wrapping_add(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_buffer_reads_at_a_positive_rate_and_sums_every_word() {
        let r = measure_read(1 << 20, 2, 2);
        assert_eq!(r.threads, 2);
        assert!(r.bytes >= 1 << 20);
        assert!(r.gb_per_s.is_finite() && r.gb_per_s > 0.0);
        let xs: Vec<u64> = (0..1003).collect();
        assert_eq!(sum_words(&xs), 1002 * 1003 / 2);
    }
}
