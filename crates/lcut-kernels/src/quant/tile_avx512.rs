//! The tile's products on AVX-512 VNNI: one 512-bit register holds a step
//! (four values of each of sixteen rows) and `vpdpbusd` against four
//! activation bytes broadcast to every lane adds each row's four products
//! into its own lane. Up to eight activation rows share a pass, each with
//! two chains of `vpdpbusd` (even and odd steps, added at the block's end:
//! the same integers), so that sixteen independent chains cover the
//! instruction's latency; four rows of one chain each had left the unit
//! waiting on it (105 against 150 GMAC/s on one Sapphire Rapids core).
//! (Why this is not one body with `tile_avx2.rs`: see there.)

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512i, _mm512_add_epi32, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps,
    _mm512_loadu_epi32, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mul_ps, _mm512_mullo_epi32,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_storeu_ps,
    _mm512_sub_epi32,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::tile::{ActPtrs, BLOCK_BYTES, GROUP_AVX512, Scaling, TILE, Tile};

/// The tile against the activation rows `a` (at most [`GROUP_AVX512`])
/// into `out[i]`, one lane per row.
pub(super) fn group(t: &Tile, a: &[Q8Row<'_>], out: &mut [[f32; TILE]; GROUP_AVX512]) {
    assert!(
        Isa::Avx512.available(),
        "the AVX-512 tile needs AVX-512 VNNI"
    );
    // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were checked above.
    unsafe {
        match a.len() {
            8 => run::<8>(t, a, out),
            7 => run::<7>(t, a, out),
            6 => run::<6>(t, a, out),
            5 => run::<5>(t, a, out),
            4 => run::<4>(t, a, out),
            3 => run::<3>(t, a, out),
            2 => run::<2>(t, a, out),
            _ => run::<1>(t, a, out),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn run<const A: usize>(t: &Tile, a: &[Q8Row<'_>], out: &mut [[f32; TILE]; GROUP_AVX512]) {
    let blocks = t.blocks();
    assert!(t.q.len() >= blocks * BLOCK_BYTES && t.d.len() >= blocks * TILE);
    assert!(t.e.len() >= blocks * TILE || t.scaling == Scaling::Centered);
    assert!(t.sc.len() >= 2 * blocks * TILE || t.scaling == Scaling::Offset);
    let p: [ActPtrs; A] = std::array::from_fn(|i| ActPtrs::of(&a[i], blocks));
    let mut acc = [_mm512_setzero_ps(); A];
    for b in 0..blocks {
        // SAFETY: block `b` of the tile's values is in bounds (checked above).
        let wb = unsafe { t.q.as_slice().as_ptr().add(b * BLOCK_BYTES) };
        // the integer sums of steps `steps` for every activation row, the
        // even and odd steps in two chains (integers: the same sums)
        let sums = |steps: std::ops::Range<usize>| {
            let mut even = [_mm512_setzero_si512(); A];
            let mut odd = [_mm512_setzero_si512(); A];
            for k in steps.step_by(2) {
                // SAFETY: steps k and k + 1 of block b are 128 readable bytes; unaligned loads.
                let (w0, w1) = unsafe {
                    (
                        _mm512_loadu_si512(wb.add(k * 64).cast::<__m512i>()),
                        _mm512_loadu_si512(wb.add(k * 64 + 64).cast::<__m512i>()),
                    )
                };
                for i in 0..A {
                    // SAFETY: b < blocks and k + 1 < 8.
                    let (x0, x1) = unsafe { (p[i].word(b, k), p[i].word(b, k + 1)) };
                    even[i] = _mm512_dpbusd_epi32(even[i], w0, _mm512_set1_epi32(x0));
                    odd[i] = _mm512_dpbusd_epi32(odd[i], w1, _mm512_set1_epi32(x1));
                }
            }
            std::array::from_fn::<_, A, _>(|i| _mm512_add_epi32(even[i], odd[i]))
        };
        // SAFETY: the block's 16 scales are in bounds (checked above).
        let d = unsafe { _mm512_loadu_ps(t.d.as_ptr().add(b * TILE)) };
        match t.scaling {
            Scaling::Offset => {
                let isum = sums(0..8);
                // SAFETY: the block's 16 offsets are in bounds (checked above).
                let e = unsafe { _mm512_loadu_ps(t.e.as_ptr().add(b * TILE)) };
                for i in 0..A {
                    // SAFETY: b < blocks.
                    let (ad, s) = unsafe { p[i].scales(b) };
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(ad));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), scale, acc[i]);
                    acc[i] = _mm512_fmadd_ps(e, _mm512_set1_ps(s), acc[i]);
                }
            }
            Scaling::Centered => {
                let halves = [sums(0..4), sums(4..8)];
                // SAFETY: the block's 32 half scales are in bounds (checked above).
                let sc = unsafe {
                    [
                        _mm512_loadu_epi32(t.sc.as_ptr().add(2 * b * TILE)),
                        _mm512_loadu_epi32(t.sc.as_ptr().add((2 * b + 1) * TILE)),
                    ]
                };
                for i in 0..A {
                    let mut isum = _mm512_setzero_si512();
                    for (h, half) in halves.iter().enumerate() {
                        // SAFETY: b < blocks, h < 2.
                        let offset = _mm512_set1_epi32(32 * unsafe { p[i].sum16(b, h) });
                        let centered = _mm512_sub_epi32(half[i], offset);
                        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sc[h], centered));
                    }
                    // SAFETY: b < blocks.
                    let (ad, _) = unsafe { p[i].scales(b) };
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(ad));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i]);
                }
            }
        }
    }
    for i in 0..A {
        // SAFETY: `out[i]` is 16 writable f32; unaligned store.
        unsafe { _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]) };
    }
}
