//! A random-weight Llama-architecture model: a shape and the seed of its
//! weights, built straight onto a device or written to a folder.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use lcut_model::{Decoder, LlamaShape, ModelConfig, Result, SpecialTokens};
use rand::{SeedableRng, rngs::StdRng};

use crate::draw::RandomWeights;
use crate::{shapes, write};

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
    /// The [`shapes::small`] shape with seed 0.
    pub fn small() -> Self {
        Self {
            shape: shapes::small(),
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
        let source = RandomWeights::new(
            PathBuf::from("(random llama)"),
            StdRng::seed_from_u64(self.seed),
        );
        Decoder::from_weights(cfg, &source, dtype, device)
    }

    /// Write `config.json` and `model.safetensors` (f32) into `folder`.
    pub fn write(&self, folder: &Path) -> Result<()> {
        write::hf_folder::write(&self.shape, TOKENS, self.seed, folder)
    }
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
