//! RULER-style long-context tasks (Hsieh et al., *RULER: What's the Real
//! Context Size of Your Long-Context Language Models?*, 2024), written by
//! lcut from a seed and sized to a target length in a model's own tokens:
//! needle in a haystack (`niah_single_1/2/3`, `niah_multikey_1/2/3`,
//! `niah_multivalue`, `niah_multiquery`), variable tracking (`vt`), common
//! and frequent words extraction (`cwe`, `fwe`) and question answering
//! (`qa_1`, `qa_2`, over lcut's own documents: see [`qa`]).
//!
//! Each item is split as kvpress's RULER data is: the context (which a
//! policy may compress) before the decode start, then the question and the
//! answer stem after it, at full depth. A sample's prompt and its task's
//! new-token budget (RULER's: 128 for niah, 30 vt, 120 cwe, 50 fwe, 32 qa)
//! fit the target; the haystack is the largest that does, found by search
//! over its units (words, lines, list entries or documents), so the prompt
//! comes within one unit of the target.

mod cwe;
mod fwe;
mod haystack;
mod niah;
mod qa;
mod vt;
mod words;

use super::{Scoring, SuiteItem};
use crate::error::Result;
use crate::text_prompt::PromptTokenizer;
use cwe::CommonWords;
use fwe::FrequentWords;
use haystack::ValueKind;
use niah::{Haystack, Niah};
use qa::Qa;
use vt::VariableTracking;

/// What a task builds for one sample at one size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parts {
    /// The context, before the decode start.
    pub context: String,
    /// The question, after it.
    pub question: String,
    /// The answer stem.
    pub answer_prefix: String,
    /// The reference strings.
    pub answers: Vec<String>,
}

/// A RULER task lcut generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RulerTask {
    /// One number in noise.
    NiahSingle1,
    /// One number in the essay.
    NiahSingle2,
    /// One UUID in the essay.
    NiahSingle3,
    /// One of four keys in the essay.
    NiahMultikey1,
    /// One number among distractor needles.
    NiahMultikey2,
    /// One UUID among distractor UUID needles.
    NiahMultikey3,
    /// Four values of one key.
    NiahMultivalue,
    /// Four keys asked at once.
    NiahMultiquery,
    /// Variable tracking.
    Vt,
    /// Common words extraction.
    Cwe,
    /// Frequent words extraction.
    Fwe,
    /// One-document QA.
    Qa1,
    /// Two-document (multi-hop) QA.
    Qa2,
}

impl RulerTask {
    /// Every task, in RULER's order.
    pub const ALL: [RulerTask; 13] = [
        RulerTask::NiahSingle1,
        RulerTask::NiahSingle2,
        RulerTask::NiahSingle3,
        RulerTask::NiahMultikey1,
        RulerTask::NiahMultikey2,
        RulerTask::NiahMultikey3,
        RulerTask::NiahMultivalue,
        RulerTask::NiahMultiquery,
        RulerTask::Vt,
        RulerTask::Cwe,
        RulerTask::Fwe,
        RulerTask::Qa1,
        RulerTask::Qa2,
    ];

    /// RULER's name of the task.
    pub fn name(self) -> &'static str {
        match self {
            RulerTask::NiahSingle1 => "niah_single_1",
            RulerTask::NiahSingle2 => "niah_single_2",
            RulerTask::NiahSingle3 => "niah_single_3",
            RulerTask::NiahMultikey1 => "niah_multikey_1",
            RulerTask::NiahMultikey2 => "niah_multikey_2",
            RulerTask::NiahMultikey3 => "niah_multikey_3",
            RulerTask::NiahMultivalue => "niah_multivalue",
            RulerTask::NiahMultiquery => "niah_multiquery",
            RulerTask::Vt => "vt",
            RulerTask::Cwe => "cwe",
            RulerTask::Fwe => "fwe",
            RulerTask::Qa1 => "qa_1",
            RulerTask::Qa2 => "qa_2",
        }
    }

    /// The task called `name` (RULER's names), or a named error listing them.
    pub fn parse(name: &str) -> std::result::Result<Self, RulerError> {
        let name = name.trim();
        Self::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| RulerError::UnknownTask {
                name: name.to_string(),
                known: Self::ALL.map(Self::name).join(", "),
            })
    }

    /// Every task of a comma-separated list (`all` for every task).
    pub fn parse_list(text: &str) -> std::result::Result<Vec<Self>, RulerError> {
        if text.trim() == "all" {
            return Ok(Self::ALL.to_vec());
        }
        let mut out: Vec<Self> = Vec::new();
        for name in text.split(',').filter(|s| !s.trim().is_empty()) {
            let task = Self::parse(name)?;
            if !out.contains(&task) {
                out.push(task);
            }
        }
        if out.is_empty() {
            return Err(RulerError::NoTasks);
        }
        Ok(out)
    }

    /// RULER's new-token budget for the task.
    pub fn max_new_tokens(self) -> usize {
        match self {
            RulerTask::Vt => 30,
            RulerTask::Cwe => 120,
            RulerTask::Fwe => 50,
            RulerTask::Qa1 | RulerTask::Qa2 => 32,
            _ => 128,
        }
    }

    /// RULER's scoring: `string_match_part` for QA, `string_match_all` else.
    pub fn scoring(self) -> Scoring {
        match self {
            RulerTask::Qa1 | RulerTask::Qa2 => Scoring::StringMatchPart,
            _ => Scoring::StringMatchAll,
        }
    }

    /// The task's generator for a target of `target` tokens.
    fn builder(self, target: usize) -> Builder {
        let niah = |haystack, key, value, (keys, values, queries)| {
            Builder::Niah(Niah {
                haystack,
                key,
                value,
                keys,
                values,
                queries,
            })
        };
        use Haystack::{Essay, Needle, Noise};
        use ValueKind::{Numbers, Uuids, Words};
        match self {
            RulerTask::NiahSingle1 => niah(Noise, Words, Numbers, (1, 1, 1)),
            RulerTask::NiahSingle2 => niah(Essay, Words, Numbers, (1, 1, 1)),
            RulerTask::NiahSingle3 => niah(Essay, Words, Uuids, (1, 1, 1)),
            RulerTask::NiahMultikey1 => niah(Essay, Words, Numbers, (4, 1, 1)),
            RulerTask::NiahMultikey2 => niah(Needle, Words, Numbers, (1, 1, 1)),
            RulerTask::NiahMultikey3 => niah(Needle, Uuids, Uuids, (1, 1, 1)),
            RulerTask::NiahMultivalue => niah(Essay, Words, Numbers, (1, 4, 1)),
            RulerTask::NiahMultiquery => niah(Essay, Words, Numbers, (1, 1, 4)),
            RulerTask::Vt => Builder::Vt(VariableTracking {
                hops: 4,
                // RULER's worked example is sized to 500 tokens: about 20
                // noise lines; fewer below 4K, so that short targets fit
                example_lines: (target / 200).clamp(2, 20),
            }),
            RulerTask::Cwe => Builder::Cwe(CommonWords::for_target(target)),
            RulerTask::Fwe => {
                Builder::Fwe(FrequentWords::for_target(target, self.max_new_tokens()))
            }
            RulerTask::Qa1 => Builder::Qa(Qa { hops: 1 }),
            RulerTask::Qa2 => Builder::Qa(Qa { hops: 2 }),
        }
    }
}

impl std::fmt::Display for RulerTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A task's generator.
#[derive(Debug, Clone, Copy)]
enum Builder {
    Niah(Niah),
    Vt(VariableTracking),
    Cwe(CommonWords),
    Fwe(FrequentWords),
    Qa(Qa),
}

impl Builder {
    /// The smallest size.
    fn min_units(&self) -> usize {
        match self {
            Builder::Niah(b) => b.min_units(),
            Builder::Vt(_) => 1,
            Builder::Cwe(b) => b.min_units(),
            Builder::Fwe(b) => b.min_units(),
            Builder::Qa(b) => b.min_units(),
        }
    }

    /// A first guess of the size for `tokens` tokens (the search corrects it).
    fn guess(&self, tokens: usize) -> usize {
        let per_unit = match self {
            Builder::Niah(Niah {
                haystack: Haystack::Essay,
                ..
            }) => 1.3,
            Builder::Niah(Niah {
                haystack: Haystack::Noise,
                ..
            })
            | Builder::Vt(_) => 22.0,
            Builder::Niah(_) => 30.0,
            Builder::Cwe(b) => 4.0 * (b.repeats.1 as f64),
            Builder::Fwe(_) => 2.5,
            Builder::Qa(_) => 70.0,
        };
        ((tokens as f64 / per_unit) as usize).max(self.min_units())
    }

    /// The sample of `seed` at size `n`.
    fn build(&self, seed: u64, n: usize) -> Parts {
        match self {
            Builder::Niah(b) => b.build(seed, n),
            Builder::Vt(b) => b.build(seed, n),
            Builder::Cwe(b) => b.build(seed, n),
            Builder::Fwe(b) => b.build(seed, n),
            Builder::Qa(b) => b.build(seed, n),
        }
    }
}

/// What is wrong with a RULER request.
#[derive(Debug, thiserror::Error)]
pub enum RulerError {
    /// A task lcut does not generate.
    #[error("unknown RULER task {name:?}: lcut generates {known}")]
    UnknownTask {
        /// The name given.
        name: String,
        /// The names lcut knows.
        known: String,
    },
    /// No task was named.
    #[error("no RULER task given (name some of them, or `all`)")]
    NoTasks,
    /// The target is longer than the model's context.
    #[error(
        "RULER length {target} is past the model's context of {context} tokens \
         (max_position_embeddings): give at most {context}"
    )]
    PastContext {
        /// The target, tokens.
        target: usize,
        /// The model's context, tokens.
        context: usize,
    },
    /// The target cannot hold a task's smallest prompt and its budget.
    #[error(
        "RULER length {target} is too short for {task}: its smallest prompt has {tokens} tokens \
         and the task asks for {budget} new tokens"
    )]
    TooShort {
        /// The task.
        task: &'static str,
        /// The target, tokens.
        target: usize,
        /// Tokens of the task's smallest prompt.
        tokens: usize,
        /// The task's new tokens.
        budget: usize,
    },
    /// No samples asked for.
    #[error("--samples must be at least 1")]
    NoSamples,
}

/// What [`generate_ruler`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulerOptions {
    /// Target length: prompt tokens and the task's new tokens, at most.
    pub target: usize,
    /// The model's context (its largest position count); the target must fit.
    pub context: usize,
    /// Samples per task.
    pub samples: usize,
    /// Seed of every draw.
    pub seed: u64,
    /// The tasks, in the order written.
    pub tasks: Vec<RulerTask>,
    /// Completion form (no chat template, the question ending in the answer
    /// stem) rather than chat form.
    pub completion: bool,
}

/// `4096` as `4k`, `6000` as `6000`: a suite's length label.
pub fn length_label(tokens: usize) -> String {
    if tokens.is_multiple_of(1024) {
        format!("{}k", tokens / 1024)
    } else {
        tokens.to_string()
    }
}

/// The RULER items of `opts` for the model whose tokenizer is `tok`: per
/// task (in order) `samples` items, each a pure function of the seed, the
/// task, its number and the target, sized so that its prompt (as the model
/// runs it) and its task's budget fit the target. A target past the
/// model's context, or too short for a task's smallest prompt, is a named
/// error before anything is written.
pub fn generate_ruler(tok: &PromptTokenizer, opts: &RulerOptions) -> Result<Vec<SuiteItem>> {
    if opts.target > opts.context {
        return Err(RulerError::PastContext {
            target: opts.target,
            context: opts.context,
        }
        .into());
    }
    if opts.samples == 0 {
        return Err(RulerError::NoSamples.into());
    }
    if opts.tasks.is_empty() {
        return Err(RulerError::NoTasks.into());
    }
    let label = length_label(opts.target);
    let mut items = Vec::with_capacity(opts.tasks.len() * opts.samples);
    for &task in &opts.tasks {
        let builder = task.builder(opts.target);
        let budget = task.max_new_tokens();
        let room = opts.target.saturating_sub(budget);
        let mut hint = builder.guess(room);
        for k in 0..opts.samples {
            // each task's samples draw from their own streams: a task's
            // items do not change when other tasks are added
            let seed = sample_seed(opts.seed, task, k);
            let item_at = |n: usize| {
                let parts = builder.build(seed, n);
                SuiteItem {
                    id: format!("{}-{k:03}", task.name()),
                    kind: task.name().into(),
                    length: label.clone(),
                    prompt: parts.context,
                    question: Some(parts.question),
                    answer_prefix: Some(parts.answer_prefix),
                    completion: opts.completion,
                    max_new_tokens: Some(budget),
                    answer: parts.answers.join(", "),
                    scoring: task.scoring(),
                    answers: parts.answers,
                    ..SuiteItem::default()
                }
            };
            let tokens =
                |n: usize| -> Result<usize> { Ok(item_at(n).prepare_tokenized(tok)?.len()) };
            let min = builder.min_units();
            let smallest = tokens(min)?;
            if smallest > room {
                return Err(RulerError::TooShort {
                    task: task.name(),
                    target: opts.target,
                    tokens: smallest,
                    budget,
                }
                .into());
            }
            let n = largest_fitting(min, hint, |n| Ok(tokens(n)? <= room))?;
            hint = n;
            items.push(item_at(n));
        }
    }
    Ok(items)
}

/// The seed of sample `k` of `task`.
fn sample_seed(seed: u64, task: RulerTask, k: usize) -> u64 {
    let t = RulerTask::ALL.iter().position(|&x| x == task).unwrap_or(0) as u64;
    let mut rng = super::rng::Rng::new(seed, 0x5255_4c45_5200 + (t << 24) + k as u64);
    rng.next_u64()
}

/// The largest size from `min` (which fits) on for which `fits` holds,
/// searched from `hint`: doubling steps to bracket it, then bisection.
/// Sizes are assumed to grow the prompt.
fn largest_fitting(
    min: usize,
    hint: usize,
    mut fits: impl FnMut(usize) -> Result<bool>,
) -> Result<usize> {
    let hint = hint.max(min);
    let (mut lo, mut hi) = if hint > min && !fits(hint)? {
        (min, hint)
    } else {
        let mut lo = hint;
        let mut step = (hint / 16).max(1);
        loop {
            let next = lo + step;
            if fits(next)? {
                lo = next;
                step *= 2;
            } else {
                break (lo, next);
            }
        }
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_round_trip_and_unknown_ones_are_named() {
        for t in RulerTask::ALL {
            assert_eq!(RulerTask::parse(t.name()).unwrap(), t);
        }
        let err = RulerTask::parse("niah_single_9").unwrap_err().to_string();
        assert!(
            err.contains("niah_single_9") && err.contains("qa_2"),
            "{err}"
        );
        assert_eq!(RulerTask::parse_list("all").unwrap().len(), 13);
        assert_eq!(
            RulerTask::parse_list("vt, cwe,vt").unwrap(),
            [RulerTask::Vt, RulerTask::Cwe]
        );
        assert!(matches!(
            RulerTask::parse_list(" , "),
            Err(RulerError::NoTasks)
        ));
        assert_eq!(RulerTask::Qa1.scoring(), Scoring::StringMatchPart);
        assert_eq!(RulerTask::Cwe.max_new_tokens(), 120);
        assert_eq!(length_label(4096), "4k");
        assert_eq!(length_label(1000), "1000");
    }

    #[test]
    fn the_search_finds_the_largest_fitting_size_from_any_hint() {
        for hint in [1, 7, 50, 99, 100, 101, 5000] {
            let mut calls = 0;
            let n = largest_fitting(1, hint, |n| {
                calls += 1;
                Ok(n * 3 <= 300)
            })
            .unwrap();
            assert_eq!(n, 100, "hint {hint}");
            assert!(calls < 40, "{calls} calls from {hint}");
        }
    }

    #[test]
    fn every_task_builds_a_sample_with_its_answers_in_its_context() {
        for task in RulerTask::ALL {
            let b = task.builder(4096);
            let p = b.build(11, b.guess(1500));
            assert!(!p.answers.is_empty(), "{task}");
            for a in &p.answers {
                assert!(p.context.contains(a.as_str()), "{task}: {a}");
                assert!(!p.question.contains(a.as_str()), "{task}");
            }
            assert_eq!(b.build(11, b.guess(1500)), p, "{task} is not deterministic");
        }
    }
}
