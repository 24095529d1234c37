//! The SPEED paper's evidence for one model, as `lcut paper` writes it:
//! what each of its six parts found, each with the command and settings
//! that made it (or the note saying why it was skipped).
//!
//! The parts follow the paper: decode-time attention mass per layer, full
//! beside SPEED+BoS (Figure 1); TTFT, TPOT and K/V held against prompt
//! length, measured beside the cost model's prediction (Figure 2); prefill
//! mass, prompt entropy and curvature per layer for each category of a task
//! suite (Figure 3); exact match by prompt length on retrieval (Figure 4);
//! the category table with the efficiency columns (Table 2 in miniature);
//! and the share of generations that end in a repetition loop.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::curves::LayerCurves;
use crate::identity::ModelIdentity;
use crate::report::SuiteSource;

/// The version of [`PaperReport`]'s JSON form.
pub const PAPER_SCHEMA_VERSION: u32 = 1;

/// One of the paper's six parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PaperPart {
    /// Figure 1: decode-time attention mass per layer, full beside SPEED+BoS.
    Masses,
    /// Figure 2: TTFT, TPOT and K/V held against prompt length.
    Timing,
    /// Figure 3: prefill mass, prompt entropy and curvature per layer, per category.
    Layers,
    /// Figure 4: exact match by prompt length on retrieval.
    Retrieval,
    /// Table 2 in miniature: accuracy per category with the efficiency columns.
    Table,
    /// Repetition loops per policy, anchor-free against +BoS.
    Loops,
}

impl PaperPart {
    /// Every part, in the paper's order.
    pub const ALL: [PaperPart; 6] = [
        PaperPart::Masses,
        PaperPart::Timing,
        PaperPart::Layers,
        PaperPart::Retrieval,
        PaperPart::Table,
        PaperPart::Loops,
    ];

    /// The name `--parts` takes and part files are named by.
    pub fn name(self) -> &'static str {
        match self {
            PaperPart::Masses => "masses",
            PaperPart::Timing => "timing",
            PaperPart::Layers => "layers",
            PaperPart::Retrieval => "retrieval",
            PaperPart::Table => "table",
            PaperPart::Loops => "loops",
        }
    }

    /// Its number in the paper's order (1 to 6).
    pub fn number(self) -> usize {
        Self::ALL
            .iter()
            .position(|&p| p == self)
            .map_or(0, |i| i + 1)
    }

    /// A heading for the part.
    pub fn title(self) -> &'static str {
        match self {
            PaperPart::Masses => "Decode-time attention mass per layer, full beside SPEED+BoS",
            PaperPart::Timing => "TTFT, TPOT and K/V held against prompt length",
            PaperPart::Layers => "Prefill mass, prompt entropy and curvature per layer by category",
            PaperPart::Retrieval => "Exact match by prompt length on retrieval",
            PaperPart::Table => "Accuracy per category with the efficiency columns",
            PaperPart::Loops => "Repetition loops, anchor-free against +BoS",
        }
    }
}

impl fmt::Display for PaperPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PaperPart {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|p| p.name() == t || p.number().to_string() == t)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown part {s:?}; the parts are {} (or their numbers 1 to 6)",
                    names.join(", ")
                )
            })
    }
}

/// How a part came out: written with its command and settings, or skipped
/// with the reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartRecord {
    /// The part.
    pub part: PaperPart,
    /// Whether its results are in the report.
    pub written: bool,
    /// The command that makes this part again.
    pub command: String,
    /// The settings it was made with (what a resumed run must match).
    pub settings: serde_json::Value,
    /// Why it was skipped, or what to keep in mind reading it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The per-layer curves of one policy's diagnostic runs (Figure 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyCurves {
    /// The policy, resolved against the model's depth.
    pub policy: String,
    /// Prompts the curves are over.
    pub prompts: usize,
    /// Masses, entropies and curvature per layer.
    pub curves: LayerCurves,
}

/// The per-layer curves of one category of the suite at full depth (Figure 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryCurves {
    /// The suite items' `kind`.
    pub kind: String,
    /// Prompts the curves are over.
    pub prompts: usize,
    /// Masses, entropies and curvature per layer.
    pub curves: LayerCurves,
}

/// One policy at one prompt length (Figure 2): measured times and K/V, and
/// the cost model's prediction of each ratio to full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingPoint {
    /// The policy, resolved.
    pub policy: String,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// New tokens generated.
    pub new_tokens: usize,
    /// Time to first token, seconds (median over repeats).
    pub ttft_s: f64,
    /// Time per output token after the first, seconds (median).
    pub tpot_s: f64,
    /// K/V bytes held at the end.
    pub kv_bytes: u64,
    /// TTFT over full's at this length, measured.
    pub ttft_ratio: f64,
    /// TPOT over full's, measured.
    pub tpot_ratio: f64,
    /// K/V held over full's, measured.
    pub kv_ratio: f64,
    /// Prefill FLOPs over full's (the FLOP model): the TTFT prediction.
    pub predicted_ttft_ratio: f64,
    /// Bytes one decode step reads (weights and the K/V decode reads) over
    /// full's: the TPOT prediction.
    pub predicted_tpot_ratio: f64,
    /// K/V held by the cost formula over full's.
    pub predicted_kv_ratio: f64,
}

/// Exact match of one policy on the retrieval items of one length class (Figure 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LengthAccuracy {
    /// The policy, resolved.
    pub policy: String,
    /// The items' length label (`256`, `1k`, ...).
    pub length: String,
    /// Mean prompt tokens of those items (chat template included).
    pub mean_prompt_tokens: f64,
    /// Items answered.
    pub correct: usize,
    /// Items.
    pub n: usize,
    /// `correct / n`.
    pub accuracy: f64,
    /// 95% Wilson interval.
    pub ci95: [f64; 2],
}

/// One row of the category table: a policy (with an adapter or not) on one
/// group of items (`all` or a kind).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryRow {
    /// The policy, resolved.
    pub policy: String,
    /// The adapter the policy ran with (its folder), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// `all` or a kind.
    pub group: String,
    /// Items.
    pub n: usize,
    /// Items answered.
    pub correct: usize,
    /// `correct / n`.
    pub accuracy: f64,
    /// 95% Wilson interval.
    pub ci95: [f64; 2],
    /// Items the full model answered.
    pub full_correct: usize,
    /// Top-1 agreement with full, teacher-forced on full's answers.
    pub top1_agreement: f64,
    /// Mean KL(full || policy) per teacher-forced token, nats.
    pub mean_kl: f64,
    /// K/V held over full's on these items.
    pub kv_ratio: f64,
    /// TTFT over full's at the longest timed length (when timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ratio: Option<f64>,
    /// TPOT over full's at the longest timed length (when timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ratio: Option<f64>,
}

/// Repetition loops of one policy's greedy generations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopRow {
    /// The policy, resolved.
    pub policy: String,
    /// The policy written without its anchors (`speed:22`), pairing the
    /// anchor-free and +BoS rows.
    pub family: String,
    /// `none` or `bos`.
    pub anchors: String,
    /// Generations.
    pub generations: usize,
    /// Generations that end in a repeated suffix.
    pub looping: usize,
    /// `looping / generations`.
    pub share: f64,
    /// 95% Wilson interval of the share.
    pub ci95: [f64; 2],
    /// Generations that ended on a stop token.
    pub stopped: usize,
    /// Mean period of the loops, tokens (0 without loops).
    pub mean_period: f64,
}

/// Everything `lcut paper` found for one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaperReport {
    /// [`PAPER_SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// The tool that made it.
    pub tool_version: String,
    /// The model.
    pub model: ModelIdentity,
    /// The task suite (with the shard run, if one).
    pub suite: SuiteSource,
    /// The cutoff C of the comparisons (SPEED, SelfOnly, ... at C).
    pub cut: usize,
    /// Where C came from (`--cut`, or lcut's recommendation).
    pub cut_source: String,
    /// lcut's recommended L_cut on the diagnosed items, when diagnosed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended: Option<usize>,
    /// Every part: written with its command and settings, or skipped.
    pub parts: Vec<PartRecord>,
    /// Figure 1: full, then SPEED+BoS at C.
    #[serde(default)]
    pub masses: Vec<PolicyCurves>,
    /// Figure 2.
    #[serde(default)]
    pub timing: Vec<TimingPoint>,
    /// Figure 3.
    #[serde(default)]
    pub layers: Vec<CategoryCurves>,
    /// Figure 4.
    #[serde(default)]
    pub retrieval: Vec<LengthAccuracy>,
    /// The category table.
    #[serde(default)]
    pub table: Vec<CategoryRow>,
    /// The prompt length the table's TTFT and TPOT ratios were timed at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_timed_at: Option<usize>,
    /// The repetition loops.
    #[serde(default)]
    pub loops: Vec<LoopRow>,
}

impl PaperReport {
    /// The record of `part`, when the report has one.
    pub fn record(&self, part: PaperPart) -> Option<&PartRecord> {
        self.parts.iter().find(|r| r.part == part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_by_name_or_number_and_list_the_choices() {
        for p in PaperPart::ALL {
            assert_eq!(p.name().parse::<PaperPart>().unwrap(), p);
            assert_eq!(p.number().to_string().parse::<PaperPart>().unwrap(), p);
        }
        assert_eq!(PaperPart::Masses.number(), 1);
        assert_eq!(PaperPart::Loops.number(), 6);
        let e = "figures".parse::<PaperPart>().unwrap_err();
        assert!(e.contains("figures") && e.contains("masses, timing"), "{e}");
        let json = serde_json::to_string(&PaperPart::Retrieval).unwrap();
        assert_eq!(json, "\"retrieval\"");
    }
}
