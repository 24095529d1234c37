//! A random-weight model: a shape and the seed of its weights, built
//! straight onto a device or written to files.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use lcut_model::{Decoder, LlamaShape, ModelConfig};

use crate::draw::RandomWeights;
use crate::error::Result;
use crate::shapes::{self, ModelShape};
use crate::write::safetensors::{StoredDtype, write_weights};
use crate::write::{self, Format, Progress, WriteOptions, Written, hf_folder};

/// A random-weight model of any shape lcut knows (Llama, Qwen2, SmolLM3,
/// OLMo 2/3, Qwen3-MoE or Mixtral, tied or not): a shape and the seed of
/// its weights. The same seed gives the same
/// weights built on the CPU and written in every format.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomModel {
    /// The shape.
    pub shape: ModelShape,
    /// Seed of the weights.
    pub seed: u64,
}

impl RandomModel {
    /// The named shape with seed `seed` (see [`shapes::named`]).
    pub fn named(name: &str, seed: u64) -> Result<Self> {
        Ok(Self {
            shape: shapes::named(name)?,
            seed,
        })
    }

    /// The parsed config of this model (an invalid shape is refused,
    /// naming the field).
    pub fn config(&self) -> Result<ModelConfig> {
        self.shape.config()
    }

    /// The decoder of this shape with weights drawn on `device` in `dtype`,
    /// nothing written to disk: how a benchmark gets a model of the
    /// Llama-3.1-8B shape without a 16 GB file. On the CPU the weights are
    /// those the writers store for the seed; CUDA draws are seeded through
    /// the device.
    pub fn build(&self, dtype: DType, device: &Device) -> Result<Decoder> {
        let cfg = self.config()?;
        if device.is_cuda() {
            device
                .set_seed(self.seed)
                .map_err(lcut_model::ModelError::from)?;
        }
        let source = RandomWeights::of_shape(
            PathBuf::from(format!("(random {})", self.shape.name)),
            &self.shape,
            self.seed,
        );
        Ok(Decoder::from_weights(cfg, &source, dtype, device)?)
    }

    /// Write the model in `format` to `out`, a path that must not exist
    /// (see [`write::write_model`]).
    pub fn write(&self, format: Format, out: &Path, progress: Progress<'_>) -> Result<Written> {
        let opts = WriteOptions {
            seed: self.seed,
            ..WriteOptions::default()
        };
        write::write_model(&self.shape, format, out, &opts, progress)
    }
}

/// A random-weight Llama-architecture model: plain sizes and the seed of
/// its weights (untied head, no biases, BoS 1, EoS 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomLlama {
    /// Sizes of the model.
    pub shape: LlamaShape,
    /// Seed of the weights.
    pub seed: u64,
}

impl RandomLlama {
    /// The [`shapes::small`] shape with seed 0.
    pub fn small() -> Self {
        Self {
            shape: shapes::small(),
            seed: 0,
        }
    }

    /// The general model of this shape.
    pub fn model(&self) -> RandomModel {
        RandomModel {
            shape: ModelShape::from(self.shape),
            seed: self.seed,
        }
    }

    /// The `config.json` value of this model.
    pub fn config_json(&self) -> serde_json::Value {
        self.model().shape.config_json("float32")
    }

    /// The parsed config of this model (an invalid shape is refused,
    /// naming the field).
    pub fn config(&self) -> Result<ModelConfig> {
        self.model().config()
    }

    /// See [`RandomModel::build`].
    pub fn build(&self, dtype: DType, device: &Device) -> Result<Decoder> {
        self.model().build(dtype, device)
    }

    /// Write `config.json` and `model.safetensors` (f32) into `folder`
    /// (created when missing), each file atomically; no tokenizer.
    pub fn write(&self, folder: &Path) -> Result<()> {
        let model = self.model();
        model.config()?;
        std::fs::create_dir_all(folder).map_err(|e| crate::SynthError::io(folder, e))?;
        hf_folder::write_config(&model.shape, StoredDtype::F32, folder)?;
        write_weights(
            folder,
            &model.shape.tensors(),
            (StoredDtype::F32, self.seed, u64::MAX),
            &mut |_, _| {},
        )?;
        Ok(())
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
