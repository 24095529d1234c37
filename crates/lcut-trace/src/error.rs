//! Errors of reading, writing and checking traces and reports.

use std::path::PathBuf;

/// What can go wrong with a trace or report, naming the file where there is one.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading, writing or renaming a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid JSON, or does not have the expected fields.
    #[error("{path}: not a valid {what}: {source}")]
    Json {
        /// The file concerned.
        path: PathBuf,
        /// What the file should hold ("report", "trace", ...).
        what: &'static str,
        /// The parser's message (it names the field, line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A value could not be turned into JSON.
    #[error("encoding {what} as JSON: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by a different version of the schema.
    #[error(
        "{path}: field `schema_version` is {found}, expected {expected} (re-create the file with this version of lcut)"
    )]
    SchemaVersion {
        /// The file concerned.
        path: PathBuf,
        /// The version found in the file (`missing` when there is none).
        found: String,
        /// The version this build reads.
        expected: u32,
    },
    /// The data parsed but is inconsistent (a shape, a length or an index is wrong).
    #[error("{context}: {message}")]
    Invalid {
        /// Where the problem is (a file, a prompt id).
        context: String,
        /// Which field, and what was expected.
        message: String,
    },
}

impl TraceError {
    /// An [`TraceError::Invalid`] error for `context` with `message`.
    pub fn invalid(context: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            context: context.into(),
            message: message.into(),
        }
    }
}
