//! Timing in a leaderboard run: on the first items of each task, the full
//! model and then each policy run the item alone, one after the other
//! (interleaved, so that a change of load on the machine falls on all of
//! them alike), for a fixed number of new tokens; TTFT and TPOT are read
//! from each run, with the K/V it holds and the prefill FLOPs it is
//! predicted to take.

use lcut_model::Decoder;
use lcut_policy::Policy;
use serde::{Deserialize, Serialize};

use crate::diagnose::predicted_prefill_flops_ratio;
use crate::error::Result;
use crate::generate::{Generation, GenerationConfig};
use crate::prompt::PreparedPrompt;
use crate::suite::SuiteItem;

/// How the first items of each task are timed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimingSettings {
    /// Items timed per task (the first ones in suite order); 0: none.
    pub items_per_task: usize,
    /// New tokens of each timed run (no stop token ends it).
    pub new_tokens: usize,
    /// Rounds of every policy per timed item; the median is kept.
    pub rounds: usize,
    /// The tasks timed (empty: every task). Prompts of one length cost
    /// about the same whatever their task, so a long grid can time one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
}

impl Default for TimingSettings {
    fn default() -> Self {
        Self {
            items_per_task: 1,
            new_tokens: 16,
            rounds: 1,
            tasks: Vec::new(),
        }
    }
}

/// One configuration's timed run of one item.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ItemTiming {
    /// Time to first token, seconds (median of the rounds).
    pub ttft_s: f64,
    /// Time per output token after the first, seconds (median).
    pub tpot_s: f64,
    /// K/V bytes held at the end of the run.
    pub kv_bytes_held: u64,
    /// Predicted prefill FLOPs over the full model's.
    pub prefill_flops_ratio: f64,
}

/// The suite indices timed: the first `settings.items_per_task` items of
/// each kind (of the kinds `settings.tasks` names, when it names any), in
/// suite order (the same whichever shard runs them).
pub fn timed_items(items: &[SuiteItem], settings: &TimingSettings) -> Vec<usize> {
    let per_task = settings.items_per_task;
    let named = |kind: &str| settings.tasks.is_empty() || settings.tasks.iter().any(|t| t == kind);
    let mut counts: Vec<(&str, usize)> = Vec::new();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate().filter(|(_, it)| named(&it.kind)) {
        let n = match counts.iter_mut().find(|(k, _)| *k == item.kind) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                counts.push((&item.kind, 1));
                1
            }
        };
        if n <= per_task {
            out.push(i);
        }
    }
    out
}

/// Every policy on `prompt`, alone, `settings.rounds` rounds of all of
/// them in order (the full model first): each configuration's median TTFT
/// and TPOT, its K/V held and its predicted prefill FLOPs.
pub fn time_item(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policies: &[Policy],
    settings: &TimingSettings,
    prefill_chunk: usize,
) -> Result<Vec<ItemTiming>> {
    let rounds = settings.rounds.max(1);
    let mut runs: Vec<Vec<ItemTiming>> = vec![Vec::with_capacity(rounds); policies.len()];
    for _ in 0..rounds {
        for (k, policy) in policies.iter().enumerate() {
            let config = GenerationConfig {
                max_new_tokens: settings.new_tokens.max(2),
                prefill_chunk: prefill_chunk.max(1),
                ..GenerationConfig::default()
            };
            let mut generation = Generation::new(model, prompt.clone(), *policy, config)?;
            generation.prefill_with(None, |_| true)?;
            let flops = predicted_prefill_flops_ratio(
                model,
                generation.sequence().visibility(),
                prompt.len(),
            );
            let out = generation.run(|_| true)?;
            runs[k].push(ItemTiming {
                ttft_s: out.timing.ttft_s,
                tpot_s: out.timing.tpot_s,
                kv_bytes_held: out.kv_bytes_held,
                prefill_flops_ratio: flops,
            });
        }
    }
    Ok(runs
        .into_iter()
        .map(|r| {
            let med = |f: fn(&ItemTiming) -> f64| median(r.iter().map(f).collect());
            ItemTiming {
                ttft_s: med(|t| t.ttft_s),
                tpot_s: med(|t| t.tpot_s),
                ..r[r.len() - 1]
            }
        })
        .collect())
}

/// The median of `xs` (the upper one of an even count); 0 when empty.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(kind: &str) -> SuiteItem {
        SuiteItem {
            kind: kind.into(),
            ..SuiteItem::default()
        }
    }

    #[test]
    fn the_first_items_of_each_task_are_timed() {
        let items: Vec<SuiteItem> = ["a", "a", "b", "a", "b", "c"].map(item).to_vec();
        let per_task = |n: usize, tasks: &[&str]| TimingSettings {
            items_per_task: n,
            tasks: tasks.iter().map(|t| t.to_string()).collect(),
            ..TimingSettings::default()
        };
        assert_eq!(timed_items(&items, &per_task(1, &[])), [0, 2, 5]);
        assert_eq!(timed_items(&items, &per_task(2, &[])), [0, 1, 2, 4, 5]);
        assert!(timed_items(&items, &per_task(0, &[])).is_empty());
        assert_eq!(timed_items(&items, &per_task(2, &["b"])), [2, 4]);
        assert_eq!(timed_items(&items, &per_task(1, &["c", "a"])), [0, 5]);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![]), 0.0);
    }
}
