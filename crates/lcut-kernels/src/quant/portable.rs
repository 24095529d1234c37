//! The quantized dot products in plain Rust: the reference every SIMD path
//! is held to. Integer sums inside a block are exact; blocks are combined
//! in f32, one after the other.

use crate::quant::acts::Q8Row;
use crate::quant::format::{
    QK, QuantFormat, e8m0_half, f16_at, mxfp4_values, nibbles32, q4k_scale_min, q5k_values,
    q6k_values, values5,
};

/// Sum of products of unsigned and signed bytes.
#[inline(always)]
fn isum_u8(w: &[u8], a: &[i8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// Sum of products of signed bytes.
#[inline(always)]
fn isum_i8(w: &[u8], a: &[i8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&x, &y)| i32::from(x as i8) * i32::from(y))
        .sum()
}

/// One weight row (whole blocks of `format`) dot one activation row.
pub(crate) fn dot_row(format: QuantFormat, row: &[u8], a: &Q8Row<'_>) -> f32 {
    let blocks = row.chunks_exact(format.block_bytes());
    match format {
        QuantFormat::Q4_0 => blocks
            .enumerate()
            .map(|(b, blk)| {
                let p = isum_u8(&nibbles32(&blk[2..18]), &a.q[QK * b..QK * b + QK]);
                // (q - 8) a summed: q a summed - 8 (a summed)
                f16_at(blk, 0) * (a.d[b] * p as f32 - 8.0 * a.s[b])
            })
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q4_1 => blocks
            .enumerate()
            .map(|(b, blk)| {
                let p = isum_u8(&nibbles32(&blk[4..20]), &a.q[QK * b..QK * b + QK]);
                f16_at(blk, 0) * a.d[b] * p as f32 + f16_at(blk, 2) * a.s[b]
            })
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q5_0 => blocks
            .enumerate()
            .map(|(b, blk)| {
                let p = isum_u8(&values5(&blk[2..6], &blk[6..22]), &a.q[QK * b..QK * b + QK]);
                // (q - 16) a summed: q a summed - 16 (a summed)
                f16_at(blk, 0) * (a.d[b] * p as f32 - 16.0 * a.s[b])
            })
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q5_1 => blocks
            .enumerate()
            .map(|(b, blk)| {
                let p = isum_u8(&values5(&blk[4..8], &blk[8..24]), &a.q[QK * b..QK * b + QK]);
                f16_at(blk, 0) * a.d[b] * p as f32 + f16_at(blk, 2) * a.s[b]
            })
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q8_0 => blocks
            .enumerate()
            .map(|(b, blk)| {
                let p = isum_i8(&blk[2..34], &a.q[QK * b..QK * b + QK]);
                f16_at(blk, 0) * a.d[b] * p as f32
            })
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Mxfp4 => blocks
            .enumerate()
            .map(|(b, blk)| {
                let w = mxfp4_values(&blk[1..17]);
                let p: i32 = w
                    .iter()
                    .zip(&a.q[QK * b..QK * b + QK])
                    .map(|(&x, &y)| i32::from(x) * i32::from(y))
                    .sum();
                e8m0_half(blk[0]) * a.d[b] * p as f32
            })
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q4K => blocks
            .enumerate()
            .map(|(sb, blk)| dot_q4k(blk, a, 8 * sb, false))
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q5K => blocks
            .enumerate()
            .map(|(sb, blk)| dot_q4k(blk, a, 8 * sb, true))
            .fold(0.0, |acc, v| acc + v),
        QuantFormat::Q6K => blocks
            .enumerate()
            .map(|(sb, blk)| dot_q6k(blk, a, 8 * sb))
            .fold(0.0, |acc, v| acc + v),
    }
}

/// One Q4_K super-block (or, `five`, Q5_K: the same scales and minimums,
/// the values' fifth bits from qh) dot activation blocks `first..first + 8`.
fn dot_q4k(blk: &[u8], a: &Q8Row<'_>, first: usize, five: bool) -> f32 {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let scales = &blk[4..16];
    let mut sum = 0f32;
    for j in 0..8 {
        let (sc, m) = q4k_scale_min(scales, j);
        let mut w = [0u8; QK];
        if five {
            w = q5k_values(&blk[16..48], &blk[48..176], j);
        } else {
            let bytes = &blk[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
            for (w, &b) in w.iter_mut().zip(bytes) {
                *w = if j % 2 == 0 { b & 0x0F } else { b >> 4 };
            }
        }
        let b = first + j;
        let p = isum_u8(&w, &a.q[QK * b..QK * b + QK]);
        sum += d * f32::from(sc) * a.d[b] * p as f32 - dmin * f32::from(m) * a.s[b];
    }
    sum
}

/// One Q6_K super-block dot activation blocks `first..first + 8`.
fn dot_q6k(blk: &[u8], a: &Q8Row<'_>, first: usize) -> f32 {
    let d = f16_at(blk, 208);
    let values = q6k_values(blk);
    let mut sum = 0f32;
    for j in 0..8 {
        let b = first + j;
        let mut block = 0i32;
        for half in 0..2 {
            let g = 2 * j + half;
            let w = &values[16 * g..16 * g + 16];
            let p = isum_u8(w, &a.q[QK * b + 16 * half..QK * b + 16 * half + 16]);
            let offset = 32 * i32::from(a.sum16[2 * b + half]);
            block += i32::from(blk[192 + g] as i8) * (p - offset);
        }
        sum += d * a.d[b] * block as f32;
    }
    sum
}
