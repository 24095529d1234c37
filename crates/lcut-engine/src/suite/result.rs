//! What `lcut eval` on a suite records: one result per item, summaries per
//! kind and per length with 95% Wilson intervals, and the merge of shard
//! results into the whole suite's result.

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// The result of one suite item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemResult {
    /// Position of the item in the suite (orders merged shards).
    pub index: usize,
    /// The item's id.
    pub id: String,
    /// Its kind.
    pub kind: String,
    /// Its length label.
    pub length: String,
    /// The policy's greedy generation answers the item.
    pub correct: bool,
    /// The full model's greedy generation answers the item.
    pub full_correct: bool,
    /// The policy's score in [0, 1] under a RULER string-match rule (absent
    /// for the right-or-wrong rules, where it is `correct`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// The full model's score under a RULER string-match rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_score: Option<f64>,
    /// The policy's greedy generation (stop token left out).
    pub generation: String,
    /// The full model's greedy generation.
    pub full_generation: String,
    /// Tokens of the full continuation the policy was teacher-forced on.
    pub forced_tokens: usize,
    /// Of those, tokens where the policy's top-1 is the full model's.
    pub agree: usize,
    /// Sum over them of KL(full || policy), nats.
    pub kl_sum: f64,
    /// K/V bytes the policy holds at the end of the teacher-forced run.
    pub kv_bytes_held: u64,
    /// K/V bytes the full model holds for the same tokens.
    pub kv_bytes_full: u64,
    /// Wall time of the item, seconds: the full model's run, which every
    /// policy needs as its reference, and every policy's runs of the item,
    /// which decode side by side.
    pub seconds: f64,
}

impl ItemResult {
    /// The policy's score in [0, 1]: the string match's, or 1 when correct.
    pub fn score(&self) -> f64 {
        self.score.unwrap_or(f64::from(u8::from(self.correct)))
    }

    /// The full model's score in [0, 1].
    pub fn full_score(&self) -> f64 {
        self.full_score
            .unwrap_or(f64::from(u8::from(self.full_correct)))
    }
}

/// Accuracy and quality of a group of items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupScore {
    /// The group: a kind, `kind length`, or `all`.
    pub group: String,
    /// Items.
    pub n: usize,
    /// Items the policy answered.
    pub correct: usize,
    /// `correct / n`.
    pub accuracy: f64,
    /// 95% Wilson interval of the accuracy.
    pub ci95: [f64; 2],
    /// Items the full model answered.
    pub full_correct: usize,
    /// Items both the full model and the policy answered: what the policy
    /// keeps of the full model's correct answers.
    #[serde(default)]
    pub kept_of_full: usize,
    /// Top-1 agreement with full over the teacher-forced tokens.
    pub top1_agreement: f64,
    /// Mean KL(full || policy) per teacher-forced token, nats.
    pub mean_kl: f64,
    /// K/V bytes held over K/V bytes of full.
    pub kv_ratio: f64,
    /// Mean K/V bytes the policy holds per item (teacher-forced run's end).
    #[serde(default)]
    pub kv_bytes_held: f64,
    /// Mean K/V bytes the full model holds per item.
    #[serde(default)]
    pub kv_bytes_full: f64,
    /// RULER's score (the mean item score in [0, 1]) when any item of the
    /// group is scored by a string match: partial credit counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Its 95% interval: Wilson's at the mean score (see [`wilson_mean`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_ci95: Option<[f64; 2]>,
    /// The full model's mean score on the group's items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_score: Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;

pub use lcut_diag::wilson;

/// The 95% Wilson interval at a mean score `mean` in [0, 1] over `n`
/// items. For right-or-wrong items it is [`wilson`]'s; for scores in
/// between (RULER's `string_match_all`) it is conservative, since a score
/// in [0, 1] with mean p has a variance of at most p(1 - p), the variance
/// Wilson's interval assumes.
pub fn wilson_mean(mean: f64, n: usize) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    let z = 1.959_963_984_540_054_f64;
    let (n, p) = (n as f64, mean.clamp(0.0, 1.0));
    let denom = 1.0 + z * z / n;
    let center = (p + z * z / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    [(center - half).max(0.0), (center + half).min(1.0)]
}

/// The score of `items` as group `group`.
pub fn score_group(group: &str, items: &[&ItemResult]) -> GroupScore {
    let n = items.len();
    let correct = items.iter().filter(|r| r.correct).count();
    let tokens: usize = items.iter().map(|r| r.forced_tokens).sum();
    let agree: usize = items.iter().map(|r| r.agree).sum();
    let kl: f64 = items.iter().map(|r| r.kl_sum).sum();
    let held: u64 = items.iter().map(|r| r.kv_bytes_held).sum();
    let full: u64 = items.iter().map(|r| r.kv_bytes_full).sum();
    let per = |x: f64, d: f64| if d > 0.0 { x / d } else { 0.0 };
    let graded = items.iter().any(|r| r.score.is_some());
    let mean_score = per(items.iter().map(|r| r.score()).sum(), n as f64);
    let full_score = per(items.iter().map(|r| r.full_score()).sum(), n as f64);
    GroupScore {
        group: group.to_string(),
        n,
        correct,
        accuracy: per(correct as f64, n as f64),
        ci95: wilson(correct, n),
        full_correct: items.iter().filter(|r| r.full_correct).count(),
        kept_of_full: items.iter().filter(|r| r.full_correct && r.correct).count(),
        top1_agreement: per(agree as f64, tokens as f64),
        mean_kl: per(kl, tokens as f64),
        kv_ratio: per(held as f64, full as f64),
        kv_bytes_held: per(held as f64, n as f64),
        kv_bytes_full: per(full as f64, n as f64),
        score: graded.then_some(mean_score),
        score_ci95: graded.then(|| wilson_mean(mean_score, n)),
        full_score: graded.then_some(full_score),
    }
}

/// Scores of `items` (in suite order): all of them, each kind, and each
/// length of the kinds that have more than one length label.
pub fn summarize(items: &[ItemResult]) -> Vec<GroupScore> {
    let all: Vec<&ItemResult> = items.iter().collect();
    let mut out = vec![score_group("all", &all)];
    let mut kinds: Vec<&str> = Vec::new();
    for r in items {
        if !kinds.contains(&r.kind.as_str()) {
            kinds.push(&r.kind);
        }
    }
    for kind in kinds {
        let of_kind: Vec<&ItemResult> = items.iter().filter(|r| r.kind == kind).collect();
        out.push(score_group(kind, &of_kind));
        let mut lengths: Vec<&str> = Vec::new();
        for r in &of_kind {
            if !lengths.contains(&r.length.as_str()) {
                lengths.push(&r.length);
            }
        }
        if lengths.len() > 1 {
            for len in lengths {
                let group: Vec<&ItemResult> = of_kind
                    .iter()
                    .copied()
                    .filter(|r| r.length == len)
                    .collect();
                out.push(score_group(&format!("{kind} {len}"), &group));
            }
        }
    }
    out
}

/// What `lcut eval --suite` writes (`--json`): the setting, the scores and
/// every item's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteEval {
    /// The model file or folder, as given.
    pub model: String,
    /// The suite file, as given.
    pub suite: String,
    /// Items in the whole suite (a shard runs some of them).
    pub suite_items: usize,
    /// Hash of the suite file's bytes.
    pub suite_hash: String,
    /// The policy, resolved against the model's depth.
    pub policy: String,
    /// Weights: `f32`, `bf16`, `f16` or `q`.
    pub dtype: String,
    /// The LoRA adapter the policy ran with; the full-depth reference is
    /// then the base model without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<lcut_trace::AdapterIdentity>,
    /// Most new tokens per generation.
    pub max_new_tokens: usize,
    /// Items that name their own budget (RULER's) had it instead of
    /// `max_new_tokens`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub item_budgets: bool,
    /// The shard `[i, n]` run, absent for the whole suite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<[usize; 2]>,
    /// The build and instruction-set level that ran the items (merged
    /// shards: each of theirs once; absent in results written before runs
    /// recorded it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub made_by: Vec<crate::made_by::MadeBy>,
    /// Sum of the items' wall times, seconds (over merged shards too).
    pub seconds: f64,
    /// `all`, each kind, each length of multi-length kinds.
    pub scores: Vec<GroupScore>,
    /// Every item's result, in suite order.
    pub items: Vec<ItemResult>,
}

impl SuiteEval {
    /// Human-readable lines: the setting, then one line per group.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "model={}{} suite={} policy={} dtype={} items={}/{} seconds={:.1}",
            self.model,
            self.adapter.as_ref().map_or_else(String::new, |a| format!(
                " adapter={} ({}; reference: the base model)",
                a.path, a.hash
            )),
            self.suite,
            self.policy,
            self.dtype,
            self.items.len(),
            self.suite_items,
            self.seconds
        )];
        lines.extend(crate::made_by::several_note(&self.made_by));
        for g in &self.scores {
            let score = match (g.score, g.score_ci95) {
                (Some(s), Some([lo, hi])) => format!(" score={s:.3} [{lo:.3}, {hi:.3}]"),
                _ => String::new(),
            };
            lines.push(format!(
                "{:<16} n={:<4}{score} accuracy={:.3} [{:.3}, {:.3}] full={:.3} kept={}/{} top1_agreement={:.3} mean_kl={:.3} kv_held={:.2}/{:.2}MiB kv_ratio={:.3}",
                g.group,
                g.n,
                g.accuracy,
                g.ci95[0],
                g.ci95[1],
                g.full_correct as f64 / g.n.max(1) as f64,
                g.kept_of_full,
                g.full_correct,
                g.top1_agreement,
                g.mean_kl,
                g.kv_bytes_held / MIB,
                g.kv_bytes_full / MIB,
                g.kv_ratio
            ));
        }
        lines
    }
}

/// Merge the results of shard runs of one suite, model, policy and setting
/// into the whole suite's result; the shards must cover every item once.
pub fn merge_evals(parts: &[SuiteEval]) -> Result<SuiteEval> {
    let first = parts
        .first()
        .ok_or_else(|| EngineError::Merge("no shard results given".into()))?;
    let key = |e: &SuiteEval| {
        (
            e.suite_hash.clone(),
            e.suite_items,
            e.policy.clone(),
            e.dtype.clone(),
            e.max_new_tokens,
            e.item_budgets,
            e.adapter.as_ref().map(|a| a.hash.clone()),
        )
    };
    if let Some(other) = parts.iter().find(|p| key(p) != key(first)) {
        return Err(EngineError::Merge(format!(
            "{} ({}, {}) and {} ({}, {}) differ in suite, policy, dtype, adapter or max_new_tokens",
            first.suite, first.policy, first.dtype, other.suite, other.policy, other.dtype
        )));
    }
    let mut items: Vec<ItemResult> = parts.iter().flat_map(|p| p.items.clone()).collect();
    items.sort_by_key(|r| r.index);
    let covered = items.iter().enumerate().all(|(k, r)| r.index == k);
    if !covered || items.len() != first.suite_items {
        return Err(EngineError::Merge(format!(
            "the shards hold {} results for a suite of {} items, not each item once \
             (a shard missing or given twice?)",
            items.len(),
            first.suite_items
        )));
    }
    Ok(SuiteEval {
        shard: None,
        made_by: crate::made_by::union(parts.iter().map(|p| p.made_by.as_slice())),
        seconds: parts.iter().map(|p| p.seconds).sum(),
        scores: summarize(&items),
        items,
        ..first.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graded_items_give_a_mean_score_with_its_interval() {
        let mut a = item(0, "niah", "4k", false);
        a.score = Some(0.5);
        let b = item(1, "niah", "4k", true);
        let g = score_group("niah", &[&a, &b]);
        assert_eq!(g.score, Some(0.75));
        assert_eq!(g.score_ci95, Some(wilson_mean(0.75, 2)));
        assert_eq!(g.correct, 1);
        // right-or-wrong groups carry no score (their accuracy is it)
        assert_eq!(score_group("x", &[&b]).score, None);
        // at a whole count, Wilson's interval exactly
        assert_eq!(wilson_mean(0.8, 10), wilson(8, 10));
    }

    #[test]
    fn wilson_matches_known_values() {
        // 8 of 10: 0.490 .. 0.943 (Wilson, z = 1.96)
        let [lo, hi] = wilson(8, 10);
        assert!(
            (lo - 0.4902).abs() < 1e-3 && (hi - 0.9433).abs() < 1e-3,
            "{lo} {hi}"
        );
        let [lo, hi] = wilson(0, 20);
        assert!(lo == 0.0 && (hi - 0.1611).abs() < 1e-3, "{hi}");
        assert_eq!(wilson(0, 0), [0.0, 1.0]);
    }

    fn item(index: usize, kind: &str, length: &str, correct: bool) -> ItemResult {
        ItemResult {
            index,
            id: format!("i{index}"),
            kind: kind.into(),
            length: length.into(),
            correct,
            full_correct: true,
            score: None,
            full_score: None,
            generation: String::new(),
            full_generation: String::new(),
            forced_tokens: 4,
            agree: 3,
            kl_sum: 0.5,
            kv_bytes_held: 50,
            kv_bytes_full: 100,
            seconds: 1.0,
        }
    }

    #[test]
    fn groups_are_all_kinds_and_lengths_of_multi_length_kinds() {
        let items = vec![
            item(0, "retrieval", "256", true),
            item(1, "retrieval", "1k", false),
            item(2, "copy", "short", true),
        ];
        let s = summarize(&items);
        let names: Vec<&str> = s.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(
            names,
            ["all", "retrieval", "retrieval 256", "retrieval 1k", "copy"]
        );
        assert_eq!((s[0].n, s[0].correct), (3, 2));
        assert!((s[0].top1_agreement - 0.75).abs() < 1e-12);
        assert!((s[0].mean_kl - 0.125).abs() < 1e-12);
        assert!((s[0].kv_ratio - 0.5).abs() < 1e-12);
        assert!(
            (s[0].kv_bytes_held - 50.0).abs() < 1e-12 && (s[0].kv_bytes_full - 100.0).abs() < 1e-12
        );
    }

    fn eval(items: Vec<ItemResult>, shard: Option<[usize; 2]>) -> SuiteEval {
        SuiteEval {
            model: "m".into(),
            suite: "s".into(),
            suite_items: 3,
            suite_hash: "h".into(),
            policy: "full".into(),
            dtype: "f32".into(),
            adapter: None,
            max_new_tokens: 8,
            item_budgets: false,
            shard,
            made_by: Vec::new(),
            seconds: items.iter().map(|r| r.seconds).sum(),
            scores: summarize(&items),
            items,
        }
    }

    #[test]
    fn merged_shards_equal_the_whole_and_gaps_are_refused() {
        let all: Vec<ItemResult> = (0..3).map(|i| item(i, "copy", "short", i != 1)).collect();
        let a = eval(vec![all[0].clone(), all[2].clone()], Some([0, 2]));
        let b = eval(vec![all[1].clone()], Some([1, 2]));
        assert_eq!(
            merge_evals(&[b.clone(), a.clone()]).unwrap(),
            eval(all, None)
        );
        assert!(merge_evals(std::slice::from_ref(&a)).is_err());
        assert!(merge_evals(&[a.clone(), a.clone(), b.clone()]).is_err());
        let mut other = b;
        other.policy = "speed:2+bos".into();
        assert!(merge_evals(&[a, other]).is_err());
    }
}
