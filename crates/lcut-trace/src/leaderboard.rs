//! The table of a leaderboard run (`lcut eval --suite ... --ratios ...`):
//! each method at each compression ratio (the share of the prompt's K/V
//! removed, as kvpress's leaderboard means it), per task and over all
//! tasks, with the bytes held and the time measured. What the HTML report
//! and the CSV are rendered from.

use serde::{Deserialize, Serialize};

/// One method at one ratio: the family as written, the knob it was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardConfig {
    /// The method as written in `--policies` (`speed+bos`, `slim`; `full`
    /// for the uncompressed reference).
    pub method: String,
    /// The family (`speed`, `slim`, `swiftkv`, `full`, ...).
    pub family: String,
    /// The ratio asked for; absent for the reference and for a policy given
    /// with its own knob.
    pub ratio: Option<f64>,
    /// The policy run, resolved against the model (`speed:22+bos`).
    pub policy: String,
    /// The share of the prompt's K/V the family's formula removes at that knob.
    pub formula_removed: f64,
    /// How the knob was chosen.
    pub note: String,
}

/// One method at one ratio on one task (or `all`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardCell {
    /// The task (an item kind), or `all`: the mean of the tasks' scores.
    pub task: String,
    /// Index of the configuration in [`LeaderboardTable::configs`].
    pub config: usize,
    /// Items.
    pub n: usize,
    /// Mean score in [0, 1] (RULER's string match; 1 or 0 per item for
    /// the right-or-wrong rules).
    pub score: f64,
    /// 95% interval of the score: Wilson's at the mean score over `n` items.
    pub ci95: [f64; 2],
    /// The full model's mean score on the same items.
    pub full_score: f64,
    /// Mean K/V bytes held per item (measured, at the end of the run
    /// teacher-forced on the full model's answer).
    pub kv_bytes_held: f64,
    /// Mean K/V bytes the full model holds per item.
    pub kv_bytes_full: f64,
    /// Share of the prompt's (context's) K/V removed, measured: the bytes
    /// full holds beyond the policy over the context's bytes at full depth.
    pub prompt_kv_removed: f64,
    /// Items timed (each policy alone, right after the full model).
    pub timed: usize,
    /// Median over the timed items of TTFT over full's TTFT.
    pub ttft_ratio: Option<f64>,
    /// Median of TPOT over full's TPOT.
    pub tpot_ratio: Option<f64>,
    /// Median of the predicted prefill FLOPs over full's (from the tokens
    /// each layer ran): 1 minus it is the compute saved.
    pub prefill_flops_ratio: Option<f64>,
}

/// The whole table of a leaderboard run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardTable {
    /// kvpress's `dataset` column (`ruler` for a RULER suite, else the
    /// suite file's name).
    pub dataset: String,
    /// kvpress's `data_dir` column: the RULER length in tokens (`4096`).
    pub data_dir: String,
    /// The model, as given.
    pub model: String,
    /// The suite file, as given.
    pub suite: String,
    /// Weights (`f32`, `q`, ...).
    pub dtype: String,
    /// The ratios asked for.
    pub ratios: Vec<f64>,
    /// Every configuration run; the first is the full model.
    pub configs: Vec<LeaderboardConfig>,
    /// The tasks in suite order (cells per task, then `all`).
    pub tasks: Vec<String>,
    /// Every (task, configuration) cell, `all` included.
    pub cells: Vec<LeaderboardCell>,
    /// Items scored.
    pub items: usize,
    /// Sum of the items' wall times, seconds.
    pub seconds: f64,
    /// How the run was timed and scored, in words (for the report).
    pub notes: Vec<String>,
}

impl LeaderboardTable {
    /// The cell of `task` and configuration `config`.
    pub fn cell(&self, task: &str, config: usize) -> Option<&LeaderboardCell> {
        self.cells
            .iter()
            .find(|c| c.task == task && c.config == config)
    }

    /// The methods in order of first appearance (the reference first).
    pub fn methods(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for c in &self.configs {
            if !out.contains(&c.method.as_str()) {
                out.push(&c.method);
            }
        }
        out
    }

    /// kvpress's `compression_ratio` of a configuration: the ratio asked
    /// for, 0 for the full model, the measured share for a policy given
    /// with its own knob.
    pub fn compression_ratio(&self, config: usize) -> f64 {
        let c = &self.configs[config];
        match c.ratio {
            Some(r) => r,
            None if c.family == "full" => 0.0,
            None => self
                .cell("all", config)
                .map_or(c.formula_removed, |cell| cell.prompt_kv_removed),
        }
    }
}
