//! The shape of a Llama-architecture model, described once: the random
//! models of the tests and benchmarks and the bundled task models are both
//! this shape plus what is theirs (a seed, a vocabulary), and both write the
//! same `config.json` for it.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{MAX_LAYERS, MAX_SIZE, ModelConfig};
use crate::error::{Result, ShapeError};

/// The sizes and constants that fix a Llama-architecture model (untied LM
/// head, no biases, SiLU MLP, plain RoPE). Serialised with these field
/// names; the Hugging Face names are written by [`LlamaShape::config_json`].
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
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return bad(
                "num_heads",
                format!("a divisor of hidden_size ({})", self.hidden_size),
                self.num_heads.to_string(),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
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
        Ok(())
    }

    /// The shape a parsed config describes (its Llama sizes; what a Llama
    /// shape has no field for is dropped).
    pub fn from_config(cfg: &ModelConfig) -> Self {
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
        if let (Some(pad), Value::Object(map)) = (tokens.pad, &mut config) {
            map.insert("pad_token_id".into(), pad.into());
        }
        config
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
    /// (embedding, final norm, LM head, then each layer's).
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (v, d, i) = (self.vocab_size, self.hidden_size, self.intermediate_size);
        let (h, kv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim());
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![v, d]),
            ("model.norm.weight".to_string(), vec![d]),
            ("lm_head.weight".to_string(), vec![v, d]),
        ];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            out.extend([
                (format!("{p}.self_attn.q_proj.weight"), vec![h * hd, d]),
                (format!("{p}.self_attn.k_proj.weight"), vec![kv * hd, d]),
                (format!("{p}.self_attn.v_proj.weight"), vec![kv * hd, d]),
                (format!("{p}.self_attn.o_proj.weight"), vec![d, h * hd]),
                (format!("{p}.mlp.gate_proj.weight"), vec![i, d]),
                (format!("{p}.mlp.up_proj.weight"), vec![i, d]),
                (format!("{p}.mlp.down_proj.weight"), vec![d, i]),
                (format!("{p}.input_layernorm.weight"), vec![d]),
                (format!("{p}.post_attention_layernorm.weight"), vec![d]),
            ]);
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
