//! What a SlimInfer run decided, as plain serialisable records for traces,
//! reports and the viewer: the prefill's kept blocks and scores per cut,
//! and each decode step's overlap, swaps and traffic.

use serde::{Deserialize, Serialize};

use crate::selection::StepTraffic;

/// What the prefill decided at one cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CutRecord {
    /// The cut layer c_i (first layer holding only the kept blocks).
    pub layer: usize,
    /// The budget in tokens K_i for this prompt (sink included).
    pub budget_tokens: usize,
    /// Every candidate block's score r(j), in block order.
    pub scores: Vec<(usize, f32)>,
    /// The kept prunable blocks S_i (sink excluded), ascending.
    pub kept: Vec<usize>,
    /// Prefill-phase tokens of S_i (P_i).
    pub kept_tokens: usize,
}

/// What one decode step's decisions did, over all cuts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Position of the decoded token.
    pub position: usize,
    /// One entry per cut.
    pub cuts: Vec<StepTraffic>,
    /// Token-layers of K/V resident after the step (sink, A_t ∩ S_i, decode phase).
    pub resident_token_layers: usize,
    /// Token-layers of K/V held after the step.
    pub held_token_layers: usize,
}

/// What a SlimInfer generation decided, for reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlimTrace {
    /// Bytes of one token's K/V at one layer (token-layers to bytes).
    pub bytes_per_token_layer: u64,
    /// Block size B.
    pub block: usize,
    /// Sink tokens (anchors) of this prompt.
    pub sink_tokens: usize,
    /// Prunable prompt tokens P.
    pub prefill_tokens: usize,
    /// The prefill's decision at each cut.
    pub cuts: Vec<CutRecord>,
    /// Each decode step's decisions.
    pub steps: Vec<StepRecord>,
    /// The SPEED cutoff that would hold the same prompt K/V (§4.7's L_eq).
    pub equal_kv_cutoff: f64,
}
