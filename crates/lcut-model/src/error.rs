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
    /// A GGUF file of a mixture-of-experts model whose routing lcut does
    /// not run (shared experts, a gating function other than softmax).
    #[error(
        "{path}: a mixture-of-experts GGUF with {what}, which lcut does not run; it runs llama.cpp's qwen3moe and Mixtral files (softmax routing over the experts, top-k weights renormalised, no shared expert)"
    )]
    GgufExperts {
        /// The file.
        path: PathBuf,
        /// The key and value lcut does not run.
        what: String,
    },
    /// A safetensors file cannot be opened or is damaged (e.g. truncated).
    #[error("{path} is not a readable safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A file given as a GGUF model does not start with the GGUF magic.
    #[error("{path} is not a GGUF file: it starts with {found:?}, not \"GGUF\"")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A GGUF version lcut does not read.
    #[error("{path}: GGUF version {version} is not supported (lcut reads versions 2 and 3)")]
    GgufVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// A GGUF file ends before something its header promises.
    #[error(
        "{path} is truncated: {what} needs {needed} bytes from offset {offset}, but the file has {file_len} bytes"
    )]
    GgufTruncated {
        /// The file.
        path: PathBuf,
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: usize,
        /// How many bytes it needs.
        needed: usize,
        /// The file's length.
        file_len: usize,
    },
    /// A GGUF header that cannot be right (impossible counts, bad types).
    #[error("{path} is not a valid GGUF file (at byte {offset}): {reason}")]
    GgufMalformed {
        /// The file.
        path: PathBuf,
        /// Byte offset where the problem was found.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF metadata key is absent or of the wrong kind.
    #[error("{path}: metadata `{key}`: expected {expected}, found {found}")]
    GgufMetadata {
        /// The file.
        path: PathBuf,
        /// The metadata key.
        key: String,
        /// What a valid value looks like.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// A tensor stored in a type candle cannot run.
    #[error(
        "{path}: tensor `{tensor}` is stored as {type_name}, which lcut cannot load (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4)"
    )]
    UnsupportedQuantization {
        /// The file.
        path: PathBuf,
        /// Tensor name in the file.
        tensor: String,
        /// ggml's name of the type.
        type_name: String,
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
    #[error("tensor `{name}` in {folder} has shape {found:?}, expected {expected:?} from {config}")]
    TensorShape {
        /// The model folder.
        folder: PathBuf,
        /// What the expected shape comes from (`config.json`, the GGUF metadata).
        config: &'static str,
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
        "tensor `lm_head.weight` is missing from the weights in {folder}, and config.json has tie_word_embeddings = false: a bare decoder without its LM head gives neither logits nor a logit lens"
    )]
    MissingLmHead {
        /// The model folder.
        folder: PathBuf,
    },
    /// The final norm is not in the weights: a bare decoder, whose hidden
    /// states have no logits and no logit lens.
    #[error(
        "tensor `model.norm.weight` (the final norm) is missing from the weights in {folder}: a bare decoder without its final norm and LM head gives neither logits nor a logit lens"
    )]
    MissingFinalNorm {
        /// The model folder.
        folder: PathBuf,
    },
    /// Hidden states given to the logit lens do not fit the model.
    #[error("logit lens: {detail}")]
    LensInput {
        /// What does not fit.
        detail: String,
    },
    /// Empty input.
    #[error("no tokens given: a forward pass needs at least one token")]
    EmptyInput,
    /// Rows, masks or trainable pairs handed to the training pass that do
    /// not fit the model.
    #[error("training pass: {detail}")]
    TrainInput {
        /// What does not fit.
        detail: String,
    },
    /// Sequences decoded together were given another number of tokens.
    #[error("{sequences} sequences to decode together but {tokens} tokens for them")]
    BatchMismatch {
        /// Sequences given.
        sequences: usize,
        /// Tokens given.
        tokens: usize,
    },
    /// A layer's cache was empty right after this chunk's keys were added
    /// to it (a bug if it ever shows).
    #[error("the K/V cache of layer {layer} is empty after appending this chunk's keys")]
    EmptyCache {
        /// The layer.
        layer: usize,
    },
    /// A teacher-forced run produced no logits (a bug if it ever shows).
    #[error("the forward pass produced no logits: no token reached the top layer")]
    MissingLogits,
    /// A step of the layer program read a value no earlier step wrote (a
    /// bug of an executor if it ever shows).
    #[error("the layer program read {what} before a step wrote it")]
    LayerProgram {
        /// What was read.
        what: &'static str,
    },
    /// Only a full-depth prefix can be restricted to another policy.
    #[error(
        "only a full-depth prefill can be reused under another policy; this one ran under {policy}"
    )]
    NotFullDepthPrefix {
        /// The policy the prefix ran under.
        policy: String,
    },
    /// A prefill cannot be shared with a policy whose states differ from a
    /// full-depth run's (SlimInfer scores blocks on its own states).
    #[error(
        "policy {policy} cannot reuse another run's prefill: its states are not a full-depth run's restricted (prefill it afresh)"
    )]
    NotRestrictable {
        /// The policy asked for.
        policy: String,
    },
    /// A pass cannot start above a policy's lower layers from a full run's
    /// states ([`Decoder::forward_above`](crate::Decoder::forward_above)).
    #[error(
        "policy {policy} cannot start its pass at layer {layer} from the full run's states: {reason}"
    )]
    NotAbove {
        /// The policy of the sequence.
        policy: String,
        /// The layer the pass was to start at.
        layer: usize,
        /// Why not.
        reason: String,
    },
    /// A full run's prompt cannot serve a policy whose tokens leave the
    /// model at a layer: it lacks the hidden states they leave with.
    #[error(
        "policy {policy} cannot take its projected K/V from this prompt run: the states entering layer {layer} are missing ({reason})"
    )]
    UnrecordedPrompt {
        /// The policy asked for.
        policy: String,
        /// The layer its tokens leave at.
        layer: usize,
        /// What is missing.
        reason: String,
    },
    /// A LoRA adapter that cannot be read or does not fit the model.
    #[error(transparent)]
    Lora(Box<crate::lora::LoraError>),
    /// A policy error (cutoff out of range, unknown anchors, ...).
    #[error(transparent)]
    Policy(#[from] lcut_policy::PolicyError),
    /// Token phases that do not fit the prompt.
    #[error(transparent)]
    Phase(#[from] lcut_policy::PhaseError),
    /// A Llama shape with a field out of range.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// An error from the tensor backend.
    #[error("tensor backend: {0}")]
    Candle(#[from] candle_core::Error),
    /// A K/V cache storage type other than f32, f16 or bf16.
    #[error("the K/V cache is stored as f32, f16 or bf16, not {dtype:?}")]
    KvDtype {
        /// The type asked for.
        dtype: candle_core::DType,
    },
    /// Slices that do not fit a CPU kernel (a malformed tensor of a GGUF
    /// file, a cache of the wrong shape).
    #[error("kernel: {0}")]
    Kernel(#[from] lcut_kernels::KernelError),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

/// A shape field that is out of range or inconsistent with another.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid Llama shape: field `{field}`: expected {expected}, found {found}")]
pub struct ShapeError {
    /// The field at fault.
    pub field: &'static str,
    /// What it should be.
    pub expected: String,
    /// What it is.
    pub found: String,
}

impl From<crate::lora::LoraError> for ModelError {
    fn from(e: crate::lora::LoraError) -> Self {
        Self::Lora(Box::new(e))
    }
}
