//! The leaderboard run: a suite (RULER's, as kvpress's leaderboard runs
//! it) under every method at every compression ratio, the ratio mapped to
//! each family's own knob ([`ratio`]); per item each policy's answer and
//! score, the K/V it holds (measured), and for the first items of each
//! task each policy's TTFT and TPOT against full's, measured alone and
//! interleaved ([`timing`]). Items are appended to a journal as they finish,
//! so an interrupted run resumes where it stopped ([`journal`]); shards
//! merge into the whole run ([`merge_runs`]); [`table`] makes the cells.

pub mod journal;
pub mod ratio;
pub mod table;
pub mod timing;

use std::path::PathBuf;

use lcut_policy::PolicySpec;
use lcut_trace::{LeaderboardConfig, LeaderboardTable};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::session::Session;
use crate::suite::{ItemResult, SuiteEvalOptions, SuiteItem, resolve_policy};
pub use ratio::{PromptRows, RATIO_FAMILIES, RatioKnob, check_ratio, map_ratio};
pub use timing::{ItemTiming, TimingSettings};

/// What is wrong with a leaderboard request or its files.
#[derive(Debug, thiserror::Error)]
pub enum LeaderboardError {
    /// A ratio outside (0, 1).
    #[error(
        "compression ratio {ratio} is outside (0, 1): it is the share of the prompt's K/V \
         removed (kvpress's leaderboard: 0.25, 0.5, 0.75, 0.875)"
    )]
    RatioOutOfRange {
        /// The ratio given.
        ratio: f64,
    },
    /// A ratio that is not a number.
    #[error("compression ratio {text:?} is not a number")]
    BadRatio {
        /// As written.
        text: String,
    },
    /// A method whose family has no ratio rule.
    #[error(
        "{method:?}: no rule maps a compression ratio to this family's knob (families with one: \
         {known}); give the policy with its own knob (e.g. speed:22+bos) instead"
    )]
    UnknownFamily {
        /// The method as written.
        method: String,
        /// The families that have a rule.
        known: String,
    },
    /// No methods besides the reference.
    #[error("--ratios needs at least one method besides full in --policies")]
    NoMethods,
    /// Every method asked for is one this model's layout does not run.
    #[error("no method of --policies runs on this model besides full: {reasons}")]
    NoneRunsHere {
        /// Each method left out and why.
        reasons: String,
    },
    /// A journal line that cannot be read.
    #[error("leaderboard journal {path}, line {line}: {reason}")]
    Journal {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A journal of another run where this one would resume.
    #[error(
        "{path} holds a run of other settings ({what} differs): give another --out, or remove \
         it to start over"
    )]
    OtherRun {
        /// The journal.
        path: PathBuf,
        /// What differs.
        what: String,
    },
    /// Shard runs that do not make one whole run.
    #[error("merging leaderboard shards: {0}")]
    Merge(String),
}

/// Everything that makes two runs the same run (a journal resumes only
/// its own run; shards merge only with shards of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardHeader {
    /// The model, as given.
    pub model: String,
    /// The suite file, as given.
    pub suite: String,
    /// Hash of the suite file's bytes.
    pub suite_hash: String,
    /// Items in the whole suite.
    pub suite_items: usize,
    /// Weights (`f32`, `q`, ...).
    pub dtype: String,
    /// Most new tokens per answer (of items without their own budget, or
    /// of every item without `item_budgets`).
    pub max_new_tokens: usize,
    /// Items' own budgets (RULER's per task) were used.
    pub item_budgets: bool,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// The ratios asked for.
    pub ratios: Vec<f64>,
    /// Every configuration, the full model first.
    pub configs: Vec<LeaderboardConfig>,
    /// How the first items of each task are timed.
    pub timing: TimingSettings,
    /// The shard `[i, n]` run, absent for the whole suite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<[usize; 2]>,
    /// The configurations asked for that this model's layout does not run
    /// ([`leave_out_refused`]), not in `configs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
}

/// A configuration asked for that the model's layout refuses (a press on a
/// model whose layers share K/V or hold a recurrent state), left out of a
/// run rather than failing it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftOut {
    /// The method as written in `--policies`.
    pub method: String,
    /// The ratio it was mapped from, if any.
    pub ratio: Option<f64>,
    /// The policy it resolved to.
    pub policy: String,
    /// Why the model does not run it.
    pub reason: String,
}

/// One line per method left out of a run: its ratios, and the refusal of
/// its first configuration (they differ only in the policy they name).
pub fn left_out_lines(left_out: &[LeftOut]) -> Vec<String> {
    let mut lines: Vec<(&str, Vec<String>, &str)> = vec![];
    for l in left_out {
        let at = l.ratio.map_or_else(|| l.policy.clone(), |r| r.to_string());
        match lines.iter_mut().find(|(m, _, _)| *m == l.method) {
            Some((_, ratios, _)) => ratios.push(at),
            None => lines.push((&l.method, vec![at], &l.reason)),
        }
    }
    lines
        .into_iter()
        .map(|(method, ratios, why)| {
            format!(
                "left out on this model: {method} at {}: {why}",
                ratios.join(", ")
            )
        })
        .collect()
}

/// `configs` split into those `session`'s model runs and those its layout
/// refuses ([`lcut_model::Decoder::check_layout`]), each with the refusal;
/// refused as a whole when nothing but the full model would be left.
pub fn leave_out_refused(
    session: &Session,
    configs: Vec<LeaderboardConfig>,
) -> Result<(Vec<LeaderboardConfig>, Vec<LeftOut>)> {
    let (mut kept, mut left_out) = (vec![], vec![]);
    for c in configs {
        let policy = resolve_policy(session, &c.policy)?;
        match session.model.check_layout(&policy) {
            Ok(()) => kept.push(c),
            Err(e) => left_out.push(LeftOut {
                method: c.method,
                ratio: c.ratio,
                policy: c.policy,
                reason: e.to_string(),
            }),
        }
    }
    if kept.len() < 2 && !left_out.is_empty() {
        let reasons: Vec<String> = left_out
            .iter()
            .map(|l| format!("{} ({})", l.policy, l.reason))
            .collect();
        return Err(LeaderboardError::NoneRunsHere {
            reasons: reasons.join("; "),
        }
        .into());
    }
    Ok((kept, left_out))
}

/// One item of a leaderboard run, every configuration's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardItem {
    /// Position of the item in the suite.
    pub index: usize,
    /// Its id.
    pub id: String,
    /// Its task (the item's kind).
    pub task: String,
    /// Tokens before the decode start (the context a policy may compress).
    pub context_tokens: usize,
    /// All prompt tokens.
    pub prompt_tokens: usize,
    /// K/V bytes of the context at full depth in the run's K/V dtype, as
    /// the full model holds them once the context has run (a sliding-window
    /// layer its window's rows).
    pub context_kv_bytes: u64,
    /// Every configuration's result, in the header's order.
    pub results: Vec<ItemResult>,
    /// Every configuration's timing, when the item was timed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timing: Vec<ItemTiming>,
    /// The build and instruction-set level that ran the item (absent in
    /// journals written before items recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<crate::made_by::MadeBy>,
}

/// What `lcut eval --ratios` writes: the setting, every item and the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardRun {
    /// The setting.
    pub header: LeaderboardHeader,
    /// Every item run (by this shard), in suite order.
    pub items: Vec<LeaderboardItem>,
    /// The cells.
    pub table: LeaderboardTable,
}

/// The configurations of `methods` at `ratios` on a model whose prompt
/// K/V spreads over its layers as `rows` says: the full model first
/// (whether named or not), then each method at each ratio (a method
/// written with its own knob, `speed:22+bos`, once). Every policy is
/// resolved, and every bad ratio or family named, before anything runs.
pub fn plan(
    methods: &[String],
    ratios: &[f64],
    rows: &PromptRows,
) -> Result<Vec<LeaderboardConfig>> {
    let layers = rows.layers();
    for &r in ratios {
        check_ratio(r)?;
    }
    let mut configs = vec![LeaderboardConfig {
        method: "full".into(),
        family: "full".into(),
        ratio: None,
        policy: "full".into(),
        formula_removed: 0.0,
        note: "the uncompressed model (kvpress's no_press)".into(),
    }];
    let mut any = false;
    for method in methods.iter().map(|m| m.trim()).filter(|m| *m != "full") {
        any = true;
        // a knob written after the family name (`speed:22+bos`)
        if ratio::split_method(method).0.contains(':') {
            let spec: PolicySpec = method.parse()?;
            let policy = spec.resolve(layers)?;
            configs.push(LeaderboardConfig {
                method: method.to_string(),
                family: method.split(':').next().unwrap_or(method).to_string(),
                ratio: None,
                policy: policy.to_string(),
                formula_removed: 0.0,
                note: "given with its own knob: its ratio is the share measured".into(),
            });
            continue;
        }
        for &r in ratios {
            let knob = map_ratio(method, r, rows)?;
            let spec: PolicySpec = knob.policy.parse()?;
            configs.push(LeaderboardConfig {
                method: method.to_string(),
                family: ratio::split_method(method).0.to_string(),
                ratio: Some(r),
                policy: spec.resolve(layers)?.to_string(),
                formula_removed: knob.removed,
                note: knob.note,
            });
        }
    }
    if !any {
        return Err(LeaderboardError::NoMethods.into());
    }
    Ok(configs)
}

/// Split `--policies` of a leaderboard run into methods at `,` or `;`: a
/// family and its options (`speed+bos`, `slim+block:16`) or a policy with
/// its own knob; a part that starts with a digit continues a SlimInfer cut
/// list (`slim:9@50%,19@25%`).
pub fn split_methods(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in text
        .split([',', ';'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match out.last_mut() {
            Some(last) if part.starts_with(|c: char| c.is_ascii_digit()) => {
                last.push(',');
                last.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out
}

/// Parse `0.25,0.5,0.75,0.875`, every ratio checked.
pub fn parse_ratios(text: &str) -> std::result::Result<Vec<f64>, LeaderboardError> {
    text.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let r: f64 = t.trim().parse().map_err(|_| LeaderboardError::BadRatio {
                text: t.trim().to_string(),
            })?;
            check_ratio(r).map(|()| r)
        })
        .collect()
}

impl LeaderboardHeader {
    /// The suite run this leaderboard run makes: every configuration's
    /// policy over the items of its shard, with `memory_budget` as
    /// [`SuiteEvalOptions::memory_budget`].
    pub fn suite_options(&self, memory_budget: Option<u64>) -> SuiteEvalOptions {
        SuiteEvalOptions {
            policies: self.configs.iter().map(|c| c.policy.clone()).collect(),
            max_new_tokens: self.max_new_tokens,
            item_budgets: self.item_budgets,
            shard: self.shard.map(|[i, n]| (i, n)),
            prefill_chunk: self.prefill_chunk,
            memory_budget,
        }
    }
}

/// Run the items of `header.shard` (all when unsharded) under every
/// configuration of `header`, skipping those `done` holds (a resumed
/// run's); `on_item` sees each new item as it finishes (to append it to
/// the journal, or to show progress) and returns false to cancel. An
/// item's configurations run in groups that fit `memory_budget` bytes
/// beside the weights (`None`: what the device has free as it begins).
pub fn run_items(
    session: &Session,
    items: &[SuiteItem],
    (header, memory_budget): (&LeaderboardHeader, Option<u64>),
    done: Vec<LeaderboardItem>,
    on_item: &mut dyn FnMut(&LeaderboardItem) -> Result<bool>,
) -> Result<Vec<LeaderboardItem>> {
    let policies = header
        .configs
        .iter()
        .map(|c| resolve_policy(session, &c.policy))
        .collect::<Result<Vec<_>>>()?;
    let opts = header.suite_options(memory_budget);
    let timed = timing::timed_items(items, &header.timing);
    let indices = crate::diagnose::shard_indices(items.len(), opts.shard)?;
    crate::suite::check_items(session, items, &indices, &policies, &opts)?;
    let mut out = done;
    let kv_dtype = session.model.kv_dtype();
    let made_by = crate::made_by::current();
    for index in indices {
        if out.iter().any(|d| d.index == index) {
            continue;
        }
        let item = &items[index];
        let results = crate::suite::evaluate_item((session, None), index, item, &policies, &opts)?;
        let prompt = item.prepare(session)?;
        let timing = match timed.contains(&index) {
            true => timing::time_item(
                &session.model,
                &prompt,
                &policies,
                &header.timing,
                opts.prefill_chunk,
            )?,
            false => Vec::new(),
        };
        let record = LeaderboardItem {
            index,
            id: item.id.clone(),
            task: item.kind.clone(),
            context_tokens: prompt.decode_start,
            prompt_tokens: prompt.len(),
            context_kv_bytes: context_kv_bytes(session, kv_dtype, prompt.decode_start),
            results,
            timing,
            made_by: Some(made_by.clone()),
        };
        if !on_item(&record)? {
            return Err(EngineError::Cancelled);
        }
        out.push(record);
    }
    out.sort_by_key(|r| r.index);
    Ok(out)
}

/// Merge the runs of the shards of one leaderboard run into the whole
/// run; the shards must be of one setting and cover every item once.
pub fn merge_runs(parts: &[LeaderboardRun]) -> Result<LeaderboardRun> {
    let (header, items) = join_parts(parts.iter().map(|p| (&p.header, &p.items[..])))?;
    let covered = items.iter().enumerate().all(|(k, r)| r.index == k);
    if !covered || items.len() != header.suite_items {
        return Err(LeaderboardError::Merge(format!(
            "the shards hold {} items for a suite of {} items, not each item once \
             (a shard missing, unfinished or given twice?)",
            items.len(),
            header.suite_items
        ))
        .into());
    }
    Ok(LeaderboardRun {
        table: table::build_table(&header, &items),
        header,
        items,
    })
}

/// The items the journals of one run's shards hold so far (runs still
/// going, or stopped), as one run whose table is built from them alone and
/// says so: a long run looked at before it ends. Each item must appear
/// once.
pub fn merge_partial(
    parts: &[(LeaderboardHeader, Vec<LeaderboardItem>)],
) -> Result<LeaderboardRun> {
    let (header, items) = join_parts(parts.iter().map(|(h, i)| (h, &i[..])))?;
    if let Some(w) = items.windows(2).find(|w| w[0].index == w[1].index) {
        return Err(LeaderboardError::Merge(format!(
            "item {} ({}) is in two of the journals (a shard given twice?)",
            w[0].index, w[0].id
        ))
        .into());
    }
    let mut table = table::build_table(&header, &items);
    if items.len() < header.suite_items {
        table.notes.insert(
            0,
            format!(
                "Partial: {} of the suite's {} items (the runs had not finished); a task's \
                 cells are over its items run so far.",
                items.len(),
                header.suite_items
            ),
        );
    }
    Ok(LeaderboardRun {
        table,
        header,
        items,
    })
}

/// The common header of shards of one run (without the shard) and all
/// their items in suite order; shards of other settings are refused.
fn join_parts<'a>(
    parts: impl Iterator<Item = (&'a LeaderboardHeader, &'a [LeaderboardItem])>,
) -> Result<(LeaderboardHeader, Vec<LeaderboardItem>)> {
    let key = |h: &LeaderboardHeader| LeaderboardHeader {
        shard: None,
        ..h.clone()
    };
    let mut header: Option<LeaderboardHeader> = None;
    let mut items = Vec::new();
    for (h, part) in parts {
        match &header {
            None => header = Some(key(h)),
            Some(first) if *first != key(h) => {
                return Err(LeaderboardError::Merge(format!(
                    "the runs of {} and {} differ in suite, model, settings or configurations",
                    first.suite, h.suite
                ))
                .into());
            }
            Some(_) => {}
        }
        items.extend_from_slice(part);
    }
    let header = header.ok_or_else(|| LeaderboardError::Merge("no shard results given".into()))?;
    items.sort_by_key(|r| r.index);
    Ok((header, items))
}

/// The K/V bytes the full model holds of a context of `tokens` tokens once
/// it has run, stored in `kv_dtype` (a sliding-window layer holds only its
/// window's rows).
fn context_kv_bytes(session: &Session, kv_dtype: candle_core::DType, tokens: usize) -> u64 {
    let cfg = session.model.config();
    let context = lcut_policy::KvCost {
        anchors: 0,
        prefill: tokens,
        decode: 0,
    };
    let full = lcut_policy::Policy::full(cfg.num_layers);
    context.bytes(&full, &cfg.kv_shape(kv_dtype), &cfg.sliding_window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_split_and_plan_the_full_model_first() {
        assert_eq!(
            split_methods("full,speed+bos; slim+block:16,swiftkv,slim:9@50%,19@25%"),
            [
                "full",
                "speed+bos",
                "slim+block:16",
                "swiftkv",
                "slim:9@50%,19@25%"
            ]
        );
        let methods = split_methods("speed+bos,speed:20,slim+block:16");
        let configs = plan(&methods, &[0.25, 0.5], &PromptRows::uniform(30)).unwrap();
        let policies: Vec<&str> = configs.iter().map(|c| c.policy.as_str()).collect();
        assert_eq!(
            policies[..4],
            ["full", "speed:22+bos", "speed:15+bos", "speed:20"]
        );
        assert!(policies[4].starts_with("slim:9@") && policies[4].ends_with("+block:16"));
        assert_eq!(configs[1].ratio, Some(0.25));
        assert_eq!(configs[3].ratio, None);
        assert!(matches!(
            plan(&split_methods("full"), &[0.5], &PromptRows::uniform(30)),
            Err(EngineError::Leaderboard(LeaderboardError::NoMethods))
        ));
        assert!(parse_ratios("0.25,0.875").is_ok());
        assert!(matches!(
            parse_ratios("0.5,1"),
            Err(LeaderboardError::RatioOutOfRange { .. })
        ));
    }

    /// On Gemma 4 (layers reading others' K/V) and Qwen3.5 (recurrent
    /// layers) the grid keeps the full model and SPEED and leaves out the
    /// presses, SlimInfer and SwiftKV, each with the layout's reason; a
    /// dense model keeps everything; a grid of nothing that runs is refused.
    #[test]
    fn a_layout_leaves_out_what_it_does_not_run() -> Result<()> {
        let methods = split_methods("speed+bos,slim,swiftkv+bos,snapkv,tova");
        for (case, why) in [
            (lcut_testkit::GEMMA4_CASE, "share K/V"),
            (lcut_testkit::QWEN35_CASE, "recurrent"),
            ("llama-gqa", ""),
        ] {
            let dir = lcut_testkit::oracle_case(case);
            let session = Session::load(&dir, candle_core::DType::F32, &candle_core::Device::Cpu)?;
            let layers = session.model.config().num_layers;
            let configs = plan(&methods, &[0.5, 0.75], &PromptRows::uniform(layers))?;
            let (kept, left_out) = leave_out_refused(&session, configs)?;
            let kept: Vec<&str> = kept.iter().map(|c| c.family.as_str()).collect();
            if why.is_empty() {
                assert_eq!(kept.len(), 11, "{case}: {kept:?}");
                assert!(left_out.is_empty(), "{case}");
                continue;
            }
            assert_eq!(kept, ["full", "speed", "speed"], "{case}");
            let families: Vec<&str> = left_out.iter().map(|l| l.method.as_str()).collect();
            assert_eq!(
                families,
                [
                    "slim",
                    "slim",
                    "swiftkv+bos",
                    "swiftkv+bos",
                    "snapkv",
                    "snapkv",
                    "tova",
                    "tova"
                ],
                "{case}"
            );
            assert!(left_out.iter().all(|l| l.reason.contains(why)), "{case}");
            let lines = left_out_lines(&left_out);
            assert_eq!(lines.len(), 4, "{case}: {lines:?}");
            assert!(lines[2].starts_with("left out on this model: snapkv at 0.5, 0.75: "));
            let presses = plan(
                &split_methods("snapkv,tova"),
                &[0.5],
                &PromptRows::uniform(layers),
            )?;
            assert!(matches!(
                leave_out_refused(&session, presses),
                Err(EngineError::Leaderboard(
                    LeaderboardError::NoneRunsHere { .. }
                ))
            ));
        }
        Ok(())
    }
}
