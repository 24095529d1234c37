//! The report of a diagnostic run: identity, settings, traces, curves,
//! recommendation and an optional sweep.

use serde::{Deserialize, Serialize};

use crate::curves::LayerCurves;
use crate::error::TraceError;
use crate::identity::ModelIdentity;
use crate::made_by::MadeBy;
use crate::metrics::LAYER_METRICS;
use crate::settings::RunSettings;
use crate::sweep_point::SweepPoint;
use crate::trace::PromptTrace;

/// Version of the JSON schema of [`Report`]; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// The vote each signal casts for L_cut (`None`: the signal could not vote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Votes {
    /// Smallest c with tail mass R(c) at most `tail_mass_max`.
    pub tail_mass: Option<usize>,
    /// One past the last layer of selective reading (low entropy, high mass).
    pub selective_band: Option<usize>,
    /// First layer from which the prompt curvature stops changing.
    pub curvature_plateau: Option<usize>,
}

/// The recommended cutoff and its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// The chosen L_cut in `1..=L`.
    pub l_cut: usize,
    /// Number of layers L.
    pub num_layers: usize,
    /// Each signal's vote.
    pub votes: Votes,
    /// Tail mass R(l_cut): the share of decode-to-prefill attention SPEED drops.
    #[serde(with = "crate::floats::scalar")]
    pub tail_mass_dropped: f32,
    /// Plain-words explanation: each vote, the thresholds, and the rule.
    pub explanation: String,
}

/// The empirical sweep over cutoffs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// The context length the costs are computed at.
    pub context_len: usize,
    /// The measured points.
    pub points: Vec<SweepPoint>,
    /// The knee of quality against cost (see `lcut_diag::knee`).
    pub knee: Option<usize>,
    /// Other policies measured on the same prompts and continuations (a
    /// SlimInfer axis, SPEED at equal K/V), costs measured on the prompts.
    #[serde(default)]
    pub policies: Vec<PolicyPoint>,
    /// Accuracy on a task suite at each cutoff (`lcut sweep --eval-suite`):
    /// SPEED+BoS, and anchor-free SPEED too when the sweep has it.
    #[serde(default)]
    pub accuracy: Vec<CutoffAccuracy>,
    /// The suite (and shard of it) `accuracy` was scored on; absent in
    /// reports written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<SuiteSource>,
    /// `[i, n]`: the teacher-forced points and `policies` were measured on
    /// prompts i, i+n, ... (`lcut sweep --shard`); absent for all prompts
    /// and in reports written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_shard: Option<[usize; 2]>,
    /// The builds and instruction-set levels that measured it: the one that
    /// ran a sweep, each shard's (sorted, each once) in a merged one; empty
    /// in reports written before it was recorded. Shards merge into the
    /// unsharded sweep bit for bit only when one made them all.
    #[serde(default)]
    pub made_by: Vec<MadeBy>,
}

/// Which task suite, and which shard of its items, a sweep's accuracy
/// points were scored on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuiteSource {
    /// The suite file as given.
    pub path: String,
    /// Hash of the suite file's bytes.
    pub hash: String,
    /// Items in the whole suite.
    pub items: usize,
    /// `[i, n]`: items i, i+n, ... were scored; absent for all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<[usize; 2]>,
}

/// Training-free accuracy of SPEED at one cutoff on a task suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CutoffAccuracy {
    /// The cutoff.
    pub l_cut: usize,
    /// Anchors kept: `"bos"` or `"none"`.
    pub anchors: String,
    /// Items answered correctly.
    pub correct: usize,
    /// Items scored.
    pub n: usize,
    /// `correct / n`.
    #[serde(with = "crate::floats::scalar")]
    pub accuracy: f32,
    /// 95% Wilson interval of the accuracy.
    pub interval: [f32; 2],
}

impl CutoffAccuracy {
    /// Whether this point is SPEED+BoS, the setting the calibration reads
    /// (anchor-free points sit beside it for comparison only).
    pub fn keeps_bos(&self) -> bool {
        self.anchors == "bos"
    }
}

/// One policy of a sweep's comparison axis, measured on the sweep's prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyPoint {
    /// The policy as written.
    pub policy: String,
    /// The SPEED point this one is paired with at equal held K/V, if any.
    #[serde(default)]
    pub paired_with: Option<String>,
    /// Teacher-forced top-1 agreement with the full model's greedy tokens.
    #[serde(with = "crate::floats::scalar")]
    pub top1_agreement: f32,
    /// Mean KL(full ‖ policy) of the next-token distributions, nats.
    #[serde(with = "crate::floats::scalar")]
    pub mean_kl: f32,
    /// Mean negative log-likelihood of the full model's continuation, nats/token.
    #[serde(with = "crate::floats::scalar")]
    pub nll: f32,
    /// Held K/V over the full model's, summed over the prompts.
    #[serde(with = "crate::floats::scalar")]
    pub kv_ratio: f32,
    /// Resident K/V (what decode reads) over the full model's.
    #[serde(with = "crate::floats::scalar")]
    pub resident_ratio: f32,
    /// Predicted prefill FLOPs over the full model's, on the prompts.
    #[serde(with = "crate::floats::scalar")]
    pub prefill_ratio: f32,
    /// The SPEED cutoff holding the same prompt K/V (mean over prompts).
    #[serde(with = "crate::floats::scalar")]
    pub equal_kv_cutoff: f32,
    /// Share of decode steps whose decisions swapped blocks at some cut.
    #[serde(with = "crate::floats::scalar")]
    pub swap_rate: f32,
    /// Per layer, the share of the full model's decode attention on the
    /// policy's prunable prompt tokens that lands on tokens whose K/V it
    /// keeps there (1 below a cut; 0 above SPEED's cutoff; 1 at every layer
    /// under projected prompt K/V, whose keys are projections).
    #[serde(default, with = "crate::floats::vec")]
    pub attention_recall: Vec<f32>,
    /// Per SlimInfer cut, the share of the kept blocks that are also among
    /// as many blocks the full model's decode queries read most at and above
    /// the cut (the scorer's precision; empty for static policies).
    #[serde(default, with = "crate::floats::vec")]
    pub scorer_precision: Vec<f32>,
    /// What each mean and ratio is over, so that shards' points merge
    /// exactly; absent in reports written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<PolicyCounts>,
}

/// The denominators of a [`PolicyPoint`]'s means and ratios: with them the
/// points of prompt shards recombine into the point of all the prompts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PolicyCounts {
    /// Continuation tokens scored: what top-1 agreement, KL and NLL average over.
    pub tokens: usize,
    /// Prompts measured: what `equal_kv_cutoff`, `attention_recall` and
    /// `scorer_precision` average over.
    pub prompts: usize,
    /// SlimInfer decode steps: what `swap_rate` is a share of.
    pub steps: usize,
    /// The full model's K/V bytes on the prompts, summed: what `kv_ratio`
    /// and `resident_ratio` divide by.
    pub full_kv_bytes: f64,
    /// The full model's prefill FLOPs on the prompts, summed: what
    /// `prefill_ratio` divides by.
    pub full_prefill_flops: f64,
}

/// A complete diagnostic report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// Version of the tool that made the report.
    pub tool_version: String,
    /// The model.
    pub model: ModelIdentity,
    /// The run settings.
    pub settings: RunSettings,
    /// One trace per prompt, ordered by `index`; enough to recompute every aggregate.
    pub traces: Vec<PromptTrace>,
    /// Aggregated per-layer curves.
    pub curves: LayerCurves,
    /// The recommended cutoff.
    pub recommendation: Recommendation,
    /// The empirical sweep, when one was run.
    pub sweep: Option<Sweep>,
    /// The builds and instruction-set levels that measured the traces:
    /// one for a run, each shard's for a merge (sorted, each once); none
    /// in a report written before reports recorded it.
    #[serde(default)]
    pub made_by: Vec<MadeBy>,
}

impl Report {
    /// Checks the traces and curves against the model's shape; `context` names
    /// the file for the message.
    pub fn validate(&self, context: &str) -> Result<(), TraceError> {
        let (l, h) = (self.model.num_layers, self.model.num_heads);
        let per_layer = self.model.layer_flops.len();
        if per_layer != 0 && per_layer != l {
            return Err(TraceError::invalid(
                context,
                format!("`model.layer_flops` has {per_layer} entries, the model {l} layers"),
            ));
        }
        for t in &self.traces {
            t.validate(context)?;
            if t.num_layers != l || t.num_heads != h {
                return Err(TraceError::invalid(
                    context,
                    format!(
                        "prompt {:?} has {} layers × {} heads, the model has {l} × {h}",
                        t.id, t.num_layers, t.num_heads
                    ),
                ));
            }
        }
        if self.traces.windows(2).any(|w| w[0].index >= w[1].index) {
            return Err(TraceError::invalid(
                context,
                "`traces` must be ordered by strictly increasing `index`",
            ));
        }
        let c = &self.curves;
        for m in LAYER_METRICS {
            let (got, want) = (m.series(c).len(), m.indexing.len(l));
            if got != want && !(m.optional && got == 0) {
                return Err(TraceError::invalid(
                    context,
                    format!("`curves.{}` has {got} entries, expected {want}", m.field),
                ));
            }
        }
        if c.num_layers != l
            || c.num_heads != h
            || c.prefill_by_head.shape() != [l, h]
            || c.prefill_by_step.shape()[0] != l
        {
            return Err(TraceError::invalid(
                context,
                format!("`curves` do not match the model's {l} layers × {h} heads"),
            ));
        }
        if let Some(routing) = &c.routing {
            routing
                .check(l)
                .map_err(|msg| TraceError::invalid(context, msg))?;
        }
        crate::trace::check_state_split_layers(&c.state_split_layers, l)
            .map_err(|msg| TraceError::invalid(context, format!("curves: {msg}")))?;
        let r = &self.recommendation;
        if r.l_cut == 0 || r.l_cut > l {
            return Err(TraceError::invalid(
                context,
                format!("`recommendation.l_cut` is {}, expected 1..={l}", r.l_cut),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(made_by: Vec<MadeBy>) -> Sweep {
        Sweep {
            context_len: 4096,
            points: Vec::new(),
            knee: Some(3),
            policies: Vec::new(),
            accuracy: Vec::new(),
            suite: None,
            prompt_shard: Some([1, 2]),
            made_by,
        }
    }

    #[test]
    fn a_sweep_names_its_builds_and_one_written_before_reads_with_none() {
        let made_by = vec![MadeBy {
            build: "lcut 0.1.0 0123456789abcdef".into(),
            isa: "avx2".into(),
        }];
        let new = sweep(made_by);
        let mut json = serde_json::to_value(&new).unwrap();
        assert_eq!(
            json["made_by"],
            serde_json::json!([{"build": "lcut 0.1.0 0123456789abcdef", "isa": "avx2"}])
        );
        assert_eq!(serde_json::from_value::<Sweep>(json.clone()).unwrap(), new);
        // a sweep.json (or a report's sweep) written before the field was
        json.as_object_mut().unwrap().remove("made_by");
        let old: Sweep = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(old, sweep(Vec::new()));
        json["made_by"] = "lcut 0.1.0".into();
        let err = serde_json::from_value::<Sweep>(json).unwrap_err();
        assert!(err.to_string().contains("expected a sequence"), "{err}");
    }
}
