//! Software prefetch of a packed matrix's weights a fixed distance ahead of
//! the group block a decode product reads.
//!
//! Each thread of a decode step streams its part of every matrix once, and
//! a part starts cold. On an Intel Xeon virtual machine (AVX-512 VNNI and
//! AMX, 2 vCPUs, 480 MiB of L3 shared with the host's other guests) the
//! hardware prefetchers alone left decode waiting on the weights. Asking
//! for them 4 KiB ahead into L2 (`prefetcht1`) made a step faster in every
//! interleaved round (`LCUT_PREFETCH=0` against the default, 2 threads,
//! 128 new tokens): SmolLM2-135M Q4_1 1.69-2.10x (TPOT 10.9-12.0 ms to
//! 5.3-6.7), the Llama-3.2-1B shape 1.24-1.33x in Q4_0 (66-68 ms to 51-54)
//! and 1.11-1.22x in Q4_K_M, and on the AVX2 kernels 1.12-1.86x and
//! 1.32-1.37x (`docs/performance-decode.md`, "On an Intel Xeon with AMX").
//! Against 2 and 8 KiB, 4 KiB was the best or within 1% of the best on
//! each of those files, so it is the one default; an earlier run found
//! `prefetcht0` (into L1) gaining less at that distance. On AMD Zen 4 a 2 KiB
//! `prefetcht0` in the Q6_K product had slowed it a little (from DRAM, one
//! thread), and no AMD CPU has been measured with this one, so the default
//! is on for Intel CPUs only; `LCUT_PREFETCH` (bytes, 0 for none) sets the
//! distance on any CPU.

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// The distance used on Intel CPUs when `LCUT_PREFETCH` is not set.
pub const INTEL_DISTANCE: usize = 4096;

/// How many bytes ahead of the block being read the products ask for the
/// weights (0: they do not); decided once per process.
pub fn distance() -> usize {
    static CHOSEN: OnceLock<usize> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let set = std::env::var("LCUT_PREFETCH").ok();
        let (bytes, ignored) = chosen(set.as_deref(), is_intel());
        if let Some(value) = ignored {
            eprintln!(
                "LCUT_PREFETCH={value:?} is not a number of bytes: prefetching {bytes} B ahead"
            );
        }
        bytes
    })
}

/// The distance for `LCUT_PREFETCH`'s value `set` on an Intel CPU or not,
/// and the value when it was set but is not a number of bytes (the default
/// then holds).
fn chosen(set: Option<&str>, intel: bool) -> (usize, Option<String>) {
    let default = if intel { INTEL_DISTANCE } else { 0 };
    match set.map(str::trim) {
        None | Some("") => (default, None),
        Some(value) => match value.parse() {
            Ok(bytes) => (bytes, None),
            Err(_) => (default, Some(value.to_string())),
        },
    }
}

/// Whether the CPU's vendor string is Intel's.
fn is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
        &vendor == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Ask for the bytes of the block `distance` bytes past `block` (as many
/// as `block` holds, every cache line of them) to be brought into L2;
/// nothing when `distance` is 0. A prefetch never faults, so addresses past
/// the end of the matrix are harmless.
#[inline(always)]
pub(crate) fn ahead(block: &[u8], distance: usize) {
    #[cfg(target_arch = "x86_64")]
    if distance > 0 {
        let from = block.as_ptr().wrapping_add(distance);
        for line in (0..block.len()).step_by(64) {
            // SAFETY: a prefetch reads nothing and cannot fault; SSE is part
            // of x86-64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    from.wrapping_add(line).cast::<i8>(),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (block, distance);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_sets_the_distance_and_intel_gets_the_default() {
        assert_eq!(chosen(None, true), (INTEL_DISTANCE, None));
        assert_eq!(chosen(None, false), (0, None));
        assert_eq!(chosen(Some("0"), true), (0, None));
        assert_eq!(chosen(Some(" 4096 "), false), (4096, None));
        assert_eq!(chosen(Some(""), false), (0, None));
        assert_eq!(
            chosen(Some("2k"), true),
            (INTEL_DISTANCE, Some("2k".to_string()))
        );
    }

    #[test]
    fn prefetching_past_the_end_of_the_weights_reads_nothing() {
        let block = [7u8; 144];
        ahead(&block[100..], 1 << 20);
        ahead(&block, 1 << 20);
        ahead(&block, 0);
        assert!(block.iter().all(|&b| b == 7));
    }
}
