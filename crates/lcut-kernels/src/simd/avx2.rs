//! AVX2 (with FMA and F16C): eight lanes of f32, [`Avx2`].

use std::arch::x86_64::{
    __m128, __m128i, __m256, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_loadu_si128,
    _mm_movehdup_ps, _mm_movehl_ps, _mm256_add_epi32, _mm256_add_ps, _mm256_castpd_ps,
    _mm256_castps_pd, _mm256_castps256_ps128, _mm256_castsi256_ps, _mm256_cvtepu16_epi32,
    _mm256_cvtph_ps, _mm256_cvtps_epi32, _mm256_div_ps, _mm256_extractf128_ps, _mm256_fmadd_ps,
    _mm256_fnmadd_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps,
    _mm256_round_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps, _mm256_slli_epi32,
    _mm256_storeu_ps, _mm256_sub_ps, _mm256_unpackhi_pd, _mm256_unpackhi_ps, _mm256_unpacklo_pd,
    _mm256_unpacklo_ps,
};

use half::{bf16, f16};

use super::{Lanes, Widen};

/// Eight f32 lanes in a 256-bit register; a kernel's entry point enables
/// `avx2,fma,f16c`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2;

// SAFETY (every method): the caller runs with AVX2, FMA and F16C enabled
// (the trait's contract); loads and stores are unaligned and bounds-checked
// by slicing first.
impl Lanes for Avx2 {
    const WIDTH: usize = 8;
    type V = __m256;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn load(x: &[f32], at: usize) -> __m256 {
        let x = &x[at..at + 8];
        unsafe { _mm256_loadu_ps(x.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn store(x: &mut [f32], at: usize, v: __m256) {
        let x = &mut x[at..at + 8];
        unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
    }

    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_min_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_max_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn sum(v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }

    /// 11 instructions for four sums, where four separate reductions take 28.
    #[inline(always)]
    unsafe fn sum4(v: [__m256; 4]) -> __m128 {
        unsafe {
            let t0 = _mm256_add_ps(
                _mm256_unpacklo_ps(v[0], v[1]),
                _mm256_unpackhi_ps(v[0], v[1]),
            );
            let t1 = _mm256_add_ps(
                _mm256_unpacklo_ps(v[2], v[3]),
                _mm256_unpackhi_ps(v[2], v[3]),
            );
            let (t0, t1) = (_mm256_castps_pd(t0), _mm256_castps_pd(t1));
            // each 128-bit lane: [v0, v1, v2, v3] partial sums
            let u = _mm256_add_ps(
                _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t1)),
                _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t1)),
            );
            _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u))
        }
    }

    /// Cephes' single-precision polynomial, about 1 ulp on the range that
    /// matters for softmax; inputs below -87.3 give ~1e-38 rather than 0.
    #[inline(always)]
    unsafe fn exp(x: __m256) -> __m256 {
        unsafe {
            let x = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
                _mm256_set1_ps(88.3),
            );
            // x = n ln2 + r, |r| <= ln2 / 2
            let n =
                _mm256_round_ps::<0x08>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
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
    }
}

impl Widen<Avx2> for f32 {
    #[inline(always)]
    unsafe fn widen(w: &[f32]) -> __m256 {
        // SAFETY: as `Avx2::load`.
        unsafe { Avx2::load(w, 0) }
    }
}

impl Widen<Avx2> for bf16 {
    #[inline(always)]
    unsafe fn widen(w: &[bf16]) -> __m256 {
        let w = &w[..8];
        // SAFETY: `w` is 16 readable bytes (bounds-checked above); unaligned
        // load; the caller runs with AVX2 enabled. A bf16 is the upper half
        // of an f32.
        unsafe {
            let bits = _mm_loadu_si128(w.as_ptr().cast::<__m128i>());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
        }
    }
}

impl Widen<Avx2> for f16 {
    #[inline(always)]
    unsafe fn widen(w: &[f16]) -> __m256 {
        let w = &w[..8];
        // SAFETY: `w` is 16 readable bytes (bounds-checked above); unaligned
        // load; the caller runs with F16C enabled.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().cast::<__m128i>())) }
    }
}
