//! Layer-wise diagnostics of decoder-only LMs for SPEED (Shallow Prefill,
//! Deep Decode), on traces recorded by the engine:
//!
//! - [`phase_masses`] and [`prefill_entropy`] of one attention row;
//! - [`curvature`] of a trajectory and the [`turning_angle`] it averages;
//! - [`aggregate`] traces into per-layer curves, and [`tail_mass`];
//! - the logit lens's [`lens_curves`] over prompts, and the causal prompt
//!   [`knockout_curves`] per band of layers;
//! - [`recommend`] an L_cut from three signals' votes, and a cut with
//!   kept heads within a K/V budget ([`plan_for_budget`]);
//! - the sweep's [`knee`], and the prefill [`prefill_flops`] model;
//! - a policy's [`predict_cost`] (prefill FLOPs, decode bytes, K/V held)
//!   from one sequence's `Visibility`;
//! - whether a generation [`ends_in_loop`] (a repeated suffix);
//! - a mixture-of-experts model's routing: the router's normalised
//!   [`routing_entropy`], a policy's [`topk_overlap`] with the full model
//!   ([`routing_overlap`] per layer and step), and the per-layer entropy,
//!   expert load and overlap of a run ([`routing_curves`]);
//! - [`build_report`] from traces and [`merge`] shard reports, sweeps of
//!   prompt shards pooled by [`merge_teacher_forced`];
//! - a leaderboard run's paired comparisons ([`compare_configs`]: the exact
//!   McNemar test or a paired bootstrap per pair, Holm's correction per
//!   ratio), and the check that its shards hold each item once
//!   ([`check_shard_items`]).
//!
//! Pure Rust on ndarray; no candle.

// Tests unwrap freely; the library itself is still linted (clippy builds both).
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod accuracy;
mod aggregate;
mod curvature;
mod error;
mod flops;
mod heads;
mod knee;
mod knockout;
mod lens;
mod masses;
mod merge;
mod paired;
mod policy_merge;
mod pooled;
mod predict;
mod recommend;
mod repetition;
mod routing;
mod sweep_merge;
pub mod synthetic;
mod tail;

pub use accuracy::{accuracy_point, merge_suite_accuracy, wilson};
pub use aggregate::aggregate;
pub use curvature::{curvature, turning_angle};
pub use error::DiagError;
pub use flops::{
    FlopShape, PromptSplit, layered_prefill_flops, policy_prefill_flops, prefill_flops,
    slim_tokens_per_layer,
};
pub use heads::{
    CHECKED_SPAN, HeadPlan, PromptShape, UNCHECKED_SPAN, expected_accuracy, head_ranking,
    kv_head_masses, kv_share, plan_candidates, plan_candidates_within, plan_for_budget,
    plan_for_budgets, span_layers,
};
pub use knee::{finish_sweep, knee};
pub use knockout::{KNOCKOUT_KL_MIN, knockout_band, knockout_curves, vote_knockout};
pub use lens::lens_curves;
pub use masses::{PhaseMasses, PrefillEntropy, phase_masses, prefill_entropy};
pub use merge::{build_report, merge};
pub use paired::{
    ALPHA, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, OWN_KNOB, PairSettings, PairedScores, ShardItems,
    binomial_cdf_half, check_shard_items, compare_configs, compare_scores, holm, mcnemar_exact,
    paired_bootstrap, ratio_groups,
};
pub use predict::{ByteSizes, PredictedCost, predict_cost};
pub use recommend::{
    recommend, same_kv_cuts, vote_curvature_plateau, vote_selective_band, vote_tail_mass,
};
pub use repetition::{
    LOOP_MAX_PERIOD, LOOP_MIN_REPEATS, RepeatedSuffix, ends_in_loop, repeated_suffix,
};
pub use routing::{OverlapTotals, routing_curves, routing_entropy, routing_overlap, topk_overlap};
pub use sweep_merge::{merge_sweep_points, merge_teacher_forced};
pub use tail::tail_mass;
