//! KV-visibility policies for layer-asymmetric decoding (SPEED with or
//! without kept heads, SelfOnly, prompt knockout bands, SlimInfer,
//! projected prompt K/V as SwiftKV and POP, kvpress's presses, and
//! registered families), the
//! token phases they act on, the one interface through
//! which everything asks a policy what a sequence sees ([`Visibility`]), and
//! the KV-cache cost model.
//!
//! Everything here is plain Rust with no tensors, so the rules can be tested
//! exhaustively and shared by the engine, the diagnostics and the viewer.

mod band;
mod capabilities;
mod cost;
mod custom;
mod cut;
mod error;
mod head_rule;
mod heads;
pub mod keys;
mod layer_rule;
mod phases;
mod policy;
mod press;
mod projected;
mod query_window;
mod record;
mod recurrent;
mod selection;
mod shared_kv;
mod slim;
mod slim_run;
mod slim_score;
mod visibility;
pub mod window;

pub use band::BandRule;
pub use capabilities::Capabilities;
pub use cost::{KvCost, KvShape};
pub use custom::{FamilyRef, PolicyFamily, register_family};
pub use cut::CutSpec;
pub use error::PolicyError;
pub use head_rule::HeadRule;
pub use heads::{
    FileModel, HeadChoice, HeadFile, HeadRanking, HeadSet, HeadSource, ModelDims, read_head_file,
    read_ranking,
};
pub use keys::{KeyPlanner, KeyQuery, LayerKeys, QuerySpans, rows_read_later, training_matrix};
pub use layer_rule::{LayerRule, UpperReads};
pub use phases::{Phase, PhaseError, TokenPhases};
pub use policy::{Anchors, HeadExceptions, Policy, PolicyKind, PolicySpec, split_list};
pub use press::{PRESSES, PressName, PressObservation, PressParams, PressRun};
pub use projected::{ProjectedKv, ProjectedName};
pub use record::{CutRecord, SlimTrace, StepRecord};
pub use recurrent::RecurrentLayers;
pub use selection::{SlimSelection, StepTraffic};
pub use shared_kv::{KvSharing, LayerKvShape};
pub use slim::{Budget, MAX_SLIM_CUTS, ScoreMode, SlimOptions, SlimParams, SlimSpec};
pub use slim_run::SlimRun;
pub use slim_score::{BlockSummaries, top_blocks};
pub use visibility::{DynamicRule, HostKeys, KvAccounting, PromptKv, RuleCopy, Visibility};
