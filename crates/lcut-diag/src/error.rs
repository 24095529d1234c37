//! Errors of the diagnostics.

use lcut_trace::TraceError;

impl DiagError {
    /// A [`DiagError::Mismatch`] of `what`, `detail` saying which values.
    pub fn mismatch(what: &'static str, detail: String) -> Self {
        Self::Mismatch { what, detail }
    }
}

/// What can go wrong when computing diagnostics or merging reports.
#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    /// An attention row and the positions given for it do not fit together.
    #[error("attention row: {0}")]
    Row(String),
    /// Nothing to aggregate or merge.
    #[error("{0}: nothing to work on")]
    Empty(&'static str),
    /// Traces or shards that must agree do not.
    #[error("{what} differ: {detail}")]
    Mismatch {
        /// What differs (for example `model identity`).
        what: &'static str,
        /// Which values, in plain words.
        detail: String,
    },
    /// Two traces claim the same prompt index.
    #[error(
        "prompt index {index} appears twice (ids {first:?} and {second:?}); shards must not overlap"
    )]
    DuplicatePrompt {
        /// The repeated index.
        index: usize,
        /// Id of the first trace with it.
        first: String,
        /// Id of the second.
        second: String,
    },
    /// A shard's sweep point lacks what its means are over, so it cannot be
    /// recombined with other shards' (a report written before the counts
    /// were recorded).
    #[error(
        "shard {shard}'s sweep point {point:?} records no {what} (written before sweeps recorded them): its means cannot be recombined across prompt shards; rerun that shard's sweep"
    )]
    MissingCounts {
        /// Index of the shard among the merged reports.
        shard: usize,
        /// The point's policy.
        point: String,
        /// What is missing (for example `scored-token count`).
        what: &'static str,
    },
    /// An argument or input outside what a computation accepts.
    #[error("{0}")]
    Invalid(String),
    /// A trace failed its schema checks.
    #[error(transparent)]
    Trace(#[from] TraceError),
}
