//! Routing of a mixture-of-experts model's decode tokens, as the
//! diagnostics record it: a probe that keeps each routed row's normalised
//! entropy and chosen experts ([`RoutingProbe`], composed with any other
//! probe by [`lcut_model::probes::Beside`]), the routing of a run's decode steps as a
//! trace holds it, and a policy's top-k overlap with the full model,
//! teacher-forced on the same tokens ([`routing_overlap_of`]). The
//! statistics themselves are [`lcut_diag`]'s.

use std::collections::HashMap;

use lcut_model::{ModelConfig, Probe, RoutingView};
use lcut_policy::Policy;
use lcut_trace::{RoutingOverlap, RoutingTrace, Tensor2};

use super::policy_axis::forced_logits;
use super::sweep::Forced;
use crate::error::{EngineError, Result};
use crate::generate::prefill_prefix;
use crate::prompt::PreparedPrompt;
use crate::session::Session;

type ProbeResult<T> = std::result::Result<T, lcut_model::ModelError>;

/// One routed row: the router's normalised entropy and the experts chosen,
/// most probable first.
#[derive(Debug, Clone, PartialEq)]
struct Routed {
    entropy: f32,
    experts: Vec<u32>,
}

/// Records, at every layer of experts, the routing of the tokens at
/// positions `from` and later: per (layer, position), the router's entropy
/// over `ln E` ([`lcut_diag::routing_entropy`]) and the chosen experts. A
/// row seen twice keeps the later one.
#[derive(Debug, Clone, Default)]
pub struct RoutingProbe {
    from: usize,
    rows: HashMap<(usize, usize), Routed>,
}

impl RoutingProbe {
    /// A probe recording the rows at positions `from` and later.
    pub fn new(from: usize) -> Self {
        Self {
            from,
            rows: HashMap::new(),
        }
    }

    /// A probe holding this one's rows at the layers below `layer`, and
    /// recording from the same position on: for a pass that starts at
    /// `layer` from the states this probe's pass had there, which routed
    /// the tokens below it exactly as this pass did.
    pub fn below(&self, layer: usize) -> Self {
        let rows = self
            .rows
            .iter()
            .filter(|((l, _), _)| *l < layer)
            .map(|(k, r)| (*k, r.clone()))
            .collect();
        Self {
            from: self.from,
            rows,
        }
    }

    /// Rows recorded so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row has been recorded.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The routing of the tokens at `positions` (a trace's decode steps) at
    /// every sparse layer of a model of `cfg`, as a trace holds it; `None`
    /// for a model without experts. A position not routed at a sparse layer
    /// is an error naming both.
    pub fn trace(&self, cfg: &ModelConfig, positions: &[usize]) -> Result<Option<RoutingTrace>> {
        let Some(e) = cfg.experts else {
            return Ok(None);
        };
        let layers: Vec<usize> = (0..cfg.num_layers)
            .filter(|&l| cfg.sparse_layers.get(l).copied().unwrap_or(false))
            .collect();
        let (n, t) = (layers.len(), positions.len());
        let mut entropy = Vec::with_capacity(n * t);
        let mut experts = Vec::with_capacity(n * t * e.top_k);
        for &layer in &layers {
            for &position in positions {
                let row = self
                    .rows
                    .get(&(layer, position))
                    .ok_or(EngineError::MissingRouting { layer, position })?;
                if row.experts.len() != e.top_k {
                    return Err(EngineError::MissingRouting { layer, position });
                }
                entropy.push(row.entropy);
                experts.extend_from_slice(&row.experts);
            }
        }
        Ok(Some(RoutingTrace {
            num_experts: e.num_experts,
            top_k: e.top_k,
            layers,
            entropy: Tensor2::new([n, t], entropy)?,
            experts,
            overlap: None,
        }))
    }
}

impl Probe for RoutingProbe {
    fn wants_routing(&self, _layer: usize) -> bool {
        true
    }

    fn on_routing(&mut self, view: RoutingView<'_>) -> ProbeResult<()> {
        let r = view.routing;
        for (i, &position) in view.positions.iter().enumerate() {
            if position < self.from {
                continue;
            }
            let (Some(probs), Some(chosen)) = (r.probs.get(i), r.experts.get(i)) else {
                continue;
            };
            let routed = Routed {
                entropy: lcut_diag::routing_entropy(probs),
                experts: chosen.iter().map(|&x| x as u32).collect(),
            };
            self.rows.insert((view.layer, position), routed);
        }
        Ok(())
    }
}

/// The positions of the decode steps that predict `generated` tokens after
/// `prompt`: the last prompt token's and each generated token's but the
/// last (a trace's `query_positions`).
pub fn decode_step_positions(prompt: &PreparedPrompt, generated: usize) -> Vec<usize> {
    let first = prompt.len() - 1;
    (first..first + generated).collect()
}

/// How far `policy`'s routing of `prompt`'s decode steps departs from the
/// full model's, both teacher-forced on the same `generated` tokens: per
/// sparse layer and step, `|chosen_policy ∩ chosen_full| / k`
/// ([`lcut_diag::routing_overlap`]). The prompt up to its decode start is
/// prefilled in chunks of `chunk` at full depth once, and the policy takes
/// its state from that run where it can (the shared prompt run: restricted,
/// retargeted, projected or staged, as the sweep does); the decode-phase
/// tokens then run in one pass, or one at a time for a policy that decides
/// as it decodes. `None` for a model without experts.
pub fn routing_overlap_of(
    session: &Session,
    prompt: &PreparedPrompt,
    generated: &[u32],
    policy: Policy,
    chunk: usize,
) -> Result<Option<RoutingOverlap>> {
    overlap_from(session, prompt, (generated, chunk), policy, true)
}

/// [`routing_overlap_of`], the policy taking its state from the shared
/// prompt run when `branch` and it can, else from a prefill of its own.
fn overlap_from(
    session: &Session,
    prompt: &PreparedPrompt,
    (generated, chunk): (&[u32], usize),
    policy: Policy,
    branch: bool,
) -> Result<Option<RoutingOverlap>> {
    let model = &session.model;
    let cfg = model.config();
    if cfg.experts.is_none() {
        return Ok(None);
    }
    let positions = decode_step_positions(prompt, generated.len());
    let from = prompt.len() - 1;
    let mut full = RoutingProbe::new(from);
    let mut under = RoutingProbe::new(from);
    if !generated.is_empty() {
        let run = (generated.to_vec(), chunk);
        let branches = if branch { vec![policy] } else { Vec::new() };
        let forced = Forced::given(session, prompt, run, &branches, Some(&mut full))?;
        if policy.reuses_full_prefill() {
            forced.restricted_with(model, prompt, policy, Some(&mut under))?;
        } else {
            let branched = match branch {
                true => forced.branch(model, prompt, policy)?,
                false => None,
            };
            let mut seq = match branched {
                Some(seq) => seq,
                None => prefill_prefix(model, prompt, policy, generated.len(), chunk)?,
            };
            forced_logits(model, &mut seq, prompt, generated, Some(&mut under))?;
        }
    }
    let (Some(full), Some(under)) = (full.trace(cfg, &positions)?, under.trace(cfg, &positions)?)
    else {
        return Ok(None);
    };
    Ok(Some(RoutingOverlap {
        policy: policy.to_string(),
        overlap: lcut_diag::routing_overlap(&under, &full)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// A press, SlimInfer and SwiftKV take their state from the shared
    /// prompt run and route their decode steps exactly as from a prefill
    /// of their own.
    #[test]
    fn a_branched_policy_routes_as_its_own_prefill() {
        let case = lcut_testkit::oracle_case("moe/qwen3moe-experts");
        let session = Session::load(&case, DType::F32, &Device::Cpu).unwrap();
        let ids = lcut_testkit::oracle_ids("moe/qwen3moe-experts").unwrap();
        let prompt = PreparedPrompt::from_ids(ids[..24].to_vec(), Some(21)).unwrap();
        let generated = &ids[24..30];
        for text in [
            "snapkv:0.5+window:2",
            "slim:2@50%+block:2+unit:1",
            "swiftkv:2+bos",
        ] {
            let spec: lcut_policy::PolicySpec = text.parse().unwrap();
            let policy = session.resolve_policy(&spec).unwrap();
            let run = |branch| {
                overlap_from(&session, &prompt, (generated, 8), policy, branch)
                    .unwrap()
                    .unwrap()
            };
            let (branched, alone) = (run(true), run(false));
            assert_eq!(branched.overlap, alone.overlap, "{text}");
            // the policy changed something: the test compares real routings
            assert!(branched.overlap.data().iter().any(|&x| x < 1.0), "{text}");
        }
    }

    #[test]
    fn decode_steps_start_at_the_last_prompt_token() {
        let prompt = PreparedPrompt::from_ids(vec![1, 5, 6, 7], Some(2)).unwrap();
        assert_eq!(decode_step_positions(&prompt, 3), vec![3, 4, 5]);
        assert!(decode_step_positions(&prompt, 0).is_empty());
    }
}
