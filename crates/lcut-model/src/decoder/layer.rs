//! One decoder layer, top to bottom: its weights ([`Layer`]) and the
//! program every executor runs ([`run_layer`]).
//!
//! The program names each step of the layer in the order the model computes
//! it; an executor ([`LayerExecutor`]) computes the steps on its own rows.
//! Two executors run it:
//!
//! - the tensor executor (`pass.rs`): the rows of a chunk as candle tensors,
//!   on any device; for inference, with the sequence's cache, the key
//!   planner's reads, probes and the projected K/V of the tokens that left
//!   below (SwiftKV, POP), and for training, every row of a sequence at once
//!   under a mask, gradients reaching LoRA pairs;
//! - the host executor (`step.rs`): one new token per sequence on host
//!   buffers through lcut's kernels (the fused decode step).
//!
//! Both read the same [`Layer`] (the host executor through host views of
//! its weights, made once), so a new mechanism of the layer (a sink, an
//! expert MLP, K/V shared from another layer) is a step here and the
//! executors' implementations of it; `docs/architecture.md` walks through
//! one.

use crate::config::Activation;
use crate::error::{ModelError, Result};
use crate::layers::{AttentionProj, FeedForward, Mlp, RmsNorm};
use crate::linear::Linear;
use crate::linear_attention::GatedDeltaNet;

/// One decoder layer's weights and switches.
#[derive(Debug, Clone)]
pub(super) struct Layer {
    /// The norm before the attention, where the layer has one (not OLMo).
    pub(super) input_norm: Option<RmsNorm>,
    /// The Q/K/V and output projections, with the Q/K head norms (of a
    /// linear-attention layer, its output projection only).
    pub(super) attn: AttentionProj,
    /// The layer's linear attention (Qwen3.5's Gated DeltaNet), which
    /// takes the place of queries, keys and values; `None`: attention.
    pub(super) linear: Option<GatedDeltaNet>,
    /// The norm on the attention output before the residual add (Gemma,
    /// OLMo).
    pub(super) attn_out_norm: Option<RmsNorm>,
    /// The norm before the MLP, where the layer has one (not OLMo).
    pub(super) mlp_in_norm: Option<RmsNorm>,
    /// The gated MLP, or the experts behind a router.
    pub(super) mlp: FeedForward,
    /// The norm on the MLP output before the residual add (Gemma, OLMo).
    pub(super) mlp_out_norm: Option<RmsNorm>,
    /// The norm on the dense MLP's own output where experts run beside it,
    /// before the two are summed (Gemma 4's `post_feedforward_layernorm_1`).
    pub(super) dense_out_norm: Option<RmsNorm>,
    /// The sliding window of keys a query reads, where the layer has one.
    pub(super) window: Option<usize>,
    /// Which RoPE the layer rotates by: 0 the model's, 1 the sliding
    /// layers' own (Gemma 3, OLMo 3); the index into
    /// [`super::Decoder::rope_tables`]. `None`: the layer does not rotate
    /// (SmolLM3's NoPE layers).
    pub(super) rope: Option<usize>,
    /// The earlier layer whose K/V the layer reads instead of storing its
    /// own (Gemma 4's shared layers); `None`: its own.
    pub(super) kv_source: Option<usize>,
    /// The branch that applies the layer's per-layer input (Gemma 4).
    pub(super) layer_input: Option<LayerInputBranch>,
    /// The learned scale of the layer's output (Gemma 4's `layer_scalar`).
    pub(super) scalar: Option<LayerScalar>,
}

/// Gemma 4's per-layer input branch, after the MLP: `norm(projection(act(
/// gate(h)) * input))` added into the residual stream `h`, where `input` is
/// the token's input for this layer.
#[derive(Debug, Clone)]
pub(super) struct LayerInputBranch {
    /// The residual stream into the input's width (`per_layer_input_gate`).
    pub(super) gate: Linear,
    /// The gated input back to the residual width (`per_layer_projection`).
    pub(super) projection: Linear,
    /// The norm on the branch (`post_per_layer_input_norm`).
    pub(super) norm: RmsNorm,
    /// The gate's activation (the MLP's).
    pub(super) activation: Activation,
}

impl Layer {
    /// The layer's dense MLP; the error of a step that needs one on a layer
    /// of experts.
    pub(super) fn dense_mlp(&self) -> Result<&Mlp> {
        match &self.mlp {
            FeedForward::Dense(m) | FeedForward::DenseAndExperts(m, _) => Ok(m),
            FeedForward::Experts(_) => Err(ModelError::LayerProgram {
                what: "a dense MLP step on a layer of experts",
            }),
        }
    }

    /// The norm at `site`, where the layer has one.
    pub(super) fn norm(&self, site: Norm) -> Option<&RmsNorm> {
        match site {
            Norm::Attention => self.input_norm.as_ref(),
            Norm::AttentionOut => self.attn_out_norm.as_ref(),
            Norm::Mlp => self.mlp_in_norm.as_ref(),
            Norm::MlpOut => self.mlp_out_norm.as_ref(),
            Norm::DenseOut => self.dense_out_norm.as_ref(),
        }
    }
}

/// A norm of the layer, by where it sits: what it reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Norm {
    /// The residual stream into the attention's input.
    Attention,
    /// The attention's output branch, in place (Gemma, OLMo).
    AttentionOut,
    /// The residual stream into the MLP's input.
    Mlp,
    /// The MLP's output branch, in place (Gemma, OLMo).
    MlpOut,
    /// The dense MLP's output branch, in place, where experts run beside it
    /// (Gemma 4).
    DenseOut,
}

/// A matrix product of the layer (bias included), by what it reads and
/// writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Product {
    /// The attention's input into queries, keys and values, one row of
    /// heads each (one fused matrix or three).
    Qkv,
    /// The attention's output, its heads side by side, into the branch.
    AttentionOut,
    /// The MLP's input into its gate and up halves (one fused matrix or two).
    GateUp,
    /// The gated activation into the branch.
    Down,
}

/// Whether the policy is shown the queries before or after their rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rotation {
    /// After the head norms, before RoPE (a press's query statistics).
    Before,
    /// As attention reads them (SlimInfer's and a press's query window).
    After,
}

/// Layer `index` of the model and its weights: what each step is told.
#[derive(Debug, Clone, Copy)]
pub(super) struct LayerAt<'a> {
    /// The layer's index.
    pub(super) index: usize,
    /// Its weights.
    pub(super) layer: &'a Layer,
}

/// A layer's learned output scale: its value, and the weight it came from
/// (a training pass multiplies by the weight, so that gradients reach it
/// and the pass sees an optimizer's updates; the value was read once, when
/// the model loaded).
#[derive(Debug, Clone)]
pub(super) struct LayerScalar {
    /// The scale.
    pub(super) value: f64,
    /// The weight [1].
    pub(super) weight: candle_core::Tensor,
}

/// The steps of a decoder layer, as one executor computes them on its rows
/// (one per token of a chunk, or one per sequence of a decode pass). Each
/// step reads and writes the rows its doc names.
pub(super) trait LayerExecutor {
    /// The RMSNorm at `site` ([`Norm`] says from what into what).
    fn norm(&mut self, at: LayerAt<'_>, site: Norm) -> Result<()>;

    /// The residual stream itself as the next block's input, unnormed (a
    /// block with no norm before it: OLMo 2/3).
    fn take_residual(&mut self) -> Result<()>;

    /// The matrix product `product` ([`Product`] says from what into what).
    fn product(&mut self, at: LayerAt<'_>, product: Product) -> Result<()>;

    /// Queries and keys normed: each head on its own (Qwen3, Gemma 3) or
    /// each row's heads together (OLMo 2/3).
    fn norm_heads(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// Queries and keys rotated at their rows' positions by the layer's
    /// RoPE (a layer without one is not asked).
    fn rotate(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The policy shown the layer's queries where it reads them.
    fn show_queries(&mut self, at: LayerAt<'_>, when: Rotation) -> Result<()>;

    /// The rows' keys and values into the cache where the policy keeps them
    /// (keys older than the window of the first row dropped), then each
    /// query head's attention over the keys the key planner gives its row,
    /// into the attention's output; a probe sees the attention rows it asks
    /// for. A layer that reads another layer's K/V ([`Layer::kv_source`])
    /// stores none and reads that layer's cache under its own visibility
    /// rule (the rule of the layer that reads).
    fn attend(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The attention's output multiplied by the sigmoid of the gate the
    /// query projection gave (Qwen3.5's full layers).
    fn gate_output(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The attention's input through the layer's linear attention (Gated
    /// DeltaNet) into the attention's output: the rows continue the
    /// sequence's recurrent state of this layer, which holds only the
    /// tokens that ran the layer before them (a policy's tokens that do
    /// not exist at the layer never enter it).
    fn linear_attention(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The gate's activation times the up half: the gated activation.
    fn gate(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The MLP's input through the layer's experts into the branch: the
    /// router's choice per row, each chosen expert's gated MLP, the outputs
    /// summed with the router's weights.
    fn experts(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The layer's experts beside its dense MLP (Gemma 4), added into the
    /// branch (the dense MLP's normed output): the router reads the
    /// residual stream through its own norm, the experts read it through
    /// their input norm, and their weighted sum is normed by their output
    /// norm.
    fn experts_beside(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The branch added into the residual stream.
    fn join_branch(&mut self) -> Result<()>;

    /// The layer's per-layer input branch from the residual stream into the
    /// branch (Gemma 4): the gate's activation times each row's input for
    /// this layer, projected and normed.
    fn layer_input(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// The residual stream multiplied by the layer's learned scalar.
    fn scale(&mut self, at: LayerAt<'_>) -> Result<()>;

    /// After the layer: a probe shown the residual stream, the policy told
    /// the layer is done.
    fn finish_layer(&mut self, at: LayerAt<'_>) -> Result<()>;
}

/// Layer `index` on the executor's rows: the residual stream in, the
/// residual stream out.
pub(super) fn run_layer(index: usize, layer: &Layer, e: &mut impl LayerExecutor) -> Result<()> {
    let at = LayerAt { index, layer };
    // attention
    block_input(at, Norm::Attention, e)?;
    match &layer.linear {
        // linear attention (Qwen3.5): no queries, keys or values
        Some(_) => e.linear_attention(at)?,
        None => {
            e.product(at, Product::Qkv)?;
            if layer.attn.has_head_norms() {
                e.norm_heads(at)?;
            }
            e.show_queries(at, Rotation::Before)?;
            if layer.rope.is_some() {
                e.rotate(at)?;
            }
            e.show_queries(at, Rotation::After)?;
            e.attend(at)?;
            if layer.attn.has_output_gate() {
                e.gate_output(at)?;
            }
        }
    }
    e.product(at, Product::AttentionOut)?;
    if layer.attn_out_norm.is_some() {
        e.norm(at, Norm::AttentionOut)?;
    }
    e.join_branch()?;
    // MLP
    block_input(at, Norm::Mlp, e)?;
    match &layer.mlp {
        FeedForward::Dense(_) => {
            e.product(at, Product::GateUp)?;
            e.gate(at)?;
            e.product(at, Product::Down)?;
        }
        FeedForward::Experts(_) => e.experts(at)?,
        FeedForward::DenseAndExperts(..) => {
            e.product(at, Product::GateUp)?;
            e.gate(at)?;
            e.product(at, Product::Down)?;
            e.norm(at, Norm::DenseOut)?;
            e.experts_beside(at)?;
        }
    }
    if layer.mlp_out_norm.is_some() {
        e.norm(at, Norm::MlpOut)?;
    }
    e.join_branch()?;
    // per-layer input (Gemma 4)
    if layer.layer_input.is_some() {
        e.layer_input(at)?;
        e.join_branch()?;
    }
    if layer.scalar.is_some() {
        e.scale(at)?;
    }
    e.finish_layer(at)
}

/// A block's input: the residual stream normed at `site`, or unnormed where
/// the layer has no norm there.
fn block_input(at: LayerAt<'_>, site: Norm, e: &mut impl LayerExecutor) -> Result<()> {
    match at.layer.norm(site) {
        Some(_) => e.norm(at, site),
        None => e.take_residual(),
    }
}

/// The error of a step that reads `what` before an earlier step wrote it: a
/// fault of an executor, reported rather than panicking.
pub(super) fn unwritten(what: &'static str) -> ModelError {
    ModelError::LayerProgram { what }
}
