//! Quantized matrix-vector products reading a ggml matrix's raw blocks (as a
//! GGUF file stores them, e.g. memory-mapped) against activations
//! quantized to 8 bits per block of 32 ([`Q8Rows`]): one integer dot
//! product per block, scaled and summed in f32. Up to [`MAX_BATCH`]
//! activation rows share one pass over the weights (batched decoding);
//! [`matmul`] takes any number (a prefill chunk).

pub mod acts;
mod aligned;
pub mod format;
mod matmul;
pub mod packed;
mod portable;
pub mod prefetch;

#[cfg(target_arch = "x86_64")]
mod acts_avx2;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_avx512;
#[cfg(target_arch = "x86_64")]
mod tile;
#[cfg(target_arch = "x86_64")]
mod tile_amx;
#[cfg(target_arch = "x86_64")]
mod tile_avx2;
#[cfg(target_arch = "x86_64")]
mod tile_avx512;
#[cfg(target_arch = "x86_64")]
mod tile_q8;

use std::borrow::Cow;
use std::ops::Range;

pub use acts::{Q8Row, Q8Rows, Q16Row, Q16Rows};
pub use aligned::{HUGE_PAGES_VAR, huge_page_bytes, huge_pages_turned_off};
pub use format::{FORMATS, QK, QK_K, QuantFormat, dequantize, quantize_mxfp4};
pub use matmul::{has_tiled_path, matmul, matmul_wide, takes_wide_activations};
pub use packed::{GROUP_ROWS, PackedMatrix};

use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::par;

/// Most activation rows one product takes.
pub const MAX_BATCH: usize = 8;

/// Output rows a thread's part is a multiple of.
pub(crate) const ROW_ALIGN: usize = 16;

/// Matrices smaller than this (bytes) are multiplied on the calling thread:
/// waking the other threads costs more than they would save.
pub const PARALLEL_BYTES: usize = 48 << 10;

/// How a quantized matrix's blocks are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Row after row of blocks, as a GGUF file stores them.
    Rows,
    /// Rows interleaved eight at a time ([`packed`]), made at load.
    Interleaved,
}

/// A quantized matrix [rows, cols] over borrowed bytes, checked once.
#[derive(Debug, Clone, Copy)]
pub struct QuantMatrix<'a> {
    pub(crate) format: QuantFormat,
    pub(crate) data: &'a [u8],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Bytes of one row in the file's layout.
    pub(crate) row_bytes: usize,
    pub(crate) layout: Layout,
}

impl<'a> QuantMatrix<'a> {
    /// The matrix of `rows` x `cols` values of `format` held in `data`
    /// (exactly `rows` rows of whole blocks).
    pub fn new(format: QuantFormat, data: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        let row_bytes = format.row_bytes(cols)?;
        check_len("quantized matrix bytes", rows * row_bytes, data.len())?;
        Ok(Self {
            format,
            data,
            rows,
            cols,
            row_bytes,
            layout: Layout::Rows,
        })
    }

    /// The matrix of `rows` x `cols` values of `format` held in `data` in
    /// the interleaved layout ([`packed`]).
    pub fn interleaved(
        format: QuantFormat,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let row_bytes = packed::check_packed(format, data, rows, cols)?;
        Ok(Self {
            format,
            data,
            rows,
            cols,
            row_bytes,
            layout: Layout::Interleaved,
        })
    }

    /// How the blocks are laid out.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row (input width).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the whole matrix.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The blocks of rows `range` in the file's layout: borrowed, or
    /// unpacked from the interleaved layout.
    pub(crate) fn rows_data(&self, range: Range<usize>) -> Cow<'a, [u8]> {
        match self.layout {
            Layout::Rows => {
                Cow::Borrowed(&self.data[range.start * self.row_bytes..range.end * self.row_bytes])
            }
            Layout::Interleaved => {
                let mut out = vec![0u8; range.len() * self.row_bytes];
                for (r, o) in range.zip(out.chunks_exact_mut(self.row_bytes)) {
                    packed::unpack_row(self, r, o);
                }
                Cow::Owned(out)
            }
        }
    }

    /// Row `i` dequantized into `out` (`cols` values): an embedding lookup.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<()> {
        if i >= self.rows {
            return Err(KernelError::Rows {
                start: i,
                end: i + 1,
                len: self.rows,
            });
        }
        match self.layout {
            Layout::Rows => dequantize(self.format, &self.rows_data(i..i + 1), out),
            Layout::Interleaved => packed::dequantize_row(self, i, out),
        }
    }
}

/// Checks shared by the products: activations as wide as the matrix, a
/// batch within [`MAX_BATCH`], rows inside the matrix, output sized.
fn check(m: &QuantMatrix<'_>, acts: &Q8Rows, rows: &Range<usize>, out: usize) -> Result<()> {
    check_len("activation row width", m.cols, acts.cols())?;
    if acts.rows() > MAX_BATCH {
        return Err(KernelError::TooManyRows {
            max: MAX_BATCH,
            got: acts.rows(),
        });
    }
    if rows.start > rows.end || rows.end > m.rows {
        return Err(KernelError::Rows {
            start: rows.start,
            end: rows.end,
            len: m.rows,
        });
    }
    check_len("product output", rows.len() * acts.rows(), out)
}

/// Rows `rows` of `m` dot every activation row, on the calling thread:
/// `out[(r - rows.start) * n + i]` is row r dot activation row i (n rows).
/// `isa` above what the CPU runs falls back to the best level it does run.
pub fn matvec_rows(
    isa: Isa,
    m: &QuantMatrix<'_>,
    acts: &Q8Rows,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    check(m, acts, &rows, out.len())?;
    with_rows(acts, |a| rows_unchecked(isa, m, a, rows, out));
    Ok(())
}

/// `f` over the rows of `acts` (at most [`MAX_BATCH`]), without allocating.
fn with_rows<R>(acts: &Q8Rows, f: impl FnOnce(&[Q8Row<'_>]) -> R) -> R {
    let n = acts.rows().min(MAX_BATCH);
    if n == 0 {
        return f(&[]);
    }
    let mut rows = [acts.row(0); MAX_BATCH];
    for (i, r) in rows.iter_mut().enumerate().take(n).skip(1) {
        *r = acts.row(i);
    }
    f(&rows[..n])
}

/// [`matvec_rows`] after its checks.
pub(crate) fn rows_unchecked(
    isa: Isa,
    m: &QuantMatrix<'_>,
    a: &[Q8Row<'_>],
    rows: Range<usize>,
    out: &mut [f32],
) {
    if m.layout == Layout::Interleaved {
        packed::rows_unchecked(isa, m, a, rows, out);
        return;
    }
    let w = &m.data[rows.start * m.row_bytes..rows.end * m.row_bytes];
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && avx512::rows(m.format, w, m.row_bytes, a, out) {
            return;
        }
        if isa >= Isa::Avx2 && avx2::rows(m.format, w, m.row_bytes, a, out) {
            return;
        }
    }
    let _ = isa;
    let n = a.len();
    if n == 0 {
        return;
    }
    for (o, row) in out.chunks_exact_mut(n).zip(w.chunks_exact(m.row_bytes)) {
        for (o, a) in o.iter_mut().zip(a) {
            *o = portable::dot_row(m.format, row, a);
        }
    }
}

/// `x W^T` for every activation row of `acts`: `out` is [n, rows]
/// row-major (n activation rows). The output rows are split across
/// rayon's threads in one parallel region (one part per thread), or run on
/// the calling thread for a matrix under [`PARALLEL_BYTES`]. `scratch` is
/// used only for n > 1 and kept for the next call.
pub fn matvec(
    isa: Isa,
    m: &QuantMatrix<'_>,
    acts: &Q8Rows,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    check(m, acts, &(0..m.rows), out.len())?;
    let n = acts.rows();
    let parallel = m.bytes() >= PARALLEL_BYTES;
    with_rows(acts, |a| {
        let run = |rows: Range<usize>, o: &mut [f32]| rows_unchecked(isa, m, a, rows, o);
        if n == 1 {
            par::for_each_part(out, 1, m.rows, ROW_ALIGN, parallel, run);
            return;
        }
        scratch.resize(out.len(), 0.0);
        par::for_each_part(scratch, n, m.rows, ROW_ALIGN, parallel, run);
        crate::ops::transpose(scratch, m.rows, n, out);
    });
    Ok(())
}
