//! Dense dot products on AVX2 and AVX-512, written once over the vector
//! width ([`Lanes`]): a register of weights per step (bf16 widened by a
//! shift, f16 by a conversion), two accumulators per activation row so
//! that consecutive multiply-adds do not wait on each other.

#![allow(unsafe_code)]

use half::{bf16, f16};

use super::DenseWeights;
use crate::isa::Isa;
use crate::simd::avx2::Avx2;
use crate::simd::avx512::Avx512;
use crate::simd::{Lanes, Widen};

/// Rows of `w` (`cols` values each) dot each row of `xs` into `out`
/// ([row][activation]) at the widest of AVX-512 and AVX2 that `isa` allows
/// and the CPU has; false, doing nothing, where it has neither.
pub(super) fn rows(
    isa: Isa,
    w: DenseWeights<'_>,
    cols: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) -> bool {
    if isa >= Isa::Avx512 && Isa::Avx512.available() {
        // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were just checked.
        unsafe { rows_avx512(w, cols, xs, out) };
        return true;
    }
    if isa >= Isa::Avx2 && Isa::Avx2.available() {
        // SAFETY: AVX2, FMA and F16C were just checked.
        unsafe { rows_avx2(w, cols, xs, out) };
        return true;
    }
    false
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn rows_avx512(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    // SAFETY: the features `Avx512` needs are enabled here.
    unsafe { rows_of::<Avx512>(w, cols, xs, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    // SAFETY: the features `Avx2` needs are enabled here.
    unsafe { rows_of::<Avx2>(w, cols, xs, out) }
}

/// # Safety
/// The CPU runs `L`'s features (the caller enables them).
#[inline(always)]
unsafe fn rows_of<L: Lanes>(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32])
where
    f32: Widen<L>,
    bf16: Widen<L>,
    f16: Widen<L>,
{
    // SAFETY: passed on from the caller.
    unsafe {
        match w {
            DenseWeights::F32(w) => rows_typed::<L, _>(w, cols, xs, out),
            DenseWeights::Bf16(w) => rows_typed::<L, _>(w, cols, xs, out),
            DenseWeights::F16(w) => rows_typed::<L, _>(w, cols, xs, out),
        }
    }
}

/// # Safety
/// As [`rows_of`].
#[inline(always)]
unsafe fn rows_typed<L: Lanes, T: Widen<L>>(w: &[T], cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    let n = xs.len();
    for (o, row) in out.chunks_exact_mut(n).zip(w.chunks_exact(cols)) {
        let mut i = 0;
        while i < n {
            let take = (n - i).min(4);
            // SAFETY: passed on from the caller.
            unsafe {
                match take {
                    1 => o[i] = dot::<L, T, 1>(row, &[xs[i]])[0],
                    2 | 3 => {
                        o[i..i + 2].copy_from_slice(&dot::<L, T, 2>(row, &[xs[i], xs[i + 1]]));
                    }
                    _ => {
                        let group = [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]];
                        o[i..i + 4].copy_from_slice(&dot::<L, T, 4>(row, &group));
                    }
                }
            }
            i += if take == 3 { 2 } else { take };
        }
    }
}

/// One weight row dot `N` activation rows.
///
/// # Safety
/// As [`rows_of`].
#[inline(always)]
unsafe fn dot<L: Lanes, T: Widen<L>, const N: usize>(row: &[T], xs: &[&[f32]; N]) -> [f32; N] {
    let lanes = L::WIDTH;
    // SAFETY: passed on from the caller.
    unsafe {
        let (mut acc0, mut acc1) = ([L::zero(); N], [L::zero(); N]);
        let cols = row.len();
        let mut j = 0;
        while j + 2 * lanes <= cols {
            let (w0, w1) = (T::widen(&row[j..]), T::widen(&row[j + lanes..]));
            for r in 0..N {
                acc0[r] = L::fmadd(w0, L::load(xs[r], j), acc0[r]);
                acc1[r] = L::fmadd(w1, L::load(xs[r], j + lanes), acc1[r]);
            }
            j += 2 * lanes;
        }
        if j + lanes <= cols {
            let w0 = T::widen(&row[j..]);
            for r in 0..N {
                acc0[r] = L::fmadd(w0, L::load(xs[r], j), acc0[r]);
            }
            j += lanes;
        }
        let mut out = [0f32; N];
        for r in 0..N {
            let tail: f32 = row[j..]
                .iter()
                .zip(&xs[r][j..])
                .map(|(&a, &b)| a.to_f32() * b)
                .sum();
            out[r] = L::sum(L::add(acc0[r], acc1[r])) + tail;
        }
        out
    }
}
