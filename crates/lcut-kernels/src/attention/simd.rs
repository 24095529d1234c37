//! The attention's block steps on AVX2 and AVX-512, written once over the
//! vector width ([`Lanes`]): each key row is widened to f32 once and
//! multiplied with several query heads of its group; value rows are
//! accumulated several registers at a time; `exp` is vectorized. What the
//! two levels choose differently because of their register files (16
//! registers of 8 lanes against 32 of 16) is a constant of [`Level`]:
//! how many heads share a key row, whether the queries stay in registers,
//! and how many dimensions of the values are held at once.

#![allow(unsafe_code)]

use std::arch::x86_64::{_mm_mul_ps, _mm_set1_ps, _mm_storeu_ps};
use std::marker::PhantomData;

use super::{BlockOps, Rows, portable};
use crate::isa::Isa;
use crate::simd::avx2::Avx2;
use crate::simd::avx512::Avx512;
use crate::simd::{Lanes, Widen};

/// An instruction set's block steps: its lanes, the choices its register
/// file makes, and its `#[target_feature]` entry points (each one line
/// into the generic body below).
pub(crate) trait Level: Lanes {
    /// The level the CPU must run.
    const ISA: Isa;
    /// Query heads that share each key row's load in `scores`.
    const SCORE_HEADS: usize;
    /// Whether `scores` keeps the query heads in registers (else it reads
    /// them from memory at each use).
    const HOLDS_QUERIES: bool;
    /// Value dimensions `accumulate` holds in registers at once, where the
    /// head width is a multiple of it.
    const VALUE_DIMS: usize;

    /// [`BlockOps::scores`] at this level.
    ///
    /// # Safety
    /// The CPU runs this level's features.
    unsafe fn scores<T: Widen<Self>>(
        q: &[f32],
        groups: usize,
        keys: Rows<'_, T>,
        scale: f32,
        out: &mut [f32],
    );
    /// [`BlockOps::accumulate`] at this level.
    ///
    /// # Safety
    /// As [`Level::scores`].
    unsafe fn accumulate<T: Widen<Self>>(
        p: &[f32],
        groups: usize,
        values: Rows<'_, T>,
        acc: &mut [f32],
    );
    /// [`BlockOps::exp_sum`] at this level.
    ///
    /// # Safety
    /// As [`Level::scores`].
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32;
}

impl Level for Avx2 {
    const ISA: Isa = Isa::Avx2;
    // three heads of four keys keep 12 of the 16 registers busy
    const SCORE_HEADS: usize = 3;
    const HOLDS_QUERIES: bool = false;
    const VALUE_DIMS: usize = 16;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores<T: Widen<Self>>(
        q: &[f32],
        groups: usize,
        keys: Rows<'_, T>,
        scale: f32,
        out: &mut [f32],
    ) {
        // SAFETY: the features `Avx2` needs are enabled here.
        unsafe { scores::<Self, T>(q, groups, keys, scale, out) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate<T: Widen<Self>>(
        p: &[f32],
        groups: usize,
        values: Rows<'_, T>,
        acc: &mut [f32],
    ) {
        // SAFETY: the features `Avx2` needs are enabled here.
        unsafe { accumulate::<Self, T>(p, groups, values, acc) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32 {
        // SAFETY: the features `Avx2` needs are enabled here.
        unsafe { exp_sum::<Self>(x, m) }
    }
}

impl Level for Avx512 {
    const ISA: Isa = Isa::Avx512;
    const SCORE_HEADS: usize = 4;
    const HOLDS_QUERIES: bool = true;
    const VALUE_DIMS: usize = 64;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn scores<T: Widen<Self>>(
        q: &[f32],
        groups: usize,
        keys: Rows<'_, T>,
        scale: f32,
        out: &mut [f32],
    ) {
        // SAFETY: the features `Avx512` needs are enabled here.
        unsafe { scores::<Self, T>(q, groups, keys, scale, out) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn accumulate<T: Widen<Self>>(
        p: &[f32],
        groups: usize,
        values: Rows<'_, T>,
        acc: &mut [f32],
    ) {
        // SAFETY: the features `Avx512` needs are enabled here.
        unsafe { accumulate::<Self, T>(p, groups, values, acc) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32 {
        // SAFETY: the features `Avx512` needs are enabled here.
        unsafe { exp_sum::<Self>(x, m) }
    }
}

/// The block steps of level `L`; one exists only where the CPU runs them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ops<L> {
    _checked: PhantomData<L>,
}

impl<L: Level> Ops<L> {
    /// The steps, where the CPU runs `L`.
    pub(crate) fn new() -> Option<Self> {
        L::ISA.available().then_some(Self {
            _checked: PhantomData,
        })
    }
}

impl<L: Level, T: Widen<L>> BlockOps<T> for Ops<L> {
    fn scores(&self, q: &[f32], groups: usize, keys: Rows<'_, T>, scale: f32, out: &mut [f32]) {
        if !keys.width.is_multiple_of(L::WIDTH) {
            return portable::Ops.scores(q, groups, keys, scale, out);
        }
        // SAFETY: an `Ops` exists only where the CPU runs `L` (`new`).
        unsafe { L::scores(q, groups, keys, scale, out) }
    }

    fn accumulate(&self, p: &[f32], groups: usize, values: Rows<'_, T>, acc: &mut [f32]) {
        if !values.width.is_multiple_of(L::WIDTH) {
            return portable::Ops.accumulate(p, groups, values, acc);
        }
        // SAFETY: an `Ops` exists only where the CPU runs `L` (`new`).
        unsafe { L::accumulate(p, groups, values, acc) }
    }

    fn exp_sum(&self, x: &mut [f32], m: f32) -> f32 {
        // SAFETY: an `Ops` exists only where the CPU runs `L` (`new`).
        unsafe { L::exp_sum(x, m) }
    }
}

/// # Safety
/// The CPU runs `L`'s features (the caller enables them).
#[inline(always)]
unsafe fn scores<L: Level, T: Widen<L>>(
    q: &[f32],
    groups: usize,
    keys: Rows<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    // head widths of 64 and 128 get loops the compiler unrolls whole:
    // `CH` registers a head
    let ch = match keys.width {
        64 | 128 => keys.width / L::WIDTH,
        _ => 0,
    };
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(L::SCORE_HEADS);
        // SAFETY: passed on from the caller.
        unsafe {
            match (n, ch) {
                (4, 4) => scores_hd::<L, T, 4, 4>(q, g0, keys, scale, out),
                (3, 4) => scores_hd::<L, T, 3, 4>(q, g0, keys, scale, out),
                (2, 4) => scores_hd::<L, T, 2, 4>(q, g0, keys, scale, out),
                (1, 4) => scores_hd::<L, T, 1, 4>(q, g0, keys, scale, out),
                (4, 8) => scores_hd::<L, T, 4, 8>(q, g0, keys, scale, out),
                (3, 8) => scores_hd::<L, T, 3, 8>(q, g0, keys, scale, out),
                (2, 8) => scores_hd::<L, T, 2, 8>(q, g0, keys, scale, out),
                (1, 8) => scores_hd::<L, T, 1, 8>(q, g0, keys, scale, out),
                (3, 16) => scores_hd::<L, T, 3, 16>(q, g0, keys, scale, out),
                (2, 16) => scores_hd::<L, T, 2, 16>(q, g0, keys, scale, out),
                (1, 16) => scores_hd::<L, T, 1, 16>(q, g0, keys, scale, out),
                (4, _) => scores_n::<L, T, 4>(q, g0, keys, scale, out),
                (3, _) => scores_n::<L, T, 3>(q, g0, keys, scale, out),
                (2, _) => scores_n::<L, T, 2>(q, g0, keys, scale, out),
                _ => scores_n::<L, T, 1>(q, g0, keys, scale, out),
            }
        }
        g0 += n;
    }
}

/// Scores of query heads `g0..g0 + G` of width `WIDTH CH` against every
/// key row, four keys at a time.
///
/// # Safety
/// As [`scores`].
// k indexes the four keys of every head's accumulators at once
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores_hd<L: Level, T: Widen<L>, const G: usize, const CH: usize>(
    q: &[f32],
    g0: usize,
    keys: Rows<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let lanes = L::WIDTH;
    let (w, count) = (lanes * CH, keys.count);
    let qg: [&[f32]; G] = std::array::from_fn(|g| &q[(g0 + g) * w..(g0 + g + 1) * w]);
    // SAFETY: passed on from the caller.
    unsafe {
        let mut qv = [[L::zero(); CH]; G];
        if L::HOLDS_QUERIES {
            for (qvg, qs) in qv.iter_mut().zip(qg) {
                for (c, x) in qvg.iter_mut().enumerate() {
                    *x = L::load(qs, lanes * c);
                }
            }
        }
        let scale4 = _mm_set1_ps(scale);
        let mut j = 0;
        while j + 4 <= count {
            let mut acc = [[L::zero(); 4]; G];
            for k in 0..4 {
                let row = keys.row(j + k);
                for c in 0..CH {
                    let kv = T::widen(&row[lanes * c..]);
                    for g in 0..G {
                        let qgc = match L::HOLDS_QUERIES {
                            true => qv[g][c],
                            false => L::load(qg[g], lanes * c),
                        };
                        acc[g][k] = L::fmadd(qgc, kv, acc[g][k]);
                    }
                }
            }
            for (g, a) in acc.iter().enumerate() {
                let dst = &mut out[(g0 + g) * count + j..(g0 + g) * count + j + 4];
                // `dst` is 4 writable f32 (bounds-checked above); unaligned store
                _mm_storeu_ps(dst.as_mut_ptr(), _mm_mul_ps(L::sum4(*a), scale4));
            }
            j += 4;
        }
        while j < count {
            let row = keys.row(j);
            let mut acc = [L::zero(); G];
            for c in 0..CH {
                let kv = T::widen(&row[lanes * c..]);
                for g in 0..G {
                    let qgc = match L::HOLDS_QUERIES {
                        true => qv[g][c],
                        false => L::load(qg[g], lanes * c),
                    };
                    acc[g] = L::fmadd(qgc, kv, acc[g]);
                }
            }
            for (g, a) in acc.iter().enumerate() {
                out[(g0 + g) * count + j] = scale * L::sum(*a);
            }
            j += 1;
        }
    }
}

/// Scores of query heads `g0..g0 + G` against every key row.
///
/// # Safety
/// As [`scores`].
#[inline(always)]
unsafe fn scores_n<L: Level, T: Widen<L>, const G: usize>(
    q: &[f32],
    g0: usize,
    keys: Rows<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let w = keys.width;
    for j in 0..keys.count {
        let key = keys.row(j);
        // SAFETY: passed on from the caller.
        unsafe {
            let mut acc = [L::zero(); G];
            for d in (0..w).step_by(L::WIDTH) {
                let k = T::widen(&key[d..]);
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = L::fmadd(L::load(q, (g0 + g) * w + d), k, *a);
                }
            }
            for (g, a) in acc.iter().enumerate() {
                out[(g0 + g) * keys.count + j] = scale * L::sum(*a);
            }
        }
    }
}

/// # Safety
/// As [`scores`].
#[inline(always)]
unsafe fn accumulate<L: Level, T: Widen<L>>(
    p: &[f32],
    groups: usize,
    values: Rows<'_, T>,
    acc: &mut [f32],
) {
    // `CH` registers of values at once: VALUE_DIMS where the width allows
    let wide = values.width.is_multiple_of(L::VALUE_DIMS);
    let ch = if wide { L::VALUE_DIMS / L::WIDTH } else { 1 };
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(4);
        // SAFETY: passed on from the caller.
        unsafe {
            match (n, ch) {
                (4, 2) => accumulate_n::<L, T, 4, 2>(p, g0, values, acc),
                (3, 2) => accumulate_n::<L, T, 3, 2>(p, g0, values, acc),
                (2, 2) => accumulate_n::<L, T, 2, 2>(p, g0, values, acc),
                (_, 2) => accumulate_n::<L, T, 1, 2>(p, g0, values, acc),
                (4, 4) => accumulate_n::<L, T, 4, 4>(p, g0, values, acc),
                (3, 4) => accumulate_n::<L, T, 3, 4>(p, g0, values, acc),
                (2, 4) => accumulate_n::<L, T, 2, 4>(p, g0, values, acc),
                (_, 4) => accumulate_n::<L, T, 1, 4>(p, g0, values, acc),
                (4, _) => accumulate_n::<L, T, 4, 1>(p, g0, values, acc),
                (3, _) => accumulate_n::<L, T, 3, 1>(p, g0, values, acc),
                (2, _) => accumulate_n::<L, T, 2, 1>(p, g0, values, acc),
                (_, _) => accumulate_n::<L, T, 1, 1>(p, g0, values, acc),
            }
        }
        g0 += n;
    }
}

/// Heads `g0..g0 + G` += their weighted value rows, `WIDTH CH` dimensions
/// at a time held in registers.
///
/// # Safety
/// As [`scores`].
#[inline(always)]
unsafe fn accumulate_n<L: Level, T: Widen<L>, const G: usize, const CH: usize>(
    p: &[f32],
    g0: usize,
    values: Rows<'_, T>,
    acc: &mut [f32],
) {
    let lanes = L::WIDTH;
    let (w, count) = (values.width, values.count);
    let weights: [&[f32]; G] = std::array::from_fn(|g| &p[(g0 + g) * count..(g0 + g + 1) * count]);
    for d in (0..w).step_by(lanes * CH) {
        // SAFETY: passed on from the caller.
        unsafe {
            let mut a = [[L::zero(); CH]; G];
            for (g, ag) in a.iter_mut().enumerate() {
                for (c, x) in ag.iter_mut().enumerate() {
                    *x = L::load(acc, (g0 + g) * w + d + lanes * c);
                }
            }
            for j in 0..count {
                let row = values.row(j);
                let row = &row[d..d + lanes * CH];
                let mut v = [L::zero(); CH];
                for (c, x) in v.iter_mut().enumerate() {
                    *x = T::widen(&row[lanes * c..]);
                }
                for (ag, wg) in a.iter_mut().zip(&weights) {
                    let pj = L::splat(wg[j]);
                    for (x, vc) in ag.iter_mut().zip(v) {
                        *x = L::fmadd(pj, vc, *x);
                    }
                }
            }
            for (g, ag) in a.iter().enumerate() {
                for (c, x) in ag.iter().enumerate() {
                    L::store(acc, (g0 + g) * w + d + lanes * c, *x);
                }
            }
        }
    }
}

/// # Safety
/// As [`scores`].
#[inline(always)]
unsafe fn exp_sum<L: Level>(x: &mut [f32], m: f32) -> f32 {
    let lanes = L::WIDTH;
    let full = x.len() / lanes * lanes;
    // SAFETY: passed on from the caller.
    let mut total = unsafe {
        let mm = L::splat(m);
        let mut sum = L::zero();
        for at in (0..full).step_by(lanes) {
            let e = L::exp(L::sub(L::load(x, at), mm));
            L::store(x, at, e);
            sum = L::add(sum, e);
        }
        L::sum(sum)
    };
    for v in &mut x[full..] {
        *v = (*v - m).exp();
        total += *v;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sum4` of four vectors is their four lane sums, at `L`.
    fn four_sums_at_once<L: Level>(sums: unsafe fn(&[f32]) -> [f32; 4]) {
        if !L::ISA.available() {
            println!("note: this CPU lacks {:?}; skipped", L::ISA);
            return;
        }
        let xs: Vec<f32> = (0..4 * L::WIDTH).map(|i| (i * i) as f32).collect();
        // SAFETY: the level was just checked.
        let got = unsafe { sums(&xs) };
        let want: Vec<f32> = xs.chunks(L::WIDTH).map(|c| c.iter().sum()).collect();
        assert_eq!(got.to_vec(), want);
    }

    /// # Safety
    /// As [`Lanes::sum4`].
    #[inline(always)]
    unsafe fn sums<L: Lanes>(xs: &[f32]) -> [f32; 4] {
        let w = L::WIDTH;
        let mut out = [0f32; 4];
        // SAFETY: `out` is 4 writable f32; the rest as the caller's.
        unsafe {
            let v = [
                L::load(xs, 0),
                L::load(xs, w),
                L::load(xs, 2 * w),
                L::load(xs, 3 * w),
            ];
            _mm_storeu_ps(out.as_mut_ptr(), L::sum4(v));
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sums_avx2(xs: &[f32]) -> [f32; 4] {
        // SAFETY: the features are enabled here.
        unsafe { sums::<Avx2>(xs) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn sums_avx512(xs: &[f32]) -> [f32; 4] {
        // SAFETY: the features are enabled here.
        unsafe { sums::<Avx512>(xs) }
    }

    #[test]
    fn four_sums_at_once_avx2() {
        four_sums_at_once::<Avx2>(sums_avx2);
    }

    #[test]
    fn four_sums_at_once_avx512() {
        four_sums_at_once::<Avx512>(sums_avx512);
    }
}
