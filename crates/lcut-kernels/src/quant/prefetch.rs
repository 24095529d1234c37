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
//! thread). On an AMD EPYC of Zen 3 (family 25, model 1: a 2-vCPU virtual
//! machine, AVX2 only) this one made decode faster too, interleaved, 2
//! threads: SmolLM2-135M Q4_1 in all 6 rounds (1.09-1.48x), the
//! Llama-3.2-1B shape in Q4_K_M in 6 of 8 (0.92-1.18x, medians 49.1 and
//! 45.7 ms; `docs/performance-decode.md`). So the default is on for Intel
//! CPUs and for EPYCs of Zen 3 (family 25, models 0-15), the AMD CPUs that
//! were measured; `LCUT_PREFETCH` (bytes, 0 for none) sets the distance on
//! any CPU.

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// The distance used on the CPUs that prefetch by default
/// ([`prefetches_by_default`]) when `LCUT_PREFETCH` is not set.
pub const DEFAULT_DISTANCE: usize = 4096;

/// How many bytes ahead of the block being read the products ask for the
/// weights (0: they do not); decided once per process.
pub fn distance() -> usize {
    static CHOSEN: OnceLock<usize> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let set = std::env::var("LCUT_PREFETCH").ok();
        let (bytes, ignored) = chosen(set.as_deref(), this_cpu_prefetches());
        if let Some(value) = ignored {
            eprintln!(
                "LCUT_PREFETCH={value:?} is not a number of bytes: prefetching {bytes} B ahead"
            );
        }
        bytes
    })
}

/// The distance for `LCUT_PREFETCH`'s value `set` on a CPU that prefetches
/// by default or not, and the value when it was set but is not a number of
/// bytes (the default then holds).
fn chosen(set: Option<&str>, by_default: bool) -> (usize, Option<String>) {
    let default = if by_default { DEFAULT_DISTANCE } else { 0 };
    match set.map(str::trim) {
        None | Some("") => (default, None),
        Some(value) => match value.parse() {
            Ok(bytes) => (bytes, None),
            Err(_) => (default, Some(value.to_string())),
        },
    }
}

/// Whether a CPU of this `vendor` string, display `family` and `model`
/// (CPUID leaf 1, the extended fields added in) prefetches by default: every
/// Intel CPU, and AMD's family 25 models 0-15 (Zen 3 EPYCs), the AMD CPUs on
/// which the prefetch was measured faster (the module's note).
fn prefetches_by_default(vendor: &[u8; 12], family: u32, model: u32) -> bool {
    match vendor {
        b"GenuineIntel" => true,
        b"AuthenticAMD" => family == 0x19 && model < 0x10,
        _ => false,
    }
}

/// [`prefetches_by_default`] for the CPU this runs on.
fn this_cpu_prefetches() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
        let (family, model) = family_and_model(std::arch::x86_64::__cpuid(1).eax);
        prefetches_by_default(&vendor, family, model)
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The display family and model of CPUID leaf 1's `eax`: the extended
/// fields count where the base family is 15 (and, for the model, 6).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn family_and_model(eax: u32) -> (u32, u32) {
    let (base_family, ext_family) = ((eax >> 8) & 0xf, (eax >> 20) & 0xff);
    let (base_model, ext_model) = ((eax >> 4) & 0xf, (eax >> 16) & 0xf);
    let family = match base_family {
        0xf => base_family + ext_family,
        f => f,
    };
    let model = match base_family {
        0x6 | 0xf => (ext_model << 4) | base_model,
        _ => base_model,
    };
    (family, model)
}

/// Ask for the cache lines that start within the block `distance` bytes
/// past `block` (as many bytes as `block` holds) to be brought into L2;
/// nothing when `distance` is 0. Blocks follow one another in a thread's
/// part, so every line is asked for once: a block of 144 bytes (Q4_0's
/// eight rows) asks for two or three lines, not three at every 64 bytes of
/// an unaligned start, which asked for a quarter of the lines twice and
/// made one thread's Q4_0 product from memory 10% slower (11.6-12.2 GB/s
/// against 13.0-13.3). A prefetch never faults, so addresses past the end
/// of the matrix are harmless.
#[inline(always)]
pub(crate) fn ahead(block: &[u8], distance: usize) {
    #[cfg(target_arch = "x86_64")]
    if distance > 0 {
        let at = block.as_ptr();
        for line in lines_ahead(at as usize, block.len(), distance) {
            // SAFETY: a prefetch reads nothing and cannot fault; SSE is part
            // of x86-64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    at.wrapping_add(line).cast::<i8>(),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (block, distance);
}

/// The offsets from `address` of the cache lines that start within the
/// `len` bytes `distance` bytes past it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn lines_ahead(address: usize, len: usize, distance: usize) -> impl Iterator<Item = usize> {
    let from = address.wrapping_add(distance);
    let first = from.next_multiple_of(64).wrapping_sub(from);
    (first..len).step_by(64).map(move |l| distance + l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_sets_the_distance_and_the_measured_cpus_get_the_default() {
        assert_eq!(chosen(None, true), (DEFAULT_DISTANCE, None));
        assert_eq!(chosen(None, false), (0, None));
        assert_eq!(chosen(Some("0"), true), (0, None));
        assert_eq!(chosen(Some(" 4096 "), false), (4096, None));
        assert_eq!(chosen(Some(""), false), (0, None));
        assert_eq!(
            chosen(Some("2k"), true),
            (DEFAULT_DISTANCE, Some("2k".to_string()))
        );
        // Intel, Zen 3 EPYC (family 25, model 1) on; Zen 4 (family 25,
        // model 17), Zen 2 (family 23) and other vendors off
        assert!(prefetches_by_default(b"GenuineIntel", 6, 0x8f));
        assert!(prefetches_by_default(b"AuthenticAMD", 0x19, 0x01));
        assert!(!prefetches_by_default(b"AuthenticAMD", 0x19, 0x11));
        assert!(!prefetches_by_default(b"AuthenticAMD", 0x17, 0x31));
        assert!(!prefetches_by_default(b"HygonGenuine", 0x18, 0x01));
    }

    #[test]
    fn cpuid_signatures_give_their_family_and_model() {
        // EPYC 7763 (Zen 3), EPYC 9654 (Zen 4), Xeon of Sapphire Rapids,
        // and a family-5 Pentium, whose extended fields do not count
        assert_eq!(family_and_model(0x00a0_0f11), (0x19, 0x01));
        assert_eq!(family_and_model(0x00a1_0f11), (0x19, 0x11));
        assert_eq!(family_and_model(0x0008_06f8), (6, 0x8f));
        assert_eq!(family_and_model(0x00f1_0543), (5, 4));
    }

    #[test]
    fn consecutive_blocks_ask_for_every_line_once() {
        // block sizes of Q4_0, Q4_1, Q8_0 and Q6_K's eight rows, streams
        // starting on a line and off it
        for (block, distance, start) in [
            (144, 4096, 0),
            (160, 4096, 64),
            (272, 2048, 0),
            (1680, 4096, 8),
        ] {
            let asked: Vec<usize> = (0..64)
                .flat_map(|b| {
                    let at = start + b * block;
                    lines_ahead(at, block, distance).map(move |l| at + l)
                })
                .collect();
            let first = (start + distance).next_multiple_of(64);
            let want: Vec<usize> = (first..start + distance + 64 * block).step_by(64).collect();
            assert_eq!(asked, want, "block {block}");
        }
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
