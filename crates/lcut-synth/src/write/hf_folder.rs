//! A Hugging Face model folder: `config.json`, the synthetic tokenizer
//! (`tokenizer.json`, `tokenizer_config.json`) and the weights in
//! safetensors, sharded above the shard size.

use std::path::{Path, PathBuf};

use super::safetensors::{StoredDtype, write_weights};
use super::{Format, Progress, WriteOptions, write_atomic};
use crate::error::Result;
use crate::shapes::ModelShape;
use crate::vocab::Vocabulary;

/// Write the folder of `shape` in `format` (a safetensors format) into the
/// existing folder `folder`; returns the files written.
pub fn write(
    shape: &ModelShape,
    format: Format,
    folder: &Path,
    opts: &WriteOptions,
    progress: Progress<'_>,
) -> Result<Vec<PathBuf>> {
    let dtype = match format {
        Format::SafetensorsBf16 => StoredDtype::Bf16,
        _ => StoredDtype::F32,
    };
    let vocab = Vocabulary::for_shape(shape)?;
    let mut files = write_config(shape, dtype, folder)?;
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    for (name, value) in [
        ("tokenizer.json", vocab.tokenizer_json()),
        ("tokenizer_config.json", vocab.tokenizer_config_json(shape)),
    ] {
        write_atomic(&folder.join(name), pretty(&value).as_bytes())?;
        files.push(name.into());
    }
    let tensors = shape.tensors();
    files.extend(write_weights(
        folder,
        &tensors,
        (dtype, opts.seed, opts.max_shard_bytes),
        progress,
    )?);
    Ok(files)
}

/// Write `config.json` of `shape` with weights stored in `dtype`.
pub fn write_config(shape: &ModelShape, dtype: StoredDtype, folder: &Path) -> Result<Vec<PathBuf>> {
    let torch_dtype = match dtype {
        StoredDtype::F32 => "float32",
        StoredDtype::Bf16 => "bfloat16",
    };
    let text = serde_json::to_string_pretty(&shape.config_json(torch_dtype)).unwrap_or_default();
    write_atomic(&folder.join("config.json"), text.as_bytes())?;
    Ok(vec!["config.json".into()])
}
