//! The block dot products of [`super`] with AVX2 integer instructions, as
//! ggml writes them: 4-bit values unpacked to bytes, multiplied with the
//! 8-bit activations by `maddubs` (unsigned x signed byte pairs to 16 bits),
//! widened by `madd`, scaled and accumulated in eight f32 lanes.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _mm_add_ps, _mm_add_ss, _mm_cvtph_ps, _mm_cvtsi32_si128,
    _mm_cvtss_f32, _mm_loadu_si128, _mm_movehdup_ps, _mm_movehl_ps, _mm_srli_epi16, _mm256_add_ps,
    _mm256_and_si256, _mm256_castps256_ps128, _mm256_cvtepi32_ps, _mm256_extractf128_ps,
    _mm256_fmadd_ps, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set_m128i,
    _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_ps, _mm256_setzero_ps, _mm256_sign_epi8,
};

use super::{BLOCK, QuantizedRow};

/// The f16 scale at `blk[at..at + 2]`, converted by the F16C instruction.
#[target_feature(enable = "avx2,fma,f16c")]
fn scale(blk: &[u8], at: usize) -> f32 {
    let h = i32::from(u16::from_le_bytes([blk[at], blk[at + 1]]));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)))
}

/// Sum of the eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The 32 activations of block `b` as one register.
#[target_feature(enable = "avx2,fma,f16c")]
fn activations(a: &QuantizedRow, b: usize) -> __m256i {
    let q: &[i8; BLOCK] = &a.q[b];
    // SAFETY: `q` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast::<__m256i>()) }
}

/// The 32 4-bit values of the 16 bytes at `qs[at..at + 16]` (low nibbles
/// first, as ggml stores them) as bytes 0..=15.
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(blk: &[u8], at: usize) -> __m256i {
    let bytes = &blk[at..at + 16];
    // SAFETY: `bytes` is 16 readable bytes (the slice above is bounds-checked).
    let packed = unsafe { _mm_loadu_si128(bytes.as_ptr().cast::<__m128i>()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Sum of unsigned x signed byte products, as eight i32 lanes converted to f32.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(x, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// One weight row of blocks (`bytes` each): `block(blk, b)` gives
/// block `b`'s integer products as f32 lanes, its scale (weight scale times
/// activation scale) and a scalar term; two accumulators alternate so that
/// consecutive blocks do not wait on each other's multiply-add.
#[target_feature(enable = "avx2,fma,f16c")]
fn row_with(row: &[u8], bytes: usize, block: impl Fn(&[u8], usize) -> (__m256, f32, f32)) -> f32 {
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut scalar = 0f32;
    let mut blocks = row.chunks_exact(bytes).enumerate();
    while let Some((b, blk)) = blocks.next() {
        let (p, d, t) = block(blk, b);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc0);
        scalar += t;
        if let Some((b, blk)) = blocks.next() {
            let (p, d, t) = block(blk, b);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc1);
            scalar += t;
        }
    }
    hsum(_mm256_add_ps(acc0, acc1)) + scalar
}

/// One weight row of Q4_0 blocks dot `a`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn row_q4_0(row: &[u8], a: &QuantizedRow) -> f32 {
    row_with(row, 18, |blk, b| {
        let p = dot_u8_i8(nibbles(blk, 2), activations(a, b));
        let d = scale(blk, 0);
        // weights are (v - 8): take 8 x (scaled activation sum) back off
        (p, d * a.d[b], -d * 8.0 * a.s[b])
    })
}

/// One weight row of Q4_1 blocks dot `a`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn row_q4_1(row: &[u8], a: &QuantizedRow) -> f32 {
    row_with(row, 20, |blk, b| {
        let p = dot_u8_i8(nibbles(blk, 4), activations(a, b));
        let (d, m) = (scale(blk, 0), scale(blk, 2));
        (p, d * a.d[b], m * a.s[b])
    })
}

/// One weight row of Q8_0 blocks dot `a`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn row_q8_0(row: &[u8], a: &QuantizedRow) -> f32 {
    row_with(row, 34, |blk, b| {
        let bytes = &blk[2..34];
        // SAFETY: `bytes` is 32 readable bytes (the slice is bounds-checked).
        let w = unsafe { _mm256_loadu_si256(bytes.as_ptr().cast::<__m256i>()) };
        let y = activations(a, b);
        // signed x signed: |w| x (y with w's sign)
        let p = dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
        (p, scale(blk, 0) * a.d[b], 0.0)
    })
}
