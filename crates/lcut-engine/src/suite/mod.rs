//! Task suites with verifiable answers: JSON Lines of chat prompts, each
//! with its expected answer and scoring rule, read with named errors, and
//! the project's own suite written from a seed ([`generate`]).

mod cutoffs;
mod eval;
mod filler;
mod generate;
mod read;
mod result;
mod rng;
mod score;

pub use cutoffs::{CutoffEvalOptions, accuracy_by_cutoff, smallest_cut_within};
pub use eval::{SuiteEvalOptions, evaluate_suite, evaluate_suite_until, resolve_policy};
pub use generate::{
    COMPLETION_SUITE, Form, SMOLLM2_SUITE, SMOLLM2_SUITE_SEED, generate, generate_in, to_jsonl,
};
pub use read::{SuiteError, parse_suite, read_suite, read_suite_hashed};
pub use result::{GroupScore, ItemResult, SuiteEval, merge_evals, score_group, summarize, wilson};
pub use score::{Scoring, is_correct, normalize};

use serde::{Deserialize, Serialize};

/// One scored item of a suite (one JSON line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The user message.
    pub prompt: String,
    /// The expected answer.
    pub answer: String,
    /// How a generation is scored against the answer.
    pub scoring: Scoring,
    /// The options of a `choice` item (the answer is one of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
}

impl SuiteItem {
    /// Whether `generation` answers this item.
    pub fn is_correct(&self, generation: &str) -> bool {
        is_correct(self.scoring, &self.answer, &self.choices, generation)
    }
}
