//! One prompt run that serves every policy of an item it can. Most
//! policies run the prompt's lower layers, or all of them, exactly as the
//! full model does; they differ in what they keep, or in what they do with
//! the prompt after it ran:
//!
//! - a policy that [reuses a full prefill](Policy::reuses_full_prefill)
//!   (the full model, SPEED, kept-head plans, knockout bands) takes the run's
//!   state restricted to what it keeps;
//! - kvpress's presses run the prompt as the full model does and decide at
//!   its end: the run observes what all of them read of the prompt's
//!   queries, and each takes the state retargeted to itself;
//! - a policy whose prompt tokens leave the model at a layer with projected
//!   K/V (SwiftKV, POP) takes the run's lower layers and projects its upper
//!   K/V from the hidden states the run recorded entering that layer;
//! - SlimInfer runs the prompt as the full model does below its first cut:
//!   it takes those layers, the states the run recorded entering the cut
//!   and the queries its first stage reads, and runs its stages itself.
//!
//! Any other policy (a custom family, SlimInfer on a model whose layers
//! below its first cut slide, SwiftKV and SlimInfer on a model with
//! per-layer inputs) prefills on its own.

use lcut_model::probes::PromptRecord;
use lcut_model::{Decoder, Sequence};
use lcut_policy::{Policy, PressObservation, TokenPhases};

use crate::error::{EngineError, Result};
use crate::generate::prefill_before_decode_start;
use crate::prompt::PreparedPrompt;

/// A prompt's state before its decode start, run once at full depth, and
/// what that run recorded for the policies that branch from it.
pub(crate) struct SharedPrefix {
    /// The full-depth run (a press's, observing for every press in
    /// `presses`, when there are any).
    seq: Sequence,
    /// The presses the run observed for.
    presses: Vec<Policy>,
    /// What the run recorded for the policies that branch from it: the
    /// hidden states entering the layers where projected policies' tokens
    /// leave and where staged policies' first stages end, and the queries
    /// those stages read.
    record: PromptRecord,
}

impl SharedPrefix {
    /// Run `prompt`'s tokens before its decode start once, at full depth,
    /// for every policy of `policies` that can branch from it, with room for
    /// `extra` tokens after the prompt (chunks of `chunk`).
    pub(crate) fn run(
        model: &Decoder,
        prompt: &PreparedPrompt,
        policies: &[Policy],
        sizes: (usize, usize),
    ) -> Result<Self> {
        Self::run_with(model, prompt, policies, sizes, |_| true)
    }

    /// [`SharedPrefix::run`], told after each chunk how many prompt tokens
    /// have run (`on_chunk` returns false to cancel:
    /// [`EngineError::Cancelled`]).
    pub(crate) fn run_with(
        model: &Decoder,
        prompt: &PreparedPrompt,
        policies: &[Policy],
        (extra, chunk): (usize, usize),
        on_chunk: impl FnMut(usize) -> bool,
    ) -> Result<Self> {
        let layers = model.config().num_layers;
        let presses = shared_presses(policies);
        let mut seq = match presses.first() {
            Some(first) => model.new_press_prefix(&presses, prompt.phases(first)?)?,
            None => {
                let full = Policy::full(layers);
                model.new_sequence(full, prompt.phases(&full)?)?
            }
        };
        let mut record = record_for(model, prompt, policies)?;
        seq.reserve(prompt.len().saturating_add(extra));
        if !prefill_before_decode_start(
            model,
            &mut seq,
            prompt,
            chunk,
            Some(&mut record),
            on_chunk,
        )? {
            return Err(EngineError::Cancelled);
        }
        Ok(Self {
            seq,
            presses,
            record,
        })
    }

    /// Bytes the run of `prompt` for `policies` records for the branches
    /// (prefilled in chunks of `chunk`), beside its K/V.
    pub(crate) fn record_bytes(
        model: &Decoder,
        prompt: &PreparedPrompt,
        policies: &[Policy],
        chunk: usize,
    ) -> Result<u64> {
        let cfg = model.config();
        let tokens = prompt.decode_start;
        let chunks = tokens.div_ceil(chunk.max(1));
        let query_width = cfg.num_heads * cfg.head_dim;
        Ok(record_for(model, prompt, policies)?.bytes_for(
            tokens,
            chunks,
            (cfg.hidden_size, query_width),
        ))
    }

    /// The full model's own state before `prompt`'s decode start.
    pub(crate) fn full(&self, prompt: &PreparedPrompt) -> Result<Sequence> {
        let full = Policy::full(self.seq.caches().len());
        Ok(self.seq.restricted(full, prompt.phases(&full)?)?)
    }

    /// The state of `policy`, one that [reuses a full
    /// prefill](Policy::reuses_full_prefill), before the decode start of
    /// `phases`: this run restricted to what it keeps.
    pub(crate) fn restricted(&self, policy: Policy, phases: TokenPhases) -> Result<Sequence> {
        Ok(self.seq.restricted(policy, phases)?)
    }

    /// `policy`'s own state before the decode start, taken from this run
    /// (`None` where it cannot serve the policy, which then prefills on its
    /// own). The state is the policy's own prefill's: bit for bit where the
    /// policy runs the prompt whole (the presses), and to float rounding
    /// where it runs fewer rows through a layer than the full run did.
    pub(crate) fn branch(
        &self,
        model: &Decoder,
        policy: Policy,
        phases: TokenPhases,
    ) -> Result<Option<Sequence>> {
        Ok(match route(model, &self.presses, &policy, phases) {
            Route::Restricted => Some(self.restricted(policy, phases)?),
            Route::Retargeted => Some(self.seq.retargeted(policy)?),
            Route::Staged => Some(model.staged_from(&self.seq, policy, phases, &self.record)?),
            Route::Projected => {
                Some(model.projected_from(&self.seq, policy, phases, &self.record)?)
            }
            Route::Alone(_) => None,
        })
    }
}

/// How a policy takes its state before the decode start from a prompt run
/// shared at full depth, or why it runs its own prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The run's caches, restricted to the rows the policy keeps (the full
    /// model, SPEED, kept heads, knockout bands).
    Restricted,
    /// The run retargeted to the press, which decides at the decode start.
    Retargeted,
    /// SlimInfer: the run's layers below its first cut, the recorded states
    /// entering the cut and the queries its first stage reads.
    Staged,
    /// SwiftKV, POP: the run's lower layers, the upper K/V projected from the
    /// recorded states entering the layer where the prompt leaves.
    Projected,
    /// The policy runs its own prompt, for the reason given.
    Alone(&'static str),
}

/// How each of `policies` takes its state from one shared run of `prompt`
/// on `model` (the run the suite, the leaderboard and the sweep make).
pub fn routes(model: &Decoder, prompt: &PreparedPrompt, policies: &[Policy]) -> Result<Vec<Route>> {
    let presses = shared_presses(policies);
    policies
        .iter()
        .map(|p| Ok(route(model, &presses, p, prompt.phases(p)?)))
        .collect()
}

/// The layers, from the bottom, whose prompt rows a branch of `policy`
/// taken by `route` reads from the shared run (the branch computes the
/// rest of its K/V itself): every layer for a restricted or retargeted
/// branch, those below the first cut for a staged one, those below where
/// the prompt leaves for a projected one, none for a policy that runs alone.
pub(crate) fn layers_shared(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: &Policy,
    route: Route,
) -> Result<usize> {
    let layers = model.config().num_layers;
    Ok(match route {
        Route::Restricted | Route::Retargeted => layers,
        Route::Staged => staged_from_full(model, policy).unwrap_or(0),
        Route::Projected => {
            let rule = policy.visibility(prompt.phases(policy)?);
            let exits = model.projected_exits(rule.as_ref(), prompt.decode_start);
            exits.first().copied().unwrap_or(0)
        }
        Route::Alone(_) => 0,
    })
}

/// How `policy` takes its state from a shared run that observed for
/// `presses`.
fn route(model: &Decoder, presses: &[Policy], policy: &Policy, phases: TokenPhases) -> Route {
    if policy.reuses_full_prefill() {
        return Route::Restricted;
    }
    if policy.press().is_some() {
        return match presses.contains(policy) {
            true => Route::Retargeted,
            false => Route::Alone(
                "its statistics cover another span of the prompt than the other presses' do",
            ),
        };
    }
    let per_layer_inputs =
        "the model gives each layer an input of its own, which the shared run does not record";
    if policy.slim().is_some() {
        let first = policy.slim().and_then(|s| s.cuts().first().copied());
        return match staged_from_full(model, policy) {
            Some(_) => Route::Staged,
            None if first == Some(0) => Route::Alone("its first stage begins at layer 0"),
            None if model.has_layer_inputs() => Route::Alone(per_layer_inputs),
            None => Route::Alone(
                "a layer below its first cut slides: the shared run drops keys there that its \
                 first stage decides from",
            ),
        };
    }
    let rule = policy.visibility(phases);
    match model
        .projected_exits(rule.as_ref(), phases.decode_start())
        .len()
    {
        0 => Route::Alone("lcut takes no state of this family from a full run"),
        _ if model.has_layer_inputs() => Route::Alone(per_layer_inputs),
        1 => Route::Projected,
        _ => Route::Alone("its prompt tokens leave the model at more than one layer"),
    }
}

/// What a full run of `prompt` records for the policies of `policies`
/// that branch from it: the hidden states entering the layers where
/// projected policies' tokens leave and where staged policies' first
/// stages end, and the queries those stages read.
fn record_for(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policies: &[Policy],
) -> Result<PromptRecord> {
    let mut record = PromptRecord::default();
    for policy in policies {
        let rule = policy.visibility(prompt.phases(policy)?);
        // where projected policies' tokens leave
        record = record.and_entering(model.projected_exits(rule.as_ref(), prompt.decode_start));
        // what a staged policy's first stage reads
        if let Some(first) = staged_from_full(model, policy) {
            let window = rule.dynamic().and_then(|d| d.query_window(first - 1));
            record = record
                .and_entering([first])
                .and_queries(window.map(|w| (first - 1, w)));
        }
    }
    Ok(record)
}

/// The first stage cut of a policy that prefills in stages (SlimInfer)
/// whose first stage a full run can stand in for: none of the layers below
/// it slides (the full run drops keys there that the stage decides from)
/// and the model has no per-layer inputs (the run does not record them).
fn staged_from_full(model: &Decoder, policy: &Policy) -> Option<usize> {
    let first = *policy.slim()?.cuts().first()?;
    (first > 0 && !model.slides_below(first) && !model.has_layer_inputs()).then_some(first)
}

/// The presses of `policies` one prompt run can observe for: each whose
/// observation joins the others' (Expected Attention's statistics over
/// another span do not; such a press runs its own prompt).
fn shared_presses(policies: &[Policy]) -> Vec<Policy> {
    let mut observe = PressObservation::default();
    policies
        .iter()
        .copied()
        .filter(|p| {
            let Some(params) = p.press() else {
                return false;
            };
            match observe.union(PressObservation::of(params)) {
                Some(joined) => {
                    observe = joined;
                    true
                }
                None => false,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_model::{DType, Device};
    use lcut_policy::PolicySpec;

    fn routes_on(case: &str, policies: &[&str]) -> Vec<Route> {
        let model = Decoder::load(&lcut_testkit::oracle_case(case), DType::F32, &Device::Cpu)
            .expect("the reference model loads");
        let layers = model.config().num_layers;
        let policies: Vec<Policy> = policies
            .iter()
            .map(|p| p.parse::<PolicySpec>().unwrap().resolve(layers).unwrap())
            .collect();
        let prompt = PreparedPrompt::from_ids((1..30).collect(), Some(24)).unwrap();
        routes(&model, &prompt, &policies).unwrap()
    }

    /// Each family takes its state from the shared run as it can; a press
    /// whose statistics cover another span, and SlimInfer where a layer
    /// below its first cut slides, run their own prompt and say why.
    #[test]
    fn each_policy_routes_as_the_shared_run_can_serve_it() {
        let policies = [
            "full",
            "speed:2+bos",
            "snapkv:0.5+window:4",
            "expected:0.5+sink:2",
            "expected:0.5+sink:3",
            "slim:2@50%+block:2+unit:1",
            "swiftkv:2+bos",
        ];
        let got = routes_on("llama-gqa", &policies);
        use Route::*;
        assert_eq!(got[..3], [Restricted, Restricted, Retargeted]);
        assert_eq!(got[3], Retargeted);
        assert!(
            matches!(got[4], Alone(why) if why.contains("another span")),
            "{got:?}"
        );
        assert_eq!(got[5..], [Staged, Projected]);
        let sliding = routes_on("gemma3-sliding", &["slim:2@50%+block:2+unit:1"]);
        assert!(
            matches!(sliding[0], Alone(why) if why.contains("slides")),
            "{sliding:?}"
        );
    }
}
