//! A linear layer whose matrix is dense (any float dtype), quantized and
//! read in place from a memory-mapped GGUF by lcut's kernels, or quantized
//! in a type only candle runs (`QMatMul`), so the decoder does not care
//! where its weights came from, optionally with a LoRA pair added on the
//! fly; and the embedding table it may share.

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::quant::{Q8Rows, QuantFormat, QuantMatrix};

use crate::error::Result;
use crate::mapped::MappedMatrix;

/// From this many input rows on, a quantized matrix is dequantized for the
/// product (candle's f32 GEMM) unless lcut's kernels have a chunk product
/// for its format on this CPU (for a mapped matrix:
/// [`crate::mapped::ProductPath::for_rows`]).
pub(crate) const DEQUANTIZE_ROWS: usize = 32;

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
    /// A quantized matrix read in place from its mapped GGUF file by
    /// lcut's kernels (CPU), and an optional dense bias [out].
    Mapped {
        /// The matrix.
        matrix: MappedMatrix,
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

    /// A layer over a matrix read in place from a mapped GGUF file.
    pub fn mapped(matrix: MappedMatrix, bias: Option<Tensor>) -> Self {
        Self::Mapped { matrix, bias }
    }

    /// Bytes a product reads of the matrix (and an on-the-fly adapter's).
    pub fn bytes(&self) -> usize {
        let tensor = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        match self {
            Self::Dense(l) => tensor(l.weight()),
            Self::Mapped { matrix, .. } => matrix.bytes(),
            Self::Quantized { matmul, .. } => match matmul {
                QMatMul::QTensor(q) => q.storage_size_in_bytes(),
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => tensor(t),
            },
            Self::Adapted(lora) => lora.base().bytes() + lora.adapter_bytes(),
        }
    }

    /// Whether the matrix is held in a quantized ggml type.
    pub fn is_quantized(&self) -> bool {
        match self {
            Self::Adapted(lora) => lora.base().is_quantized(),
            Self::Mapped { .. } => true,
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
            Self::Mapped { matrix, bias } => {
                let y = matrix.forward(x, DEQUANTIZE_ROWS)?;
                match bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                }
            }
            Self::Quantized { matmul, bias } => {
                let y = match matmul {
                    // a prefill chunk is faster through the dense product of
                    // the weights dequantized for this call (candle's CPU
                    // kernels go row by row, and its Q4_1 one is scalar)
                    QMatMul::QTensor(q) if rows(x) >= DEQUANTIZE_ROWS => {
                        let w = q.dequantize(x.device())?;
                        candle_nn::Linear::new(w, None).forward(x)?
                    }
                    // decoding on the CPU: lcut's kernels (candle's Q4_1 one is
                    // scalar)
                    QMatMul::QTensor(q)
                        if x.device().is_cpu()
                            && x.dtype() == DType::F32
                            && kernel_format(q.dtype()).is_some() =>
                    {
                        kernel_product(q, x)?
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

/// The ggml type of candle's `dtype`, when lcut's kernels read it.
fn kernel_format(dtype: candle_core::quantized::GgmlDType) -> Option<QuantFormat> {
    use candle_core::quantized::GgmlDType as G;
    Some(match dtype {
        G::Q4_0 => QuantFormat::Q4_0,
        G::Q4_1 => QuantFormat::Q4_1,
        G::Q5_0 => QuantFormat::Q5_0,
        G::Q5_1 => QuantFormat::Q5_1,
        G::Q8_0 => QuantFormat::Q8_0,
        G::Q4K => QuantFormat::Q4K,
        G::Q5K => QuantFormat::Q5K,
        G::Q6K => QuantFormat::Q6K,
        _ => return None,
    })
}

/// `x W^T` by lcut's kernels over a candle tensor's blocks (a few rows).
fn kernel_product(q: &QTensor, x: &Tensor) -> Result<Tensor> {
    let format = kernel_format(q.dtype())
        .ok_or_else(|| candle_core::Error::Msg(format!("no kernel for {:?}", q.dtype())))?;
    let (n, k) = q.shape().dims2()?;
    let data = q.data()?;
    let m = QuantMatrix::new(format, &data, n, k)?;
    let mut dims = x.dims().to_vec();
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let mut y = vec![0f32; rows(x) * n];
    let (mut acts, mut scratch) = (Q8Rows::new(), Vec::new());
    let per = lcut_kernels::quant::MAX_BATCH;
    for (xc, yc) in xs.chunks(per * k).zip(y.chunks_mut(per * n)) {
        acts.quantize(xc, xc.len() / k, k)?;
        lcut_kernels::quant::matvec(Isa::detect(), &m, &acts, yc, &mut scratch)?;
    }
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    Ok(Tensor::from_vec(y, dims, x.device())?)
}

/// A linear layer with a LoRA pair applied on the fly.
#[derive(Debug, Clone)]
pub struct LoraLinear {
    base: Linear,
    /// A [r, in].
    a: candle_nn::Linear,
    /// B [out, r], times `scale` when it is 1.
    b: candle_nn::Linear,
    /// The factor applied to B's product at every call (1 when it is in B).
    scale: f64,
}

impl LoraLinear {
    /// `base` with the pair `a` [r, in] and `b` (scale·B [out, r]).
    pub(crate) fn new(base: Linear, a: candle_nn::Linear, b: candle_nn::Linear) -> Self {
        Self {
            base,
            a,
            b,
            scale: 1.0,
        }
    }

    /// `base` with a pair being trained: `a` [r, in] and `b` [out, r] as the
    /// optimizer holds them (their updates are seen at the next call), the
    /// scale applied at every call.
    pub(crate) fn trainable(base: Linear, a: Tensor, b: Tensor, scale: f64) -> Self {
        Self {
            base,
            a: candle_nn::Linear::new(a, None),
            b: candle_nn::Linear::new(b, None),
            scale,
        }
    }

    /// base(x) + scale·(x Aᵀ) Bᵀ.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let low = self.b.forward(&self.a.forward(x)?)?;
        let low = match self.scale == 1.0 {
            true => low,
            false => (low * self.scale)?,
        };
        Ok((self.base.forward(x)? + low)?)
    }

    /// The layer under the adapter.
    pub fn base(&self) -> &Linear {
        &self.base
    }

    /// Bytes of the adapter's two matrices.
    pub fn adapter_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        bytes(self.a.weight()) + bytes(self.b.weight())
    }

    /// scale·B·A [out, in] in f32.
    fn delta(&self) -> Result<Tensor> {
        let b = self.b.weight().to_dtype(DType::F32)?;
        let a = self.a.weight().to_dtype(DType::F32)?;
        Ok((b.matmul(&a)? * self.scale)?)
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
        Linear::Mapped { matrix, .. } => matrix.dims(),
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
        Linear::Mapped { matrix, bias } => {
            let (rows, cols) = matrix.dims();
            let w = Tensor::from_vec(
                matrix.dequantize()?,
                (rows, cols),
                &candle_core::Device::Cpu,
            )?;
            (w, bias.clone())
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
    /// A quantized table read in place from its mapped GGUF file.
    Mapped(MappedMatrix),
}

impl Embedding {
    /// Bytes the table takes as held.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Self::Quantized(q) => q.storage_size_in_bytes(),
            Self::Mapped(m) => m.bytes(),
        }
    }

    /// Rows of `ids` [n] as [n, hidden].
    pub fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(table) => table.index_select(ids, 0)?,
            Self::Quantized(table) => table.embedding(ids)?,
            Self::Mapped(table) => {
                let rows = table.rows_of(&ids.to_vec1::<u32>()?)?;
                rows.to_device(ids.device())?
            }
        })
    }

    /// The LM head that shares this table (tied embeddings). A mapped
    /// table is packed for the products as a matrix loaded as a linear
    /// layer is ([`crate::mapped::packs_at_load`]); its lookups read the
    /// same copy.
    pub fn tied_head(&self) -> Result<Linear> {
        match self {
            Self::Dense(table) => Ok(Linear::dense(table.clone(), None)),
            Self::Quantized(table) => Linear::quantized(table.clone(), None),
            Self::Mapped(table) => {
                if crate::mapped::packs_at_load() {
                    table.pack()?;
                }
                Ok(Linear::mapped(table.clone(), None))
            }
        }
    }
}
