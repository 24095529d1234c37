//! A Hugging Face model folder: `config.json` and `model.safetensors` (f32).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use lcut_model::{LlamaShape, ModelError, Result, SpecialTokens};
use rand::{SeedableRng, rngs::StdRng};

use super::{rename, write_atomic};
use crate::draw::uniform;

/// Write `config.json` (with `tokens`) and `model.safetensors` (f32, drawn
/// from `seed`) of `shape` into `folder`; an invalid shape is refused before
/// anything is written.
pub fn write(shape: &LlamaShape, tokens: SpecialTokens, seed: u64, folder: &Path) -> Result<()> {
    shape.validate()?;
    std::fs::create_dir_all(folder).map_err(|source| ModelError::Io {
        path: folder.to_path_buf(),
        source,
    })?;
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = Device::Cpu;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    // norms are ones; the matrices are drawn in the order listed
    for (name, dims) in shape.weight_shapes() {
        let t = if dims.len() == 1 {
            Tensor::ones(dims.as_slice(), DType::F32, &dev)?
        } else {
            let data = uniform(&mut rng, dims.iter().product());
            Tensor::from_vec(data, dims.as_slice(), &dev)?
        };
        tensors.insert(name, t);
    }
    let config = serde_json::to_string_pretty(&shape.config_json(tokens)).unwrap_or_default();
    write_atomic(&folder.join("config.json"), config.as_bytes())?;
    let tmp = folder.join("model.safetensors.partial");
    candle_core::safetensors::save(&tensors, &tmp)?;
    rename(&tmp, &folder.join("model.safetensors"))
}
