//! KV-visibility policies for layer-asymmetric decoding (SPEED), the token
//! phases they act on, and the KV-cache cost model.
//!
//! Everything here is plain Rust with no tensors, so the rules can be tested
//! exhaustively and shared by the engine, the diagnostics and the viewer.

mod cost;
mod phases;
mod policy;
mod record;
mod selection;
mod slim;

pub use cost::{KvCost, KvShape};
pub use phases::{Phase, PhaseError, TokenPhases};
pub use policy::{Anchors, CutSpec, Policy, PolicyError, PolicyKind, PolicySpec};
pub use record::{CutRecord, SlimTrace, StepRecord};
pub use selection::{SlimSelection, StepTraffic};
pub use slim::{Budget, MAX_SLIM_CUTS, ScoreMode, SlimOptions, SlimParams, SlimSpec};
