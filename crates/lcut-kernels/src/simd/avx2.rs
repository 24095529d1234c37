//! AVX2 helpers: eight lanes of f32.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_loadu_si128, _mm_movehdup_ps,
    _mm_movehl_ps, _mm256_add_epi32, _mm256_add_ps, _mm256_castps256_ps128, _mm256_castsi256_ps,
    _mm256_cvtepu16_epi32, _mm256_cvtph_ps, _mm256_cvtps_epi32, _mm256_extractf128_ps,
    _mm256_fmadd_ps, _mm256_fnmadd_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps,
    _mm256_mul_ps, _mm256_round_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_slli_epi32,
};

use half::{bf16, f16};

use super::Element;

/// A storage type loaded eight values at a time as f32.
pub(crate) trait Widen8: Element {
    /// The first eight values of `w` as f32.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    unsafe fn load8(w: &[Self]) -> __m256;
}

impl Widen8 for f32 {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(w: &[f32]) -> __m256 {
        let w = &w[..8];
        // SAFETY: `w` is 8 readable f32 (bounds-checked above); unaligned load.
        unsafe { _mm256_loadu_ps(w.as_ptr()) }
    }
}

impl Widen8 for bf16 {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(w: &[bf16]) -> __m256 {
        let w = &w[..8];
        // SAFETY: `w` is 16 readable bytes (bounds-checked above); unaligned load.
        let bits = unsafe { _mm_loadu_si128(w.as_ptr().cast::<__m128i>()) };
        // a bf16 is the upper half of an f32
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
    }
}

impl Widen8 for f16 {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(w: &[f16]) -> __m256 {
        let w = &w[..8];
        // SAFETY: `w` is 16 readable bytes (bounds-checked above); unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.as_ptr().cast::<__m128i>()) })
    }
}

/// Sum of the eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Eight f32 at `x[at..at + 8]`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_f32(x: &[f32], at: usize) -> __m256 {
    let x = &x[at..at + 8];
    // SAFETY: `x` is 8 readable f32 (bounds-checked above); unaligned load.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// e^x in each lane (Cephes' single-precision polynomial, about 1 ulp on
/// the range that matters for softmax; inputs below -87.3 give ~1e-38
/// rather than 0).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn exp(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.3),
    );
    // x = n ln2 + r, |r| <= ln2 / 2
    let n = _mm256_round_ps::<0x08>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    // 2^n through the exponent bits
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
}
