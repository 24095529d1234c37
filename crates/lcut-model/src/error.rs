//! Errors of model loading and execution. Every variant names the file, the
//! field or the tensor at fault and what was expected.

use std::path::PathBuf;

/// Errors raised while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A required file is absent from the model folder.
    #[error("{path} is missing: {what}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
        /// What it is for.
        what: String,
    },
    /// A JSON file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A config field is absent or of the wrong kind.
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
    /// The config names an architecture lcut does not implement.
    #[error("{path}: model_type {model_type:?} is not supported (supported: {supported})")]
    UnknownArchitecture {
        /// The config file.
        path: PathBuf,
        /// The model_type found.
        model_type: String,
        /// The list of supported model types.
        supported: String,
    },
    /// A safetensors file cannot be opened or is damaged (e.g. truncated).
    #[error("{path} is not a readable safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A tensor the architecture needs is not in the weights.
    #[error("tensor `{name}` is missing from the weights in {folder}")]
    MissingTensor {
        /// The model folder.
        folder: PathBuf,
        /// Tensor name.
        name: String,
    },
    /// A tensor has a shape that does not match the config.
    #[error(
        "tensor `{name}` in {folder} has shape {found:?}, expected {expected:?} from config.json"
    )]
    TensorShape {
        /// The model folder.
        folder: PathBuf,
        /// Tensor name.
        name: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {id} at position {position} is outside the vocabulary of {vocab_size}")]
    TokenOutOfVocab {
        /// The id.
        id: u32,
        /// Its position.
        position: usize,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// The sequence would pass the model's maximum length.
    #[error(
        "sequence of {len} tokens is longer than the model allows (max_position_embeddings = {max})"
    )]
    SequenceTooLong {
        /// Tokens asked for.
        len: usize,
        /// The model's limit.
        max: usize,
    },
    /// A policy resolved for another depth than the model's.
    #[error(
        "the policy {policy} was resolved for {policy_layers} layers, but the model has {model_layers}"
    )]
    PolicyDepth {
        /// The policy, written out.
        policy: String,
        /// Depth the policy was resolved for.
        policy_layers: usize,
        /// Depth of the model.
        model_layers: usize,
    },
    /// The LM head is neither in the weights nor tied to the embeddings.
    #[error(
        "tensor `lm_head.weight` is missing from the weights in {folder}, and config.json has tie_word_embeddings = false"
    )]
    MissingLmHead {
        /// The model folder.
        folder: PathBuf,
    },
    /// Empty input.
    #[error("no tokens given: a forward pass needs at least one token")]
    EmptyInput,
    /// A policy error (cutoff out of range, unknown anchors, ...).
    #[error(transparent)]
    Policy(#[from] lcut_policy::PolicyError),
    /// Token phases that do not fit the prompt.
    #[error(transparent)]
    Phase(#[from] lcut_policy::PhaseError),
    /// An error from the tensor backend.
    #[error("tensor backend: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
