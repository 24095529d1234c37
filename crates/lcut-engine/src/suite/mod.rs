//! Task suites with verifiable answers: JSON Lines of chat prompts, each
//! with its expected answer and scoring rule, read with named errors, the
//! project's own suite written from a seed ([`generate`]), and RULER-style
//! long-context tasks sized in a model's own tokens ([`generate_ruler`]).

mod branch_memory;
mod cutoffs;
mod eval;
mod filler;
mod generate;
mod read;
mod result;
mod rng;
mod ruler;
mod score;

pub use branch_memory::{ItemMemory, planned_share};
pub use cutoffs::{CutoffEvalOptions, accuracy_by_cutoff, cutoff_memory, smallest_cut_within};
pub use eval::{
    SuiteEvalOptions, evaluate_suite, evaluate_suite_until, largest_item_memory, resolve_policy,
};
pub(crate) use eval::{check_items, evaluate_item};
pub use generate::{
    COMPLETION_SUITE, Form, SMOLLM2_SUITE, SMOLLM2_SUITE_SEED, generate, generate_in, to_jsonl,
};
pub use read::{SuiteError, parse_suite, read_suite, read_suite_hashed};
pub use result::{
    GroupScore, ItemResult, SuiteEval, merge_evals, score_group, summarize, wilson, wilson_mean,
};
pub use ruler::{RulerError, RulerOptions, RulerTask, generate_ruler, length_label};
pub use score::{Scoring, is_correct, normalize, string_match};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::prompt::PreparedPrompt;
use crate::text_prompt::SplitPrompt;

/// One scored item of a suite (one JSON line).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuiteItem {
    /// Identifier, unique within the suite.
    pub id: String,
    /// Kind of task (`retrieval`, `copy`, `lookup`, `choice`, `arithmetic`, ...).
    pub kind: String,
    /// Length label (`256`, `512`, `1k`, `2k` prompt tokens, or `short`).
    pub length: String,
    /// A finer label within the kind (e.g. the depth of a retrieval fact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Optional system message (the model's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The user message; with a `question`, its first part, the context.
    pub prompt: String,
    /// The question, after the context and after the decode start: it and
    /// the answer stem are decode-phase tokens (at full depth under SPEED,
    /// never compressed), as in kvpress's pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// The start of the answer, put after the generation prompt (chat) or
    /// after the question and a newline (completion); needs a `question`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_prefix: Option<String>,
    /// Written as a completion (BoS, context, question, answer stem) rather
    /// than through the model's chat template.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub completion: bool,
    /// The new-token budget the task asks for (RULER's per task); a run's
    /// `--max-new-tokens` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    /// The expected answer.
    pub answer: String,
    /// How a generation is scored against the answer.
    pub scoring: Scoring,
    /// The options of a `choice` item (the answer is one of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// The reference strings of a `string_match_all` or `string_match_part`
    /// item (`answer` alone when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<String>,
}

impl SuiteItem {
    /// Whether `generation` answers this item (a graded item: all of it).
    pub fn is_correct(&self, generation: &str) -> bool {
        match self.scoring {
            Scoring::StringMatchAll | Scoring::StringMatchPart => self.score(generation) >= 1.0,
            rule => is_correct(rule, &self.answer, &self.choices, generation),
        }
    }

    /// The score of `generation` in [0, 1]: RULER's string match over the
    /// references for those rules, 1 or 0 for the others.
    pub fn score(&self, generation: &str) -> f64 {
        match self.scoring {
            Scoring::StringMatchAll | Scoring::StringMatchPart => {
                string_match(self.scoring, &self.references(), generation)
            }
            rule => f64::from(u8::from(is_correct(
                rule,
                &self.answer,
                &self.choices,
                generation,
            ))),
        }
    }

    /// The reference strings: `answers`, or `answer` alone.
    pub fn references(&self) -> Vec<String> {
        if self.answers.is_empty() {
            vec![self.answer.clone()]
        } else {
            self.answers.clone()
        }
    }

    /// The prompt the model runs: the user message through the chat
    /// template (or raw for a `completion` item), or, with a `question`,
    /// the context before the decode start and the question and answer
    /// stem after it ([`SplitPrompt`]).
    pub fn prepare(&self, session: &crate::Session) -> Result<PreparedPrompt> {
        match self.split() {
            Some(parts) => session.prepare_split(parts, !self.completion),
            None => session.prepare_text(&self.prompt, self.system.as_deref(), !self.completion),
        }
    }

    /// [`SuiteItem::prepare`] with a model's tokenizer alone (no weights).
    pub fn prepare_tokenized(&self, tok: &crate::PromptTokenizer) -> Result<PreparedPrompt> {
        match self.split() {
            Some(parts) => tok.prepare_split(parts, !self.completion),
            None => tok.prepare_text(&self.prompt, self.system.as_deref(), !self.completion),
        }
    }

    /// The item's budget of new tokens: `run_budget` when the run sets one,
    /// else the item's own, else `default`.
    pub fn budget(&self, run_budget: Option<usize>, default: usize) -> usize {
        run_budget.or(self.max_new_tokens).unwrap_or(default)
    }

    /// The two parts of an item with a question.
    fn split(&self) -> Option<SplitPrompt<'_>> {
        self.question.as_deref().map(|question| SplitPrompt {
            context: &self.prompt,
            question,
            answer_prefix: self.answer_prefix.as_deref().unwrap_or(""),
            system: self.system.as_deref(),
        })
    }
}
