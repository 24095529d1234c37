//! What can go wrong making a random model: a name or format lcut does not
//! know, an output that is in the way or cannot be written, a shape that
//! is inconsistent or that a format cannot hold, and the model errors
//! underneath.

use std::path::PathBuf;

use thiserror::Error;

/// An error of a random model's making or writing.
#[derive(Debug, Error)]
pub enum SynthError {
    /// `--shape` names no known shape.
    #[error("unknown shape `{name}`: the shapes are {known}")]
    UnknownShape {
        /// The name given.
        name: String,
        /// The names known, comma-separated.
        known: String,
    },
    /// `--format` names no known format.
    #[error("unknown format `{name}`: the formats are {known}")]
    UnknownFormat {
        /// The name given.
        name: String,
        /// The formats known, comma-separated.
        known: String,
    },
    /// The output path already exists; nothing is overwritten.
    #[error("{}: already exists; remove it or choose another --out (nothing was written)", path.display())]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },
    /// The output (or its temporary file) cannot be created or written.
    #[error("{}: cannot write: {source}", path.display())]
    Unwritable {
        /// The path that failed.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A tensor's rows are not a whole number of the format's blocks.
    #[error(
        "{format} cannot hold `{tensor}`: its rows of {cols} values are not a multiple of \
         the {block}-value blocks of {type_name}"
    )]
    BlockSize {
        /// The format asked for.
        format: String,
        /// The tensor.
        tensor: String,
        /// Its row length.
        cols: usize,
        /// The ggml type's block size.
        block: usize,
        /// The ggml type.
        type_name: String,
    },
    /// The shape has a setting the format has no way to record (the file
    /// would be read back as another model).
    #[error("{format} cannot record {what}")]
    Unrecordable {
        /// The format asked for.
        format: String,
        /// The setting, and what the format would make of it.
        what: String,
    },
    /// A shape's own field (beyond its Llama sizes) is out of range or
    /// does not fit the rest of the shape.
    #[error("invalid shape `{shape}`: field `{field}`: expected {expected}, found {found}")]
    InvalidShape {
        /// The shape's name.
        shape: String,
        /// The field at fault (`head_dim`, `experts.top_k`, ...).
        field: &'static str,
        /// What it should be.
        expected: String,
        /// What it is.
        found: String,
    },
    /// A shape lists one projection of a layer's experts out of order
    /// (a GGUF file stacks them expert 0 first) or of unequal sizes.
    #[error(
        "`{expert}` cannot be expert {position} of GGUF tensor `{tensor}`: a layer's experts \
         must be listed in order, each of the same size"
    )]
    ExpertOrder {
        /// The 3-D GGUF tensor.
        tensor: String,
        /// The expert's weight (Hugging Face name).
        expert: String,
        /// The slab it would take.
        position: usize,
    },
    /// The vocabulary is too small for the synthetic tokenizer.
    #[error(
        "a vocabulary of {vocab} tokens cannot hold the synthetic tokenizer's {needed} \
         (special, byte and word tokens)"
    )]
    VocabTooSmall {
        /// The shape's vocabulary size.
        vocab: usize,
        /// Tokens the tokenizer needs.
        needed: usize,
    },
    /// A model error (an invalid shape, a file error).
    #[error(transparent)]
    Model(#[from] lcut_model::ModelError),
    /// A tensor operation failed (quantization).
    #[error("quantizing `{tensor}`: {source}")]
    Quantize {
        /// The tensor.
        tensor: String,
        /// Why.
        source: candle_core::Error,
    },
}

/// Result of the synth crate.
pub type Result<T> = std::result::Result<T, SynthError>;

impl SynthError {
    /// An I/O error at `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Unwritable {
            path: path.into(),
            source,
        }
    }
}
