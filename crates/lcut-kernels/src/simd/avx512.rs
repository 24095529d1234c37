//! AVX-512 (F/BW/VL/VNNI, with AVX2, FMA and F16C): sixteen lanes of f32,
//! [`Avx512`].

use std::arch::x86_64::{
    __m128, __m256i, __m512, _mm_add_ps, _mm256_add_ps, _mm256_castpd_ps, _mm256_castps256_ps128,
    _mm256_extractf128_ps, _mm256_loadu_si256, _mm512_add_ps, _mm512_castpd_ps, _mm512_castps_pd,
    _mm512_castps512_ps256, _mm512_castsi512_ps, _mm512_cvtepu16_epi32, _mm512_cvtph_ps,
    _mm512_div_ps, _mm512_extractf64x4_pd, _mm512_fmadd_ps, _mm512_fnmadd_ps, _mm512_loadu_ps,
    _mm512_max_ps, _mm512_min_ps, _mm512_mul_ps, _mm512_reduce_add_ps, _mm512_roundscale_ps,
    _mm512_scalef_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_slli_epi32, _mm512_storeu_ps,
    _mm512_sub_ps, _mm512_unpackhi_pd, _mm512_unpackhi_ps, _mm512_unpacklo_pd, _mm512_unpacklo_ps,
};

use half::{bf16, f16};

use super::{Lanes, Widen};

/// Sixteen f32 lanes in a 512-bit register; a kernel's entry point enables
/// `avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512;

// SAFETY (every method): the caller runs with AVX-512 F/BW/VL/VNNI, AVX2,
// FMA and F16C enabled (the trait's contract); loads and stores are
// unaligned and bounds-checked by slicing first.
impl Lanes for Avx512 {
    const WIDTH: usize = 16;
    type V = __m512;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn load(x: &[f32], at: usize) -> __m512 {
        let x = &x[at..at + 16];
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn store(x: &mut [f32], at: usize, v: __m512) {
        let x = &mut x[at..at + 16];
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) }
    }

    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_min_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_max_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn sum(v: __m512) -> f32 {
        unsafe { _mm512_reduce_add_ps(v) }
    }

    /// 13 instructions for four sums, where four separate reductions take 32.
    #[inline(always)]
    unsafe fn sum4(v: [__m512; 4]) -> __m128 {
        unsafe {
            let t0 = _mm512_add_ps(
                _mm512_unpacklo_ps(v[0], v[1]),
                _mm512_unpackhi_ps(v[0], v[1]),
            );
            let t1 = _mm512_add_ps(
                _mm512_unpacklo_ps(v[2], v[3]),
                _mm512_unpackhi_ps(v[2], v[3]),
            );
            let (t0, t1) = (_mm512_castps_pd(t0), _mm512_castps_pd(t1));
            // each 128-bit lane: [v0, v1, v2, v3] partial sums
            let u = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t1)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t1)),
            );
            let y = _mm256_add_ps(
                _mm512_castps512_ps256(u),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(u))),
            );
            _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps::<1>(y))
        }
    }

    /// Cephes' single-precision polynomial, about 1 ulp; `scalef` applies
    /// 2^n, so very negative inputs reach 0.
    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        unsafe {
            let x = _mm512_min_ps(
                _mm512_max_ps(x, _mm512_set1_ps(-104.0)),
                _mm512_set1_ps(88.3),
            );
            // x = n ln2 + r, |r| <= ln2 / 2
            let n = _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(
                x,
                _mm512_set1_ps(std::f32::consts::LOG2_E),
            ));
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm512_set1_ps(1.987_569_1e-4);
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                0.166_666_65,
                0.5,
            ] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
            }
            let r2 = _mm512_mul_ps(r, r);
            let p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
            _mm512_scalef_ps(p, n)
        }
    }
}

impl Widen<Avx512> for f32 {
    #[inline(always)]
    unsafe fn widen(w: &[f32]) -> __m512 {
        // SAFETY: as `Avx512::load`.
        unsafe { Avx512::load(w, 0) }
    }
}

impl Widen<Avx512> for bf16 {
    #[inline(always)]
    unsafe fn widen(w: &[bf16]) -> __m512 {
        let w = &w[..16];
        // SAFETY: `w` is 32 readable bytes (bounds-checked above); unaligned
        // load; the caller runs with AVX-512 enabled. A bf16 is the upper
        // half of an f32.
        unsafe {
            let bits = _mm256_loadu_si256(w.as_ptr().cast::<__m256i>());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
        }
    }
}

impl Widen<Avx512> for f16 {
    #[inline(always)]
    unsafe fn widen(w: &[f16]) -> __m512 {
        let w = &w[..16];
        // SAFETY: `w` is 32 readable bytes (bounds-checked above); unaligned
        // load; the caller runs with F16C and AVX-512 enabled.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().cast::<__m256i>())) }
    }
}
