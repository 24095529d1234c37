//! The shape of a Llama-architecture model, described once: the random
//! models of the tests and benchmarks and the bundled task models are both
//! this shape plus what is theirs (a seed, a vocabulary), and both write the
//! same `config.json` for it. A shape may take one of the newer layouts of
//! the same layer ([`Layout`]: SmolLM3's NoPE layers, OLMo's norms after the
//! blocks and sliding layers), so that task models and random models of
//! those layouts are made the same way.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{Arch, MAX_LAYERS, MAX_SIZE, ModelConfig};
use crate::error::{Result, ShapeError};

/// The layer layout of a shape: Llama's, or a newer one built from the
/// same parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    /// Llama: a norm before each block, every layer rotated.
    #[default]
    Llama,
    /// SmolLM3: every `nope_interval`-th layer (counting from 1) without
    /// RoPE.
    Smollm3 {
        /// The interval of the layers without rotation (SmolLM3's 4).
        nope_interval: usize,
    },
    /// OLMo 2 (`window` none) or OLMo 3 (three layers sliding over
    /// `window` tokens, then a full one): norms after the blocks, q/k norms
    /// over the whole projection.
    Olmo {
        /// OLMo 3's sliding window.
        window: Option<usize>,
    },
    /// Mixtral: Llama's attention, each layer's MLP a mixture of `experts`
    /// gated MLPs of which a token reads its router's top `top_k`.
    Mixtral {
        /// Experts per layer.
        experts: usize,
        /// Experts each token reads.
        top_k: usize,
    },
    /// Qwen3.5 (`qwen3_5_text`): every `full_interval`-th layer (counting
    /// from 1) full attention with a gated output, per-head q/k norms and
    /// RoPE on a quarter of each head; the others linear attention (Gated
    /// DeltaNet, convolution kernel 4) with the full layers' heads (key
    /// heads as many as the K/V heads, value heads as the query heads, both
    /// of the head width); (1 + w) norms. With `experts`, Qwen3.5-MoE
    /// (`qwen3_5_moe_text`): every MLP a mixture of experts half as wide,
    /// each token reading its router's top k, beside a shared expert of the
    /// same width scaled by the sigmoid of its own gate.
    Qwen35 {
        /// The interval of the full-attention layers (Qwen3.5's 4).
        full_interval: usize,
        /// Experts per layer and experts each token reads, in place of
        /// each layer's MLP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        experts: Option<(usize, usize)>,
    },
    /// Gemma 4 (`gemma4_text`): two layers sliding over `window` tokens,
    /// then a full one (the last layer full), the full layers' keys being
    /// their values (`attention_k_eq_v`) and rotated over a quarter of each
    /// head; per-layer inputs of [`GEMMA4_LAYER_INPUT`] values; the last
    /// `shared` layers reading the K/V of the last unshared layer of their
    /// type; sandwich norms, q/k/v norms, a layer scalar, GELU MLPs, tied
    /// embeddings scaled by sqrt(hidden), logits soft-capped at 30; with
    /// `experts`, every MLP beside a mixture of experts half as wide, as
    /// Gemma 4 26B-A4B's (`enable_moe_block`).
    Gemma4 {
        /// The sliding layers' window.
        window: usize,
        /// Layers at the top that read an earlier layer's K/V.
        shared: usize,
        /// Experts per layer and experts each token reads, beside each
        /// layer's MLP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        experts: Option<(usize, usize)>,
    },
}

/// The per-layer input width of [`Layout::Gemma4`] (`hidden_size_per_layer_input`).
pub const GEMMA4_LAYER_INPUT: usize = 16;

/// The convolution kernel of [`Layout::Qwen35`]'s linear layers.
const QWEN35_CONV_KERNEL: usize = 4;

impl std::str::FromStr for Layout {
    type Err = String;

    /// `llama`, `smollm3` (NoPE every 4th layer) or `smollm3:N`, `olmo2`,
    /// `olmo3` (window 4096, transformers' default) or `olmo3:W`, `mixtral`
    /// (the top 2 of 8 experts) or `mixtral:E/K`, `qwen35` (every 4th layer
    /// full), `qwen35:N` or `qwen35:N/E/K` (Qwen3.5-MoE: E experts and a
    /// shared one, each token reading K), `gemma4` (window 512, no shared layers),
    /// `gemma4:W` or `gemma4:W/S` (the last S layers shared), or
    /// `gemma4:W/S/E/K` (E experts beside every MLP, each token reading K).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let number = |what: &str| -> std::result::Result<Option<usize>, String> {
            arg.map(|a| match a.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "{s:?}: the {what} after ':' must be a positive integer"
                )),
            })
            .transpose()
        };
        match name {
            "llama" if arg.is_none() => Ok(Layout::Llama),
            "smollm3" => Ok(Layout::Smollm3 {
                nope_interval: number("NoPE interval")?.unwrap_or(4),
            }),
            "olmo2" if arg.is_none() => Ok(Layout::Olmo { window: None }),
            "olmo3" => Ok(Layout::Olmo {
                window: Some(number("sliding window")?.unwrap_or(4096)),
            }),
            "mixtral" => {
                let (experts, top_k) = match arg {
                    None => (8, 2),
                    Some(a) => {
                        let parsed = a
                            .split_once('/')
                            .and_then(|(e, k)| Some((e.parse().ok()?, k.parse().ok()?)));
                        match parsed {
                            Some((e, k)) if k > 0 && k <= e => (e, k),
                            _ => {
                                return Err(format!(
                                    "{s:?}: after ':' give EXPERTS/TOP_K, 0 < TOP_K <= EXPERTS"
                                ));
                            }
                        }
                    }
                };
                Ok(Layout::Mixtral { experts, top_k })
            }
            "qwen35" => {
                let fields: Vec<Option<usize>> =
                    arg.map_or(vec![], |a| a.split('/').map(|x| x.parse().ok()).collect());
                let (full_interval, experts) = match fields[..] {
                    [] => (Some(4), Some(None)),
                    [n] => (n, Some(None)),
                    [n, Some(e), Some(top)] if top > 0 && top <= e => (n, Some(Some((e, top)))),
                    _ => (None, None),
                };
                match (full_interval, experts) {
                    (Some(full_interval), Some(experts)) if full_interval > 0 => {
                        Ok(Layout::Qwen35 {
                            full_interval,
                            experts,
                        })
                    }
                    _ => Err(format!(
                        "{s:?}: after ':' give FULL_INTERVAL or FULL_INTERVAL/EXPERTS/TOP_K, \
                         a positive interval and 0 < TOP_K <= EXPERTS"
                    )),
                }
            }
            "gemma4" => {
                let fields: Vec<Option<usize>> =
                    arg.map_or(vec![], |a| a.split('/').map(|x| x.parse().ok()).collect());
                let (window, shared, experts) = match fields[..] {
                    [] => (Some(512), Some(0), Some(None)),
                    [w] => (w, Some(0), Some(None)),
                    [w, k] => (w, k, Some(None)),
                    [w, k, Some(e), Some(top)] if top > 0 && top <= e => {
                        (w, k, Some(Some((e, top))))
                    }
                    _ => (None, None, None),
                };
                match (window, shared, experts) {
                    (Some(window), Some(shared), Some(experts)) if window > 0 => {
                        Ok(Layout::Gemma4 {
                            window,
                            shared,
                            experts,
                        })
                    }
                    _ => Err(format!(
                        "{s:?}: after ':' give WINDOW, WINDOW/SHARED or WINDOW/SHARED/EXPERTS/TOP_K, \
                         a positive window and 0 < TOP_K <= EXPERTS"
                    )),
                }
            }
            _ => Err(format!(
                "{s:?} is not a layout: llama, smollm3[:NOPE_INTERVAL], olmo2, olmo3[:WINDOW], \
                 mixtral[:EXPERTS/TOP_K], qwen35[:FULL_INTERVAL[/EXPERTS/TOP_K]], \
                 gemma4[:WINDOW[/SHARED[/EXPERTS/TOP_K]]]"
            )),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layout::Llama => f.write_str("llama"),
            Layout::Smollm3 { nope_interval } => write!(f, "smollm3:{nope_interval}"),
            Layout::Olmo { window: None } => f.write_str("olmo2"),
            Layout::Olmo { window: Some(w) } => write!(f, "olmo3:{w}"),
            Layout::Mixtral { experts, top_k } => write!(f, "mixtral:{experts}/{top_k}"),
            Layout::Qwen35 {
                full_interval,
                experts: None,
            } => write!(f, "qwen35:{full_interval}"),
            Layout::Qwen35 {
                full_interval,
                experts: Some((e, k)),
            } => write!(f, "qwen35:{full_interval}/{e}/{k}"),
            Layout::Gemma4 {
                window,
                shared,
                experts: None,
            } => write!(f, "gemma4:{window}/{shared}"),
            Layout::Gemma4 {
                window,
                shared,
                experts: Some((e, k)),
            } => write!(f, "gemma4:{window}/{shared}/{e}/{k}"),
        }
    }
}

impl Layout {
    /// Whether this is Llama's layout (the shape's serialised form then
    /// names no layout, as it did before layouts existed).
    pub fn is_llama(&self) -> bool {
        *self == Layout::Llama
    }

    /// Whether layer `l` of this layout is a linear-attention layer.
    pub fn is_linear(&self, l: usize) -> bool {
        matches!(self, Layout::Qwen35 { full_interval, .. } if !(l + 1).is_multiple_of(*full_interval))
    }

    /// Whether layer `l` of `layers` is a full-attention layer of
    /// [`Layout::Gemma4`] (every third, and the last).
    fn gemma4_full(l: usize, layers: usize) -> bool {
        (l + 1).is_multiple_of(3) || l + 1 == layers
    }
}

/// The sizes and constants that fix a Llama-architecture model (untied LM
/// head, no biases, SiLU MLP, plain RoPE) and its layer layout. Serialised
/// with these field names; the Hugging Face names are written by
/// [`LlamaShape::config_json`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LlamaShape {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Longest sequence the config allows.
    pub max_position_embeddings: usize,
    /// The layer layout.
    #[serde(default, skip_serializing_if = "Layout::is_llama")]
    pub layout: Layout,
}

/// The special token ids a `config.json` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: u32,
    /// End of sequence.
    pub eos: u32,
    /// Padding, when the vocabulary has one.
    pub pad: Option<u32>,
}

impl LlamaShape {
    /// Width of one head (`hidden_size / num_heads`; 0 when `num_heads` is 0).
    pub fn head_dim(&self) -> usize {
        self.hidden_size.checked_div(self.num_heads).unwrap_or(0)
    }

    /// Check every size, naming the first field that is wrong: sizes are
    /// positive and within what a config may claim, the heads split the
    /// width into an even head width (RoPE rotates pairs), the K/V heads
    /// divide the query heads, and the constants are finite.
    pub fn validate(&self) -> std::result::Result<(), ShapeError> {
        self.validate_heads_of(None)
    }

    /// [`Self::validate`] for a model whose heads are `head_dim` wide where
    /// that is given (gpt-oss's 64 at width 2880 and 64 heads): the
    /// hidden size need not split into the heads then; the caller checks
    /// that width.
    pub fn validate_heads_of(
        &self,
        head_dim: Option<usize>,
    ) -> std::result::Result<(), ShapeError> {
        let bad = |field, expected: String, found: String| {
            Err(ShapeError {
                field,
                expected,
                found,
            })
        };
        let sizes = [
            ("vocab_size", self.vocab_size, MAX_SIZE),
            ("hidden_size", self.hidden_size, MAX_SIZE),
            ("intermediate_size", self.intermediate_size, MAX_SIZE),
            ("num_layers", self.num_layers, MAX_LAYERS),
            ("num_heads", self.num_heads, MAX_SIZE),
            ("num_kv_heads", self.num_kv_heads, MAX_SIZE),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                usize::MAX,
            ),
        ];
        for (field, n, max) in sizes {
            if n == 0 || n > max {
                return bad(
                    field,
                    format!("a positive integer up to {max}"),
                    n.to_string(),
                );
            }
        }
        if head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_heads) {
            return bad(
                "num_heads",
                format!("a divisor of hidden_size ({})", self.hidden_size),
                self.num_heads.to_string(),
            );
        }
        if head_dim.is_none() && !self.head_dim().is_multiple_of(2) {
            return bad(
                "num_heads",
                format!(
                    "a head count that splits hidden_size ({}) into an even head width",
                    self.hidden_size
                ),
                format!("{} (head width {})", self.num_heads, self.head_dim()),
            );
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(
                "num_kv_heads",
                format!("a divisor of num_heads ({})", self.num_heads),
                self.num_kv_heads.to_string(),
            );
        }
        let mixture = match self.layout {
            Layout::Mixtral { experts, top_k } => Some((experts, top_k)),
            Layout::Gemma4 { experts, .. } | Layout::Qwen35 { experts, .. } => experts,
            _ => None,
        };
        if let Some((experts, top_k)) = mixture
            && !(experts <= MAX_SIZE && top_k > 0 && top_k <= experts)
        {
            return bad(
                "layout",
                format!("experts up to {MAX_SIZE} and a top-k in 1..=experts"),
                format!("{experts} experts, top {top_k}"),
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(
                "rope_theta",
                "a positive finite number".into(),
                self.rope_theta.to_string(),
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return bad(
                "rms_norm_eps",
                "a non-negative finite number".into(),
                self.rms_norm_eps.to_string(),
            );
        }
        match self.layout {
            Layout::Smollm3 { nope_interval: 0 } => bad(
                "layout.nope_interval",
                "a positive interval".into(),
                "0".into(),
            ),
            Layout::Olmo { window: Some(0) } => bad(
                "layout.window",
                "a positive window (tokens a query reads)".into(),
                "0".into(),
            ),
            Layout::Qwen35 {
                full_interval: 0, ..
            } => bad(
                "layout.full_interval",
                "a positive interval".into(),
                "0".into(),
            ),
            Layout::Gemma4 { window: 0, .. } => bad(
                "layout.window",
                "a positive window (tokens a query reads)".into(),
                "0".into(),
            ),
            Layout::Gemma4 { shared, .. } if shared >= self.num_layers => bad(
                "layout.shared",
                format!("fewer than the {} layers", self.num_layers),
                shared.to_string(),
            ),
            Layout::Qwen35 { .. } | Layout::Gemma4 { .. } if self.head_dim() < 8 => bad(
                "num_heads",
                "heads at least 8 wide (RoPE turns a quarter of each, in pairs)".into(),
                format!("{} (head width {})", self.num_heads, self.head_dim()),
            ),
            _ => Ok(()),
        }
    }

    /// The shape a parsed config describes (its Llama sizes and layout;
    /// what a shape has no field for is dropped).
    pub fn from_config(cfg: &ModelConfig) -> Self {
        let layout = match cfg.arch {
            Arch::SmolLM3 => Layout::Smollm3 {
                nope_interval: cfg.rotates.iter().position(|r| !r).map_or(0, |l| l + 1),
            },
            Arch::Olmo2 => Layout::Olmo { window: None },
            Arch::Olmo3 => Layout::Olmo {
                window: cfg.sliding_window.iter().flatten().next().copied(),
            },
            Arch::Mixtral => Layout::Mixtral {
                experts: cfg.experts.map_or(0, |e| e.num_experts),
                top_k: cfg.experts.map_or(0, |e| e.top_k),
            },
            Arch::Gemma4 => Layout::Gemma4 {
                window: cfg
                    .sliding_window
                    .iter()
                    .flatten()
                    .next()
                    .copied()
                    .unwrap_or(0),
                shared: (cfg.layer_attention.iter())
                    .filter(|a| a.kv_source.is_some())
                    .count(),
                experts: cfg.experts.map(|e| (e.num_experts, e.top_k)),
            },
            Arch::Qwen35 | Arch::Qwen35Moe => Layout::Qwen35 {
                full_interval: (cfg.linear_attention.as_ref())
                    .and_then(|la| la.layers.iter().position(|&linear| !linear))
                    .map_or(0, |l| l + 1),
                experts: cfg.experts.map(|e| (e.num_experts, e.top_k)),
            },
            _ => Layout::Llama,
        };
        Self {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            intermediate_size: cfg.intermediate_size,
            num_layers: cfg.num_layers,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            rope_theta: cfg.rope.theta,
            rms_norm_eps: cfg.rms_norm_eps,
            max_position_embeddings: cfg.max_position_embeddings,
            layout,
        }
    }

    /// The Hugging Face `config.json` of a model of this shape (Llama,
    /// untied head, no biases, f32) naming `tokens`.
    pub fn config_json(&self, tokens: SpecialTokens) -> Value {
        let mut config = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim(),
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "tie_word_embeddings": false,
            "bos_token_id": tokens.bos,
            "eos_token_id": tokens.eos,
            "torch_dtype": "float32"
        });
        let Value::Object(map) = &mut config else {
            return config;
        };
        if let Some(pad) = tokens.pad {
            map.insert("pad_token_id".into(), pad.into());
        }
        match self.layout {
            Layout::Llama => {}
            Layout::Smollm3 { nope_interval } => {
                map.insert("architectures".into(), json!(["SmolLM3ForCausalLM"]));
                map.insert("model_type".into(), json!("smollm3"));
                map.insert("no_rope_layer_interval".into(), json!(nope_interval));
            }
            Layout::Olmo { window } => {
                map.remove("mlp_bias");
                map.remove("head_dim");
                let (arch, model_type) = match window {
                    None => ("Olmo2ForCausalLM", "olmo2"),
                    Some(_) => ("Olmo3ForCausalLM", "olmo3"),
                };
                map.insert("architectures".into(), json!([arch]));
                map.insert("model_type".into(), json!(model_type));
                if let Some(w) = window {
                    map.insert("sliding_window".into(), json!(w));
                    let types: Vec<&str> = (0..self.num_layers)
                        .map(|l| match (l + 1) % 4 {
                            0 => "full_attention",
                            _ => "sliding_attention",
                        })
                        .collect();
                    map.insert("layer_types".into(), json!(types));
                }
            }
            Layout::Mixtral { experts, top_k } => {
                map.remove("mlp_bias");
                map.insert("architectures".into(), json!(["MixtralForCausalLM"]));
                map.insert("model_type".into(), json!("mixtral"));
                map.insert("num_local_experts".into(), json!(experts));
                map.insert("num_experts_per_tok".into(), json!(top_k));
            }
            Layout::Qwen35 { experts, .. } => {
                for stale in ["mlp_bias", "rope_theta"] {
                    map.remove(stale);
                }
                let (architecture, model_type) = match experts {
                    None => ("Qwen3_5ForCausalLM", "qwen3_5_text"),
                    Some(_) => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
                };
                map.insert("architectures".into(), json!([architecture]));
                map.insert("model_type".into(), json!(model_type));
                if let Some((e, k)) = experts {
                    map.insert("num_experts".into(), json!(e));
                    map.insert("num_experts_per_tok".into(), json!(k));
                    map.insert("moe_intermediate_size".into(), json!(self.expert_width()));
                    map.insert(
                        "shared_expert_intermediate_size".into(),
                        json!(self.expert_width()),
                    );
                }
                let types: Vec<&str> = (0..self.num_layers)
                    .map(|l| match self.layout.is_linear(l) {
                        true => "linear_attention",
                        false => "full_attention",
                    })
                    .collect();
                map.insert("layer_types".into(), json!(types));
                map.insert("linear_num_key_heads".into(), json!(self.num_kv_heads));
                map.insert("linear_num_value_heads".into(), json!(self.num_heads));
                map.insert("linear_key_head_dim".into(), json!(self.head_dim()));
                map.insert("linear_value_head_dim".into(), json!(self.head_dim()));
                map.insert("linear_conv_kernel_dim".into(), json!(QWEN35_CONV_KERNEL));
                map.insert(
                    "rope_parameters".into(),
                    json!({
                        "rope_type": "default",
                        "rope_theta": self.rope_theta,
                        "partial_rotary_factor": 0.25
                    }),
                );
            }
            Layout::Gemma4 {
                window,
                shared,
                experts,
            } => {
                for stale in ["mlp_bias", "rope_theta", "hidden_act"] {
                    map.remove(stale);
                }
                let types: Vec<&str> = (0..self.num_layers)
                    .map(|l| match Layout::gemma4_full(l, self.num_layers) {
                        true => "full_attention",
                        false => "sliding_attention",
                    })
                    .collect();
                let fields = json!({
                    "architectures": ["Gemma4ForCausalLM"],
                    "model_type": "gemma4_text",
                    "hidden_activation": "gelu_pytorch_tanh",
                    "tie_word_embeddings": true,
                    "layer_types": types,
                    "sliding_window": window,
                    "attention_k_eq_v": true,
                    "global_head_dim": self.head_dim(),
                    "num_global_key_value_heads": self.num_kv_heads,
                    "hidden_size_per_layer_input": GEMMA4_LAYER_INPUT,
                    "vocab_size_per_layer_input": self.vocab_size,
                    "num_kv_shared_layers": shared,
                    "final_logit_softcapping": 30.0,
                    "enable_moe_block": false,
                    "rope_parameters": {
                        "full_attention": {
                            "rope_type": "proportional",
                            "rope_theta": self.rope_theta,
                            "partial_rotary_factor": 0.25
                        },
                        "sliding_attention": {
                            "rope_type": "default",
                            "rope_theta": self.rope_theta
                        }
                    }
                });
                if let Value::Object(fields) = fields {
                    map.extend(fields);
                }
                if let Some((e, k)) = experts {
                    map.insert("enable_moe_block".into(), json!(true));
                    map.insert("num_experts".into(), json!(e));
                    map.insert("top_k_experts".into(), json!(k));
                    map.insert("moe_intermediate_size".into(), json!(self.expert_width()));
                }
            }
        }
        config
    }

    /// The inner width of each expert of [`Layout::Gemma4`]'s and
    /// [`Layout::Qwen35`]'s mixtures (and of Qwen3.5-MoE's shared expert):
    /// half the MLP's (at least one).
    fn expert_width(&self) -> usize {
        (self.intermediate_size / 2).max(1)
    }

    /// The value every entry of a fresh model's one-dimensional weight
    /// `name` starts at: a norm at its identity (1, or 0 where the layout's
    /// norms are (1 + w), except Qwen3.5's plain gated norm), Qwen3.5's log
    /// decay rates at 0 and decay-step biases at -4, so that each linear
    /// layer's state keeps about 98% of itself from one token to the next
    /// (softplus(-4) = 0.018). Started at 0, keeping about half, the 4-layer
    /// copy model stayed on its first plateau for 850 steps where the
    /// Llama layout's leaves it in 150.
    pub fn vector_start(&self, name: &str) -> f32 {
        let qwen35 = matches!(self.layout, Layout::Qwen35 { .. });
        if qwen35 && name.ends_with("dt_bias") {
            return -4.0;
        }
        match qwen35 && !name.ends_with("linear_attn.norm.weight") {
            true => 0.0,
            false => 1.0,
        }
    }

    /// The decoder config of a model of this shape naming `tokens`: the
    /// shape is validated, then read through the same parser as a
    /// `config.json` on disk, so the two cannot disagree.
    pub fn model_config(&self, tokens: SpecialTokens) -> Result<ModelConfig> {
        self.validate()?;
        ModelConfig::from_json_value(
            &self.config_json(tokens),
            Path::new("(llama shape)/config.json"),
        )
    }

    /// Every weight's Hugging Face name and shape, in a fixed order
    /// (embedding, final norm, LM head, then each layer's: attention or
    /// Qwen3.5's linear attention, MLP, norms, and the q/k norms of OLMo's
    /// layout).
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (v, d, i) = (self.vocab_size, self.hidden_size, self.intermediate_size);
        let (h, kv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim());
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![v, d]),
            ("model.norm.weight".to_string(), vec![d]),
        ];
        if let Layout::Gemma4 { .. } = self.layout {
            // tied embeddings; each token's inputs to every layer
            let all = self.num_layers * GEMMA4_LAYER_INPUT;
            out.extend([
                (
                    "model.embed_tokens_per_layer.weight".to_string(),
                    vec![v, all],
                ),
                (
                    "model.per_layer_model_projection.weight".to_string(),
                    vec![all, d],
                ),
                (
                    "model.per_layer_projection_norm.weight".to_string(),
                    vec![GEMMA4_LAYER_INPUT],
                ),
            ]);
        } else {
            out.push(("lm_head.weight".to_string(), vec![v, d]));
        }
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            match self.layout {
                Layout::Gemma4 { shared, .. } => {
                    let a = format!("{p}.self_attn");
                    out.extend([
                        (format!("{a}.q_proj.weight"), vec![h * hd, d]),
                        (format!("{a}.o_proj.weight"), vec![d, h * hd]),
                        (format!("{a}.q_norm.weight"), vec![hd]),
                    ]);
                    // a shared layer reads another's K/V; a full layer's keys are its values
                    if l < self.num_layers - shared {
                        out.extend([
                            (format!("{a}.k_proj.weight"), vec![kv * hd, d]),
                            (format!("{a}.k_norm.weight"), vec![hd]),
                        ]);
                        if !Layout::gemma4_full(l, self.num_layers) {
                            out.push((format!("{a}.v_proj.weight"), vec![kv * hd, d]));
                        }
                    }
                    let g = GEMMA4_LAYER_INPUT;
                    out.extend([
                        (format!("{p}.layer_scalar"), vec![1]),
                        (format!("{p}.per_layer_input_gate.weight"), vec![g, d]),
                        (format!("{p}.per_layer_projection.weight"), vec![d, g]),
                        (format!("{p}.post_per_layer_input_norm.weight"), vec![d]),
                    ]);
                }
                Layout::Qwen35 { .. } if self.layout.is_linear(l) => {
                    // key heads as the K/V heads, value heads as the query heads
                    let a = format!("{p}.linear_attn");
                    let channels = 2 * kv * hd + h * hd;
                    out.extend([
                        (format!("{a}.in_proj_qkv.weight"), vec![channels, d]),
                        (format!("{a}.in_proj_z.weight"), vec![h * hd, d]),
                        (format!("{a}.in_proj_b.weight"), vec![h, d]),
                        (format!("{a}.in_proj_a.weight"), vec![h, d]),
                        (
                            format!("{a}.conv1d.weight"),
                            vec![channels, 1, QWEN35_CONV_KERNEL],
                        ),
                        (format!("{a}.A_log"), vec![h]),
                        (format!("{a}.dt_bias"), vec![h]),
                        (format!("{a}.norm.weight"), vec![hd]),
                        (format!("{a}.out_proj.weight"), vec![d, h * hd]),
                    ]);
                }
                _ => {
                    // Qwen3.5's full layers project the output gate beside the queries
                    let gated = matches!(self.layout, Layout::Qwen35 { .. });
                    let q_rows = if gated { 2 * h * hd } else { h * hd };
                    out.extend([
                        (format!("{p}.self_attn.q_proj.weight"), vec![q_rows, d]),
                        (format!("{p}.self_attn.k_proj.weight"), vec![kv * hd, d]),
                        (format!("{p}.self_attn.v_proj.weight"), vec![kv * hd, d]),
                        (format!("{p}.self_attn.o_proj.weight"), vec![d, h * hd]),
                    ]);
                    if gated {
                        out.extend([
                            (format!("{p}.self_attn.q_norm.weight"), vec![hd]),
                            (format!("{p}.self_attn.k_norm.weight"), vec![hd]),
                        ]);
                    }
                }
            }
            match self.layout {
                Layout::Mixtral { experts, .. } => {
                    let moe = format!("{p}.block_sparse_moe");
                    out.push((format!("{moe}.gate.weight"), vec![experts, d]));
                    for e in 0..experts {
                        out.extend([
                            (format!("{moe}.experts.{e}.w1.weight"), vec![i, d]),
                            (format!("{moe}.experts.{e}.w2.weight"), vec![d, i]),
                            (format!("{moe}.experts.{e}.w3.weight"), vec![i, d]),
                        ]);
                    }
                }
                Layout::Qwen35 {
                    experts: Some((e, _)),
                    ..
                } => {
                    // the router, the experts, the shared expert and its gate
                    let w = self.expert_width();
                    let mlp = format!("{p}.mlp");
                    out.push((format!("{mlp}.gate.weight"), vec![e, d]));
                    let experts = (0..e).map(|e| format!("{mlp}.experts.{e}"));
                    for x in experts.chain([format!("{mlp}.shared_expert")]) {
                        out.extend([
                            (format!("{x}.gate_proj.weight"), vec![w, d]),
                            (format!("{x}.up_proj.weight"), vec![w, d]),
                            (format!("{x}.down_proj.weight"), vec![d, w]),
                        ]);
                    }
                    out.push((format!("{mlp}.shared_expert_gate.weight"), vec![1, d]));
                }
                _ => out.extend([
                    (format!("{p}.mlp.gate_proj.weight"), vec![i, d]),
                    (format!("{p}.mlp.up_proj.weight"), vec![i, d]),
                    (format!("{p}.mlp.down_proj.weight"), vec![d, i]),
                ]),
            }
            if let Layout::Gemma4 {
                experts: Some((e, _)),
                ..
            } = self.layout
            {
                // the router with its two scales, the experts stacked, and
                // the norms of the two branches
                let w = self.expert_width();
                out.extend([
                    (format!("{p}.router.proj.weight"), vec![e, d]),
                    (format!("{p}.router.scale"), vec![d]),
                    (format!("{p}.router.per_expert_scale"), vec![e]),
                    (format!("{p}.experts.gate_up_proj"), vec![e, 2 * w, d]),
                    (format!("{p}.experts.down_proj"), vec![e, d, w]),
                    (format!("{p}.post_feedforward_layernorm_1.weight"), vec![d]),
                    (format!("{p}.pre_feedforward_layernorm_2.weight"), vec![d]),
                    (format!("{p}.post_feedforward_layernorm_2.weight"), vec![d]),
                ]);
            }
            let norms: &[(&str, usize)] = match self.layout {
                Layout::Llama
                | Layout::Smollm3 { .. }
                | Layout::Mixtral { .. }
                | Layout::Qwen35 { .. } => {
                    &[("input_layernorm", d), ("post_attention_layernorm", d)]
                }
                Layout::Olmo { .. } => &[
                    ("post_attention_layernorm", d),
                    ("post_feedforward_layernorm", d),
                    ("self_attn.q_norm", h * hd),
                    ("self_attn.k_norm", kv * hd),
                ],
                Layout::Gemma4 { .. } => &[
                    ("input_layernorm", d),
                    ("post_attention_layernorm", d),
                    ("pre_feedforward_layernorm", d),
                    ("post_feedforward_layernorm", d),
                ],
            };
            out.extend(
                norms
                    .iter()
                    .map(|(name, width)| (format!("{p}.{name}.weight"), vec![*width])),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LlamaShape {
        LlamaShape {
            vocab_size: 92,
            hidden_size: 128,
            intermediate_size: 256,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 512,
            layout: Layout::Llama,
        }
    }

    const TOKENS: SpecialTokens = SpecialTokens {
        bos: 2,
        eos: 3,
        pad: Some(0),
    };

    #[test]
    fn the_config_reads_back_as_the_same_shape() {
        let s = shape();
        let cfg = s.model_config(TOKENS).unwrap();
        assert_eq!(LlamaShape::from_config(&cfg), s);
        assert_eq!(cfg.arch, crate::Arch::Llama);
        assert_eq!(cfg.head_dim, 32);
        assert!(!cfg.tie_word_embeddings && !cfg.qkv_bias);
        assert_eq!((cfg.bos_token_id, cfg.eos_token_ids), (Some(2), vec![3]));
        let json = s.config_json(TOKENS);
        assert_eq!(json["pad_token_id"], 0);
        let no_pad = s.config_json(SpecialTokens {
            pad: None,
            ..TOKENS
        });
        assert!(no_pad.get("pad_token_id").is_none());
    }

    #[test]
    fn the_serialised_form_keeps_its_field_names() {
        let text = serde_json::to_string(&shape()).unwrap();
        assert_eq!(
            text,
            r#"{"vocab_size":92,"hidden_size":128,"intermediate_size":256,"num_layers":4,"num_heads":4,"num_kv_heads":2,"rope_theta":10000.0,"rms_norm_eps":0.00001,"max_position_embeddings":512}"#
        );
        let back: LlamaShape = serde_json::from_str(&text).unwrap();
        assert_eq!(back, shape());
    }

    #[test]
    fn validation_names_the_bad_field() {
        type Spoil = fn(&mut LlamaShape);
        let cases: [(&str, Spoil); 9] = [
            ("vocab_size", |s| s.vocab_size = 0),
            ("hidden_size", |s| s.hidden_size = MAX_SIZE + 1),
            ("num_layers", |s| s.num_layers = 0),
            ("num_heads", |s| s.num_heads = 0),
            ("num_heads", |s| s.num_heads = 3),
            ("num_heads", |s| s.num_heads = 128),
            ("num_kv_heads", |s| s.num_kv_heads = 3),
            ("rope_theta", |s| s.rope_theta = f64::NAN),
            ("rms_norm_eps", |s| s.rms_norm_eps = -1.0),
        ];
        assert_eq!(shape().validate(), Ok(()));
        for (field, spoil) in cases {
            let mut s = shape();
            spoil(&mut s);
            let err = s.validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().contains(field), "{err}");
            // the decoder config refuses it too, without panicking
            assert!(s.model_config(TOKENS).is_err());
        }
    }

    /// Each layout's config reads back as the same shape, and the decoder
    /// builds from exactly the weights the shape lists.
    #[test]
    fn every_layout_reads_back_and_builds_from_its_weights() {
        for layout in [
            Layout::Smollm3 { nope_interval: 2 },
            Layout::Olmo { window: None },
            Layout::Olmo { window: Some(8) },
            Layout::Mixtral {
                experts: 4,
                top_k: 2,
            },
            Layout::Qwen35 {
                full_interval: 2,
                experts: None,
            },
            Layout::Qwen35 {
                full_interval: 4,
                experts: None,
            },
            Layout::Qwen35 {
                full_interval: 2,
                experts: Some((4, 2)),
            },
            Layout::Gemma4 {
                window: 8,
                shared: 0,
                experts: None,
            },
            Layout::Gemma4 {
                window: 8,
                shared: 1,
                experts: None,
            },
            Layout::Gemma4 {
                window: 8,
                shared: 1,
                experts: Some((4, 2)),
            },
        ] {
            let s = LlamaShape { layout, ..shape() };
            let cfg = s.model_config(TOKENS).unwrap();
            assert_eq!(LlamaShape::from_config(&cfg), s, "{layout:?}");
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<LlamaShape>(&text).unwrap(), s);
            let weights: std::collections::HashMap<String, candle_core::Tensor> = s
                .weight_shapes()
                .into_iter()
                .map(|(name, dims)| {
                    let t = candle_core::Tensor::ones(
                        dims,
                        candle_core::DType::F32,
                        &candle_core::Device::Cpu,
                    );
                    (name, t.unwrap())
                })
                .collect();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("model.safetensors");
            candle_core::safetensors::save(&weights, &path).unwrap();
            std::fs::write(
                dir.path().join("config.json"),
                s.config_json(TOKENS).to_string(),
            )
            .unwrap();
            let model = crate::Decoder::load(
                dir.path(),
                candle_core::DType::F32,
                &candle_core::Device::Cpu,
            );
            assert!(model.is_ok(), "{layout:?}: {:?}", model.err());
        }
        let bad = LlamaShape {
            layout: Layout::Smollm3 { nope_interval: 0 },
            ..shape()
        };
        assert_eq!(bad.validate().unwrap_err().field, "layout.nope_interval");
        let bad = LlamaShape {
            layout: Layout::Mixtral {
                experts: 2,
                top_k: 3,
            },
            ..shape()
        };
        assert_eq!(bad.validate().unwrap_err().field, "layout");
        let bad = LlamaShape {
            layout: Layout::Qwen35 {
                full_interval: 0,
                experts: None,
            },
            ..shape()
        };
        assert_eq!(bad.validate().unwrap_err().field, "layout.full_interval");
        // RoPE turns a quarter of each head, in pairs
        let bad = LlamaShape {
            layout: Layout::Qwen35 {
                full_interval: 4,
                experts: None,
            },
            num_heads: 32,
            ..shape()
        };
        assert_eq!(bad.validate().unwrap_err().field, "num_heads");
        let linear: Vec<bool> = (0..8)
            .map(|l| {
                Layout::Qwen35 {
                    full_interval: 4,
                    experts: None,
                }
                .is_linear(l)
            })
            .collect();
        assert_eq!(linear, [true, true, true, false, true, true, true, false]);
        for text in [
            "llama",
            "smollm3:2",
            "olmo2",
            "olmo3:64",
            "mixtral:4/2",
            "qwen35:3",
            "qwen35:4/8/2",
            "gemma4:32/2",
            "gemma4:32/1/4/2",
        ] {
            let layout: Layout = text.parse().unwrap();
            assert_eq!(layout.to_string(), text);
        }
        assert_eq!(
            "mixtral".parse::<Layout>().unwrap().to_string(),
            "mixtral:8/2"
        );
        assert_eq!("qwen35".parse::<Layout>().unwrap().to_string(), "qwen35:4");
        assert_eq!(
            "gemma4".parse::<Layout>().unwrap().to_string(),
            "gemma4:512/0"
        );
        assert_eq!(
            "gemma4:16".parse::<Layout>().unwrap().to_string(),
            "gemma4:16/0"
        );
        let bad = LlamaShape {
            layout: Layout::Gemma4 {
                window: 8,
                shared: 4,
                experts: None,
            },
            ..shape()
        };
        assert_eq!(bad.validate().unwrap_err().field, "layout.shared");
        let bad = LlamaShape {
            layout: Layout::Gemma4 {
                window: 8,
                shared: 0,
                experts: Some((MAX_SIZE + 1, 2)),
            },
            ..shape()
        };
        assert_eq!(bad.validate().unwrap_err().field, "layout");
        for text in [
            "olmo3:0",
            "smollm3:x",
            "llama:2",
            "gemma5",
            "mixtral:4",
            "mixtral:2/3",
            "mixtral:4/0",
            "qwen35:0",
            "qwen35:x",
            "qwen35:4/8",
            "qwen35:4/2/3",
            "qwen35:0/8/2",
            "gemma4:0",
            "gemma4:8/x",
            "gemma4:8/0/4",
            "gemma4:8/0/2/3",
            "gemma4:8/0/4/0",
            "gemma4:8/0/4/2/1",
        ] {
            assert!(text.parse::<Layout>().is_err(), "{text}");
        }
    }

    #[test]
    fn weight_shapes_cover_every_layer() {
        let s = shape();
        let w = s.weight_shapes();
        assert_eq!(w.len(), 3 + 9 * s.num_layers);
        let k = w
            .iter()
            .find(|(n, _)| n == "model.layers.3.self_attn.k_proj.weight")
            .unwrap();
        assert_eq!(k.1, vec![2 * 32, 128]);
    }
}
