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
    /// A policy could not be resolved for the model or applied to a
    /// sequence (cut out of range, anchors, phases).
    #[error(transparent)]
    Visibility(#[from] lcut_policy::PolicyError),
    /// Token phases that do not fit a sequence.
    #[error(transparent)]
    Phase(#[from] lcut_policy::PhaseError),
    /// A session (model and tokenizer) could not load or run a prompt.
    #[error(transparent)]
    Engine(#[from] lcut_engine::EngineError),
    /// A setting or a file that cannot be used, the message naming it.
    #[error("{0}")]
    Refused(String),
    /// An error, with what was being done when it happened.
    #[error("{what}")]
    While {
        /// What was being done (`reading FILE`, `loading model DIR`).
        what: String,
        /// The error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
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

/// `with_context` on a result: its error becomes [`TrainError::While`].
pub(crate) trait Context<T> {
    /// The error, with `what()` saying what was being done.
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| TrainError::While {
            what: what(),
            source: Box::new(e),
        })
    }
}

/// [`TrainError::Refused`] with a formatted message, returned.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::error::TrainError::Refused(format!($($arg)*)))
    };
}
pub(crate) use refuse;
