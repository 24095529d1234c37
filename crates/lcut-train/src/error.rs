//! Errors of the trainer and the evaluator. Each names the file or the
//! setting at fault and what was expected.

use std::path::PathBuf;

/// Errors raised while building, training, saving or evaluating a model.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The task settings are inconsistent.
    #[error("invalid task settings: {reason}")]
    TaskSpec {
        /// What is wrong.
        reason: String,
    },
    /// The model shape is inconsistent.
    #[error("invalid model shape: {reason}")]
    Shape {
        /// What is wrong.
        reason: String,
    },
    /// A policy string could not be parsed or resolved.
    #[error("policy {text:?}: {source}")]
    Policy {
        /// The policy as written.
        text: String,
        /// The parse or resolve error.
        source: lcut_policy::PolicyError,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A JSON file does not hold what was expected.
    #[error("{path}: {reason}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The model could not be loaded or run by lcut-model.
    #[error(transparent)]
    Model(#[from] lcut_model::ModelError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The tokenizer written for the model does not encode as the trainer does.
    #[error("tokenizer check failed: {0}")]
    Tokenizer(String),
}

/// Result with [`TrainError`].
pub type Result<T> = std::result::Result<T, TrainError>;

impl From<lcut_model::ShapeError> for TrainError {
    /// A bad field of a model shape, named in the reason.
    fn from(e: lcut_model::ShapeError) -> Self {
        TrainError::Shape {
            reason: format!(
                "field `{}`: expected {}, found {}",
                e.field, e.expected, e.found
            ),
        }
    }
}
