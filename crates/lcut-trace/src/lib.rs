//! The lcut trace and report schema, and its JSON files.
//!
//! A [`PromptTrace`] holds what a full-depth greedy run recorded for one prompt:
//! per-(layer, decode step, head) phase masses and prefill entropy, a binned
//! layer × prompt-position attention map, per-layer curvature and, for a
//! mixture-of-experts model, the routing of its decode steps. A [`Report`]
//! gathers the traces of a run with the model's identity, the settings, the
//! aggregated per-layer curves, the recommended L_cut and an optional sweep.
//!
//! Files are written atomically ([`write_atomic`]); reading checks
//! [`SCHEMA_VERSION`] and every shape, and errors name the file and field.
//! The per-layer series of the curves are described once in [`LAYER_METRICS`].
//! A [`PaperReport`] holds what `lcut paper` found for one model: the SPEED
//! paper's six parts, each with the command and settings that made it.
//! Trace size is bounded independently of prompt length (see [`trace_size_bound`]).
//! A [`MadeBy`] names the build and instruction-set level that made a
//! record (a sweep, a suite result, a leaderboard item), and [`made_by`]
//! the notes that say when a merged one had several.
//!
//! This crate does not depend on candle.

// Tests unwrap freely; the library itself is still linted (clippy builds both).
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod bins;
mod curves;
mod error;
pub mod floats;
mod identity;
mod io;
mod knockout;
mod leaderboard;
mod lens;
pub mod made_by;
mod metrics;
mod paper;
mod report;
mod routing;
mod settings;
mod size;
mod sweep_point;
mod tensor;
mod trace;

pub use bins::{bin_edges, bin_of, bin_sums};
pub use curves::{Formation, LayerCurves};
pub use error::TraceError;
pub use floats::Series;
pub use identity::{AdapterIdentity, LayerFlops, ModelIdentity, hash_bytes, hash_parts};
pub use io::{
    read_json, read_report_json, write_atomic, write_file_atomic, write_json, write_report_json,
};
pub use knockout::{BandChoice, KnockoutTrace};
pub use leaderboard::{
    LeaderboardCell, LeaderboardConfig, LeaderboardPairs, LeaderboardTable, PairComparison,
    PairTest, PairVerdict,
};
pub use lens::LensTrace;
pub use made_by::MadeBy;
pub use metrics::{Indexing, LAYER_METRICS, LayerMetric, MetricAxis};
pub use paper::{
    CategoryCurves, CategoryRow, LengthAccuracy, LoopRow, PAPER_SCHEMA_VERSION, PaperPart,
    PaperReport, PartRecord, PolicyCurves, TimingPoint,
};
pub use report::{
    CutoffAccuracy, PolicyCounts, PolicyPoint, Recommendation, Report, SCHEMA_VERSION, SuiteSource,
    Sweep, Votes,
};
pub use routing::{RoutingCurves, RoutingOverlap, RoutingTrace};
pub use settings::{RunSettings, Thresholds};
pub use size::{routing_memory_bound, routing_size_bound, trace_memory_bound, trace_size_bound};
pub use sweep_point::{SweepPoint, anchors_label, speed_policy};
pub use tensor::{Tensor2, Tensor3};
pub use trace::{PromptTrace, TraceHeader, normalised_entropy};

/// The version of this crate, for [`Report::tool_version`] when no other is given.
pub const CRATE_VERSION: &str = env!("CARGO_PKG_VERSION");
