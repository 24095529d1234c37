//! The teacher of adapter training: the full model's greedy continuations
//! of prompts from lcut's task generators, with its next-token distribution
//! at each generated token cut to the top k. Making them is most of a
//! training run's preparation and does not depend on the cut, so they are
//! kept in a JSON Lines file (`--teacher FILE`) that later runs for other
//! policies read back; the first line records how they were made, and a run
//! that asks for something else is refused by name.

use std::collections::HashSet;
use std::path::Path;

use lcut_engine::suite::SuiteItem;
use lcut_engine::{Generation, PreparedPrompt, Session, Step, run_together};
use lcut_policy::Policy;
use serde::{Deserialize, Serialize};

use super::optim::SplitMix;
use crate::error::{Context, Result, TrainError, refuse};

/// How a teacher file was made: a run reusing it must ask for the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherSettings {
    /// The base model's fingerprint (`Decoder::lora_fingerprint`).
    pub base_fingerprint: String,
    /// First seed of the task generators (more seeds follow when needed).
    pub prompt_seed: u64,
    /// Prompts kept.
    pub prompts: usize,
    /// Longest prompt kept, tokens.
    pub max_prompt_tokens: usize,
    /// Most tokens per continuation.
    pub max_new_tokens: usize,
    /// Tokens kept of each next-token distribution.
    pub top_k: usize,
    /// Hash of the suite whose prompts were left out, if one was.
    pub excluded_suite_hash: Option<String>,
}

/// One prompt and what the full model made of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherRecord {
    /// The item's id in its generator's suite.
    pub id: String,
    /// The item's kind (`retrieval`, `copy`, ...); files made before it was
    /// recorded give it by the id's first word.
    #[serde(default)]
    pub kind: String,
    /// The system message, if any.
    pub system: Option<String>,
    /// The user prompt.
    pub prompt: String,
    /// The prompt's token ids (checked when read back).
    pub prompt_ids: Vec<u32>,
    /// The greedy continuation.
    pub continuation: Vec<u32>,
    /// Per continuation token, the k likeliest next tokens before it...
    pub top_ids: Vec<Vec<u32>>,
    /// ...and their probabilities, renormalised over the k.
    pub top_probs: Vec<Vec<f32>>,
}

/// The k largest entries of `logits` and their softmax probabilities
/// renormalised over those k (ties to the lower id).
pub fn top_k(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.clamp(1, logits.len().max(1));
    order.select_nth_unstable_by(k - 1, |&a, &b| {
        logits[b].total_cmp(&logits[a]).then(a.cmp(&b))
    });
    order.truncate(k);
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let max = order.first().map_or(0.0, |&i| logits[i]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| f64::from(logits[i] - max).exp())
        .collect();
    let sum: f64 = weights.iter().sum();
    let probs = weights.iter().map(|w| (w / sum) as f32).collect();
    (order.into_iter().map(|i| i as u32).collect(), probs)
}

/// A prompt set's `(system, prompt)` pairs.
pub type PromptSet = HashSet<(Option<String>, String)>;

/// A greedy continuation and, per token, the top k ids and probabilities
/// of the distribution it was chosen from.
#[derive(Default)]
struct Continuation {
    tokens: Vec<u32>,
    top_ids: Vec<Vec<u32>>,
    top_probs: Vec<Vec<f32>>,
}

/// The prompts of the task generators from `settings.prompt_seed` on (one
/// suite per seed, each shuffled by its seed), without those of `exclude`.
fn candidate_items(seed: u64, exclude: &PromptSet) -> Vec<SuiteItem> {
    let mut items = lcut_engine::suite::generate(seed);
    let mut rng = SplitMix(seed);
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i + 1));
    }
    items.retain(|it| !exclude.contains(&(it.system.clone(), it.prompt.clone())));
    items
}

/// Make the teacher records for `settings`, showing progress on `on_record`:
/// the full model's greedy continuations of the chosen prompts, decoded
/// side by side ([`run_together`]: the same tokens as one at a time).
pub fn make(
    session: &Session,
    settings: &TeacherSettings,
    exclude: &PromptSet,
    mut on_record: impl FnMut(),
) -> Result<Vec<TeacherRecord>> {
    let chosen = choose_prompts(session, settings, exclude)?;
    let full = Policy::full(session.model.config().num_layers);
    let config = session.greedy_config(settings.max_new_tokens);
    let jobs = chosen
        .iter()
        .map(|(_, _, p)| Generation::new(&session.model, p.clone(), full, config.clone()));
    let mut continued: Vec<Continuation> = chosen.iter().map(|_| Continuation::default()).collect();
    let mut failure = None;
    let on_step = |i: usize, step: &Step| match step.logits.to_vec1::<f32>() {
        Ok(row) => {
            let (ids, probs) = top_k(&row, settings.top_k);
            let c = &mut continued[i];
            c.tokens.push(step.token);
            c.top_ids.push(ids);
            c.top_probs.push(probs);
            true
        }
        Err(e) => {
            failure = Some(e);
            false
        }
    };
    let ran = run_together(jobs, on_step, |_, _| on_record());
    if let Some(e) = failure {
        return Err(TrainError::Candle(e));
    }
    ran?;
    Ok(chosen
        .into_iter()
        .zip(continued)
        .map(|((id, item, prompt), c)| TeacherRecord {
            id,
            kind: item.kind,
            system: item.system,
            prompt: item.prompt,
            prompt_ids: prompt.ids,
            continuation: c.tokens,
            top_ids: c.top_ids,
            top_probs: c.top_probs,
        })
        .collect())
}

/// The first `settings.prompts` candidate prompts of at most
/// `settings.max_prompt_tokens` tokens (fewer where the model's positions
/// leave less room beside the new tokens), named by seed and item; refused
/// when 64 generator seeds do not hold that many.
fn choose_prompts(
    session: &Session,
    settings: &TeacherSettings,
    exclude: &PromptSet,
) -> Result<Vec<(String, SuiteItem, PreparedPrompt)>> {
    let positions = session.model.config().max_position_embeddings;
    let room = positions.saturating_sub(settings.max_new_tokens);
    let longest = settings.max_prompt_tokens.min(room);
    let mut chosen = Vec::with_capacity(settings.prompts);
    for seed in settings.prompt_seed..settings.prompt_seed + 64 {
        for item in candidate_items(seed, exclude) {
            if chosen.len() == settings.prompts {
                return Ok(chosen);
            }
            let prompt = session.prepare_text(&item.prompt, item.system.as_deref(), true)?;
            if prompt.ids.len() <= longest {
                chosen.push((format!("seed{seed}/{}", item.id), item, prompt));
            }
        }
    }
    if chosen.len() < settings.prompts {
        let why = match longest < settings.max_prompt_tokens {
            true => format!(
                " (the model's {positions} positions less the {} new tokens)",
                settings.max_new_tokens
            ),
            false => String::new(),
        };
        refuse!(
            "only {} prompts of at most {longest} tokens{why} in 64 generator seeds; ask for fewer",
            chosen.len(),
        );
    }
    Ok(chosen)
}

/// Read a teacher file made with `settings`; `Ok(None)` when there is none.
pub fn read(path: &Path, settings: &TeacherSettings) -> Result<Option<Vec<TeacherRecord>>> {
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    let Some(head) = lines.next() else {
        refuse!("teacher file {} is empty", path.display());
    };
    let made: TeacherSettings = serde_json::from_str(head)
        .with_context(|| format!("teacher file {} line 1: not its settings", path.display()))?;
    let json = |s: &TeacherSettings| {
        serde_json::to_string(s).with_context(|| format!("teacher file {}", path.display()))
    };
    if &made != settings {
        refuse!(
            "teacher file {} was made with {}, this run asks for {}: give another --teacher file",
            path.display(),
            json(&made)?,
            json(settings)?
        );
    }
    let records = lines
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str::<TeacherRecord>(line)
                .with_context(|| format!("teacher file {} line {}", path.display(), i + 2))
        })
        .collect::<Result<Vec<_>>>()?;
    if records.len() != settings.prompts {
        refuse!(
            "teacher file {} has {} records, its settings say {}",
            path.display(),
            records.len(),
            settings.prompts
        );
    }
    Ok(Some(records))
}

impl TeacherRecord {
    /// The item's kind.
    pub fn kind(&self) -> &str {
        match self.kind.is_empty() {
            false => &self.kind,
            true => {
                let item = self.id.rsplit('/').next().unwrap_or(&self.id);
                item.split('-').next().unwrap_or(item)
            }
        }
    }
}

/// Indices into `records` in which every kind is as frequent as the most
/// frequent one: each record of a rarer kind is repeated (its kind's
/// records in turn) until its kind has as many entries.
pub fn balanced_by_kind(records: &[TeacherRecord]) -> Vec<usize> {
    let mut kinds: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        match kinds.iter_mut().find(|(k, _)| *k == r.kind()) {
            Some((_, list)) => list.push(i),
            None => kinds.push((r.kind(), vec![i])),
        }
    }
    let most = kinds.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
    kinds
        .iter()
        .flat_map(|(_, list)| list.iter().copied().cycle().take(most))
        .collect()
}

/// Write `records` with their settings as the first line, atomically.
pub fn write(path: &Path, settings: &TeacherSettings, records: &[TeacherRecord]) -> Result<()> {
    let writing = || format!("writing {}", path.display());
    let mut text = serde_json::to_string(settings).with_context(writing)?;
    text.push('\n');
    for r in records {
        text.push_str(&serde_json::to_string(r).with_context(writing)?);
        text.push('\n');
    }
    lcut_model::lora::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The `(system, prompt)` pairs of the suite at `path` and the hash of its bytes.
pub fn suite_prompts(path: &Path) -> Result<(PromptSet, String)> {
    let (items, hash) =
        lcut_engine::suite::read_suite_hashed(path).map_err(lcut_engine::EngineError::from)?;
    let set = items.into_iter().map(|it| (it.system, it.prompt)).collect();
    Ok((set, hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_keeps_the_largest_and_renormalises() {
        let logits = [0.5, 3.0, -1.0, 3.0, 2.0];
        let (ids, probs) = top_k(&logits, 3);
        assert_eq!(ids, vec![1, 3, 4]);
        let e = [1.0f64, 1.0, (-1.0f64).exp()];
        let sum: f64 = e.iter().sum();
        for (p, want) in probs.iter().zip(e.iter().map(|x| x / sum)) {
            assert!((f64::from(*p) - want).abs() < 1e-6, "{probs:?}");
        }
        // k beyond the vocabulary keeps everything
        assert_eq!(top_k(&logits, 9).0.len(), 5);
    }

    #[test]
    fn balancing_repeats_the_rarer_kinds() {
        let record = |id: &str, kind: &str| TeacherRecord {
            id: id.into(),
            kind: kind.into(),
            system: None,
            prompt: String::new(),
            prompt_ids: vec![],
            continuation: vec![],
            top_ids: vec![],
            top_probs: vec![],
        };
        let records = [
            record("seed1/copy-00", "copy"),
            record("seed1/copy-01", "copy"),
            record("seed1/copy-02", "copy"),
            record("seed1/arithmetic-00", ""),
            record("seed1/lookup-00", "lookup"),
            record("seed1/lookup-01", "lookup"),
        ];
        assert_eq!(records[3].kind(), "arithmetic");
        let picked = balanced_by_kind(&records);
        assert_eq!(picked, vec![0, 1, 2, 3, 3, 3, 4, 5, 4]);
    }

    #[test]
    fn a_teacher_file_made_otherwise_is_refused_by_name() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("teacher.jsonl");
        let settings = TeacherSettings {
            base_fingerprint: "1,2".into(),
            prompt_seed: 101,
            prompts: 1,
            max_prompt_tokens: 100,
            max_new_tokens: 4,
            top_k: 2,
            excluded_suite_hash: None,
        };
        let record = TeacherRecord {
            id: "seed101/x".into(),
            kind: "x".into(),
            system: None,
            prompt: "hi".into(),
            prompt_ids: vec![1, 2],
            continuation: vec![3],
            top_ids: vec![vec![3, 4]],
            top_probs: vec![vec![0.75, 0.25]],
        };
        assert!(read(&path, &settings)?.is_none());
        write(&path, &settings, std::slice::from_ref(&record))?;
        assert_eq!(read(&path, &settings)?, Some(vec![record]));
        let other = TeacherSettings {
            top_k: 8,
            ..settings
        };
        let err = read(&path, &other).unwrap_err().to_string();
        assert!(
            err.contains("was made with") && err.contains("teacher.jsonl"),
            "{err}"
        );
        Ok(())
    }
}
