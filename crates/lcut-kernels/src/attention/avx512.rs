//! The attention's block steps with AVX-512: each key row is widened to
//! f32 once and multiplied with up to four query heads of its group; value
//! rows are accumulated 64 (or 16) dimensions at a time in registers;
//! `exp` is vectorized.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128, __m512, _mm_add_ps, _mm_mul_ps, _mm_set1_ps, _mm_storeu_ps, _mm256_add_ps,
    _mm256_castpd_ps, _mm256_castps256_ps128, _mm256_extractf128_ps, _mm512_add_ps,
    _mm512_castpd_ps, _mm512_castps_pd, _mm512_castps512_ps256, _mm512_extractf64x4_pd,
    _mm512_fmadd_ps, _mm512_reduce_add_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    _mm512_sub_ps, _mm512_unpackhi_pd, _mm512_unpackhi_ps, _mm512_unpacklo_pd, _mm512_unpacklo_ps,
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
        // head widths of 64 and 128 get loops the compiler unrolls whole
        match (n, keys.width) {
            (4, 64) => scores_hd::<T, 4, 4>(q, g0, keys, scale, out),
            (3, 64) => scores_hd::<T, 3, 4>(q, g0, keys, scale, out),
            (2, 64) => scores_hd::<T, 2, 4>(q, g0, keys, scale, out),
            (1, 64) => scores_hd::<T, 1, 4>(q, g0, keys, scale, out),
            (4, 128) => scores_hd::<T, 4, 8>(q, g0, keys, scale, out),
            (3, 128) => scores_hd::<T, 3, 8>(q, g0, keys, scale, out),
            (2, 128) => scores_hd::<T, 2, 8>(q, g0, keys, scale, out),
            (1, 128) => scores_hd::<T, 1, 8>(q, g0, keys, scale, out),
            (4, _) => scores_n::<T, 4>(q, g0, keys, scale, out),
            (3, _) => scores_n::<T, 3>(q, g0, keys, scale, out),
            (2, _) => scores_n::<T, 2>(q, g0, keys, scale, out),
            _ => scores_n::<T, 1>(q, g0, keys, scale, out),
        }
        g0 += n;
    }
}

/// The sums of four vectors' lanes: a transposing reduction (13
/// instructions for four sums, where four separate reductions take 32).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn reduce4(v: [__m512; 4]) -> __m128 {
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

/// Scores of query heads `g0..g0 + G` of width `16 CH` against every key
/// row, four keys at a time.
// k indexes the four keys of every head's accumulators at once
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scores_hd<T: Widen16, const G: usize, const CH: usize>(
    q: &[f32],
    g0: usize,
    keys: Rows<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let (w, count) = (16 * CH, keys.count);
    let mut qv = [[_mm512_setzero_ps(); CH]; G];
    for (g, qg) in qv.iter_mut().enumerate() {
        for (c, x) in qg.iter_mut().enumerate() {
            *x = load_f32(q, (g0 + g) * w + 16 * c);
        }
    }
    let scale4 = _mm_set1_ps(scale);
    let mut j = 0;
    while j + 4 <= count {
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for k in 0..4 {
            let at = (j + k) * keys.stride;
            let row = &keys.data[at..at + w];
            for c in 0..CH {
                // SAFETY: the features `load16` needs are enabled here.
                let kv = unsafe { T::load16(&row[16 * c..]) };
                for g in 0..G {
                    acc[g][k] = _mm512_fmadd_ps(qv[g][c], kv, acc[g][k]);
                }
            }
        }
        for (g, a) in acc.iter().enumerate() {
            let dst = &mut out[(g0 + g) * count + j..(g0 + g) * count + j + 4];
            // SAFETY: `dst` is 4 writable f32 (bounds-checked above); unaligned store.
            unsafe { _mm_storeu_ps(dst.as_mut_ptr(), _mm_mul_ps(reduce4(*a), scale4)) };
        }
        j += 4;
    }
    while j < count {
        let at = j * keys.stride;
        let row = &keys.data[at..at + w];
        let mut acc = [_mm512_setzero_ps(); G];
        for c in 0..CH {
            // SAFETY: the features `load16` needs are enabled here.
            let kv = unsafe { T::load16(&row[16 * c..]) };
            for g in 0..G {
                acc[g] = _mm512_fmadd_ps(qv[g][c], kv, acc[g]);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            out[(g0 + g) * count + j] = scale * _mm512_reduce_add_ps(*a);
        }
        j += 1;
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
    let weights: [&[f32]; G] = std::array::from_fn(|g| &p[(g0 + g) * count..(g0 + g + 1) * count]);
    for d in (0..w).step_by(16 * CH) {
        let mut a = [[_mm512_setzero_ps(); CH]; G];
        for (g, ag) in a.iter_mut().enumerate() {
            for (c, x) in ag.iter_mut().enumerate() {
                *x = load_f32(acc, (g0 + g) * w + d + 16 * c);
            }
        }
        let rows = values.data.chunks(values.stride).take(count);
        for (j, row) in rows.enumerate() {
            let row = &row[d..d + 16 * CH];
            let mut v = [_mm512_setzero_ps(); CH];
            for (c, x) in v.iter_mut().enumerate() {
                // SAFETY: the features `load16` needs are enabled here.
                *x = unsafe { T::load16(&row[16 * c..]) };
            }
            for (ag, wg) in a.iter_mut().zip(&weights) {
                let pj = _mm512_set1_ps(wg[j]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_sums_at_once() {
        if !Isa::Avx512.available() {
            println!("note: this CPU lacks AVX-512; skipped");
            return;
        }
        let xs: Vec<f32> = (0..64).map(|i| i as f32).collect();
        // SAFETY: AVX-512 was just checked.
        let got = unsafe { sums(&xs) };
        let want: Vec<f32> = xs.chunks(16).map(|c| c.iter().sum()).collect();
        assert_eq!(got.to_vec(), want);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn sums(xs: &[f32]) -> [f32; 4] {
        let v = [
            load_f32(xs, 0),
            load_f32(xs, 16),
            load_f32(xs, 32),
            load_f32(xs, 48),
        ];
        let mut out = [0f32; 4];
        // SAFETY: `out` is 4 writable f32.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), reduce4(v)) };
        out
    }
}
