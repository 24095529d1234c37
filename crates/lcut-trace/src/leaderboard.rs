//! The table of a leaderboard run (`lcut eval --suite ... --ratios ...`):
//! each method at each compression ratio (the share of the prompt's K/V
//! removed, as kvpress's leaderboard means it), per task and over all
//! tasks, with the bytes held and the time measured. What the HTML report
//! and the CSV are rendered from; and the paired comparisons of its
//! configurations ([`LeaderboardPairs`]), which say which methods beat which.

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

/// The test that compared two configurations of a leaderboard run on the
/// items both scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairTest {
    /// The exact McNemar test: every shared item scored 0 or 1 under both,
    /// and the p-value is the two-sided binomial test of `b` of `b + c`
    /// discordant items at one half.
    McnemarExact,
    /// A paired bootstrap of the mean score difference: some shared item
    /// has a partial score (RULER's string match), so the items are
    /// resampled with their pairs kept together.
    PairedBootstrap,
    /// No test: the two configurations share no item.
    None,
}

impl PairTest {
    /// The test's name in tables: `McNemar (exact)`, `paired bootstrap`, `none`.
    pub fn label(self) -> &'static str {
        match self {
            Self::McnemarExact => "McNemar (exact)",
            Self::PairedBootstrap => "paired bootstrap",
            Self::None => "none",
        }
    }
}

/// What a pair's comparison decided, after the Holm correction over the
/// pairs of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairVerdict {
    /// Configuration `a` scores higher, and the difference is real at the
    /// run's level (Holm-adjusted p at most alpha).
    ABeatsB,
    /// Configuration `b` scores higher, and the difference is real.
    BBeatsA,
    /// The run does not tell the two apart at its level.
    Tied,
    /// The two share no item: nothing was compared.
    NoSharedItems,
}

impl PairVerdict {
    /// The verdict as the CSV writes it (`a_beats_b`, `b_beats_a`, `tied`,
    /// `no_shared_items`).
    pub fn name(self) -> &'static str {
        match self {
            Self::ABeatsB => "a_beats_b",
            Self::BBeatsA => "b_beats_a",
            Self::Tied => "tied",
            Self::NoSharedItems => "no_shared_items",
        }
    }
}

/// Two configurations of one group (one compression ratio) compared on
/// the items both scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairComparison {
    /// The group: the ratio as written (`0.25`), or `own knob` for the
    /// methods given with their own knob. The full model is in every group.
    pub group: String,
    /// The group's ratio; absent for `own knob`.
    pub ratio: Option<f64>,
    /// Index of the first configuration in [`LeaderboardTable::configs`]
    /// (the earlier of the two).
    pub config_a: usize,
    /// Index of the second configuration.
    pub config_b: usize,
    /// The first configuration's method as written.
    pub method_a: String,
    /// The second configuration's method as written.
    pub method_b: String,
    /// Items both configurations scored: what the test is over.
    pub n: usize,
    /// Items only `a` scored (left out of the test, not silently: counted).
    pub only_a: usize,
    /// Items only `b` scored.
    pub only_b: usize,
    /// `a`'s mean score over the shared items, in [0, 1].
    pub score_a: f64,
    /// `b`'s mean score over the shared items.
    pub score_b: f64,
    /// Shared items on which `a` scored higher than `b` (McNemar's `b`:
    /// `a` right and `b` wrong, for right-or-wrong scores).
    pub b: usize,
    /// Shared items on which `b` scored higher than `a` (McNemar's `c`).
    pub c: usize,
    /// The test made.
    pub test: PairTest,
    /// Its two-sided p-value; absent without shared items.
    pub p: Option<f64>,
    /// The p-value adjusted by Holm's step-down over the tested pairs of
    /// the group; absent without shared items.
    pub p_holm: Option<f64>,
    /// What the comparison decided.
    pub verdict: PairVerdict,
}

impl PairComparison {
    /// The configuration this pair says is better, when it says one is.
    pub fn winner(&self) -> Option<usize> {
        match self.verdict {
            PairVerdict::ABeatsB => Some(self.config_a),
            PairVerdict::BBeatsA => Some(self.config_b),
            PairVerdict::Tied | PairVerdict::NoSharedItems => None,
        }
    }

    /// The other configuration of the pair, when `config` is one of its two.
    pub fn other(&self, config: usize) -> Option<usize> {
        match config {
            c if c == self.config_a => Some(self.config_b),
            c if c == self.config_b => Some(self.config_a),
            _ => None,
        }
    }
}

/// Every pair of configurations at each compression ratio compared on the
/// same items: which methods beat which, and which the run cannot tell
/// apart. Written beside the table (`leaderboard-pairs.json`, `.csv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardPairs {
    /// The family-wise level of each group's decisions (0.05: "real at
    /// 95%").
    pub alpha: f64,
    /// Resamples of each paired bootstrap.
    pub bootstrap_resamples: usize,
    /// The seed of each paired bootstrap (the same for every pair, so a
    /// pair's p-value does not depend on the other pairs).
    pub bootstrap_seed: u64,
    /// Every pair, group by group in the order of the configurations.
    pub pairs: Vec<PairComparison>,
}

impl LeaderboardPairs {
    /// The groups in order of first appearance.
    pub fn groups(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in &self.pairs {
            if !out.contains(&p.group.as_str()) {
                out.push(&p.group);
            }
        }
        out
    }

    /// The configurations compared in `group`, in configuration order.
    pub fn members(&self, group: &str) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .pairs
            .iter()
            .filter(|p| p.group == group)
            .flat_map(|p| [p.config_a, p.config_b])
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The pair of `x` and `y` (in either order) in `group`.
    pub fn pair(&self, group: &str, x: usize, y: usize) -> Option<&PairComparison> {
        self.pairs.iter().find(|p| {
            p.group == group
                && ((p.config_a, p.config_b) == (x, y) || (p.config_a, p.config_b) == (y, x))
        })
    }

    /// The configurations `config` beats in `group`.
    pub fn beats(&self, group: &str, config: usize) -> Vec<usize> {
        self.others(group, config, |p| p.winner() == Some(config))
    }

    /// The configurations that beat `config` in `group`.
    pub fn beaten_by(&self, group: &str, config: usize) -> Vec<usize> {
        self.others(group, config, |p| p.winner().is_some_and(|w| w != config))
    }

    /// The configurations `group`'s pairs cannot tell apart from `config`
    /// (tied; pairs without shared items are not counted as ties).
    pub fn tied_with(&self, group: &str, config: usize) -> Vec<usize> {
        self.others(group, config, |p| p.verdict == PairVerdict::Tied)
    }

    fn others(
        &self,
        group: &str,
        config: usize,
        keep: impl Fn(&PairComparison) -> bool,
    ) -> Vec<usize> {
        self.pairs
            .iter()
            .filter(|p| p.group == group && keep(p))
            .filter_map(|p| p.other(config))
            .collect()
    }
}
