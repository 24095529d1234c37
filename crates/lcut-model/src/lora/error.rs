//! Errors of reading, checking and writing LoRA adapters. Every variant
//! names the file (and the field or tensor) at fault and what was expected.

use std::path::PathBuf;

/// Errors raised for a LoRA adapter folder.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    /// A file of the adapter could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done (read, write).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `adapter_config.json` is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A field of `adapter_config.json` is absent or of the wrong kind.
    #[error("{path}: field `{field}`: expected {expected}, found {found}")]
    ConfigField {
        /// The config file.
        path: PathBuf,
        /// The field.
        field: String,
        /// What a valid value looks like.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// A target module lcut's decoder does not have.
    #[error(
        "{path}: target module `{module}` is not a linear layer of this model (it has: {known})"
    )]
    UnknownTarget {
        /// The config file.
        path: PathBuf,
        /// The module named.
        module: String,
        /// The modules the model has.
        known: String,
    },
    /// `adapter_model.safetensors` cannot be read.
    #[error("{path} is not a readable safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A tensor name that is not a LoRA matrix of a targeted module.
    #[error("{path}: tensor `{name}` is not expected: {why}")]
    UnexpectedTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Why it does not belong.
        why: String,
    },
    /// A LoRA matrix the config implies is absent.
    #[error("{path}: tensor `{name}` is missing ({why})")]
    MissingTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor looked for.
        name: String,
        /// Why it is expected.
        why: String,
    },
    /// A LoRA matrix whose rank is not the config's `r`.
    #[error(
        "{path}: tensor `{name}` has rank {found} (shape {shape:?}), but adapter_config.json says r = {expected}"
    )]
    RankMismatch {
        /// The weights file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The config's rank.
        expected: usize,
        /// The tensor's rank.
        found: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A LoRA matrix whose shape does not fit the model's layer.
    #[error(
        "{path}: tensor `{name}` has shape {found:?}, but the model's {module} needs {expected:?}: the adapter was made for a model of another shape"
    )]
    ShapeMismatch {
        /// The weights file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The module in the model.
        module: String,
        /// The shape the model needs.
        expected: Vec<usize>,
        /// The tensor's shape.
        found: Vec<usize>,
    },
    /// A LoRA tensor for a layer the model does not have.
    #[error("{path}: tensor `{name}` is for layer {layer}, but the model has {layers} layers")]
    LayerOutOfRange {
        /// The weights file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The layer named.
        layer: usize,
        /// The model's depth.
        layers: usize,
    },
    /// The adapter records a base model whose weights differ from the loaded one.
    #[error(
        "{path}: the adapter was trained on base {recorded} (fingerprint {expected}), but the loaded model's fingerprint is {found}: it is another base model"
    )]
    OtherBase {
        /// The config file.
        path: PathBuf,
        /// The base named in the config.
        recorded: String,
        /// The fingerprint in the config.
        expected: String,
        /// The loaded model's fingerprint.
        found: String,
    },
    /// An error from the tensor backend.
    #[error("tensor backend: {0}")]
    Candle(#[from] candle_core::Error),
}
