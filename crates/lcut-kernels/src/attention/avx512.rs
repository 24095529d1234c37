//! The attention's block steps with AVX-512: each key row is widened to
//! f32 once and multiplied with up to four query heads of its group; value
//! rows are accumulated 64 (or 16) dimensions at a time in registers;
//! `exp` is vectorized.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_storeu_ps, _mm512_sub_ps,
};

use super::{BlockOps, Rows, portable};
use crate::isa::Isa;
use crate::simd::avx512::{Widen16, exp, load_f32};

/// AVX-512 block steps; one exists only where the CPU runs them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ops {
    _checked: (),
}

impl Ops {
    /// The steps, where the CPU has AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C.
    pub(crate) fn new() -> Option<Self> {
        Isa::Avx512.available().then_some(Self { _checked: () })
    }
}

impl<T: Widen16> BlockOps<T> for Ops {
    fn scores(&self, q: &[f32], groups: usize, keys: Rows<'_, T>, scale: f32, out: &mut [f32]) {
        if !keys.width.is_multiple_of(16) {
            return portable::Ops.scores(q, groups, keys, scale, out);
        }
        // SAFETY: an `Ops` exists only where the CPU has the features (`new`).
        unsafe { scores(q, groups, keys, scale, out) }
    }

    fn accumulate(&self, p: &[f32], groups: usize, values: Rows<'_, T>, acc: &mut [f32]) {
        if !values.width.is_multiple_of(16) {
            return portable::Ops.accumulate(p, groups, values, acc);
        }
        // SAFETY: an `Ops` exists only where the CPU has the features (`new`).
        unsafe { accumulate(p, groups, values, acc) }
    }

    fn exp_sum(&self, x: &mut [f32], m: f32) -> f32 {
        // SAFETY: an `Ops` exists only where the CPU has the features (`new`).
        unsafe { exp_sum(x, m) }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scores<T: Widen16>(q: &[f32], groups: usize, keys: Rows<'_, T>, scale: f32, out: &mut [f32]) {
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(4);
        match n {
            4 => scores_n::<T, 4>(q, g0, keys, scale, out),
            3 => scores_n::<T, 3>(q, g0, keys, scale, out),
            2 => scores_n::<T, 2>(q, g0, keys, scale, out),
            _ => scores_n::<T, 1>(q, g0, keys, scale, out),
        }
        g0 += n;
    }
}

/// Scores of query heads `g0..g0 + G` against every key row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scores_n<T: Widen16, const G: usize>(
    q: &[f32],
    g0: usize,
    keys: Rows<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let w = keys.width;
    for j in 0..keys.count {
        let key = &keys.data[j * keys.stride..j * keys.stride + w];
        let mut acc = [_mm512_setzero_ps(); G];
        for d in (0..w).step_by(16) {
            // SAFETY: the features `load16` needs are enabled here.
            let k = unsafe { T::load16(&key[d..]) };
            for (g, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(load_f32(q, (g0 + g) * w + d), k, *a);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            out[(g0 + g) * keys.count + j] = scale * _mm512_reduce_add_ps(*a);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn accumulate<T: Widen16>(p: &[f32], groups: usize, values: Rows<'_, T>, acc: &mut [f32]) {
    let wide = values.width.is_multiple_of(64);
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(4);
        match (n, wide) {
            (4, true) => accumulate_n::<T, 4, 4>(p, g0, values, acc),
            (3, true) => accumulate_n::<T, 3, 4>(p, g0, values, acc),
            (2, true) => accumulate_n::<T, 2, 4>(p, g0, values, acc),
            (_, true) => accumulate_n::<T, 1, 4>(p, g0, values, acc),
            (4, false) => accumulate_n::<T, 4, 1>(p, g0, values, acc),
            (3, false) => accumulate_n::<T, 3, 1>(p, g0, values, acc),
            (2, false) => accumulate_n::<T, 2, 1>(p, g0, values, acc),
            (_, false) => accumulate_n::<T, 1, 1>(p, g0, values, acc),
        }
        g0 += n;
    }
}

/// Heads `g0..g0 + G` += their weighted value rows, `16 CH` dimensions at a
/// time held in registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn accumulate_n<T: Widen16, const G: usize, const CH: usize>(
    p: &[f32],
    g0: usize,
    values: Rows<'_, T>,
    acc: &mut [f32],
) {
    let (w, count) = (values.width, values.count);
    for d in (0..w).step_by(16 * CH) {
        let mut a = [[_mm512_setzero_ps(); CH]; G];
        for (g, ag) in a.iter_mut().enumerate() {
            for (c, x) in ag.iter_mut().enumerate() {
                *x = load_f32(acc, (g0 + g) * w + d + 16 * c);
            }
        }
        for j in 0..count {
            let row = &values.data[j * values.stride + d..j * values.stride + d + 16 * CH];
            let mut v = [_mm512_setzero_ps(); CH];
            for (c, x) in v.iter_mut().enumerate() {
                // SAFETY: the features `load16` needs are enabled here.
                *x = unsafe { T::load16(&row[16 * c..]) };
            }
            for (g, ag) in a.iter_mut().enumerate() {
                let pj = _mm512_set1_ps(p[(g0 + g) * count + j]);
                for (x, vc) in ag.iter_mut().zip(v) {
                    *x = _mm512_fmadd_ps(pj, vc, *x);
                }
            }
        }
        for (g, ag) in a.iter().enumerate() {
            for (c, x) in ag.iter().enumerate() {
                store(acc, (g0 + g) * w + d + 16 * c, *x);
            }
        }
    }
}

/// Store sixteen f32 at `x[at..at + 16]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn store(x: &mut [f32], at: usize, v: __m512) {
    let x = &mut x[at..at + 16];
    // SAFETY: `x` is 16 writable f32 (bounds-checked above); unaligned store.
    unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn exp_sum(x: &mut [f32], m: f32) -> f32 {
    let mm = _mm512_set1_ps(m);
    let mut sum = _mm512_setzero_ps();
    let full = x.len() / 16 * 16;
    for at in (0..full).step_by(16) {
        let e = exp(_mm512_sub_ps(load_f32(x, at), mm));
        store(x, at, e);
        sum = _mm512_add_ps(sum, e);
    }
    let mut total = _mm512_reduce_add_ps(sum);
    for v in &mut x[full..] {
        *v = (*v - m).exp();
        total += *v;
    }
    total
}
