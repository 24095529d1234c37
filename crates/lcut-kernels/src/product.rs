//! The products a decoder layer runs, whatever its weights are stored in:
//! a [`Matrix`] is a quantized ggml matrix or a dense one, and
//! [`matvec_concat`] multiplies one input by several matrices (Q, K and V;
//! gate and up) in one parallel region, into one buffer holding their
//! outputs side by side.

use std::ops::Range;

use crate::dense::{self, DenseMatrix};
use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::par;
use crate::quant::{self, MAX_BATCH, PARALLEL_BYTES, Q8Rows, QuantMatrix};

/// Output rows a thread's part is a multiple of.
const ROW_ALIGN: usize = 16;

/// A weight matrix [rows, cols], quantized or dense.
#[derive(Debug, Clone, Copy)]
pub enum Matrix<'a> {
    /// ggml blocks, multiplied against 8-bit activations.
    Quant(QuantMatrix<'a>),
    /// f32, bf16 or f16 values, multiplied against f32 activations.
    Dense(DenseMatrix<'a>),
}

impl Matrix<'_> {
    /// Output rows.
    pub fn rows(&self) -> usize {
        match self {
            Self::Quant(m) => m.rows(),
            Self::Dense(m) => m.rows(),
        }
    }

    /// Values per row (input width).
    pub fn cols(&self) -> usize {
        match self {
            Self::Quant(m) => m.cols(),
            Self::Dense(m) => m.cols(),
        }
    }

    /// Bytes a product reads.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Quant(m) => m.bytes(),
            Self::Dense(m) => m.bytes(),
        }
    }
}

/// The input rows of the products, in f32, with their 8-bit quantization
/// made once, on the first quantized product that needs it. Buffers are kept
/// between steps.
#[derive(Debug, Clone, Default)]
pub struct Activations {
    x: Vec<f32>,
    rows: usize,
    cols: usize,
    q8: Q8Rows,
    quantized: bool,
}

impl Activations {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The buffer for `rows` new input rows of `cols` values, to fill.
    pub fn fill(&mut self, rows: usize, cols: usize) -> &mut [f32] {
        self.rows = rows;
        self.cols = cols;
        self.quantized = false;
        self.x.resize(rows * cols, 0.0);
        &mut self.x
    }

    /// The input rows.
    pub fn values(&self) -> &[f32] {
        &self.x
    }

    /// Input rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The 8-bit quantization of the rows (made now if not yet).
    fn quantized(&mut self) -> Result<&Q8Rows> {
        if !self.quantized {
            self.q8.quantize(&self.x, self.rows, self.cols)?;
            self.quantized = true;
        }
        Ok(&self.q8)
    }
}

/// `x W_i^T` for every matrix `mats[i]` (all as wide as the input) into
/// `out`, [n, sum of rows] row-major: each input row's outputs of the
/// matrices side by side, in order. The rows of all matrices are split
/// across rayon's threads in one parallel region (on the calling thread
/// when they hold less than [`PARALLEL_BYTES`] together). `scratch` serves
/// n > 1 and is kept for the next call.
pub fn matvec_concat(
    isa: Isa,
    mats: &[Matrix<'_>],
    acts: &mut Activations,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let n = acts.rows;
    if n > MAX_BATCH {
        return Err(KernelError::TooManyRows {
            max: MAX_BATCH,
            got: n,
        });
    }
    let total: usize = mats.iter().map(Matrix::rows).sum();
    for m in mats {
        check_len("activation row width", m.cols(), acts.cols)?;
    }
    check_len("product output", n * total, out.len())?;
    if mats.iter().any(|m| matches!(m, Matrix::Quant(_))) {
        acts.quantized()?;
    }
    let (x, q8) = (&acts.x[..], &acts.q8);
    let bytes: usize = mats.iter().map(Matrix::bytes).sum();
    let parallel = bytes >= PARALLEL_BYTES;
    let run = |rows: Range<usize>, o: &mut [f32]| {
        let mut at = 0;
        for (m, offset) in mats.iter().zip(offsets(mats)) {
            let lo = rows.start.max(offset);
            let hi = rows.end.min(offset + m.rows());
            if lo < hi {
                let dst = &mut o[at * n..(at + hi - lo) * n];
                let local = lo - offset..hi - offset;
                // shapes were checked above: errors cannot occur here
                let done = match m {
                    Matrix::Quant(q) => quant::matvec_rows(isa, q, q8, local, dst),
                    Matrix::Dense(d) => dense::matvec_rows(isa, d, x, n, local, dst),
                };
                debug_assert!(done.is_ok());
                at += hi - lo;
            }
        }
    };
    if n == 1 {
        par::for_each_part(out, 1, total, ROW_ALIGN, parallel, run);
        return Ok(());
    }
    scratch.resize(out.len(), 0.0);
    par::for_each_part(scratch, n, total, ROW_ALIGN, parallel, run);
    crate::ops::transpose(scratch, total, n, out);
    Ok(())
}

/// The first row of each matrix in the concatenation.
fn offsets<'m>(mats: &'m [Matrix<'_>]) -> impl Iterator<Item = usize> + 'm {
    mats.iter().scan(0, |acc, m| {
        let at = *acc;
        *acc += m.rows();
        Some(at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::DenseWeights;
    use crate::quant::QuantFormat;
    use crate::testdata::{Rng, random_blocks};

    #[test]
    fn concatenated_products_equal_each_product_alone() {
        let mut rng = Rng::new(31);
        let cols = 128;
        let q = random_blocks(QuantFormat::Q4_1, 200 * cols / 32, &mut rng);
        let k = random_blocks(QuantFormat::Q8_0, 40 * cols / 32, &mut rng);
        let d = rng.normals(70 * cols, 0.1);
        let mats = [
            Matrix::Quant(QuantMatrix::new(QuantFormat::Q4_1, &q, 200, cols).expect("fits")),
            Matrix::Quant(QuantMatrix::new(QuantFormat::Q8_0, &k, 40, cols).expect("fits")),
            Matrix::Dense(DenseMatrix::new(DenseWeights::F32(&d), 70, cols).expect("fits")),
        ];
        for n in [1, 3] {
            let mut acts = Activations::new();
            acts.fill(n, cols)
                .copy_from_slice(&rng.normals(n * cols, 1.0));
            let mut out = vec![0f32; n * 310];
            matvec_concat(Isa::detect(), &mats, &mut acts, &mut out, &mut Vec::new())
                .expect("shapes");
            let mut at = 0;
            for m in &mats {
                let mut one = vec![0f32; n * m.rows()];
                matvec_concat(Isa::detect(), &[*m], &mut acts, &mut one, &mut Vec::new())
                    .expect("shapes");
                for i in 0..n {
                    let got = &out[i * 310 + at..i * 310 + at + m.rows()];
                    assert_eq!(got, &one[i * m.rows()..(i + 1) * m.rows()]);
                }
                at += m.rows();
            }
        }
        let mut acts = Activations::new();
        acts.fill(1, 64);
        assert!(
            matvec_concat(
                Isa::detect(),
                &mats,
                &mut acts,
                &mut [0.0; 310],
                &mut Vec::new()
            )
            .is_err()
        );
    }
}
