//! Named model shapes a random model can take: the sizes, architecture and
//! constants of real checkpoints, as their Hugging Face `config.json` gives
//! them, so that tests and benchmarks run the shapes people use without
//! downloading them.

use std::path::Path;

use lcut_model::{LlamaShape, ModelConfig, RopeScaling, SpecialTokens};
use serde_json::{Value, json};

use crate::error::{Result, SynthError};

/// The architecture family of a shape: what its `config.json` and GGUF
/// metadata call it, and what it adds to the Llama layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama: no biases.
    Llama,
    /// Qwen2: biases on the q, k and v projections.
    Qwen2,
}

impl Family {
    /// The `model_type` of its `config.json` and the `general.architecture`
    /// of its GGUF files.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
        }
    }

    /// Whether the q, k and v projections have biases.
    pub fn qkv_bias(self) -> bool {
        self == Family::Qwen2
    }
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

/// A model's shape: sizes, family, RoPE scaling, tied head and special
/// tokens; everything its `config.json` says besides the dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// The name it is known by (`llama-3.1-8b`).
    pub name: String,
    /// Layers, widths, heads, vocabulary and constants.
    pub sizes: LlamaShape,
    /// Architecture family.
    pub family: Family,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// The LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// BoS and EoS ids.
    pub tokens: SpecialTokens,
}

/// The names [`named`] knows, in the order `lcut synth --help` lists them.
pub const NAMES: [&str; 4] = ["llama-3.2-1b", "qwen2.5-1.5b", "llama-3.1-8b", "small"];

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
        family: Family::Llama,
        rope_scaling: llama3_scaling(32.0),
        tie_word_embeddings: true,
        tokens: LLAMA3_TOKENS,
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
        family: Family::Qwen2,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        // `<|endoftext|>` is both
        tokens: SpecialTokens {
            bos: 151_643,
            eos: 151_643,
            pad: None,
        },
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
        family: Family::Llama,
        rope_scaling: llama3_scaling(8.0),
        tie_word_embeddings: false,
        tokens: LLAMA3_TOKENS,
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
    /// A plain Llama of these sizes (untied head, no RoPE scaling, BoS 1,
    /// EoS 2), as the random models of the tests are.
    pub fn llama(name: &str, sizes: LlamaShape) -> Self {
        Self {
            name: name.to_string(),
            sizes,
            family: Family::Llama,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: false,
            tokens: SpecialTokens {
                bos: 1,
                eos: 2,
                pad: None,
            },
        }
    }

    /// The same shape with `layers` layers (`llama-3.2-1b` with 32 layers
    /// is a 1B-wide model as deep as an 8B one); the name says so.
    pub fn with_layers(mut self, layers: usize) -> Self {
        if layers != self.sizes.num_layers {
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
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = self.rope_scaling
        {
            map.insert(
                "rope_scaling".into(),
                json!({
                    "factor": factor,
                    "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings as u64,
                    "rope_type": "llama3"
                }),
            );
        }
        if self.family == Family::Qwen2 {
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

    /// The decoder config of this shape, read through the same parser as a
    /// `config.json` on disk; an invalid shape is refused by field.
    pub fn config(&self) -> Result<ModelConfig> {
        self.sizes
            .validate()
            .map_err(lcut_model::ModelError::from)?;
        let text = self.config_json("float32").to_string();
        Ok(ModelConfig::from_json_str(
            &text,
            Path::new("(model shape)/config.json"),
        )?)
    }

    /// Every weight in the order Hugging Face writes them: the embedding,
    /// each layer's (attention with its biases, MLP, norms), the final norm
    /// and the LM head (none when tied).
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let s = &self.sizes;
        let (v, d, i) = (s.vocab_size, s.hidden_size, s.intermediate_size);
        let (q, kv) = (s.num_heads * s.head_dim(), s.num_kv_heads * s.head_dim());
        let spec = |name: String, dims: Vec<usize>, kind| TensorSpec { name, dims, kind };
        let mut out = vec![spec(
            "model.embed_tokens.weight".into(),
            vec![v, d],
            TensorKind::Matrix,
        )];
        for l in 0..s.num_layers {
            let p = format!("model.layers.{l}");
            for (proj, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                let name = format!("{p}.self_attn.{proj}");
                out.push(spec(
                    format!("{name}.weight"),
                    vec![rows, d],
                    TensorKind::Matrix,
                ));
                if self.family.qkv_bias() {
                    out.push(spec(format!("{name}.bias"), vec![rows], TensorKind::Bias));
                }
            }
            out.extend([
                spec(
                    format!("{p}.self_attn.o_proj.weight"),
                    vec![d, q],
                    TensorKind::Matrix,
                ),
                spec(
                    format!("{p}.mlp.gate_proj.weight"),
                    vec![i, d],
                    TensorKind::Matrix,
                ),
                spec(
                    format!("{p}.mlp.up_proj.weight"),
                    vec![i, d],
                    TensorKind::Matrix,
                ),
                spec(
                    format!("{p}.mlp.down_proj.weight"),
                    vec![d, i],
                    TensorKind::Matrix,
                ),
                spec(
                    format!("{p}.input_layernorm.weight"),
                    vec![d],
                    TensorKind::Norm,
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
                vec![v, d],
                TensorKind::Matrix,
            ));
        }
        out
    }

    /// Number of weights.
    pub fn parameter_count(&self) -> u64 {
        self.tensors().iter().map(|t| t.len() as u64).sum()
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
            let shape = named(name).unwrap();
            assert_eq!(shape.parameter_count(), params, "{name}");
            let cfg = shape.config().unwrap();
            assert_eq!(lcut_model::memory::parameter_count(&cfg), params, "{name}");
        }
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
