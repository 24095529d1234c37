//! What one unit of each part gives, as its part file keeps it: enough to
//! rebuild every figure and table, and to join the units of shards.

use lcut_engine::suite::ItemResult;
use lcut_trace::PromptTrace;
use serde::{Deserialize, Serialize};

/// A diagnosed suite item (Figures 1 and 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagUnit {
    /// The item's kind.
    pub kind: String,
    /// The greedy run's trace under the part's policy.
    pub trace: PromptTrace,
}

/// A retrieval item's answers at each cut (Figure 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievalUnit {
    /// The item's length label.
    pub length: String,
    /// Its prompt tokens (chat template included).
    pub prompt_tokens: usize,
    /// `(policy, answered)` per policy.
    pub answers: Vec<(String, bool)>,
}

/// One policy's result on one suite item (the table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableEntry {
    /// The policy, resolved.
    pub policy: String,
    /// The adapter's folder, when the policy ran with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// Its result, as `lcut eval --suite` records it.
    pub result: ItemResult,
}

/// One policy's long greedy generation of one item (the loops).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopEntry {
    /// The policy, resolved.
    pub policy: String,
    /// The generated tokens, a final stop token left out.
    pub tokens: Vec<u32>,
    /// Whether it ended on a stop token.
    pub stopped: bool,
    /// The generated text.
    pub text: String,
}
