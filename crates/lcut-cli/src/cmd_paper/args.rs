//! The options of `lcut paper` and `lcut paper-merge`, and the settings a
//! run resolves from them (a preset with the user's overrides), recorded in
//! the run's folder and in every part it writes.

use std::path::{Path, PathBuf};

use clap::Args;
use lcut_trace::{AdapterIdentity, PaperPart};
use serde::{Deserialize, Serialize};

use super::plan::Sizes;

/// Arguments of `lcut paper`.
#[derive(Debug, Args)]
pub struct PaperArgs {
    /// The model and how it loads (`--model`, `--dtype`, `--kv-dtype`,
    /// `--device`).
    #[command(flatten)]
    pub load: crate::common::ModelArgs,
    /// Task suite (JSON Lines; categories are the items' `kind`); with the
    /// bundled model, its copy suite by default.
    #[arg(long)]
    pub suite: Option<PathBuf>,
    /// SPEED-aware LoRA adapters (PEFT layout, each recording the policy it
    /// was trained for): each adds a table row of its policy with it.
    #[arg(long, value_name = "DIR", num_args = 1..)]
    pub lora: Vec<PathBuf>,
    /// The folder of the run: its parts, then the report (paper.html,
    /// paper.md, paper.json, figures/, csv/).
    #[arg(long)]
    pub out: PathBuf,
    /// A small run fit for CI: few items, short generations, short prompts.
    #[arg(long)]
    pub quick: bool,
    /// Longest timed run (prompt and new tokens), e.g. 8k; the model's
    /// context by default (1k with --quick).
    #[arg(long)]
    pub max_len: Option<String>,
    /// The cut C the policies are compared at (a count or a fraction of the
    /// depth, e.g. 22 or 3/4); lcut's recommendation by default. Needed
    /// with --shard: every shard must compare at one cut.
    #[arg(long)]
    pub cut: Option<String>,
    /// Figure 4's cuts, comma-separated (C and two below it by default).
    #[arg(long)]
    pub retrieval_cuts: Option<String>,
    /// Run only these parts (names or numbers, comma-separated: masses,
    /// timing, layers, retrieval, table, loops).
    #[arg(long, value_delimiter = ',')]
    pub parts: Vec<PaperPart>,
    /// Run shard I of N (suite items I, I+N, ..., and every N-th prompt
    /// length); `lcut paper-merge` joins the shards' folders.
    #[arg(long)]
    pub shard: Option<String>,
    /// Items of each kind diagnosed (Figures 1 and 3) and generated at
    /// length for the loops.
    #[arg(long)]
    pub items_per_kind: Option<usize>,
    /// Greedy tokens of each diagnosed prompt.
    #[arg(long)]
    pub diag_new_tokens: Option<usize>,
    /// Most new tokens of each scored answer (Figure 4 and the table).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// New tokens of each loop generation.
    #[arg(long)]
    pub loop_tokens: Option<usize>,
    /// New tokens of each timed run (the paper's 128).
    #[arg(long)]
    pub new_tokens: Option<usize>,
    /// Timed runs per policy and length; the median is reported.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
}

/// Arguments of `lcut paper-merge`.
#[derive(Debug, Args)]
pub struct PaperMergeArgs {
    /// The shards' folders (`lcut paper --shard I/N --out DIR`).
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
    /// The folder of the whole run (parts and report).
    #[arg(long)]
    pub out: PathBuf,
}

/// The settings of a run, as resolved: what every run into its folder
/// must repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// The quick preset.
    pub quick: bool,
    /// The cut C as given, resolved to layers (`None`: recommended).
    pub cut: Option<usize>,
    /// Figure 4's cuts as given.
    pub retrieval_cuts: Option<Vec<usize>>,
    /// Longest timed run, tokens.
    pub max_len: usize,
    /// The preset's sizes with the overrides.
    pub sizes: Sizes,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Weights as loaded.
    pub dtype: String,
    /// The K/V cache's dtype as resolved (`f16`, `f32`, `bf16`); runs
    /// written before the option existed read as the default.
    #[serde(default = "default_kv_dtype")]
    pub kv_dtype: String,
    /// The device.
    pub device: String,
    /// The adapters, with the policy each was trained for.
    pub adapters: Vec<AdapterIdentity>,
}

impl Settings {
    /// The options that make `part` again into `out` (all parts when
    /// `None`), at cut `cut`: the model, the suite and the shard of it
    /// (`[i, n]`), the preset, every override and the resolved cut.
    pub fn command(
        &self,
        (model, suite, shard): (&str, &str, Option<[usize; 2]>),
        out: &Path,
        cut: Option<usize>,
        part: Option<PaperPart>,
    ) -> String {
        let mut words = vec![
            "lcut paper".to_string(),
            format!("--model {}", quote(model)),
            format!("--suite {}", quote(suite)),
        ];
        if let Some([i, n]) = shard {
            words.push(format!("--shard {i}/{n}"));
        }
        if self.quick {
            words.push("--quick".into());
        }
        if let Some(c) = cut.or(self.cut) {
            words.push(format!("--cut {c}"));
        }
        if let Some(c) = &self.retrieval_cuts {
            let list: Vec<String> = c.iter().map(ToString::to_string).collect();
            words.push(format!("--retrieval-cuts {}", list.join(",")));
        }
        words.push(format!("--max-len {}", self.max_len));
        let preset = Sizes::preset(self.quick);
        let s = &self.sizes;
        for (name, value, default) in [
            ("--items-per-kind", s.items_per_kind, preset.items_per_kind),
            (
                "--diag-new-tokens",
                s.diag_new_tokens,
                preset.diag_new_tokens,
            ),
            ("--max-new-tokens", s.answer_tokens, preset.answer_tokens),
            ("--loop-tokens", s.loop_tokens, preset.loop_tokens),
            (
                "--new-tokens",
                s.timing_new_tokens,
                preset.timing_new_tokens,
            ),
            ("--repeats", s.repeats, preset.repeats),
            ("--prefill-chunk", self.prefill_chunk, 512),
        ] {
            if value != default {
                words.push(format!("{name} {value}"));
            }
        }
        if self.dtype != "f32" {
            words.push(format!("--dtype {}", self.dtype));
        }
        if self.kv_dtype != default_kv_dtype_for(&self.dtype) {
            words.push(format!("--kv-dtype {}", self.kv_dtype));
        }
        if self.device != "cpu" {
            words.push(format!("--device {}", self.device));
        }
        if part.is_none_or(|p| p == PaperPart::Table) {
            words.extend(
                self.adapters
                    .iter()
                    .map(|a| format!("--lora {}", quote(&a.path))),
            );
        }
        words.push(format!("--out {}", quote(&out.display().to_string())));
        if let Some(p) = part {
            words.push(format!("--parts {p}"));
        }
        words.join(" ")
    }
}

/// What `--kv-dtype auto` resolves to for weights named `dtype` (`q`, `f32`...).
fn default_kv_dtype_for(dtype: &str) -> &str {
    if dtype == "q" { "f16" } else { dtype }
}

/// The cache's dtype of a run recorded before `--kv-dtype` existed.
fn default_kv_dtype() -> String {
    "f32".into()
}

/// A path as a shell word.
fn quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-:@+=".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(quick: bool) -> Settings {
        Settings {
            quick,
            cut: None,
            retrieval_cuts: None,
            max_len: 512,
            sizes: Sizes::preset(quick),
            prefill_chunk: 512,
            dtype: "f32".into(),
            kv_dtype: "f32".into(),
            device: "cpu".into(),
            adapters: vec![],
        }
    }

    #[test]
    fn the_command_names_the_preset_the_overrides_the_cut_and_the_part() {
        let mut s = settings(true);
        s.sizes.loop_tokens = 40;
        let c = s.command(
            ("m dir", "s.jsonl", None),
            Path::new("runs/p"),
            Some(3),
            Some(PaperPart::Loops),
        );
        assert_eq!(
            c,
            "lcut paper --model 'm dir' --suite s.jsonl --quick --cut 3 --max-len 512 \
             --loop-tokens 40 --out runs/p --parts loops"
        );
        let c = settings(false).command(("m", "s", None), Path::new("o"), None, None);
        assert_eq!(c, "lcut paper --model m --suite s --max-len 512 --out o");
    }

    #[test]
    fn the_command_of_a_shard_names_the_shard() {
        let c = settings(false).command(("m", "s", Some([1, 4])), Path::new("o"), Some(22), None);
        assert_eq!(
            c,
            "lcut paper --model m --suite s --shard 1/4 --cut 22 --max-len 512 --out o"
        );
    }
}
