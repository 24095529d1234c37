//! A linear layer whose matrix is dense (any float dtype) or quantized
//! (a ggml type run by candle's `QMatMul`), so the decoder does not care
//! where its weights came from, optionally with a LoRA pair added on the
//! fly; and the embedding table it may share.

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

use crate::error::Result;
use crate::qdot;

/// From this many input rows on, a quantized matrix is dequantized for the
/// product (one dense product instead of a row-by-row quantized one).
const DEQUANTIZE_ROWS: usize = 32;

/// Rows of `x` [.., in]: the product of every dimension but the last.
fn rows(x: &Tensor) -> usize {
    let dims = x.dims();
    dims[..dims.len().saturating_sub(1)].iter().product()
}

/// y = x W^T (+ b), with W dense or quantized.
#[derive(Debug, Clone)]
pub enum Linear {
    /// A dense weight matrix [out, in].
    Dense(candle_nn::Linear),
    /// A quantized weight matrix [out, in] and an optional dense bias [out].
    Quantized {
        /// The matrix, kept in its ggml type.
        matmul: QMatMul,
        /// The bias.
        bias: Option<Tensor>,
    },
    /// A layer with a LoRA adapter applied on the fly.
    Adapted(Box<LoraLinear>),
}

impl Linear {
    /// A dense layer.
    pub fn dense(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self::Dense(candle_nn::Linear::new(weight, bias))
    }

    /// A layer over a quantized matrix (F32/F16 matrices become dense).
    pub fn quantized(weight: Arc<QTensor>, bias: Option<Tensor>) -> Result<Self> {
        Ok(Self::Quantized {
            matmul: QMatMul::from_arc(weight)?,
            bias,
        })
    }

    /// Whether the matrix is held in a quantized ggml type.
    pub fn is_quantized(&self) -> bool {
        match self {
            Self::Adapted(lora) => lora.base().is_quantized(),
            _ => matches!(
                self,
                Self::Quantized {
                    matmul: QMatMul::QTensor(_),
                    ..
                }
            ),
        }
    }

    /// Apply the layer to `x` [.., in].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(lin) => lin.forward(x)?,
            Self::Adapted(lora) => lora.forward(x)?,
            Self::Quantized { matmul, bias } => {
                let y = match matmul {
                    // a prefill chunk is faster through the dense product of
                    // the weights dequantized for this call (candle's CPU
                    // kernels go row by row, and its Q4_1 one is scalar)
                    QMatMul::QTensor(q) if rows(x) >= DEQUANTIZE_ROWS => {
                        let w = q.dequantize(x.device())?;
                        candle_nn::Linear::new(w, None).forward(x)?
                    }
                    // decoding on the CPU: lcut's kernel (candle's Q4_1 one is
                    // scalar)
                    QMatMul::QTensor(q)
                        if x.device().is_cpu()
                            && x.dtype() == DType::F32
                            && qdot::supports(q.dtype()) =>
                    {
                        let (n, k) = q.shape().dims2()?;
                        let mut dims = x.dims().to_vec();
                        let xs = x.flatten_all()?.to_vec1::<f32>()?;
                        let y = qdot::matmul(q.dtype(), &q.data()?, n, k, &xs);
                        if let Some(last) = dims.last_mut() {
                            *last = n;
                        }
                        Tensor::from_vec(y, dims, x.device())?
                    }
                    _ => matmul.forward(x)?,
                };
                match bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                }
            }
        })
    }
}

/// A linear layer with a LoRA pair applied on the fly.
#[derive(Debug, Clone)]
pub struct LoraLinear {
    base: Linear,
    /// A [r, in].
    a: candle_nn::Linear,
    /// scale·B [out, r].
    b: candle_nn::Linear,
}

impl LoraLinear {
    /// `base` with the pair `a` [r, in] and `b` (scale·B [out, r]).
    pub(crate) fn new(base: Linear, a: candle_nn::Linear, b: candle_nn::Linear) -> Self {
        Self { base, a, b }
    }

    /// base(x) + scale·(x Aᵀ) Bᵀ.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let low = self.a.forward(x)?;
        Ok((self.base.forward(x)? + self.b.forward(&low)?)?)
    }

    /// The layer under the adapter.
    pub fn base(&self) -> &Linear {
        &self.base
    }

    /// scale·B·A [out, in] in f32.
    fn delta(&self) -> Result<Tensor> {
        let b = self.b.weight().to_dtype(DType::F32)?;
        let a = self.a.weight().to_dtype(DType::F32)?;
        Ok(b.matmul(&a)?)
    }
}

/// (out, in) of a linear layer.
pub(crate) fn linear_dims(lin: &Linear) -> Result<(usize, usize)> {
    Ok(match lin {
        Linear::Dense(l) => l.weight().dims2()?,
        Linear::Quantized { matmul, .. } => match matmul {
            QMatMul::QTensor(q) => q.shape().dims2()?,
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims2()?,
        },
        Linear::Adapted(l) => linear_dims(&l.base)?,
    })
}

/// The layer's effective matrix in f32 (quantized ones dequantized, an
/// on-the-fly adapter added) and its bias.
pub(crate) fn dense_parts(lin: &Linear) -> Result<(Tensor, Option<Tensor>)> {
    Ok(match lin {
        Linear::Dense(l) => (l.weight().to_dtype(DType::F32)?, l.bias().cloned()),
        Linear::Quantized { matmul, bias } => {
            let w = match matmul {
                QMatMul::QTensor(q) => q.dequantize(&q.device())?,
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.clone(),
            };
            (w.to_dtype(DType::F32)?, bias.clone())
        }
        Linear::Adapted(l) => {
            let (w, b) = dense_parts(&l.base)?;
            ((w + l.delta()?)?, b)
        }
    })
}

/// The token embedding table, dense or quantized.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// A dense table [vocab, hidden].
    Dense(Tensor),
    /// A quantized table, looked up row by row without dequantizing the rest.
    Quantized(Arc<QTensor>),
}

impl Embedding {
    /// Rows of `ids` [n] as [n, hidden].
    pub fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(table) => table.index_select(ids, 0)?,
            Self::Quantized(table) => table.embedding(ids)?,
        })
    }

    /// The LM head that shares this table (tied embeddings).
    pub fn tied_head(&self) -> Result<Linear> {
        match self {
            Self::Dense(table) => Ok(Linear::dense(table.clone(), None)),
            Self::Quantized(table) => Linear::quantized(table.clone(), None),
        }
    }
}
