//! The chunk product's AVX-512 VNNI micro-kernel for the formats whose
//! weights are d · q + e in blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
//! offset to unsigned, and Q4_K's sub-blocks; not Q6_K, whose scales
//! change every 16 values): sixteen weight rows are
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
    _mm512_setzero_si512, _mm512_storeu_ps, _mm512_sub_epi32,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::format::{QK, QK_K, QuantFormat, f16_at, nibbles32, q4k_scale_min, values5};

/// Weight rows per tile (one per lane).
pub(super) const TILE: usize = 16;

/// Activation rows sharing one pass over a tile.
const GROUP: usize = 4;

/// Whether `format` has this path on this CPU.
pub(super) fn supports(isa: Isa, format: QuantFormat) -> bool {
    isa >= Isa::Avx512 && Isa::Avx512.available() && !matches!(format, QuantFormat::Q6K)
}

/// Call `f(b, values, d, e)` for each 32-value block `b` of a quantized
/// row: its values as bytes (unsigned but Q8_0's, whose bytes are signed)
/// and the weight of value j being `d · values[j] + e`. Q4_K's sub-blocks
/// of 32 carry their own 6-bit scale and minimum under the super-block's.
/// (Q6_K, with a scale per 16 values, has no such form.)
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
            QuantFormat::Q8_0 => {
                let values: [u8; QK] = std::array::from_fn(|j| blk[2 + j]);
                f(i, &values, d, 0.0);
            }
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
            QuantFormat::Q6K => unreachable!("Q6_K has no tile path (`supports`)"),
        }
    }
}

/// Up to [`TILE`] weight rows unpacked: per block, eight steps of 64 bytes
/// (four values of each row), the rows' scales and the coefficient of the
/// activations' scaled sum (the offset or the minimum).
///
/// `vpdpbusd` multiplies unsigned by signed bytes. Unsigned weights take
/// the unsigned side; Q8_0's signed weights take the signed side against
/// the activations offset by 128, and the block's integer sum loses
/// 128 · Σ q again (`c`), so that it stays exact.
#[derive(Debug, Default)]
pub(super) struct Tile {
    q: Vec<u8>,
    d: Vec<f32>,
    e: Vec<f32>,
    c: Vec<i32>,
    signed: bool,
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
        self.signed = format == QuantFormat::Q8_0;
        self.c.clear();
        self.c
            .resize(if self.signed { blocks * TILE } else { 0 }, 0);
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            for_each_block32(format, row, |b, values, d, e| {
                self.d[b * TILE + r] = d;
                self.e[b * TILE + r] = e;
                if self.signed {
                    self.c[b * TILE + r] = values.iter().map(|&v| 128 * i32::from(v as i8)).sum();
                }
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
                match (group.len(), self.signed) {
                    (4, false) => self.group::<4, false>(group, &mut sums),
                    (3, false) => self.group::<3, false>(group, &mut sums),
                    (2, false) => self.group::<2, false>(group, &mut sums),
                    (_, false) => self.group::<1, false>(group, &mut sums),
                    (4, true) => self.group::<4, true>(group, &mut sums),
                    (3, true) => self.group::<3, true>(group, &mut sums),
                    (2, true) => self.group::<2, true>(group, &mut sums),
                    (_, true) => self.group::<1, true>(group, &mut sums),
                }
            }
            for (i, s) in sums.iter().enumerate().take(group.len()) {
                let at = (g * GROUP + i) * stride;
                o[at..at + self.rows].copy_from_slice(&s[..self.rows]);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn group<const A: usize, const SIGNED: bool>(
        &self,
        a: &[Q8Row<'_>],
        out: &mut [[f32; TILE]; GROUP],
    ) {
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
                    isum[i] = if SIGNED {
                        // the activation bytes offset by 128 (unsigned), the weights signed
                        let x = _mm512_set1_epi32(x ^ 0x8080_8080_u32 as i32);
                        _mm512_dpbusd_epi32(isum[i], x, w)
                    } else {
                        _mm512_dpbusd_epi32(isum[i], w, _mm512_set1_epi32(x))
                    };
                }
            }
            if SIGNED {
                let c = &self.c[b * TILE..b * TILE + TILE];
                // SAFETY: `c` is 16 readable i32 (bounds-checked above); unaligned load.
                let c = unsafe { _mm512_loadu_si512(c.as_ptr().cast::<__m512i>()) };
                for s in &mut isum {
                    *s = _mm512_sub_epi32(*s, c);
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
