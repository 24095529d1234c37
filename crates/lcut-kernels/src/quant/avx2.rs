//! The quantized dot products with AVX2 integer instructions: 4- and 6-bit
//! values unpacked to bytes, multiplied with the 8-bit activations by
//! `maddubs` (unsigned x signed byte pairs to 16 bits), widened by `madd`,
//! scaled per block and accumulated in eight f32 lanes. Up to four
//! activation rows share each unpacked block.
//!
//! A pair with `avx512.rs`, not one body over the vector width: without
//! VNNI each product is two instructions and a widening, and AVX-512 puts
//! two blocks in a register with one gather for their scales, so the
//! instruction sequences differ, not only their width.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _mm_add_ps, _mm_add_ss, _mm_cvtph_ps, _mm_cvtsi32_si128,
    _mm_cvtss_f32, _mm_loadu_si128, _mm_movehdup_ps, _mm_movehl_ps, _mm_set1_epi16, _mm_shuffle_ps,
    _mm_srli_epi16, _mm256_add_ps, _mm256_and_si256, _mm256_blendv_epi8, _mm256_castps256_ps128,
    _mm256_castsi256_ps, _mm256_cmpeq_epi8, _mm256_cmpgt_epi32, _mm256_cvtepi32_ps,
    _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_si256, _mm256_madd_epi16,
    _mm256_maddubs_epi16, _mm256_or_si256, _mm256_set_m128i, _mm256_set1_epi8, _mm256_set1_epi16,
    _mm256_set1_epi32, _mm256_set1_epi64x, _mm256_set1_ps, _mm256_setr_epi64x, _mm256_setzero_ps,
    _mm256_shuffle_epi8, _mm256_sign_epi8, _mm256_slli_epi16, _mm256_slli_epi32, _mm256_sllv_epi32,
    _mm256_srli_epi16, _mm256_sub_epi32, _mm256_zextsi128_si256,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::format::{KVALUES_MXFP4, QK, QuantFormat, e8m0_half, q4k_scale_min};

/// Rows of `w` (`row_bytes` each) dot the activation rows `a` into `out`
/// ([row][activation]); false, doing nothing, where the CPU lacks AVX2.
pub(super) fn rows(
    format: QuantFormat,
    w: &[u8],
    row_bytes: usize,
    a: &[Q8Row<'_>],
    out: &mut [f32],
) -> bool {
    if !Isa::Avx2.available() {
        return false;
    }
    // SAFETY: AVX2, FMA and F16C were just checked, all `rows_avx2` needs.
    unsafe { rows_avx2(format, w, row_bytes, a, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2(format: QuantFormat, w: &[u8], row_bytes: usize, a: &[Q8Row<'_>], out: &mut [f32]) {
    let n = a.len();
    for (o, row) in out.chunks_exact_mut(n).zip(w.chunks_exact(row_bytes)) {
        let mut i = 0;
        while i < n {
            match n - i {
                1 => {
                    o[i] = dot::<1>(format, row, &[a[i]])[0];
                    i += 1;
                }
                2 | 3 => {
                    o[i..i + 2].copy_from_slice(&dot::<2>(format, row, &[a[i], a[i + 1]]));
                    i += 2;
                }
                _ => {
                    let group = [a[i], a[i + 1], a[i + 2], a[i + 3]];
                    o[i..i + 4].copy_from_slice(&dot::<4>(format, row, &group));
                    i += 4;
                }
            }
        }
    }
}

/// One weight row dot `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot<const N: usize>(format: QuantFormat, row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    match format {
        QuantFormat::Q4_0 => row32::<N, Q4_0>(row, a),
        QuantFormat::Q4_1 => row32::<N, Q4_1>(row, a),
        QuantFormat::Q5_0 => row32::<N, Q5_0>(row, a),
        QuantFormat::Q5_1 => row32::<N, Q5_1>(row, a),
        QuantFormat::Q8_0 => row32::<N, Q8_0>(row, a),
        QuantFormat::Q4K => row_q4k::<N, false>(row, a),
        QuantFormat::Q5K => row_q4k::<N, true>(row, a),
        QuantFormat::Q6K => row_q6k::<N>(row, a),
        QuantFormat::Mxfp4 => row32::<N, MXFP4>(row, a),
    }
}

/// The 32-value formats, as const generic tags.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q5_0: u8 = 3;
const Q5_1: u8 = 4;
const MXFP4: u8 = 5;

/// Sum of the eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The two f16 at `blk[at..at + 4]` as f32 (one conversion).
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_pair(blk: &[u8], at: usize) -> (f32, f32) {
    let bits = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v)))
}

/// The f16 at `blk[at..at + 2]` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_one(blk: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([blk[at], blk[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 32 bytes at `bytes[..32]`.
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` is 32 readable bytes (bounds-checked above); unaligned load.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast::<__m256i>()) }
}

/// The 32 quantized activations of block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
fn acts(a: &Q8Row<'_>, b: usize) -> __m256i {
    let q = &a.q[QK * b..QK * b + QK];
    // SAFETY: `q` is 32 readable bytes (bounds-checked above); unaligned load.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast::<__m256i>()) }
}

/// The 32 4-bit values of 16 nibble bytes (low nibbles first) as bytes.
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..16];
    // SAFETY: `bytes` is 16 readable bytes (bounds-checked above); unaligned load.
    let packed = unsafe { _mm_loadu_si128(bytes.as_ptr().cast::<__m128i>()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The 32 signed values of an MXFP4 block's 16 code bytes: each nibble
/// looked up in the code table by a byte shuffle (ggml's way).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mxfp4_bytes(bytes: &[u8]) -> __m256i {
    let table = &KVALUES_MXFP4;
    // SAFETY: the table is 16 readable bytes; unaligned load.
    let table = unsafe { _mm_loadu_si128(table.as_ptr().cast::<__m128i>()) };
    _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(bytes))
}

/// Eight E8M0 exponents (one per i32 lane) as the blocks' scales,
/// 2^(e - 128) lane by lane as [`e8m0_half`] builds it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn e8m0_half8(e: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
}

/// The fifth bits of a Q5 block's 32 values (the little-endian u32 at
/// `qh[..4]`) as 0x10 or 0 in each byte (ggml's `bytes_from_bits_32`).
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(qh: &[u8]) -> __m256i {
    let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    // byte j gets the bits' byte j / 8
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    // all bits but bit j mod 8 set: the byte is all ones where that bit is
    let others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    let set = _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Unsigned x signed byte products summed in eight i32 lanes, as f32.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(x, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// One block of a 32-value format into `acc` (per activation row) and the
/// rows' scalar terms (Q4_0's offset, Q4_1's minimum).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn block32<const N: usize, const KIND: u8>(
    blk: &[u8],
    b: usize,
    a: &[Q8Row<'_>; N],
    acc: &mut [__m256; N],
    extra: &mut [f32; N],
) {
    match KIND {
        Q4_0 => {
            let w = nibbles(&blk[2..18]);
            let (d, _) = f16_pair(blk, 0);
            for r in 0..N {
                let p = dot_u8_i8(w, acts(&a[r], b));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[b]), p, acc[r]);
                // weights are (q - 8): take 8 x (scaled activation sum) back off
                extra[r] -= 8.0 * d * a[r].s[b];
            }
        }
        Q5_0 => {
            let w = _mm256_or_si256(nibbles(&blk[6..22]), fifth_bits(&blk[2..6]));
            let (d, _) = f16_pair(blk, 0);
            for r in 0..N {
                let p = dot_u8_i8(w, acts(&a[r], b));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[b]), p, acc[r]);
                // weights are (q - 16)
                extra[r] -= 16.0 * d * a[r].s[b];
            }
        }
        Q5_1 => {
            let w = _mm256_or_si256(nibbles(&blk[8..24]), fifth_bits(&blk[4..8]));
            let (d, m) = f16_pair(blk, 0);
            for r in 0..N {
                let p = dot_u8_i8(w, acts(&a[r], b));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[b]), p, acc[r]);
                extra[r] += m * a[r].s[b];
            }
        }
        Q4_1 => {
            let w = nibbles(&blk[4..20]);
            let (d, m) = f16_pair(blk, 0);
            for r in 0..N {
                let p = dot_u8_i8(w, acts(&a[r], b));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[b]), p, acc[r]);
                extra[r] += m * a[r].s[b];
            }
        }
        MXFP4 => {
            let w = mxfp4_bytes(&blk[1..17]);
            let d = e8m0_half(blk[0]);
            let abs = _mm256_sign_epi8(w, w);
            for r in 0..N {
                // signed x signed: |w| x (a with w's sign)
                let p = dot_u8_i8(abs, _mm256_sign_epi8(acts(&a[r], b), w));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[b]), p, acc[r]);
            }
        }
        _ => {
            let w = load32(&blk[2..34]);
            let (d, _) = f16_pair(blk, 0);
            let abs = _mm256_sign_epi8(w, w);
            for r in 0..N {
                // signed x signed: |w| x (a with w's sign)
                let p = dot_u8_i8(abs, _mm256_sign_epi8(acts(&a[r], b), w));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[b]), p, acc[r]);
            }
        }
    }
}

/// One row of a 32-value format: blocks alternate between two accumulators
/// so that consecutive blocks do not wait on each other's multiply-add.
#[target_feature(enable = "avx2,fma,f16c")]
fn row32<const N: usize, const KIND: u8>(row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    let bytes = match KIND {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        MXFP4 => 17,
        _ => 34,
    };
    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    let mut extra = [0f32; N];
    let mut blocks = row.chunks_exact(bytes).enumerate();
    while let Some((b, blk)) = blocks.next() {
        block32::<N, KIND>(blk, b, a, &mut acc0, &mut extra);
        if let Some((b, blk)) = blocks.next() {
            block32::<N, KIND>(blk, b, a, &mut acc1, &mut extra);
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) + extra[r];
    }
    out
}

/// One row of Q4_K super-blocks: each 32 bytes of nibbles are two
/// sub-blocks (low then high nibbles), each scaled by its 6-bit scale.
/// `FIVE`: Q5_K, the same with each value's fifth bit from qh (bits 2i,
/// 2i + 1 of its byte for the nibbles' pair i) put above its nibble.
#[target_feature(enable = "avx2,fma,f16c")]
fn row_q4k<const N: usize, const FIVE: bool>(row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    let (bytes, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    let mut extra = [0f32; N];
    let (low, fifth) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    for (sb, blk) in row.chunks_exact(bytes).enumerate() {
        let (d, dmin) = f16_pair(blk, 0);
        let (mut sc, mut mins) = ([0f32; 8], [0f32; 8]);
        for j in 0..8 {
            let (s, m) = q4k_scale_min(&blk[4..16], j);
            sc[j] = d * f32::from(s);
            mins[j] = dmin * f32::from(m);
        }
        // Q5_K's fifth bits, shifted down two bits per pair: bits 0 and 1
        // of each byte are the current pair's (16-bit shifts move bits
        // across bytes only above them)
        let mut qh = if FIVE {
            load32(&blk[16..])
        } else {
            _mm256_set1_epi8(0)
        };
        for i in 0..4 {
            let q = load32(&blk[qs + 32 * i..]);
            let mut lo = _mm256_and_si256(q, low);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
            if FIVE {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), fifth));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), fifth));
                qh = _mm256_srli_epi16::<2>(qh);
            }
            let b = 8 * sb + 2 * i;
            for r in 0..N {
                let p = dot_u8_i8(lo, acts(&a[r], b));
                acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[2 * i] * a[r].d[b]), p, acc0[r]);
                let p = dot_u8_i8(hi, acts(&a[r], b + 1));
                let s = _mm256_set1_ps(sc[2 * i + 1] * a[r].d[b + 1]);
                acc1[r] = _mm256_fmadd_ps(s, p, acc1[r]);
            }
        }
        for r in 0..N {
            for (j, m) in mins.iter().enumerate() {
                extra[r] -= m * a[r].s[8 * sb + j];
            }
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) + extra[r];
    }
    out
}

/// The four groups of 32 6-bit values (0..=63) of one half of a Q6_K block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k_half(blk: &[u8], half: usize) -> [__m256i; 4] {
    let ql0 = load32(&blk[64 * half..]);
    let ql1 = load32(&blk[64 * half + 32..]);
    let qh = load32(&blk[128 + 32 * half..]);
    q6k_values(ql0, ql1, qh)
}

/// Four vectors of 6-bit values (0..=63) from two of low nibbles and one
/// of high bit pairs, as Q6_K stores them: value `k` of vector `t` is
/// nibble `t / 2` (low, then high) of byte `k` of `ql0` (`t` even) or
/// `ql1` (`t` odd), below bits `2t, 2t + 1` of byte `k` of `qh`. Each
/// high pair is shifted to bits 4-5 and masked there (the 16-bit shifts
/// carry bits across bytes only outside that mask). The row product
/// unpacks through this function; the interleaved products read another
/// layout (`packed_avx2::q6k_packed_values`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q6k_values(ql0: __m256i, ql1: __m256i, qh: __m256i) -> [__m256i; 4] {
    let (low, pair) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let value = |nibbles: __m256i, high: __m256i| {
        _mm256_or_si256(_mm256_and_si256(nibbles, low), _mm256_and_si256(high, pair))
    };
    [
        value(ql0, _mm256_slli_epi16::<4>(qh)),
        value(ql1, _mm256_slli_epi16::<2>(qh)),
        value(_mm256_srli_epi16::<4>(ql0), qh),
        value(_mm256_srli_epi16::<4>(ql1), _mm256_srli_epi16::<2>(qh)),
    ]
}

/// One row of Q6_K super-blocks: per block of 32, the two groups of 16 are
/// scaled in 16-bit lanes by their own scales, the offset of 32 comes off
/// through the activation sums per 16.
#[target_feature(enable = "avx2,fma,f16c")]
fn row_q6k<const N: usize>(row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    for (sb, blk) in row.chunks_exact(210).enumerate() {
        let d = f16_one(blk, 208);
        for half in 0..2 {
            let q = q6k_half(blk, half);
            for (t, q) in q.into_iter().enumerate() {
                let g = 8 * half + 2 * t;
                let (s0, s1) = (i16::from(blk[192 + g] as i8), i16::from(blk[193 + g] as i8));
                let scales = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                let b = 8 * sb + 4 * half + t;
                for r in 0..N {
                    let pairs = _mm256_maddubs_epi16(q, acts(&a[r], b));
                    // the offset of 32 comes off in lane 0, so the block's
                    // integer sum stays exact
                    let offset = 32
                        * (i32::from(s0) * i32::from(a[r].sum16[2 * b])
                            + i32::from(s1) * i32::from(a[r].sum16[2 * b + 1]));
                    let sums = _mm256_sub_epi32(
                        _mm256_madd_epi16(pairs, scales),
                        _mm256_zextsi128_si256(_mm_cvtsi32_si128(offset)),
                    );
                    let p = _mm256_cvtepi32_ps(sums);
                    let db = _mm256_set1_ps(d * a[r].d[b]);
                    if t % 2 == 0 {
                        acc0[r] = _mm256_fmadd_ps(db, p, acc0[r]);
                    } else {
                        acc1[r] = _mm256_fmadd_ps(db, p, acc1[r]);
                    }
                }
            }
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
    }
    out
}
