//! Activations quantized with AVX2 to 8 or 16 bits per block of 32, the
//! same values as the portable path (`f32::round`: to nearest, ties away
//! from zero).

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m256i, _CMP_EQ_OQ, _CMP_LT_OQ, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT,
    _MM_FROUND_TO_ZERO, _mm_add_epi32, _mm_cvtsi128_si32, _mm_cvtss_f32, _mm_max_ps,
    _mm_movehdup_ps, _mm_movehl_ps, _mm_shuffle_epi32, _mm256_add_epi32, _mm256_add_ps,
    _mm256_and_ps, _mm256_blendv_ps, _mm256_castps256_ps128, _mm256_castsi256_ps,
    _mm256_castsi256_si128, _mm256_cmp_ps, _mm256_cvtps_epi32, _mm256_extractf128_ps,
    _mm256_extracti128_si256, _mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps,
    _mm256_packs_epi16, _mm256_packs_epi32, _mm256_permute4x64_epi64, _mm256_permutevar8x32_epi32,
    _mm256_round_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps,
    _mm256_storeu_si256, _mm256_sub_ps,
};

use crate::isa::Isa;
use crate::quant::acts::Q16_MAX;
use crate::quant::format::QK;

/// One block of 32 activations quantized to bytes: (scale, sum of the
/// first 16 values, sum of the last 16); `None` where the CPU lacks AVX2 or
/// the slices are short.
pub(super) fn quantize_block(xs: &[f32], q: &mut [i8]) -> Option<(f32, i32, i32)> {
    if !Isa::Avx2.available() || xs.len() < QK || q.len() < QK {
        return None;
    }
    // SAFETY: AVX2, FMA and F16C were just checked.
    Some(unsafe { quantize_block_avx2(xs, q) })
}

/// One block of 32 activations quantized to 16-bit integers; returns the
/// scale, `None` where the CPU lacks AVX2 or the slices are short.
pub(super) fn quantize_block16(xs: &[f32], q: &mut [i16]) -> Option<f32> {
    if !Isa::Avx2.available() || xs.len() < QK || q.len() < QK {
        return None;
    }
    // SAFETY: AVX2, FMA and F16C were just checked.
    Some(unsafe { quantize_block16_avx2(xs, q) })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_block_avx2(xs: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    let (d, i) = rounded(xs, 127.0);
    // packs work within 128-bit lanes: put the four rows of eight back in order
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let q = &mut q[..QK];
    // SAFETY: `q` is 32 writable bytes (bounds-checked above); unaligned store.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes) };
    let sum = |a: __m256i, b: __m256i| {
        let s = _mm256_add_epi32(a, b);
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    };
    (d, sum(i[0], i[1]), sum(i[2], i[3]))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_block16_avx2(xs: &[f32], q: &mut [i16]) -> f32 {
    let (d, i) = rounded(xs, Q16_MAX);
    let q = &mut q[..QK];
    for (half, pair) in q.chunks_exact_mut(16).zip([[i[0], i[1]], [i[2], i[3]]]) {
        // packs work within 128-bit lanes: put the two rows of eight back in order
        let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(pair[0], pair[1]));
        // SAFETY: `half` is 16 writable i16 (bounds-checked above); unaligned store.
        unsafe { _mm256_storeu_si256(half.as_mut_ptr().cast(), words) };
    }
    d
}

/// The block's scale (largest magnitude over `limit`) and its 32 values
/// divided by it, rounded as `f32::round` and clamped to ±`limit`, as four
/// registers of eight 32-bit integers.
#[target_feature(enable = "avx2,fma,f16c")]
fn rounded(xs: &[f32], limit: f32) -> (f32, [__m256i; 4]) {
    let xs = &xs[..QK];
    // SAFETY: `xs` is 32 readable f32 (bounds-checked above); unaligned loads.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xs[8 * i..].as_ptr()) });
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let abs = |x: __m256| _mm256_and_ps(x, magnitude);
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ps(m, _mm_movehdup_ps(m)));
    let d = amax / limit;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let invv = _mm256_set1_ps(inv);
    let (one, half, zero) = (
        _mm256_set1_ps(1.0),
        _mm256_set1_ps(0.5),
        _mm256_setzero_ps(),
    );
    let round = |x: __m256| -> __m256i {
        let t = _mm256_mul_ps(x, invv);
        // f32::round: to nearest, ties away from zero
        let trunc = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
        let even = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let tie = _mm256_cmp_ps::<_CMP_EQ_OQ>(abs(_mm256_sub_ps(t, trunc)), half);
        let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(t, zero);
        let step = _mm256_blendv_ps(one, _mm256_set1_ps(-1.0), negative);
        let r = _mm256_blendv_ps(even, _mm256_add_ps(trunc, step), tie);
        let r = _mm256_max_ps(
            _mm256_min_ps(r, _mm256_set1_ps(limit)),
            _mm256_set1_ps(-limit),
        );
        _mm256_cvtps_epi32(r)
    };
    (d, [round(v[0]), round(v[1]), round(v[2]), round(v[3])])
}
