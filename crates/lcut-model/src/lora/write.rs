//! Writing an adapter folder in PEFT's layout: `adapter_config.json` and
//! `adapter_model.safetensors` (f32, PEFT's names), each file atomically.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Tensor};

use super::adapter::{LoraPair, Site, WEIGHTS_FILE, tensor_name};
use super::config::{CONFIG_FILE, LoraConfig};
use super::error::LoraError;

/// Write `config` and `pairs` to `folder` (created if absent).
pub fn write_adapter(
    folder: &Path,
    config: &LoraConfig,
    pairs: &BTreeMap<Site, LoraPair>,
) -> Result<(), LoraError> {
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| LoraError::Io {
            action,
            path,
            source,
        }
    };
    std::fs::create_dir_all(folder).map_err(io("create", folder))?;
    let mut tensors: Vec<(String, Tensor)> = Vec::with_capacity(2 * pairs.len());
    for ((layer, module), pair) in pairs {
        tensors.push((
            tensor_name(*layer, module, "A"),
            pair.a.to_dtype(DType::F32)?,
        ));
        tensors.push((
            tensor_name(*layer, module, "B"),
            pair.b.to_dtype(DType::F32)?,
        ));
    }
    let weights = folder.join(WEIGHTS_FILE);
    let info = [("format".to_string(), "pt".to_string())]
        .into_iter()
        .collect();
    let bytes = safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(info))
        .map_err(|e| LoraError::Safetensors {
            path: weights.clone(),
            reason: e.to_string(),
        })?;
    write_atomic(&weights, &bytes).map_err(io("write", &weights))?;
    let config_path = folder.join(CONFIG_FILE);
    let mut text =
        serde_json::to_string_pretty(&config.to_json()).map_err(|source| LoraError::Json {
            path: config_path.clone(),
            source,
        })?;
    text.push('\n');
    write_atomic(&config_path, text.as_bytes()).map_err(io("write", &config_path))
}

/// Write `bytes` to `path` atomically (the project's one implementation).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    lcut_trace::write_file_atomic(path, bytes)
}
