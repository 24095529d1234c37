//! Errors of rendering and writing reports.

use std::path::PathBuf;

use lcut_trace::TraceError;

/// What can go wrong when exporting a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The format name is not one of `html`, `md`, `csv`, `json`.
    #[error("unknown report format {0:?}: expected one of html, md, csv, json")]
    UnknownFormat(String),
    /// The output folder could not be created.
    #[error("creating the output folder {path}: {source}")]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding the report as JSON failed.
    #[error("encoding the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Writing the file failed (the message names it).
    #[error(transparent)]
    Trace(#[from] TraceError),
}
