//! The quantized dot products with AVX-512 VNNI: two blocks of 32 values
//! per 512-bit register, multiplied with the 8-bit activations by `dpbusd`
//! (unsigned x signed bytes summed four at a time into i32 lanes), the
//! per-block scales of up to sixteen blocks converted at once (one gather
//! of their f16 scales) and broadcast to their lanes by a permute. (Why
//! this is not one body with `avx2.rs`: see there.)

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256i, __m512, __m512i, __mmask16, _mm_loadu_si128, _mm256_and_si256, _mm256_loadu_ps,
    _mm256_loadu_si256, _mm256_loadu2_m128i, _mm256_mask_add_epi8, _mm256_movm_epi8, _mm256_mul_ps,
    _mm256_or_si256, _mm256_set_m128i, _mm256_set1_epi8, _mm256_set1_ps, _mm256_shuffle_epi8,
    _mm256_srli_epi16, _mm256_test_epi8_mask, _mm512_abs_epi8, _mm512_add_epi32, _mm512_and_si512,
    _mm512_broadcast_i32x4, _mm512_castsi256_si512, _mm512_castsi512_ps, _mm512_castsi512_si256,
    _mm512_cmplt_epu32_mask, _mm512_cvtepi8_epi32, _mm512_cvtepi32_epi16, _mm512_cvtepi32_ps,
    _mm512_cvtph_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_fnmadd_ps, _mm512_inserti64x4,
    _mm512_loadu_si512, _mm512_mask_blend_epi32, _mm512_mask_i32gather_epi32, _mm512_mask_sub_epi8,
    _mm512_maskz_loadu_ps, _mm512_movepi8_mask, _mm512_movm_epi8, _mm512_mul_ps, _mm512_or_si512,
    _mm512_permutexvar_ps, _mm512_reduce_add_ps, _mm512_set1_epi8, _mm512_set1_epi32,
    _mm512_set1_ps, _mm512_setr_epi32, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_shuffle_epi8, _mm512_shuffle_i64x2, _mm512_slli_epi32, _mm512_sllv_epi32,
    _mm512_srli_epi32, _mm512_sub_epi32, _mm512_zextps256_ps512, _mm512_zextsi256_si512,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::avx2::q6k_half;
use crate::quant::format::{KVALUES_MXFP4, QK, QuantFormat, q4k_scale_min};

/// Rows of `w` (`row_bytes` each) dot the activation rows `a` into `out`
/// ([row][activation]); false, doing nothing, where the CPU lacks AVX-512
/// VNNI.
pub(super) fn rows(
    format: QuantFormat,
    w: &[u8],
    row_bytes: usize,
    a: &[Q8Row<'_>],
    out: &mut [f32],
) -> bool {
    if !Isa::Avx512.available() {
        return false;
    }
    // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were just checked,
    // all `rows_avx512` needs.
    unsafe { rows_avx512(format, w, row_bytes, a, out) };
    true
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn rows_avx512(format: QuantFormat, w: &[u8], row_bytes: usize, a: &[Q8Row<'_>], out: &mut [f32]) {
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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

/// Bytes per block of a 32-value format tag.
const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        MXFP4 => 17,
        _ => 34,
    }
}

/// Where a 32-value format's nibbles start in its block.
const fn nibble_offset(kind: u8) -> usize {
    match kind {
        Q4_0 => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        MXFP4 => 1,
        _ => 8,
    }
}

/// The fifth bits of a Q5 block (the little-endian u32 at its offset 2 or 4).
fn fifth_bits_of(kind: u8, blk: &[u8]) -> u32 {
    let at = if kind == Q5_0 { 2 } else { 4 };
    u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
}

/// 64 bytes at `bytes[..64]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load64(bytes: &[i8]) -> __m512i {
    let bytes = &bytes[..64];
    // SAFETY: `bytes` is 64 readable bytes (bounds-checked above); unaligned load.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast::<__m512i>()) }
}

/// 32 bytes at `bytes[..32]`, zero-extended to 512 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load32_zext<T>(bytes: &[T]) -> __m512i {
    let bytes = &bytes[..32 / size_of::<T>()];
    // SAFETY: `bytes` is 32 readable bytes (bounds-checked above); unaligned load.
    let v = unsafe { _mm256_loadu_si256(bytes.as_ptr().cast::<__m256i>()) };
    _mm512_zextsi256_si512(v)
}

/// `count` (at most 16) f32 from `xs`, zeros in the other lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load_f32(xs: &[f32], count: usize) -> __m512 {
    let xs = &xs[..count.min(16)];
    let mask = lanes(xs.len());
    // SAFETY: only the lanes under `mask` are read: the `xs.len()` first
    // elements, all inside `xs`.
    unsafe { _mm512_maskz_loadu_ps(mask, xs.as_ptr()) }
}

/// The mask of the first `count` (at most 16) lanes.
fn lanes(count: usize) -> __mmask16 {
    ((1u32 << count.min(16)) - 1) as __mmask16
}

/// The first four bytes of each of `count` blocks of `bytes` bytes
/// (scales) as i32 lanes, zeros in the others.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn gather_heads(group: &[u8], bytes: usize, count: usize) -> __m512i {
    let count = count.min(16).min(group.len() / bytes);
    let offsets = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let offsets = std::arch::x86_64::_mm512_mullo_epi32(offsets, _mm512_set1_epi32(bytes as i32));
    // SAFETY: lane i < count reads 4 bytes at i * bytes; i * bytes + 4 <=
    // count * bytes <= group.len() since every block has at least 4 bytes.
    // Lanes outside the mask read nothing. Gathers allow unaligned addresses.
    unsafe {
        _mm512_mask_i32gather_epi32::<1>(
            _mm512_setzero_si512(),
            lanes(count),
            offsets,
            group.as_ptr().cast::<i32>(),
        )
    }
}

/// MXFP4's code table in each 128-bit lane (for a byte shuffle).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn mxfp4_table() -> __m512i {
    let table = &KVALUES_MXFP4;
    // SAFETY: the table is 16 readable bytes; unaligned load.
    let table = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
    _mm512_broadcast_i32x4(table)
}

/// Sixteen E8M0 exponents (one per i32 lane) as the blocks' scales,
/// 2^(e - 128) lane by lane as [`crate::quant::format::e8m0_half`] builds it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn e8m0_half16(e: __m512i) -> __m512 {
    let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal))
}

/// Two consecutive blocks' 64 weights as bytes, in activation order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair<const KIND: u8>(two: &[u8]) -> __m512i {
    let bytes = block_bytes(KIND);
    match KIND {
        Q8_0 => {
            let lo = load32_zext(&two[2..34]);
            let hi = &two[bytes + 2..bytes + 34];
            // SAFETY: `hi` is 32 readable bytes (bounds-checked above).
            let hi = unsafe { _mm256_loadu_si256(hi.as_ptr().cast::<__m256i>()) };
            _mm512_inserti64x4::<1>(lo, hi)
        }
        _ => {
            let off = nibble_offset(KIND);
            let (lo, hi) = (&two[off..off + 16], &two[bytes + off..bytes + off + 16]);
            // SAFETY: `lo` and `hi` are 16 readable bytes each (bounds-checked above).
            let x = unsafe { _mm256_loadu2_m128i(hi.as_ptr().cast(), lo.as_ptr().cast()) };
            // [lo, hi, lo >> 4, hi >> 4] -> [lo low, lo high, hi low, hi high] nibbles
            let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi16::<4>(x));
            let z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
            let z = _mm512_shuffle_i64x2::<0xD8>(z, z);
            if KIND == Q5_0 || KIND == Q5_1 {
                let bits = u64::from(fifth_bits_of(KIND, two))
                    | (u64::from(fifth_bits_of(KIND, &two[bytes..])) << 32);
                let high = _mm512_and_si512(_mm512_movm_epi8(bits), _mm512_set1_epi8(0x10));
                return _mm512_or_si512(z, high);
            }
            if KIND == MXFP4 {
                return _mm512_shuffle_epi8(mxfp4_table(), z);
            }
            z
        }
    }
}

/// One block's 32 weights as bytes, zeros above.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn single<const KIND: u8>(blk: &[u8]) -> __m512i {
    match KIND {
        Q8_0 => load32_zext(&blk[2..34]),
        _ => {
            let off = nibble_offset(KIND);
            let bytes = &blk[off..off + 16];
            // SAFETY: `bytes` is 16 readable bytes (bounds-checked above).
            let packed = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
            let both = _mm256_set_m128i(std::arch::x86_64::_mm_srli_epi16::<4>(packed), packed);
            let mut w = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
            if KIND == Q5_0 || KIND == Q5_1 {
                let high = _mm256_movm_epi8(fifth_bits_of(KIND, blk));
                w = _mm256_or_si256(w, _mm256_and_si256(high, _mm256_set1_epi8(0x10)));
            }
            if KIND == MXFP4 {
                w = _mm256_shuffle_epi8(_mm512_castsi512_si256(mxfp4_table()), w);
            }
            _mm512_zextsi256_si512(w)
        }
    }
}

/// Weights (bytes) times activations summed in i32 lanes of four.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn prod<const KIND: u8>(w: __m512i, a: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    match KIND {
        // signed x signed: |w| x (a with w's sign)
        Q8_0 | MXFP4 => {
            let signed = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), zero, a);
            _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w), signed)
        }
        _ => _mm512_dpbusd_epi32(zero, w, a),
    }
}

/// One row of a 32-value format, sixteen blocks at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn row32<const N: usize, const KIND: u8>(row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    let bytes = block_bytes(KIND);
    let blocks = row.len() / bytes;
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
    let mut extra = [_mm512_setzero_ps(); N];
    let mut g = 0;
    while g < blocks {
        let count = (blocks - g).min(16);
        let group = &row[g * bytes..(g + count) * bytes];
        let heads = gather_heads(group, bytes, count);
        let d = if KIND == MXFP4 {
            e8m0_half16(_mm512_and_si512(heads, _mm512_set1_epi32(0xFF)))
        } else {
            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(heads))
        };
        let mut scale = [_mm512_setzero_ps(); N];
        for r in 0..N {
            scale[r] = _mm512_mul_ps(d, load_f32(&a[r].d[g..], count));
            let s = load_f32(&a[r].s[g..], count);
            match KIND {
                // weights are (q - 8): take 8 x (scaled activation sum) back off
                Q4_0 => {
                    extra[r] = _mm512_fnmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(8.0)), s, extra[r])
                }
                // weights are (q - 16)
                Q5_0 => {
                    let sixteen = _mm512_mul_ps(d, _mm512_set1_ps(16.0));
                    extra[r] = _mm512_fnmadd_ps(sixteen, s, extra[r])
                }
                Q4_1 | Q5_1 => {
                    let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(heads)));
                    extra[r] = _mm512_fmadd_ps(m, s, extra[r]);
                }
                _ => {}
            }
        }
        // two accumulators, each block pair's multiply-add on a fixed one
        let mut i = 0;
        while i + 4 <= count {
            pair_step::<N, KIND>(group, g, i, a, &scale, &mut acc0);
            pair_step::<N, KIND>(group, g, i + 2, a, &scale, &mut acc1);
            i += 4;
        }
        if i + 2 <= count {
            pair_step::<N, KIND>(group, g, i, a, &scale, &mut acc0);
            i += 2;
        }
        if i < count {
            let w = single::<KIND>(&group[i * bytes..(i + 1) * bytes]);
            let idx = _mm512_set1_epi32(i as i32);
            for r in 0..N {
                let p = prod::<KIND>(w, load32_zext(&a[r].q[QK * (g + i)..]));
                let s = _mm512_permutexvar_ps(idx, scale[r]);
                acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc1[r]);
            }
        }
        g += count;
    }
    let mut out = [0f32; N];
    for r in 0..N {
        let acc = std::arch::x86_64::_mm512_add_ps(acc0[r], acc1[r]);
        out[r] = _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(extra[r]);
    }
    out
}

/// Blocks `i`, `i + 1` of a group starting at block `g` into `acc`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn pair_step<const N: usize, const KIND: u8>(
    group: &[u8],
    g: usize,
    i: usize,
    a: &[Q8Row<'_>; N],
    scale: &[__m512; N],
    acc: &mut [__m512; N],
) {
    let bytes = block_bytes(KIND);
    let pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let w = pair::<KIND>(&group[i * bytes..(i + 2) * bytes]);
    let idx = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(i as i32));
    for r in 0..N {
        let p = prod::<KIND>(w, load64(&a[r].q[QK * (g + i)..]));
        let s = _mm512_permutexvar_ps(idx, scale[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
    }
}

/// One row of Q4_K super-blocks: each 32 bytes of nibbles are two
/// sub-blocks (low, high nibbles), which are two consecutive activation
/// blocks: one 512-bit product per 32 bytes. `FIVE`: Q5_K, the same with
/// each value's fifth bit from qh put above its nibble.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn row_q4k<const N: usize, const FIVE: bool>(row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    let bytes = if FIVE { 176 } else { 144 };
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
    let mut extra = [_mm256_set1_ps(0.0); N];
    for (sb, blk) in row.chunks_exact(bytes).enumerate() {
        let (d, dmin) = (
            crate::quant::format::f16_at(blk, 0),
            crate::quant::format::f16_at(blk, 2),
        );
        let (mut sc, mut mins) = ([0f32; 8], [0f32; 8]);
        for j in 0..8 {
            let (s, m) = q4k_scale_min(&blk[4..16], j);
            sc[j] = d * f32::from(s);
            mins[j] = dmin * f32::from(m);
        }
        // SAFETY: `sc` and `mins` are 8 f32 each; unaligned loads.
        let (sc, mins) = unsafe { (_mm256_loadu_ps(sc.as_ptr()), _mm256_loadu_ps(mins.as_ptr())) };
        let mut scale = [_mm512_setzero_ps(); N];
        for r in 0..N {
            let first = 8 * sb;
            let da = &a[r].d[first..first + 8];
            let s = &a[r].s[first..first + 8];
            // SAFETY: `da` and `s` are 8 f32 each (bounds-checked above).
            let (da, s) = unsafe { (_mm256_loadu_ps(da.as_ptr()), _mm256_loadu_ps(s.as_ptr())) };
            scale[r] = _mm512_zextps256_ps512(_mm256_mul_ps(sc, da));
            extra[r] = std::arch::x86_64::_mm256_fnmadd_ps(mins, s, extra[r]);
        }
        for i in [0, 2] {
            q4k_step::<N, FIVE>(blk, sb, i, a, &scale, &mut acc0);
            q4k_step::<N, FIVE>(blk, sb, i + 1, a, &scale, &mut acc1);
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        let acc = std::arch::x86_64::_mm512_add_ps(acc0[r], acc1[r]);
        out[r] = _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(_mm512_zextps256_ps512(extra[r]));
    }
    out
}

/// Bytes 32i..32i+32 of a Q4_K block's nibbles (sub-blocks 2i, 2i+1) into
/// `acc`; `FIVE`: of a Q5_K block, bits 2i and 2i + 1 of qh above them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn q4k_step<const N: usize, const FIVE: bool>(
    blk: &[u8],
    sb: usize,
    i: usize,
    a: &[Q8Row<'_>; N],
    scale: &[__m512; N],
    acc: &mut [__m512; N],
) {
    let pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let low = _mm256_set1_epi8(0x0F);
    let qs = if FIVE { 48 } else { 16 };
    let q = &blk[qs + 32 * i..qs + 32 + 32 * i];
    // SAFETY: `q` is 32 readable bytes (bounds-checked above).
    let q = unsafe { _mm256_loadu_si256(q.as_ptr().cast::<__m256i>()) };
    let mut lo = _mm256_and_si256(q, low);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
    if FIVE {
        let qh = &blk[16..48];
        // SAFETY: `qh` is 32 readable bytes (bounds-checked above).
        let qh = unsafe { _mm256_loadu_si256(qh.as_ptr().cast::<__m256i>()) };
        // 16 added where bit 2i (2i + 1) of the value's qh byte is set
        let sixteen = _mm256_set1_epi8(0x10);
        let bit = |k: usize| _mm256_set1_epi8((1u8 << k) as i8);
        let (b0, b1) = (bit(2 * i), bit(2 * i + 1));
        lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(qh, b0), lo, sixteen);
        hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(qh, b1), hi, sixteen);
    }
    let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    let idx = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(2 * i as i32));
    for r in 0..N {
        let av = load64(&a[r].q[QK * (8 * sb + 2 * i)..]);
        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, av);
        let s = _mm512_permutexvar_ps(idx, scale[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
    }
}

/// One row of Q6_K super-blocks: two activation blocks per product, each
/// group of 16 values (four i32 lanes) scaled by its own 8-bit scale; the
/// offset of 32 comes off exactly in the integer lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn row_q6k<const N: usize>(row: &[u8], a: &[Q8Row<'_>; N]) -> [f32; N] {
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
    for (sb, blk) in row.chunks_exact(210).enumerate() {
        let d = crate::quant::format::f16_at(blk, 208);
        let scales = &blk[192..208];
        // SAFETY: `scales` is 16 readable bytes (bounds-checked above).
        let scales = unsafe { _mm_loadu_si128(scales.as_ptr().cast()) };
        let scales = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales)),
            _mm512_set1_ps(d),
        );
        let mut da = [_mm512_setzero_ps(); N];
        for r in 0..N {
            da[r] = _mm512_zextps256_ps512(load8(&a[r].d[8 * sb..]));
        }
        for half in 0..2 {
            let q = q6k_half(blk, half);
            q6k_step::<N>(q[0], q[1], 4 * half, sb, &scales, &da, a, &mut acc0);
            q6k_step::<N>(q[2], q[3], 4 * half + 2, sb, &scales, &da, a, &mut acc1);
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = _mm512_reduce_add_ps(std::arch::x86_64::_mm512_add_ps(acc0[r], acc1[r]));
    }
    out
}

/// Activation blocks `local`, `local + 1` of super-block `sb` (their
/// 6-bit values `q0`, `q1`) into `acc`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
fn q6k_step<const N: usize>(
    q0: __m256i,
    q1: __m256i,
    local: usize,
    sb: usize,
    scales: &__m512,
    da: &[__m512; N],
    a: &[Q8Row<'_>; N],
    acc: &mut [__m512; N],
) {
    let group_lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let zero = _mm512_setzero_si512();
    let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
    let gidx = _mm512_add_epi32(group_lanes, _mm512_set1_epi32(2 * local as i32));
    let gscale = _mm512_permutexvar_ps(gidx, *scales);
    let bidx = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(local as i32));
    for r in 0..N {
        let av = load64(&a[r].q[QK * (8 * sb + local)..]);
        // (q - 32) a, exactly, in the integer lanes
        let p = _mm512_sub_epi32(
            _mm512_dpbusd_epi32(zero, w, av),
            _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(32), av),
        );
        let s = _mm512_mul_ps(gscale, _mm512_permutexvar_ps(bidx, da[r]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
    }
}

/// Quantize one block of 32 activations to `q` as the portable path does
/// (scale amax / 127, round half away from zero): (scale, sum of the first
/// 16, sum of the last 16); `None` where the CPU lacks AVX-512.
pub(super) fn quantize_block(xs: &[f32], q: &mut [i8]) -> Option<(f32, i32, i32)> {
    if !Isa::Avx512.available() || xs.len() < QK || q.len() < QK {
        return None;
    }
    // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were just checked.
    Some(unsafe { quantize_block_avx512(xs, q) })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn quantize_block_avx512(xs: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    use std::arch::x86_64::{
        _CMP_EQ_OQ, _CMP_LT_OQ, _mm_storeu_si128, _mm512_abs_ps, _mm512_cmp_ps_mask,
        _mm512_cvtepi32_epi8, _mm512_cvtps_epi32, _mm512_mask_blend_ps, _mm512_max_ps,
        _mm512_min_ps, _mm512_reduce_add_epi32, _mm512_reduce_max_ps, _mm512_roundscale_ps,
        _mm512_set1_ps, _mm512_sub_ps,
    };
    let (a, b) = (load_f32_16(xs, 0), load_f32_16(xs, 16));
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let invv = _mm512_set1_ps(inv);
    let one = _mm512_set1_ps(1.0);
    let half = _mm512_set1_ps(0.5);
    let round = |v: __m512| -> __m512 {
        let t = _mm512_mul_ps(v, invv);
        // f32::round: to nearest, ties away from zero
        let trunc = _mm512_roundscale_ps::<0x0B>(t);
        let even = _mm512_roundscale_ps::<0x08>(t);
        let tie = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(_mm512_sub_ps(t, trunc)), half);
        let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(t, _mm512_setzero_ps());
        let step = _mm512_mask_blend_ps(negative, one, _mm512_set1_ps(-1.0));
        let away = std::arch::x86_64::_mm512_add_ps(trunc, step);
        let r = _mm512_mask_blend_ps(tie, even, away);
        _mm512_max_ps(
            _mm512_min_ps(r, _mm512_set1_ps(127.0)),
            _mm512_set1_ps(-127.0),
        )
    };
    let (ia, ib) = (_mm512_cvtps_epi32(round(a)), _mm512_cvtps_epi32(round(b)));
    let q = &mut q[..QK];
    // SAFETY: `q` is 32 writable bytes (bounds-checked above); unaligned stores.
    unsafe {
        _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(ia));
        _mm_storeu_si128(q[16..].as_mut_ptr().cast(), _mm512_cvtepi32_epi8(ib));
    }
    (d, _mm512_reduce_add_epi32(ia), _mm512_reduce_add_epi32(ib))
}

/// Sixteen f32 at `xs[at..at + 16]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load_f32_16(xs: &[f32], at: usize) -> __m512 {
    let xs = &xs[at..at + 16];
    // SAFETY: `xs` is 16 readable f32 (bounds-checked above); unaligned load.
    unsafe { std::arch::x86_64::_mm512_loadu_ps(xs.as_ptr()) }
}

/// Eight f32 at `xs[..8]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load8(xs: &[f32]) -> std::arch::x86_64::__m256 {
    let xs = &xs[..8];
    // SAFETY: `xs` is 8 readable f32 (bounds-checked above); unaligned load.
    unsafe { _mm256_loadu_ps(xs.as_ptr()) }
}
