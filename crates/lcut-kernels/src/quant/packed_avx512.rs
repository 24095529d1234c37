//! The interleaved products with AVX-512 VNNI: one 256-bit register holds
//! four weights of each of eight rows (a chunk of a group block, unpacked
//! to bytes), `vpdpbusd` adds each row's four products with the activation
//! row's four values (one broadcast word) into its own i32 lane, and a
//! block's eight row sums are scaled by one conversion and one multiply-add.
//! Up to four activation rows share each unpacked chunk. (Why this is not
//! one body with `packed_avx2.rs`: see there.)

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _mm_loadl_epi64, _mm_loadu_si128, _mm256_add_epi32, _mm256_add_ps,
    _mm256_and_si256, _mm256_cvtepi8_epi32, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32,
    _mm256_cvtph_ps, _mm256_dpbusd_epi32, _mm256_fmadd_ps, _mm256_fnmadd_ps, _mm256_loadu_si256,
    _mm256_mask_add_epi8, _mm256_movm_epi8, _mm256_mul_ps, _mm256_mullo_epi32, _mm256_or_si256,
    _mm256_set_m128i, _mm256_set1_epi8, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_storeu_ps,
    _mm256_sub_epi32, _mm256_test_epi8_mask, _mm256_xor_si256,
};

use crate::isa::Isa;
use crate::quant::MAX_BATCH;
use crate::quant::acts::{Q8Row, Q8Super};
use crate::quant::avx2::e8m0_half8;
use crate::quant::format::{MXFP4_PLUS12, QuantFormat};
use crate::quant::packed::{
    GROUP_ROWS, Q5K_PAIR_AT, Q5K_PAIR_BYTES, act_word, group_block_bytes, word,
};
use crate::quant::packed_avx2::q6k_packed_values;
use crate::quant::prefetch;

/// One group (eight rows, all its group blocks) dot the activation rows
/// `a` into `sums[i][lane]`; false, doing nothing, where the CPU lacks
/// AVX-512 VNNI.
pub(super) fn group(
    format: QuantFormat,
    group: &[u8],
    a: &[Q8Row<'_>],
    sums: &mut [[f32; GROUP_ROWS]; MAX_BATCH],
) -> bool {
    if !Isa::Avx512.available() {
        return false;
    }
    // Q6_K keeps eight sums per activation row live: two rows at a time
    let most = if format == QuantFormat::Q6K { 2 } else { 4 };
    let mut i = 0;
    while i < a.len() {
        // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were just checked.
        let done = unsafe {
            match (a.len() - i).min(most) {
                1 => store::<1>(dot::<1>(format, group, &[a[i]]), &mut sums[i..]),
                2 | 3 => store::<2>(dot::<2>(format, group, &[a[i], a[i + 1]]), &mut sums[i..]),
                _ => {
                    let four = [a[i], a[i + 1], a[i + 2], a[i + 3]];
                    store::<4>(dot::<4>(format, group, &four), &mut sums[i..])
                }
            }
        };
        i += done;
    }
    true
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn store<const N: usize>(v: [__m256; N], sums: &mut [[f32; GROUP_ROWS]]) -> usize {
    for (v, s) in v.into_iter().zip(sums.iter_mut()) {
        // SAFETY: `s` is 8 writable f32; unaligned store.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) };
    }
    N
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot<const N: usize>(format: QuantFormat, group: &[u8], a: &[Q8Row<'_>; N]) -> [__m256; N] {
    match format {
        QuantFormat::Q4_0 => g32::<N, Q4_0>(group, a),
        QuantFormat::Q4_1 => g32::<N, Q4_1>(group, a),
        QuantFormat::Q5_0 => g32::<N, Q5_0>(group, a),
        QuantFormat::Q5_1 => g32::<N, Q5_1>(group, a),
        QuantFormat::Q8_0 => g32::<N, Q8_0>(group, a),
        QuantFormat::Q4K => g_q4k::<N, false>(group, a),
        QuantFormat::Q5K => g_q4k::<N, true>(group, a),
        QuantFormat::Q6K => g_q6k::<N>(group, a),
        QuantFormat::Mxfp4 => g32::<N, MXFP4>(group, a),
    }
}

/// The 32-value formats, as const generic tags.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q5_0: u8 = 3;
const Q5_1: u8 = 4;
const MXFP4: u8 = 5;

const fn format_of(kind: u8) -> QuantFormat {
    match kind {
        Q4_0 => QuantFormat::Q4_0,
        Q4_1 => QuantFormat::Q4_1,
        Q5_0 => QuantFormat::Q5_0,
        Q5_1 => QuantFormat::Q5_1,
        MXFP4 => QuantFormat::Mxfp4,
        _ => QuantFormat::Q8_0,
    }
}

/// 32 bytes at `bytes[..32]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load32(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` is 32 readable bytes (bounds-checked above); unaligned load.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast::<__m256i>()) }
}

/// The eight f16 at `bytes[..16]` as f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn f16x8(bytes: &[u8]) -> __m256 {
    let bytes = &bytes[..16];
    // SAFETY: `bytes` is 16 readable bytes (bounds-checked above); unaligned load.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(bytes.as_ptr().cast::<__m128i>()) })
}

/// The eight bytes at `bytes[..8]` as i32 lanes, zero- or sign-extended.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn bytes8(bytes: &[u8], signed: bool) -> __m256i {
    let bytes = &bytes[..8];
    // SAFETY: `bytes` is 8 readable bytes (bounds-checked above); unaligned load.
    let v = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast::<__m128i>()) };
    if signed {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// The eight chunks of a 32-value group block as bytes, chunk k holding
/// values (of every row) that pair with activation word k of the block;
/// Q8_0's signed bytes offset by 128 (unsigned).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn weights32<const KIND: u8>(blk: &[u8]) -> [__m256i; 8] {
    let zero = _mm256_setzero_si256();
    let mut w = [zero; 8];
    match KIND {
        Q8_0 => {
            for (k, w) in w.iter_mut().enumerate() {
                *w = _mm256_xor_si256(load32(&blk[16 + 32 * k..]), _mm256_set1_epi8(-128));
            }
        }
        _ => {
            let qs = match KIND {
                Q4_0 => 16,
                Q4_1 => 32,
                Q5_0 => 48,
                MXFP4 => 8,
                _ => 64,
            };
            let low = _mm256_set1_epi8(0x0F);
            for c in 0..4 {
                let v = load32(&blk[qs + 32 * c..]);
                w[c] = _mm256_and_si256(v, low);
                w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
            }
            if KIND == MXFP4 {
                // code value + 12 (unsigned); 12 x the activation sum comes off
                let table = &MXFP4_PLUS12;
                // SAFETY: the table is 16 readable bytes; unaligned load.
                let table = unsafe { _mm_loadu_si128(table.as_ptr().cast::<__m128i>()) };
                let table = _mm256_set_m128i(table, table);
                for x in &mut w {
                    *x = _mm256_shuffle_epi8(table, *x);
                }
            }
            if KIND == Q5_0 || KIND == Q5_1 {
                let bits = if KIND == Q5_0 { 16 } else { 32 };
                let fifth = _mm256_set1_epi8(0x10);
                for c in 0..4 {
                    let lo = _mm256_movm_epi8(word(blk, bits + 8 * c));
                    let hi = _mm256_movm_epi8(word(blk, bits + 8 * c + 4));
                    w[c] = _mm256_or_si256(w[c], _mm256_and_si256(lo, fifth));
                    w[c + 4] = _mm256_or_si256(w[c + 4], _mm256_and_si256(hi, fifth));
                }
            }
        }
    }
    w
}

/// Eight rows of a 32-value format: per block, each activation row's eight
/// words against the eight chunks, one i32 sum per row, scaled by the
/// rows' scales times the activation block's; the offset (Q4_0, Q5_0) or
/// minimum (Q4_1, Q5_1) times the block's scaled activation sum apart.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn g32<const N: usize, const KIND: u8>(group: &[u8], a: &[Q8Row<'_>; N]) -> [__m256; N] {
    let gb = group_block_bytes(format_of(KIND));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut extra = [_mm256_setzero_ps(); N];
    let distance = prefetch::distance();
    for (b, blk) in group.chunks_exact(gb).enumerate() {
        prefetch::ahead(blk, distance);
        let d = if KIND == MXFP4 {
            e8m0_half8(bytes8(blk, false))
        } else {
            f16x8(blk)
        };
        let w = weights32::<KIND>(blk);
        let coef = match KIND {
            Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
            Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
            Q4_1 | Q5_1 => f16x8(&blk[16..]),
            _ => _mm256_setzero_ps(),
        };
        for r in 0..N {
            let mut isum = _mm256_setzero_si256();
            for (k, w) in w.iter().enumerate() {
                let x = _mm256_set1_epi32(act_word(&a[r], 8 * b + k));
                isum = _mm256_dpbusd_epi32(isum, *w, x);
            }
            if KIND == Q8_0 {
                // (q + 128) x summed: take 128 x (the block's activation sum) back
                let s = i32::from(a[r].sum16[2 * b]) + i32::from(a[r].sum16[2 * b + 1]);
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * s));
            }
            if KIND == MXFP4 {
                // (v + 12) x summed: take 12 x (the block's activation sum) back
                let s = i32::from(a[r].sum16[2 * b]) + i32::from(a[r].sum16[2 * b + 1]);
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(12 * s));
            }
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[r].d[b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[r]);
            if KIND != Q8_0 && KIND != MXFP4 {
                extra[r] = _mm256_fmadd_ps(coef, _mm256_set1_ps(a[r].s[b]), extra[r]);
            }
        }
    }
    let mut out = [_mm256_setzero_ps(); N];
    for r in 0..N {
        out[r] = _mm256_add_ps(acc[r], extra[r]);
    }
    out
}

/// Eight rows of Q4_K: each pair of sub-blocks (2i, 2i+1) is eight chunks
/// whose low and high nibbles are the two sub-blocks; each sub-block's row
/// sums are scaled by super-scale x 6-bit scale x the activation block's
/// scale, and super-minimum x 6-bit minimum x the block's scaled sum comes
/// off. `FIVE`: Q5_K, the same with each chunk's fifth bits put above its
/// nibbles (bit m and 4 + m of the pair's fifth-bit vector for its chunk
/// 4h + m).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn g_q4k<const N: usize, const FIVE: bool>(group: &[u8], a: &[Q8Row<'_>; N]) -> [__m256; N] {
    let gb = group_block_bytes(if FIVE {
        QuantFormat::Q5K
    } else {
        QuantFormat::Q4K
    });
    let (low, fifth) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut extra = [_mm256_setzero_ps(); N];
    let distance = prefetch::distance();
    for (sb, blk) in group.chunks_exact(gb).enumerate() {
        prefetch::ahead(blk, distance);
        let a: [Q8Super<'_>; N] = std::array::from_fn(|r| a[r].super_block(sb));
        let (d, dmin) = (f16x8(blk), f16x8(&blk[16..]));
        for i in 0..4 {
            let (j0, j1) = (2 * i, 2 * i + 1);
            let mut s0 = [_mm256_setzero_si256(); N];
            let mut s1 = [_mm256_setzero_si256(); N];
            let (chunks, high) = if FIVE {
                let at = Q5K_PAIR_AT + Q5K_PAIR_BYTES * i;
                (at + 64, [load32(&blk[at..]), load32(&blk[at + 32..])])
            } else {
                (160 + 256 * i, [_mm256_setzero_si256(); 2])
            };
            for k in 0..8 {
                let v = load32(&blk[chunks + 32 * k..]);
                let mut lo = _mm256_and_si256(v, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                if FIVE {
                    let (h, m) = (high[k / 4], k % 4);
                    let bit = |b: usize| _mm256_set1_epi8((1u8 << b) as i8);
                    lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(h, bit(m)), lo, fifth);
                    hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(h, bit(4 + m)), hi, fifth);
                }
                for r in 0..N {
                    let x0 = _mm256_set1_epi32(a[r].word(8 * j0 + k));
                    let x1 = _mm256_set1_epi32(a[r].word(8 * j1 + k));
                    s0[r] = _mm256_dpbusd_epi32(s0[r], lo, x0);
                    s1[r] = _mm256_dpbusd_epi32(s1[r], hi, x1);
                }
            }
            let sc0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(bytes8(&blk[32 + 8 * j0..], false)));
            let sc1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(bytes8(&blk[32 + 8 * j1..], false)));
            let m0 = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(bytes8(&blk[96 + 8 * j0..], false)));
            let m1 = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(bytes8(&blk[96 + 8 * j1..], false)));
            for r in 0..N {
                let x0 = _mm256_mul_ps(sc0, _mm256_set1_ps(a[r].d[j0]));
                let x1 = _mm256_mul_ps(sc1, _mm256_set1_ps(a[r].d[j1]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[r]), x0, acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[r]), x1, acc[r]);
                extra[r] = _mm256_fnmadd_ps(m0, _mm256_set1_ps(a[r].s[j0]), extra[r]);
                extra[r] = _mm256_fnmadd_ps(m1, _mm256_set1_ps(a[r].s[j1]), extra[r]);
            }
        }
    }
    let mut out = [_mm256_setzero_ps(); N];
    for r in 0..N {
        out[r] = _mm256_add_ps(acc[r], extra[r]);
    }
    out
}

/// Eight rows of Q6_K: for each half of 128 values and each half of a
/// block's 32 (a group of 16 per block), four steps of three chunks make
/// the four blocks' 6-bit values; each group's row sums less 32 x the
/// activations' sum over those 16 values (exact, in integers) are
/// multiplied by the group's 8-bit scales, and scaled by the super-scale
/// times the activation block's scale.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn g_q6k<const N: usize>(group: &[u8], a: &[Q8Row<'_>; N]) -> [__m256; N] {
    let gb = group_block_bytes(QuantFormat::Q6K);
    let mut acc = [_mm256_setzero_ps(); N];
    let distance = prefetch::distance();
    for (sb, blk) in group.chunks_exact(gb).enumerate() {
        prefetch::ahead(blk, distance);
        let a: [Q8Super<'_>; N] = std::array::from_fn(|r| a[r].super_block(sb));
        let d = f16x8(blk);
        for h in 0..2 {
            let mut block = [[_mm256_setzero_si256(); N]; 4];
            for half in 0..2 {
                let mut isum = [[_mm256_setzero_si256(); N]; 4];
                for c in 4 * half..4 * half + 4 {
                    let at = 144 + 96 * (8 * h + c);
                    let q = q6k_packed_values(
                        load32(&blk[at..]),
                        load32(&blk[at + 32..]),
                        load32(&blk[at + 64..]),
                    );
                    for (t, q) in q.iter().enumerate() {
                        let b = 4 * h + t;
                        for r in 0..N {
                            let x = _mm256_set1_epi32(a[r].word(8 * b + c));
                            isum[t][r] = _mm256_dpbusd_epi32(isum[t][r], *q, x);
                        }
                    }
                }
                for t in 0..4 {
                    let (b, g) = (4 * h + t, 8 * h + 2 * t + half);
                    let sc = bytes8(&blk[16 + 8 * g..], true);
                    for r in 0..N {
                        let offset = 32 * i32::from(a[r].sum16[2 * b + half]);
                        let v = _mm256_sub_epi32(isum[t][r], _mm256_set1_epi32(offset));
                        block[t][r] = _mm256_add_epi32(block[t][r], _mm256_mullo_epi32(v, sc));
                    }
                }
            }
            for (t, block) in block.iter().enumerate() {
                let b = 4 * h + t;
                for r in 0..N {
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[r].d[b]));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block[r]), scale, acc[r]);
                }
            }
        }
    }
    acc
}
