//! The quantized matrix-matrix product of a prefill chunk: every
//! activation row (quantized once per call) against every weight row, in
//! one parallel region over the weight rows. Each thread walks its rows in
//! tiles small enough to stay in the first-level cache while a block of
//! activation rows (sized for the second level) passes over them, eight
//! rows at a time through the same dot products as [`super::matvec_rows`],
//! so every output equals that product's bit for bit; on AVX2 and AVX-512
//! every format but Q8_0 (Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K) instead runs
//! a micro-kernel over sixteen unpacked weight rows at once (`tile`), equal
//! to the batched product within rounding and the same bits on both levels.
//! Q8_0's tile ([`matmul_wide`]) takes activations quantized to 16 bits.

use std::ops::Range;

use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::par;
use crate::quant::acts::{Q8Row, Q8Rows, Q16Rows};
use crate::quant::{
    MAX_BATCH, PARALLEL_BYTES, QuantFormat, QuantMatrix, ROW_ALIGN, rows_unchecked,
};

/// Bytes of weight rows a tile holds (first-level cache).
const TILE_BYTES: usize = 16 << 10;

/// Bytes of quantized activation rows a block holds (second-level cache).
const ACT_BLOCK_BYTES: usize = 128 << 10;

/// Weight rows per tile for rows of `row_bytes`: a multiple of eight (an
/// interleaved matrix's groups), 8..=64.
fn tile_rows(row_bytes: usize) -> usize {
    (TILE_BYTES / row_bytes.max(1)).clamp(8, 64) / 8 * 8
}

/// Activation rows per block for rows of `cols` values: a multiple of
/// [`MAX_BATCH`], at least one batch.
fn act_block_rows(cols: usize) -> usize {
    (ACT_BLOCK_BYTES / cols.max(1)).max(MAX_BATCH) / MAX_BATCH * MAX_BATCH
}

/// Whether the chunk product of `format` at `isa` runs a tile
/// micro-kernel on this CPU (AVX2 or AVX-512 VNNI; every format, Q8_0 on
/// 16-bit activations through [`matmul_wide`], the others through
/// [`matmul`]). The 8-bit tile beats dequantizing the matrix for an f32
/// GEMM on long chunks; Q8_0's 16-bit tile does so only on wide matrices
/// (on AVX2 it does as many multiply-adds an instruction as an f32 FMA).
pub fn has_tiled_path(isa: Isa, format: QuantFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::tile::supports(isa, format) || super::tile_q8::supports(isa, format)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, format);
        false
    }
}

/// Whether the chunk product of `format` at `isa` takes 16-bit activations
/// ([`matmul_wide`]; Q8_0 where its tile runs) rather than 8-bit ones.
pub fn takes_wide_activations(isa: Isa, format: QuantFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::tile_q8::supports(isa, format)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, format);
        false
    }
}

/// [`matmul`] for a Q8_0 matrix against activations quantized to 16 bits,
/// on its tile micro-kernel ([`takes_wide_activations`] must hold; an
/// error names the format and level otherwise).
pub fn matmul_wide(
    isa: Isa,
    m: &QuantMatrix<'_>,
    acts: &Q16Rows,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    if !takes_wide_activations(isa, m.format()) {
        return Err(KernelError::Unsupported(format!(
            "no 16-bit activation product for {:?} at {isa:?} on this CPU (Q8_0 on AVX2 or \
             AVX-512 only)",
            m.format()
        )));
    }
    check_len("activation row width", m.cols(), acts.cols())?;
    let n = acts.rows();
    check_len("product output", n * m.rows(), out.len())?;
    #[cfg(target_arch = "x86_64")]
    {
        use super::acts::Q16Row;
        use super::tile::TILE;
        use super::tile_q8::Tile16;
        let a: Vec<Q16Row<'_>> = (0..n).map(|i| acts.row(i)).collect();
        tiled(m, n, out, scratch, |rows, o| {
            let mut t = Tile16::default();
            for first in (rows.start..rows.end).step_by(TILE) {
                t.fill(&m.rows_data(first..rows.end.min(first + TILE)), m.row_bytes);
                t.product(isa, &a, &mut o[first - rows.start..], rows.len());
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (acts, scratch);
    Ok(())
}

/// The weight rows of `m` split across threads, each part's product
/// `part(rows, o)` written to `o` ([activation][row - rows.start]) in
/// `scratch`, then copied into `out` ([activation][row]).
#[cfg(target_arch = "x86_64")]
fn tiled(
    m: &QuantMatrix<'_>,
    n: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    part: impl Fn(Range<usize>, &mut [f32]) + Sync,
) {
    if n == 0 || m.rows() == 0 {
        return;
    }
    let parallel = m.bytes().saturating_mul(n) >= PARALLEL_BYTES;
    scratch.resize(out.len(), 0.0);
    let parts = par::parts(m.rows(), ROW_ALIGN, parallel);
    par::for_each_part(scratch, n, m.rows(), ROW_ALIGN, parallel, part);
    for (p, rows) in parts.iter().enumerate() {
        let part = &scratch[parts[0].len() * n * p..][..rows.len() * n];
        for (i, src) in part.chunks_exact(rows.len()).enumerate() {
            out[i * m.rows() + rows.start..i * m.rows() + rows.end].copy_from_slice(src);
        }
    }
}

/// `x W^T` for every row of `acts` (any number): `out` is [n, rows]
/// row-major. The weight rows are split across rayon's threads in one
/// parallel region (on the calling thread when the product reads under
/// [`PARALLEL_BYTES`] of weights in all). `scratch` holds the [rows, n]
/// product before its transpose and is kept for the next call.
pub fn matmul(
    isa: Isa,
    m: &QuantMatrix<'_>,
    acts: &Q8Rows,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    check_len("activation row width", m.cols(), acts.cols())?;
    let n = acts.rows();
    check_len("product output", n * m.rows(), out.len())?;
    if n == 0 || m.rows() == 0 {
        return Ok(());
    }
    let a: Vec<Q8Row<'_>> = (0..n).map(|i| acts.row(i)).collect();
    #[cfg(target_arch = "x86_64")]
    if super::tile::supports(isa, m.format()) {
        // laid out for the AMX tiles once, read by every thread
        let amx = (super::tile::takes_amx(isa, m.format(), m.cols()) && n >= super::tile::TILE)
            .then(|| super::tile_amx::AmxActs::new(&a, m.cols() / super::format::QK));
        tiled(m, n, out, scratch, |rows, o| {
            tiled_part(isa, m, &a, amx.as_ref(), rows, o)
        });
        return Ok(());
    }
    let parallel = m.bytes().saturating_mul(n) >= PARALLEL_BYTES;
    scratch.resize(out.len(), 0.0);
    let (tile, block) = (tile_rows(m.row_bytes), act_block_rows(m.cols()));
    par::for_each_part(scratch, n, m.rows(), ROW_ALIGN, parallel, |rows, o| {
        part(isa, m, &a, rows, o, (tile, block));
    });
    crate::ops::transpose(scratch, m.rows(), n, out);
    Ok(())
}

/// One thread's weight rows `rows` against every activation row `a`, into
/// `o` ([row - rows.start][activation]).
fn part(
    isa: Isa,
    m: &QuantMatrix<'_>,
    a: &[Q8Row<'_>],
    rows: Range<usize>,
    o: &mut [f32],
    (tile, block): (usize, usize),
) {
    let n = a.len();
    let mut batch = [0f32; 64 * MAX_BATCH];
    for first_act in (0..n).step_by(block) {
        let acts = &a[first_act..n.min(first_act + block)];
        for t in (rows.start..rows.end).step_by(tile) {
            let tile_rows = t..rows.end.min(t + tile);
            for (g, group) in acts.chunks(MAX_BATCH).enumerate() {
                let width = group.len();
                let got = &mut batch[..tile_rows.len() * width];
                rows_unchecked(isa, m, group, tile_rows.clone(), got);
                let col = first_act + g * MAX_BATCH;
                for (r, vals) in got.chunks_exact(width).enumerate() {
                    let at = (t - rows.start + r) * n + col;
                    o[at..at + width].copy_from_slice(vals);
                }
            }
        }
    }
}

/// One thread's weight rows `rows` on the tile micro-kernel, into `o`
/// ([activation][row - rows.start]), sixteen rows unpacked at a time;
/// `amx`: `a`'s values laid out for the AMX tiles, where they run.
#[cfg(target_arch = "x86_64")]
fn tiled_part(
    isa: Isa,
    m: &QuantMatrix<'_>,
    a: &[Q8Row<'_>],
    amx: Option<&super::tile_amx::AmxActs>,
    rows: Range<usize>,
    o: &mut [f32],
) {
    use super::tile::{TILE, Tile};
    let mut t = Tile::default();
    for first in (rows.start..rows.end).step_by(TILE) {
        let tile_rows = first..rows.end.min(first + TILE);
        if !t.fill_interleaved(m, tile_rows.clone()) {
            t.fill(m.format(), &m.rows_data(tile_rows), m.row_bytes);
        }
        t.product(isa, a, amx, &mut o[first - rows.start..], rows.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_and_blocks_stay_in_their_bounds() {
        for row_bytes in [1, 18, 360, 1152, 4608, 100_000] {
            let t = tile_rows(row_bytes);
            assert!(
                (8..=64).contains(&t) && t.is_multiple_of(8),
                "{row_bytes}: {t}"
            );
        }
        for cols in [1, 576, 8192, 1 << 20] {
            let b = act_block_rows(cols);
            assert!(b >= MAX_BATCH && b.is_multiple_of(MAX_BATCH), "{cols}: {b}");
        }
    }
}
