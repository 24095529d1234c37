//! Errors of a parity check, each naming the case or file at fault.

use std::path::PathBuf;

use lcut_model::ModelError;

/// What can go wrong while checking a reference case.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    /// A case could not be read, loaded or run (`step` says which).
    #[error("{step} {case}")]
    Case {
        /// `reading`, `loading` or `running`.
        step: &'static str,
        /// The case's folder or name.
        case: String,
        /// Why.
        #[source]
        source: Box<ModelError>,
    },
    /// A file of transformers' logits in lcut's dtype could not be read.
    #[error("reading transformers' logits {}", path.display())]
    TransformersLogits {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: candle_core::Error,
    },
    /// A file of transformers' logits lacks a tensor the case has.
    #[error("{} has no tensor {key}", path.display())]
    MissingLogits {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        key: String,
    },
    /// The decoder or a tensor operation failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result with [`ParityError`].
pub type Result<T> = std::result::Result<T, ParityError>;
