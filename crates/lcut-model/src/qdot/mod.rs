//! Quantized matrix products for a few rows (decoding) on the CPU, for Q4_0,
//! Q4_1 and Q8_0 (candle's CPU kernel for Q4_1 is scalar, 3x slower than
//! this one; for Q4_0 and Q8_0 the two are on a par): the activations are
//! quantized to 8 bits per block of 32 (as ggml's Q8_1: a scale and the
//! scaled sum), each output row is one integer dot product per block, and
//! large products split their output rows across threads. On a CPU
//! with AVX2 the blocks are multiplied with AVX2 integer instructions
//! (`avx2`, chosen at run time); elsewhere by portable code.

#[cfg(target_arch = "x86_64")]
mod avx2;

use candle_core::quantized::GgmlDType;
use half::f16;
use rayon::prelude::*;

/// Values per block in every type handled here.
const BLOCK: usize = 32;
/// Fewest output rows per parallel task.
const ROWS_PER_TASK: usize = 64;
/// Products smaller than this (multiply-adds) run on the calling thread.
const PARALLEL_MACS: usize = 256 << 10;

/// Whether [`matmul`] handles this type.
pub fn supports(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q8_0)
}

/// Bytes of one block of a supported type.
fn block_bytes(dtype: GgmlDType) -> usize {
    match dtype {
        GgmlDType::Q4_0 => Q4_0::BYTES,
        GgmlDType::Q4_1 => Q4_1::BYTES,
        _ => Q8_0::BYTES,
    }
}

/// One row of activations quantized to 8 bits per block of 32.
struct QuantizedRow {
    /// Quantized values, block by block.
    q: Vec<[i8; BLOCK]>,
    /// Scale of each block.
    d: Vec<f32>,
    /// Scale times the sum of the block's quantized values.
    s: Vec<f32>,
}

fn quantize_row(x: &[f32]) -> QuantizedRow {
    let blocks = x.len() / BLOCK;
    let mut out = QuantizedRow {
        q: Vec::with_capacity(blocks),
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
    };
    for xs in x.chunks_exact(BLOCK) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0i8; BLOCK];
        let mut sum = 0i32;
        for (q, v) in q.iter_mut().zip(xs) {
            *q = (v * inv).round() as i8;
            sum += i32::from(*q);
        }
        out.q.push(q);
        out.d.push(d);
        out.s.push(d * sum as f32);
    }
    out
}

/// Sum of products of two blocks of 32 small integers (vectorizes).
#[inline(always)]
fn idot(w: &[i8; BLOCK], a: &[i8; BLOCK]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// Sum over a block of its 32 4-bit values (16 bytes, low nibbles first)
/// times 32 quantized activations, in 16-bit lanes (vectorizes).
#[inline(always)]
fn idot_u4(qs: &[u8], a: &[i8; BLOCK]) -> i32 {
    let mut w = [0i16; BLOCK];
    for (j, &b) in qs.iter().take(16).enumerate() {
        w[j] = i16::from(b & 0x0F);
        w[j + 16] = i16::from(b >> 4);
    }
    let mut sum = 0i32;
    for j in 0..BLOCK {
        sum += i32::from(w[j] * i16::from(a[j]));
    }
    sum
}

/// The f16 scale at `bytes[at..at + 2]`.
#[inline(always)]
fn scale(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// One ggml block type: its size and its dot product with 32 quantized
/// activations (`d`: their scale, `s`: scale times their sum).
trait Kind {
    const BYTES: usize;
    fn dot(blk: &[u8], qa: &[i8; BLOCK], d: f32, s: f32) -> f32;
}

/// Q4_0: scale, 32 4-bit values v (weight = scale * (v - 8)).
struct Q4_0;
/// Q4_1: scale, minimum, 32 4-bit values v (weight = scale * v + minimum).
struct Q4_1;
/// Q8_0: scale, 32 signed bytes (weight = scale * v).
struct Q8_0;

impl Kind for Q4_0 {
    const BYTES: usize = 18;
    #[inline(always)]
    fn dot(blk: &[u8], qa: &[i8; BLOCK], d: f32, s: f32) -> f32 {
        // (v - 8) a summed = v a summed - 8 (a summed), and s = d (a summed)
        scale(blk, 0) * (d * idot_u4(&blk[2..18], qa) as f32 - 8.0 * s)
    }
}

impl Kind for Q4_1 {
    const BYTES: usize = 20;
    #[inline(always)]
    fn dot(blk: &[u8], qa: &[i8; BLOCK], d: f32, s: f32) -> f32 {
        let (dw, mw) = (scale(blk, 0), scale(blk, 2));
        dw * d * idot_u4(&blk[4..20], qa) as f32 + mw * s
    }
}

impl Kind for Q8_0 {
    const BYTES: usize = 34;
    #[inline(always)]
    fn dot(blk: &[u8], qa: &[i8; BLOCK], d: f32, _s: f32) -> f32 {
        let mut w = [0i8; BLOCK];
        for (w, &b) in w.iter_mut().zip(&blk[2..34]) {
            *w = b as i8;
        }
        scale(blk, 0) * d * idot(&w, qa) as f32
    }
}

/// One task: `out[i]` = row i of `w` dot `a`, for a run of output rows.
#[inline(always)]
fn rows_body<K: Kind>(w: &[u8], row_bytes: usize, a: &QuantizedRow, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
        let mut sum = 0f32;
        let blocks = row.chunks_exact(K::BYTES).zip(&a.q);
        for ((blk, qa), (d, s)) in blocks.zip(a.d.iter().zip(&a.s)) {
            sum += K::dot(blk, qa, *d, *s);
        }
        *o = sum;
    }
}

fn rows_portable(dtype: GgmlDType, w: &[u8], row_bytes: usize, a: &QuantizedRow, out: &mut [f32]) {
    match dtype {
        GgmlDType::Q4_0 => rows_body::<Q4_0>(w, row_bytes, a, out),
        GgmlDType::Q4_1 => rows_body::<Q4_1>(w, row_bytes, a, out),
        _ => rows_body::<Q8_0>(w, row_bytes, a, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(unsafe_code)]
fn rows_avx2(dtype: GgmlDType, w: &[u8], row_bytes: usize, a: &QuantizedRow, out: &mut [f32]) {
    let row: unsafe fn(&[u8], &QuantizedRow) -> f32 = match dtype {
        GgmlDType::Q4_0 => avx2::row_q4_0,
        GgmlDType::Q4_1 => avx2::row_q4_1,
        _ => avx2::row_q8_0,
    };
    for (o, r) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
        // SAFETY: this function only runs where AVX2, FMA and F16C are
        // present, which is all the row functions require.
        *o = unsafe { row(r, a) };
    }
}

#[allow(unsafe_code)]
fn rows(dtype: GgmlDType, w: &[u8], row_bytes: usize, a: &QuantizedRow, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        // SAFETY: the CPU has just been checked to support AVX2, FMA and
        // F16C, the only requirement of `rows_avx2`.
        unsafe { rows_avx2(dtype, w, row_bytes, a, out) };
        return;
    }
    rows_portable(dtype, w, row_bytes, a, out);
}

/// `x W^T` for `x` [m, k] (row-major f32) and `W` [n, k] given as the raw
/// ggml blocks of a supported type; returns [m, n] row-major. `k` must be a
/// multiple of 32 and `w` exactly `n` rows of `k / 32` blocks.
pub fn matmul(dtype: GgmlDType, w: &[u8], n: usize, k: usize, x: &[f32]) -> Vec<f32> {
    let row_bytes = k / BLOCK * block_bytes(dtype);
    debug_assert_eq!(w.len(), n * row_bytes);
    let m = x.len() / k;
    let mut out = vec![0f32; m * n];
    for (xr, yr) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
        let a = quantize_row(xr);
        if n * k < PARALLEL_MACS {
            // waking the thread pool costs more than the product itself
            rows(dtype, w, row_bytes, &a, yr);
            continue;
        }
        // one task per thread: fewer hand-offs to the pool
        let per_task = n
            .div_ceil(rayon::current_num_threads().max(1))
            .max(ROWS_PER_TASK);
        yr.par_chunks_mut(per_task)
            .zip(w.par_chunks(per_task * row_bytes))
            .for_each(|(o, wc)| rows(dtype, wc, row_bytes, &a, o));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// Against candle's own quantized product (the same activation
    /// quantization) and against the dequantized weights in f32.
    #[test]
    fn matches_candle_and_the_dequantized_product() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (n, k) = (70, 128);
        let w = Tensor::randn(0f32, 0.2, (n, k), &dev)?;
        let x = Tensor::randn(0f32, 1.0, (3, k), &dev)?;
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = std::sync::Arc::new(QTensor::quantize(&w, dtype)?);
            let ours = matmul(dtype, &q.data()?, n, k, &x.flatten_all()?.to_vec1()?);
            let ours = Tensor::from_vec(ours, (3, n), &dev)?;
            let candle = QMatMul::from_arc(q.clone())?.forward(&x)?;
            let dense = x.matmul(&q.dequantize(&dev)?.t()?)?;
            let scale = dense.abs()?.max_all()?.to_scalar::<f32>()?;
            let vs_candle = (&ours - &candle)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let vs_dense = (&ours - &dense)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(
                vs_candle <= 1e-3 * scale,
                "{dtype:?}: vs candle {vs_candle}"
            );
            assert!(vs_dense <= 2e-2 * scale, "{dtype:?}: vs dense {vs_dense}");
        }
        Ok(())
    }

    /// The portable block loops (used where the CPU lacks AVX2) give what
    /// the dispatched path gives, over a product large enough to be split
    /// across threads.
    #[test]
    fn portable_path_equals_the_dispatched_one() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (n, k) = (2100, 128);
        assert!(n * k >= PARALLEL_MACS);
        let w = Tensor::randn(0f32, 0.2, (n, k), &dev)?;
        let x: Vec<f32> = Tensor::randn(0f32, 1.0, (1, k), &dev)?
            .flatten_all()?
            .to_vec1()?;
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let data = QTensor::quantize(&w, dtype)?.data()?.to_vec();
            let dispatched = matmul(dtype, &data, n, k, &x);
            let mut portable = vec![0f32; n];
            let row_bytes = k / BLOCK * block_bytes(dtype);
            rows_portable(dtype, &data, row_bytes, &quantize_row(&x), &mut portable);
            let scale = portable.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in dispatched.iter().zip(&portable).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * scale,
                    "{dtype:?} row {i}: {a} vs {b}"
                );
            }
        }
        Ok(())
    }
}
