//! AVX-512 helpers: sixteen lanes of f32.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256i, __m512, _mm256_loadu_si256, _mm512_add_ps, _mm512_castsi512_ps, _mm512_cvtepu16_epi32,
    _mm512_cvtph_ps, _mm512_fmadd_ps, _mm512_fnmadd_ps, _mm512_loadu_ps, _mm512_max_ps,
    _mm512_min_ps, _mm512_mul_ps, _mm512_roundscale_ps, _mm512_scalef_ps, _mm512_set1_ps,
    _mm512_slli_epi32,
};

use half::{bf16, f16};

use super::Element;

/// A storage type loaded sixteen values at a time as f32.
pub(crate) trait Widen16: Element {
    /// The first sixteen values of `w` as f32.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    unsafe fn load16(w: &[Self]) -> __m512;
}

impl Widen16 for f32 {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(w: &[f32]) -> __m512 {
        let w = &w[..16];
        // SAFETY: `w` is 16 readable f32 (bounds-checked above); unaligned load.
        unsafe { _mm512_loadu_ps(w.as_ptr()) }
    }
}

impl Widen16 for bf16 {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(w: &[bf16]) -> __m512 {
        let w = &w[..16];
        // SAFETY: `w` is 32 readable bytes (bounds-checked above); unaligned load.
        let bits = unsafe { _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()) };
        // a bf16 is the upper half of an f32
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
    }
}

impl Widen16 for f16 {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(w: &[f16]) -> __m512 {
        let w = &w[..16];
        // SAFETY: `w` is 32 readable bytes (bounds-checked above); unaligned load.
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()) })
    }
}

/// Sixteen f32 at `x[at..at + 16]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn load_f32(x: &[f32], at: usize) -> __m512 {
    let x = &x[at..at + 16];
    // SAFETY: `x` is 16 readable f32 (bounds-checked above); unaligned load.
    unsafe { _mm512_loadu_ps(x.as_ptr()) }
}

/// e^x in each lane (Cephes' single-precision polynomial, about 1 ulp;
/// `scalef` applies 2^n, so very negative inputs reach 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn exp(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-104.0)),
        _mm512_set1_ps(88.3),
    );
    // x = n ln2 + r, |r| <= ln2 / 2
    let n =
        _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
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
