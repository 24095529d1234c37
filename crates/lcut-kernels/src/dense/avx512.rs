//! Dense dot products with AVX-512: sixteen weights per register (bf16
//! widened by a shift, f16 by a conversion), two accumulators per
//! activation row.

#![allow(unsafe_code)]

use std::arch::x86_64::{_mm512_add_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps, _mm512_setzero_ps};

use super::DenseWeights;
use crate::isa::Isa;
use crate::simd::avx512::{Widen16, load_f32};

/// Rows of `w` (`cols` values each) dot each row of `xs` into `out`
/// ([row][activation]); false, doing nothing, where the CPU lacks AVX-512.
pub(super) fn rows(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) -> bool {
    if !Isa::Avx512.available() {
        return false;
    }
    // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were just checked,
    // all `rows_avx512` needs.
    unsafe { rows_avx512(w, cols, xs, out) };
    true
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn rows_avx512(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    match w {
        DenseWeights::F32(w) => rows_typed(w, cols, xs, out),
        DenseWeights::Bf16(w) => rows_typed(w, cols, xs, out),
        DenseWeights::F16(w) => rows_typed(w, cols, xs, out),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn rows_typed<T: Widen16>(w: &[T], cols: usize, xs: &[&[f32]], out: &mut [f32]) {
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot<T: Widen16, const N: usize>(row: &[T], xs: &[&[f32]; N]) -> [f32; N] {
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
    let cols = row.len();
    let mut j = 0;
    while j + 32 <= cols {
        // SAFETY: the features `load16` needs are enabled here.
        let (w0, w1) = unsafe { (T::load16(&row[j..]), T::load16(&row[j + 16..])) };
        for r in 0..N {
            acc0[r] = _mm512_fmadd_ps(w0, load_f32(xs[r], j), acc0[r]);
            acc1[r] = _mm512_fmadd_ps(w1, load_f32(xs[r], j + 16), acc1[r]);
        }
        j += 32;
    }
    if j + 16 <= cols {
        // SAFETY: the features `load16` needs are enabled here.
        let w0 = unsafe { T::load16(&row[j..]) };
        for r in 0..N {
            acc0[r] = _mm512_fmadd_ps(w0, load_f32(xs[r], j), acc0[r]);
        }
        j += 16;
    }
    let mut out = [0f32; N];
    for r in 0..N {
        let tail: f32 = row[j..]
            .iter()
            .zip(&xs[r][j..])
            .map(|(&a, &b)| a.to_f32() * b)
            .sum();
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) + tail;
    }
    out
}
