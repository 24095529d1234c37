//! The tile's products on AVX-512 VNNI: one 512-bit register holds a step
//! (four values of each of sixteen rows) and `vpdpbusd` against four
//! activation bytes broadcast to every lane adds each row's four products
//! into its own lane.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512i, _mm512_add_epi32, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps,
    _mm512_loadu_epi32, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mul_ps, _mm512_mullo_epi32,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_storeu_ps,
    _mm512_sub_epi32,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::format::QK;
use crate::quant::tile::{BLOCK_BYTES, GROUP, Scaling, TILE, Tile};

/// The tile against the activation rows `a` (at most [`GROUP`]) into
/// `out[i]`, one lane per row.
pub(super) fn group(t: &Tile, a: &[Q8Row<'_>], out: &mut [[f32; TILE]; GROUP]) {
    assert!(
        Isa::Avx512.available(),
        "the AVX-512 tile needs AVX-512 VNNI"
    );
    // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were checked above.
    unsafe {
        match a.len() {
            4 => run::<4>(t, a, out),
            3 => run::<3>(t, a, out),
            2 => run::<2>(t, a, out),
            _ => run::<1>(t, a, out),
        }
    }
}

/// The activation bytes `4k..4k + 4` of block `b` of row `a` as one word.
pub(super) fn act_word(a: &Q8Row<'_>, b: usize, k: usize) -> i32 {
    let x = &a.q[QK * b + 4 * k..QK * b + 4 * k + 4];
    i32::from_le_bytes([x[0] as u8, x[1] as u8, x[2] as u8, x[3] as u8])
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn run<const A: usize>(t: &Tile, a: &[Q8Row<'_>], out: &mut [[f32; TILE]; GROUP]) {
    let mut acc = [_mm512_setzero_ps(); A];
    for b in 0..t.blocks() {
        let wb = &t.q[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
        // the integer sums of steps `steps` for every activation row
        let sums = |steps: std::ops::Range<usize>| {
            let mut isum = [_mm512_setzero_si512(); A];
            for k in steps {
                let w = &wb[k * 64..k * 64 + 64];
                // SAFETY: `w` is 64 readable bytes (bounds-checked above); unaligned load.
                let w = unsafe { _mm512_loadu_si512(w.as_ptr().cast::<__m512i>()) };
                for i in 0..A {
                    let x = _mm512_set1_epi32(act_word(&a[i], b, k));
                    isum[i] = _mm512_dpbusd_epi32(isum[i], w, x);
                }
            }
            isum
        };
        let d = &t.d[b * TILE..(b + 1) * TILE];
        // SAFETY: `d` is 16 readable f32 (bounds-checked above).
        let d = unsafe { _mm512_loadu_ps(d.as_ptr()) };
        match t.scaling {
            Scaling::Offset => {
                let isum = sums(0..8);
                let e = &t.e[b * TILE..(b + 1) * TILE];
                // SAFETY: `e` is 16 readable f32 (bounds-checked above).
                let e = unsafe { _mm512_loadu_ps(e.as_ptr()) };
                for i in 0..A {
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(a[i].d[b]));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), scale, acc[i]);
                    acc[i] = _mm512_fmadd_ps(e, _mm512_set1_ps(a[i].s[b]), acc[i]);
                }
            }
            Scaling::Centered => {
                let halves = [sums(0..4), sums(4..8)];
                let sc = &t.sc[2 * b * TILE..(2 * b + 2) * TILE];
                // SAFETY: `sc` is 32 readable i32 (bounds-checked above).
                let sc = unsafe {
                    [
                        _mm512_loadu_epi32(sc.as_ptr()),
                        _mm512_loadu_epi32(sc[TILE..].as_ptr()),
                    ]
                };
                for i in 0..A {
                    let mut isum = _mm512_setzero_si512();
                    for (h, half) in halves.iter().enumerate() {
                        let offset = _mm512_set1_epi32(32 * i32::from(a[i].sum16[2 * b + h]));
                        let centered = _mm512_sub_epi32(half[i], offset);
                        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sc[h], centered));
                    }
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(a[i].d[b]));
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
