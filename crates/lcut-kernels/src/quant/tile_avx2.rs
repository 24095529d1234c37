//! The tile's products on AVX2 (no VNNI): the sixteen rows in two passes
//! of eight, a 256-bit register holding four values of each of eight rows;
//! `vpmaddubsw` multiplies them with four activation bytes broadcast to
//! every lane and adds pairs into 16 bits, the 16-bit sums of as many steps
//! as stay below the saturation ([`Tile::i16_steps`]: 8 for 4-bit values, 4
//! for 5-bit, 2 for 6-bit) are added, and `vpmaddwd` against ones adds them
//! into each row's 32-bit lane, as llama.cpp's AVX2 products do. The integer sums and the
//! f32 steps per lane are those of the AVX-512 tile, so both levels give
//! the same bits. A pair with `tile_avx512.rs` because the integer step is
//! another instruction sequence (two passes and 16-bit sums here, one
//! `vpdpbusd` chain per row pair there), not only another width.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256i, _mm256_add_epi16, _mm256_add_epi32, _mm256_cvtepi32_ps, _mm256_fmadd_ps,
    _mm256_loadu_ps, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_mul_ps,
    _mm256_mullo_epi32, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_setzero_si256, _mm256_storeu_ps, _mm256_sub_epi32,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::tile::{ActPtrs, BLOCK_BYTES, GROUP, Scaling, TILE, Tile};

/// Rows of one pass (lanes of a 256-bit register).
const HALF: usize = TILE / 2;

/// The tile against the activation rows `a` (at most [`GROUP`]) into
/// `out[i]`, one lane per row.
pub(super) fn group(t: &Tile, a: &[Q8Row<'_>], out: &mut [[f32; TILE]; GROUP]) {
    assert!(
        Isa::Avx2.available(),
        "the AVX2 tile needs AVX2, FMA and F16C"
    );
    for h in 0..2 {
        match (t.scaling, t.i16_steps) {
            (Scaling::Offset, 8) => rows_of::<8, false>(t, a, h, out),
            (Scaling::Offset, _) => rows_of::<4, false>(t, a, h, out),
            (Scaling::Centered, _) => rows_of::<2, true>(t, a, h, out),
        }
    }
}

/// [`run`] for the activation rows' count.
fn rows_of<const M: usize, const CENTERED: bool>(
    t: &Tile,
    a: &[Q8Row<'_>],
    h: usize,
    out: &mut [[f32; TILE]],
) {
    if CENTERED && a.len() > 2 {
        // four rows' sums of both halves would not fit the 16 registers
        let (first, rest) = out.split_at_mut(2);
        rows_of::<M, CENTERED>(t, &a[..2], h, first);
        rows_of::<M, CENTERED>(t, &a[2..], h, rest);
        return;
    }
    // SAFETY: the caller checked AVX2, FMA and F16C.
    unsafe {
        match a.len() {
            4 => run::<4, M, CENTERED>(t, a, h, out),
            3 => run::<3, M, CENTERED>(t, a, h, out),
            2 => run::<2, M, CENTERED>(t, a, h, out),
            _ => run::<1, M, CENTERED>(t, a, h, out),
        }
    }
}

/// Rows `8h..8h + 8` of the tile against `a` into `out[i][8h..8h + 8]`,
/// `M` steps' pairs summed in 16 bits before they widen; `CENTERED`: the
/// tile's scaling is [`Scaling::Centered`] (two halves per block).
#[target_feature(enable = "avx2,fma,f16c")]
fn run<const A: usize, const M: usize, const CENTERED: bool>(
    t: &Tile,
    a: &[Q8Row<'_>],
    h: usize,
    out: &mut [[f32; TILE]],
) {
    let ones = _mm256_set1_epi16(1);
    let lanes = h * HALF..(h + 1) * HALF;
    let parts = if CENTERED { 2 } else { 1 };
    let blocks = t.blocks();
    // each row's values, checked once here rather than word by word below
    let p: [ActPtrs; A] = std::array::from_fn(|i| ActPtrs::of(&a[i], blocks));
    let mut acc = [_mm256_setzero_ps(); A];
    for b in 0..blocks {
        let wb = &t.q.as_slice()[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
        // the block's integer sum per activation row (Centered: both
        // halves centred and scaled, in integers)
        let mut total = [_mm256_setzero_si256(); A];
        for part in 0..parts {
            let mut isum = [_mm256_setzero_si256(); A];
            for first in (part * 8 / parts..(part + 1) * 8 / parts).step_by(M) {
                let mut pairs = [_mm256_setzero_si256(); A];
                for k in first..first + M {
                    let w = &wb[k * 64 + 32 * h..k * 64 + 32 * h + 32];
                    // SAFETY: `w` is 32 readable bytes (bounds-checked above); unaligned load.
                    let w = unsafe { _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()) };
                    for i in 0..A {
                        // SAFETY: b < blocks and k < 8 (the rows' bounds checked above).
                        let word = unsafe { p[i].word(b, k) };
                        let x = _mm256_set1_epi32(word);
                        pairs[i] = _mm256_add_epi16(pairs[i], _mm256_maddubs_epi16(w, x));
                    }
                }
                for i in 0..A {
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(pairs[i], ones));
                }
            }
            if CENTERED {
                let at = (2 * b + part) * TILE + lanes.start;
                let sc = &t.sc[at..at + HALF];
                // SAFETY: `sc` is 8 readable i32 (bounds-checked above); unaligned load.
                let sc = unsafe { _mm256_loadu_si256(sc.as_ptr().cast::<__m256i>()) };
                for i in 0..A {
                    let offset = _mm256_set1_epi32(32 * i32::from(a[i].sum16[2 * b + part]));
                    let centered = _mm256_sub_epi32(isum[i], offset);
                    total[i] = _mm256_add_epi32(total[i], _mm256_mullo_epi32(sc, centered));
                }
            } else {
                total = isum;
            }
        }
        let d = &t.d[b * TILE..(b + 1) * TILE][lanes.clone()];
        // SAFETY: `d` is 8 readable f32 (bounds-checked above).
        let d = unsafe { _mm256_loadu_ps(d.as_ptr()) };
        for i in 0..A {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[i].d[b]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[i]), scale, acc[i]);
        }
        if !CENTERED {
            let e = &t.e[b * TILE..(b + 1) * TILE][lanes.clone()];
            // SAFETY: `e` is 8 readable f32 (bounds-checked above).
            let e = unsafe { _mm256_loadu_ps(e.as_ptr()) };
            for i in 0..A {
                acc[i] = _mm256_fmadd_ps(e, _mm256_set1_ps(a[i].s[b]), acc[i]);
            }
        }
    }
    for i in 0..A {
        let o = &mut out[i][lanes.clone()];
        // SAFETY: `o` is 8 writable f32 (bounds-checked above); unaligned store.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc[i]) };
    }
}
