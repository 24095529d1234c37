//! The per-layer curves of a report: attention masses, prefill entropy,
//! tail mass, curvature, the logit lens and (for a mixture-of-experts
//! model) routing aggregated over prompts (each series is described
//! in [`crate::LAYER_METRICS`]).

use serde::{Deserialize, Serialize};

use crate::floats::Series;
use crate::routing::RoutingCurves;
use crate::tensor::Tensor2;

/// Per-layer curves aggregated over prompts, decode steps and heads.
///
/// Masses and the head-mean entropy are means over prompts of per-prompt means
/// over steps and heads (every prompt counts equally). Per-layer series have
/// `num_layers` entries; tail mass, curvature and lens series have `num_layers + 1`
/// (the lens series none when the run did not record it).
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
    /// Mean attention on no key per layer: the learned sink's share
    /// (gpt-oss); empty for a model without sinks (and in reports written
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "no_values")]
    pub sink: Series,
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
    /// Logit lens (index 0 = embeddings, `l + 1` = the output of layer `l`;
    /// `L + 1` entries, or none when the run did not record the lens): mean
    /// probability of each decode step's token under the hidden state's lens.
    #[serde(default)]
    pub lens_prob: Series,
    /// Share of decode steps whose token the hidden state's lens ranks first.
    #[serde(default)]
    pub lens_top1: Series,
    /// Share of decode steps whose answer has formed by this hidden state:
    /// its lens and every later one rank the step's token first.
    #[serde(default)]
    pub lens_formed: Series,
    /// Mean KL(final ‖ lens) of the next-token distributions, nats.
    #[serde(default)]
    pub lens_kl: Series,
    /// Mean log10 of the rank of the step's token under the lens (0 = first).
    #[serde(default)]
    pub lens_log_rank: Series,
    /// Causal prompt knockout (`L` entries, or none when the run did not
    /// measure it): entry `a` is the mean over continuation tokens, pooled
    /// over prompts, of KL(full ‖ the prompt hidden from the decode queries
    /// at the band of layers starting at `a`), nats; NaN where a band
    /// would run past the last layer.
    #[serde(default)]
    pub knockout_kl: Series,
    /// Top-1 agreement with the full model with the prompt knocked out of
    /// the band starting at each layer (as `knockout_kl`).
    #[serde(default)]
    pub knockout_top1: Series,
    /// `[L, H]`: mean prefill mass per layer and head.
    pub prefill_by_head: Tensor2,
    /// `[L, max steps]`: mean over heads and over the prompts that reached step k
    /// of the prefill mass (the mean layer × decode-step heatmap).
    pub prefill_by_step: Tensor2,
    /// How a mixture-of-experts model routes its decode tokens per layer
    /// (entropy, expert load, a policy's overlap with the full model);
    /// absent for a dense model and in reports written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingCurves>,
    /// Layers without attention rows (Qwen3.5's linear-attention layers),
    /// ascending, whose masses are their state split (see
    /// [`crate::PromptTrace::state_split_layers`]): their prefill mass is
    /// the prompt's share of the layer's output, their entropy NaN. Empty
    /// where every layer attends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_split_layers: Vec<usize>,
}

/// Where a run's answers form, read off its logit-lens curves.
///
/// A step's answer has formed at hidden state `i` (0 the embeddings, `l + 1`
/// the output of layer `l`) when the lens of state `i` and of every later
/// state ranks the step's token first ([`crate::LensTrace::formation`]);
/// the last state, the model's own logits, always does, so every step
/// forms somewhere in `0..=L`. Read as a cut: above layer boundary `i` the
/// answer no longer changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Formation {
    /// The **formation layer**: the smallest boundary `i` by which at least
    /// half the steps' answers have formed (`lens_formed[i] >= 0.5`), the
    /// median formation site with every prompt weighted equally.
    pub median: usize,
    /// The mean formation site over steps (prompts weighted equally):
    /// `Σ_{i < L} (1 - lens_formed[i])`.
    pub mean: f32,
    /// Share of steps whose token the lens of the output of layer `L - 2`
    /// (the last layer's input) already ranks first.
    pub top1_before_last: f32,
}

impl LayerCurves {
    /// Curves of a model of `num_layers` layers and `num_heads` heads with
    /// no series recorded (every series empty, the per-head and per-step
    /// masses zero-sized in steps): a start that a caller fills in.
    pub fn empty(num_layers: usize, num_heads: usize) -> Self {
        let e = Series::default;
        Self {
            num_layers,
            num_heads,
            bos: e(),
            anchor: e(),
            prefill: e(),
            decode: e(),
            self_mass: e(),
            sink: e(),
            entropy_head_mean: e(),
            entropy_weighted: e(),
            tail_mass: e(),
            curvature_prompt: e(),
            curvature_generated: e(),
            straightening_prompt: e(),
            straightening_generated: e(),
            lens_prob: e(),
            lens_top1: e(),
            lens_formed: e(),
            lens_kl: e(),
            lens_log_rank: e(),
            knockout_kl: e(),
            knockout_top1: e(),
            prefill_by_head: Tensor2::zeros([num_layers, num_heads]),
            prefill_by_step: Tensor2::zeros([num_layers, 0]),
            routing: None,
            state_split_layers: Vec::new(),
        }
    }

    /// Where the answers form, `None` when the curves hold no lens.
    pub fn formation(&self) -> Option<Formation> {
        let formed = &self.lens_formed;
        let l = self.num_layers;
        if formed.len() != l + 1 || formed.iter().any(|f| !f.is_finite()) {
            return None;
        }
        let median = (0..=l).find(|&i| formed[i] >= 0.5).unwrap_or(l);
        let mean = formed[..l].iter().map(|f| 1.0 - f).sum();
        let top1_before_last = self
            .lens_top1
            .get(l.saturating_sub(1))
            .copied()
            .unwrap_or(f32::NAN);
        Some(Formation {
            median,
            mean,
            top1_before_last,
        })
    }
}

/// Whether a series holds no value (an optional one left out of the JSON).
fn no_values(s: &Series) -> bool {
    s.0.is_empty()
}
