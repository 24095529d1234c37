//! The building blocks of one decoder layer: RMSNorm, the gated MLP and the
//! attention projections, each loaded with the architecture's switches.

use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor};

use crate::config::{Activation, Arch, ExpertsConfig, ModelConfig, QkNorm, RouterKind};
use crate::error::Result;
use crate::linear::{Embedding, Linear};
use crate::rope::Rope;
use crate::weights::WeightSource;

/// Loads tensors of one model with the config's dtype and device.
pub(crate) struct Loader<'a> {
    pub files: &'a dyn WeightSource,
    pub cfg: &'a ModelConfig,
    pub dtype: DType,
    pub device: &'a Device,
    /// Keep matrices in their stored (ggml) type where the source has one.
    pub quantized: bool,
}

impl Loader<'_> {
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.files.load(name, shape, self.dtype, self.device)
    }

    /// A matrix [out, in] and its bias: quantized when asked and stored so.
    pub fn linear(&self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        self.linear_packed(prefix, (out, inp), bias, Packing::AtLoad)
    }

    /// [`Self::linear`], a matrix read in place packed `when`.
    pub fn linear_packed(
        &self,
        prefix: &str,
        (out, inp): (usize, usize),
        bias: bool,
        when: Packing,
    ) -> Result<Linear> {
        let name = format!("{prefix}.weight");
        let b = if bias {
            Some(self.tensor(&format!("{prefix}.bias"), &[out])?)
        } else {
            None
        };
        if self.quantized
            && let Some(m) = self.files.load_mapped(&name, &[out, inp], self.device)?
        {
            if !crate::mapped::packs_at_load() {
                return Ok(Linear::mapped(m, b));
            }
            let m = match when {
                Packing::AtLoad => {
                    m.pack()?;
                    m
                }
                Packing::OnFirstUse => m.packed_on_first_use(),
            };
            return Ok(Linear::mapped(m, b));
        }
        if let Some(q) = self.quantized_tensor(&name, &[out, inp])? {
            return Linear::quantized(Arc::new(q), b);
        }
        Ok(Linear::dense(self.tensor(&name, &[out, inp])?, b))
    }

    /// The token embeddings [vocab, hidden]: quantized when asked and stored so.
    pub fn embedding(&self, name: &str, vocab: usize, hidden: usize) -> Result<Embedding> {
        if self.quantized
            && let Some(m) = self
                .files
                .load_mapped(name, &[vocab, hidden], self.device)?
        {
            return Ok(Embedding::Mapped(m));
        }
        if let Some(q) = self.quantized_tensor(name, &[vocab, hidden])? {
            return Ok(Embedding::Quantized(Arc::new(q)));
        }
        Ok(Embedding::Dense(self.tensor(name, &[vocab, hidden])?))
    }

    fn quantized_tensor(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        if !self.quantized {
            return Ok(None);
        }
        self.files.load_quantized(name, shape, self.device)
    }

    /// The RMSNorm at `name` over `width` values, its weight offset from
    /// one where the model's norms are (1 + w).
    pub fn norm(&self, name: &str, width: usize) -> Result<RmsNorm> {
        let norm = self.plain_norm(name, width)?;
        Ok(match self.cfg.norm_weight_offset {
            true => RmsNorm {
                weight: (&norm.weight + 1.0)?,
                offset_from: Some(norm.weight),
                ..norm
            },
            false => norm,
        })
    }

    /// The RMSNorm at `name` over `width` values whose weight is plain `w`
    /// whatever the model's other norms are (Qwen3.5's gated norm).
    pub fn plain_norm(&self, name: &str, width: usize) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.tensor(&format!("{name}.weight"), &[width])?,
            offset_from: None,
            eps: self.cfg.rms_norm_eps as f32,
        })
    }

    /// An RMSNorm over `width` values with no learned weight (ones): Gemma
    /// 4's value norm and its router's input norm.
    pub fn unweighted_norm(&self, width: usize) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: Tensor::ones(width, self.dtype, self.device)?,
            offset_from: None,
            eps: self.cfg.rms_norm_eps as f32,
        })
    }
}

/// When a matrix read in place from a GGUF file is packed into the kernels'
/// interleaved layout (on CPUs where they read it faster).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packing {
    /// When the model loads.
    AtLoad,
    /// When a product first reads it (experts).
    OnFirstUse,
}

/// RMSNorm over the last dimension (weights already offset for (1 + w) norms).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    /// A (1 + w) norm's `w` as the weights hold it: a training pass adds
    /// the one at every call, so that it sees an optimizer's updates to `w`
    /// (`weight` was made from it once, when the model loaded).
    offset_from: Option<Tensor>,
    eps: f32,
}

impl RmsNorm {
    /// The scale vector (offset already applied).
    pub(crate) fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Normalise `x` over its last dimension. When `x` or the scale
    /// carries gradients (a training pass) the norm is one op with its own
    /// backward on the CPU in f32, and made of ops candle can differentiate
    /// elsewhere (candle's fused kernel has no backward); the same values
    /// every way, within rounding.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.track_op() || self.weight.track_op() {
            let weight = match &self.offset_from {
                Some(w) => (w + 1.0)?,
                None => self.weight.clone(),
            };
            if crate::grad_ops::takes(x) && crate::grad_ops::takes(&weight) {
                return Ok(crate::grad_ops::rms_norm(x, &weight, self.eps)?);
            }
            let var = x.sqr()?.mean_keepdim(D::Minus1)?;
            let normed = x.broadcast_div(&(var + f64::from(self.eps))?.sqrt()?)?;
            return Ok(normed.broadcast_mul(&weight)?);
        }
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight,
            self.eps,
        )?)
    }
}

/// The gated MLP: down(act(gate(x)) * up(x)), gate/up possibly fused.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_up: GateUp,
    down: Linear,
    activation: Activation,
}

#[derive(Debug, Clone)]
enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused { gate_up: Linear, inner: usize },
}

/// The MLP's input matrices, as the model stores them.
pub(crate) enum GateUpLinears<'a> {
    /// Gate and up apart.
    Separate(&'a Linear, &'a Linear),
    /// One matrix: gate rows, then up rows.
    Fused(&'a Linear),
}

impl Mlp {
    /// The gate and up matrices.
    pub(crate) fn gate_up(&self) -> GateUpLinears<'_> {
        match &self.gate_up {
            GateUp::Separate { gate, up } => GateUpLinears::Separate(gate, up),
            GateUp::Fused { gate_up, .. } => GateUpLinears::Fused(gate_up),
        }
    }

    /// The down matrix.
    pub(crate) fn down(&self) -> &Linear {
        &self.down
    }

    /// The dense MLP at `prefix` of inner width `i`.
    pub(crate) fn load(ld: &Loader<'_>, prefix: &str, i: usize) -> Result<Self> {
        let d = ld.cfg.hidden_size;
        if !ld.cfg.fused_gate_up {
            return Self::load_named(
                ld,
                prefix,
                ["gate_proj", "up_proj", "down_proj"],
                (i, Packing::AtLoad, false),
            );
        }
        // Phi-3: gate and up in one matrix
        Ok(Self {
            gate_up: GateUp::Fused {
                gate_up: ld.linear(&format!("{prefix}.gate_up_proj"), 2 * i, d, false)?,
                inner: i,
            },
            down: ld.linear(&format!("{prefix}.down_proj"), d, i, false)?,
            activation: ld.cfg.activation,
        })
    }

    /// A gated MLP of inner width `inner` whose gate, up and down matrices
    /// are `prefix.{names}` (an expert: `gate_proj`... or Mixtral's `w1`,
    /// `w3`, `w2`), packed `when`, each with a bias where `bias` (gpt-oss's
    /// experts in a GGUF file).
    pub(crate) fn load_named(
        ld: &Loader<'_>,
        prefix: &str,
        [gate, up, down]: [&str; 3],
        (inner, when, bias): (usize, Packing, bool),
    ) -> Result<Self> {
        let d = ld.cfg.hidden_size;
        let linear =
            |name: &str, shape| ld.linear_packed(&format!("{prefix}.{name}"), shape, bias, when);
        Ok(Self {
            gate_up: GateUp::Separate {
                gate: linear(gate, (inner, d))?,
                up: linear(up, (inner, d))?,
            },
            down: linear(down, (d, inner))?,
            activation: ld.cfg.activation,
        })
    }

    /// A gated MLP of given gate, up and down matrices (gpt-oss's experts,
    /// cut out of their stacked tensors).
    pub(crate) fn from_parts(
        gate: Linear,
        up: Linear,
        down: Linear,
        activation: Activation,
    ) -> Self {
        Self {
            gate_up: GateUp::Separate { gate, up },
            down,
            activation,
        }
    }

    /// The MLP of `x` [n, hidden]: down(act(gate(x)) * up(x)).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (gate, up) = self.gate_up_of(x)?;
        self.down.forward(&self.gated(&gate, &up)?)
    }

    /// Bytes of the MLP's matrices (and biases' where they count them).
    pub fn bytes(&self) -> usize {
        self.linears().into_iter().map(Linear::bytes).sum()
    }

    /// The MLP's linear layers.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut out = match &self.gate_up {
            GateUp::Separate { gate, up } => vec![gate, up],
            GateUp::Fused { gate_up, .. } => vec![gate_up],
        };
        out.push(&self.down);
        out
    }

    /// The MLP's linear layers by module name, for adapters.
    pub(crate) fn named_linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = match &mut self.gate_up {
            GateUp::Separate { gate, up } => vec![("gate_proj", gate), ("up_proj", up)],
            GateUp::Fused { gate_up, .. } => vec![("gate_up_proj", gate_up)],
        };
        out.push(("down_proj", &mut self.down));
        out
    }

    /// The gate and up halves [n, inner] each of the MLP's input `x` [n, hidden].
    pub(crate) fn gate_up_of(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok(match &self.gate_up {
            GateUp::Separate { gate, up } => (gate.forward(x)?, up.forward(x)?),
            GateUp::Fused { gate_up, inner } => {
                let gu = gate_up.forward(x)?;
                (
                    gu.narrow(D::Minus1, 0, *inner)?,
                    gu.narrow(D::Minus1, *inner, *inner)?,
                )
            }
        })
    }

    /// The kernels' form of the gated activation.
    pub(crate) fn gate_activation(&self) -> lcut_kernels::ops::GateActivation {
        gate_activation(self.activation)
    }

    /// The gated activation: the gate's activation times the up half.
    pub(crate) fn gated(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        gated(self.activation, gate, up)
    }
}

/// The host kernels' name of `activation`.
pub(crate) fn gate_activation(activation: Activation) -> lcut_kernels::ops::GateActivation {
    use lcut_kernels::ops::GateActivation as G;
    match activation {
        Activation::Silu => G::Silu,
        Activation::GeluTanh => G::GeluTanh,
        Activation::ClampedSwiGlu { limit, alpha } => G::ClampedSwiGlu { limit, alpha },
    }
}

/// The gated activation under `activation`: the gate's activation times the
/// up half (the MLP's; Gemma 4's per-layer input branch's too). f32 on the
/// CPU where no gradient flows (prefill, the tensor path's experts), the
/// kernels' vectorized form, as the decode step runs it (libm's `tanh` and
/// `exp` once per value were a quarter of Gemma 4 E2B's prefill); candle's
/// elsewhere, which training differentiates.
pub(crate) fn gated(activation: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let on_host = gate.device().is_cpu() && gate.dtype() == DType::F32 && up.dtype() == DType::F32;
    if on_host && !gate.track_op() && !up.track_op() && gate.dims() == up.dims() {
        return host_gated(gate_activation(activation), gate, up);
    }
    {
        let act = match activation {
            Activation::Silu => candle_nn::ops::silu(gate)?,
            Activation::GeluTanh => gate.gelu()?,
            Activation::ClampedSwiGlu { limit, alpha } => {
                let limit = f64::from(limit);
                let gate = gate.minimum(limit)?;
                let up = up.clamp(-limit, limit)?;
                let glu = (&gate * candle_nn::ops::sigmoid(&(&gate * f64::from(alpha))?)?)?;
                return Ok(((up + 1.0)? * glu)?);
            }
        };
        Ok((act * up)?)
    }
}

/// [`gated`] on the host: the kernels' gate over both halves' values, in
/// slices of `HOST_GATE_SLICE` across the threads (the same bits wherever a
/// value sits).
fn host_gated(
    act: lcut_kernels::ops::GateActivation,
    gate: &Tensor,
    up: &Tensor,
) -> Result<Tensor> {
    use rayon::prelude::*;
    const HOST_GATE_SLICE: usize = 1 << 14;
    let mut values = gate.flatten_all()?.to_vec1::<f32>()?;
    let ups = up.flatten_all()?.to_vec1::<f32>()?;
    values
        .par_chunks_mut(HOST_GATE_SLICE)
        .zip(ups.par_chunks(HOST_GATE_SLICE))
        .try_for_each(|(g, u)| lcut_kernels::ops::gate_in_place(g, u, act))?;
    Ok(Tensor::from_vec(values, gate.shape(), gate.device())?)
}

/// A mixture of experts in place of the MLP: the router's softmax over the
/// experts, the `top_k` most probable run on each row (their
/// probabilities renormalised when the model says so), their outputs
/// summed with those weights.
#[derive(Debug, Clone)]
pub struct Experts {
    router: Linear,
    experts: Vec<Mlp>,
    rule: RouterRule,
    /// The expert every token runs beside the routed ones (Qwen3.5-MoE).
    shared: Option<Box<SharedExpert>>,
    /// What a block beside the dense MLP reads and writes (Gemma 4).
    beside: Option<Box<BesideNorms>>,
    /// The experts' matrices stacked, where the experts run on a device
    /// other than the CPU and every matrix is dense (the experts' own
    /// layers are views into it).
    stacked: Option<Box<StackedExperts>>,
}

/// The norms of an experts block that runs beside the layer's dense MLP
/// (Gemma 4): the router reads the residual stream through `router` (no
/// weight; the learned scale and 1/sqrt(hidden) are folded into the
/// router's matrix: [`BesideNorms::router_matrix`]), the experts read it
/// through `input` (`pre_feedforward_layernorm_2`), and their weighted sum
/// leaves through `output` (`post_feedforward_layernorm_2`). Each chosen
/// expert's weight is scaled by its entry of `expert_scale`
/// (`router.per_expert_scale`).
#[derive(Debug, Clone)]
pub(crate) struct BesideNorms {
    pub(crate) router: RmsNorm,
    pub(crate) input: RmsNorm,
    pub(crate) output: RmsNorm,
    /// `router.proj` dense, as the weights gave it.
    proj: Tensor,
    /// `router.scale` [hidden] in f32, as the weights gave it.
    scale: Tensor,
    /// `router.per_expert_scale` [experts] in f32, as the weights gave it
    /// (the router rule holds a host copy).
    pub(crate) expert_scale: Tensor,
    /// The model's dtype, the folded matrix's.
    dtype: DType,
}

impl BesideNorms {
    /// The router's matrix with its scale and 1/sqrt(hidden) folded into
    /// each column, in the model's dtype. The tensor path folds it from
    /// the weights at each call (a few thousand products), not once as the
    /// model loads, so that a trainer's updates to `router.proj` and
    /// `router.scale` reach the forward and its gradients reach them; the
    /// same arithmetic each time, so the same bits as the fold the fused
    /// step reads.
    pub(crate) fn router_matrix(&self) -> Result<Tensor> {
        let root = (self.scale.elem_count() as f64).powf(-0.5);
        let scale = (&self.scale * root)?;
        Ok(self
            .proj
            .broadcast_mul(&scale.unsqueeze(0)?)?
            .to_dtype(self.dtype)?)
    }
}

/// An expert every token runs beside the routed ones, its output scaled by
/// the sigmoid of its own gate (Qwen3.5-MoE's `mlp.shared_expert` and
/// `mlp.shared_expert_gate`).
#[derive(Debug, Clone)]
pub(crate) struct SharedExpert {
    /// The gated MLP.
    pub(crate) mlp: Mlp,
    /// The gate: one logit per row [1, hidden].
    pub(crate) gate: Linear,
}

impl SharedExpert {
    /// The scaled output of rows `x` [n, hidden]: sigmoid(gate(x)) * mlp(x).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let scale = candle_nn::ops::sigmoid(&self.gate.forward(x)?)?;
        Ok(self.mlp.forward(x)?.broadcast_mul(&scale)?)
    }
}

/// How a router's logits choose a token's experts and weigh them: the one
/// rule the tensor path and the fused step both follow.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouterRule {
    /// Softmax then top-k, or top-k then softmax.
    kind: RouterKind,
    /// Experts each token runs.
    top_k: usize,
    /// The top-k probabilities renormalised to sum to one.
    normalize: bool,
    /// Each expert's learned scale of its weight, applied after the
    /// renormalisation (Gemma 4's `per_expert_scale`).
    scale: Option<std::sync::Arc<[f32]>>,
}

impl RouterRule {
    /// The rule `e` describes, each chosen expert's weight times its
    /// entry of `scale` where the model learns one (Gemma 4).
    fn of(e: &ExpertsConfig, scale: Option<std::sync::Arc<[f32]>>) -> Self {
        Self {
            kind: e.router,
            top_k: e.top_k,
            normalize: e.normalize_top_k,
            scale,
        }
    }

    /// One row's routing from its router logits: the softmax over every
    /// expert; the `top_k` most probable (ties to the lower index, as
    /// torch's topk), their probabilities renormalised where the model
    /// does; or, for gpt-oss, the `top_k` largest logits with a softmax
    /// over them only (the same experts: the softmax keeps the logits'
    /// order).
    pub(crate) fn choose(&self, logits: &[f32]) -> (Vec<f32>, Vec<usize>, Vec<f32>) {
        let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<f32> = logits.iter().map(|z| (z - top).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        order.truncate(self.top_k);
        let mut weights: Vec<f32> = order.iter().map(|&i| probs[i]).collect();
        if self.normalize || self.kind == RouterKind::TopKSoftmax {
            let sum: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|v| *v /= sum);
        }
        if let Some(scale) = &self.scale {
            for (w, &e) in weights.iter_mut().zip(&order) {
                *w *= scale.get(e).copied().unwrap_or(1.0);
            }
        }
        (probs, order, weights)
    }
}

/// gpt-oss's experts, stored stacked: `gate_up_proj` [experts, hidden,
/// 2 inner] (gate and up interleaved, even and odd columns) and
/// `down_proj` [experts, inner, hidden] (both input-major), each with a
/// bias [experts, width]; cut into one gated MLP per expert.
fn stacked_experts(ld: &Loader<'_>, prefix: &str, e: ExpertsConfig) -> Result<Vec<Mlp>> {
    let (n, d, i) = (e.num_experts, ld.cfg.hidden_size, e.inner);
    let gate_up = ld.tensor(&format!("{prefix}.gate_up_proj"), &[n, d, 2 * i])?;
    let gate_up_bias = ld.tensor(&format!("{prefix}.gate_up_proj_bias"), &[n, 2 * i])?;
    let down = ld.tensor(&format!("{prefix}.down_proj"), &[n, i, d])?;
    let down_bias = ld.tensor(&format!("{prefix}.down_proj_bias"), &[n, d])?;
    // [n, d, i, 2]: column 2j + 0 of the gate, 2j + 1 of the up half
    let gate_up = gate_up.reshape((n, d, i, 2))?;
    let gate_up_bias = gate_up_bias.reshape((n, i, 2))?;
    (0..n)
        .map(|x| {
            let half = |part: usize| -> Result<Linear> {
                let w = gate_up
                    .get(x)?
                    .narrow(2, part, 1)?
                    .squeeze(2)?
                    .t()?
                    .contiguous()?;
                let b = gate_up_bias
                    .get(x)?
                    .narrow(1, part, 1)?
                    .squeeze(1)?
                    .contiguous()?;
                Ok(Linear::dense(w, Some(b)))
            };
            let down = Linear::dense(
                down.get(x)?.t()?.contiguous()?,
                Some(down_bias.get(x)?.contiguous()?),
            );
            Ok(Mlp::from_parts(half(0)?, half(1)?, down, ld.cfg.activation))
        })
        .collect()
}

/// The environment variable that, set to `0`, keeps a GPU's experts
/// unstacked: each chosen expert then runs its own kernels, as on the CPU.
pub const STACKED_EXPERTS_VAR: &str = "LCUT_STACKED_EXPERTS";

/// The largest expert (its three matrices' bytes) whose matrices a device
/// stacks. The gathered products copy the chosen experts' matrices before
/// reading them, three times the bytes of running each alone, to save
/// about six kernels an expert: on an H200 that won a Qwen3-30B-A3B decode
/// step 16% (9.4 MB experts, 8 chosen) and tied gpt-oss-20b's (50 MB, 4
/// chosen); Mixtral's (352 MB, 2 chosen) would only pay the copy.
pub(crate) const STACKED_EXPERT_MAX_BYTES: usize = 32 << 20;

/// Every expert's gate, up and down matrices as one tensor each (see
/// [`Experts::stacked`]).
#[derive(Debug, Clone)]
struct StackedExperts {
    gate: StackedLinear,
    up: StackedLinear,
    down: StackedLinear,
    /// The experts' gated activation (all share it).
    activation: Activation,
}

/// One matrix of every expert: weights [experts, out, in] and biases
/// [experts, out].
#[derive(Debug, Clone)]
struct StackedLinear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl StackedLinear {
    /// `layers` stacked, or `None` where their shapes or biases differ.
    fn stack(layers: &[&candle_nn::Linear]) -> Result<Option<Self>> {
        let shape = layers.first().map(|l| l.weight().shape().clone());
        let alike = |l: &&candle_nn::Linear| Some(l.weight().shape().clone()) == shape;
        if !layers.iter().all(alike) {
            return Ok(None);
        }
        let weights: Vec<Tensor> = layers.iter().map(|l| l.weight().clone()).collect();
        let biases: Option<Vec<Tensor>> = layers.iter().map(|l| l.bias().cloned()).collect();
        let bias = match biases {
            Some(b) => Some(Tensor::stack(&b, 0)?),
            None if layers.iter().any(|l| l.bias().is_some()) => return Ok(None),
            None => None,
        };
        Ok(Some(Self {
            weight: Tensor::stack(&weights, 0)?,
            bias,
        }))
    }

    /// Expert `e`'s layer, a view into the stack.
    fn layer(&self, e: usize) -> Result<Linear> {
        let bias = self.bias.as_ref().map(|b| b.get(e)).transpose()?;
        Ok(Linear::dense(self.weight.get(e)?, bias))
    }

    /// `x W^T (+ b)` of every expert's inputs [experts, rows, in] under its
    /// own matrix: [experts, rows, out].
    fn product_all(&self, input: &Tensor) -> Result<Tensor> {
        let y = input.matmul(&self.weight.transpose(1, 2)?)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(&b.unsqueeze(1)?)?,
            None => y,
        })
    }

    /// `x W^T (+ b)` of each input [m, 1, in] under the matrix of its
    /// expert in `experts` [m] (gathered from the stack): [m, 1, out].
    fn product(&self, experts: &Tensor, input: &Tensor) -> Result<Tensor> {
        let gathered = Self {
            weight: self.weight.index_select(experts, 0)?,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.index_select(experts, 0))
                .transpose()?,
        };
        gathered.product_all(input)
    }
}

/// How many times a batch's (row, expert) pairs the padded products may
/// compute (each expert's rows padded to the busiest expert's count) before
/// a chunk runs each expert alone instead.
const PADDED_WASTE: usize = 2;

impl StackedExperts {
    /// The output of rows `x` [n, hidden] routed by `routing` on the stacks,
    /// or `None` where neither way fits (each expert then runs its own
    /// kernels over its rows). Both run about ten kernels a block however
    /// many experts run, where one kernel per expert made a GPU wait on
    /// launches: while the (row, expert) pairs are no more than the experts
    /// (a decode step), [`Self::gathered`]; else, while padding every
    /// expert's rows to the busiest's costs at most [`PADDED_WASTE`] times
    /// the pairs, [`Self::padded`].
    fn forward(&self, x: &Tensor, routing: &Routing) -> Result<Option<Tensor>> {
        let experts = self.gate.weight.dim(0)?;
        let mut counts = vec![0usize; experts];
        for &e in routing.experts.iter().flatten() {
            *counts
                .get_mut(e)
                .ok_or(crate::error::ModelError::LayerProgram {
                    what: "a routed expert past the layer's experts",
                })? += 1;
        }
        let pairs: usize = counts.iter().sum();
        let busiest = counts.iter().copied().max().unwrap_or(0);
        if pairs <= experts {
            return self.gathered(x, routing).map(Some);
        }
        if experts * busiest > PADDED_WASTE * pairs {
            return Ok(None);
        }
        self.padded(x, routing, busiest).map(Some)
    }

    /// Every (row, chosen expert) pair's matrices gathered from the stacks,
    /// the gate, up and down run as three batched products, each pair's
    /// output weighted and added into its row. It copies the chosen
    /// matrices, so it is for a few rows.
    fn gathered(&self, x: &Tensor, routing: &Routing) -> Result<Tensor> {
        let (n, d) = x.dims2()?;
        let mut indices = Vec::new();
        let mut rows = Vec::new();
        let mut weights = Vec::new();
        for (r, (chosen, w)) in routing.experts.iter().zip(&routing.weights).enumerate() {
            for (&e, &w) in chosen.iter().zip(w) {
                indices.push(e as u32);
                rows.push(r as u32);
                weights.push(w);
            }
        }
        let m = indices.len();
        if m == 0 {
            return Ok(x.zeros_like()?);
        }
        // one upload of the indices (each waits for the device's queue):
        // the experts, then their rows
        indices.extend_from_slice(&rows);
        let indices = Tensor::from_vec(indices, 2 * m, x.device())?;
        let (experts, rows) = (indices.narrow(0, 0, m)?, indices.narrow(0, m, m)?);
        let weights = Tensor::from_vec(weights, (m, 1), x.device())?.to_dtype(x.dtype())?;
        let inputs = match n {
            1 => x.broadcast_as((m, d))?.contiguous()?,
            _ => x.index_select(&rows, 0)?,
        }
        .unsqueeze(1)?;
        let gate = self.gate.product(&experts, &inputs)?;
        let up = self.up.product(&experts, &inputs)?;
        let hidden = gated(self.activation, &gate, &up)?;
        let y = self.down.product(&experts, &hidden)?.squeeze(1)?;
        let y = y.broadcast_mul(&weights)?;
        Ok(match n {
            1 => y.sum_keepdim(0)?,
            _ => x.zeros_like()?.index_add(&rows, &y, 0)?,
        })
    }

    /// Every expert over its rows at once: expert `e`'s rows (ascending)
    /// fill slots `e * busiest..`, the rest of its slots pointing at a zero
    /// row past `x`'s; the stacks' three products batched over the experts,
    /// reading each expert's matrices once and copying none; each slot's
    /// output weighted (zero for padding) and added into its row.
    fn padded(&self, x: &Tensor, routing: &Routing, busiest: usize) -> Result<Tensor> {
        let (n, d) = x.dims2()?;
        let experts = self.gate.weight.dim(0)?;
        let slots = experts * busiest;
        let mut rows = vec![n as u32; slots];
        let mut weights = vec![0f32; slots];
        let mut filled = vec![0usize; experts];
        for (r, (chosen, w)) in routing.experts.iter().zip(&routing.weights).enumerate() {
            for (&e, &w) in chosen.iter().zip(w) {
                let slot = e * busiest + filled[e];
                rows[slot] = r as u32;
                weights[slot] = w;
                filled[e] += 1;
            }
        }
        let rows = Tensor::from_vec(rows, slots, x.device())?;
        let weights = Tensor::from_vec(weights, (slots, 1), x.device())?.to_dtype(x.dtype())?;
        let with_zero = Tensor::cat(&[x, &x.narrow(0, 0, 1)?.zeros_like()?], 0)?;
        let inputs = with_zero
            .index_select(&rows, 0)?
            .reshape((experts, busiest, d))?;
        let gate = self.gate.product_all(&inputs)?;
        let up = self.up.product_all(&inputs)?;
        let hidden = gated(self.activation, &gate, &up)?;
        let y = self.down.product_all(&hidden)?.reshape((slots, d))?;
        let y = y.broadcast_mul(&weights)?;
        let out = with_zero.zeros_like()?.index_add(&rows, &y, 0)?;
        Ok(out.narrow(0, 0, n)?)
    }
}

/// Which experts each row runs and with what weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Per row, the router's probability of every expert (its softmax).
    pub probs: Vec<Vec<f32>>,
    /// Per row, the chosen experts, most probable first.
    pub experts: Vec<Vec<usize>>,
    /// Per row, their weights (renormalised where the model does).
    pub weights: Vec<Vec<f32>>,
}

impl Experts {
    /// The experts of the layer at `prefix` (`{prefix}.mlp` for Qwen3-MoE
    /// and gpt-oss, `{prefix}.block_sparse_moe` for Mixtral).
    pub(crate) fn load(ld: &Loader<'_>, layer_prefix: &str) -> Result<Self> {
        let cfg = ld.cfg;
        let e = cfg.experts.ok_or(crate::error::ModelError::LayerProgram {
            what: "the experts of a model without experts",
        })?;
        if e.beside_mlp {
            return Self::load_beside(ld, layer_prefix, e);
        }
        let (block, router, names) = match cfg.arch {
            Arch::Mixtral => ("block_sparse_moe", "gate", ["w1", "w3", "w2"]),
            Arch::GptOss => ("mlp", "router", ["gate_proj", "up_proj", "down_proj"]),
            _ => ("mlp", "gate", ["gate_proj", "up_proj", "down_proj"]),
        };
        let prefix = format!("{layer_prefix}.{block}");
        let router = ld.linear(
            &format!("{prefix}.{router}"),
            e.num_experts,
            cfg.hidden_size,
            e.bias,
        )?;
        // gpt-oss's Hugging Face checkpoints stack the experts; its GGUF
        // files hold them as the others' are (`ffn_gate_exps`... with biases)
        let stacked = format!("{prefix}.experts.gate_up_proj");
        let experts = match cfg.arch {
            Arch::GptOss if ld.files.contains(&stacked) => {
                stacked_experts(ld, &format!("{prefix}.experts"), e)?
            }
            _ => (0..e.num_experts)
                .map(|i| {
                    let prefix = format!("{prefix}.experts.{i}");
                    let how = (e.inner, Packing::OnFirstUse, e.bias);
                    Mlp::load_named(ld, &prefix, names, how)
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let shared = match e.shared_inner {
            Some(inner) => Some(Box::new(SharedExpert {
                mlp: Mlp::load_named(
                    ld,
                    &format!("{prefix}.shared_expert"),
                    ["gate_proj", "up_proj", "down_proj"],
                    (inner, Packing::AtLoad, false),
                )?,
                gate: ld.linear(
                    &format!("{prefix}.shared_expert_gate"),
                    1,
                    cfg.hidden_size,
                    false,
                )?,
            })),
            None => None,
        };
        Self {
            router,
            experts,
            rule: RouterRule::of(&e, None),
            shared,
            beside: None,
            stacked: None,
        }
        .stacked_on(ld.device)
    }

    /// Gemma 4's experts of the layer at `prefix`, beside its dense MLP:
    /// the router `router.proj` with its `router.scale` (and 1/sqrt(hidden))
    /// folded in and its `router.per_expert_scale`, the experts stacked
    /// (`experts.gate_up_proj` [experts, 2 inner, hidden], gate rows first;
    /// `experts.down_proj` [experts, hidden, inner]), and the branch's
    /// norms.
    fn load_beside(ld: &Loader<'_>, prefix: &str, e: ExpertsConfig) -> Result<Self> {
        let (n, d, i) = (e.num_experts, ld.cfg.hidden_size, e.inner);
        // dense (a GGUF's router is read dequantized), its scales folded
        // in for the fused step and inference; the tensor path folds them
        // at each call from the weights themselves
        let router = ld.linear(&format!("{prefix}.router.proj"), n, d, false)?;
        let (proj, _) = crate::linear::dense_parts(&router)?;
        let scale = ld
            .tensor(&format!("{prefix}.router.scale"), &[d])?
            .to_dtype(DType::F32)?;
        let expert_scale = ld
            .tensor(&format!("{prefix}.router.per_expert_scale"), &[n])?
            .to_dtype(DType::F32)?;
        let per_expert = expert_scale.to_vec1::<f32>()?;
        // a GGUF kept quantized: each expert's matrices read in place (its
        // gate and up halves of llama.cpp's fused `ffn_gate_up_exps`)
        let one_by_one = format!("{prefix}.experts.0.gate_proj.weight");
        let experts = if ld.quantized && ld.files.contains(&one_by_one) {
            (0..n)
                .map(|x| {
                    let names = ["gate_proj", "up_proj", "down_proj"];
                    let how = (i, Packing::OnFirstUse, false);
                    Mlp::load_named(ld, &format!("{prefix}.experts.{x}"), names, how)
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Self::stacked_beside(ld, prefix, (n, d, i))?
        };
        let beside = BesideNorms {
            router: ld.unweighted_norm(d)?,
            input: ld.norm(&format!("{prefix}.pre_feedforward_layernorm_2"), d)?,
            output: ld.norm(&format!("{prefix}.post_feedforward_layernorm_2"), d)?,
            proj,
            scale,
            expert_scale,
            dtype: ld.dtype,
        };
        Self {
            router: Linear::dense(beside.router_matrix()?, None),
            experts,
            rule: RouterRule::of(&e, Some(per_expert.into())),
            shared: None,
            beside: Some(Box::new(beside)),
            stacked: None,
        }
        .stacked_on(ld.device)
    }

    /// Gemma 4's stacked experts as dense matrices: `experts.gate_up_proj`
    /// [experts, 2 inner, hidden] (each expert's gate rows first) and
    /// `experts.down_proj` [experts, hidden, inner].
    fn stacked_beside(
        ld: &Loader<'_>,
        prefix: &str,
        (n, d, i): (usize, usize, usize),
    ) -> Result<Vec<Mlp>> {
        let gate_up = ld.tensor(&format!("{prefix}.experts.gate_up_proj"), &[n, 2 * i, d])?;
        let down = ld.tensor(&format!("{prefix}.experts.down_proj"), &[n, d, i])?;
        (0..n)
            .map(|x| {
                let gate_up = gate_up.get(x)?;
                let half = |part: usize| -> Result<Linear> {
                    Ok(Linear::dense(
                        gate_up.narrow(0, part * i, i)?.contiguous()?,
                        None,
                    ))
                };
                let down = Linear::dense(down.get(x)?.contiguous()?, None);
                Ok(Mlp::from_parts(half(0)?, half(1)?, down, ld.cfg.activation))
            })
            .collect()
    }

    /// `self` with its experts' matrices stacked where they run on `device`
    /// not the CPU, an expert's matrices hold at most
    /// [`STACKED_EXPERT_MAX_BYTES`] and [`STACKED_EXPERTS_VAR`] is not `0`.
    fn stacked_on(self, device: &Device) -> Result<Self> {
        let off = std::env::var(STACKED_EXPERTS_VAR).is_ok_and(|v| v == "0");
        if device.is_cpu() || off {
            // before any size is asked: a CPU's experts read in place are
            // packed by the first question about their bytes
            return Ok(self);
        }
        match self.experts.first().map_or(0, Mlp::bytes) > STACKED_EXPERT_MAX_BYTES {
            true => Ok(self),
            false => self.stacked(),
        }
    }

    /// `self` with its experts' matrices stacked, where every expert's gate,
    /// up and down are dense and of one shape: a few rows then run their
    /// chosen experts in a handful of batched products
    /// ([`StackedExperts::forward`]) rather than several kernels per expert.
    /// The experts' own layers become views into the stacks.
    pub(crate) fn stacked(mut self) -> Result<Self> {
        let mut parts = Vec::with_capacity(self.experts.len());
        for mlp in &self.experts {
            let (GateUp::Separate { gate, up }, down) = (&mlp.gate_up, &mlp.down) else {
                return Ok(self);
            };
            match (gate, up, down) {
                (Linear::Dense(g), Linear::Dense(u), Linear::Dense(d)) => parts.push([g, u, d]),
                _ => return Ok(self),
            }
        }
        let Some(activation) = self.experts.first().map(|m| m.activation) else {
            return Ok(self);
        };
        let [gate, up, down] = [0, 1, 2]
            .map(|part| StackedLinear::stack(&parts.iter().map(|p| p[part]).collect::<Vec<_>>()));
        let (Some(gate), Some(up), Some(down)) = (gate?, up?, down?) else {
            return Ok(self);
        };
        self.experts = (0..parts.len())
            .map(|e| {
                Ok(Mlp::from_parts(
                    gate.layer(e)?,
                    up.layer(e)?,
                    down.layer(e)?,
                    activation,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        self.stacked = Some(Box::new(StackedExperts {
            gate,
            up,
            down,
            activation,
        }));
        Ok(self)
    }

    /// Whether the experts' matrices are stacked.
    #[cfg(test)]
    pub(crate) fn is_stacked(&self) -> bool {
        self.stacked.is_some()
    }

    /// The norms of a block beside the layer's dense MLP (Gemma 4).
    pub(crate) fn beside(&self) -> Option<&BesideNorms> {
        self.beside.as_deref()
    }

    /// The router's logits of rows `x` [n, experts]: a block beside the
    /// dense MLP folds its router's scales from the weights first
    /// ([`BesideNorms::router_matrix`]).
    fn router_logits(&self, x: &Tensor) -> Result<Tensor> {
        let input = self.router_input(x)?;
        match &self.beside {
            Some(b) => Linear::dense(b.router_matrix()?, None).forward(&input),
            None => self.router.forward(&input),
        }
    }

    /// What the router reads of rows `x`: `x` itself, or for a block beside
    /// the dense MLP (whose `x` is the residual stream) `x` through the
    /// router's unweighted norm.
    fn router_input(&self, x: &Tensor) -> Result<Tensor> {
        match &self.beside {
            Some(b) => b.router.forward(x),
            None => Ok(x.clone()),
        }
    }

    /// The expert every token runs beside the routed ones, where the block
    /// has one.
    pub(crate) fn shared(&self) -> Option<&SharedExpert> {
        self.shared.as_deref()
    }

    /// The routing of rows `x` [n, hidden] by the router's logits (in f32)
    /// and [`RouterRule::choose`].
    pub fn route(&self, x: &Tensor) -> Result<Routing> {
        let logits = self
            .router_logits(x)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        let mut routing = Routing {
            probs: Vec::with_capacity(logits.len()),
            experts: Vec::with_capacity(logits.len()),
            weights: Vec::with_capacity(logits.len()),
        };
        for row in &logits {
            let (probs, experts, weights) = self.rule.choose(row);
            routing.probs.push(probs);
            routing.experts.push(experts);
            routing.weights.push(weights);
        }
        Ok(routing)
    }

    /// The router.
    pub(crate) fn router(&self) -> &Linear {
        &self.router
    }

    /// The experts, in the router's order.
    pub(crate) fn experts(&self) -> &[Mlp] {
        &self.experts
    }

    /// How the router chooses.
    pub(crate) fn rule(&self) -> RouterRule {
        self.rule.clone()
    }

    /// The weights `routing` gives its rows' chosen experts [n, top_k],
    /// recomputed from the router's logits of `x` with tensor ops, so that
    /// a loss reaches the router through them (training): the softmax over
    /// every expert at the chosen ones, renormalised where the rule does
    /// (a softmax over the top-k logits is that renormalisation).
    pub(crate) fn trainable_weights(&self, x: &Tensor, routing: &Routing) -> Result<Tensor> {
        let logits = self.router_logits(x)?;
        let shifted = logits.broadcast_sub(&logits.max_keepdim(1)?.detach())?;
        let exp = shifted.exp()?;
        let probs = exp.broadcast_div(&exp.sum_keepdim(1)?)?;
        let k = self.rule.top_k;
        let chosen: Vec<u32> = routing
            .experts
            .iter()
            .flatten()
            .map(|&e| e as u32)
            .collect();
        let idx = Tensor::from_vec(chosen, (routing.experts.len(), k), x.device())?;
        let mut weights = probs.gather(&idx, 1)?;
        if self.rule.normalize || self.rule.kind == RouterKind::TopKSoftmax {
            weights = weights.broadcast_div(&weights.sum_keepdim(1)?)?;
        }
        if let Some(beside) = &self.beside {
            // each chosen expert's learned scale, as `RouterRule::choose`
            // applies it, read from the weight itself
            let scale = beside
                .expert_scale
                .to_dtype(weights.dtype())?
                .index_select(&idx.flatten_all()?, 0)?
                .reshape(weights.shape())?;
            weights = (weights * scale)?;
        }
        Ok(weights)
    }

    /// The block's output for rows `x` [n, hidden] routed by `routing`
    /// (theirs, from [`Self::route`]): each expert run once on the rows that
    /// chose it, its output scaled by their weights and added into theirs.
    /// The weights are `routing`'s, or `trainable` ([n, top_k], from
    /// [`Self::trainable_weights`]) when given.
    pub(crate) fn forward_routed(
        &self,
        x: &Tensor,
        routing: &Routing,
        trainable: Option<&Tensor>,
    ) -> Result<Tensor> {
        if trainable.is_none()
            && let Some(out) = self.stacked_output(x, routing)?
        {
            return self.with_shared(x, out);
        }
        if let ([chosen], [weights], None) = (&routing.experts[..], &routing.weights[..], trainable)
        {
            return self.with_shared(x, self.forward_one_row(x, chosen, weights)?);
        }
        // every expert's rows (ascending), their weights and their slots in
        // `trainable`, one expert after another: uploaded once, each expert
        // reading its span
        let mut by_expert: Vec<Vec<(u32, f32, u32)>> = vec![Vec::new(); self.experts.len()];
        for (r, (chosen, w)) in routing.experts.iter().zip(&routing.weights).enumerate() {
            for (k, &e) in chosen.iter().enumerate() {
                if let Some(list) = by_expert.get_mut(e) {
                    list.push((r as u32, w[k], (r * chosen.len() + k) as u32));
                }
            }
        }
        let all: Vec<(u32, f32, u32)> = by_expert.iter().flatten().copied().collect();
        let total = all.len();
        let rows = Tensor::from_vec(all.iter().map(|a| a.0).collect(), total, x.device())?;
        let scales = match trainable {
            Some(t) => {
                let slots = Tensor::from_vec(all.iter().map(|a| a.2).collect(), total, x.device())?;
                t.flatten_all()?.index_select(&slots, 0)?
            }
            None => Tensor::from_vec(all.iter().map(|a| a.1).collect(), total, x.device())?
                .to_dtype(x.dtype())?,
        };
        let mut out = x.zeros_like()?;
        let mut start = 0;
        for (expert, list) in self.experts.iter().zip(&by_expert) {
            let n = list.len();
            if n == 0 {
                continue;
            }
            let idx = rows.narrow(0, start, n)?;
            let scale = scales.narrow(0, start, n)?.reshape((n, 1))?;
            start += n;
            let y = expert
                .forward(&x.index_select(&idx, 0)?)?
                .broadcast_mul(&scale)?;
            out = out.index_add(&idx, &y, 0)?;
        }
        self.with_shared(x, out)
    }

    /// The routed experts' output of rows `x` on the stacked matrices (see
    /// [`StackedExperts::forward`]), or `None` where they are not stacked or
    /// the batch does not fit them.
    pub(crate) fn stacked_output(&self, x: &Tensor, routing: &Routing) -> Result<Option<Tensor>> {
        match &self.stacked {
            Some(stacked) => stacked.forward(x, routing),
            None => Ok(None),
        }
    }

    /// [`Self::forward_routed`] of one row (a decode step): the chosen
    /// experts run on the row itself, each output scaled by a scalar and
    /// summed in the experts' order, the same values and the same sums as
    /// the gathered rows and index-adds of many rows, without the index and
    /// weight tensors that a GPU would have to upload, each upload waiting
    /// for the work queued before it.
    fn forward_one_row(&self, x: &Tensor, chosen: &[usize], weights: &[f32]) -> Result<Tensor> {
        let mut out: Option<Tensor> = None;
        for (e, expert) in self.experts.iter().enumerate() {
            let Some(k) = chosen.iter().position(|&c| c == e) else {
                continue;
            };
            let y = expert.forward(x)?.affine(f64::from(weights[k]), 0.0)?;
            out = Some(match out {
                Some(sum) => (sum + y)?,
                None => y,
            });
        }
        Ok(match out {
            Some(sum) => sum,
            None => x.zeros_like()?,
        })
    }

    /// The routed experts' output `routed` for rows `x` with the shared
    /// expert's added, where the block has one (every way of running the
    /// routed experts ends here).
    pub(crate) fn with_shared(&self, x: &Tensor, routed: Tensor) -> Result<Tensor> {
        match &self.shared {
            Some(shared) => Ok((routed + shared.forward(x)?)?),
            None => Ok(routed),
        }
    }

    /// Bytes one token reads: the router, `top_k` experts (the experts
    /// are of one size) and the shared expert with its gate.
    pub fn token_bytes(&self) -> usize {
        let expert = self.experts.first().map_or(0, Mlp::bytes);
        let shared: usize = self.shared_linears().map(Linear::bytes).sum();
        self.router.bytes() + self.rule.top_k * expert + shared
    }

    /// The router, every expert's linear layers and the shared expert's.
    pub fn linears(&self) -> Vec<&Linear> {
        std::iter::once(&self.router)
            .chain(self.experts.iter().flat_map(|m| m.linears()))
            .chain(self.shared_linears())
            .collect()
    }

    /// The shared expert's linear layers and its gate (none without one).
    fn shared_linears(&self) -> impl Iterator<Item = &Linear> {
        self.shared
            .iter()
            .flat_map(|s| s.mlp.linears().into_iter().chain(std::iter::once(&s.gate)))
    }
}

/// A layer's feed-forward block: one gated MLP, a mixture of experts, or
/// both side by side.
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// One gated MLP.
    Dense(Mlp),
    /// Experts behind a router.
    Experts(Experts),
    /// A gated MLP and experts beside it on the same residual stream, each
    /// branch normed, their sum the block's output (Gemma 4's
    /// `enable_moe_block`).
    DenseAndExperts(Mlp, Experts),
}

impl FeedForward {
    /// The block's linear layers.
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            FeedForward::Dense(m) => m.linears(),
            FeedForward::Experts(e) => e.linears(),
            FeedForward::DenseAndExperts(m, e) => {
                m.linears().into_iter().chain(e.linears()).collect()
            }
        }
    }

    /// Bytes of weights one token reads: the MLP, or the router and the
    /// experts it runs.
    pub fn token_bytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.bytes(),
            FeedForward::Experts(e) => e.token_bytes(),
            FeedForward::DenseAndExperts(m, e) => m.bytes() + e.token_bytes(),
        }
    }
}

/// Queries, keys and values of a chunk's rows, [heads, n, head_dim] each.
pub(crate) struct Qkv {
    /// Queries.
    pub q: Tensor,
    /// Keys and values (one per K/V head); `None` on a layer that reads
    /// another layer's K/V (Gemma 4's shared layers).
    pub kv: Option<(Tensor, Tensor)>,
    /// The output gate [n, heads * head_dim], before its sigmoid, where the
    /// query projection gives one (Qwen3.5's full layers).
    pub gate: Option<Tensor>,
}

/// The attention projections of one layer.
#[derive(Debug, Clone)]
pub struct AttentionProj {
    qkv: QkvProj,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// The unscaled RMSNorm of each value head (Gemma 4).
    v_norm: Option<RmsNorm>,
    /// The q/k norms span the whole projection, not one head (OLMo 2/3).
    whole_norms: bool,
    /// Each query head's sink logit [heads] in f32 (gpt-oss).
    sinks: Option<Tensor>,
    /// The query projection gives each head's queries then its output gate
    /// (Qwen3.5's full layers).
    output_gate: bool,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

#[derive(Debug, Clone)]
enum QkvProj {
    Separate {
        q: Linear,
        k: Linear,
        v: Linear,
    },
    Fused(Linear),
    /// The values are the keys' projection, before the key norm and RoPE
    /// (Gemma 4's full layers with `attention_k_eq_v`).
    KeysAsValues {
        q: Linear,
        k: Linear,
    },
    /// Queries only: the layer reads another layer's K/V (Gemma 4's
    /// shared layers store none of their own).
    QueriesOnly {
        q: Linear,
    },
    /// No queries, keys or values: a linear-attention layer (Qwen3.5), whose
    /// input projections are its Gated DeltaNet's; only the output
    /// projection is the attention's.
    Recurrent,
}

/// The attention's input matrices, as the model stores them.
pub(crate) enum QkvLinears<'a> {
    /// Q, K and V apart.
    Separate(&'a Linear, &'a Linear, &'a Linear),
    /// One matrix: Q rows, then K, then V.
    Fused(&'a Linear),
    /// Q and K; the values are the keys' projection (Gemma 4's full
    /// layers with `attention_k_eq_v`).
    KeysAsValues(&'a Linear, &'a Linear),
    /// Q only: the K/V are another layer's (Gemma 4's shared layers).
    QueriesOnly(&'a Linear),
    /// None: a linear-attention layer (the fused step does not read this
    /// layout).
    Recurrent,
}

impl AttentionProj {
    /// The Q, K and V matrices.
    pub(crate) fn qkv_linears(&self) -> QkvLinears<'_> {
        match &self.qkv {
            QkvProj::Separate { q, k, v } => QkvLinears::Separate(q, k, v),
            QkvProj::Fused(lin) => QkvLinears::Fused(lin),
            QkvProj::KeysAsValues { q, k } => QkvLinears::KeysAsValues(q, k),
            QkvProj::QueriesOnly { q } => QkvLinears::QueriesOnly(q),
            QkvProj::Recurrent => QkvLinears::Recurrent,
        }
    }

    /// The output matrix.
    pub(crate) fn o(&self) -> &Linear {
        &self.o
    }

    /// The query and key norms (Qwen3's and Gemma's of each head, of
    /// `head_dim` values; OLMo's of the whole projection, the host kernels
    /// norm each weight-wide run of values either way).
    pub(crate) fn qk_norms(&self) -> (Option<&RmsNorm>, Option<&RmsNorm>) {
        (self.q_norm.as_ref(), self.k_norm.as_ref())
    }

    /// The attention of layer `layer` at `prefix`, of the shape and K/V
    /// source the config gives that layer.
    pub(crate) fn load(ld: &Loader<'_>, prefix: &str, layer: usize) -> Result<Self> {
        let c = ld.cfg;
        let shape = c.layer_attention.get(layer).copied().ok_or(
            crate::error::ModelError::LayerProgram {
                what: "the attention of a layer past the config's depth",
            },
        )?;
        let (h, kv, hd, d) = (c.num_heads, shape.kv_heads, shape.head_dim, c.hidden_size);
        let linear =
            |name: &str, rows: usize| ld.linear(&format!("{prefix}.{name}"), rows, d, c.qkv_bias);
        // the query projection gives a head's queries, then its gate
        let q_rows = match c.attn_output_gate {
            true => 2 * h * hd,
            false => h * hd,
        };
        let qkv = if c.fused_qkv {
            QkvProj::Fused(linear("qkv_proj", (h + 2 * kv) * hd)?)
        } else if shape.kv_source.is_some() {
            QkvProj::QueriesOnly {
                q: linear("q_proj", q_rows)?,
            }
        } else if shape.values_from_keys {
            QkvProj::KeysAsValues {
                q: linear("q_proj", q_rows)?,
                k: linear("k_proj", kv * hd)?,
            }
        } else {
            QkvProj::Separate {
                q: linear("q_proj", q_rows)?,
                k: linear("k_proj", kv * hd)?,
                v: linear("v_proj", kv * hd)?,
            }
        };
        let o_bias = ld.files.contains(&format!("{prefix}.o_proj.bias"));
        let (q_width, k_width) = match c.qk_norm {
            QkNorm::Whole => (h * hd, kv * hd),
            QkNorm::None | QkNorm::PerHead => (hd, hd),
        };
        let (q_norm, k_norm) = match c.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead | QkNorm::Whole => (
                Some(ld.norm(&format!("{prefix}.q_norm"), q_width)?),
                match shape.kv_source {
                    Some(_) => None,
                    None => Some(ld.norm(&format!("{prefix}.k_norm"), k_width)?),
                },
            ),
        };
        let v_norm = match shape.value_norm && shape.kv_source.is_none() {
            true => Some(ld.unweighted_norm(hd)?),
            false => None,
        };
        Ok(Self {
            qkv,
            o: ld.linear(&format!("{prefix}.o_proj"), d, h * hd, o_bias)?,
            q_norm,
            k_norm,
            v_norm,
            whole_norms: c.qk_norm == QkNorm::Whole,
            sinks: match c.attention_sinks {
                true => {
                    Some(
                        ld.files
                            .load(&format!("{prefix}.sinks"), &[h], DType::F32, ld.device)?,
                    )
                }
                false => None,
            },
            output_gate: c.attn_output_gate,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: hd,
        })
    }

    /// The attention of a linear-attention layer (Qwen3.5): no queries,
    /// keys or values, only the output projection `{prefix}.out_proj` from
    /// `heads` value heads of `head_dim` values.
    pub(crate) fn output_only(
        ld: &Loader<'_>,
        prefix: &str,
        (heads, head_dim): (usize, usize),
    ) -> Result<Self> {
        let d = ld.cfg.hidden_size;
        Ok(Self {
            qkv: QkvProj::Recurrent,
            o: ld.linear(&format!("{prefix}.out_proj"), d, heads * head_dim, false)?,
            q_norm: None,
            k_norm: None,
            v_norm: None,
            whole_norms: false,
            sinks: None,
            output_gate: false,
            num_heads: heads,
            num_kv_heads: 0,
            head_dim,
        })
    }

    /// Whether the layer's values go through an unscaled RMSNorm per head
    /// (Gemma 4).
    pub(crate) fn norms_values(&self) -> bool {
        self.v_norm.is_some()
    }

    /// Whether the attention's output is multiplied by the sigmoid of a gate
    /// the query projection gives (Qwen3.5's full layers).
    pub(crate) fn has_output_gate(&self) -> bool {
        self.output_gate
    }

    /// K/V heads of the layer.
    pub(crate) fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    /// Width of one head of the layer.
    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Each query head's learned sink logit [heads] (f32), where the model
    /// has them: a column in every softmax with no value.
    pub fn sinks(&self) -> Option<&Tensor> {
        self.sinks.as_ref()
    }

    /// The attention's linear layers.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut out = match &self.qkv {
            QkvProj::Separate { q, k, v } => vec![q, k, v],
            QkvProj::Fused(lin) => vec![lin],
            QkvProj::KeysAsValues { q, k } => vec![q, k],
            QkvProj::QueriesOnly { q } => vec![q],
            QkvProj::Recurrent => vec![],
        };
        out.push(&self.o);
        out
    }

    /// The attention's linear layers by module name, for adapters.
    pub(crate) fn named_linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = match &mut self.qkv {
            QkvProj::Separate { q, k, v } => vec![("q_proj", q), ("k_proj", k), ("v_proj", v)],
            QkvProj::Fused(lin) => vec![("qkv_proj", lin)],
            QkvProj::KeysAsValues { q, k } => vec![("q_proj", q), ("k_proj", k)],
            QkvProj::QueriesOnly { q } => vec![("q_proj", q)],
            // a linear layer's matrices have other names: no adapter reaches them
            QkvProj::Recurrent => return vec![],
        };
        out.push(("o_proj", &mut self.o));
        out
    }

    /// Whether the layer norms its queries and keys (each head: Qwen3,
    /// Gemma 3; the whole projection: OLMo 2/3).
    pub(crate) fn has_head_norms(&self) -> bool {
        self.q_norm.is_some() || self.k_norm.is_some()
    }

    /// Project `x` [n, hidden] to queries, keys and values, heads first
    /// (the values normed where the layer norms them; no keys nor values
    /// on a layer that reads another layer's).
    pub(crate) fn project(&self, x: &Tensor) -> Result<Qkv> {
        let h = self.num_heads;
        let q = match &self.qkv {
            QkvProj::Separate { q, .. }
            | QkvProj::KeysAsValues { q, .. }
            | QkvProj::QueriesOnly { q } => q.forward(x)?,
            QkvProj::Fused(lin) => {
                let all = lin.forward(x)?;
                let q = all.narrow(1, 0, h * self.head_dim)?;
                let (k, v) = self.split_fused_kv(&all)?;
                return Ok(Qkv {
                    q: self.heads(q, h)?,
                    kv: Some(self.kv_heads(k, v)?),
                    gate: None,
                });
            }
            QkvProj::Recurrent => {
                return Err(crate::error::ModelError::LayerProgram {
                    what: "queries of a linear-attention layer",
                });
            }
        };
        let (q, gate) = match self.output_gate {
            true => {
                // per head: head_dim queries, then head_dim gate values
                let n = q.dim(0)?;
                let hd = self.head_dim;
                let both = q.reshape((n, h, 2 * hd))?;
                (
                    both.narrow(2, 0, hd)?.reshape((n, h * hd))?,
                    Some(both.narrow(2, hd, hd)?.reshape((n, h * hd))?),
                )
            }
            false => (q, None),
        };
        Ok(Qkv {
            q: self.heads(q, h)?,
            kv: self.project_kv(x)?,
            gate,
        })
    }

    /// The attention's output [heads, n, head_dim] times the sigmoid of the
    /// gate [n, heads * head_dim] the query projection gave.
    pub(crate) fn gated_output(&self, attn: &Tensor, gate: &Tensor) -> Result<Tensor> {
        let gate = self.heads(gate.clone(), self.num_heads)?;
        Ok((attn * candle_nn::ops::sigmoid(&gate)?)?)
    }

    /// The K and V parts [n, kv * head_dim] of a fused projection's output.
    fn split_fused_kv(&self, all: &Tensor) -> Result<(Tensor, Tensor)> {
        let (h, kv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        Ok((
            all.narrow(1, h * hd, kv * hd)?,
            all.narrow(1, (h + kv) * hd, kv * hd)?,
        ))
    }

    /// Keys and values [n, kv * head_dim] as heads, the values normed
    /// where the layer norms them.
    fn kv_heads(&self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let kv = self.num_kv_heads;
        let v = self.heads(v, kv)?;
        let v = match &self.v_norm {
            Some(norm) => norm.forward(&v)?,
            None => v,
        };
        Ok((self.heads(k, kv)?, v))
    }

    /// The keys and values of `x` [n, hidden], heads first, before the key
    /// norm and RoPE; `None` on a layer that reads another layer's.
    fn project_kv(&self, x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        let (k, v) = match &self.qkv {
            QkvProj::Separate { k, v, .. } => (k.forward(x)?, v.forward(x)?),
            QkvProj::Fused(lin) => self.split_fused_kv(&lin.forward(x)?)?,
            QkvProj::KeysAsValues { k, .. } => {
                let k = k.forward(x)?;
                (k.clone(), k)
            }
            QkvProj::QueriesOnly { .. } => return Ok(None),
            QkvProj::Recurrent => {
                return Err(crate::error::ModelError::LayerProgram {
                    what: "keys and values of a linear-attention layer",
                });
            }
        };
        Ok(Some(self.kv_heads(k, v)?))
    }

    /// The query and key heads [heads, n, head_dim] normed by the layer's
    /// q/k norms (over each head's values, or over a row's every head).
    pub(crate) fn norm_heads(
        &self,
        q: &Tensor,
        k: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        Ok((
            self.norm_projection(q, self.q_norm.as_ref())?,
            k.map(|k| self.norm_projection(k, self.k_norm.as_ref()))
                .transpose()?,
        ))
    }

    /// Heads [heads, n, head_dim] normed by `norm`: each head alone, or each
    /// row's heads together when the norm spans the whole projection.
    fn norm_projection(&self, t: &Tensor, norm: Option<&RmsNorm>) -> Result<Tensor> {
        let Some(norm) = norm else {
            return Ok(t.clone());
        };
        if !self.whole_norms {
            return norm.forward(t);
        }
        let (heads, n, hd) = t.dims3()?;
        let rows = swap_rows_heads(t)?.reshape((n, heads * hd))?;
        let normed = norm.forward(&rows)?.reshape((n, heads, hd))?;
        swap_rows_heads(&normed)
    }

    /// Project `x` [n, hidden] to k and v only ([kv_heads, n, head_dim]
    /// each, heads first), with the k-norm and RoPE at `cos`/`sin` where the
    /// layer rotates (`rotation`): the K/V a token keeps at a layer it does
    /// not run (projected prompt K/V). A fused projection is computed whole
    /// and its query part dropped. A layer that reads another layer's K/V
    /// has none of its own: refused.
    pub fn kv(
        &self,
        x: &Tensor,
        rotation: Option<(&Rope, &Tensor, &Tensor)>,
    ) -> Result<(Tensor, Tensor)> {
        let (k, v) = self
            .project_kv(x)?
            .ok_or(crate::error::ModelError::LayerProgram {
                what: "projected K/V of a layer that reads another layer's K/V",
            })?;
        let mut k = self.norm_projection(&k, self.k_norm.as_ref())?;
        if let Some((rope, cos, sin)) = rotation {
            k = rope.apply(&k, cos, sin)?;
        }
        Ok((k, v))
    }

    /// [n, count * head_dim] as [count, n, head_dim], contiguous.
    fn heads(&self, t: Tensor, count: usize) -> Result<Tensor> {
        let n = t.dim(0)?;
        swap_rows_heads(&t.contiguous()?.reshape((n, count, self.head_dim))?)
    }

    /// Output projection of the attention result [heads, n, head_dim].
    pub fn output(&self, attn: &Tensor) -> Result<Tensor> {
        let (_, n, _) = attn.dims3()?;
        let merged = attn
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n, self.num_heads * self.head_dim))?;
        self.o.forward(&merged)
    }
}

/// Rows-first heads [n, heads, head_dim] as heads first [heads, n,
/// head_dim], or back, contiguous.
pub(crate) fn swap_rows_heads(t: &Tensor) -> Result<Tensor> {
    Ok(t.transpose(0, 1)?.contiguous()?)
}
