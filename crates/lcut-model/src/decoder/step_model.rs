//! What the fused decode step reads of a decoder, prepared once: host
//! copies of the small vectors (norms, biases) and, for each matrix, where
//! lcut's kernels read it: a quantized matrix in its mapped GGUF file, or a
//! dense CPU tensor whose storage is borrowed for the step (never copied).
//!
//! A decoder gets no step model (and decodes through the tensor path) when
//! [`Unfused`] names a reason: a GPU, a matrix in a ggml type the kernels do
//! not read, a LoRA adapter applied on the fly, or a dense tensor that is
//! not a plain CPU buffer.

use candle_core::quantized::QMatMul;
use candle_core::{CpuStorage, DType, Storage, StorageRef, Tensor};
use lcut_kernels::dense::{DenseMatrix, DenseWeights};
use lcut_kernels::ops::GateActivation;
use lcut_kernels::product::Matrix;

use super::Decoder;
use super::layer::{Norm, Product};
use crate::error::{ModelError, Result};
use crate::layers::{Experts, FeedForward, GateUpLinears, Mlp, QkvLinears, RmsNorm, RouterRule};
use crate::linear::Linear;
use crate::mapped::MappedMatrix;

/// Why a decoder decodes through the tensor path instead of the fused step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfused {
    /// The model runs on a GPU.
    Device,
    /// A LoRA adapter is applied on the fly (`--lora-mode on-the-fly`).
    OnTheFlyLora,
    /// A matrix is held in a ggml type only candle runs (Q2_K, Q3_K).
    CandleQuantized,
    /// A dense matrix is not a contiguous f32, bf16 or f16 CPU tensor.
    DenseStorage,
    /// The fused step was turned off ([`Decoder::set_fused_decode`]).
    TurnedOff,
}

impl Unfused {
    /// The rule, as the documentation names it.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Device => "the model runs on a GPU",
            Self::OnTheFlyLora => "a LoRA adapter is applied on the fly",
            Self::CandleQuantized => "a matrix is in a ggml type only candle runs",
            Self::DenseStorage => "a dense matrix is not a contiguous CPU buffer",
            Self::TurnedOff => "the fused step was turned off",
        }
    }
}

/// Where one matrix is read from.
#[derive(Debug, Clone)]
enum Source {
    /// Blocks in a mapped GGUF file.
    Mapped(MappedMatrix),
    /// A dense CPU tensor, borrowed through slot `slot` of [`Held`].
    Dense {
        slot: usize,
        offset: usize,
        rows: usize,
        cols: usize,
    },
}

/// One linear layer of the step: its matrix and its bias on the host.
#[derive(Debug, Clone)]
pub(crate) struct StepLinear {
    source: Source,
    /// Output rows.
    pub(crate) rows: usize,
    /// The bias [rows].
    pub(crate) bias: Option<Vec<f32>>,
}

impl StepLinear {
    /// The kernel view of the matrix, borrowing `held` for dense ones.
    pub(crate) fn view<'a>(&'a self, held: &'a Held<'_>) -> Matrix<'a> {
        match &self.source {
            Source::Mapped(m) => Matrix::Quant(m.view()),
            Source::Dense {
                slot,
                offset,
                rows,
                cols,
            } => {
                let n = rows * cols;
                let data = match &*held.guards[*slot] {
                    Storage::Cpu(CpuStorage::F32(v)) => DenseWeights::F32(&v[*offset..offset + n]),
                    Storage::Cpu(CpuStorage::BF16(v)) => {
                        DenseWeights::Bf16(&v[*offset..offset + n])
                    }
                    Storage::Cpu(CpuStorage::F16(v)) => DenseWeights::F16(&v[*offset..offset + n]),
                    // checked when the step model was built; tensors are immutable
                    _ => unreachable!("a dense step matrix is an f32/bf16/f16 CPU tensor"),
                };
                // the length is rows x cols by construction
                Matrix::Dense(DenseMatrix::new(data, *rows, *cols).expect("rows x cols values"))
            }
        }
    }

    /// Put one output row (file row order) into Hugging Face order in place,
    /// for llama.cpp's permuted Q/K rows; `tmp` is scratch.
    pub(crate) fn unpermute(&self, out: &mut [f32], tmp: &mut Vec<f32>) {
        if let Source::Mapped(m) = &self.source
            && m.is_permuted()
        {
            tmp.clear();
            tmp.extend_from_slice(out);
            m.unpermute_into(tmp, out);
        }
    }

    /// Add the bias to one output row.
    pub(crate) fn add_bias(&self, out: &mut [f32]) {
        if let Some(b) = &self.bias {
            out.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
}

/// One decoder layer of the step.
#[derive(Debug, Clone)]
pub(crate) struct StepLayer {
    pub(crate) input_norm: Option<Vec<f32>>,
    /// Q, K, V (or one fused QKV matrix); none on a linear-attention layer.
    pub(crate) qkv: Vec<StepLinear>,
    /// Whether the query projection also gives each head's output gate
    /// (Qwen3.5's full layers: per head, its queries then its gate).
    pub(crate) output_gate: bool,
    /// A linear-attention layer's input projections, their outputs side by
    /// side (queries, keys and values; the output gate; the learning rates;
    /// the decay steps), and its gated norm's weight; `None` on an
    /// attention layer.
    pub(crate) linear: Option<(Vec<StepLinear>, Vec<f32>)>,
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    /// The K/V heads and head width of the layer's attention (Gemma 4's
    /// differ by layer type; a linear-attention layer's are its value
    /// heads').
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    /// The values are the keys' projection before its norm (`qkv` holds Q
    /// and K only: Gemma 4's full layers with `attention_k_eq_v`).
    pub(crate) values_from_keys: bool,
    /// The unscaled RMSNorm of each value head (ones of `head_dim`), where
    /// the layer norms its values (Gemma 4).
    pub(crate) value_norm: Option<Vec<f32>>,
    /// The layer whose cache this one reads, storing none (`qkv` holds Q
    /// only: Gemma 4's shared layers); `None`: its own.
    pub(crate) kv_source: Option<usize>,
    /// The per-layer input branch (Gemma 4).
    pub(crate) layer_input: Option<StepLayerInput>,
    pub(crate) o: StepLinear,
    pub(crate) attn_out_norm: Option<Vec<f32>>,
    pub(crate) mlp_in_norm: Option<Vec<f32>>,
    /// Gate and up (or one fused matrix, gate rows first); none on a
    /// layer of experts.
    pub(crate) gate_up: Vec<StepLinear>,
    /// The MLP's down matrix; none on a layer of experts.
    pub(crate) down: Option<StepLinear>,
    /// The router and the experts, on a layer of experts.
    pub(crate) experts: Option<StepExperts>,
    /// Each query head's sink logit, where the attention has them.
    pub(crate) sinks: Option<Vec<f32>>,
    pub(crate) mlp_out_norm: Option<Vec<f32>>,
    /// The norm on the dense MLP's output where experts run beside it.
    pub(crate) dense_out_norm: Option<Vec<f32>>,
    pub(crate) activation: GateActivation,
}

impl StepLayer {
    /// The norm at `site`, where the layer has one.
    pub(crate) fn norm(&self, site: Norm) -> Option<&[f32]> {
        match site {
            Norm::Attention => self.input_norm.as_deref(),
            Norm::AttentionOut => self.attn_out_norm.as_deref(),
            Norm::Mlp => self.mlp_in_norm.as_deref(),
            Norm::MlpOut => self.mlp_out_norm.as_deref(),
            Norm::DenseOut => self.dense_out_norm.as_deref(),
        }
    }

    /// The matrices of `product`, their outputs side by side in this order.
    pub(crate) fn product(&self, product: Product) -> &[StepLinear] {
        match product {
            Product::Qkv => &self.qkv,
            Product::AttentionOut => std::slice::from_ref(&self.o),
            Product::GateUp => &self.gate_up,
            Product::Down => self.down.as_slice(),
        }
    }
}

/// Gemma 4's per-layer input branch as the step reads it: the residual
/// stream through `gate` into the input's width, the gate's activation
/// times the row's input for the layer, through `projection`, then `norm`.
#[derive(Debug, Clone)]
pub(crate) struct StepLayerInput {
    pub(crate) gate: StepLinear,
    pub(crate) projection: StepLinear,
    pub(crate) norm: Vec<f32>,
    pub(crate) activation: GateActivation,
}

/// One expert of the step: its gate and up matrices, and its down matrix.
#[derive(Debug, Clone)]
pub(crate) struct StepExpert {
    pub(crate) gate_up: Vec<StepLinear>,
    pub(crate) down: StepLinear,
}

/// A layer's mixture of experts as the step reads it: a token reads the
/// router and only the experts the router chooses for it.
#[derive(Debug, Clone)]
pub(crate) struct StepExperts {
    pub(crate) router: StepLinear,
    pub(crate) experts: Vec<StepExpert>,
    pub(crate) rule: RouterRule,
    /// The expert every token runs, and its gate [1, hidden] (Qwen3.5-MoE).
    pub(crate) shared: Option<(StepExpert, StepLinear)>,
    /// The norms of experts beside the dense MLP (Gemma 4).
    pub(crate) beside: Option<StepBeside>,
}

/// The norms of experts beside the dense MLP as the step reads them: the
/// router's input (unweighted: ones), the experts' input and their output.
#[derive(Debug, Clone)]
pub(crate) struct StepBeside {
    pub(crate) router: Vec<f32>,
    pub(crate) input: Vec<f32>,
    pub(crate) output: Vec<f32>,
}

/// Gemma 4's per-layer inputs as the step makes them: the scaled
/// embeddings through `projection` into every layer's input, each layer's
/// `width` values normed by `norm`.
#[derive(Debug, Clone)]
pub(crate) struct StepLayerInputs {
    pub(crate) projection: StepLinear,
    pub(crate) norm: Vec<f32>,
    pub(crate) width: usize,
}

/// The whole model as the fused step reads it.
#[derive(Debug, Clone)]
pub(crate) struct StepModel {
    pub(crate) layers: Vec<StepLayer>,
    /// The per-layer inputs' model-level weights, where the model has them.
    pub(crate) layer_inputs: Option<StepLayerInputs>,
    pub(crate) final_norm: Vec<f32>,
    pub(crate) lm_head: StepLinear,
    /// The dense tensors, in slot order.
    dense: Vec<Tensor>,
}

/// The read guards of a step model's dense tensors, held for one step.
pub(crate) struct Held<'a> {
    guards: Vec<StorageRef<'a>>,
}

impl StepModel {
    /// Borrow every dense tensor's storage for one step.
    pub(crate) fn hold(&self) -> Held<'_> {
        Held {
            guards: self
                .dense
                .iter()
                .map(|t| t.storage_and_layout().0)
                .collect(),
        }
    }

    /// The step model of `dec`, or why it has none.
    pub(crate) fn build(dec: &Decoder) -> Result<std::result::Result<Self, Unfused>> {
        match Self::try_build(dec) {
            Ok(m) => Ok(Ok(m)),
            Err(Skip::Unfused(u)) => Ok(Err(u)),
            Err(Skip::Failed(e)) => Err(e),
        }
    }

    fn try_build(dec: &Decoder) -> std::result::Result<Self, Skip> {
        if !dec.device.is_cpu() {
            return Err(Skip::Unfused(Unfused::Device));
        }
        let mut b = Builder { dense: Vec::new() };
        let mut layers = Vec::with_capacity(dec.layers.len());
        for layer in &dec.layers {
            let qkv = match layer.attn.qkv_linears() {
                QkvLinears::Separate(q, k, v) => vec![b.linear(q)?, b.linear(k)?, b.linear(v)?],
                QkvLinears::Fused(m) => vec![b.linear(m)?],
                QkvLinears::KeysAsValues(q, k) => vec![b.linear(q)?, b.linear(k)?],
                QkvLinears::QueriesOnly(q) => vec![b.linear(q)?],
                QkvLinears::Recurrent => Vec::new(),
            };
            let head_dim = layer.attn.head_dim();
            let layer_input = match &layer.layer_input {
                Some(branch) => Some(StepLayerInput {
                    gate: b.linear(&branch.gate)?,
                    projection: b.linear(&branch.projection)?,
                    norm: norm(&branch.norm)?,
                    activation: crate::layers::gate_activation(branch.activation),
                }),
                None => None,
            };
            let linear = match &layer.linear {
                Some(net) => Some((
                    net.linears()
                        .into_iter()
                        .map(|m| b.linear(m))
                        .collect::<std::result::Result<Vec<_>, Skip>>()?,
                    net.norm_weight()?,
                )),
                None => None,
            };
            let sinks = layer
                .attn
                .sinks()
                .map(|t| t.to_vec1::<f32>())
                .transpose()
                .map_err(|e| Skip::Failed(e.into()))?;
            let (gate_up, down, experts, activation) = match &layer.mlp {
                FeedForward::Dense(mlp) => (
                    gate_up_of(&mut b, mlp)?,
                    Some(b.linear(mlp.down())?),
                    None,
                    mlp.gate_activation(),
                ),
                FeedForward::Experts(e) => {
                    let activation = match e.experts().first() {
                        Some(m) => m.gate_activation(),
                        None => GateActivation::Silu,
                    };
                    (Vec::new(), None, Some(step_experts(&mut b, e)?), activation)
                }
                FeedForward::DenseAndExperts(mlp, e) => (
                    gate_up_of(&mut b, mlp)?,
                    Some(b.linear(mlp.down())?),
                    Some(step_experts(&mut b, e)?),
                    mlp.gate_activation(),
                ),
            };
            let (q_norm, k_norm) = layer.attn.qk_norms();
            layers.push(StepLayer {
                input_norm: layer.input_norm.as_ref().map(norm).transpose()?,
                qkv,
                output_gate: layer.attn.has_output_gate(),
                linear,
                q_norm: q_norm.map(norm).transpose()?,
                k_norm: k_norm.map(norm).transpose()?,
                kv_heads: layer.attn.num_kv_heads(),
                head_dim,
                values_from_keys: matches!(layer.attn.qkv_linears(), QkvLinears::KeysAsValues(..)),
                value_norm: layer.attn.norms_values().then(|| vec![1.0; head_dim]),
                kv_source: layer.kv_source,
                layer_input,
                o: b.linear(layer.attn.o())?,
                attn_out_norm: layer.attn_out_norm.as_ref().map(norm).transpose()?,
                mlp_in_norm: layer.mlp_in_norm.as_ref().map(norm).transpose()?,
                gate_up,
                down,
                experts,
                sinks,
                mlp_out_norm: layer.mlp_out_norm.as_ref().map(norm).transpose()?,
                dense_out_norm: layer.dense_out_norm.as_ref().map(norm).transpose()?,
                activation,
            });
        }
        let layer_inputs = match &dec.layer_inputs {
            Some(li) => Some(StepLayerInputs {
                projection: b.linear(li.projection())?,
                norm: norm(li.norm())?,
                width: li.width(),
            }),
            None => None,
        };
        Ok(Self {
            layer_inputs,
            lm_head: b.linear(&dec.lm_head)?,
            layers,
            final_norm: norm(&dec.final_norm)?,
            dense: b.dense,
        })
    }
}

/// A layer's experts as the step reads them: the router, every expert, a
/// shared expert with its gate, the norms of a block beside the dense MLP.
fn step_experts(b: &mut Builder, e: &Experts) -> std::result::Result<StepExperts, Skip> {
    let experts = e
        .experts()
        .iter()
        .map(|m| {
            Ok(StepExpert {
                gate_up: gate_up_of(b, m)?,
                down: b.linear(m.down())?,
            })
        })
        .collect::<std::result::Result<Vec<_>, Skip>>()?;
    let shared = match e.shared() {
        Some(s) => Some((
            StepExpert {
                gate_up: gate_up_of(b, &s.mlp)?,
                down: b.linear(s.mlp.down())?,
            },
            b.linear(&s.gate)?,
        )),
        None => None,
    };
    let beside = match e.beside() {
        Some(n) => Some(StepBeside {
            router: norm(&n.router)?,
            input: norm(&n.input)?,
            output: norm(&n.output)?,
        }),
        None => None,
    };
    Ok(StepExperts {
        router: b.linear(e.router())?,
        experts,
        rule: e.rule(),
        shared,
        beside,
    })
}

/// The gate and up matrices of a gated MLP as the step reads them.
fn gate_up_of(b: &mut Builder, mlp: &Mlp) -> std::result::Result<Vec<StepLinear>, Skip> {
    Ok(match mlp.gate_up() {
        GateUpLinears::Separate(g, u) => vec![b.linear(g)?, b.linear(u)?],
        GateUpLinears::Fused(m) => vec![b.linear(m)?],
    })
}

/// Why building stopped: a rule that sends the model down the tensor
/// path, or an error.
enum Skip {
    Unfused(Unfused),
    Failed(ModelError),
}

impl From<ModelError> for Skip {
    fn from(e: ModelError) -> Self {
        Self::Failed(e)
    }
}

impl From<candle_core::Error> for Skip {
    fn from(e: candle_core::Error) -> Self {
        Self::Failed(e.into())
    }
}

/// Collects the dense tensors (slots) while the layers are prepared.
struct Builder {
    dense: Vec<Tensor>,
}

impl Builder {
    /// The step's view of a linear layer, or why the kernels cannot read it.
    fn linear(&mut self, lin: &Linear) -> std::result::Result<StepLinear, Skip> {
        let (source, rows, bias) = match lin {
            Linear::Mapped { matrix, bias } => (
                Source::Mapped(matrix.clone()),
                matrix.dims().0,
                bias.as_ref(),
            ),
            Linear::Dense(l) => self.dense(l.weight(), l.bias())?,
            // a float matrix of a GGUF (F32, F16, BF16), which candle
            // holds dequantized
            Linear::Quantized {
                matmul: QMatMul::Tensor(w) | QMatMul::TensorF16(w),
                bias,
            } => self.dense(w, bias.as_ref())?,
            Linear::Quantized { .. } => return Err(Skip::Unfused(Unfused::CandleQuantized)),
            Linear::Adapted(_) => return Err(Skip::Unfused(Unfused::OnTheFlyLora)),
        };
        let bias = bias
            .map(|b| b.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>())
            .transpose()?;
        Ok(StepLinear { source, rows, bias })
    }

    /// A dense matrix `w` [rows, cols] and its bias, borrowed through a new
    /// slot, or why the kernels cannot read it in place.
    fn dense<'t>(
        &mut self,
        w: &Tensor,
        bias: Option<&'t Tensor>,
    ) -> std::result::Result<(Source, usize, Option<&'t Tensor>), Skip> {
        let (rows, cols) = w.dims2()?;
        let ok_dtype = matches!(w.dtype(), DType::F32 | DType::BF16 | DType::F16);
        if !w.device().is_cpu() || !w.is_contiguous() || !ok_dtype {
            return Err(Skip::Unfused(Unfused::DenseStorage));
        }
        let offset = w.storage_and_layout().1.start_offset();
        self.dense.push(w.clone());
        let source = Source::Dense {
            slot: self.dense.len() - 1,
            offset,
            rows,
            cols,
        };
        Ok((source, rows, bias))
    }
}

/// A norm's scale on the host, in f32.
fn norm(n: &RmsNorm) -> Result<Vec<f32>> {
    Ok(n.weight().to_dtype(DType::F32)?.to_vec1::<f32>()?)
}
