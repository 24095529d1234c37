//! A sweep's comparison axis: any policy (SlimInfer above all) measured on
//! the same prompts and the same full-model continuations as the SPEED
//! cutoffs, each with a fresh prefill of its own (a SlimInfer selection is
//! made from its own states) and its decode steps fed one at a time (its
//! decisions move with each step). Costs are measured on the prompts.

use candle_core::Tensor;
use lcut_diag::{FlopShape, policy_prefill_flops};
use lcut_model::probes::PromptMassProbe;
use lcut_model::{Decoder, LogitRows, Probe, Sequence};
use lcut_policy::{
    Budget, CutSpec, KvCost, Phase, Policy, PolicySpec, SlimOptions, SlimSelection, SlimSpec,
};
use lcut_trace::{PolicyCounts, PolicyPoint};

use super::quality::{Totals, score};
use crate::error::{EngineError, Result};
use crate::generate::prefill_prefix;
use crate::prompt::PreparedPrompt;
use crate::shared_prefix::SharedPrefix;

/// A policy on the comparison axis, with the SPEED point it is paired with.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisPolicy {
    /// The policy.
    pub spec: PolicySpec,
    /// The SPEED policy holding the same K/V, when the pair was generated.
    pub paired_with: Option<String>,
}

/// §4.7's pairs at equal held K/V: for each SPEED+BoS cutoff `C` above
/// `first_cut` (and below the depth), one SlimInfer cut at `first_cut`
/// keeping the share `x = (C − c_1)/(L − c_1)` of the prompt, so that
/// `c_1·P + (L − c_1)·x·P = C·P`; `options` apply to every pair. Each
/// pair is SPEED then SlimInfer, both measured on the prompts.
pub fn equal_kv_pairs(
    num_layers: usize,
    cuts: &[usize],
    first_cut: usize,
    options: SlimOptions,
) -> Result<Vec<AxisPolicy>> {
    let mut out = Vec::new();
    for &c in cuts.iter().filter(|&&c| c > first_cut && c < num_layers) {
        let share = (c - first_cut) as f64 / (num_layers - first_cut) as f64;
        let basis_points = (share * 10_000.0).round() as u32;
        let spec = SlimSpec::new(
            &[(CutSpec::Layers(first_cut), Budget::Share(basis_points))],
            options,
        )
        .map_err(|reason| {
            EngineError::Policy(lcut_policy::PolicyError::Malformed {
                text: format!("equal-K/V pair for speed:{c}+bos"),
                reason,
            })
        })?;
        let speed: PolicySpec = format!("speed:{c}+bos").parse()?;
        out.push(AxisPolicy {
            paired_with: Some(spec.to_string()),
            spec: speed,
        });
        out.push(AxisPolicy {
            spec: PolicySpec::slim(spec),
            paired_with: Some(format!("speed:{c}+bos")),
        });
    }
    Ok(out)
}

/// Running sums of one axis policy over prompts.
#[derive(Debug, Clone, Default)]
pub(super) struct AxisTotals {
    pub(super) quality: Totals,
    pub(super) held: f64,
    resident: f64,
    pub(super) full: f64,
    flops: f64,
    flops_full: f64,
    equal_kv_cutoff: f64,
    prompts: usize,
    steps: usize,
    swapped_steps: usize,
    recall: Vec<f64>,
    precision: Vec<f64>,
}

impl AxisTotals {
    /// The point as reported.
    pub(super) fn point(&self, policy: &AxisPolicy) -> PolicyPoint {
        let n = self.quality.tokens.max(1) as f64;
        let ratio = |a: f64, b: f64| (a / b.max(f64::MIN_POSITIVE)) as f32;
        PolicyPoint {
            policy: policy.spec.to_string(),
            paired_with: policy.paired_with.clone(),
            top1_agreement: (self.quality.agree / n) as f32,
            mean_kl: (self.quality.kl / n) as f32,
            nll: (self.quality.nll / n) as f32,
            kv_ratio: ratio(self.held, self.full),
            resident_ratio: ratio(self.resident, self.full),
            prefill_ratio: ratio(self.flops, self.flops_full),
            equal_kv_cutoff: (self.equal_kv_cutoff / self.prompts.max(1) as f64) as f32,
            swap_rate: ratio(self.swapped_steps as f64, self.steps.max(1) as f64),
            scorer_precision: self
                .precision
                .iter()
                .map(|p| (p / self.prompts.max(1) as f64) as f32)
                .collect(),
            attention_recall: self
                .recall
                .iter()
                .map(|r| (r / self.prompts.max(1) as f64) as f32)
                .collect(),
            counts: Some(PolicyCounts {
                tokens: self.quality.tokens,
                prompts: self.prompts,
                steps: self.steps,
                full_kv_bytes: self.full,
                full_prefill_flops: self.flops_full,
            }),
        }
    }
}

/// The prefill FLOPs a policy's run of `len` prompt tokens is predicted
/// to take over the full model's, from what each layer of `vis` ran and
/// projected (`lcut bench`'s `FLOP x`; 1 minus it is the compute saved).
pub fn predicted_prefill_flops_ratio(
    model: &Decoder,
    vis: &dyn lcut_policy::Visibility,
    len: usize,
) -> f64 {
    let shape = flop_shape(model);
    let full = lcut_policy::Policy::full(model.config().num_layers)
        .visibility(lcut_policy::TokenPhases::all_decode());
    policy_prefill_flops(&shape, vis, len) / policy_prefill_flops(&shape, full.as_ref(), len)
}

/// The FLOP model's shape of a decoder: its layers' own coefficients where
/// they differ from the uniform shape (Gemma 4, Qwen3.5, experts), none
/// where every layer is that shape.
pub(super) fn flop_shape(model: &Decoder) -> FlopShape {
    let c = model.config();
    FlopShape {
        num_layers: c.num_layers,
        hidden_size: c.hidden_size,
        num_heads: c.num_heads,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        intermediate_size: c.intermediate_size,
        vocab_size: c.vocab_size,
        windows: c.sliding_window.clone(),
        layers: Vec::new(),
    }
    .with_layers(lcut_model::memory::layer_flops(c))
}

/// Run `prompt` under `policy` (its state before the decode start taken
/// from `shared`, the prompt's full-depth run, where that serves it, else
/// prefilled in chunks of `chunk`; the decode-phase prompt tokens as one
/// chunk, then each token of `continuation` but the last one at a time)
/// and add its measurement ([`add_forced`]) to `totals`.
pub(super) fn measure(
    model: &Decoder,
    (prompt, shared): (&PreparedPrompt, &SharedPrefix),
    policy: Policy,
    continuation: &[u32],
    reference: (&Tensor, &PromptMassProbe),
    chunk: usize,
    totals: &mut AxisTotals,
) -> Result<()> {
    if continuation.is_empty() {
        return Ok(());
    }
    let mut seq = match shared.branch(model, policy, prompt.phases(&policy)?)? {
        Some(seq) => seq,
        None => prefill_prefix(model, prompt, policy, continuation.len(), chunk)?,
    };
    let logits = forced_logits(model, &mut seq, prompt, continuation, None)?;
    add_forced(
        model,
        &seq,
        prompt,
        (&logits, continuation),
        reference,
        totals,
    )
}

/// Score `logits`, the rows of the run in `seq` teacher-forced on
/// `continuation`, against `reference` (the full model's rows predicting
/// it) and add quality, costs and attention recall (the share of the full
/// model's decode attention on prompt tokens that lands on tokens whose K/V
/// the policy keeps at each layer, from `mass`) to `totals`.
pub(crate) fn add_forced(
    model: &Decoder,
    seq: &Sequence,
    prompt: &PreparedPrompt,
    (logits, continuation): (&Tensor, &[u32]),
    (reference, mass): (&Tensor, &PromptMassProbe),
    totals: &mut AxisTotals,
) -> Result<()> {
    let t = score(reference, logits, continuation)?;
    add_scored(model, seq, prompt, (t, mass), totals);
    Ok(())
}

/// [`add_forced`] for rows already scored (`t`, the sums over the
/// continuation): the quality, costs and recall of the run in `seq`.
pub(crate) fn add_scored(
    model: &Decoder,
    seq: &Sequence,
    prompt: &PreparedPrompt,
    (t, mass): (Totals, &PromptMassProbe),
    totals: &mut AxisTotals,
) {
    totals.quality.add(t);
    add_costs(model, seq, prompt, mass, totals);
    // kept: the layer holds K/V of the token (its own, or projected)
    let phases = seq.phases();
    let recall = mass.recall(
        |pos| phases.phase(pos) == Phase::Prefill,
        |layer, pos| seq.retains_kv(layer, pos),
    );
    totals.recall.resize(recall.len(), 0.0);
    for (sum, r) in totals.recall.iter_mut().zip(recall) {
        *sum += f64::from(r);
    }
    totals.prompts += 1;
}

/// From `seq` at `prompt`'s decode start, feed the decode-phase prompt
/// tokens and `continuation` but its last token one at a time: the logits
/// [n, V] of the rows that predict it; `probe`, when given, sees every pass.
pub(super) fn forced_logits(
    model: &Decoder,
    seq: &mut Sequence,
    prompt: &PreparedPrompt,
    continuation: &[u32],
    mut probe: Option<&mut dyn Probe>,
) -> Result<Tensor> {
    let s = prompt.decode_start;
    let mut rows = Vec::with_capacity(continuation.len());
    let first = model.forward(seq, &prompt.ids[s..], LogitRows::Last, probe.as_deref_mut())?;
    rows.push(first.logits.ok_or(EngineError::MissingLogits {
        position: prompt.len() - 1,
    })?);
    for &token in &continuation[..continuation.len().saturating_sub(1)] {
        let out = model.forward(seq, &[token], LogitRows::Last, probe.as_deref_mut())?;
        rows.push(out.logits.ok_or(EngineError::MissingLogits {
            position: seq.len() - 1,
        })?);
    }
    Ok(Tensor::cat(&rows, 0)?)
}

/// Add the costs of the run in `seq` to `totals`, as its visibility counts
/// them: K/V held and resident (the full model's beside them), prefill
/// FLOPs, the equal-K/V cutoff and, for SlimInfer, its scorer's precision
/// against `mass` and its swaps.
fn add_costs(
    model: &Decoder,
    seq: &Sequence,
    prompt: &PreparedPrompt,
    mass: &PromptMassProbe,
    totals: &mut AxisTotals,
) {
    let s = prompt.decode_start;
    let layers = model.config().num_layers;
    let phases = seq.phases();
    let cost = KvCost {
        anchors: phases.anchor_len(),
        prefill: phases.prefill_len(),
        decode: seq.len() - s,
    };
    let kv_heads = model.config().num_kv_heads;
    let b = model.kv_shape().bytes_per_token_layer() as f64 / kv_heads as f64;
    totals.held += seq.kv_bytes_held() as f64;
    let windows = &model.config().sliding_window;
    totals.full += cost.bytes(&Policy::full(layers), &model.kv_shape(), windows) as f64;
    let shape = flop_shape(model);
    let n = prompt.len();
    let full = Policy::full(layers).visibility(lcut_policy::TokenPhases::all_decode());
    totals.flops_full += policy_prefill_flops(&shape, full.as_ref(), n);
    let vis = seq.visibility();
    let counts = vis.accounting();
    totals.resident +=
        b * counts.resident_head_rows_windowed(cost.decode, kv_heads, windows) as f64;
    totals.flops += policy_prefill_flops(&shape, vis, n);
    totals.equal_kv_cutoff += counts.equal_kv_cutoff(kv_heads);
    if let Some(run) = seq.slim() {
        // SlimInfer's own records: how well its scorer chose, how often it swapped
        let precision = scorer_precision(mass, run.selection());
        totals.precision.resize(precision.len(), 0.0);
        for (sum, p) in totals.precision.iter_mut().zip(precision) {
            *sum += p;
        }
        totals.steps += run.steps().len();
        totals.swapped_steps += run
            .steps()
            .iter()
            .filter(|st| st.cuts.iter().any(|t| t.swapped))
            .count();
    }
}

/// Per cut, the share of the blocks the prefill kept that are also among
/// the same number of blocks the full model's decode queries read most at
/// and above the cut (1 when nothing is pruned).
fn scorer_precision(mass: &PromptMassProbe, sel: &SlimSelection) -> Vec<f64> {
    let cuts = sel.params().cuts();
    (0..cuts.len())
        .map(|i| {
            let prunable: Vec<usize> = sel.prunable_blocks().collect();
            let kept: Vec<usize> = sel
                .kept_blocks(i)
                .into_iter()
                .filter(|b| prunable.contains(b))
                .collect();
            if kept.is_empty() || kept.len() == prunable.len() {
                return 1.0;
            }
            let block_mass = |b: usize| -> f64 {
                mass.mass[cuts[i]..]
                    .iter()
                    .map(|row| sel.block_positions(b).map(|p| row[p]).sum::<f64>())
                    .sum()
            };
            let mut by_mass: Vec<(usize, f64)> =
                prunable.iter().map(|&b| (b, block_mass(b))).collect();
            by_mass.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let hits = by_mass
                .iter()
                .take(kept.len())
                .filter(|(b, _)| kept.contains(b))
                .count();
            hits as f64 / kept.len() as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_kv_pairs_hold_what_the_speed_cut_holds() {
        let o = SlimOptions {
            block: 8,
            unit: 2,
            ..SlimOptions::default()
        };
        let pairs = equal_kv_pairs(4, &[1, 2, 3, 4], 1, o).unwrap();
        let names: Vec<String> = pairs.iter().map(|p| p.spec.to_string()).collect();
        // bundled 4-layer model: speed:2 <-> slim:1@33.33%, speed:3 <-> slim:1@66.67%
        assert_eq!(
            names,
            vec![
                "speed:2+bos",
                "slim:1@33.33%+block:8+unit:2",
                "speed:3+bos",
                "slim:1@66.67%+block:8+unit:2"
            ]
        );
        assert_eq!(pairs[3].paired_with.as_deref(), Some("speed:3+bos"));
        assert_eq!(
            pairs[2].paired_with.as_deref(),
            Some("slim:1@66.67%+block:8+unit:2")
        );
        // held K/V: c1·P + (L − c1)·x·P = C·P
        let p = pairs[3].spec.resolve(4).unwrap();
        let params = p.slim().unwrap();
        assert!((params.equal_kv_cutoff(4, 900, &[600]) - 3.0).abs() < 1e-9);
    }
}
