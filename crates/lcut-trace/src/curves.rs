//! The per-layer curves of a report: attention masses, prefill entropy,
//! tail mass and curvature aggregated over prompts (each series is described
//! in [`crate::LAYER_METRICS`]).

use serde::{Deserialize, Serialize};

use crate::floats::Series;
use crate::tensor::Tensor2;

/// Per-layer curves aggregated over prompts, decode steps and heads.
///
/// Masses and the head-mean entropy are means over prompts of per-prompt means
/// over steps and heads (every prompt counts equally). Per-layer series have
/// `num_layers` entries; tail mass and curvature series have `num_layers + 1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCurves {
    /// Number of layers L.
    pub num_layers: usize,
    /// Number of query heads H.
    pub num_heads: usize,
    /// Mean attention on BoS per layer.
    pub bos: Series,
    /// Mean attention on non-BoS anchors per layer.
    pub anchor: Series,
    /// Mean attention on prefill tokens per layer.
    pub prefill: Series,
    /// Mean attention on earlier decode-phase tokens per layer.
    pub decode: Series,
    /// Mean attention of queries on themselves per layer.
    pub self_mass: Series,
    /// Normalised conditional prefill entropy, mean over heads, steps, prompts
    /// (NaN entries skipped).
    pub entropy_head_mean: Series,
    /// Normalised conditional prefill entropy weighted by prefill mass:
    /// `Σ m_prefill · H / Σ m_prefill` pooled over prompts, steps and heads.
    pub entropy_weighted: Series,
    /// Tail mass R(c) for c in `0..=L`: share of prefill mass at layers `>= c`.
    pub tail_mass: Series,
    /// Mean curvature of the prompt span (index 0 = embeddings), radians.
    pub curvature_prompt: Series,
    /// Mean curvature of the generated span (index 0 = embeddings), radians.
    pub curvature_generated: Series,
    /// `C_l - C_0` of the prompt span (negative = straighter than the embeddings).
    pub straightening_prompt: Series,
    /// `C_l - C_0` of the generated span.
    pub straightening_generated: Series,
    /// `[L, H]`: mean prefill mass per layer and head.
    pub prefill_by_head: Tensor2,
    /// `[L, max steps]`: mean over heads and over the prompts that reached step k
    /// of the prefill mass (the mean layer × decode-step heatmap).
    pub prefill_by_step: Tensor2,
}
