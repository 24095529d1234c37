//! The chunk product's micro-kernel for Q8_0, against 16-bit activations
//! ([`Q16Rows`](super::acts::Q16Rows)): Q8_0's weights are precise enough
//! that the 8-bit activations of the other formats' tile ([`super::tile`])
//! would double its logits' deviation from transformers', so its weights
//! are widened to 16 bits instead and multiplied in 16-bit pairs.
//!
//! Sixteen weight rows are unpacked once into 16-bit values interleaved
//! two at a time (lane r of a 64-byte step holds two values of row r), so
//! that one multiply-add of 16-bit pairs against two activations broadcast
//! to every lane adds into lane r the dot product of row r: `vpdpwssd` on
//! AVX-512 VNNI (sixteen rows a register), `vpmaddwd` and an add on AVX2
//! (eight rows a register, two passes). No pair saturates (weights ≥ -128,
//! activations within ±32767) and a block's sum stays within 2^28, so both
//! levels hold the same integers; one conversion and one multiply-add in
//! f32 scale a block's sixteen sums lane by lane in the same order on both
//! levels, which gives the same bits.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256i, __m512i, _mm256_add_epi32, _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
    _mm256_loadu_si256, _mm256_madd_epi16, _mm256_mul_ps, _mm256_set1_epi32, _mm256_set1_ps,
    _mm256_setzero_ps, _mm256_setzero_si256, _mm256_storeu_ps, _mm512_cvtepi32_ps,
    _mm512_dpwssd_epi32, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mul_ps,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_storeu_ps,
};

use crate::isa::Isa;
use crate::quant::acts::Q16Row;
use crate::quant::format::{QK, QuantFormat, f16_at};
use crate::quant::tile::{GROUP, TILE, by_groups, level, reset};

/// Steps per block of 32 values (two values of each row a step).
const STEPS: usize = QK / 2;

/// 16-bit values of one step: two of each row.
const STEP_VALUES: usize = 2 * TILE;

/// Whether the Q8_0 tile runs at `isa` on this CPU (AVX2 or AVX-512 VNNI).
pub(super) fn supports(isa: Isa, format: QuantFormat) -> bool {
    format == QuantFormat::Q8_0 && level(isa).is_some()
}

/// Up to [`TILE`] Q8_0 rows unpacked: per block, sixteen steps of two
/// 16-bit values of each row, and the rows' scales.
#[derive(Debug, Default)]
pub(super) struct Tile16 {
    /// The values, [block][step][row][2].
    q: Vec<i16>,
    /// Each row's scale, [block][row].
    d: Vec<f32>,
    /// Rows unpacked (the lanes past them hold zeros).
    rows: usize,
}

impl Tile16 {
    /// Unpack the Q8_0 rows `w` (`row_bytes` each, at most [`TILE`]).
    pub(super) fn fill(&mut self, w: &[u8], row_bytes: usize) {
        let format = QuantFormat::Q8_0;
        let blocks = row_bytes / format.block_bytes();
        self.rows = w.len() / row_bytes;
        reset(&mut self.q, blocks * STEPS * STEP_VALUES);
        reset(&mut self.d, blocks * TILE);
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            for (b, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
                self.d[b * TILE + r] = f16_at(blk, 0);
                for (k, pair) in blk[2..2 + QK].chunks_exact(2).enumerate() {
                    let at = (b * STEPS + k) * STEP_VALUES + 2 * r;
                    self.q[at] = i16::from(pair[0] as i8);
                    self.q[at + 1] = i16::from(pair[1] as i8);
                }
            }
        }
    }

    /// Blocks of 32 values per row.
    fn blocks(&self) -> usize {
        self.d.len() / TILE
    }

    /// The tile against every activation row `a` on the best level up to
    /// `isa` ([`supports`] must hold): `o[i * stride + r]` is row r dot
    /// activation row i.
    pub(super) fn product(&self, isa: Isa, a: &[Q16Row<'_>], o: &mut [f32], stride: usize) {
        let level =
            level(isa).expect("the Q8_0 tile runs on AVX2 or AVX-512 (AMX: its AVX-512 path)");
        by_groups(a, self.rows, o, stride, |group, sums| {
            // SAFETY: `level` is a level this CPU has.
            unsafe {
                match (level >= Isa::Avx512, group.len()) {
                    (true, 4) => group_avx512::<4>(self, group, sums),
                    (true, 3) => group_avx512::<3>(self, group, sums),
                    (true, 2) => group_avx512::<2>(self, group, sums),
                    (true, _) => group_avx512::<1>(self, group, sums),
                    (false, 4) => group_avx2::<4>(self, group, sums),
                    (false, 3) => group_avx2::<3>(self, group, sums),
                    (false, 2) => group_avx2::<2>(self, group, sums),
                    (false, _) => group_avx2::<1>(self, group, sums),
                }
            }
        });
    }
}

/// The 32 activations of block `b` of each of the `A` rows `a`.
fn block_acts<'a, const A: usize>(a: &[Q16Row<'a>], b: usize) -> [&'a [i16; QK]; A] {
    std::array::from_fn(|i| {
        a[i].q[QK * b..QK * (b + 1)]
            .try_into()
            .expect("a block is 32 values")
    })
}

/// The activations `2k..2k + 2` of a block as one word (the first in the
/// low half, as `vpmaddwd` pairs them with a row's two weights).
#[inline(always)]
fn act_pair(x: &[i16; QK], k: usize) -> i32 {
    (u32::from(x[2 * k] as u16) | (u32::from(x[2 * k + 1] as u16) << 16)) as i32
}

/// The tile against the `A` activation rows `a` on AVX-512 VNNI.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_avx512<const A: usize>(
    t: &Tile16,
    a: &[Q16Row<'_>],
    out: &mut [[f32; TILE]; GROUP],
) {
    let mut acc = [_mm512_setzero_ps(); A];
    for b in 0..t.blocks() {
        let mut isum = [_mm512_setzero_si512(); A];
        let xs = block_acts::<A>(a, b);
        for k in 0..STEPS {
            let at = (b * STEPS + k) * STEP_VALUES;
            let w = &t.q[at..at + STEP_VALUES];
            // SAFETY: `w` is 64 readable bytes (bounds-checked above); unaligned load.
            let w = unsafe { _mm512_loadu_si512(w.as_ptr().cast::<__m512i>()) };
            for (i, x) in xs.iter().enumerate() {
                let x = _mm512_set1_epi32(act_pair(x, k));
                isum[i] = _mm512_dpwssd_epi32(isum[i], w, x);
            }
        }
        let d = &t.d[b * TILE..(b + 1) * TILE];
        // SAFETY: `d` is 16 readable f32 (bounds-checked above).
        let d = unsafe { _mm512_loadu_ps(d.as_ptr()) };
        for (i, row) in a[..A].iter().enumerate() {
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(row.d[b]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), scale, acc[i]);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `o` is 16 writable f32; unaligned store.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
    }
}

/// The tile against the `A` activation rows `a` on AVX2, in two passes of
/// eight rows.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const A: usize>(t: &Tile16, a: &[Q16Row<'_>], out: &mut [[f32; TILE]; GROUP]) {
    const HALF: usize = TILE / 2;
    for h in 0..2 {
        let lanes = h * HALF..(h + 1) * HALF;
        let mut acc = [_mm256_setzero_ps(); A];
        for b in 0..t.blocks() {
            let mut isum = [_mm256_setzero_si256(); A];
            let xs = block_acts::<A>(a, b);
            for k in 0..STEPS {
                let at = (b * STEPS + k) * STEP_VALUES + 2 * lanes.start;
                let w = &t.q[at..at + STEP_VALUES / 2];
                // SAFETY: `w` is 32 readable bytes (bounds-checked above); unaligned load.
                let w = unsafe { _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()) };
                for (i, x) in xs.iter().enumerate() {
                    let x = _mm256_set1_epi32(act_pair(x, k));
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(w, x));
                }
            }
            let d = &t.d[b * TILE..(b + 1) * TILE][lanes.clone()];
            // SAFETY: `d` is 8 readable f32 (bounds-checked above).
            let d = unsafe { _mm256_loadu_ps(d.as_ptr()) };
            for (i, row) in a[..A].iter().enumerate() {
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(row.d[b]));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), scale, acc[i]);
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            let o = &mut o[lanes.clone()];
            // SAFETY: `o` is 8 writable f32 (bounds-checked above); unaligned store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc) };
        }
    }
}
