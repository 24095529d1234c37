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
    /// An item of a run is in two of its shards (or twice in one).
    #[error(
        "item {index} ({id}) is in both {first} and {second}: each item must be in one shard \
         (a shard given twice?)"
    )]
    DuplicateItem {
        /// The item's position in the suite.
        index: usize,
        /// Its id.
        id: String,
        /// The shard that holds it first.
        first: String,
        /// The shard that holds it again.
        second: String,
    },
    /// Items of a run's suite that none of its shards holds.
    #[error(
        "{count} of the suite's {suite_items} items are in no shard (positions {first}{more}): \
         a shard missing or unfinished? (`--partial` tables the items so far)",
        more = if *count > 10 { ", ..." } else { "" }
    )]
    MissingItems {
        /// How many are missing.
        count: usize,
        /// Items in the whole suite.
        suite_items: usize,
        /// The first (up to ten) missing positions, comma-separated.
        first: String,
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
