//! Named model shapes a random model can take: the sizes, architecture and
//! constants of real checkpoints, as their Hugging Face `config.json` gives
//! them, so that tests and benchmarks run the shapes people use without
//! downloading them.

use std::path::Path;

use lcut_model::{Arch, Layout, LlamaShape, ModelConfig, RopeScaling, SpecialTokens};
use serde_json::{Map, Value, json};

use crate::draw;
use crate::error::{Result, SynthError};

/// The architecture family of a shape: what its `config.json` and GGUF
/// metadata call it and what it adds to Llama's layer. Not stored: a
/// shape's family follows from its experts ([`ModelShape::experts`]), its
/// layout ([`LlamaShape::layout`]) and, on Llama's layout, its q/k/v
/// biases ([`ModelShape::family`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama: no biases.
    Llama,
    /// Qwen2: Llama's layout with biases on the q, k and v projections.
    Qwen2,
    /// SmolLM3: Llama's layer, every few layers without RoPE.
    Smollm3,
    /// OLMo 2 or 3: norms after the blocks, whole-projection q/k norms
    /// (OLMo 3: sliding layers, YaRN on the full ones).
    Olmo,
    /// Qwen3-MoE: Qwen3's attention (per-head q/k norms), a mixture of
    /// experts in place of every MLP, the top-k weights renormalised.
    Qwen3Moe,
    /// Mixtral: Llama's attention, a mixture of experts in place of every
    /// MLP.
    Mixtral,
    /// Qwen3.5: linear-attention layers (Gated DeltaNet) with a full
    /// attention layer every few ([`ModelShape::linear`]), the full layers'
    /// queries carrying an output gate; (1 + w) norms.
    Qwen35,
    /// Qwen3.5-MoE: Qwen3.5's layers, every MLP a mixture of experts with a
    /// shared expert beside them.
    Qwen35Moe,
    /// gpt-oss: attention with biases and a learned sink logit per head,
    /// sliding and full layers alternating, YaRN, and a mixture of experts
    /// (biased, clamped SwiGLU) in place of every MLP.
    GptOss,
    /// Gemma 4 (`gemma4_text`): sliding and full layers of their own head
    /// widths, per-layer inputs, the top layers reading earlier layers'
    /// K/V, sandwich norms, q/k/v norms, layer scalars
    /// ([`ModelShape::gemma4`]).
    Gemma4,
}

/// Which architecture's mixture of experts a shape has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertsKind {
    /// Qwen3-MoE's (`mlp.gate`, `mlp.experts.I.{gate,up,down}_proj`; its
    /// own expert width beside the config's dense `intermediate_size`).
    Qwen3Moe,
    /// Mixtral's (`block_sparse_moe.gate`, `block_sparse_moe.experts.I.w1`
    /// to `w3`; the expert width is `intermediate_size`).
    Mixtral,
    /// Qwen3.5-MoE's: Qwen3-MoE's names and renormalised top-k, plus a
    /// shared expert of width `shared_inner` (`mlp.shared_expert`) that
    /// every token runs, scaled by the sigmoid of its one-row gate
    /// (`mlp.shared_expert_gate`).
    Qwen35Moe {
        /// The shared expert's inner width.
        shared_inner: usize,
    },
    /// gpt-oss's (`mlp.router` with a bias; every expert's gate and up
    /// projections fused in `mlp.experts.gate_up_proj` [experts, hidden, 2
    /// inner], gate and up columns alternating, the down projections in
    /// `mlp.experts.down_proj` [experts, inner, hidden], each with a bias;
    /// the expert width is `intermediate_size`). The family's attention
    /// comes with it: q/k/v/o biases, a sink logit per head
    /// (`self_attn.sinks`), and every other layer, the first included,
    /// sliding over `sliding_window` tokens.
    GptOss {
        /// The sliding layers' window.
        sliding_window: usize,
    },
    /// Gemma 4's (`enable_moe_block`), beside every layer's dense MLP and
    /// summed with it: a router (`router.proj`, of kind
    /// [`TensorKind::ScaledRouter`]) reading an unweighted RMS norm of the
    /// residual times `router.scale` and 1/sqrt(hidden), the chosen weights
    /// renormalised and scaled by `router.per_expert_scale`; every
    /// expert's gate and up projections stacked in `experts.gate_up_proj`
    /// [experts, 2 inner, hidden] (gate rows first), the down projections
    /// in `experts.down_proj` [experts, hidden, inner]; the branch's own
    /// norms (`pre_feedforward_layernorm_2`, `post_feedforward_layernorm_1`
    /// and `_2`). Only with Gemma 4's layers ([`ModelShape::gemma4`]).
    Gemma4,
}

/// A mixture of experts in place of every layer's MLP: a router (a
/// [`TensorKind::Router`] matrix of one row per expert) picks `top_k` of
/// `num_experts` gated MLPs of width `inner` per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertShape {
    /// Whose experts: decides the family, names and config fields.
    pub kind: ExpertsKind,
    /// Experts per layer.
    pub num_experts: usize,
    /// Experts each token runs.
    pub top_k: usize,
    /// Each expert's inner width.
    pub inner: usize,
}

/// What a weight tensor is, which decides how it is drawn and stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A matrix (embedding, projection, LM head).
    Matrix,
    /// An RMSNorm weight (drawn as ones).
    Norm,
    /// A bias vector.
    Bias,
    /// A mixture of experts' router: one row per expert, drawn so that
    /// its logits have about unit spread at any width ([`crate::draw`]),
    /// and kept in f32 in every GGUF file (llama.cpp never quantizes it).
    Router,
    /// The token embedding of a shape with experts, drawn at unit standard
    /// deviation so that each token's own direction leads the residual
    /// stream the routers read ([`crate::draw`]); stored as a matrix.
    RoutedEmbedding,
    /// The token embedding of a Gemma 4 shape with experts, which the
    /// model multiplies by sqrt(hidden) as it reads it: drawn at
    /// [`crate::draw::ROUTED_EMBEDDING_STD`] over sqrt(hidden), so that the
    /// residual stream starts as large as a [`TensorKind::RoutedEmbedding`]
    /// starts it. As the tied head, it then gives logits of spread about 16:
    /// a routed embedding's draw gave 16 sqrt(hidden), which the soft cap
    /// flattens (docs/layouts.md measures both draws); stored as a matrix.
    ScaledRoutedEmbedding,
    /// Gemma 4's router (`router.proj`), whose input is RMS-normed and
    /// divided by sqrt(hidden) by the model itself: drawn at standard
    /// deviation 16 ([`crate::draw::SCALED_ROUTER_STD`]), so that its
    /// logits spread by about 16 and near ties between experts are rare.
    /// Each expert's output passes the branch's norm, so a token that takes
    /// another expert under a format's rounding moves its logits by its
    /// whole share: at spread 1 (a [`TensorKind::Router`]'s, scaled) bf16
    /// changed one token's experts in 64 over 6 layers and moved the logits
    /// by 0.02-0.04 of the largest, at 4 still 0.036, at 16 by 0.005
    /// (measured on the test shape); kept in f32 in every GGUF file.
    ScaledRouter,
    /// A query or key RMSNorm weight that carries the attention's scale
    /// (Gemma 4's, whose attention scale is 1): drawn as `d`^(-1/4) for a
    /// head of `d` values, so that a random model's scores are the dot
    /// products over sqrt(d), as a trained model's norms make them. Drawn
    /// as ones, the normed queries and keys give scores of spread sqrt(d)
    /// and an attention so peaked that Q8_0's rounding moved the tiny
    /// model's logits by 0.15 of the largest.
    QkScaleNorm,
    /// An RMSNorm weight the model adds one to (`x * (1 + w)`, Qwen3.5's):
    /// drawn as zeros, as transformers initialises it, so that it scales
    /// by one; llama.cpp's converter stores `1 + w`.
    OffsetNorm,
    /// Qwen3.5's decay rates `A_log` (one per value head): drawn as
    /// `ln(a)` with `a` uniform in [1, 16), as transformers initialises
    /// them; llama.cpp's converter stores `-exp(A_log)`. Kept in f32.
    DecayLog,
    /// A depthwise convolution's kernel (Qwen3.5's `conv1d`, [channels, 1,
    /// kernel]): drawn at 1/sqrt(kernel), as a convolution's default
    /// initialisation bounds it; kept in f32 (llama.cpp never quantizes
    /// `ssm_conv1d`).
    Convolution,
}

/// One weight of a shape: its Hugging Face name, dimensions and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Hugging Face name (`model.layers.3.self_attn.q_proj.weight`).
    pub name: String,
    /// Dimensions, rows first.
    pub dims: Vec<usize>,
    /// What it is.
    pub kind: TensorKind,
}

impl TensorSpec {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Length of a row (the last dimension).
    pub fn cols(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// Number of rows (the product of the other dimensions).
    pub fn rows(&self) -> usize {
        self.len() / self.cols().max(1)
    }
}

/// Qwen3.5's hybrid layers: every `full_interval`-th layer (counting from
/// one) full attention, the others Gated DeltaNet linear attention with
/// these head counts and widths, and the full layers rotating a
/// `partial_rotary` share of their heads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearShape {
    /// One full-attention layer in this many (`full_attention_interval`).
    pub full_interval: usize,
    /// Query and key heads of a linear layer (`linear_num_key_heads`).
    pub key_heads: usize,
    /// Width of one query or key head (`linear_key_head_dim`).
    pub key_dim: usize,
    /// Value heads of a linear layer (`linear_num_value_heads`), a multiple
    /// of the key heads.
    pub value_heads: usize,
    /// Width of one value head (`linear_value_head_dim`).
    pub value_dim: usize,
    /// The causal convolution's kernel (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// The share of a full layer's head that rotates
    /// (`partial_rotary_factor`).
    pub partial_rotary: f64,
}

impl LinearShape {
    /// Whether layer `l` is a linear-attention layer.
    pub fn is_linear(&self, l: usize) -> bool {
        !(l + 1).is_multiple_of(self.full_interval.max(1))
    }

    /// The convolution's channels: queries, keys and values.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

/// Gemma 4's layers as its released text configs describe them: every
/// `full_interval`-th layer (counting from one) and the last attend to
/// every token with heads `full_head_dim` wide (`global_head_dim`), the
/// others slide over `window` tokens with the shape's `head_dim`; the last
/// `shared` layers store no K/V and read the last unshared layer of their
/// type; every layer adds a per-layer input `layer_input` wide, made from
/// its own token table (`embed_tokens_per_layer`) and a projection of the
/// embedding. The sliding layers rotate whole heads at base
/// `sliding_theta`, the full ones a quarter of each head, proportionally,
/// at the shape's `rope_theta`. The full layers have `full_kv_heads` K/V
/// heads and, where `keys_are_values`, no value projection (their values
/// are their keys before the key norm and rotation); V is RMS-normed
/// without a weight, and the logits are soft-capped at `softcap`. A shape
/// without per-layer inputs has `layer_input` 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma4Shape {
    /// One full layer in this many, the last layer full besides.
    pub full_interval: usize,
    /// The sliding layers' window (`sliding_window`).
    pub window: usize,
    /// The full layers' head width (`global_head_dim`).
    pub full_head_dim: usize,
    /// The full layers' K/V heads (`num_global_key_value_heads`, which the
    /// config names only where `keys_are_values`; else the shape's
    /// `num_kv_heads`).
    pub full_kv_heads: usize,
    /// The full layers' keys are their values (`attention_k_eq_v`).
    pub keys_are_values: bool,
    /// Width of each layer's input (`hidden_size_per_layer_input`; 0: the
    /// model has none).
    pub layer_input: usize,
    /// Layers at the top that read an earlier layer's K/V
    /// (`num_kv_shared_layers`).
    pub shared: usize,
    /// The shared layers' MLPs are twice `intermediate_size`
    /// (`use_double_wide_mlp`).
    pub double_wide_mlp: bool,
    /// The sliding layers' RoPE base.
    pub sliding_theta: f64,
    /// The final logits' soft cap (`final_logit_softcapping`).
    pub softcap: f64,
}

impl Gemma4Shape {
    /// The share of a full layer's head that rotates (`partial_rotary_factor`).
    pub const FULL_ROTARY: f64 = 0.25;

    /// Whether layer `l` of `layers` is a full-attention layer.
    pub fn is_full(&self, l: usize, layers: usize) -> bool {
        (l + 1).is_multiple_of(self.full_interval.max(1)) || l + 1 == layers
    }

    /// Whether layer `l` of `layers` stores its own K/V.
    pub fn owns_kv(&self, l: usize, layers: usize) -> bool {
        l + self.shared < layers
    }

    /// Whether layer `l` of `layers` has a value projection: it stores its
    /// own K/V, and is not a full layer whose keys are its values.
    pub fn has_values(&self, l: usize, layers: usize) -> bool {
        self.owns_kv(l, layers) && !(self.keys_are_values && self.is_full(l, layers))
    }

    /// Layer `l`'s K/V heads, given the sliding layers' `kv_heads`.
    pub fn kv_heads(&self, l: usize, layers: usize, kv_heads: usize) -> usize {
        match self.is_full(l, layers) {
            true => self.full_kv_heads,
            false => kv_heads,
        }
    }

    /// Layer `l`'s MLP width, given the config's `intermediate_size`.
    pub fn mlp_width(&self, l: usize, layers: usize, intermediate: usize) -> usize {
        match self.double_wide_mlp && !self.owns_kv(l, layers) {
            true => 2 * intermediate,
            false => intermediate,
        }
    }

    /// The shared layers of the shape cut to `layers` deep from `from`:
    /// the same share of the depth, the unshared layers rounded up to end
    /// on a full layer (each shared layer's source is below it), none
    /// where the whole cut model is that deep. E2B's 20 of 35 stay 20;
    /// at 10 layers, 5 (layers 0-4 hold K/V, the full layer 4 among them).
    pub fn shared_at(&self, layers: usize, from: usize) -> usize {
        if layers == from || self.shared == 0 {
            return self.shared.min(layers.saturating_sub(1));
        }
        let unshared = (layers * (from - self.shared)).div_ceil(from.max(1));
        let unshared = unshared.div_ceil(self.full_interval) * self.full_interval;
        layers.saturating_sub(unshared.max(self.full_interval))
    }
}

/// A model's shape: sizes and layout, biases, RoPE scaling, tied head and
/// special tokens; everything its `config.json` says besides the dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// The name it is known by (`llama-3.1-8b`).
    pub name: String,
    /// Layers, widths, heads, vocabulary, constants and the layer layout
    /// (which decides the family, [`ModelShape::family`]).
    pub sizes: LlamaShape,
    /// The q, k and v projections have biases. On Llama's layout this makes
    /// the shape Qwen2 (written as `qwen2`); on another layout it is the
    /// config's `attention_bias` (which llama.cpp's `smollm3` and `olmo2`
    /// do not load; no named shape has it).
    pub qkv_bias: bool,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// The LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// BoS and EoS ids.
    pub tokens: SpecialTokens,
    /// Width of one head where it is not `hidden_size / num_heads`
    /// (Qwen3-30B-A3B's 128 at width 2048 and 32 heads); `None`: that
    /// quotient ([`ModelShape::head_dim`]).
    pub head_dim: Option<usize>,
    /// A mixture of experts in place of every layer's MLP (which makes the
    /// shape Qwen3-MoE, Mixtral or Qwen3.5-MoE); `None`: a dense MLP.
    pub experts: Option<ExpertShape>,
    /// Qwen3.5's linear-attention layers (which make the shape Qwen3.5 or
    /// Qwen3.5-MoE); `None`: every layer attends.
    pub linear: Option<LinearShape>,
    /// Gemma 4's layers (which make the shape Gemma 4); `None`: another
    /// family's.
    pub gemma4: Option<Gemma4Shape>,
}

/// The names [`named`] knows, in the order `lcut synth --help` lists them.
pub const NAMES: [&str; 14] = [
    "llama-3.2-1b",
    "qwen2.5-1.5b",
    "smollm3-3b",
    "olmo-3-7b",
    "llama-3.1-8b",
    "qwen3.5-9b",
    "gemma-4-e2b",
    "gemma-4-e4b",
    "gemma-4-26b-a4b",
    "qwen3-30b-a3b",
    "qwen3.5-35b-a3b",
    "gpt-oss-20b",
    "mixtral-8x7b",
    "small",
];

/// Llama 3's RoPE scaling with the given factor (its other constants are
/// the same in 3.1 and 3.2).
fn llama3_scaling(factor: f64) -> RopeScaling {
    RopeScaling::Llama3 {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    }
}

/// YaRN with `factor` over `original_max_position_embeddings` positions
/// and transformers' defaults for the rest (`beta_fast` 32, `beta_slow` 1,
/// attention factor 0.1 ln(factor) + 1, the ramp truncated), as a config
/// naming only those two reads back.
pub fn yarn_scaling(factor: f64, original_max_position_embeddings: f64) -> RopeScaling {
    RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: yarn_default_attention_factor(factor),
        truncate: true,
    }
}

/// transformers' YaRN attention factor for `factor` when the config names
/// none: 0.1 ln(factor) + 1, or 1 for a factor up to 1.
fn yarn_default_attention_factor(factor: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    }
}

/// YaRN's parameters as a config names them: `factor` and
/// `original_max_position_embeddings` always, then `beta_fast`,
/// `beta_slow` and `attention_factor` only where they differ from
/// transformers' defaults (which a reader supplies; llama.cpp's converter
/// writes a GGUF key for each one the config names). `None` without YaRN.
/// `truncate` is not a number and is left to the caller.
pub fn yarn_params(scaling: &RopeScaling) -> Option<Vec<(&'static str, f64)>> {
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate: _,
    } = *scaling
    else {
        return None;
    };
    let mut out = vec![
        ("factor", factor),
        (
            "original_max_position_embeddings",
            original_max_position_embeddings,
        ),
    ];
    for (name, value, default) in [
        ("beta_fast", beta_fast, 32.0),
        ("beta_slow", beta_slow, 1.0),
        (
            "attention_factor",
            attention_factor,
            yarn_default_attention_factor(factor),
        ),
    ] {
        if value != default {
            out.push((name, value));
        }
    }
    Some(out)
}

/// Llama 3's special tokens: `<|begin_of_text|>` and `<|end_of_text|>`.
const LLAMA3_TOKENS: SpecialTokens = SpecialTokens {
    bos: 128_000,
    eos: 128_001,
    pad: None,
};

/// meta-llama/Llama-3.2-1B: 16 layers, hidden 2048, 32 heads (8 K/V),
/// MLP 8192, vocabulary 128256, tied embeddings, Llama 3 RoPE (factor 32).
pub fn llama_3_2_1b() -> ModelShape {
    ModelShape {
        name: "llama-3.2-1b".into(),
        sizes: LlamaShape {
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_layers: 16,
            num_heads: 32,
            num_kv_heads: 8,
            rope_theta: 500_000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 131_072,
            layout: lcut_model::Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: llama3_scaling(32.0),
        tie_word_embeddings: true,
        tokens: LLAMA3_TOKENS,
        head_dim: None,
        experts: None,
        linear: None,
        gemma4: None,
    }
}

/// Qwen/Qwen2.5-1.5B: 28 layers, hidden 1536, 12 heads (2 K/V), MLP 8960,
/// vocabulary 151936, q/k/v biases, tied embeddings, RoPE base 10^6.
pub fn qwen2_5_1_5b() -> ModelShape {
    ModelShape {
        name: "qwen2.5-1.5b".into(),
        sizes: LlamaShape {
            vocab_size: 151_936,
            hidden_size: 1536,
            intermediate_size: 8960,
            num_layers: 28,
            num_heads: 12,
            num_kv_heads: 2,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 131_072,
            layout: lcut_model::Layout::Llama,
        },
        qkv_bias: true,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        // `<|endoftext|>` is both
        tokens: SpecialTokens {
            bos: 151_643,
            eos: 151_643,
            pad: None,
        },
        head_dim: None,
        experts: None,
        linear: None,
        gemma4: None,
    }
}

/// meta-llama/Llama-3.1-8B: 32 layers, hidden 4096, 32 heads (8 K/V), MLP
/// 14336, vocabulary 128256, untied head, Llama 3 RoPE (factor 8).
pub fn llama_3_1_8b() -> ModelShape {
    ModelShape {
        name: "llama-3.1-8b".into(),
        sizes: LlamaShape {
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            rope_theta: 500_000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 131_072,
            layout: lcut_model::Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: llama3_scaling(8.0),
        tie_word_embeddings: false,
        tokens: LLAMA3_TOKENS,
        head_dim: None,
        experts: None,
        linear: None,
        gemma4: None,
    }
}

/// HuggingFaceTB/SmolLM3-3B: 36 layers, hidden 2048, 16 heads (4 K/V), MLP
/// 11008, vocabulary 128256, tied embeddings, RMSNorm eps 1e-6, 65536
/// positions, RoPE base 5e6 on every layer but each 4th (counting from 1,
/// which has no RoPE), no RoPE scaling. BoS 128000 (`<|begin_of_text|>`,
/// as Llama 3's) and EoS 128012 (`<|im_end|>`, SmolLM3's own rather than
/// Llama 3's 128001); no pad. These figures are from memory of the
/// published `config.json`, not read from a downloaded file.
pub fn smollm3_3b() -> ModelShape {
    ModelShape {
        name: "smollm3-3b".into(),
        sizes: LlamaShape {
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 11_008,
            num_layers: 36,
            num_heads: 16,
            num_kv_heads: 4,
            rope_theta: 5_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 65_536,
            layout: Layout::Smollm3 { nope_interval: 4 },
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        tokens: SpecialTokens {
            bos: 128_000,
            eos: 128_012,
            pad: None,
        },
        head_dim: None,
        experts: None,
        linear: None,
        gemma4: None,
    }
}

/// allenai/Olmo-3-1025-7B: 32 layers, hidden 4096, 32 heads (32 K/V), MLP
/// 11008, vocabulary 100278, untied head, RMSNorm eps 1e-6, 65536
/// positions; OLMo's norms after the blocks and q/k norms over the whole
/// projection; three layers sliding over 4096 tokens, then a full one;
/// RoPE base 5e5, with YaRN (factor 8 over 8192 original positions,
/// transformers' default attention factor) on the full layers only. BoS
/// and EoS 100257 (`<|endoftext|>`), pad 100277 (`<|pad|>`). These figures
/// are from memory of the published `config.json`, not read from a
/// downloaded file.
pub fn olmo_3_7b() -> ModelShape {
    ModelShape {
        name: "olmo-3-7b".into(),
        sizes: LlamaShape {
            vocab_size: 100_278,
            hidden_size: 4096,
            intermediate_size: 11_008,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 32,
            rope_theta: 500_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 65_536,
            layout: Layout::Olmo { window: Some(4096) },
        },
        qkv_bias: false,
        rope_scaling: yarn_scaling(8.0, 8192.0),
        tie_word_embeddings: false,
        tokens: SpecialTokens {
            bos: 100_257,
            eos: 100_257,
            pad: Some(100_277),
        },
        head_dim: None,
        experts: None,
        linear: None,
        gemma4: None,
    }
}

/// Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads (4 K/V) of width
/// 128 (wider than 2048 / 32), per-head q/k norms, and in every layer 128
/// experts of inner width 768, 8 run per token with their weights
/// renormalised (`norm_topk_prob`); the config's dense
/// `intermediate_size` 6144 is used by no layer. Vocabulary 151936,
/// untied head, RoPE base 10^6, RMSNorm eps 1e-6, 40960 positions; BoS
/// 151643 (`<|endoftext|>`), EoS 151645 (`<|im_end|>`), no pad. About
/// 30.5e9 parameters, 3.3e9 run per token. These figures are from memory
/// of the published `config.json`, not read from a downloaded file.
pub fn qwen3_30b_a3b() -> ModelShape {
    ModelShape {
        name: "qwen3-30b-a3b".into(),
        sizes: LlamaShape {
            vocab_size: 151_936,
            hidden_size: 2048,
            intermediate_size: 6144,
            num_layers: 48,
            num_heads: 32,
            num_kv_heads: 4,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 40_960,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        tokens: SpecialTokens {
            bos: 151_643,
            eos: 151_645,
            pad: None,
        },
        head_dim: Some(128),
        experts: Some(ExpertShape {
            kind: ExpertsKind::Qwen3Moe,
            num_experts: 128,
            top_k: 8,
            inner: 768,
        }),
        linear: None,
        gemma4: None,
    }
}

/// mistralai/Mixtral-8x7B-v0.1: 32 layers, hidden 4096, 32 heads (8 K/V),
/// and in every layer 8 experts of inner width 14336, 2 run per token
/// (renormalised, as Mixtral always does); vocabulary 32000, untied head,
/// RoPE base 10^6, RMSNorm eps 1e-5, 32768 positions, no sliding window;
/// BoS 1 (`<s>`), EoS 2 (`</s>`), no pad. About 46.7e9 parameters,
/// 12.9e9 run per token. These figures are from memory of the published
/// `config.json`, not read from a downloaded file.
pub fn mixtral_8x7b() -> ModelShape {
    ModelShape {
        name: "mixtral-8x7b".into(),
        sizes: LlamaShape {
            vocab_size: 32_000,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 32_768,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        tokens: SpecialTokens {
            bos: 1,
            eos: 2,
            pad: None,
        },
        head_dim: None,
        experts: Some(ExpertShape {
            kind: ExpertsKind::Mixtral,
            num_experts: 8,
            top_k: 2,
            inner: 14_336,
        }),
        linear: None,
        gemma4: None,
    }
}

/// Qwen3.5's linear layers as both published sizes below have them: 16
/// query/key heads and 32 value heads, all 128 wide, a kernel of 4, one
/// full layer in four rotating a quarter of its 256-wide heads.
const QWEN35_LINEAR: LinearShape = LinearShape {
    full_interval: 4,
    key_heads: 16,
    key_dim: 128,
    value_heads: 32,
    value_dim: 128,
    conv_kernel: 4,
    partial_rotary: 0.25,
};

/// Qwen3.5's special tokens: BoS `<|endoftext|>` (248044, which its
/// tokenizer does not put before a text), EoS `<|im_end|>` (248046).
const QWEN35_TOKENS: SpecialTokens = SpecialTokens {
    bos: 248_044,
    eos: 248_046,
    pad: None,
};

/// Qwen/Qwen3.5-9B's language model (`qwen3_5_text`): 32 layers, hidden
/// 4096, three Gated DeltaNet layers then a full attention layer
/// ([`QWEN35_LINEAR`]), the full layers' 16 heads (4 K/V) 256 wide with
/// an output gate, MLP 12288, vocabulary 248320, untied head, RoPE base
/// 10^7, RMSNorm eps 1e-6, 262144 positions. About 8.95e9 parameters
/// (the checkpoint's "9B" adds its vision tower). These figures are from
/// memory of the published model card and `config.json`, not read from a
/// downloaded file; the parameter count agrees with the name.
pub fn qwen3_5_9b() -> ModelShape {
    ModelShape {
        name: "qwen3.5-9b".into(),
        sizes: LlamaShape {
            vocab_size: 248_320,
            hidden_size: 4096,
            intermediate_size: 12_288,
            num_layers: 32,
            num_heads: 16,
            num_kv_heads: 4,
            rope_theta: 10_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        tokens: QWEN35_TOKENS,
        head_dim: Some(256),
        experts: None,
        linear: Some(QWEN35_LINEAR),
        gemma4: None,
    }
}

/// Qwen/Qwen3.5-35B-A3B's language model (`qwen3_5_moe_text`): 40
/// layers, hidden 2048, Qwen3.5's linear and full layers
/// ([`QWEN35_LINEAR`]; the full layers' 16 heads, 2 K/V, 256 wide), and in
/// every layer 256 experts of inner width 512, 8 run per token
/// (renormalised), beside a shared expert of width 512; vocabulary
/// 248320, untied head, RoPE base 10^7, RMSNorm eps 1e-6, 262144
/// positions. About 34.7e9 parameters, 3.4e9 run per token. From memory
/// of the published model card and `config.json`, as [`qwen3_5_9b`]; the
/// counts agree with the name. The config's dense `intermediate_size` is
/// used by no layer and given the experts' width.
pub fn qwen3_5_35b_a3b() -> ModelShape {
    ModelShape {
        name: "qwen3.5-35b-a3b".into(),
        sizes: LlamaShape {
            vocab_size: 248_320,
            hidden_size: 2048,
            intermediate_size: 512,
            num_layers: 40,
            num_heads: 16,
            num_kv_heads: 2,
            rope_theta: 10_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        tokens: QWEN35_TOKENS,
        head_dim: Some(256),
        experts: Some(ExpertShape {
            kind: ExpertsKind::Qwen35Moe { shared_inner: 512 },
            num_experts: 256,
            top_k: 8,
            inner: 512,
        }),
        linear: Some(QWEN35_LINEAR),
        gemma4: None,
    }
}

/// openai/gpt-oss-20b: 24 layers, hidden 2880, 64 heads (8 K/V) 64 wide
/// with q/k/v/o biases and a sink logit each, layers alternating a
/// 128-token window and full attention (the first slides), and in every
/// layer 32 experts of inner width 2880, 4 run per token (softmax over
/// the chosen logits), their SwiGLU clamped at 7; vocabulary 201088,
/// untied head, RoPE base 150000 with YaRN (factor 32 over 4096 original
/// positions), RMSNorm eps 1e-5, 131072 positions; BoS 199998
/// (`<|startoftext|>`), EoS 200002 (`<|return|>`), pad 199999
/// (`<|endoftext|>`). About 20.9e9 parameters; a token runs 4.2e9 of them
/// (3.6e9 without the embedding, the count OpenAI gives). YaRN's ramp is
/// truncated here, as llama.cpp always runs it (the published config says
/// `truncate: false`), so that the folder and the GGUF file are one model.
/// From memory of the published `config.json`; the counts agree with the
/// model card.
pub fn gpt_oss_20b() -> ModelShape {
    ModelShape {
        name: "gpt-oss-20b".into(),
        sizes: LlamaShape {
            vocab_size: 201_088,
            hidden_size: 2880,
            intermediate_size: 2880,
            num_layers: 24,
            num_heads: 64,
            num_kv_heads: 8,
            rope_theta: 150_000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 131_072,
            layout: Layout::Llama,
        },
        qkv_bias: true,
        rope_scaling: yarn_scaling(32.0, 4096.0),
        tie_word_embeddings: false,
        tokens: SpecialTokens {
            bos: 199_998,
            eos: 200_002,
            pad: Some(199_999),
        },
        head_dim: Some(64),
        experts: Some(ExpertShape {
            kind: ExpertsKind::GptOss {
                sliding_window: 128,
            },
            num_experts: 32,
            top_k: 4,
            inner: 2880,
        }),
        linear: None,
        gemma4: None,
    }
}

/// Gemma 4's special tokens: BoS `<bos>` (2), EoS `<eos>` (1), pad `<pad>`
/// (0).
const GEMMA4_TOKENS: SpecialTokens = SpecialTokens {
    bos: 2,
    eos: 1,
    pad: Some(0),
};

/// google/gemma-4-E2B's language model (`gemma4_text`): 35 layers, hidden
/// 1536, 8 heads and one K/V head, four layers sliding over 512 tokens
/// with heads 256 wide then a full one with heads 512 wide (layers 4, 9,
/// ..., 34), the last 20 layers reading the K/V of layers 13 (sliding) and
/// 14 (full), their MLPs twice the others' 6144; per-layer inputs 256 wide
/// from a 262144-row table; vocabulary 262144, tied head, RoPE base 10^4
/// on the sliding layers and 10^6 (proportional, a quarter of each head)
/// on the full ones, RMSNorm eps 1e-6, 131072 positions, logits capped at
/// 30; BoS 2, EoS 1, pad 0. About 4.63e9 parameters, 2.28e9 without the
/// per-layer table (the model card's "2.3B effective"; its 5.1B adds the
/// vision and audio towers). From published text configs, not from a
/// downloaded file: four copies agree on every figure here, a fifth gives
/// the MLP 8192 wide (docs/layouts.md).
pub fn gemma_4_e2b() -> ModelShape {
    ModelShape {
        name: "gemma-4-e2b".into(),
        sizes: LlamaShape {
            vocab_size: 262_144,
            hidden_size: 1536,
            intermediate_size: 6144,
            num_layers: 35,
            num_heads: 8,
            num_kv_heads: 1,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 131_072,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        tokens: GEMMA4_TOKENS,
        head_dim: Some(256),
        experts: None,
        linear: None,
        gemma4: Some(Gemma4Shape {
            full_interval: 5,
            window: 512,
            full_head_dim: 512,
            full_kv_heads: 1,
            keys_are_values: false,
            layer_input: 256,
            shared: 20,
            double_wide_mlp: true,
            sliding_theta: 10_000.0,
            softcap: 30.0,
        }),
    }
}

/// google/gemma-4-E4B's language model (`gemma4_text`): 42 layers, hidden
/// 2560, 8 heads and two K/V heads, five layers sliding over 512 tokens
/// with heads 256 wide then a full one with heads 512 wide (layers 5, 11,
/// ..., 41), the last 18 layers reading the K/V of layers 22 (sliding) and
/// 23 (full), every MLP 10240 wide (no double-wide MLPs); per-layer inputs
/// 256 wide from a 262144-row table; vocabulary 262144, tied head, RoPE
/// base 10^4 on the sliding layers and 10^6 (proportional, a quarter of
/// each head) on the full ones, RMSNorm eps 1e-6, 131072 positions, logits
/// capped at 30; BoS 2, EoS 1, pad 0. From published text configs, not
/// from a downloaded file: four independent copies agree on every figure
/// here (docs/layouts.md).
pub fn gemma_4_e4b() -> ModelShape {
    ModelShape {
        name: "gemma-4-e4b".into(),
        sizes: LlamaShape {
            vocab_size: 262_144,
            hidden_size: 2560,
            intermediate_size: 10_240,
            num_layers: 42,
            num_heads: 8,
            num_kv_heads: 2,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 131_072,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        tokens: GEMMA4_TOKENS,
        head_dim: Some(256),
        experts: None,
        linear: None,
        gemma4: Some(Gemma4Shape {
            full_interval: 6,
            window: 512,
            full_head_dim: 512,
            full_kv_heads: 2,
            keys_are_values: false,
            layer_input: 256,
            shared: 18,
            double_wide_mlp: false,
            sliding_theta: 10_000.0,
            softcap: 30.0,
        }),
    }
}

/// google/gemma-4-26B-A4B's language model (`gemma4_text` with
/// `enable_moe_block`): 30 layers, hidden 2816, 16 heads; five layers
/// sliding over 1024 tokens with 8 K/V heads 256 wide, then a full one
/// (layers 5, 11, ..., 29) with 2 K/V heads 512 wide whose keys are its
/// values; in every layer a dense MLP 2112 wide beside 128 experts of
/// width 704, 8 run per token; no per-layer inputs and no shared K/V;
/// vocabulary 262144, tied head, RoPE base 10^4 on the sliding layers and
/// 10^6 (proportional, a quarter of each head) on the full ones, RMSNorm
/// eps 1e-6, 262144 positions, logits capped at 30; BoS 2, EoS 1, pad 0.
/// About 25.2e9 parameters, 3.8e9 run per token (the model card's "26B
/// A4B" counts the vision tower too). From published text configs, not
/// from a downloaded file: two independent copies agree on every figure
/// here, a third differs on two (docs/layouts.md).
pub fn gemma_4_26b_a4b() -> ModelShape {
    ModelShape {
        name: "gemma-4-26b-a4b".into(),
        sizes: LlamaShape {
            vocab_size: 262_144,
            hidden_size: 2816,
            intermediate_size: 2112,
            num_layers: 30,
            num_heads: 16,
            num_kv_heads: 8,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            layout: Layout::Llama,
        },
        qkv_bias: false,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        tokens: GEMMA4_TOKENS,
        head_dim: Some(256),
        experts: Some(ExpertShape {
            kind: ExpertsKind::Gemma4,
            num_experts: 128,
            top_k: 8,
            inner: 704,
        }),
        linear: None,
        gemma4: Some(Gemma4Shape {
            full_interval: 6,
            window: 1024,
            full_head_dim: 512,
            full_kv_heads: 2,
            keys_are_values: true,
            layer_input: 0,
            shared: 0,
            double_wide_mlp: false,
            sliding_theta: 10_000.0,
            softcap: 30.0,
        }),
    }
}

/// 8 layers, hidden 512, 8 heads, 2 KV heads, vocab 32000 (about 57M parameters).
pub fn small() -> LlamaShape {
    LlamaShape {
        vocab_size: 32000,
        hidden_size: 512,
        intermediate_size: 1408,
        num_layers: 8,
        num_heads: 8,
        num_kv_heads: 2,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 8192,
        layout: lcut_model::Layout::Llama,
    }
}

/// The shape of one of [`NAMES`] (case-insensitive); an unknown name is
/// refused with the list.
pub fn named(name: &str) -> Result<ModelShape> {
    let shape = match name.trim().to_ascii_lowercase().as_str() {
        "llama-3.2-1b" => llama_3_2_1b(),
        "qwen2.5-1.5b" => qwen2_5_1_5b(),
        "llama-3.1-8b" => llama_3_1_8b(),
        "smollm3-3b" => smollm3_3b(),
        "olmo-3-7b" => olmo_3_7b(),
        "qwen3-30b-a3b" => qwen3_30b_a3b(),
        "qwen3.5-9b" => qwen3_5_9b(),
        "qwen3.5-35b-a3b" => qwen3_5_35b_a3b(),
        "gemma-4-e2b" => gemma_4_e2b(),
        "gemma-4-e4b" => gemma_4_e4b(),
        "gemma-4-26b-a4b" => gemma_4_26b_a4b(),
        "gpt-oss-20b" => gpt_oss_20b(),
        "mixtral-8x7b" => mixtral_8x7b(),
        "small" => ModelShape::llama("small", small()),
        _ => {
            return Err(SynthError::UnknownShape {
                name: name.to_string(),
                known: NAMES.join(", "),
            });
        }
    };
    Ok(shape)
}

impl ModelShape {
    /// A model of these sizes and layout with an untied head, no biases,
    /// no RoPE scaling, BoS 1 and EoS 2: on Llama's layout a plain Llama,
    /// as the random models of the tests are.
    pub fn llama(name: &str, sizes: LlamaShape) -> Self {
        Self {
            name: name.to_string(),
            sizes,
            qkv_bias: false,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: false,
            tokens: SpecialTokens {
                bos: 1,
                eos: 2,
                pad: None,
            },
            head_dim: None,
            experts: None,
            linear: None,
            gemma4: None,
        }
    }

    /// The architecture family: Gemma 4 where the shape has its layers,
    /// Qwen3.5 or Qwen3.5-MoE where it has linear layers, else the experts' where it has any (Qwen3-MoE or
    /// Mixtral), else the layout's, Qwen2 for Llama's layout with q/k/v
    /// biases.
    pub fn family(&self) -> Family {
        if self.gemma4.is_some() {
            return Family::Gemma4;
        }
        match (self.experts.map(|e| e.kind), self.linear) {
            (Some(_), Some(_)) => return Family::Qwen35Moe,
            (None, Some(_)) => return Family::Qwen35,
            (Some(ExpertsKind::Qwen3Moe), None) => return Family::Qwen3Moe,
            (Some(ExpertsKind::Mixtral), None) => return Family::Mixtral,
            (Some(ExpertsKind::GptOss { .. }), None) => return Family::GptOss,
            // refused by `validate_own`: Gemma 4's experts need its layers
            (Some(ExpertsKind::Gemma4), None) => return Family::Gemma4,
            // refused by `validate_own`: Qwen3.5-MoE's experts need its
            // linear layers
            (Some(ExpertsKind::Qwen35Moe { .. }), None) => return Family::Qwen35Moe,
            (None, None) => {}
        }
        match self.sizes.layout {
            Layout::Llama if self.qkv_bias => Family::Qwen2,
            Layout::Llama => Family::Llama,
            Layout::Smollm3 { .. } => Family::Smollm3,
            Layout::Olmo { .. } => Family::Olmo,
            // refused by `validate_own`: a synthesized shape's experts are
            // its `experts` field, its linear layers its `linear` field, and
            // it has no Gemma 4 family
            Layout::Mixtral { .. } => Family::Mixtral,
            Layout::Qwen35 { .. } => Family::Qwen35,
            Layout::Gemma4 { .. } => Family::Llama,
        }
    }

    /// The architecture lcut reads this shape as (OLMo 3 when OLMo's
    /// layout has a window): its `model_type`, GGUF name and whether
    /// llama.cpp permutes its Q/K rows come from there.
    pub fn arch(&self) -> Arch {
        match (self.family(), self.sizes.layout) {
            (Family::Llama, _) => Arch::Llama,
            (Family::Qwen2, _) => Arch::Qwen2,
            (Family::Smollm3, _) => Arch::SmolLM3,
            (Family::Olmo, Layout::Olmo { window: Some(_) }) => Arch::Olmo3,
            (Family::Olmo, _) => Arch::Olmo2,
            (Family::Qwen3Moe, _) => Arch::Qwen3Moe,
            (Family::Mixtral, _) => Arch::Mixtral,
            (Family::Qwen35, _) => Arch::Qwen35,
            (Family::Qwen35Moe, _) => Arch::Qwen35Moe,
            (Family::GptOss, _) => Arch::GptOss,
            (Family::Gemma4, _) => Arch::Gemma4,
        }
    }

    /// Whether the tokenizer puts BoS before a text, as the checkpoint's
    /// does: Llama 3's, Mixtral's and Gemma 4's do; Qwen2's, Qwen3's, Qwen3.5's,
    /// SmolLM3's, OLMo's and gpt-oss's do not.
    pub fn adds_bos(&self) -> bool {
        matches!(
            self.family(),
            Family::Llama | Family::Mixtral | Family::Gemma4
        )
    }

    /// Width of one head: the shape's own where it names one, else
    /// `hidden_size / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or_else(|| self.sizes.head_dim())
    }

    /// The shape's own checks beyond its sizes' ([`LlamaShape::validate`]):
    /// a head width of its own is positive and even (RoPE rotates pairs),
    /// and Qwen3.5 and gpt-oss have one; Qwen3.5's linear layers pass
    /// [`Self::validate_linear`], and its experts come only with them;
    /// experts sit on Llama's layout, with q/k/v biases exactly for gpt-oss
    /// (whose window is positive), run at least one and at most all of at
    /// least one expert of positive width, and Mixtral's width is the
    /// config's `intermediate_size` (its config has no other field for
    /// it). Each refusal names the field.
    fn validate_own(&self) -> Result<()> {
        let bad = |field: &'static str, expected: String, found: String| {
            Err(SynthError::InvalidShape {
                shape: self.name.clone(),
                field,
                expected,
                found,
            })
        };
        if let Some(hd) = self.head_dim
            && (hd == 0 || hd % 2 == 1 || hd > lcut_model::config::MAX_SIZE)
        {
            return bad("head_dim", "a positive even width".into(), hd.to_string());
        }
        if let Layout::Mixtral { .. } | Layout::Qwen35 { .. } | Layout::Gemma4 { .. } =
            self.sizes.layout
        {
            return bad(
                "sizes.layout",
                "a layout without experts or linear layers (a shape's are its `experts` and \
                 `linear` fields), and not Gemma 4's (no shape of it yet)"
                    .into(),
                self.sizes.layout.to_string(),
            );
        }
        let gpt_oss = matches!(
            self.experts.map(|e| e.kind),
            Some(ExpertsKind::GptOss { .. })
        );
        if (self.linear.is_some() || gpt_oss) && self.head_dim.is_none() {
            return bad(
                "head_dim",
                "a width of its own (Qwen3.5's and gpt-oss's configs name it)".into(),
                "none".into(),
            );
        }
        if let Some(la) = self.linear {
            self.validate_linear(la)?;
        }
        if let Some(g) = self.gemma4 {
            self.validate_gemma4(g)?;
        }
        let Some(e) = self.experts else {
            return Ok(());
        };
        if (e.kind == ExpertsKind::Gemma4) != self.gemma4.is_some() {
            return bad(
                "experts.kind",
                "Gemma 4's experts exactly when the shape has Gemma 4's layers".into(),
                format!(
                    "{:?} with Gemma 4's layers: {}",
                    e.kind,
                    self.gemma4.is_some()
                ),
            );
        }
        if matches!(e.kind, ExpertsKind::Qwen35Moe { .. }) != self.linear.is_some() {
            return bad(
                "experts.kind",
                "Qwen3.5-MoE's experts exactly when the shape has linear layers".into(),
                format!("{:?} with linear layers: {}", e.kind, self.linear.is_some()),
            );
        }
        if let ExpertsKind::Qwen35Moe { shared_inner } = e.kind
            && (shared_inner == 0 || shared_inner > lcut_model::config::MAX_SIZE)
        {
            return bad(
                "experts.kind.shared_inner",
                "a positive width".into(),
                shared_inner.to_string(),
            );
        }
        if self.sizes.layout != Layout::Llama {
            return bad(
                "sizes.layout",
                "Llama's layout (the experts' families have no other)".into(),
                self.sizes.layout.to_string(),
            );
        }
        if self.qkv_bias != gpt_oss {
            return bad(
                "qkv_bias",
                "true for gpt-oss (its attention has biases), false for the other experts' families".into(),
                self.qkv_bias.to_string(),
            );
        }
        if let ExpertsKind::GptOss { sliding_window: 0 } = e.kind {
            return bad(
                "experts.kind.sliding_window",
                "a positive window".into(),
                "0".into(),
            );
        }
        if e.num_experts == 0 || e.num_experts > lcut_model::config::MAX_SIZE {
            return bad(
                "experts.num_experts",
                "a positive count".into(),
                e.num_experts.to_string(),
            );
        }
        if e.top_k == 0 || e.top_k > e.num_experts {
            return bad(
                "experts.top_k",
                format!("between 1 and the expert count ({})", e.num_experts),
                e.top_k.to_string(),
            );
        }
        if e.inner == 0 || e.inner > lcut_model::config::MAX_SIZE {
            return bad(
                "experts.inner",
                "a positive width".into(),
                e.inner.to_string(),
            );
        }
        if e.kind == ExpertsKind::Mixtral && e.inner != self.sizes.intermediate_size {
            return bad(
                "experts.inner",
                format!(
                    "Mixtral's intermediate_size ({}), the only width its config names",
                    self.sizes.intermediate_size
                ),
                e.inner.to_string(),
            );
        }
        Ok(())
    }

    /// The checks of Gemma 4's layers: on Llama's layout with a head width
    /// of its own, without q/k/v biases or linear layers, any experts
    /// Gemma 4's (checked with the others' by [`Self::validate_own`]);
    /// positive widths and interval (the per-layer inputs' may be 0), the
    /// full heads' width even, their K/V heads dividing the heads and, where
    /// their keys are not their values, the sliding layers' count (the
    /// config has no other field for it); and at least one layer holding
    /// K/V below the shared ones, of every type they read.
    fn validate_gemma4(&self, g: Gemma4Shape) -> Result<()> {
        let bad = |field: &'static str, expected: &str, found: String| {
            Err(SynthError::InvalidShape {
                shape: self.name.clone(),
                field,
                expected: expected.into(),
                found,
            })
        };
        if self.sizes.layout != Layout::Llama
            || self.qkv_bias
            || self.linear.is_some()
            || self.head_dim.is_none()
        {
            return bad(
                "gemma4",
                "Llama's layout with a head width of its own and no q/k/v biases or linear layers",
                format!(
                    "{} with q/k/v biases: {}, linear layers: {}, head width: {:?}",
                    self.sizes.layout,
                    self.qkv_bias,
                    self.linear.is_some(),
                    self.head_dim
                ),
            );
        }
        for (field, n) in [
            ("gemma4.full_interval", g.full_interval),
            ("gemma4.window", g.window),
            ("gemma4.full_kv_heads", g.full_kv_heads),
        ] {
            if n == 0 || n > lcut_model::config::MAX_SIZE {
                return bad(field, "a positive count or width", n.to_string());
            }
        }
        if g.layer_input > lcut_model::config::MAX_SIZE {
            return bad(
                "gemma4.layer_input",
                "a width (0: no per-layer inputs)",
                g.layer_input.to_string(),
            );
        }
        let heads = self.sizes.num_heads;
        if !heads.is_multiple_of(g.full_kv_heads)
            || (!g.keys_are_values && g.full_kv_heads != self.sizes.num_kv_heads)
        {
            return bad(
                "gemma4.full_kv_heads",
                &format!(
                    "a divisor of the {heads} heads, and the sliding layers' {} unless the \
                     full layers' keys are their values",
                    self.sizes.num_kv_heads
                ),
                g.full_kv_heads.to_string(),
            );
        }
        let fd = g.full_head_dim;
        if fd == 0 || fd % 2 == 1 || fd > lcut_model::config::MAX_SIZE {
            return bad(
                "gemma4.full_head_dim",
                "a positive even width",
                fd.to_string(),
            );
        }
        let layers = self.sizes.num_layers;
        let sources_below = |full: bool| {
            (0..layers)
                .filter(|&l| !g.owns_kv(l, layers) && g.is_full(l, layers) == full)
                .all(|_| {
                    (0..layers).any(|src| g.owns_kv(src, layers) && g.is_full(src, layers) == full)
                })
        };
        if g.shared >= layers || !sources_below(true) || !sources_below(false) {
            return bad(
                "gemma4.shared",
                "fewer than the layers, leaving below them a layer of each type they read",
                g.shared.to_string(),
            );
        }
        Ok(())
    }

    /// The checks of Qwen3.5's linear layers: on Llama's layout without
    /// q/k/v biases, positive counts and widths, value heads a multiple of the key heads
    /// and a rotated share that leaves a whole pair.
    fn validate_linear(&self, la: LinearShape) -> Result<()> {
        let bad = |field: &'static str, expected: &str, found: String| {
            Err(SynthError::InvalidShape {
                shape: self.name.clone(),
                field,
                expected: expected.into(),
                found,
            })
        };
        if self.sizes.layout != Layout::Llama || self.qkv_bias {
            return bad(
                "linear",
                "Llama's layout without q/k/v biases (Qwen3.5's full layers)",
                format!("{} with q/k/v biases: {}", self.sizes.layout, self.qkv_bias),
            );
        }
        for (field, n) in [
            ("linear.full_interval", la.full_interval),
            ("linear.key_heads", la.key_heads),
            ("linear.key_dim", la.key_dim),
            ("linear.value_heads", la.value_heads),
            ("linear.value_dim", la.value_dim),
            ("linear.conv_kernel", la.conv_kernel),
        ] {
            if n == 0 || n > lcut_model::config::MAX_SIZE {
                return bad(field, "a positive count or width", n.to_string());
            }
        }
        if !la.value_heads.is_multiple_of(la.key_heads) {
            return bad(
                "linear.value_heads",
                &format!("a multiple of the key heads ({})", la.key_heads),
                la.value_heads.to_string(),
            );
        }
        if !(la.partial_rotary > 0.0 && la.partial_rotary <= 1.0) || self.rotary_dim() < 2 {
            return bad(
                "linear.partial_rotary",
                "a share in (0, 1] that rotates at least one pair",
                la.partial_rotary.to_string(),
            );
        }
        Ok(())
    }

    /// Whether layer `l` has a value projection (`v_proj`): not on
    /// Qwen3.5's linear layers, nor on Gemma 4's shared layers and full
    /// layers whose keys are their values.
    pub fn has_value_projection(&self, l: usize) -> bool {
        let layers = self.sizes.num_layers;
        match (self.linear, self.gemma4) {
            (Some(la), _) => !la.is_linear(l),
            (None, Some(g)) => g.has_values(l, layers),
            (None, None) => true,
        }
    }

    /// How many of a head's values rotate: all of them, or on Qwen3.5's
    /// full layers the `partial_rotary` share, in whole pairs (llama.cpp's
    /// `rope.dimension_count`).
    pub fn rotary_dim(&self) -> usize {
        match self.linear {
            Some(la) => ((self.head_dim() as f64 * la.partial_rotary) as usize) & !1,
            None => self.head_dim(),
        }
    }

    /// The same shape with `layers` layers (`llama-3.2-1b` with 32 layers
    /// is a 1B-wide model as deep as an 8B one); the name says so.
    /// Gemma 4's shared layers keep their share of the depth
    /// ([`Gemma4Shape::shared_at`]).
    pub fn with_layers(mut self, layers: usize) -> Self {
        if layers != self.sizes.num_layers {
            if let Some(g) = &mut self.gemma4 {
                g.shared = g.shared_at(layers, self.sizes.num_layers);
            }
            self.name = format!("{}-{layers}l", self.name);
            self.sizes.num_layers = layers;
        }
        self
    }

    /// The Hugging Face `config.json` of this shape, weights stored as
    /// `torch_dtype` (`float32`, `bfloat16`).
    pub fn config_json(&self, torch_dtype: &str) -> Value {
        let mut config = self.sizes.config_json(self.tokens);
        let Value::Object(map) = &mut config else {
            return config;
        };
        map.insert("torch_dtype".into(), json!(torch_dtype));
        map.insert(
            "tie_word_embeddings".into(),
            json!(self.tie_word_embeddings),
        );
        map.insert("initializer_range".into(), json!(0.02));
        map.insert("attention_dropout".into(), json!(0.0));
        map.insert("use_cache".into(), json!(true));
        map.insert("attention_bias".into(), json!(self.qkv_bias));
        if let Some(scaling) = self.rope_scaling_json() {
            // the old top-level key: on OLMo 3, transformers (and lcut)
            // apply it to the full layers only
            map.insert("rope_scaling".into(), scaling);
        }
        if self.head_dim.is_some() {
            map.insert("head_dim".into(), json!(self.head_dim()));
        }
        // Gemma 4's experts are written with its layers (`gemma4_config`)
        if let Some(e) = self.experts.filter(|e| e.kind != ExpertsKind::Gemma4) {
            experts_config(map, &self.sizes, e);
        }
        if let Some(la) = self.linear {
            self.qwen35_config(map, la);
        }
        if let Some(g) = self.gemma4 {
            self.gemma4_config(map, g);
        }
        if self.family() == Family::Qwen2 {
            // Qwen2's config names no head width or bias switches (its
            // q/k/v always have biases), and keeps its window switched off
            for key in ["head_dim", "attention_bias", "mlp_bias"] {
                map.remove(key);
            }
            map.insert("model_type".into(), json!("qwen2"));
            map.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
            map.insert(
                "sliding_window".into(),
                json!(self.sizes.max_position_embeddings),
            );
            map.insert("use_sliding_window".into(), json!(false));
            map.insert("max_window_layers".into(), json!(self.sizes.num_layers));
        }
        config
    }

    /// Qwen3.5's fields into `map` (which holds Llama's and the experts'),
    /// as its text config names them: the model type, the layer types, the
    /// linear layers' sizes, and the rotated share beside the base in
    /// `rope_parameters`.
    fn qwen35_config(&self, map: &mut Map<String, Value>, la: LinearShape) {
        let (arch, model_type) = match self.experts {
            Some(_) => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
            None => ("Qwen3_5ForCausalLM", "qwen3_5_text"),
        };
        map.insert("architectures".into(), json!([arch]));
        map.insert("model_type".into(), json!(model_type));
        map.remove("mlp_bias");
        map.remove("rope_theta");
        let types: Vec<&str> = (0..self.sizes.num_layers)
            .map(|l| match la.is_linear(l) {
                true => "linear_attention",
                false => "full_attention",
            })
            .collect();
        map.insert("layer_types".into(), json!(types));
        map.insert("full_attention_interval".into(), json!(la.full_interval));
        map.insert("linear_num_key_heads".into(), json!(la.key_heads));
        map.insert("linear_key_head_dim".into(), json!(la.key_dim));
        map.insert("linear_num_value_heads".into(), json!(la.value_heads));
        map.insert("linear_value_head_dim".into(), json!(la.value_dim));
        map.insert("linear_conv_kernel_dim".into(), json!(la.conv_kernel));
        map.insert(
            "rope_parameters".into(),
            json!({
                "rope_type": "default",
                "rope_theta": self.sizes.rope_theta,
                "partial_rotary_factor": la.partial_rotary,
            }),
        );
    }

    /// Gemma 4's fields into `map` (which holds Llama's), as its released
    /// text configs name them: the model type, the layer types and window,
    /// the full layers' head width, K/V heads (named only where their keys
    /// are their values, as transformers reads them only then) and keys,
    /// the shared layers, the per-layer inputs, each layer type's RoPE, the
    /// soft cap, the GELU MLPs and the experts beside them.
    fn gemma4_config(&self, map: &mut Map<String, Value>, g: Gemma4Shape) {
        let s = &self.sizes;
        map.insert("architectures".into(), json!(["Gemma4ForCausalLM"]));
        map.insert("model_type".into(), json!("gemma4_text"));
        for key in ["mlp_bias", "rope_theta", "hidden_act"] {
            map.remove(key);
        }
        let types: Vec<&str> = (0..s.num_layers)
            .map(|l| match g.is_full(l, s.num_layers) {
                true => "full_attention",
                false => "sliding_attention",
            })
            .collect();
        let fields = json!({
            "layer_types": types,
            "sliding_window": g.window,
            "global_head_dim": g.full_head_dim,
            "num_global_key_value_heads": g.keys_are_values.then_some(g.full_kv_heads),
            "attention_k_eq_v": g.keys_are_values,
            "num_kv_shared_layers": g.shared,
            "use_double_wide_mlp": g.double_wide_mlp,
            "hidden_size_per_layer_input": g.layer_input,
            "vocab_size_per_layer_input": s.vocab_size,
            "final_logit_softcapping": g.softcap,
            "hidden_activation": "gelu_pytorch_tanh",
            "enable_moe_block": self.experts.is_some(),
            "num_experts": self.experts.map(|e| e.num_experts),
            "top_k_experts": self.experts.map(|e| e.top_k),
            "moe_intermediate_size": self.experts.map(|e| e.inner),
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "proportional",
                    "rope_theta": s.rope_theta,
                    "partial_rotary_factor": Gemma4Shape::FULL_ROTARY,
                },
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": g.sliding_theta,
                },
            },
        });
        if let Value::Object(fields) = fields {
            map.extend(fields);
        }
    }

    /// The config's `rope_scaling` object: Llama 3's or YaRN's parameters
    /// (YaRN's defaults left out, [`yarn_params`]); `None` without scaling
    /// (linear scaling is not written either).
    fn rope_scaling_json(&self) -> Option<Value> {
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = self.rope_scaling
        {
            return Some(json!({
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings as u64,
                "rope_type": "llama3"
            }));
        }
        let params = yarn_params(&self.rope_scaling)?;
        let mut obj = Map::new();
        obj.insert("rope_type".into(), json!("yarn"));
        for (name, value) in params {
            let value = match name {
                "original_max_position_embeddings" => json!(value as u64),
                _ => json!(value),
            };
            obj.insert(name.into(), value);
        }
        if let RopeScaling::Yarn {
            truncate: false, ..
        } = self.rope_scaling
        {
            obj.insert("truncate".into(), json!(false));
        }
        Some(Value::Object(obj))
    }

    /// The decoder config of this shape, read through the same parser as a
    /// `config.json` on disk; an invalid shape is refused by field.
    pub fn config(&self) -> Result<ModelConfig> {
        self.sizes
            .validate_heads_of(self.head_dim)
            .map_err(lcut_model::ModelError::from)?;
        self.validate_own()?;
        let text = self.config_json("float32").to_string();
        Ok(ModelConfig::from_json_str(
            &text,
            Path::new("(model shape)/config.json"),
        )?)
    }

    /// Every weight in the order Hugging Face writes them: the embedding,
    /// each layer's (attention with its biases, MLP, then the layout's
    /// norms, as [`LlamaShape::weight_shapes`] names them; with experts,
    /// the attention, the router, every expert's gate, up and down
    /// projections and the norms), the final norm and the LM head (none
    /// when tied). Norms are of kind [`TensorKind::Norm`] (drawn as ones);
    /// a shape with experts draws its embedding as a
    /// [`TensorKind::RoutedEmbedding`].
    pub fn tensors(&self) -> Vec<TensorSpec> {
        const EMBED: &str = "model.embed_tokens.weight";
        const HEAD: &str = "lm_head.weight";
        let routed = self.experts.is_some();
        let spec = |(name, dims): (String, Vec<usize>)| TensorSpec {
            kind: match draw::kind_of(&name) {
                TensorKind::Matrix if routed && name == EMBED => TensorKind::RoutedEmbedding,
                kind => kind,
            },
            name,
            dims,
        };
        let (layers, top): (Vec<_>, Vec<_>) = self
            .sizes
            .weight_shapes()
            .into_iter()
            .partition(|(name, _)| name.starts_with("model.layers."));
        let mut out: Vec<TensorSpec> = top
            .iter()
            .filter(|(name, _)| name == EMBED)
            .cloned()
            .map(spec)
            .collect();
        if let Some(la) = self.linear {
            return self.qwen35_tensors(la);
        }
        if let Some(g) = self.gemma4 {
            return self.gemma4_tensors(g);
        }
        if let Some(e) = self
            .experts
            .filter(|e| matches!(e.kind, ExpertsKind::GptOss { .. }))
        {
            return self.gpt_oss_tensors(e);
        }
        let layers = match self.experts {
            Some(e) => (0..self.sizes.num_layers)
                .flat_map(|l| self.expert_layer(l, e))
                .collect(),
            None => layers,
        };
        for (name, dims) in layers {
            let bias = self.qkv_bias
                && [".q_proj.weight", ".k_proj.weight", ".v_proj.weight"]
                    .iter()
                    .any(|p| name.ends_with(p));
            let bias = bias.then(|| TensorSpec {
                name: format!("{}.bias", name.trim_end_matches(".weight")),
                dims: dims[..1].to_vec(),
                kind: TensorKind::Bias,
            });
            out.push(spec((name, dims)));
            out.extend(bias);
        }
        out.extend(
            top.into_iter()
                .filter(|(name, _)| name != EMBED && !(self.tie_word_embeddings && name == HEAD))
                .map(spec),
        );
        out
    }

    /// Every weight of a Gemma 4 shape with layers `g`, in transformers'
    /// order: the embedding (a [`TensorKind::ScaledRoutedEmbedding`] where
    /// the shape has experts) and, where
    /// the shape has per-layer inputs, their table, projection and norm;
    /// each layer's input norm, queries, keys and values with their norms
    /// (no keys or values in a shared layer, no values in a full layer
    /// whose keys are its values; the q/k norms of kind
    /// [`TensorKind::QkScaleNorm`]), output, MLP of the layer's width,
    /// the sandwich norms, the layer scalar (drawn as a norm: one), the
    /// per-layer input's gate, projection and norm, and the experts beside
    /// the MLP ([`ExpertsKind::Gemma4`]: the router and its two scales,
    /// drawn as norms, the stacked experts and the branch's three norms);
    /// the final norm (the head is the embedding).
    fn gemma4_tensors(&self, g: Gemma4Shape) -> Vec<TensorSpec> {
        let s = &self.sizes;
        let (v, d, h, kv, layers) = (
            s.vocab_size,
            s.hidden_size,
            s.num_heads,
            s.num_kv_heads,
            s.num_layers,
        );
        let all = layers * g.layer_input;
        let spec = |name: String, dims: Vec<usize>| TensorSpec {
            kind: draw::kind_of(&name),
            name,
            dims,
        };
        let of_kind =
            |name: String, dims: Vec<usize>, kind: TensorKind| TensorSpec { name, dims, kind };
        let embedding = match self.experts {
            Some(_) => TensorKind::ScaledRoutedEmbedding,
            None => TensorKind::Matrix,
        };
        let mut out = vec![of_kind(
            "model.embed_tokens.weight".into(),
            vec![v, d],
            embedding,
        )];
        if g.layer_input > 0 {
            out.extend([
                spec("model.embed_tokens_per_layer.weight".into(), vec![v, all]),
                spec(
                    "model.per_layer_model_projection.weight".into(),
                    vec![all, d],
                ),
                spec(
                    "model.per_layer_projection_norm.weight".into(),
                    vec![g.layer_input],
                ),
            ]);
        }
        for l in 0..layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let hd = match g.is_full(l, layers) {
                true => g.full_head_dim,
                false => self.head_dim(),
            };
            let kv = g.kv_heads(l, layers, kv);
            let w = g.mlp_width(l, layers, s.intermediate_size);
            out.push(spec(format!("{p}.input_layernorm.weight"), vec![d]));
            out.push(spec(format!("{a}.q_proj.weight"), vec![h * hd, d]));
            if g.owns_kv(l, layers) {
                out.push(spec(format!("{a}.k_proj.weight"), vec![kv * hd, d]));
            }
            if g.has_values(l, layers) {
                out.push(spec(format!("{a}.v_proj.weight"), vec![kv * hd, d]));
            }
            out.push(spec(format!("{a}.o_proj.weight"), vec![d, h * hd]));
            let qk_norm = |name: String| TensorSpec {
                name,
                dims: vec![hd],
                kind: TensorKind::QkScaleNorm,
            };
            out.push(qk_norm(format!("{a}.q_norm.weight")));
            if g.owns_kv(l, layers) {
                out.push(qk_norm(format!("{a}.k_norm.weight")));
            }
            out.extend([
                spec(format!("{p}.mlp.gate_proj.weight"), vec![w, d]),
                spec(format!("{p}.mlp.up_proj.weight"), vec![w, d]),
                spec(format!("{p}.mlp.down_proj.weight"), vec![d, w]),
                spec(format!("{p}.post_attention_layernorm.weight"), vec![d]),
                spec(format!("{p}.pre_feedforward_layernorm.weight"), vec![d]),
                spec(format!("{p}.post_feedforward_layernorm.weight"), vec![d]),
                of_kind(format!("{p}.layer_scalar"), vec![1], TensorKind::Norm),
            ]);
            if g.layer_input > 0 {
                out.extend([
                    spec(
                        format!("{p}.per_layer_input_gate.weight"),
                        vec![g.layer_input, d],
                    ),
                    spec(
                        format!("{p}.per_layer_projection.weight"),
                        vec![d, g.layer_input],
                    ),
                    spec(format!("{p}.post_per_layer_input_norm.weight"), vec![d]),
                ]);
            }
            if let Some(e) = self.experts {
                let (n, i) = (e.num_experts, e.inner);
                out.extend([
                    of_kind(
                        format!("{p}.router.proj.weight"),
                        vec![n, d],
                        TensorKind::ScaledRouter,
                    ),
                    of_kind(format!("{p}.router.scale"), vec![d], TensorKind::Norm),
                    of_kind(
                        format!("{p}.router.per_expert_scale"),
                        vec![n],
                        TensorKind::Norm,
                    ),
                    spec(format!("{p}.experts.gate_up_proj"), vec![n, 2 * i, d]),
                    spec(format!("{p}.experts.down_proj"), vec![n, d, i]),
                ]);
                // named past `norm.weight`, which `draw::kind_of` goes by
                out.extend(
                    [
                        "pre_feedforward_layernorm_2",
                        "post_feedforward_layernorm_1",
                        "post_feedforward_layernorm_2",
                    ]
                    .map(|norm| of_kind(format!("{p}.{norm}.weight"), vec![d], TensorKind::Norm)),
                );
            }
        }
        out.push(spec("model.norm.weight".into(), vec![d]));
        out
    }

    /// Every weight of a Qwen3.5 shape with linear layers `la`, each of its
    /// kind: the embedding (routed where the shape has experts), each
    /// layer's input norm, its mixer (a linear layer's projections,
    /// convolution, step biases, decay rates, gated norm and output; a full
    /// layer's gated queries, keys, values, output and q/k norms), its MLP
    /// (dense, or the router, every expert and the shared expert with its
    /// gate) and its norm before the MLP, then the final norm and the head.
    /// Every norm but the linear layers' gated one is a
    /// [`TensorKind::OffsetNorm`].
    fn qwen35_tensors(&self, la: LinearShape) -> Vec<TensorSpec> {
        let s = &self.sizes;
        let (d, h, kv, hd) = (s.hidden_size, s.num_heads, s.num_kv_heads, self.head_dim());
        let spec =
            |name: String, dims: Vec<usize>, kind: TensorKind| TensorSpec { name, dims, kind };
        let matrix = |name: String, dims: Vec<usize>| spec(name, dims, TensorKind::Matrix);
        let embedding = match self.experts {
            Some(_) => TensorKind::RoutedEmbedding,
            None => TensorKind::Matrix,
        };
        let mut out = vec![spec(
            "model.embed_tokens.weight".into(),
            vec![s.vocab_size, d],
            embedding,
        )];
        for l in 0..s.num_layers {
            let p = format!("model.layers.{l}");
            out.push(spec(
                format!("{p}.input_layernorm.weight"),
                vec![d],
                TensorKind::OffsetNorm,
            ));
            if la.is_linear(l) {
                let x = format!("{p}.linear_attn");
                let (vh, values) = (la.value_heads, la.value_heads * la.value_dim);
                out.extend([
                    matrix(
                        format!("{x}.in_proj_qkv.weight"),
                        vec![la.conv_channels(), d],
                    ),
                    matrix(format!("{x}.in_proj_z.weight"), vec![values, d]),
                    matrix(format!("{x}.in_proj_b.weight"), vec![vh, d]),
                    matrix(format!("{x}.in_proj_a.weight"), vec![vh, d]),
                    spec(
                        format!("{x}.conv1d.weight"),
                        vec![la.conv_channels(), 1, la.conv_kernel],
                        TensorKind::Convolution,
                    ),
                    spec(format!("{x}.dt_bias"), vec![vh], TensorKind::Bias),
                    spec(format!("{x}.A_log"), vec![vh], TensorKind::DecayLog),
                    spec(
                        format!("{x}.norm.weight"),
                        vec![la.value_dim],
                        TensorKind::Norm,
                    ),
                    matrix(format!("{x}.out_proj.weight"), vec![d, values]),
                ]);
            } else {
                let x = format!("{p}.self_attn");
                out.extend([
                    // each head's queries, then its output gate
                    matrix(format!("{x}.q_proj.weight"), vec![2 * h * hd, d]),
                    matrix(format!("{x}.k_proj.weight"), vec![kv * hd, d]),
                    matrix(format!("{x}.v_proj.weight"), vec![kv * hd, d]),
                    matrix(format!("{x}.o_proj.weight"), vec![d, h * hd]),
                    spec(
                        format!("{x}.q_norm.weight"),
                        vec![hd],
                        TensorKind::OffsetNorm,
                    ),
                    spec(
                        format!("{x}.k_norm.weight"),
                        vec![hd],
                        TensorKind::OffsetNorm,
                    ),
                ]);
            }
            let gated = |x: &str, inner: usize| {
                [
                    matrix(format!("{x}.gate_proj.weight"), vec![inner, d]),
                    matrix(format!("{x}.up_proj.weight"), vec![inner, d]),
                    matrix(format!("{x}.down_proj.weight"), vec![d, inner]),
                ]
            };
            match self.experts {
                Some(e) => {
                    out.push(spec(
                        format!("{p}.mlp.gate.weight"),
                        vec![e.num_experts, d],
                        TensorKind::Router,
                    ));
                    for i in 0..e.num_experts {
                        out.extend(gated(&format!("{p}.mlp.experts.{i}"), e.inner));
                    }
                    if let ExpertsKind::Qwen35Moe { shared_inner } = e.kind {
                        out.extend(gated(&format!("{p}.mlp.shared_expert"), shared_inner));
                        out.push(spec(
                            format!("{p}.mlp.shared_expert_gate.weight"),
                            vec![1, d],
                            TensorKind::Router,
                        ));
                    }
                }
                None => out.extend(gated(&format!("{p}.mlp"), s.intermediate_size)),
            }
            out.push(spec(
                format!("{p}.post_attention_layernorm.weight"),
                vec![d],
                TensorKind::OffsetNorm,
            ));
        }
        out.push(spec(
            "model.norm.weight".into(),
            vec![d],
            TensorKind::OffsetNorm,
        ));
        if !self.tie_word_embeddings {
            out.push(matrix("lm_head.weight".into(), vec![s.vocab_size, d]));
        }
        out
    }

    /// Every weight of a gpt-oss shape with experts `e`, each of its kind,
    /// in the order transformers registers them: the embedding (routed),
    /// each layer's input norm, attention (q/k/v/o with biases, the sinks),
    /// router and its bias, the fused experts and their biases, and its
    /// norm before the experts, then the final norm and the head.
    fn gpt_oss_tensors(&self, e: ExpertShape) -> Vec<TensorSpec> {
        let s = &self.sizes;
        let (d, h, kv, hd) = (s.hidden_size, s.num_heads, s.num_kv_heads, self.head_dim());
        let (n, inner) = (e.num_experts, e.inner);
        let spec =
            |name: String, dims: Vec<usize>, kind: TensorKind| TensorSpec { name, dims, kind };
        let mut out = vec![spec(
            "model.embed_tokens.weight".into(),
            vec![s.vocab_size, d],
            TensorKind::RoutedEmbedding,
        )];
        for l in 0..s.num_layers {
            let p = format!("model.layers.{l}");
            out.push(spec(
                format!("{p}.input_layernorm.weight"),
                vec![d],
                TensorKind::Norm,
            ));
            for (proj, rows, cols) in [
                ("q_proj", h * hd, d),
                ("k_proj", kv * hd, d),
                ("v_proj", kv * hd, d),
                ("o_proj", d, h * hd),
            ] {
                let x = format!("{p}.self_attn.{proj}");
                out.push(spec(
                    format!("{x}.weight"),
                    vec![rows, cols],
                    TensorKind::Matrix,
                ));
                out.push(spec(format!("{x}.bias"), vec![rows], TensorKind::Bias));
            }
            out.extend([
                spec(format!("{p}.self_attn.sinks"), vec![h], TensorKind::Bias),
                spec(
                    format!("{p}.mlp.router.weight"),
                    vec![n, d],
                    TensorKind::Router,
                ),
                spec(format!("{p}.mlp.router.bias"), vec![n], TensorKind::Bias),
                spec(
                    format!("{p}.mlp.experts.gate_up_proj"),
                    vec![n, d, 2 * inner],
                    TensorKind::Matrix,
                ),
                spec(
                    format!("{p}.mlp.experts.gate_up_proj_bias"),
                    vec![n, 2 * inner],
                    TensorKind::Bias,
                ),
                spec(
                    format!("{p}.mlp.experts.down_proj"),
                    vec![n, inner, d],
                    TensorKind::Matrix,
                ),
                spec(
                    format!("{p}.mlp.experts.down_proj_bias"),
                    vec![n, d],
                    TensorKind::Bias,
                ),
                spec(
                    format!("{p}.post_attention_layernorm.weight"),
                    vec![d],
                    TensorKind::Norm,
                ),
            ]);
        }
        out.push(spec("model.norm.weight".into(), vec![d], TensorKind::Norm));
        if !self.tie_word_embeddings {
            out.push(spec(
                "lm_head.weight".into(),
                vec![s.vocab_size, d],
                TensorKind::Matrix,
            ));
        }
        out
    }

    /// Layer `l`'s weights of a shape with experts `e`, in the order
    /// transformers registers them: the attention's projections (of
    /// [`Self::head_dim`]-wide heads) and Qwen3's per-head q/k norms, the
    /// router, each expert's gate, up and down projections (Mixtral's
    /// `w1`, `w3`, `w2`), and the norms before attention and MLP.
    fn expert_layer(&self, l: usize, e: ExpertShape) -> Vec<(String, Vec<usize>)> {
        let s = &self.sizes;
        let (d, h, kv, hd) = (s.hidden_size, s.num_heads, s.num_kv_heads, self.head_dim());
        let p = format!("model.layers.{l}");
        let mut out = vec![
            (format!("{p}.self_attn.q_proj.weight"), vec![h * hd, d]),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv * hd, d]),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv * hd, d]),
            (format!("{p}.self_attn.o_proj.weight"), vec![d, h * hd]),
        ];
        let (block, [gate, up, down]) = match e.kind {
            // Qwen3.5-MoE's layers are listed by `qwen35_tensors`,
            // gpt-oss's by `gpt_oss_tensors`, Gemma 4's by `gemma4_tensors`
            ExpertsKind::Qwen3Moe
            | ExpertsKind::Qwen35Moe { .. }
            | ExpertsKind::GptOss { .. }
            | ExpertsKind::Gemma4 => {
                out.extend([
                    (format!("{p}.self_attn.q_norm.weight"), vec![hd]),
                    (format!("{p}.self_attn.k_norm.weight"), vec![hd]),
                ]);
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            ExpertsKind::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
        };
        out.push((format!("{p}.{block}.gate.weight"), vec![e.num_experts, d]));
        for i in 0..e.num_experts {
            let x = format!("{p}.{block}.experts.{i}");
            out.extend([
                (format!("{x}.{gate}.weight"), vec![e.inner, d]),
                (format!("{x}.{up}.weight"), vec![e.inner, d]),
                (format!("{x}.{down}.weight"), vec![d, e.inner]),
            ]);
        }
        out.extend([
            (format!("{p}.input_layernorm.weight"), vec![d]),
            (format!("{p}.post_attention_layernorm.weight"), vec![d]),
        ]);
        out
    }

    /// Number of weights.
    pub fn parameter_count(&self) -> u64 {
        self.tensors().iter().map(|t| t.len() as u64).sum()
    }

    /// Number of weights one token runs through: every weight but the
    /// experts it does not run (all experts of a layer being the same
    /// size, the weights of `top_k` of them); the routers count, as
    /// they run on every token. [`Self::parameter_count`] without experts.
    pub fn active_parameter_count(&self) -> u64 {
        let (top_k, experts) = self
            .experts
            .map_or((usize::MAX, 1), |e| (e.top_k, e.num_experts));
        self.tensors()
            .iter()
            .filter(|t| expert_index(&t.name).is_none_or(|i| i < top_k))
            .map(|t| match is_fused_experts(&t.name) {
                // every expert's weights in one tensor (gpt-oss)
                true => (t.len() / experts * top_k) as u64,
                false => t.len() as u64,
            })
            .sum()
    }
}

/// Whether weight `name` holds every expert's copy of a projection or its
/// bias in one tensor, experts first (gpt-oss's `mlp.experts.gate_up_proj`
/// and the like, Gemma 4's `experts.gate_up_proj` and `experts.down_proj`).
pub fn is_fused_experts(name: &str) -> bool {
    name.contains(".experts.") && expert_index(name).is_none()
}

/// The index of the expert weight `name` (Hugging Face name,
/// `...experts.I.PROJ.weight`) belongs to; `None` for any other weight.
pub fn expert_index(name: &str) -> Option<usize> {
    let (_, rest) = name.split_once(".experts.")?;
    rest.split('.').next()?.parse().ok()
}

/// The experts' fields of a Qwen3-MoE, Mixtral or Qwen3.5-MoE
/// `config.json`, as the published configs name them, into `map` (which
/// holds Llama's fields for `sizes`): Qwen3-MoE's every layer sparse with
/// its top-k renormalised (the only routing llama.cpp's `qwen3moe` runs),
/// Mixtral with no window, Qwen3.5-MoE's shared expert.
fn experts_config(map: &mut Map<String, Value>, sizes: &LlamaShape, e: ExpertShape) {
    map.remove("mlp_bias");
    map.insert("sliding_window".into(), Value::Null);
    map.insert("num_experts_per_tok".into(), json!(e.top_k));
    map.insert("output_router_logits".into(), json!(false));
    match e.kind {
        ExpertsKind::Qwen3Moe => {
            map.insert("architectures".into(), json!(["Qwen3MoeForCausalLM"]));
            map.insert("model_type".into(), json!("qwen3_moe"));
            map.insert("num_experts".into(), json!(e.num_experts));
            map.insert("moe_intermediate_size".into(), json!(e.inner));
            map.insert("norm_topk_prob".into(), json!(true));
            map.insert("decoder_sparse_step".into(), json!(1));
            map.insert("mlp_only_layers".into(), json!([]));
            map.insert("router_aux_loss_coef".into(), json!(0.001));
            map.insert("use_sliding_window".into(), json!(false));
            map.insert("max_window_layers".into(), json!(sizes.num_layers));
        }
        ExpertsKind::Qwen35Moe { shared_inner } => {
            // its model type and architecture are Qwen3.5's (`qwen35_config`)
            map.insert("num_experts".into(), json!(e.num_experts));
            map.insert("moe_intermediate_size".into(), json!(e.inner));
            map.insert(
                "shared_expert_intermediate_size".into(),
                json!(shared_inner),
            );
            map.insert("router_aux_loss_coef".into(), json!(0.001));
        }
        ExpertsKind::GptOss { sliding_window } => {
            map.insert("architectures".into(), json!(["GptOssForCausalLM"]));
            map.insert("model_type".into(), json!("gpt_oss"));
            map.insert("num_local_experts".into(), json!(e.num_experts));
            map.insert("intermediate_size".into(), json!(e.inner));
            map.insert("sliding_window".into(), json!(sliding_window));
            let types: Vec<&str> = (0..sizes.num_layers)
                .map(|l| match l % 2 {
                    0 => "sliding_attention",
                    _ => "full_attention",
                })
                .collect();
            map.insert("layer_types".into(), json!(types));
            map.insert("swiglu_limit".into(), json!(7.0));
            map.insert("router_aux_loss_coef".into(), json!(0.9));
        }
        // written with Gemma 4's layers (`gemma4_config`)
        ExpertsKind::Gemma4 => {}
        ExpertsKind::Mixtral => {
            map.insert("architectures".into(), json!(["MixtralForCausalLM"]));
            map.insert("model_type".into(), json!("mixtral"));
            map.insert("num_local_experts".into(), json!(e.num_experts));
            map.insert("router_aux_loss_coef".into(), json!(0.02));
            map.insert("router_jitter_noise".into(), json!(0.0));
        }
    }
}

impl From<LlamaShape> for ModelShape {
    fn from(sizes: LlamaShape) -> Self {
        Self::llama("random-llama", sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published parameter counts of the three checkpoints (1.24B,
    /// 1.54B, 8.03B), counted from the weights a shape lists and by the
    /// memory estimate from its config: the two must agree with the models.
    #[test]
    fn named_shapes_have_their_published_parameter_counts() {
        for (name, params) in [
            ("llama-3.2-1b", 1_235_814_400u64),
            ("qwen2.5-1.5b", 1_543_714_304),
            ("llama-3.1-8b", 8_030_261_248),
        ] {
            assert_counts(name, params);
        }
    }

    /// Shape `name` has `params` weights, counted from the tensors it lists
    /// and by the memory estimate from its config.
    fn assert_counts(name: &str, params: u64) {
        let shape = named(name).unwrap();
        assert_eq!(shape.parameter_count(), params, "{name}");
        let cfg = shape.config().unwrap();
        assert_eq!(lcut_model::memory::parameter_count(&cfg), params, "{name}");
    }

    /// The config read back has what makes each checkpoint itself: the
    /// family, tied head, Qwen2's biases and Llama 3's RoPE scaling.
    #[test]
    fn configs_read_back_with_family_tying_bias_and_rope() {
        let cfg = named("Qwen2.5-1.5B").unwrap().config().unwrap();
        assert_eq!(cfg.arch, lcut_model::Arch::Qwen2);
        assert!(cfg.qkv_bias && cfg.tie_word_embeddings);
        assert_eq!(cfg.head_dim, 128);
        assert!(cfg.sliding_window.iter().all(Option::is_none));
        assert_eq!(
            (cfg.bos_token_id, cfg.eos_token_ids.clone()),
            (Some(151_643), vec![151_643])
        );
        let cfg = named("llama-3.1-8b").unwrap().config().unwrap();
        assert!(!cfg.qkv_bias && !cfg.tie_word_embeddings);
        assert!(matches!(
            cfg.rope.scaling,
            RopeScaling::Llama3 { factor, .. } if factor == 8.0
        ));
        let one_b = named("llama-3.2-1b").unwrap();
        assert!(one_b.config().unwrap().tie_word_embeddings);
        assert!(!one_b.tensors().iter().any(|t| t.name == "lm_head.weight"));
        let deep = one_b.with_layers(32);
        assert_eq!(deep.name, "llama-3.2-1b-32l");
        assert_eq!(deep.config().unwrap().num_layers, 32);
    }

    /// SmolLM3-3B and OLMo-3-7B counted from the weights each shape lists
    /// and by the memory estimate from its config (these are the counts of
    /// the figures above, not checked against a published total).
    #[test]
    fn smollm3_and_olmo3_count_their_weights_as_their_configs_do() {
        for (name, params) in [
            ("smollm3-3b", 3_075_098_624u64),
            ("olmo-3-7b", 7_298_011_136),
        ] {
            assert_counts(name, params);
        }
    }

    /// The two mixtures of experts, counted from the weights each shape
    /// lists, by the memory estimate from its config, and by hand from the
    /// published sizes. Qwen3-30B-A3B, per layer: attention 2048 x (4096 +
    /// 512 + 512) + 4096 x 2048 = 18874368, q/k norms 2 x 128, two norms
    /// 2 x 2048, router 128 x 2048 = 262144, experts 128 x 3 x 2048 x 768
    /// = 603979776 (8 of them run: 37748736); 48 layers, embedding and
    /// head 2 x 151936 x 2048, final norm 2048: 30532122624 in all
    /// (30.5e9), 3353032704 run per token (3.3e9). Mixtral-8x7B, per
    /// layer: attention 4096 x (4096 + 1024 + 1024) + 4096 x 4096 =
    /// 41943040, norms 2 x 4096, router 8 x 4096 = 32768, experts 8 x 3 x
    /// 4096 x 14336 = 1409286144 (2 run: 352321536); 32 layers, embedding
    /// and head 2 x 32000 x 4096, final norm 4096: 46702792704 (46.7e9),
    /// 12879925248 run per token (12.9e9).
    #[test]
    fn the_mixtures_of_experts_count_their_weights_and_the_ones_a_token_runs() {
        let by_hand =
            |layer: u64, layers: u64, vocab: u64, d: u64| layers * layer + 2 * vocab * d + d;
        let qwen_layer = 18_874_368 + 2 * 128 + 2 * 2048 + 128 * 2048;
        let mixtral_layer = 41_943_040 + 2 * 4096 + 8 * 4096;
        for (name, params, active) in [
            (
                "qwen3-30b-a3b",
                by_hand(qwen_layer + 603_979_776, 48, 151_936, 2048),
                by_hand(qwen_layer + 37_748_736, 48, 151_936, 2048),
            ),
            (
                "mixtral-8x7b",
                by_hand(mixtral_layer + 1_409_286_144, 32, 32_000, 4096),
                by_hand(mixtral_layer + 352_321_536, 32, 32_000, 4096),
            ),
        ] {
            assert_counts(name, params);
            assert_eq!(
                named(name).unwrap().active_parameter_count(),
                active,
                "{name}"
            );
        }
        assert_counts("qwen3-30b-a3b", 30_532_122_624);
        assert_counts("mixtral-8x7b", 46_702_792_704);
        assert_eq!(qwen3_30b_a3b().active_parameter_count(), 3_353_032_704);
        assert_eq!(mixtral_8x7b().active_parameter_count(), 12_879_925_248);
        // a dense shape runs every weight
        let dense = llama_3_2_1b();
        assert_eq!(dense.active_parameter_count(), dense.parameter_count());
        // a cut keeps the experts and counts the layers it keeps
        let cut = qwen3_30b_a3b().with_layers(4);
        assert_eq!(cut.name, "qwen3-30b-a3b-4l");
        assert_eq!(
            cut.parameter_count(),
            by_hand(qwen_layer + 603_979_776, 4, 151_936, 2048)
        );
    }

    /// The configs read back as the checkpoints': Qwen3-MoE with its own
    /// head width, per-head q/k norms and every layer's 8 of 128 experts
    /// renormalised; Mixtral with Llama's attention, no window and its 2 of
    /// 8; both untied with their tokens.
    #[test]
    fn the_mixtures_of_experts_configs_read_back() {
        use lcut_model::config::{ExpertsConfig, QkNorm, RouterKind};
        let cfg = qwen3_30b_a3b().config().unwrap();
        assert_eq!(cfg.arch, Arch::Qwen3Moe);
        assert_eq!(
            (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads),
            (128, 32, 4)
        );
        assert_eq!(cfg.qk_norm, QkNorm::PerHead);
        assert_eq!(
            cfg.experts,
            Some(ExpertsConfig {
                router: RouterKind::SoftmaxTopK,
                bias: false,
                num_experts: 128,
                top_k: 8,
                inner: 768,
                normalize_top_k: true,
                shared_inner: None,
                beside_mlp: false,
            })
        );
        assert_eq!(cfg.sparse_layers, vec![true; 48]);
        assert_eq!((cfg.rope.theta, cfg.rms_norm_eps), (1e6, 1e-6));
        assert!(!cfg.tie_word_embeddings && !cfg.qkv_bias);
        assert_eq!(
            (cfg.bos_token_id, cfg.eos_token_ids),
            (Some(151_643), vec![151_645])
        );
        let cfg = mixtral_8x7b().config().unwrap();
        assert_eq!(cfg.arch, Arch::Mixtral);
        assert_eq!((cfg.head_dim, cfg.qk_norm), (128, QkNorm::None));
        let e = cfg.experts.unwrap();
        assert_eq!(
            (e.num_experts, e.top_k, e.inner, e.normalize_top_k),
            (8, 2, 14_336, true)
        );
        assert_eq!(cfg.sparse_layers, vec![true; 32]);
        assert!(cfg.sliding_window.iter().all(Option::is_none));
        assert_eq!((cfg.rope.theta, cfg.rms_norm_eps), (1e6, 1e-5));
        assert_eq!((cfg.bos_token_id, cfg.eos_token_ids), (Some(1), vec![2]));
        assert!(mixtral_8x7b().adds_bos() && !qwen3_30b_a3b().adds_bos());
    }

    /// A layer of experts lists its attention (Qwen3's heads 128 wide, its
    /// q/k norms one head wide), the router (its own kind), every expert's
    /// three projections under the family's names, and two norms; the
    /// embedding is drawn as a routed one.
    #[test]
    fn a_layer_of_experts_lists_its_router_and_every_expert() {
        let t = qwen3_30b_a3b().with_layers(2).tensors();
        let find = |name: &str| t.iter().find(|s| s.name == name).cloned();
        let p = "model.layers.1";
        for (name, dims, kind) in [
            ("self_attn.q_proj", vec![4096, 2048], TensorKind::Matrix),
            ("self_attn.k_proj", vec![512, 2048], TensorKind::Matrix),
            ("self_attn.o_proj", vec![2048, 4096], TensorKind::Matrix),
            ("self_attn.q_norm", vec![128], TensorKind::Norm),
            ("self_attn.k_norm", vec![128], TensorKind::Norm),
            ("mlp.gate", vec![128, 2048], TensorKind::Router),
            (
                "mlp.experts.127.gate_proj",
                vec![768, 2048],
                TensorKind::Matrix,
            ),
            ("mlp.experts.0.up_proj", vec![768, 2048], TensorKind::Matrix),
            (
                "mlp.experts.5.down_proj",
                vec![2048, 768],
                TensorKind::Matrix,
            ),
            ("post_attention_layernorm", vec![2048], TensorKind::Norm),
        ] {
            let s = find(&format!("{p}.{name}.weight")).unwrap_or_else(|| panic!("{name}"));
            assert_eq!((s.dims, s.kind), (dims, kind), "{name}");
        }
        assert!(find(&format!("{p}.mlp.gate_proj.weight")).is_none());
        assert_eq!(
            find("model.embed_tokens.weight").unwrap().kind,
            TensorKind::RoutedEmbedding
        );
        assert_eq!(find("lm_head.weight").unwrap().kind, TensorKind::Matrix);
        assert_eq!(t.len(), 3 + 2 * (4 + 2 + 1 + 3 * 128 + 2));
        let t = mixtral_8x7b().with_layers(1).tensors();
        let names: Vec<&str> = t.iter().map(|s| s.name.as_str()).collect();
        for name in [
            "model.layers.0.block_sparse_moe.gate.weight",
            "model.layers.0.block_sparse_moe.experts.7.w1.weight",
            "model.layers.0.block_sparse_moe.experts.7.w2.weight",
            "model.layers.0.block_sparse_moe.experts.7.w3.weight",
        ] {
            assert!(names.contains(&name), "{name}");
        }
        assert!(!names.iter().any(|n| n.contains("q_norm")));
        assert_eq!(
            expert_index("model.layers.0.block_sparse_moe.experts.7.w2.weight"),
            Some(7)
        );
        assert_eq!(expert_index("model.layers.0.mlp.gate.weight"), None);
        // a dense shape's embedding is a plain matrix
        let dense = llama_3_1_8b().with_layers(1).tensors();
        assert_eq!(dense[0].kind, TensorKind::Matrix);
    }

    /// A shape's own fields out of range or at odds with the rest are
    /// refused by field, before any weight is written.
    #[test]
    fn bad_expert_fields_are_refused_by_name() {
        type Spoil = fn(&mut ModelShape);
        let cases: [(&str, Spoil); 7] = [
            ("head_dim", |s| s.head_dim = Some(127)),
            ("head_dim", |s| s.head_dim = Some(0)),
            ("experts.top_k", |s| {
                if let Some(e) = s.experts.as_mut() {
                    e.top_k = 129;
                }
            }),
            ("experts.num_experts", |s| {
                if let Some(e) = s.experts.as_mut() {
                    e.num_experts = 0;
                }
            }),
            ("experts.inner", |s| {
                if let Some(e) = s.experts.as_mut() {
                    e.inner = 0;
                }
            }),
            ("sizes.layout", |s| {
                s.sizes.layout = Layout::Olmo { window: None }
            }),
            ("qkv_bias", |s| s.qkv_bias = true),
        ];
        for (field, spoil) in cases {
            let mut shape = qwen3_30b_a3b();
            spoil(&mut shape);
            match shape.config() {
                Err(SynthError::InvalidShape { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let mut mixtral = mixtral_8x7b();
        mixtral.sizes.intermediate_size = 4096;
        let err = mixtral.config().unwrap_err();
        assert!(err.to_string().contains("experts.inner"), "{err}");
        assert!(err.to_string().contains("mixtral-8x7b"), "{err}");
    }

    /// Each named shape's family and architecture follow its layout (and
    /// Qwen2's biases), and its config reads back as that architecture.
    #[test]
    fn the_family_follows_the_layout() {
        for (name, family, arch) in [
            ("llama-3.2-1b", Family::Llama, Arch::Llama),
            ("qwen2.5-1.5b", Family::Qwen2, Arch::Qwen2),
            ("smollm3-3b", Family::Smollm3, Arch::SmolLM3),
            ("olmo-3-7b", Family::Olmo, Arch::Olmo3),
            ("llama-3.1-8b", Family::Llama, Arch::Llama),
            ("qwen3-30b-a3b", Family::Qwen3Moe, Arch::Qwen3Moe),
            ("mixtral-8x7b", Family::Mixtral, Arch::Mixtral),
            ("qwen3.5-9b", Family::Qwen35, Arch::Qwen35),
            ("qwen3.5-35b-a3b", Family::Qwen35Moe, Arch::Qwen35Moe),
            ("gpt-oss-20b", Family::GptOss, Arch::GptOss),
            ("small", Family::Llama, Arch::Llama),
        ] {
            let shape = named(name).unwrap();
            assert_eq!((shape.family(), shape.arch()), (family, arch), "{name}");
            assert_eq!(shape.config().unwrap().arch, arch, "{name}");
        }
        let mut olmo2 = olmo_3_7b();
        olmo2.sizes.layout = Layout::Olmo { window: None };
        assert_eq!(olmo2.arch(), Arch::Olmo2);
        assert_eq!(olmo2.config().unwrap().arch, Arch::Olmo2);
        assert_eq!(
            NAMES.len(),
            NAMES.iter().filter(|n| named(n).is_ok()).count()
        );
    }

    /// SmolLM3's config: every 4th layer unrotated, tied head, its tokens.
    /// OLMo 3's: three sliding layers then a full one, YaRN written as the
    /// old top-level `rope_scaling` (factor and original context only) and
    /// read back on the full layers alone, norms after the blocks.
    #[test]
    fn smollm3_and_olmo3_configs_read_back_with_their_layout() {
        let cfg = smollm3_3b().config().unwrap();
        assert_eq!(cfg.rotates.len(), 36);
        let unrotated: Vec<usize> = (0..36).filter(|&l| !cfg.rotates[l]).collect();
        assert_eq!(unrotated, (1..=9).map(|k| 4 * k - 1).collect::<Vec<_>>());
        assert!(cfg.tie_word_embeddings && cfg.sliding_window.iter().all(Option::is_none));
        assert_eq!((cfg.rope.theta, cfg.rope.scaling), (5e6, RopeScaling::None));
        assert_eq!(
            (cfg.bos_token_id, cfg.eos_token_ids),
            (Some(128_000), vec![128_012])
        );

        let olmo = olmo_3_7b();
        let json = olmo.config_json("bfloat16");
        assert_eq!(
            json["rope_scaling"],
            json!({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192})
        );
        assert_eq!(json["pad_token_id"], 100_277);
        let cfg = olmo.config().unwrap();
        assert_eq!(cfg.rope.scaling, olmo.rope_scaling);
        assert!(matches!(
            cfg.rope.scaling,
            RopeScaling::Yarn { attention_factor, beta_fast, beta_slow, truncate: true, .. }
                if (attention_factor - (0.1 * 8f64.ln() + 1.0)).abs() < 1e-12
                    && beta_fast == 32.0 && beta_slow == 1.0
        ));
        let sliding = cfg.sliding_rope.unwrap();
        assert_eq!((sliding.theta, sliding.scaling), (5e5, RopeScaling::None));
        assert_eq!(cfg.norms, lcut_model::config::NormPlacement::Post);
        assert!(!cfg.tie_word_embeddings);
        let full: Vec<usize> = (0..32)
            .filter(|&l| cfg.sliding_window[l].is_none())
            .collect();
        assert_eq!(full, vec![3, 7, 11, 15, 19, 23, 27, 31]);
        assert!(cfg.sliding_window.iter().flatten().all(|&w| w == 4096));
        let cut = olmo.with_layers(4).config().unwrap();
        assert_eq!(
            cut.sliding_window,
            vec![Some(4096), Some(4096), Some(4096), None]
        );
        // YaRN's non-default parameters are written and read back too
        let mut tuned = olmo_3_7b();
        tuned.rope_scaling = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 16.0,
            beta_slow: 2.0,
            attention_factor: 1.5,
            truncate: false,
        };
        assert_eq!(tuned.config().unwrap().rope.scaling, tuned.rope_scaling);
    }

    /// OLMo's weights are its layout's: norms after attention and MLP,
    /// q/k norms over the whole projection, no norm before the blocks; all
    /// norms drawn as ones. Every shape lists exactly the weights
    /// [`LlamaShape::weight_shapes`] names (the LM head only when untied)
    /// plus Qwen2's biases.
    #[test]
    fn tensors_follow_the_layout() {
        let olmo = olmo_3_7b();
        let t = olmo.tensors();
        let find = |name: &str| t.iter().find(|s| s.name == name);
        let p = "model.layers.5";
        assert!(find(&format!("{p}.input_layernorm.weight")).is_none());
        for (norm, width) in [
            ("post_attention_layernorm", 4096),
            ("post_feedforward_layernorm", 4096),
            ("self_attn.q_norm", 32 * 128),
            ("self_attn.k_norm", 32 * 128),
        ] {
            let s = find(&format!("{p}.{norm}.weight")).unwrap();
            assert_eq!((s.dims.clone(), s.kind), (vec![width], TensorKind::Norm));
        }
        assert_eq!(t.first().unwrap().name, "model.embed_tokens.weight");
        assert_eq!(t.last().unwrap().name, "lm_head.weight");
        for shape in [
            llama_3_2_1b(),
            qwen2_5_1_5b(),
            smollm3_3b(),
            olmo_3_7b().with_layers(2),
        ] {
            let listed: std::collections::BTreeSet<String> = shape
                .tensors()
                .into_iter()
                .filter(|s| s.kind != TensorKind::Bias)
                .map(|s| s.name)
                .collect();
            let named: std::collections::BTreeSet<String> = shape
                .sizes
                .weight_shapes()
                .into_iter()
                .map(|(n, _)| n)
                .filter(|n| !(shape.tie_word_embeddings && n == "lm_head.weight"))
                .collect();
            assert_eq!(listed, named, "{}", shape.name);
            let biases = shape
                .tensors()
                .iter()
                .filter(|s| s.kind == TensorKind::Bias)
                .count();
            assert_eq!(
                biases,
                if shape.qkv_bias {
                    3 * shape.sizes.num_layers
                } else {
                    0
                }
            );
        }
    }

    #[test]
    fn an_unknown_shape_is_refused_with_the_names() {
        let err = named("llama-4-400b").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("llama-4-400b") && msg.contains("llama-3.1-8b"),
            "{msg}"
        );
        assert!(matches!(err, SynthError::UnknownShape { .. }));
    }
}
