//! Activations quantized to 8 bits per block of 32 values, as ggml's Q8_1
//! (with sums per 16 for Q6_K): the input side of every quantized product;
//! and to 16 bits ([`Q16Rows`]) for Q8_0's chunk product, whose weights are
//! precise enough that 8-bit activations would be the larger error.

use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::quant::format::QK;

/// Rows of activations, each quantized to signed bytes with one f32 scale
/// per block of 32. Buffers are kept between calls: quantizing the next
/// input of the same shape allocates nothing.
#[derive(Debug, Clone, Default)]
pub struct Q8Rows {
    rows: usize,
    cols: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    sum16: Vec<i16>,
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct Q8Row<'a> {
    /// The quantized values (`cols` of them).
    pub q: &'a [i8],
    /// Scale of each block of 32.
    pub d: &'a [f32],
    /// Scale times the sum of the block's values, per block of 32.
    pub s: &'a [f32],
    /// Sum of the values of each group of 16.
    pub sum16: &'a [i16],
}

impl Q8Rows {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantize `x`, `rows` rows of `cols` values (row-major), replacing
    /// what was held. `cols` must be a multiple of 32.
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) -> Result<()> {
        self.quantize_with(Isa::detect(), x, rows, cols)
    }

    /// [`Q8Rows::quantize`] on a given instruction-set level (every level
    /// gives the same values: the SIMD paths round as `f32::round` does).
    pub fn quantize_with(&mut self, isa: Isa, x: &[f32], rows: usize, cols: usize) -> Result<()> {
        check_blocks("Q8 activations", x, rows, cols)?;
        let blocks = rows * cols / QK;
        self.rows = rows;
        self.cols = cols;
        self.q.resize(rows * cols, 0);
        self.d.resize(blocks, 0.0);
        self.s.resize(blocks, 0.0);
        self.sum16.resize(2 * blocks, 0);
        let blocks = x.chunks_exact(QK).zip(self.q.chunks_exact_mut(QK));
        let sums = self.d.iter_mut().zip(&mut self.s);
        for (((xs, qs), (d, s)), sum16) in blocks.zip(sums).zip(self.sum16.chunks_exact_mut(2)) {
            let (scale, lo, hi) = quantize_block_with(isa, xs, qs);
            *d = scale;
            // |16 x 127| fits an i16
            sum16[0] = lo as i16;
            sum16[1] = hi as i16;
            *s = *d * (lo + hi) as f32;
        }
        Ok(())
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` (panics past [`Q8Rows::rows`]).
    pub fn row(&self, i: usize) -> Q8Row<'_> {
        let (c, b) = (self.cols, self.cols / QK);
        Q8Row {
            q: &self.q[i * c..(i + 1) * c],
            d: &self.d[i * b..(i + 1) * b],
            s: &self.s[i * b..(i + 1) * b],
            sum16: &self.sum16[2 * i * b..2 * (i + 1) * b],
        }
    }
}

/// The 256 values of one activation row that meet a K-quant super-block,
/// with their scales and sums, as arrays: a kernel's indices into them are
/// checked against constants, and most checks fold away, rather than
/// against a slice's length (Q6_K's product ran 35% faster in cache).
#[derive(Debug, Clone, Copy)]
pub struct Q8Super<'a> {
    /// The 256 quantized values.
    pub q: &'a [i8; 256],
    /// Scale of each block of 32.
    pub d: &'a [f32; 8],
    /// Scale times the sum of the block's values, per block of 32.
    pub s: &'a [f32; 8],
    /// Sum of the values of each group of 16.
    pub sum16: &'a [i16; 16],
}

impl<'a> Q8Row<'a> {
    /// Super-block `sb`: values `256 sb..256 sb + 256`; panics past the
    /// row's end.
    #[inline(always)]
    pub fn super_block(&self, sb: usize) -> Q8Super<'a> {
        fn part<T, const N: usize>(v: &[T], at: usize) -> &[T; N] {
            v[at..].first_chunk().expect("a super-block within the row")
        }
        Q8Super {
            q: part(self.q, 256 * sb),
            d: part(self.d, 8 * sb),
            s: part(self.s, 8 * sb),
            sum16: part(self.sum16, 16 * sb),
        }
    }
}

impl Q8Super<'_> {
    /// Word `w` of the values (values `4w..4w + 4` as a little-endian i32).
    #[inline(always)]
    pub fn word(&self, w: usize) -> i32 {
        word_of(self.q, w)
    }
}

/// Word `w` of the quantized values `q`: values `4w..4w + 4` as a
/// little-endian i32, the operand a `vpdpbusd` broadcasts.
#[inline(always)]
pub(crate) fn word_of(q: &[i8], w: usize) -> i32 {
    let q = &q[4 * w..4 * w + 4];
    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
}

/// That `x` holds `rows` rows of `cols` values, `cols` a whole number of
/// blocks of 32 (`what` names the activations in the error).
fn check_blocks(what: &'static str, x: &[f32], rows: usize, cols: usize) -> Result<()> {
    if !cols.is_multiple_of(QK) {
        return Err(KernelError::PartialBlock {
            format: what,
            cols,
            block: QK,
        });
    }
    check_len("activations", rows * cols, x.len())
}

/// One block on the best path `isa` allows: (scale, sum of the first 16
/// values, sum of the last 16).
fn quantize_block_with(isa: Isa, xs: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512
        && let Some(r) = crate::quant::avx512::quantize_block(xs, q)
    {
        return r;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2
        && let Some(r) = crate::quant::acts_avx2::quantize_block(xs, q)
    {
        return r;
    }
    let _ = isa;
    let d = quantize_block(xs, q);
    let lo: i32 = q[..16].iter().map(|&v| i32::from(v)).sum();
    let hi: i32 = q[16..].iter().map(|&v| i32::from(v)).sum();
    (d, lo, hi)
}

/// Quantize 32 values to `q` (round to nearest, ties away from zero);
/// returns the scale (0 for an all-zero block).
fn quantize_block(xs: &[f32], q: &mut [i8]) -> f32 {
    let (d, inv) = scale_of(xs, 127.0);
    for (q, v) in q.iter_mut().zip(xs) {
        *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// A block's scale (its largest magnitude over `limit`) and the scale's
/// inverse (0 for an all-zero block).
fn scale_of(xs: &[f32], limit: f32) -> (f32, f32) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / limit;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// The largest magnitude of a 16-bit activation (symmetric, as the 8-bit
/// ones keep to 127).
pub(super) const Q16_MAX: f32 = 32767.0;

/// Rows of activations, each quantized to 16-bit integers with one f32
/// scale per block of 32 (largest magnitude over [`Q16_MAX`]): rounding
/// 2^8 times finer than [`Q8Rows`]. Buffers are kept between calls.
#[derive(Debug, Clone, Default)]
pub struct Q16Rows {
    rows: usize,
    cols: usize,
    q: Vec<i16>,
    d: Vec<f32>,
}

/// One row of 16-bit activations.
#[derive(Debug, Clone, Copy)]
pub struct Q16Row<'a> {
    /// The quantized values (`cols` of them).
    pub q: &'a [i16],
    /// Scale of each block of 32.
    pub d: &'a [f32],
}

impl Q16Rows {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantize `x`, `rows` rows of `cols` values (row-major), replacing
    /// what was held. `cols` must be a multiple of 32.
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) -> Result<()> {
        self.quantize_with(Isa::detect(), x, rows, cols)
    }

    /// [`Q16Rows::quantize`] on a given instruction-set level (every level
    /// gives the same values).
    pub fn quantize_with(&mut self, isa: Isa, x: &[f32], rows: usize, cols: usize) -> Result<()> {
        check_blocks("Q16 activations", x, rows, cols)?;
        self.rows = rows;
        self.cols = cols;
        self.q.resize(rows * cols, 0);
        self.d.resize(rows * cols / QK, 0.0);
        let blocks = x.chunks_exact(QK).zip(self.q.chunks_exact_mut(QK));
        for ((xs, qs), d) in blocks.zip(&mut self.d) {
            *d = quantize_block16_with(isa, xs, qs);
        }
        Ok(())
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` (panics past [`Q16Rows::rows`]).
    pub fn row(&self, i: usize) -> Q16Row<'_> {
        let (c, b) = (self.cols, self.cols / QK);
        Q16Row {
            q: &self.q[i * c..(i + 1) * c],
            d: &self.d[i * b..(i + 1) * b],
        }
    }
}

/// One block to 16 bits on the best path `isa` allows; returns the scale.
fn quantize_block16_with(isa: Isa, xs: &[f32], q: &mut [i16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2
        && let Some(d) = crate::quant::acts_avx2::quantize_block16(xs, q)
    {
        return d;
    }
    let _ = isa;
    let (d, inv) = scale_of(xs, Q16_MAX);
    for (q, v) in q.iter_mut().zip(xs) {
        *q = (v * inv).round().clamp(-Q16_MAX, Q16_MAX) as i16;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_largest_value_and_sums() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.5).collect();
        let mut a = Q8Rows::new();
        a.quantize(&x, 1, 64).expect("whole blocks");
        let r = a.row(0);
        // the largest magnitude of each block maps to +-127
        assert_eq!(r.q[0], -127);
        assert_eq!(r.q[63], 127);
        for b in 0..2 {
            let sum: i32 = r.q[32 * b..32 * b + 32].iter().map(|&v| i32::from(v)).sum();
            assert_eq!(
                i32::from(r.sum16[2 * b]) + i32::from(r.sum16[2 * b + 1]),
                sum
            );
            assert!((r.s[b] - r.d[b] * sum as f32).abs() <= 1e-6 * r.s[b].abs().max(1.0));
            for j in 0..32 {
                let back = f32::from(r.q[32 * b + j]) * r.d[b];
                assert!((back - x[32 * b + j]).abs() <= r.d[b] * 0.5 + 1e-6);
            }
        }
        assert!(a.quantize(&x, 1, 48).is_err());
        // every level rounds as f32::round, ties (x.5 at scale 1) included
        let mut y: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 0.731).collect();
        for b in y.chunks_exact_mut(32) {
            b[0] = 127.0;
            b[5] = 2.5;
            b[6] = -2.5;
            b[7] = 0.5;
            b[8] = -0.5;
            b[9] = 0.499_999_97;
        }
        let mut want = Q8Rows::new();
        want.quantize_with(Isa::Portable, &y, 2, 128)
            .expect("whole blocks");
        assert_eq!(want.row(0).q[5..10], [3, -3, 1, -1, 0]);
        let mut checks = crate::testdata::IsaChecks::new("acts::blocks_keep_their_largest_value");
        for isa in crate::isa::ALL.into_iter().filter(|&i| checks.runs(i)) {
            let mut got = Q8Rows::new();
            got.quantize_with(isa, &y, 2, 128).expect("whole blocks");
            assert_eq!(
                (&got.q, &got.d, &got.s, &got.sum16),
                (&want.q, &want.d, &want.s, &want.sum16),
                "{isa:?}"
            );
        }
        assert!(a.quantize(&x[..32], 1, 64).is_err());
    }

    #[test]
    fn sixteen_bit_blocks_round_alike_on_every_level() {
        let mut y: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 0.731).collect();
        for b in y.chunks_exact_mut(32) {
            // scale 1: the largest value is 32767, ties land on x.5
            b[0] = Q16_MAX;
            b[5] = 2.5;
            b[6] = -2.5;
            b[7] = 0.5;
            b[8] = -0.5;
            b[9] = 0.499_999_97;
        }
        y[64..96].fill(0.0);
        let mut want = Q16Rows::new();
        want.quantize_with(Isa::Portable, &y, 2, 128)
            .expect("whole blocks");
        assert_eq!(want.row(0).q[5..10], [3, -3, 1, -1, 0]);
        assert_eq!(want.row(0).q[0], 32767);
        assert_eq!(want.row(0).d[2], 0.0, "an all-zero block has scale 0");
        for (j, (&q, &x)) in want.q.iter().zip(&y).enumerate() {
            let d = want.d[j / 32];
            assert!((f32::from(q) * d - x).abs() <= 0.5 * d + 1e-6, "{j}");
        }
        let mut checks = crate::testdata::IsaChecks::new("acts::sixteen_bit_blocks_round_alike");
        for isa in crate::isa::ALL.into_iter().filter(|&i| checks.runs(i)) {
            let mut got = Q16Rows::new();
            got.quantize_with(isa, &y, 2, 128).expect("whole blocks");
            assert_eq!((&got.q, &got.d), (&want.q, &want.d), "{isa:?}");
        }
        assert!(want.quantize(&y[..32], 1, 64).is_err());
        assert!(want.quantize(&y[..48], 1, 48).is_err());
    }
}
