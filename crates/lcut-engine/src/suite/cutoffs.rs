//! Training-free accuracy of SPEED at each cutoff on a suite: one full
//! prefill per item up to the decode start, reused for every cutoff (the
//! same states SPEED computes there), then each cutoff's own greedy answer,
//! decoded side by side in as few groups as the memory free allows (the same
//! answers in any grouping), scored by the item's rule. What calibrates the
//! recommender.

use lcut_diag::accuracy_point;
use lcut_policy::{Anchors, Policy, PolicyKind};
use lcut_trace::{CutoffAccuracy, anchors_label};

use super::SuiteItem;
use super::branch_memory::{ItemMemory, budget_or_free};
use crate::diagnose::shard_indices;
use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationConfig, prefill_prefix};
use crate::session::Session;

/// Settings of [`accuracy_by_cutoff`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutoffEvalOptions {
    /// Cutoffs to score (the depth is the full model).
    pub cuts: Vec<usize>,
    /// Anchor settings scored at every cutoff (e.g. BoS, then none), each
    /// from the same full prefill of an item.
    pub anchors: Vec<Anchors>,
    /// Most new tokens of each greedy answer.
    pub max_new_tokens: usize,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Score shard `(i, n)` only: items i, i+n, ... (all when absent).
    pub shard: Option<(usize, usize)>,
    /// Bytes an item's answers may hold beside the weights; `None`: the
    /// [planned share](super::planned_share) of what the device has free.
    pub memory_budget: Option<u64>,
}

impl CutoffEvalOptions {
    /// The bytes an item's run may hold: the budget given, else the planned
    /// share of what the session's device has free now (`None` when it
    /// cannot say).
    pub fn memory_budget_or_free(&self, session: &Session) -> Option<u64> {
        budget_or_free(self.memory_budget, session)
    }
}

/// SPEED at each of `opts.anchors` × `opts.cuts` (anchors outer).
fn cutoff_policies(session: &Session, opts: &CutoffEvalOptions) -> Result<Vec<Policy>> {
    let layers = session.model.config().num_layers;
    Ok(opts
        .anchors
        .iter()
        .flat_map(|&a| opts.cuts.iter().map(move |&c| (c, a)))
        .map(|(c, a)| Policy::new(PolicyKind::Speed, c, layers, a))
        .collect::<std::result::Result<Vec<_>, _>>()?)
}

/// What each item of `opts.shard` holds under `opts`'s cutoffs, the item
/// that holds the most first checked: an item that does not fit one cutoff
/// at a time is refused (with the figures) before any item runs. Returns
/// the largest (`None` for no items).
pub fn cutoff_memory(
    session: &Session,
    items: &[SuiteItem],
    opts: &CutoffEvalOptions,
) -> Result<Option<ItemMemory>> {
    let policies = cutoff_policies(session, opts)?;
    let mut largest: Option<ItemMemory> = None;
    for k in shard_indices(items.len(), opts.shard)? {
        let prompt = items[k].prepare(session)?;
        let m = ItemMemory::of_cutoffs(&session.model, &prompt, &policies, opts.max_new_tokens)?;
        if largest.as_ref().is_none_or(|l| m.total() > l.total()) {
            largest = Some(m);
        }
    }
    if let Some(m) = &largest {
        m.groups(opts.memory_budget_or_free(session))?;
    }
    Ok(largest)
}

/// Accuracy of SPEED at each of `opts.anchors` × `opts.cuts` (anchors
/// outer) on `items`, or on the shard `opts.shard` of them; `on_item(done,
/// total)` after each item returns false to cancel.
pub fn accuracy_by_cutoff(
    session: &Session,
    items: &[SuiteItem],
    opts: &CutoffEvalOptions,
    on_item: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<Vec<CutoffAccuracy>> {
    let model = &session.model;
    let layers = model.config().num_layers;
    let policies = cutoff_policies(session, opts)?;
    cutoff_memory(session, items, opts)?;
    let budget = opts.memory_budget_or_free(session);
    let mut correct = vec![0usize; policies.len()];
    let mine = shard_indices(items.len(), opts.shard)?;
    for (i, item) in mine.iter().map(|&k| &items[k]).enumerate() {
        let prompt = item.prepare(session)?;
        let (max_new, chunk) = (opts.max_new_tokens, opts.prefill_chunk.max(1));
        let groups = ItemMemory::of_cutoffs(model, &prompt, &policies, max_new)?.groups(budget)?;
        let prefix = prefill_prefix(model, &prompt, Policy::full(layers), max_new, chunk)?;
        let config = GenerationConfig {
            prefill_chunk: chunk,
            ..session.greedy_config(max_new)
        };
        for group in groups {
            let mut answers = policies[group.clone()]
                .iter()
                .map(|policy| {
                    let seq = prefix.restricted(*policy, prompt.phases(policy)?)?;
                    Generation::from_prefix(model, prompt.clone(), seq, config.clone())
                })
                .collect::<Result<Vec<_>>>()?;
            // the group's answers decoded side by side
            loop {
                let mut gens: Vec<&mut Generation<'_>> = answers.iter_mut().collect();
                let steps = Generation::step_together(&mut gens, |_, own| own)?;
                if steps.iter().all(Option::is_none) {
                    break;
                }
            }
            for (k, answer) in group.zip(&answers) {
                let text = session.generated_text(answer.produced());
                correct[k] += usize::from(item.is_correct(&text));
            }
        }
        if !on_item(i + 1, mine.len()) {
            return Err(EngineError::Cancelled);
        }
    }
    let n = mine.len();
    Ok(policies
        .iter()
        .zip(correct)
        .map(|(p, k)| accuracy_point(p.l_cut(), &anchors_label(p.anchors()), k, n))
        .collect())
}

/// The smallest cutoff whose SPEED+BoS accuracy is within `tolerance`
/// (e.g. 0.02) of the deepest BoS cutoff's (the full model when the depth
/// is among the cuts); anchor-free points are not read.
pub fn smallest_cut_within(points: &[CutoffAccuracy], tolerance: f32) -> Option<usize> {
    let bos = || points.iter().filter(|p| p.keeps_bos());
    let full = bos().max_by_key(|p| p.l_cut)?;
    bos()
        .filter(|p| p.accuracy >= full.accuracy - tolerance)
        .map(|p| p.l_cut)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(l_cut: usize, accuracy: f32) -> CutoffAccuracy {
        CutoffAccuracy {
            l_cut,
            anchors: "bos".into(),
            correct: 0,
            n: 100,
            accuracy,
            interval: [0.0, 1.0],
        }
    }

    #[test]
    fn the_smallest_cut_within_tolerance_of_full() {
        let pts = [
            point(20, 0.1),
            point(26, 0.7),
            point(28, 0.725),
            point(30, 0.74),
        ];
        assert_eq!(smallest_cut_within(&pts, 0.02), Some(28));
        assert_eq!(smallest_cut_within(&pts, 0.05), Some(26));
        assert_eq!(smallest_cut_within(&[], 0.02), None);
        // anchor-free points, better or worse, do not move the answer
        let mut with_free = pts.to_vec();
        for (c, a) in [(20, 0.9), (30, 0.1)] {
            with_free.push(CutoffAccuracy {
                anchors: "none".into(),
                ..point(c, a)
            });
        }
        assert_eq!(smallest_cut_within(&with_free, 0.02), Some(28));
        with_free.retain(|p| !p.keeps_bos());
        assert_eq!(smallest_cut_within(&with_free, 0.02), None);
    }
}
