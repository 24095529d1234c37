//! The chunk product's AVX-512 VNNI micro-kernel for the 4- and 5-bit
//! formats whose weights are d · q + e in blocks of 32 with q unsigned
//! (Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K's sub-blocks): sixteen weight rows are
//! unpacked once into bytes interleaved four at a time (lane r of a
//! register holds four values of row r), so that `vpdpbusd` against four
//! activation bytes broadcast to every lane adds into lane r the dot
//! product of row r; after the eight steps of a block each lane holds a
//! whole block's integer sum, and one conversion and two multiply-adds
//! scale sixteen (row, block) sums at once, for each of up to four
//! activation rows sharing the unpacked weights.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512i, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_loadu_ps,
    _mm512_loadu_si512, _mm512_mul_ps, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_setzero_si512, _mm512_storeu_ps,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::format::{QK, QK_K, QuantFormat, f16_at, nibbles32, q4k_scale_min, values5};

/// Weight rows per tile (one per lane).
pub(super) const TILE: usize = 16;

/// Activation rows sharing one pass over a tile.
const GROUP: usize = 4;

/// Whether `format` has this path on this CPU. Q8_0 has not: its
/// weights' own error is so small that 8-bit activations in every prefill
/// chunk doubled its logits' largest deviation from transformers' (0.11 to
/// 0.21 of the logit scale on the oracle models), so it keeps the
/// dequantized f32 product. Q6_K changes scale every 16 values.
pub(super) fn supports(isa: Isa, format: QuantFormat) -> bool {
    isa >= Isa::Avx512
        && Isa::Avx512.available()
        && !matches!(format, QuantFormat::Q8_0 | QuantFormat::Q6K)
}

/// Call `f(b, values, d, e)` for each 32-value block `b` of a quantized
/// row of a format with this path: its values as unsigned bytes and the
/// weight of value j being `d · values[j] + e`. Q4_K's sub-blocks of 32
/// carry their own 6-bit scale and minimum under the super-block's.
fn for_each_block32(
    format: QuantFormat,
    row: &[u8],
    mut f: impl FnMut(usize, &[u8; QK], f32, f32),
) {
    for (i, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
        let d = f16_at(blk, 0);
        match format {
            QuantFormat::Q4_0 => f(i, &nibbles32(&blk[2..18]), d, -8.0 * d),
            QuantFormat::Q4_1 => f(i, &nibbles32(&blk[4..20]), d, f16_at(blk, 2)),
            QuantFormat::Q5_0 => f(i, &values5(&blk[2..6], &blk[6..22]), d, -16.0 * d),
            QuantFormat::Q5_1 => f(i, &values5(&blk[4..8], &blk[8..24]), d, f16_at(blk, 2)),
            QuantFormat::Q4K => {
                let dmin = f16_at(blk, 2);
                for j in 0..QK_K / QK {
                    let (sc, m) = q4k_scale_min(&blk[4..16], j);
                    let bytes = &blk[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
                    let values: [u8; QK] = std::array::from_fn(|l| {
                        if j % 2 == 0 {
                            bytes[l] & 0x0F
                        } else {
                            bytes[l] >> 4
                        }
                    });
                    f(
                        8 * i + j,
                        &values,
                        d * f32::from(sc),
                        -(dmin * f32::from(m)),
                    );
                }
            }
            QuantFormat::Q8_0 | QuantFormat::Q6K => {
                unreachable!("{format:?} has no tile path (`supports`)")
            }
        }
    }
}

/// Up to [`TILE`] weight rows unpacked: per block, eight steps of 64 bytes
/// (four values of each row), the rows' scales and the coefficient of the
/// activations' scaled sum (the offset or the minimum).
#[derive(Debug, Default)]
pub(super) struct Tile {
    q: Vec<u8>,
    d: Vec<f32>,
    e: Vec<f32>,
    rows: usize,
}

impl Tile {
    /// Unpack the rows `w` (`row_bytes` each, at most [`TILE`]) of `format`.
    pub(super) fn fill(&mut self, format: QuantFormat, w: &[u8], row_bytes: usize) {
        let blocks = row_bytes / format.block_bytes() * (format.block_len() / QK);
        self.rows = w.len() / row_bytes;
        self.q.clear();
        self.q.resize(blocks * 8 * 64, 0);
        self.d.clear();
        self.d.resize(blocks * TILE, 0.0);
        self.e.clear();
        self.e.resize(blocks * TILE, 0.0);
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            for_each_block32(format, row, |b, values, d, e| {
                self.d[b * TILE + r] = d;
                self.e[b * TILE + r] = e;
                for k in 0..8 {
                    let at = b * 512 + k * 64 + r * 4;
                    self.q[at..at + 4].copy_from_slice(&values[4 * k..4 * k + 4]);
                }
            });
        }
    }

    /// The tile against every activation row `a`: `o[i * stride + r]` is
    /// row r dot activation row i.
    pub(super) fn product(&self, a: &[Q8Row<'_>], o: &mut [f32], stride: usize) {
        assert!(Isa::Avx512.available(), "the tile exists only with AVX-512");
        for (g, group) in a.chunks(GROUP).enumerate() {
            let mut sums = [[0f32; TILE]; GROUP];
            // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were checked above.
            unsafe {
                match group.len() {
                    4 => self.group::<4>(group, &mut sums),
                    3 => self.group::<3>(group, &mut sums),
                    2 => self.group::<2>(group, &mut sums),
                    _ => self.group::<1>(group, &mut sums),
                }
            }
            for (i, s) in sums.iter().enumerate().take(group.len()) {
                let at = (g * GROUP + i) * stride;
                o[at..at + self.rows].copy_from_slice(&s[..self.rows]);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn group<const A: usize>(&self, a: &[Q8Row<'_>], out: &mut [[f32; TILE]; GROUP]) {
        let blocks = self.d.len() / TILE;
        let mut acc = [_mm512_setzero_ps(); A];
        for b in 0..blocks {
            let mut isum = [_mm512_setzero_si512(); A];
            let wb = &self.q[b * 512..b * 512 + 512];
            for k in 0..8 {
                let w = &wb[k * 64..k * 64 + 64];
                // SAFETY: `w` is 64 readable bytes (bounds-checked above); unaligned load.
                let w = unsafe { _mm512_loadu_si512(w.as_ptr().cast::<__m512i>()) };
                for i in 0..A {
                    let x = &a[i].q[QK * b + 4 * k..QK * b + 4 * k + 4];
                    let x = i32::from_le_bytes([x[0] as u8, x[1] as u8, x[2] as u8, x[3] as u8]);
                    isum[i] = _mm512_dpbusd_epi32(isum[i], w, _mm512_set1_epi32(x));
                }
            }
            let (d, e) = (
                &self.d[b * TILE..b * TILE + TILE],
                &self.e[b * TILE..b * TILE + TILE],
            );
            // SAFETY: `d` and `e` are 16 readable f32 each (bounds-checked above).
            let (d, e) = unsafe { (_mm512_loadu_ps(d.as_ptr()), _mm512_loadu_ps(e.as_ptr())) };
            for i in 0..A {
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(a[i].d[b]));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), scale, acc[i]);
                acc[i] = _mm512_fmadd_ps(e, _mm512_set1_ps(a[i].s[b]), acc[i]);
            }
        }
        for i in 0..A {
            // SAFETY: `out[i]` is 16 writable f32; unaligned store.
            unsafe { _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]) };
        }
    }
}
