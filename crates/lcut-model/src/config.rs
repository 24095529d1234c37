//! `config.json` of a Hugging Face model folder, read into one description
//! with per-architecture switches.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

mod gemma3;
mod gemma4;
mod layer_ropes;
mod multimodal;
pub(crate) use multimodal::decoder_model_type;
mod qwen3_5;

/// transformers' `Gemma3TextConfig` defaults a Gemma 3 config may leave out.
pub use gemma3::TEXT_CLASS_DEFAULTS as GEMMA3_TEXT_CLASS_DEFAULTS;

/// The architectures lcut implements, by their `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Arch {
    /// Llama 1/2/3 (`llama`).
    Llama,
    /// Mistral (`mistral`): sliding window on every layer.
    Mistral,
    /// Qwen2 / Qwen2.5 (`qwen2`): q/k/v bias.
    Qwen2,
    /// Qwen3 (`qwen3`): per-head RMSNorm on q and k.
    Qwen3,
    /// Gemma-2 (`gemma2`): scaled embeddings, (1+w) norms, sandwich norms, GeGLU, softcaps.
    Gemma2,
    /// Phi-3 (`phi3`): fused qkv and gate_up projections.
    Phi3,
    /// Gemma 3, text only (`gemma3_text`; GGUF's `gemma3`): Gemma-2's layer
    /// with q/k norms and no soft-caps by default, sliding and global layers
    /// in a pattern, a RoPE base per layer type.
    Gemma3,
    /// SmolLM3 (`smollm3`): Llama's layer, every `no_rope_layer_interval`-th
    /// layer without rotation (NoPE).
    SmolLM3,
    /// OLMo 2 (`olmo2`): a norm after each block (on its output, before the
    /// residual add) and none before, q/k RMSNorm over the whole projection.
    Olmo2,
    /// OLMo 3 (`olmo3`; GGUF's `olmo2` with a sliding window): OLMo 2's layer
    /// with sliding and full layers and a RoPE per layer type.
    Olmo3,
    /// Qwen3-MoE (`qwen3_moe`): Qwen3's attention, a mixture of experts in
    /// place of the MLP (dense MLPs where `mlp_only_layers` or
    /// `decoder_sparse_step` say).
    Qwen3Moe,
    /// Mixtral (`mixtral`): Mistral's attention, the top 2 of 8 experts.
    Mixtral,
    /// gpt-oss (`gpt_oss`; GGUF's `gpt-oss`): a learned sink logit per
    /// head in every softmax, sliding and full layers alternating, q/k/v/o
    /// biases, YaRN, and experts with biases and a clamped SwiGLU routed by
    /// a softmax over the top-k router logits.
    GptOss,
    /// Gemma 4, text only (`gemma4_text`, or the `text_config` of a
    /// `gemma4` config): sliding and full layers with a head width and K/V
    /// head count each, plain-`w` norms, attention scale 1, keys that are
    /// the values on full layers (`attention_k_eq_v`) and their
    /// proportional RoPE, per-layer inputs, a learned scalar per layer, and
    /// the last layers reading an earlier layer's K/V
    /// (`num_kv_shared_layers`).
    Gemma4,
    /// Qwen3.5, text only (`qwen3_5_text`): three linear-attention layers
    /// (Gated DeltaNet: a causal convolution, then a gated delta-rule
    /// recurrence with a fixed-size state) for every full-attention layer;
    /// full layers with an output gate, (1 + w) per-head q/k norms and a
    /// rotation of a quarter of the head.
    Qwen35,
    /// Qwen3.5's mixture of experts, text only (`qwen3_5_moe_text`; GGUF's
    /// `qwen35moe`): Qwen3.5's layers with every MLP the top-k of many
    /// routed experts (renormalised) beside a shared expert scaled by the
    /// sigmoid of its own gate.
    Qwen35Moe,
}

impl Arch {
    const ALL: [(&'static str, Arch); 16] = [
        ("llama", Arch::Llama),
        ("mistral", Arch::Mistral),
        ("qwen2", Arch::Qwen2),
        ("qwen3", Arch::Qwen3),
        ("gemma2", Arch::Gemma2),
        ("phi3", Arch::Phi3),
        ("gemma3_text", Arch::Gemma3),
        ("smollm3", Arch::SmolLM3),
        ("olmo2", Arch::Olmo2),
        ("olmo3", Arch::Olmo3),
        ("qwen3_moe", Arch::Qwen3Moe),
        ("mixtral", Arch::Mixtral),
        ("gpt_oss", Arch::GptOss),
        ("gemma4_text", Arch::Gemma4),
        ("qwen3_5_text", Arch::Qwen35),
        ("qwen3_5_moe_text", Arch::Qwen35Moe),
    ];

    /// The `model_type` string of this architecture.
    pub fn model_type(&self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| a == self)
            .map(|(n, _)| *n)
            .unwrap_or("llama")
    }

    /// The architecture of a `model_type` (also GGUF's `general.architecture`).
    pub(crate) fn from_model_type(s: &str) -> Option<Arch> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, a)| *a)
    }

    /// The name GGUF's `general.architecture` gives this architecture
    /// (llama.cpp calls text-only Gemma 3 `gemma3`).
    pub fn gguf_name(&self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Olmo3 => "olmo2",
            Arch::Qwen3Moe => "qwen3moe",
            // with `llama.expert_count`
            Arch::Mixtral => "llama",
            Arch::GptOss => "gpt-oss",
            Arch::Gemma4 => "gemma4",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            other => other.model_type(),
        }
    }

    /// The architecture of a GGUF's `general.architecture`.
    pub(crate) fn from_gguf_name(s: &str) -> Option<Arch> {
        Self::ALL
            .iter()
            .map(|(_, a)| *a)
            .find(|a| a.gguf_name() == s)
    }

    /// Gemma 2 or 3: scaled embeddings, (1 + w) norms, sandwich norms, GeGLU.
    pub fn is_gemma(&self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    /// Qwen3.5, dense or with experts: linear-attention layers beside full
    /// ones, (1 + w) norms, gated full-attention outputs.
    pub fn is_qwen35(&self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }

    /// OLMo 2 or 3: norms after the blocks, whole-projection q/k norms.
    pub fn is_olmo(&self) -> bool {
        matches!(self, Arch::Olmo2 | Arch::Olmo3)
    }

    /// Whether llama.cpp's converter permuted this architecture's Q/K rows
    /// for its interleaved RoPE (the Llama family's `permute`).
    pub fn gguf_permutes_qk(&self) -> bool {
        matches!(
            self,
            Arch::Llama | Arch::Mistral | Arch::SmolLM3 | Arch::Mixtral
        )
    }

    /// Whether llama.cpp's GGUF files of this architecture name a layer's
    /// `post_attention_layernorm` `post_attention_norm`: the norm after
    /// attention of Gemma's sandwich and OLMo's post-norm layers, and the
    /// norm before the MLP of gpt-oss and Qwen3.5 (the other architectures'
    /// norm before the MLP is `ffn_norm`).
    pub fn gguf_post_attention_norm(&self) -> bool {
        self.is_gemma()
            || self.is_qwen35()
            || matches!(
                self,
                Arch::Gemma4 | Arch::Olmo2 | Arch::Olmo3 | Arch::GptOss
            )
    }

    /// The `model_type`s lcut implements, comma-separated.
    pub(crate) fn supported() -> String {
        Self::ALL
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Activation {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU).
    GeluTanh,
    /// gpt-oss's SwiGLU: the gate clamped above at `limit`, the up half to
    /// +-`limit`, then `(up + 1) * g * sigmoid(alpha g)`.
    ClampedSwiGlu {
        /// The clamp (`swiglu_limit`).
        limit: f32,
        /// The sigmoid's slope (`swiglu_alpha`).
        alpha: f32,
    },
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum RopeScaling {
    /// No scaling.
    None,
    /// Position interpolation: frequencies divided by `factor`.
    Linear {
        /// Scaling factor.
        factor: f64,
    },
    /// Llama 3.1 frequency-band scaling.
    Llama3 {
        /// Scaling factor for low frequencies.
        factor: f64,
        /// Low-frequency band boundary factor.
        low_freq_factor: f64,
        /// High-frequency band boundary factor.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
    /// YaRN: each frequency blended between itself and itself / `factor`
    /// by a ramp over the dimensions whose wavelengths fall between
    /// `beta_fast` and `beta_slow` rotations of the original context; cos
    /// and sin scaled by `attention_factor` (OLMo 3's full layers, gpt-oss).
    Yarn {
        /// Scaling factor.
        factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: f64,
        /// Rotations over the original context where extrapolation ends.
        beta_fast: f64,
        /// Rotations over the original context where interpolation starts.
        beta_slow: f64,
        /// Scale of cos and sin (the config's `attention_factor`, else
        /// 0.1 ln(factor) + 1, or the ratio of the two `mscale`s).
        attention_factor: f64,
        /// The ramp's bounds rounded out to whole dimensions
        /// (transformers' `truncate`, default true).
        truncate: bool,
    },
    /// Gemma 4's proportional RoPE on full layers: the frequencies of a
    /// whole head (`rotary_dim` is the head width, so the pairs are `(i, i +
    /// D/2)`), `theta^(-2i/D)` for the first `rotated_pairs` pairs and zero
    /// (no rotation) past them, each divided by `factor`.
    Proportional {
        /// Divisor of every frequency.
        factor: f64,
        /// Pairs that rotate, from the first.
        rotated_pairs: usize,
    },
}

/// One layer's attention shape and where its K/V come from: the same for
/// every layer of most models, per layer on Gemma 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerAttention {
    /// K/V heads (0 on a layer without K/V: Qwen3.5's linear layers).
    pub kv_heads: usize,
    /// Width of one head (queries, keys and values).
    pub head_dim: usize,
    /// The values are the keys' projection (no `v_proj`; Gemma 4's full
    /// layers with `attention_k_eq_v`), normed but not rotated.
    pub values_from_keys: bool,
    /// The values pass an RMSNorm without a scale (Gemma 4).
    pub value_norm: bool,
    /// The earlier layer whose K/V this layer reads instead of storing its
    /// own (Gemma 4's `num_kv_shared_layers`); `None`: its own.
    pub kv_source: Option<usize>,
}

impl LayerAttention {
    /// Heads' worth of K and V rows the layer projects: none where it reads
    /// another layer's K/V, the keys alone where its values are its keys,
    /// else keys and values.
    pub fn projected_kv_heads(&self) -> usize {
        match (self.kv_source, self.values_from_keys) {
            (Some(_), _) => 0,
            (None, true) => self.kv_heads,
            (None, false) => 2 * self.kv_heads,
        }
    }
}

/// Qwen3.5's linear-attention layers (Gated DeltaNet): which layers they
/// are and their shape. Each holds no K/V but a fixed-size state: the last
/// `conv_kernel - 1` inputs of its convolution and, per value head, a
/// `key_head_dim x value_head_dim` matrix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinearAttentionConfig {
    /// Whether each layer is a linear-attention layer (the others are full
    /// attention).
    pub layers: Vec<bool>,
    /// Query and key heads (`linear_num_key_heads`).
    pub key_heads: usize,
    /// Value heads (`linear_num_value_heads`), a multiple of the key heads:
    /// each key head serves `value_heads / key_heads` value heads (which
    /// ones: [`LinearAttentionConfig::value_heads_tiled`]).
    pub value_heads: usize,
    /// Width of a query or key head (`linear_key_head_dim`).
    pub key_head_dim: usize,
    /// Width of a value head (`linear_value_head_dim`).
    pub value_head_dim: usize,
    /// The causal convolution's kernel (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Whether the value heads come in llama.cpp's tiled order, value head
    /// `h` reading key head `h % key_heads` (its converter reorders every
    /// per-value-head weight so), rather than Hugging Face's grouped order,
    /// `h / (value_heads / key_heads)`. A GGUF file's; the same layer
    /// either way, its value heads numbered differently.
    pub value_heads_tiled: bool,
}

impl LinearAttentionConfig {
    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }

    /// Values of one linear layer's state: the convolution's last `kernel -
    /// 1` inputs of every channel, and a key x value matrix per value head.
    pub fn state_values(&self) -> usize {
        self.conv_channels() * (self.conv_kernel - 1)
            + self.value_heads * self.key_head_dim * self.value_head_dim
    }

    /// Whether layer `l` is a linear-attention layer.
    pub fn is_linear(&self, l: usize) -> bool {
        self.layers.get(l).copied().unwrap_or(false)
    }
}

/// Gemma 4's per-layer inputs: each token gets `width` values per layer,
/// (RMSNorm of a projection of its embedding + a row of a per-layer token
/// table) / sqrt(2), which each layer applies after its MLP as a gated
/// branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PerLayerInput {
    /// Values per layer (`hidden_size_per_layer_input`).
    pub width: usize,
    /// Rows of the per-layer token table (`vocab_size_per_layer_input`).
    pub vocab: usize,
}

/// Where a layer's norms sit around its attention and MLP blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NormPlacement {
    /// One norm before each block (Llama): `input_layernorm`, then
    /// `post_attention_layernorm` before the MLP.
    Pre,
    /// Before and after each block (Gemma): `input_layernorm`,
    /// `post_attention_layernorm`, `pre_feedforward_layernorm`,
    /// `post_feedforward_layernorm`.
    Sandwich,
    /// Only after each block, on its output before the residual add (OLMo 2
    /// and 3): `post_attention_layernorm`, `post_feedforward_layernorm`.
    Post,
}

impl NormPlacement {
    /// Whether each block has a norm on its input.
    pub fn before(&self) -> bool {
        !matches!(self, NormPlacement::Post)
    }

    /// Whether each block's output is normed before the residual add.
    pub fn after(&self) -> bool {
        !matches!(self, NormPlacement::Pre)
    }
}

/// A mixture-of-experts MLP: a router picks `top_k` of `num_experts`
/// gated MLPs per token and sums their outputs weighted by its
/// probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExpertsConfig {
    /// How the router's logits become the chosen experts' weights.
    pub router: RouterKind,
    /// The router and each expert's projections have biases (gpt-oss).
    pub bias: bool,
    /// Experts per sparse layer.
    pub num_experts: usize,
    /// Experts each token runs.
    pub top_k: usize,
    /// Each expert's inner width.
    pub inner: usize,
    /// The chosen experts' probabilities are renormalised to sum to one
    /// (Mixtral and Qwen3.5-MoE always; Qwen3-MoE with `norm_topk_prob`).
    pub normalize_top_k: bool,
    /// The inner width of an expert every token runs beside the routed
    /// ones, scaled by the sigmoid of its own gate (Qwen3.5-MoE's
    /// `shared_expert_intermediate_size`); `None`: no shared expert.
    pub shared_inner: Option<usize>,
    /// The experts run beside the layer's dense MLP rather than in its
    /// place (Gemma 4's `enable_moe_block`): the router reads the residual
    /// through an unweighted norm and a learned scale, each branch has its
    /// own norms, and each expert's weight a learned scale.
    pub beside_mlp: bool,
}

/// How a router's logits become the weights of the experts a token runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RouterKind {
    /// A softmax over every expert, then the `top_k` most probable
    /// (renormalised where `normalize_top_k`): Qwen3-MoE, Mixtral.
    SoftmaxTopK,
    /// The `top_k` largest logits, then a softmax over those only: gpt-oss.
    TopKSoftmax,
}

/// How queries and keys are normed before their rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum QkNorm {
    /// Not normed.
    None,
    /// Each head on its own, one weight of `head_dim` shared by the heads
    /// (Qwen3, Gemma 3).
    PerHead,
    /// The whole projection at once, a weight over every head's values
    /// (OLMo 2 and 3).
    Whole,
}

/// Rotary position embedding settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RopeConfig {
    /// Base of the frequencies.
    pub theta: f64,
    /// Frequency scaling.
    pub scaling: RopeScaling,
    /// Number of leading head dimensions that rotate (even).
    pub rotary_dim: usize,
}

/// Everything the decoder needs to know about one model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size V.
    pub vocab_size: usize,
    /// Residual width d.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers L.
    pub num_layers: usize,
    /// Query heads H.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE settings.
    pub rope: RopeConfig,
    /// Longest sequence the model allows.
    pub max_position_embeddings: usize,
    /// The LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// BoS token id, when the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token ids.
    pub eos_token_ids: Vec<u32>,
    /// Sliding window per layer (a query at i reads keys j with i - j < w).
    pub sliding_window: Vec<Option<usize>>,
    /// RoPE of the sliding-window layers where it is not [`Self::rope`]
    /// (Gemma 3: its own base, no scaling; OLMo 3: no scaling); `None`:
    /// every layer uses `rope`.
    pub sliding_rope: Option<RopeConfig>,
    /// Whether each layer rotates its queries and keys (false: a layer
    /// without position embedding, SmolLM3's NoPE layers).
    pub rotates: Vec<bool>,
    /// q/k/v projections have biases.
    pub qkv_bias: bool,
    /// RMSNorm on q and k before RoPE.
    pub qk_norm: QkNorm,
    /// Norm weights are offsets from one: x * (1 + w).
    pub norm_weight_offset: bool,
    /// Where each layer's norms sit.
    pub norms: NormPlacement,
    /// Embeddings are multiplied by this before layer 0.
    pub embedding_scale: Option<f64>,
    /// Attention scores are soft-capped: c * tanh(s / c).
    pub attn_softcap: Option<f64>,
    /// Final logits are soft-capped: c * tanh(z / c).
    pub final_softcap: Option<f64>,
    /// Scale of attention scores (usually head_dim^-0.5).
    pub attn_scale: f64,
    /// q, k and v come from one `qkv_proj`.
    pub fused_qkv: bool,
    /// gate and up come from one `gate_up_proj`.
    pub fused_gate_up: bool,
    /// MLP activation.
    pub activation: Activation,
    /// The experts of the sparse layers, where the model has any.
    pub experts: Option<ExpertsConfig>,
    /// Whether each layer's MLP is the mixture of experts (false: a dense
    /// MLP of `intermediate_size`).
    pub sparse_layers: Vec<bool>,
    /// Every head's softmax has a learned sink logit (`self_attn.sinks`):
    /// a column with no value, so a row's probabilities sum to less than
    /// one (gpt-oss).
    pub attention_sinks: bool,
    /// Each layer's attention shape and K/V source (Gemma 4's differ by
    /// layer; every other model's are `num_kv_heads` heads of `head_dim`,
    /// its own K/V).
    pub layer_attention: Vec<LayerAttention>,
    /// Per-layer inputs, where the model has them (Gemma 4).
    pub per_layer_input: Option<PerLayerInput>,
    /// Each layer's output is multiplied by its learned `layer_scalar`
    /// (Gemma 4).
    pub layer_scalars: bool,
    /// The linear-attention layers, where the model has them (Qwen3.5).
    pub linear_attention: Option<LinearAttentionConfig>,
    /// The query projection also gives a gate per head; the attention's
    /// output is multiplied by its sigmoid before the output projection
    /// (Qwen3.5's full layers).
    pub attn_output_gate: bool,
    /// The layers whose dense MLP is twice `intermediate_size` wide
    /// (Gemma 4's `use_double_wide_mlp`: the layers that read another
    /// layer's K/V); empty for every other model.
    pub double_wide_mlp: Vec<bool>,
}

impl ModelConfig {
    /// The inner width of layer `l`'s dense MLP.
    pub fn mlp_width(&self, l: usize) -> usize {
        match self.double_wide_mlp.get(l) {
            Some(true) => 2 * self.intermediate_size,
            _ => self.intermediate_size,
        }
    }
}

/// Largest width, head count, head width or vocabulary a config may claim
/// (2^24, far above any real model's): no product of two such sizes
/// overflows, and a damaged config cannot make the loader size anything by
/// a number the weights have not confirmed.
pub const MAX_SIZE: usize = 1 << 24;

/// Most decoder layers a config may claim (2^16): per-layer settings are
/// allocated from the config before the weights are read.
pub const MAX_LAYERS: usize = 1 << 16;

/// Reads typed fields out of a config object, naming the file and field in errors.
struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn err(&self, field: &str, expected: &str, found: Option<&Value>) -> ModelError {
        ModelError::ConfigField {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            expected: expected.to_string(),
            found: found.map_or("nothing (field missing)".to_string(), |v| v.to_string()),
        }
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => Ok(Some(n as usize)),
                None => Err(self.err(field, "a non-negative integer", Some(v))),
            },
        }
    }

    fn positive(&self, field: &str) -> Result<usize> {
        self.positive_at_most(field, MAX_SIZE)
    }

    /// A positive integer no larger than `max`.
    fn positive_at_most(&self, field: &str, max: usize) -> Result<usize> {
        // one expectation for every wrong value: "a non-negative integer"
        // for a string, then "a positive integer" for 0, would be two
        match self.get(field).and_then(Value::as_u64) {
            Some(n) if n > 0 && n <= max as u64 => Ok(n as usize),
            _ => Err(self.err(
                field,
                &format!("a positive integer up to {max}"),
                self.get(field),
            )),
        }
    }

    /// A positive float, when present.
    fn opt_positive_f64(&self, field: &str) -> Result<Option<f64>> {
        match self.opt_f64(field)? {
            Some(x) if x <= 0.0 => Err(self.err(field, "a positive number", self.get(field))),
            x => Ok(x),
        }
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.err(field, "a finite number", Some(v))),
            },
        }
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, "true or false", Some(v))),
        }
    }

    fn opt_str(&self, field: &str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, "a string", Some(v))),
        }
    }

    fn token_ids(&self, field: &str) -> Result<Vec<u32>> {
        match self.get(field) {
            None => Ok(vec![]),
            Some(Value::Array(xs)) => xs
                .iter()
                .map(|x| {
                    token_id(x).ok_or_else(|| self.err(field, "token ids (below 2^32)", Some(x)))
                })
                .collect(),
            Some(v) => token_id(v).map(|n| vec![n]).ok_or_else(|| {
                self.err(field, "a token id (below 2^32) or a list of them", Some(v))
            }),
        }
    }
}

/// A token id: an integer that fits in 32 bits (a larger one must not wrap
/// around to another token).
fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

impl ModelConfig {
    /// Read `config.json` from a model folder.
    pub fn from_folder(folder: &Path) -> Result<Self> {
        let path = folder.join("config.json");
        if !path.exists() {
            return Err(ModelError::MissingFile {
                path,
                what: "every Hugging Face model folder has a config.json".into(),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_json_str(&text, &path)
    }

    /// Parse the text of a `config.json`; `path` is used in error messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_value(&value, path)
    }

    /// Read a config from its JSON value (Hugging Face field names); `path`
    /// is used in error messages.
    pub(crate) fn from_json_value(value: &Value, path: &Path) -> Result<Self> {
        let Value::Object(map) = value else {
            return Err(ModelError::ConfigField {
                path: path.to_path_buf(),
                field: "(top level)".into(),
                expected: "a JSON object".into(),
                found: value.to_string(),
            });
        };
        let f = Fields { path, map };
        let model_type = f
            .opt_str("model_type")?
            .ok_or_else(|| f.err("model_type", "an architecture name", None))?;
        if let Some(wrapper) = multimodal::wrapper(model_type) {
            let text = multimodal::text_config(&f, wrapper)?;
            return Self::from_json_value(&Value::Object(text), path)
                .map_err(multimodal::inside_text_config);
        }
        let arch =
            Arch::from_model_type(model_type).ok_or_else(|| ModelError::UnknownArchitecture {
                path: PathBuf::from(path),
                model_type: model_type.to_string(),
                supported: Arch::supported(),
            })?;
        if arch == Arch::Gemma3 {
            let map = gemma3::with_class_defaults(map);
            return Self::build(&Fields { path, map: &map }, arch);
        }
        Self::build(&f, arch)
    }

    fn build(f: &Fields<'_>, arch: Arch) -> Result<Self> {
        let hidden_size = f.positive("hidden_size")?;
        let num_heads = f.positive("num_attention_heads")?;
        let num_layers = f.positive_at_most("num_hidden_layers", MAX_LAYERS)?;
        let num_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(f.err(
                "num_key_value_heads",
                &format!("a positive divisor of num_attention_heads ({num_heads})"),
                f.get("num_key_value_heads"),
            ));
        }
        let head_dim = match f.opt_usize("head_dim")? {
            Some(h) if h > 0 && h <= MAX_SIZE => h,
            Some(_) => {
                return Err(f.err(
                    "head_dim",
                    &format!("a positive integer up to {MAX_SIZE}"),
                    f.get("head_dim"),
                ));
            }
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => {
                return Err(f.err(
                    "head_dim",
                    "a head width (hidden_size is not divisible by num_attention_heads)",
                    None,
                ));
            }
        };
        let gemma4 = match arch {
            Arch::Gemma4 => Some(gemma4::read(
                f,
                num_layers,
                num_heads,
                (num_kv_heads, head_dim),
                f.positive("vocab_size")?,
            )?),
            _ => None,
        };
        let (rope, sliding_rope) = match arch {
            Arch::Gemma4 => {
                let g = gemma4.as_ref().ok_or(ModelError::LayerProgram {
                    what: "Gemma 4's layout before its RoPE",
                })?;
                (g.full_rope, Some(g.sliding_rope))
            }
            Arch::Gemma3 => {
                gemma3::refuse_bidirectional(f)?;
                let (global, sliding) = layer_ropes::ropes(f, head_dim, &gemma3::ROPES)?;
                (global, Some(sliding))
            }
            Arch::Olmo3 => {
                let (global, sliding) = layer_ropes::ropes(f, head_dim, &OLMO3_ROPES)?;
                (global, Some(sliding))
            }
            Arch::GptOss
                if f.get("rope_parameters").is_none() && f.get("rope_scaling").is_none() =>
            {
                (gpt_oss_rope(f, head_dim)?, None)
            }
            _ if arch.is_qwen35() => (qwen35_rope(f, head_dim)?, None),
            _ => (read_rope(f, head_dim, default_theta(arch))?, None),
        };
        let linear_attention = match arch.is_qwen35() {
            true => Some(qwen3_5::read(f, num_layers)?),
            false => None,
        };
        let is_gemma = arch.is_gemma();
        let activation = read_activation(f, arch)?;
        let attn_scale = match (arch, f.opt_f64("query_pre_attn_scalar")?) {
            // transformers' default for Gemma 3, a zero or negative one refused
            (Arch::Gemma3, _) => f
                .opt_positive_f64("query_pre_attn_scalar")?
                .unwrap_or(256.0)
                .powf(-0.5),
            (_, Some(s)) if is_gemma && s > 0.0 => s.powf(-0.5),
            // the q/k norms carry the scale
            (Arch::Gemma4, _) => 1.0,
            _ => (head_dim as f64).powf(-0.5),
        };
        let default_tie = is_gemma || matches!(arch, Arch::SmolLM3 | Arch::Gemma4);
        // transformers' defaults of each config class
        let default_positions = match arch {
            Arch::Gemma3 | Arch::Gemma4 => 131_072,
            Arch::SmolLM3 | Arch::Qwen35 | Arch::Qwen35Moe => 32_768,
            Arch::Olmo2 | Arch::Olmo3 => 2048,
            Arch::GptOss => 131_072,
            _ => 4096,
        };
        let default_eps = match arch {
            _ if arch.is_olmo() => 1e-5,
            Arch::GptOss => 1e-5,
            _ => 1e-6,
        };
        let (experts, sparse_layers) = read_experts(f, arch, num_layers)?;
        let double_wide_mlp = match &gemma4 {
            Some(g) => g.double_wide_mlp.clone(),
            None => Vec::new(),
        };
        let (sliding_window, layer_attention, per_layer_input) = match gemma4 {
            Some(g) => (g.windows, g.attention, g.per_layer_input),
            None => (
                read_sliding_window(f, arch, num_layers)?,
                (0..num_layers)
                    .map(|l| LayerAttention {
                        // a linear-attention layer holds no K/V
                        kv_heads: match &linear_attention {
                            Some(la) if la.is_linear(l) => 0,
                            _ => num_kv_heads,
                        },
                        head_dim,
                        values_from_keys: false,
                        value_norm: false,
                        kv_source: None,
                    })
                    .collect(),
                None,
            ),
        };
        let sandwich = is_gemma || arch == Arch::Gemma4;
        Ok(Self {
            arch,
            vocab_size: f.positive("vocab_size")?,
            hidden_size,
            intermediate_size: f.positive("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(default_eps),
            rope,
            max_position_embeddings: f
                .opt_usize("max_position_embeddings")?
                .unwrap_or(default_positions),
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(default_tie),
            bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
            eos_token_ids: f.token_ids("eos_token_id")?,
            sliding_window,
            sliding_rope,
            rotates: read_rotates(f, arch, num_layers)?,
            qkv_bias: match arch {
                Arch::Qwen2 => true,
                Arch::GptOss => f.opt_bool("attention_bias")?.unwrap_or(true),
                _ => f.opt_bool("attention_bias")?.unwrap_or(false),
            },
            qk_norm: match arch {
                Arch::Qwen3
                | Arch::Qwen3Moe
                | Arch::Gemma3
                | Arch::Gemma4
                | Arch::Qwen35
                | Arch::Qwen35Moe => QkNorm::PerHead,
                Arch::Olmo2 | Arch::Olmo3 => QkNorm::Whole,
                _ => QkNorm::None,
            },
            norm_weight_offset: is_gemma || arch.is_qwen35(),
            norms: match arch {
                _ if sandwich => NormPlacement::Sandwich,
                Arch::Olmo2 | Arch::Olmo3 => NormPlacement::Post,
                _ => NormPlacement::Pre,
            },
            embedding_scale: sandwich.then(|| (hidden_size as f64).sqrt()),
            // a cap of 0 would turn every score into NaN
            attn_softcap: if is_gemma {
                f.opt_positive_f64("attn_logit_softcapping")?
            } else {
                None
            },
            final_softcap: if sandwich {
                f.opt_positive_f64("final_logit_softcapping")?
            } else {
                None
            },
            attn_scale,
            fused_qkv: arch == Arch::Phi3,
            fused_gate_up: arch == Arch::Phi3,
            activation,
            experts,
            sparse_layers,
            attention_sinks: arch == Arch::GptOss,
            layer_attention,
            per_layer_input,
            layer_scalars: arch == Arch::Gemma4,
            linear_attention,
            attn_output_gate: arch.is_qwen35(),
            double_wide_mlp,
        })
    }

    /// Shape of one token's K/V at one layer, for the cost model, with the
    /// cache in `dtype`.
    pub fn kv_shape(&self, dtype: candle_core::DType) -> lcut_policy::KvShape {
        lcut_policy::KvShape {
            num_layers: self.num_layers,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            dtype_bytes: dtype.size_in_bytes(),
        }
    }

    /// Number of query heads sharing one key/value head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// Qwen3.5's RoPE: read as any model's, but a quarter of the head rotates
/// where the config names no `partial_rotary_factor` (transformers'
/// default for the class). Text-only positions are the same on its three
/// multimodal sections (`mrope_section`), so the rotation is the plain one.
fn qwen35_rope(f: &Fields<'_>, head_dim: usize) -> Result<RopeConfig> {
    let mut rope = read_rope(f, head_dim, default_theta(Arch::Qwen35))?;
    let named = f.get("partial_rotary_factor").is_some()
        || f.get("rope_parameters")
            .or(f.get("rope_scaling"))
            .and_then(|p| p.get("partial_rotary_factor"))
            .is_some_and(|v| !v.is_null());
    if !named {
        rope.rotary_dim = ((head_dim as f64 * qwen3_5::DEFAULT_PARTIAL_ROTARY) as usize) & !1;
        if rope.rotary_dim == 0 {
            return Err(f.err(
                "head_dim",
                "a head of at least 8 values (a quarter of it rotates, in pairs)",
                f.get("head_dim"),
            ));
        }
    }
    Ok(rope)
}

/// OLMo 3's RoPE defaults: every layer type at transformers' base 5e5
/// (the sliding layers read the same `rope_theta`), scaling on full
/// layers only.
const OLMO3_ROPES: layer_ropes::RopeDefaults = layer_ropes::RopeDefaults {
    global_theta: 500_000.0,
    sliding_field: "rope_theta",
    sliding_theta: 500_000.0,
};

/// The experts of a mixture-of-experts config and which layers are sparse
/// (Qwen3-MoE: every `decoder_sparse_step`-th layer, counting from 1, not
/// in `mlp_only_layers`; Mixtral: every layer); none for dense models.
fn read_experts(
    f: &Fields<'_>,
    arch: Arch,
    num_layers: usize,
) -> Result<(Option<ExpertsConfig>, Vec<bool>)> {
    let (inner_field, defaults) = match arch {
        Arch::Qwen3Moe => ("moe_intermediate_size", (128, 8)),
        Arch::Mixtral => ("intermediate_size", (8, 2)),
        Arch::GptOss => ("intermediate_size", (128, 4)),
        Arch::Qwen35Moe => ("moe_intermediate_size", (256, 8)),
        // Gemma 4's config class has no defaults for its experts
        Arch::Gemma4 if f.opt_bool("enable_moe_block")? == Some(true) => {
            ("moe_intermediate_size", (0, 0))
        }
        _ => return Ok((None, vec![false; num_layers])),
    };
    // Qwen3-MoE's checkpoints say `num_experts`, transformers 5 writes the
    // count under Mixtral's name `num_local_experts` for both
    let count_field = match (arch, f.get("num_experts")) {
        (Arch::Gemma4, _) | (_, Some(_)) => "num_experts",
        (_, None) => "num_local_experts",
    };
    let top_k_field = match arch {
        Arch::Gemma4 => "top_k_experts",
        _ => "num_experts_per_tok",
    };
    let count = |field: &str, default: usize| -> Result<usize> {
        match f.get(field) {
            None if default > 0 => Ok(default),
            _ => f.positive(field),
        }
    };
    let num_experts = count(count_field, defaults.0)?;
    let top_k = count(top_k_field, defaults.1)?;
    if top_k > num_experts {
        return Err(f.err(
            top_k_field,
            &format!("at most the expert count ({count_field} = {num_experts})"),
            f.get(top_k_field),
        ));
    }
    let inner = match (arch, f.get(inner_field)) {
        (Arch::Qwen3Moe, None) => 768,
        (Arch::Qwen35Moe, None) => 512,
        _ => f.positive(inner_field)?,
    };
    let shared_inner = match arch {
        Arch::Qwen35Moe => Some(match f.get("shared_expert_intermediate_size") {
            None => 512,
            Some(_) => f.positive("shared_expert_intermediate_size")?,
        }),
        _ => None,
    };
    let experts = ExpertsConfig {
        router: match arch {
            Arch::GptOss => RouterKind::TopKSoftmax,
            _ => RouterKind::SoftmaxTopK,
        },
        bias: arch == Arch::GptOss,
        num_experts,
        top_k,
        inner,
        normalize_top_k: match arch {
            Arch::Mixtral | Arch::Qwen35Moe | Arch::Gemma4 => true,
            // the softmax over the top k already sums to one
            Arch::GptOss => false,
            _ => f.opt_bool("norm_topk_prob")?.unwrap_or(false),
        },
        shared_inner,
        beside_mlp: arch == Arch::Gemma4,
    };
    if matches!(
        arch,
        Arch::Mixtral | Arch::GptOss | Arch::Qwen35Moe | Arch::Gemma4
    ) {
        return Ok((Some(experts), vec![true; num_layers]));
    }
    let step = match f.get("decoder_sparse_step") {
        None => 1,
        Some(_) => f.positive("decoder_sparse_step")?,
    };
    let dense: Vec<usize> = match f.get("mlp_only_layers") {
        None => vec![],
        Some(Value::Array(xs)) => xs
            .iter()
            .map(|x| match x.as_u64() {
                Some(l) if (l as usize) < num_layers => Ok(l as usize),
                _ => Err(f.err(
                    "mlp_only_layers",
                    &format!("layer indices below num_hidden_layers ({num_layers})"),
                    Some(x),
                )),
            })
            .collect::<Result<_>>()?,
        Some(v) => return Err(f.err("mlp_only_layers", "a list of layer indices", Some(v))),
    };
    let sparse = (0..num_layers)
        .map(|l| !dense.contains(&l) && (l + 1).is_multiple_of(step))
        .collect();
    Ok((Some(experts), sparse))
}

/// transformers' RoPE base of a config class that names none.
fn default_theta(arch: Arch) -> f64 {
    match arch {
        Arch::SmolLM3 => 2_000_000.0,
        Arch::Mixtral => 1_000_000.0,
        Arch::GptOss => 150_000.0,
        _ => 10_000.0,
    }
}

/// gpt-oss's RoPE where the config names none: transformers' default
/// YaRN (factor 32 over an original context of 4096, betas 32 and 1, the
/// ramp not truncated), on `rope_theta` (default 150000).
fn gpt_oss_rope(f: &Fields<'_>, head_dim: usize) -> Result<RopeConfig> {
    let mut rope = read_rope(f, head_dim, default_theta(Arch::GptOss))?;
    let factor: f64 = 32.0;
    rope.scaling = RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: 4096.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 0.1 * factor.ln() + 1.0,
        truncate: false,
    };
    Ok(rope)
}

/// Whether each layer rotates: SmolLM3's `no_rope_layers` (1 rotates, 0
/// does not) or, without it, every `no_rope_layer_interval`-th layer
/// (counting from 1, default 4) unrotated; every layer of the others.
fn read_rotates(f: &Fields<'_>, arch: Arch, num_layers: usize) -> Result<Vec<bool>> {
    if arch != Arch::SmolLM3 {
        return Ok(vec![true; num_layers]);
    }
    if let Some(list) = f.get("no_rope_layers") {
        let flags = list.as_array().filter(|xs| xs.len() == num_layers);
        let Some(flags) = flags else {
            return Err(f.err(
                "no_rope_layers",
                &format!("a list of {num_layers} flags (num_hidden_layers), 1 or 0"),
                Some(list),
            ));
        };
        return flags
            .iter()
            .map(|x| match x.as_u64() {
                Some(n @ (0 | 1)) => Ok(n == 1),
                _ => Err(f.err(
                    "no_rope_layers",
                    "1 (the layer rotates) or 0 (it does not) per layer",
                    Some(x),
                )),
            })
            .collect();
    }
    let interval = match f.opt_usize("no_rope_layer_interval")? {
        None => 4,
        Some(0) => {
            return Err(f.err(
                "no_rope_layer_interval",
                "a positive interval (every interval-th layer has no rotation)",
                f.get("no_rope_layer_interval"),
            ));
        }
        Some(n) => n,
    };
    Ok((0..num_layers)
        .map(|l| !(l + 1).is_multiple_of(interval))
        .collect())
}

fn read_activation(f: &Fields<'_>, arch: Arch) -> Result<Activation> {
    if arch == Arch::GptOss {
        // transformers' GptOssExperts: whatever `hidden_act` says
        let limit = f.opt_positive_f64("swiglu_limit")?.unwrap_or(7.0) as f32;
        let alpha = f.opt_positive_f64("swiglu_alpha")?.unwrap_or(1.702) as f32;
        return Ok(Activation::ClampedSwiGlu { limit, alpha });
    }
    let (field, default) = if arch.is_gemma() || arch == Arch::Gemma4 {
        ("hidden_activation", "gelu_pytorch_tanh")
    } else {
        ("hidden_act", "silu")
    };
    match f.opt_str(field)?.unwrap_or(default) {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanh),
        _ => Err(f.err(field, "one of silu, gelu_pytorch_tanh", f.get(field))),
    }
}

/// RoPE settings from either style: `rope_parameters`, or top-level
/// `rope_theta` with an optional `rope_scaling` object.
fn read_rope(f: &Fields<'_>, head_dim: usize, default_theta: f64) -> Result<RopeConfig> {
    let (params_field, params) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, Some(p)) => ("rope_scaling", Some(p)),
        (None, None) => ("rope_scaling", None),
    };
    let params = match params {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => return Err(f.err(params_field, "an object", Some(v))),
    };
    rope_from(
        f,
        (params_field, params),
        ("rope_theta", default_theta),
        head_dim,
    )
}

/// RoPE settings of one parameters object (`params`, the config's field
/// `params_field`; `None` when the config has none): its `rope_theta`,
/// else the top-level field `theta_field`, else `default_theta`; its
/// rotary share and its scaling.
fn rope_from(
    f: &Fields<'_>,
    (params_field, params): (&str, Option<&Map<String, Value>>),
    (theta_field, default_theta): (&str, f64),
    head_dim: usize,
) -> Result<RopeConfig> {
    let sub = params.map(|map| Fields { path: f.path, map });
    let (theta, named) = match sub
        .as_ref()
        .map(|s| s.opt_f64("rope_theta"))
        .transpose()?
        .flatten()
    {
        Some(t) => (t, format!("{params_field}.rope_theta")),
        None => (
            f.opt_f64(theta_field)?.unwrap_or(default_theta),
            theta_field.to_string(),
        ),
    };
    if theta <= 0.0 {
        return Err(f.err(&named, "a positive number", Some(&Value::from(theta))));
    }
    let partial = match sub
        .as_ref()
        .map(|s| s.opt_f64("partial_rotary_factor"))
        .transpose()?
        .flatten()
    {
        Some(p) => Some(p),
        None => f.opt_f64("partial_rotary_factor")?,
    }
    .unwrap_or(1.0);
    let rotary_dim = ((head_dim as f64 * partial) as usize) & !1;
    if rotary_dim == 0 || rotary_dim > head_dim {
        return Err(f.err("partial_rotary_factor", "a fraction in (0, 1]", None));
    }
    let scaling = match sub {
        None => RopeScaling::None,
        Some(s) => {
            let kind = match s.opt_str("rope_type")? {
                Some(k) => Some(k),
                None => s.opt_str("type")?,
            };
            // a factor of 0 or below would make the frequencies infinite or negative
            let need = |name: &str| -> Result<f64> {
                s.opt_positive_f64(name)?.ok_or_else(|| {
                    f.err(&format!("{params_field}.{name}"), "a positive number", None)
                })
            };
            match kind.unwrap_or("default") {
                "default" => RopeScaling::None,
                "linear" => RopeScaling::Linear {
                    factor: need("factor")?,
                },
                "llama3" => RopeScaling::Llama3 {
                    factor: need("factor")?,
                    low_freq_factor: need("low_freq_factor")?,
                    high_freq_factor: need("high_freq_factor")?,
                    original_max_position_embeddings: need("original_max_position_embeddings")?,
                },
                "yarn" => read_yarn(&s, params_field, need("factor")?)?,
                other => {
                    return Err(f.err(
                        &format!("{params_field}.rope_type"),
                        "one of default, linear, llama3, yarn",
                        Some(&Value::String(other.to_string())),
                    ));
                }
            }
        }
    };
    Ok(RopeConfig {
        theta,
        scaling,
        rotary_dim,
    })
}

/// YaRN's parameters from a RoPE parameters object `s` (the config's field
/// `params_field`) with its `factor`, transformers' defaults where absent.
fn read_yarn(s: &Fields<'_>, params_field: &str, factor: f64) -> Result<RopeScaling> {
    let positive = |name: &str, default: Option<f64>| -> Result<f64> {
        match (s.opt_positive_f64(name)?, default) {
            (Some(x), _) | (None, Some(x)) => Ok(x),
            (None, None) => {
                Err(s.err(&format!("{params_field}.{name}"), "a positive number", None))
            }
        }
    };
    // transformers: 0.1 ln(factor) + 1 (1 for factor <= 1), or the ratio of
    // that with `mscale` and with `mscale_all_dim` when both are given
    let mscale = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    let inferred = match (s.opt_f64("mscale")?, s.opt_f64("mscale_all_dim")?) {
        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
        _ => mscale(1.0),
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: positive("original_max_position_embeddings", None)?,
        beta_fast: positive("beta_fast", Some(32.0))?,
        beta_slow: positive("beta_slow", Some(1.0))?,
        attention_factor: positive("attention_factor", Some(inferred))?,
        truncate: s.opt_bool("truncate")?.unwrap_or(true),
    })
}

/// Sliding window per layer: `layer_types` when the config lists them,
/// otherwise each architecture's rule.
fn read_sliding_window(
    f: &Fields<'_>,
    arch: Arch,
    num_layers: usize,
) -> Result<Vec<Option<usize>>> {
    let window = match (arch, f.opt_usize("sliding_window")?) {
        // a window of 0 would leave a query nothing to read
        (_, Some(0)) => {
            return Err(f.err(
                "sliding_window",
                "a positive window (tokens a query reads)",
                f.get("sliding_window"),
            ));
        }
        // transformers' defaults for Gemma 3, OLMo 3 and gpt-oss
        (Arch::Gemma3 | Arch::Olmo3, None) => Some(4096),
        (Arch::GptOss, None) => Some(128),
        (_, w) => w,
    };
    // OLMo 2 never slides; SmolLM3 only with `use_sliding_window`, whatever
    // its `layer_types` list
    let never = match arch {
        // Qwen3.5's layer types are linear or full attention, none slides
        Arch::Olmo2 | Arch::Qwen35 | Arch::Qwen35Moe => true,
        Arch::SmolLM3 => !f.opt_bool("use_sliding_window")?.unwrap_or(false),
        _ => false,
    };
    if never {
        return Ok(vec![None; num_layers]);
    }
    if let Some(types) = f.get("layer_types") {
        let Value::Array(types) = types else {
            return Err(f.err("layer_types", "a list of layer types", Some(types)));
        };
        if types.len() != num_layers {
            return Err(f.err(
                "layer_types",
                &format!("{num_layers} entries (num_hidden_layers)"),
                Some(&Value::from(types.len())),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(None),
                Some("sliding_attention") => window.map(Some).ok_or_else(|| {
                    f.err(
                        "sliding_window",
                        "a window size for sliding_attention layers",
                        None,
                    )
                }),
                _ => Err(f.err(
                    "layer_types",
                    "full_attention or sliding_attention",
                    Some(t),
                )),
            })
            .collect();
    }
    let pattern = match arch {
        Arch::Gemma3 => gemma3::pattern(f)?,
        _ => 0,
    };
    let per_layer = |l: usize| -> Option<usize> {
        match arch {
            Arch::Mistral | Arch::Mixtral | Arch::Phi3 => window,
            Arch::Gemma2 => window.filter(|_| l.is_multiple_of(2)),
            Arch::Gemma3 => window.filter(|_| gemma3::is_sliding(l, pattern)),
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
                let used = f
                    .opt_bool("use_sliding_window")
                    .ok()
                    .flatten()
                    .unwrap_or(false);
                let from = f.opt_usize("max_window_layers").ok().flatten().unwrap_or(0);
                window.filter(|_| used && l >= from)
            }
            // SmolLM3 slides only where `use_sliding_window` and its
            // `layer_types` say so (read above when listed)
            Arch::Llama | Arch::SmolLM3 | Arch::Olmo2 | Arch::Qwen35 | Arch::Qwen35Moe => None,
            // transformers' default: three sliding layers, then a full one
            Arch::Olmo3 => window.filter(|_| !(l + 1).is_multiple_of(4)),
            // transformers' default: sliding and full layers alternating
            Arch::GptOss => window.filter(|_| l.is_multiple_of(2)),
            // Gemma 4's layer types are read with its layout (gemma4.rs)
            Arch::Gemma4 => window.filter(|_| !(l + 1).is_multiple_of(6)),
        }
    };
    Ok((0..num_layers).map(per_layer).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelConfig> {
        ModelConfig::from_json_str(json, Path::new("m/config.json"))
    }

    const BASE: &str = r#""vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2"#;
    /// BASE's heads for Gemma 3, whose class defaults (4 K/V heads 256
    /// wide) do not fit its 2 heads of 4.
    const GEMMA3_HEADS: &str = r#""num_key_value_heads": 2, "head_dim": 4"#;

    #[test]
    fn reads_both_rope_styles() {
        let old = parse(&format!(
            r#"{{"model_type":"llama", {BASE}, "rope_theta": 500000.0,
            "rope_scaling": {{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":64}}}}"#
        ))
        .unwrap();
        let new = parse(&format!(
            r#"{{"model_type":"llama", {BASE}, "rope_parameters": {{"rope_theta": 500000.0,
            "rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":64}}}}"#
        ))
        .unwrap();
        assert_eq!(old.rope, new.rope);
        assert_eq!(old.rope.theta, 500000.0);
        assert!(matches!(old.rope.scaling, RopeScaling::Llama3 { .. }));
    }

    #[test]
    fn unknown_model_type_is_named() {
        let err = parse(&format!(r#"{{"model_type":"gpt2", {BASE}}}"#)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("gpt2") && msg.contains("m/config.json"),
            "{msg}"
        );
    }

    #[test]
    fn missing_and_wrong_fields_are_named() {
        let err = parse(r#"{"model_type":"llama", "vocab_size": 10}"#).unwrap_err();
        assert!(err.to_string().contains("hidden_size"), "{err}");
        let err = parse(&format!(
            r#"{{"model_type":"llama", {BASE}, "num_key_value_heads": 3}}"#
        ))
        .unwrap_err();
        assert!(err.to_string().contains("num_key_value_heads"), "{err}");
        let err = parse(&format!(
            r#"{{"model_type":"llama", {BASE}, "rms_norm_eps": "x"}}"#
        ))
        .unwrap_err();
        assert!(err.to_string().contains("rms_norm_eps"), "{err}");
        let err = parse("{not json").unwrap_err();
        assert!(matches!(err, ModelError::Json { .. }), "{err}");
    }

    #[test]
    fn unsupported_rope_type_is_named() {
        let err = parse(&format!(
            r#"{{"model_type":"phi3", {BASE}, "rope_scaling": {{"type":"longrope"}}}}"#
        ))
        .unwrap_err();
        assert!(err.to_string().contains("longrope"), "{err}");
    }

    /// google/gemma-3-270m's config.json (transformers 4.55's keys).
    const GEMMA3_270M: &str = r#"{"architectures": ["Gemma3ForCausalLM"],
        "_sliding_window_pattern": 6, "attention_bias": false, "attn_logit_softcapping": null,
        "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "intermediate_size": 2048,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
          "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
          "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
          "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
          "sliding_attention", "sliding_attention", "full_attention"],
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
        "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 512,
        "use_bidirectional_attention": false, "vocab_size": 262144}"#;

    #[test]
    fn gemma3_reads_layer_types_and_two_rope_bases() {
        let c = parse(GEMMA3_270M).unwrap();
        assert_eq!(c.arch, Arch::Gemma3);
        let global: Vec<usize> = (0..18).filter(|&l| c.sliding_window[l].is_none()).collect();
        assert_eq!(global, vec![5, 11, 17]);
        assert!(c.sliding_window.iter().flatten().all(|&w| w == 512));
        assert_eq!((c.rope.theta, c.rope.scaling), (1e6, RopeScaling::None));
        let local = c.sliding_rope.expect("a RoPE for sliding layers");
        assert_eq!((local.theta, local.scaling), (1e4, RopeScaling::None));
        assert_eq!(c.attn_scale, 1.0 / 16.0);
        assert!(
            c.qk_norm == QkNorm::PerHead
                && c.norm_weight_offset
                && c.norms == NormPlacement::Sandwich
        );
        assert!(c.tie_word_embeddings && c.attn_softcap.is_none() && c.final_softcap.is_none());
        assert_eq!(c.embedding_scale, Some(640f64.sqrt()));
        assert_eq!(c.activation, Activation::GeluTanh);
    }

    #[test]
    fn gemma3_pattern_and_scaling_in_the_older_keys() {
        // Gemma 3 4B's keys: a period instead of layer types, linear scaling
        // on global layers only
        let c = parse(&format!(
            r#"{{"model_type":"gemma3_text", {BASE}, {GEMMA3_HEADS}, "num_hidden_layers": 7,
            "sliding_window": 4, "sliding_window_pattern": 3, "rope_theta": 1000000.0,
            "rope_scaling": {{"rope_type": "linear", "factor": 8.0}}, "query_pre_attn_scalar": 9}}"#
        ))
        .unwrap();
        let slides: Vec<bool> = c.sliding_window.iter().map(Option::is_some).collect();
        assert_eq!(slides, [true, true, false, true, true, false, true]);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 8.0 });
        let local = c.sliding_rope.unwrap();
        assert_eq!((local.theta, local.scaling), (1e4, RopeScaling::None));
        assert_eq!(c.attn_scale, 1.0 / 3.0);
        // transformers' defaults: period 6, window 4096, bases 1e6 and 1e4, scalar 256
        let d = parse(&format!(
            r#"{{"model_type":"gemma3_text", {BASE}, {GEMMA3_HEADS}}}"#
        ))
        .unwrap();
        assert_eq!(d.sliding_window, vec![Some(4096), Some(4096)]);
        assert_eq!((d.rope.theta, d.sliding_rope.unwrap().theta), (1e6, 1e4));
        assert_eq!(d.attn_scale, 1.0 / 16.0);
    }

    #[test]
    fn gemma3_reads_rope_parameters_per_layer_type() {
        let c = parse(&format!(
            r#"{{"model_type":"gemma3_text", {BASE}, {GEMMA3_HEADS}, "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {{"full_attention": {{"rope_type": "linear", "factor": 4.0,
              "rope_theta": 500000.0}}, "sliding_attention": {{"rope_type": "default",
              "rope_theta": 20000.0}}}}}}"#
        ))
        .unwrap();
        assert_eq!(c.sliding_window, vec![Some(4), None]);
        assert_eq!(c.rope.theta, 500000.0);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 4.0 });
        assert_eq!(c.sliding_rope.unwrap().theta, 20000.0);
        let err = parse(&format!(
            r#"{{"model_type":"gemma3_text", {BASE}, {GEMMA3_HEADS}, "rope_parameters":
            {{"full_attention": {{"rope_type": "longrope", "factor": 4.0}}}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("rope_parameters.full_attention.rope_type"),
            "{err}"
        );
    }

    #[test]
    fn gemma3_bad_values_are_named() {
        for (extra, field) in [
            (r#""sliding_window": 0"#, "sliding_window"),
            (r#""sliding_window_pattern": 0"#, "sliding_window_pattern"),
            (r#""query_pre_attn_scalar": 0"#, "query_pre_attn_scalar"),
            (r#""rope_local_base_freq": -1"#, "rope_local_base_freq"),
            (
                r#""use_bidirectional_attention": true"#,
                "use_bidirectional_attention",
            ),
            (
                r#""rope_parameters": {"sliding_attention": 3}"#,
                "rope_parameters.sliding_attention",
            ),
        ] {
            let err = parse(&format!(
                r#"{{"model_type":"gemma3_text", {BASE}, {GEMMA3_HEADS}, {extra}}}"#
            ))
            .expect_err(extra);
            assert!(err.to_string().contains(field), "{extra}: {err}");
        }
    }

    #[test]
    fn a_published_multimodal_gemma3_config_is_read_with_the_class_defaults() {
        // google/gemma-3-4b-it's config.json in the shape it was published
        // (transformers 4.50): the text config names only what differs from
        // Gemma3TextConfig's defaults
        let text = r#""hidden_size": 2560, "intermediate_size": 10240,
            "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024"#;
        let config = format!(
            r#"{{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
            "image_token_index": 262144, "mm_tokens_per_image": 256, "text_config": {{{text}}},
            "vision_config": {{"hidden_size": 1152, "image_size": 896,
                "model_type": "siglip_vision_model", "num_hidden_layers": 27, "patch_size": 14}}}}"#
        );
        let c = parse(&config).unwrap();
        assert_eq!(c.arch, Arch::Gemma3);
        let sizes = (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_layers,
        );
        assert_eq!(sizes, (262_208, 2560, 10_240, 34));
        let heads = (c.num_heads, c.num_kv_heads, c.head_dim);
        assert_eq!(heads, (8, 4, 256));
        assert_eq!(c.attn_scale, 256f64.powf(-0.5));
        assert!(c.tie_word_embeddings);
        // the wrapper's EoS list, the text class's BoS
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(2), vec![1, 106])
        );
        let full: Vec<usize> = (0..34).filter(|&l| c.sliding_window[l].is_none()).collect();
        assert_eq!(full, vec![5, 11, 17, 23, 29]);
        assert_eq!(c.sliding_window[0], Some(1024));
        // a text-only config leaving a field out means the class default too
        // (not lcut's generic one: as many K/V heads as heads, hidden / heads)
        let c = parse(&format!(r#"{{{text}}}"#)).unwrap();
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 4, 256));
        // a field the file names is the file's
        let c = parse(&format!(
            r#"{{{text}, "num_key_value_heads": 2, "head_dim": 64}}"#
        ))
        .unwrap();
        assert_eq!((c.num_kv_heads, c.head_dim), (2, 64));
    }

    #[test]
    fn gemma_defaults_alternate_windows() {
        let c = parse(&format!(
            r#"{{"model_type":"gemma2", {BASE}, "sliding_window": 4, "query_pre_attn_scalar": 16}}"#
        ))
        .unwrap();
        assert_eq!(c.sliding_window, vec![Some(4), None]);
        assert!(c.norm_weight_offset && c.tie_word_embeddings);
        assert_eq!(c.norms, NormPlacement::Sandwich);
        assert_eq!(c.attn_scale, 0.25);
    }

    const FOUR_LAYERS: &str = r#""vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 4, "num_attention_heads": 2"#;

    #[test]
    fn smollm3_rotates_all_but_every_interval_th_layer() {
        let c = parse(&format!(r#"{{"model_type":"smollm3", {FOUR_LAYERS}}}"#)).unwrap();
        // transformers' default interval 4: the fourth layer has no RoPE
        assert_eq!(c.rotates, vec![true, true, true, false]);
        assert_eq!(c.rope.theta, 2_000_000.0);
        assert!(c.tie_word_embeddings && c.norms == NormPlacement::Pre);
        let c = parse(&format!(
            r#"{{"model_type":"smollm3", {FOUR_LAYERS}, "no_rope_layer_interval": 2}}"#
        ))
        .unwrap();
        assert_eq!(c.rotates, vec![true, false, true, false]);
        // the list wins over the interval
        let c = parse(&format!(
            r#"{{"model_type":"smollm3", {FOUR_LAYERS}, "no_rope_layer_interval": 2,
                "no_rope_layers": [0, 1, 1, 1]}}"#
        ))
        .unwrap();
        assert_eq!(c.rotates, vec![false, true, true, true]);
        // sliding only with use_sliding_window, whatever layer_types says
        let types = r#""sliding_window": 3, "layer_types":
            ["sliding_attention", "full_attention", "full_attention", "full_attention"]"#;
        let off = parse(&format!(
            r#"{{"model_type":"smollm3", {FOUR_LAYERS}, {types}}}"#
        ))
        .unwrap();
        assert_eq!(off.sliding_window, vec![None; 4]);
        let on = parse(&format!(
            r#"{{"model_type":"smollm3", {FOUR_LAYERS}, {types}, "use_sliding_window": true}}"#
        ))
        .unwrap();
        assert_eq!(on.sliding_window, vec![Some(3), None, None, None]);
        // every other architecture rotates every layer
        let llama = parse(&format!(r#"{{"model_type":"llama", {FOUR_LAYERS}}}"#)).unwrap();
        assert_eq!(llama.rotates, vec![true; 4]);
    }

    #[test]
    fn yarn_reads_transformers_defaults_and_names_bad_values() {
        let yarn = |params: &str| {
            parse(&format!(
                r#"{{"model_type":"llama", {FOUR_LAYERS}, "rope_scaling": {{"rope_type": "yarn", {params}}}}}"#
            ))
        };
        let c = yarn(r#""factor": 8.0, "original_max_position_embeddings": 8192"#).unwrap();
        let RopeScaling::Yarn {
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
            ..
        } = c.rope.scaling
        else {
            panic!("{:?}", c.rope.scaling);
        };
        assert_eq!((beta_fast, beta_slow, truncate), (32.0, 1.0, true));
        assert!((attention_factor - (0.1 * 8f64.ln() + 1.0)).abs() < 1e-12);
        let c = yarn(
            r#""factor": 8.0, "original_max_position_embeddings": 8192, "attention_factor": 1.5,
               "beta_fast": 16, "truncate": false"#,
        )
        .unwrap();
        assert!(matches!(
            c.rope.scaling,
            RopeScaling::Yarn {
                attention_factor: 1.5,
                beta_fast: 16.0,
                truncate: false,
                ..
            }
        ));
        for (params, field) in [
            (
                r#""original_max_position_embeddings": 8192"#,
                "rope_scaling.factor",
            ),
            (
                r#""factor": 8.0"#,
                "rope_scaling.original_max_position_embeddings",
            ),
            (
                r#""factor": 8.0, "original_max_position_embeddings": 8192, "beta_slow": -1"#,
                "beta_slow",
            ),
            (
                r#""factor": 8.0, "original_max_position_embeddings": 8192, "truncate": 1"#,
                "truncate",
            ),
        ] {
            let err = yarn(params).expect_err(params);
            assert!(err.to_string().contains(field), "{params}: {err}");
        }
    }

    #[test]
    fn experts_are_read_and_bad_counts_named() {
        let moe = |extra: &str| {
            parse(&format!(
                r#"{{"model_type":"qwen3_moe", {FOUR_LAYERS}, "num_experts": 8,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 6 {extra}}}"#
            ))
        };
        let c = moe(r#", "mlp_only_layers": [0], "decoder_sparse_step": 2"#).unwrap();
        let e = c.experts.unwrap();
        assert_eq!(
            (e.num_experts, e.top_k, e.inner, e.normalize_top_k),
            (8, 2, 6, false)
        );
        // every second layer, counting from 1, and not layer 0
        assert_eq!(c.sparse_layers, vec![false, true, false, true]);
        assert_eq!(c.qk_norm, QkNorm::PerHead);
        let m = parse(&format!(
            r#"{{"model_type":"mixtral", {FOUR_LAYERS}, "num_local_experts": 4}}"#
        ))
        .unwrap();
        let e = m.experts.unwrap();
        assert_eq!(
            (e.num_experts, e.top_k, e.inner, e.normalize_top_k),
            (4, 2, 16, true)
        );
        assert_eq!(m.sparse_layers, vec![true; 4]);
        // a dense model has none
        let llama = parse(&format!(r#"{{"model_type":"llama", {FOUR_LAYERS}}}"#)).unwrap();
        assert!(llama.experts.is_none() && llama.sparse_layers == vec![false; 4]);
        for (extra, field) in [
            (r#", "num_experts_per_tok": 9"#, "num_experts_per_tok"),
            (r#", "num_experts_per_tok": 0"#, "num_experts_per_tok"),
            (r#", "num_experts": 0"#, "num_experts"),
            (r#", "mlp_only_layers": [4]"#, "mlp_only_layers"),
            (r#", "mlp_only_layers": 1"#, "mlp_only_layers"),
            (r#", "decoder_sparse_step": 0"#, "decoder_sparse_step"),
            (r#", "moe_intermediate_size": 0"#, "moe_intermediate_size"),
        ] {
            // a later key replaces an earlier one in serde_json's map
            let err = moe(extra).expect_err(extra);
            assert!(err.to_string().contains(field), "{extra}: {err}");
        }
    }

    #[test]
    fn smollm3_bad_nope_layers_are_named() {
        for (extra, field, says) in [
            (
                r#""no_rope_layer_interval": 0"#,
                "no_rope_layer_interval",
                "positive",
            ),
            (
                r#""no_rope_layers": [1, 1, 0]"#,
                "no_rope_layers",
                "4 flags",
            ),
            (
                r#""no_rope_layers": [1, 1, 2, 1]"#,
                "no_rope_layers",
                "1 (the layer rotates)",
            ),
            (r#""no_rope_layers": "all""#, "no_rope_layers", "4 flags"),
        ] {
            let err = parse(&format!(
                r#"{{"model_type":"smollm3", {FOUR_LAYERS}, {extra}}}"#
            ))
            .expect_err(extra);
            let msg = err.to_string();
            assert!(msg.contains(field) && msg.contains(says), "{extra}: {msg}");
        }
    }

    /// A Gemma 4 config as transformers 5.24 saves it (the reference case
    /// `layouts/gemma4-shared`): layers 4 and 5 read layers 3 and 2.
    const GEMMA4: &str = r#""model_type": "gemma4_text", "vocab_size": 320, "hidden_size": 64,
        "intermediate_size": 160, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "attention_k_eq_v": true,
        "sliding_window": 12, "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 320, "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
          "sliding_attention", "sliding_attention", "full_attention"],
        "per_layer_config": {"2": {"head_dim": 32, "num_key_value_heads": 1},
                             "5": {"head_dim": 32, "num_key_value_heads": 1}},
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25,
            "rope_theta": 10000.0, "rope_type": "proportional"},
          "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}"#;

    fn gemma4(extra: &str) -> Result<ModelConfig> {
        parse(&format!("{{{GEMMA4}{extra}}}"))
    }

    #[test]
    fn gemma4_reads_layer_shapes_sharing_and_its_ropes() {
        // the shared layers' MLPs twice as wide where the config says so
        let wide = gemma4(r#", "use_double_wide_mlp": true"#).unwrap();
        let widths: Vec<usize> = (0..6).map(|l| wide.mlp_width(l)).collect();
        let i = wide.intermediate_size;
        assert_eq!(widths, vec![i, i, i, i, 2 * i, 2 * i]);
        let c = gemma4("").unwrap();
        assert!((0..6).all(|l| c.mlp_width(l) == c.intermediate_size));
        assert_eq!(c.arch, Arch::Gemma4);
        let shapes: Vec<(usize, usize, bool, Option<usize>)> = c
            .layer_attention
            .iter()
            .map(|a| (a.kv_heads, a.head_dim, a.values_from_keys, a.kv_source))
            .collect();
        assert_eq!(
            shapes,
            vec![
                (2, 16, false, None),
                (2, 16, false, None),
                (1, 32, true, None),
                (2, 16, false, None),
                (2, 16, false, Some(3)),
                (1, 32, true, Some(2)),
            ]
        );
        assert!(c.layer_attention.iter().all(|a| a.value_norm));
        assert_eq!(c.sliding_window[2], None);
        assert_eq!(c.sliding_window[0], Some(12));
        // the full layers' proportional RoPE: 4 of 16 pairs of a 32-wide head
        assert_eq!(c.rope.rotary_dim, 32);
        assert_eq!(
            c.rope.scaling,
            RopeScaling::Proportional {
                factor: 1.0,
                rotated_pairs: 4
            }
        );
        let sliding = c.sliding_rope.unwrap();
        assert_eq!(
            (sliding.rotary_dim, sliding.scaling),
            (16, RopeScaling::None)
        );
        assert_eq!(
            c.per_layer_input,
            Some(PerLayerInput {
                width: 8,
                vocab: 320
            })
        );
        assert!(c.layer_scalars && !c.norm_weight_offset && c.qk_norm == QkNorm::PerHead);
        assert_eq!((c.attn_scale, c.final_softcap), (1.0, Some(30.0)));
        assert_eq!(c.embedding_scale, Some(8.0));
        // the released checkpoints' keys: global_head_dim and
        // num_global_key_value_heads instead of per_layer_config
        let released = parse(&format!(
            "{{{}, \"global_head_dim\": 32, \"num_global_key_value_heads\": 1}}",
            GEMMA4.replace(
                r#""per_layer_config": {"2": {"head_dim": 32, "num_key_value_heads": 1},
                             "5": {"head_dim": 32, "num_key_value_heads": 1}},"#,
                ""
            )
        ))
        .unwrap();
        assert_eq!(released.layer_attention, c.layer_attention);
    }

    #[test]
    fn gemma4_inconsistent_fields_are_named() {
        for (extra, field, says) in [
            (
                r#", "num_kv_shared_layers": 6"#,
                "num_kv_shared_layers",
                "fewer than",
            ),
            // five shared layers leave no full layer below layer 1
            (
                r#", "num_kv_shared_layers": 5"#,
                "num_kv_shared_layers",
                "full_attention",
            ),
            (
                r#", "layer_types": ["full_attention"]"#,
                "layer_types",
                "6 layer types",
            ),
            (r#", "layer_types": 3"#, "layer_types", "6 layer types"),
            (
                r#", "per_layer_config": {"9": {"head_dim": 8}}"#,
                "per_layer_config",
                "below num_hidden_layers",
            ),
            (
                r#", "per_layer_config": {"2": {"num_key_value_heads": 3}}"#,
                "per_layer_config.2.num_key_value_heads",
                "divisor",
            ),
            (
                r#", "per_layer_config": {"2": {"head_dim": 32}, "5": {"head_dim": 64}}"#,
                "per_layer_config",
                "one head width",
            ),
            (
                r#", "per_layer_config": {"3": {"head_dim": 8}}"#,
                "per_layer_config",
                "one head width",
            ),
            (r#", "sliding_window": 0"#, "sliding_window", "positive"),
            (
                r#", "vocab_size_per_layer_input": 100"#,
                "vocab_size_per_layer_input",
                "at least vocab_size",
            ),
            (
                r#", "hidden_size_per_layer_input": 16777216"#,
                "hidden_size_per_layer_input",
                "num_hidden_layers",
            ),
            (
                // experts without their count
                r#", "enable_moe_block": true, "top_k_experts": 2, "moe_intermediate_size": 8"#,
                "num_experts",
                "positive",
            ),
            (
                r#", "use_bidirectional_attention": "all""#,
                "use_bidirectional_attention",
                "causal",
            ),
            (
                r#", "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 2}}"#,
                "rope_parameters.full_attention.partial_rotary_factor",
                "fraction",
            ),
            (
                r#", "rope_parameters": {"sliding_attention": {"rope_type": "longrope"}}"#,
                "rope_parameters.sliding_attention.rope_type",
                "one of",
            ),
        ] {
            let err = gemma4(extra).expect_err(extra);
            let msg = err.to_string();
            assert!(msg.contains(field) && msg.contains(says), "{extra}: {msg}");
        }
        // the multimodal wrapper's text decoder is read; an empty one names
        // its first missing field inside text_config
        let err = parse(r#"{"model_type": "gemma4", "text_config": {}}"#).unwrap_err();
        assert!(err.to_string().contains("text_config.hidden_size"), "{err}");
    }

    /// A Qwen3.5 config as transformers 5.24 saves it (the reference case
    /// `layouts/qwen35-hybrid`): layers 3 and 7 full, the others linear.
    const QWEN35: &str = r#""model_type": "qwen3_5_text", "vocab_size": 320, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_value_head_dim": 8, "tie_word_embeddings": true,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention",
          "full_attention", "linear_attention", "linear_attention", "linear_attention",
          "full_attention"],
        "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0,
          "rope_type": "default"}"#;

    fn qwen35(extra: &str) -> Result<ModelConfig> {
        parse(&format!("{{{QWEN35}{extra}}}"))
    }

    /// Qwen3.5's published folder: the wrapper (`qwen3_5`) around
    /// [`QWEN35`]'s decoder, whose `tie_word_embeddings` is `text_tie`, and
    /// the wrapper's own fields `top`.
    fn qwen35_wrapped(text_tie: bool, top: &str) -> Result<ModelConfig> {
        parse(&format!(
            r#"{{"model_type": "qwen3_5", "vision_config": {{"depth": 1}}{top},
                "text_config": {{{QWEN35}, "tie_word_embeddings": {text_tie}}}}}"#
        ))
    }

    #[test]
    fn a_multimodal_wrapper_is_read_as_its_text_decoder() {
        let text = qwen35("").unwrap();
        // the LM head is tied by the wrapper's field, as transformers ties
        // it: Qwen3.5's wrapper unties by default, whatever the text says
        let c = qwen35_wrapped(true, "").unwrap();
        assert_eq!(c.arch, text.arch);
        assert_eq!(c.num_layers, text.num_layers);
        assert_eq!(c.linear_attention.as_ref().map(|l| l.value_heads), Some(4));
        assert!(!c.tie_word_embeddings);
        let c = qwen35_wrapped(false, r#", "tie_word_embeddings": true"#).unwrap();
        assert!(c.tie_word_embeddings);
        // Gemma 4's wrapper ties by default
        let gemma4 = parse(&format!(
            r#"{{"model_type": "gemma4", "text_config": {{{BASE}, "model_type": "gemma4_text",
                "tie_word_embeddings": false}}}}"#
        ))
        .unwrap();
        assert!(gemma4.arch == Arch::Gemma4 && gemma4.tie_word_embeddings);
        // the wrapper's BoS and EoS where the text config names none
        let c = qwen35_wrapped(true, r#", "bos_token_id": 5, "eos_token_id": [6, 7]"#).unwrap();
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(5), vec![6, 7])
        );
        // a text config of another family, and a wrong field inside the text
        // config, are named where they are
        let err = parse(&format!(
            r#"{{"model_type": "qwen3_5", "text_config": {{{BASE}, "model_type": "llama"}}}}"#
        ))
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("text_config.model_type") && msg.contains("qwen3_5_text"),
            "{msg}"
        );
        let err = parse(&format!(
            r#"{{"model_type": "qwen3_5", "text_config": {{{QWEN35}, "num_hidden_layers": 0}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("text_config.num_hidden_layers"),
            "{err}"
        );
        let err = qwen35_wrapped(true, r#", "tie_word_embeddings": "yes""#).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("tie_word_embeddings") && !msg.contains("text_config."),
            "{msg}"
        );
    }

    #[test]
    fn qwen35_reads_its_linear_layers_and_gated_full_layers() {
        let c = qwen35("").unwrap();
        assert_eq!(c.arch, Arch::Qwen35);
        let la = c.linear_attention.clone().unwrap();
        let linear: Vec<usize> = (0..8).filter(|&l| la.is_linear(l)).collect();
        assert_eq!(linear, vec![0, 1, 2, 4, 5, 6]);
        assert_eq!(
            (
                la.key_heads,
                la.value_heads,
                la.key_head_dim,
                la.value_head_dim
            ),
            (2, 4, 16, 8)
        );
        assert_eq!(la.conv_channels(), 2 * 32 + 32);
        assert_eq!(la.state_values(), 96 * 3 + 4 * 16 * 8);
        // linear layers hold no K/V; full ones 2 heads of 16
        let kv: Vec<usize> = c.layer_attention.iter().map(|a| a.kv_heads).collect();
        assert_eq!(kv, vec![0, 0, 0, 2, 0, 0, 0, 2]);
        assert!(c.attn_output_gate && c.norm_weight_offset && c.qk_norm == QkNorm::PerHead);
        assert_eq!((c.rope.rotary_dim, c.rope.theta), (4, 10_000.0));
        assert_eq!(c.sliding_window, vec![None; 8]);
        // transformers' defaults: every fourth layer full, a quarter of the
        // head rotating, the class's linear shapes
        let d = parse(&format!(
            r#"{{"model_type": "qwen3_5_text", {BASE}, "num_hidden_layers": 8, "head_dim": 32}}"#
        ))
        .unwrap();
        let la = d.linear_attention.unwrap();
        assert_eq!(
            la.layers,
            vec![true, true, true, false, true, true, true, false]
        );
        assert_eq!(
            (
                la.key_heads,
                la.value_heads,
                la.key_head_dim,
                la.conv_kernel
            ),
            (16, 32, 128, 4)
        );
        assert_eq!(d.rope.rotary_dim, 8);
        // every other architecture has none
        let llama = parse(&format!(r#"{{"model_type":"llama", {BASE}}}"#)).unwrap();
        assert!(llama.linear_attention.is_none() && !llama.attn_output_gate);
    }

    #[test]
    fn qwen35_inconsistent_fields_are_named() {
        for (extra, field, says) in [
            (
                r#", "layer_types": ["linear_attention", "full_attention"]"#,
                "layer_types",
                "8 layer types",
            ),
            (
                r#", "layer_types": "hybrid""#,
                "layer_types",
                "8 layer types",
            ),
            (
                r#", "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                    "sliding_attention", "linear_attention", "linear_attention",
                    "linear_attention", "full_attention"]"#,
                "layer_types",
                "linear_attention or full_attention",
            ),
            (
                r#", "linear_num_value_heads": 3"#,
                "linear_num_value_heads",
                "a multiple of linear_num_key_heads",
            ),
            (
                r#", "linear_num_key_heads": 0"#,
                "linear_num_key_heads",
                "positive",
            ),
            (
                r#", "linear_conv_kernel_dim": 0"#,
                "linear_conv_kernel_dim",
                "positive",
            ),
            (
                r#", "linear_value_head_dim": "wide""#,
                "linear_value_head_dim",
                "positive",
            ),
            (
                r#", "linear_key_head_dim": 16777216"#,
                "linear_key_head_dim",
                "heads x head width",
            ),
            (
                r#", "rope_parameters": {"partial_rotary_factor": 3.0}"#,
                "partial_rotary_factor",
                "fraction",
            ),
        ] {
            let err = qwen35(extra).expect_err(extra);
            let msg = err.to_string();
            assert!(msg.contains(field) && msg.contains(says), "{extra}: {msg}");
        }
        // a multimodal wrapper without its text decoder's config is refused,
        // naming what it should hold
        for (model_type, text) in [
            ("qwen3_5", "qwen3_5_text"),
            ("qwen3_5_moe", "qwen3_5_moe_text"),
        ] {
            let err = parse(&format!(r#"{{"model_type": "{model_type}", {BASE}}}"#)).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("text_config") && msg.contains(text) && msg.contains(model_type),
                "{msg}"
            );
        }
        // the experts: every layer sparse, the top k renormalised, a shared
        // expert of its own width
        let c = parse(&format!(
            r#"{{"model_type": "qwen3_5_moe_text", {BASE}, "head_dim": 8, "num_experts": 8,
                "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                "shared_expert_intermediate_size": 24}}"#
        ))
        .unwrap();
        let e = c.experts.expect("experts");
        assert_eq!(
            (e.num_experts, e.top_k, e.inner, e.shared_inner),
            (8, 2, 16, Some(24))
        );
        assert!(e.normalize_top_k && c.sparse_layers.iter().all(|&s| s));
        assert!(c.linear_attention.is_some() && c.attn_output_gate);
        let err = parse(&format!(
            r#"{{"model_type": "qwen3_5_moe_text", {BASE}, "head_dim": 8, "shared_expert_intermediate_size": 0}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("shared_expert_intermediate_size"),
            "{err}"
        );
    }

    #[test]
    fn olmo_norms_follow_the_blocks_and_olmo3_slides() {
        let c = parse(&format!(
            r#"{{"model_type":"olmo2", {FOUR_LAYERS}, "sliding_window": 2}}"#
        ))
        .unwrap();
        assert_eq!((c.norms, c.qk_norm), (NormPlacement::Post, QkNorm::Whole));
        // OLMo 2 never slides; transformers' OLMo defaults
        assert_eq!(c.sliding_window, vec![None; 4]);
        assert_eq!((c.rms_norm_eps, c.rope.theta), (1e-5, 10_000.0));
        assert!(!c.tie_word_embeddings && c.sliding_rope.is_none());
        // OLMo 3: three sliding layers then a full one, scaling on full layers only
        let c = parse(&format!(
            r#"{{"model_type":"olmo3", {FOUR_LAYERS}, "sliding_window": 2, "rope_theta": 1000.0,
                "rope_scaling": {{"rope_type": "linear", "factor": 4.0}}}}"#
        ))
        .unwrap();
        assert_eq!(c.sliding_window, vec![Some(2), Some(2), Some(2), None]);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 4.0 });
        let sliding = c.sliding_rope.unwrap();
        assert_eq!(
            (sliding.theta, sliding.scaling),
            (1000.0, RopeScaling::None)
        );
        // and the transformers 5 form, one object per layer type
        let c = parse(&format!(
            r#"{{"model_type":"olmo3", {FOUR_LAYERS}, "layer_types":
                ["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
                "rope_parameters": {{"full_attention": {{"rope_theta": 7.0, "rope_type": "default"}},
                                    "sliding_attention": {{"rope_theta": 5.0}}}}}}"#
        ))
        .unwrap();
        assert_eq!(c.sliding_window, vec![None, Some(4096), None, Some(4096)]);
        assert_eq!((c.rope.theta, c.sliding_rope.unwrap().theta), (7.0, 5.0));
        let err = parse(&format!(
            r#"{{"model_type":"olmo3", {FOUR_LAYERS}, "layer_types": ["full_attention"]}}"#
        ))
        .expect_err("layer_types of another length");
        assert!(err.to_string().contains("layer_types"), "{err}");
    }
}
