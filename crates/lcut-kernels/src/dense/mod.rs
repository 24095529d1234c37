//! Dense matrix-vector products over f32, bf16 or f16 weights [rows, cols]
//! (a Hugging Face model's matrices as stored) with f32 activations, up to
//! [`MAX_BATCH`](crate::quant::MAX_BATCH) activation rows per pass over
//! the weights; bf16 and f16 are widened to f32 in registers.

mod portable;

#[cfg(target_arch = "x86_64")]
mod simd;

use std::ops::Range;

use half::{bf16, f16};

use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::par;
use crate::quant::{MAX_BATCH, PARALLEL_BYTES};

/// Output rows a thread's part is a multiple of.
const ROW_ALIGN: usize = 16;

/// The weights of a dense matrix, row-major.
#[derive(Debug, Clone, Copy)]
pub enum DenseWeights<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    Bf16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
}

impl DenseWeights<'_> {
    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(w) => w.len(),
            Self::Bf16(w) => w.len(),
            Self::F16(w) => w.len(),
        }
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per value.
    pub fn elem_bytes(&self) -> usize {
        match self {
            Self::F32(_) => 4,
            Self::Bf16(_) | Self::F16(_) => 2,
        }
    }

    /// The values `range`.
    fn slice(&self, range: Range<usize>) -> Self {
        match self {
            Self::F32(w) => Self::F32(&w[range]),
            Self::Bf16(w) => Self::Bf16(&w[range]),
            Self::F16(w) => Self::F16(&w[range]),
        }
    }
}

/// A dense matrix [rows, cols] over borrowed values, checked once.
#[derive(Debug, Clone, Copy)]
pub struct DenseMatrix<'a> {
    data: DenseWeights<'a>,
    rows: usize,
    cols: usize,
}

impl<'a> DenseMatrix<'a> {
    /// The matrix of `rows` x `cols` values held row-major in `data`.
    pub fn new(data: DenseWeights<'a>, rows: usize, cols: usize) -> Result<Self> {
        check_len("dense matrix values", rows * cols, data.len())?;
        Ok(Self { data, rows, cols })
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
        self.data.len() * self.data.elem_bytes()
    }

    /// The weights.
    pub fn weights(&self) -> DenseWeights<'a> {
        self.data
    }
}

/// Checks shared by the products.
fn check(m: &DenseMatrix<'_>, x: &[f32], n: usize, rows: &Range<usize>, out: usize) -> Result<()> {
    if n > MAX_BATCH {
        return Err(KernelError::TooManyRows {
            max: MAX_BATCH,
            got: n,
        });
    }
    check_len("activations", n * m.cols, x.len())?;
    if rows.start > rows.end || rows.end > m.rows {
        return Err(KernelError::Rows {
            start: rows.start,
            end: rows.end,
            len: m.rows,
        });
    }
    check_len("product output", rows.len() * n, out)
}

/// Rows `rows` of `m` dot each of the `n` activation rows of `x` [n, cols],
/// on the calling thread: `out[(r - rows.start) * n + i]`.
pub fn matvec_rows(
    isa: Isa,
    m: &DenseMatrix<'_>,
    x: &[f32],
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    check(m, x, n, &rows, out.len())?;
    rows_unchecked(isa, m, x, n, rows, out);
    Ok(())
}

/// [`matvec_rows`] after its checks.
fn rows_unchecked(
    isa: Isa,
    m: &DenseMatrix<'_>,
    x: &[f32],
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    if n == 0 {
        return;
    }
    let w = m.data.slice(rows.start * m.cols..rows.end * m.cols);
    let mut xs = [&x[..0]; MAX_BATCH];
    for (i, r) in xs.iter_mut().enumerate().take(n) {
        *r = &x[i * m.cols..(i + 1) * m.cols];
    }
    let xs = &xs[..n];
    #[cfg(target_arch = "x86_64")]
    if simd::rows(isa, w, m.cols, xs, out) {
        return;
    }
    let _ = isa;
    portable::rows(w, m.cols, xs, out);
}

/// `x W^T` for the `n` activation rows of `x` [n, cols]: `out` is
/// [n, rows], the rows split across rayon's threads in one parallel region
/// (on the calling thread for a matrix under
/// [`PARALLEL_BYTES`](crate::quant::PARALLEL_BYTES)). `scratch` serves
/// n > 1 and is kept for the next call.
pub fn matvec(
    isa: Isa,
    m: &DenseMatrix<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    check(m, x, n, &(0..m.rows), out.len())?;
    let parallel = m.bytes() >= PARALLEL_BYTES;
    let run = |rows: Range<usize>, o: &mut [f32]| rows_unchecked(isa, m, x, n, rows, o);
    if n == 1 {
        par::for_each_part(out, 1, m.rows, ROW_ALIGN, parallel, run);
        return Ok(());
    }
    scratch.resize(out.len(), 0.0);
    par::for_each_part(scratch, n, m.rows, ROW_ALIGN, parallel, run);
    crate::ops::transpose(scratch, m.rows, n, out);
    Ok(())
}
