//! Dense dot products with AVX2 and FMA: eight weights per register
//! (bf16 widened by a shift, f16 by F16C), two accumulators per activation
//! row so that consecutive multiply-adds do not wait on each other.

#![allow(unsafe_code)]

use std::arch::x86_64::{_mm256_add_ps, _mm256_fmadd_ps, _mm256_setzero_ps};

use super::DenseWeights;
use crate::isa::Isa;
use crate::simd::avx2::{Widen8, hsum, load_f32};

/// Rows of `w` (`cols` values each) dot each row of `xs` into `out`
/// ([row][activation]); false, doing nothing, where the CPU lacks AVX2.
pub(super) fn rows(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) -> bool {
    if !Isa::Avx2.available() {
        return false;
    }
    // SAFETY: AVX2, FMA and F16C were just checked, all `rows_avx2` needs.
    unsafe { rows_avx2(w, cols, xs, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    match w {
        DenseWeights::F32(w) => rows_typed(w, cols, xs, out),
        DenseWeights::Bf16(w) => rows_typed(w, cols, xs, out),
        DenseWeights::F16(w) => rows_typed(w, cols, xs, out),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_typed<T: Widen8>(w: &[T], cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    let n = xs.len();
    for (o, row) in out.chunks_exact_mut(n).zip(w.chunks_exact(cols)) {
        let mut i = 0;
        while i < n {
            let take = (n - i).min(4);
            match take {
                1 => o[i] = dot::<T, 1>(row, &[xs[i]])[0],
                2 | 3 => {
                    o[i..i + 2].copy_from_slice(&dot::<T, 2>(row, &[xs[i], xs[i + 1]]));
                }
                _ => {
                    let group = [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]];
                    o[i..i + 4].copy_from_slice(&dot::<T, 4>(row, &group));
                }
            }
            i += if take == 3 { 2 } else { take };
        }
    }
}

/// One weight row dot `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot<T: Widen8, const N: usize>(row: &[T], xs: &[&[f32]; N]) -> [f32; N] {
    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    let cols = row.len();
    let mut j = 0;
    while j + 16 <= cols {
        // SAFETY: AVX2, FMA and F16C are enabled here.
        let (w0, w1) = unsafe { (T::load8(&row[j..]), T::load8(&row[j + 8..])) };
        for r in 0..N {
            acc0[r] = _mm256_fmadd_ps(w0, load_f32(xs[r], j), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, load_f32(xs[r], j + 8), acc1[r]);
        }
        j += 16;
    }
    if j + 8 <= cols {
        // SAFETY: AVX2, FMA and F16C are enabled here.
        let w0 = unsafe { T::load8(&row[j..]) };
        for r in 0..N {
            acc0[r] = _mm256_fmadd_ps(w0, load_f32(xs[r], j), acc0[r]);
        }
        j += 8;
    }
    let mut out = [0f32; N];
    for r in 0..N {
        let tail: f32 = row[j..]
            .iter()
            .zip(&xs[r][j..])
            .map(|(&a, &b)| a.to_f32() * b)
            .sum();
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) + tail;
    }
    out
}
