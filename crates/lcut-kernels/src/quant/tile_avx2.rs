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
    _mm256_mullo_epi32, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_si256,
    _mm256_storeu_ps, _mm256_sub_epi32,
};
use std::ops::Range;

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::tile::{ActPtrs, BLOCK_BYTES, GROUP, Scaling, TILE, Tile};

/// Rows of one pass (lanes of a 256-bit register).
const HALF: usize = TILE / 2;

/// Blocks of the tile that every activation row passes over before the
/// next ones: sixteen blocks' values (8 KiB) and scales stay in the
/// first-level cache while all the rows read them, where each group of
/// rows read a whole tile of a 2048-wide matrix (40 KiB) from the second
/// level again. Each lane's f32 sums still run block after block, in
/// order, through memory between the chunks: the chunks change no bit.
const CHUNK_BLOCKS: usize = 16;

/// The tile against every activation row `a`: `o[i * stride + r]` is row
/// r (below `rows`) dot activation row i.
pub(super) fn product(t: &Tile, a: &[Q8Row<'_>], o: &mut [f32], stride: usize, rows: usize) {
    assert!(
        Isa::Avx2.available(),
        "the AVX2 tile needs AVX2, FMA and F16C"
    );
    let blocks = t.blocks();
    assert!(t.q.len() >= blocks * BLOCK_BYTES && t.d.len() >= blocks * TILE);
    assert!(t.e.len() >= blocks * TILE || t.scaling == Scaling::Centered);
    assert!(t.sc.len() >= 2 * blocks * TILE || t.scaling == Scaling::Offset);
    // each row's values, checked once here rather than word by word below
    let p: Vec<ActPtrs> = a.iter().map(|row| ActPtrs::of(row, blocks)).collect();
    let mut sums = vec![[0f32; TILE]; a.len()];
    for first in (0..blocks).step_by(CHUNK_BLOCKS) {
        let chunk = first..blocks.min(first + CHUNK_BLOCKS);
        for (p, sums) in p.chunks(GROUP).zip(sums.chunks_mut(GROUP)) {
            for h in 0..2 {
                match (t.scaling, t.i16_steps) {
                    (Scaling::Offset, 8) => rows_of::<8, false>(t, p, chunk.clone(), h, sums),
                    (Scaling::Offset, _) => rows_of::<4, false>(t, p, chunk.clone(), h, sums),
                    (Scaling::Centered, _) => rows_of::<2, true>(t, p, chunk.clone(), h, sums),
                }
            }
        }
    }
    for (i, s) in sums.iter().enumerate() {
        o[i * stride..i * stride + rows].copy_from_slice(&s[..rows]);
    }
}

/// [`run`] for the activation rows' count (at most [`GROUP`]).
fn rows_of<const M: usize, const CENTERED: bool>(
    t: &Tile,
    p: &[ActPtrs],
    blocks: Range<usize>,
    h: usize,
    out: &mut [[f32; TILE]],
) {
    if CENTERED && p.len() > 2 {
        // four rows' sums of both halves would not fit the 16 registers
        let (first, rest) = out.split_at_mut(2);
        rows_of::<M, CENTERED>(t, &p[..2], blocks.clone(), h, first);
        rows_of::<M, CENTERED>(t, &p[2..], blocks, h, rest);
        return;
    }
    // SAFETY: `product` checked AVX2, FMA and F16C, the tile's blocks and
    // the rows' (`blocks` is within them).
    unsafe {
        match p.len() {
            4 => run::<4, M, CENTERED>(t, p, blocks, h, out),
            3 => run::<3, M, CENTERED>(t, p, blocks, h, out),
            2 => run::<2, M, CENTERED>(t, p, blocks, h, out),
            _ => run::<1, M, CENTERED>(t, p, blocks, h, out),
        }
    }
}

/// Blocks `blocks` of rows `8h..8h + 8` of the tile against the activation
/// rows `p`, added to `out[i][8h..8h + 8]`, `M` steps' pairs summed in 16
/// bits before they widen; `CENTERED`: the tile's scaling is
/// [`Scaling::Centered`] (two halves per block).
///
/// # Safety
/// AVX2, FMA and F16C run here; `blocks` are within the tile's blocks and
/// each of `p`'s rows (the bounds [`product`] checks); `p` holds `A` rows
/// and `out` at least as many.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const A: usize, const M: usize, const CENTERED: bool>(
    t: &Tile,
    p: &[ActPtrs],
    blocks: Range<usize>,
    h: usize,
    out: &mut [[f32; TILE]],
) {
    let ones = _mm256_set1_epi16(1);
    let lane = h * HALF;
    let parts = if CENTERED { 2 } else { 1 };
    let p: [ActPtrs; A] = std::array::from_fn(|i| p[i]);
    let out = &mut out[..A];
    // SAFETY: each `out[i]` holds 16 f32, `lane + 8` of them; unaligned loads.
    let mut acc: [_; A] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(out[i][lane..].as_ptr()) });
    for b in blocks {
        // SAFETY: block `b` of the tile's values is in bounds (the caller's
        // bounds), and so is its half `h` of each 64-byte step.
        let wb = unsafe { t.q.as_slice().as_ptr().add(b * BLOCK_BYTES + 32 * h) };
        // the block's integer sum per activation row (Centered: both
        // halves centred and scaled, in integers)
        let mut total = [_mm256_setzero_si256(); A];
        for part in 0..parts {
            let mut isum = [_mm256_setzero_si256(); A];
            for first in (part * 8 / parts..(part + 1) * 8 / parts).step_by(M) {
                let mut pairs = [_mm256_setzero_si256(); A];
                for k in first..first + M {
                    // SAFETY: step k < 8 of block b: 32 readable bytes; unaligned load.
                    let w = unsafe { _mm256_loadu_si256(wb.add(k * 64).cast::<__m256i>()) };
                    for i in 0..A {
                        // SAFETY: b is within the rows' blocks and k < 8.
                        let x = _mm256_set1_epi32(unsafe { p[i].word(b, k) });
                        pairs[i] = _mm256_add_epi16(pairs[i], _mm256_maddubs_epi16(w, x));
                    }
                }
                for i in 0..A {
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(pairs[i], ones));
                }
            }
            if CENTERED {
                // SAFETY: the block's half scales are in bounds (the caller's
                // bounds); unaligned load.
                let sc = unsafe {
                    _mm256_loadu_si256(t.sc.as_ptr().add((2 * b + part) * TILE + lane).cast())
                };
                for i in 0..A {
                    // SAFETY: b is within the rows' blocks and part < 2.
                    let offset = _mm256_set1_epi32(32 * unsafe { p[i].sum16(b, part) });
                    let centered = _mm256_sub_epi32(isum[i], offset);
                    total[i] = _mm256_add_epi32(total[i], _mm256_mullo_epi32(sc, centered));
                }
            } else {
                total = isum;
            }
        }
        // SAFETY: the block's scales are in bounds (the caller's bounds).
        let d = unsafe { _mm256_loadu_ps(t.d.as_ptr().add(b * TILE + lane)) };
        for i in 0..A {
            // SAFETY: b is within the rows' blocks.
            let (ad, _) = unsafe { p[i].scales(b) };
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(ad));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[i]), scale, acc[i]);
        }
        if !CENTERED {
            // SAFETY: the block's offsets are in bounds (the caller's bounds).
            let e = unsafe { _mm256_loadu_ps(t.e.as_ptr().add(b * TILE + lane)) };
            for i in 0..A {
                // SAFETY: b is within the rows' blocks.
                let (_, s) = unsafe { p[i].scales(b) };
                acc[i] = _mm256_fmadd_ps(e, _mm256_set1_ps(s), acc[i]);
            }
        }
    }
    for i in 0..A {
        // SAFETY: `out[i]` holds 16 f32, `lane + 8` of them; unaligned store.
        unsafe { _mm256_storeu_ps(out[i][lane..].as_mut_ptr(), acc[i]) };
    }
}
