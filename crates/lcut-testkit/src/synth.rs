//! Random-weight models in the Hugging Face layout, for benchmarks and tests
//! that need a model of a given shape rather than a trained one.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

use lcut_model::{
    Decoder, LlamaShape, ModelConfig, ModelError, Result, SpecialTokens, WeightSource,
};

/// A random-weight Llama-architecture model: a shape and the seed of its
/// weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomLlama {
    /// Sizes of the model.
    pub shape: LlamaShape,
    /// Seed of the weights.
    pub seed: u64,
}

/// The special tokens a random model's `config.json` names.
const TOKENS: SpecialTokens = SpecialTokens {
    bos: 1,
    eos: 2,
    pad: None,
};

impl RandomLlama {
    /// 8 layers, hidden 512, 8 heads, 2 KV heads, vocab 32000 (about 57M parameters).
    pub fn small() -> Self {
        Self {
            shape: LlamaShape {
                vocab_size: 32000,
                hidden_size: 512,
                intermediate_size: 1408,
                num_layers: 8,
                num_heads: 8,
                num_kv_heads: 2,
                rope_theta: 10000.0,
                rms_norm_eps: 1e-5,
                max_position_embeddings: 8192,
            },
            seed: 0,
        }
    }

    /// The `config.json` value of this model.
    pub fn config_json(&self) -> serde_json::Value {
        self.shape.config_json(TOKENS)
    }

    /// The parsed config of this model (an invalid shape is refused,
    /// naming the field).
    pub fn config(&self) -> Result<ModelConfig> {
        self.shape.model_config(TOKENS)
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
        self.shape.validate()?;
        std::fs::create_dir_all(folder).map_err(|source| ModelError::Io {
            path: folder.to_path_buf(),
            source,
        })?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let dev = Device::Cpu;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        // norms are ones; the matrices are drawn in the order listed
        for (name, shape) in self.shape.weight_shapes() {
            let t = if shape.len() == 1 {
                Tensor::ones(shape.as_slice(), DType::F32, &dev)?
            } else {
                let n: usize = shape.iter().product();
                let a = 0.02 * 3f32.sqrt();
                let data: Vec<f32> = (0..n).map(|_| rng.random_range(-a..a)).collect();
                Tensor::from_vec(data, shape.as_slice(), &dev)?
            };
            tensors.insert(name, t);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape the decoder cannot have is refused by name, before any
    /// division by the head count, by every way of making the model.
    #[test]
    fn a_bad_shape_is_refused_by_name() {
        let mut model = RandomLlama::small();
        model.shape.num_heads = 0;
        let dir = tempfile::tempdir().unwrap();
        for err in [
            model.config().unwrap_err(),
            model.build(DType::F32, &Device::Cpu).unwrap_err(),
            model.write(dir.path()).unwrap_err(),
        ] {
            assert!(err.to_string().contains("num_heads"), "{err}");
        }
        assert!(!dir.path().join("config.json").exists());
    }

    /// The written config is the shape's config and reads back as it.
    #[test]
    fn the_written_model_reads_back_as_its_shape() {
        let mut model = RandomLlama::small();
        model.shape.vocab_size = 64;
        model.shape.num_layers = 1;
        let dir = tempfile::tempdir().unwrap();
        model.write(dir.path()).unwrap();
        let cfg = ModelConfig::from_folder(dir.path()).unwrap();
        assert_eq!(LlamaShape::from_config(&cfg), model.shape);
        assert_eq!(cfg.bos_token_id, Some(1));
        assert_eq!(cfg.eos_token_ids, vec![2]);
    }
}
