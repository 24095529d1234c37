//! Random-weight models in the Hugging Face layout, for benchmarks and tests
//! that need a model of a given shape rather than a trained one.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;

use lcut_model::{Decoder, ModelConfig, ModelError, Result, WeightSource};

/// The shape of a random Llama-architecture model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomLlama {
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
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Longest sequence allowed.
    pub max_position_embeddings: usize,
    /// Seed of the weights.
    pub seed: u64,
}

impl RandomLlama {
    /// 8 layers, hidden 512, 8 heads, 2 KV heads, vocab 32000 (about 57M parameters).
    pub fn small() -> Self {
        Self {
            vocab_size: 32000,
            hidden_size: 512,
            intermediate_size: 1408,
            num_layers: 8,
            num_heads: 8,
            num_kv_heads: 2,
            max_position_embeddings: 8192,
            seed: 0,
        }
    }

    /// The `config.json` value of this model.
    pub fn config_json(&self) -> serde_json::Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "float32"
        })
    }

    /// The parsed config of this model.
    pub fn config(&self) -> Result<ModelConfig> {
        let text = serde_json::to_string(&self.config_json()).unwrap_or_default();
        ModelConfig::from_json_str(&text, Path::new("(random llama)/config.json"))
    }

    /// The decoder of this shape with weights drawn on `device` in `dtype`,
    /// nothing written to disk: how a benchmark gets a model of the
    /// Llama-3.1-8B shape without a 32 GB file. On the CPU the draw is
    /// seeded by `seed`; CUDA draws are seeded through the device.
    pub fn build(&self, dtype: DType, device: &Device) -> Result<Decoder> {
        let cfg = self.config()?;
        if device.is_cuda() {
            device.set_seed(self.seed)?;
        }
        let source = RandomWeights {
            folder: std::path::PathBuf::from("(random llama)"),
            rng: std::cell::RefCell::new(StdRng::seed_from_u64(self.seed)),
        };
        Decoder::from_weights(cfg, &source, dtype, device)
    }

    /// Write `config.json` and `model.safetensors` (f32) into `folder`.
    pub fn write(&self, folder: &Path) -> Result<()> {
        std::fs::create_dir_all(folder).map_err(|source| ModelError::Io {
            path: folder.to_path_buf(),
            source,
        })?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let dev = Device::Cpu;
        let (d, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let hd = d / self.num_heads;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        let mut rand_t = |shape: &[usize], std: f32| -> Result<Tensor> {
            let n: usize = shape.iter().product();
            let a = std * 3f32.sqrt();
            let data: Vec<f32> = (0..n).map(|_| rng.random_range(-a..a)).collect();
            Ok(Tensor::from_vec(data, shape, &dev)?)
        };
        tensors.insert("model.embed_tokens.weight".into(), rand_t(&[v, d], 0.02)?);
        tensors.insert("lm_head.weight".into(), rand_t(&[v, d], 0.02)?);
        tensors.insert(
            "model.norm.weight".into(),
            Tensor::ones(d, candle_core::DType::F32, &dev)?,
        );
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            let shapes = [
                ("self_attn.q_proj", vec![self.num_heads * hd, d]),
                ("self_attn.k_proj", vec![self.num_kv_heads * hd, d]),
                ("self_attn.v_proj", vec![self.num_kv_heads * hd, d]),
                ("self_attn.o_proj", vec![d, self.num_heads * hd]),
                ("mlp.gate_proj", vec![i, d]),
                ("mlp.up_proj", vec![i, d]),
                ("mlp.down_proj", vec![d, i]),
            ];
            for (name, shape) in shapes {
                tensors.insert(format!("{p}.{name}.weight"), rand_t(&shape, 0.02)?);
            }
            for norm in ["input_layernorm", "post_attention_layernorm"] {
                tensors.insert(
                    format!("{p}.{norm}.weight"),
                    Tensor::ones(d, candle_core::DType::F32, &dev)?,
                );
            }
        }
        let config = serde_json::to_string_pretty(&self.config_json()).unwrap_or_default();
        write_atomic(&folder.join("config.json"), config.as_bytes())?;
        let tmp = folder.join("model.safetensors.partial");
        candle_core::safetensors::save(&tensors, &tmp)?;
        rename(&tmp, &folder.join("model.safetensors"))
    }
}

/// Weights generated on request: norms are ones, every other matrix is
/// drawn with standard deviation 0.02; no biases.
struct RandomWeights {
    folder: std::path::PathBuf,
    rng: std::cell::RefCell<StdRng>,
}

impl WeightSource for RandomWeights {
    fn folder(&self) -> &Path {
        &self.folder
    }

    fn contains(&self, name: &str) -> bool {
        name.ends_with(".weight")
    }

    fn load(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if name.ends_with("norm.weight") {
            return Ok(Tensor::ones(expected, dtype, device)?);
        }
        let t = if device.is_cuda() {
            Tensor::randn(0f32, 0.02, expected, device)?
        } else {
            let n: usize = expected.iter().product();
            let a = 0.02 * 3f32.sqrt();
            let mut rng = self.rng.borrow_mut();
            let data: Vec<f32> = (0..n).map(|_| rng.random_range(-a..a)).collect();
            Tensor::from_vec(data, expected, device)?
        };
        Ok(t.to_dtype(dtype)?)
    }
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| ModelError::Io {
        path: to.to_path_buf(),
        source,
    })
}

/// Write `bytes` to `path` through a temporary file and a rename, so a
/// reader never sees a half-written file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    lcut_model::lora::write_atomic(path, bytes).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}
