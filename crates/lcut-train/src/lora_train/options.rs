//! What an adapter training job is asked to do: the base model and policy,
//! the adapter's shape (rank, alpha, layers, projections), the training
//! data, the optimizer's settings and where the files go.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use lcut_model::ResolvedModel;
use lcut_policy::PolicySpec;

use super::model::MODULES;
use super::run::LoraTrainOptions;
use crate::error::{Result, refuse};

/// Layers to adapt, `A..B` (end exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpan {
    /// First layer.
    pub start: usize,
    /// One past the last layer.
    pub end: usize,
}

impl FromStr for LayerSpan {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        let (a, b) = text
            .split_once("..")
            .ok_or_else(|| "expected A..B".to_string())?;
        let number = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("{t:?} is not a layer number"))
        };
        Ok(Self {
            start: number(a)?,
            end: number(b)?,
        })
    }
}

impl fmt::Display for LayerSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// The layers to adapt of a model of `layers` layers cut at `cut`: `span`,
/// or the cut to the top when none is given.
pub fn adapted_layers(span: Option<LayerSpan>, cut: usize, layers: usize) -> Result<Vec<usize>> {
    let Some(span) = span else {
        return Ok((cut..layers).collect());
    };
    if span.end > layers || span.start >= span.end {
        refuse!("--layers {span}: expected a range within 0..{layers} (end exclusive)");
    }
    Ok((span.start..span.end).collect())
}

/// Projection names as the adapter's sites take them: `q` or `q_proj` is
/// `q_proj`; an unknown projection is refused by name.
pub fn projection_names(short: &[String]) -> Result<Vec<String>> {
    short
        .iter()
        .map(|m| {
            let m = m.trim();
            let full = if m.ends_with("_proj") {
                m.to_string()
            } else {
                format!("{m}_proj")
            };
            match MODULES.iter().any(|x| x.ends_with(&full)) {
                true => Ok(full),
                false => {
                    refuse!(
                        "--modules: unknown projection {m:?} (q, k, v, o, gate, up, down; \
                         qkv and gate_up where the model fuses them)"
                    )
                }
            }
        })
        .collect()
}

/// Where the training sequences come from: the full model's greedy
/// continuations of prompts from lcut's task generators.
#[derive(Debug, Clone, PartialEq)]
pub struct DataOptions {
    /// Training prompts drawn from the task generators.
    pub prompts: usize,
    /// First seed of the task generators (one suite of prompts a seed, the
    /// next seeds used when more are needed).
    pub prompt_seed: u64,
    /// Prompts longer than this many tokens are skipped.
    pub max_prompt_tokens: usize,
    /// Tokens the full model continues each prompt with (the targets).
    pub max_new_tokens: usize,
    /// Tokens kept of each of the full model's distributions.
    pub kd_top_k: usize,
    /// The teacher's records as JSON Lines: read when the file exists (made
    /// with the same settings), else made and written there.
    pub teacher: Option<PathBuf>,
    /// Draw every kind of prompt as often as the most frequent one.
    pub balance_kinds: bool,
    /// Leave out every prompt of this suite.
    pub exclude_suite: Option<PathBuf>,
}

/// A whole adapter training job.
#[derive(Debug, Clone)]
pub struct AdapterJob {
    /// Base model (a Hugging Face folder or a GGUF file, found by path or
    /// by name), loaded dense in f32.
    pub model: ResolvedModel,
    /// The SPEED policy to train for.
    pub policy: PolicySpec,
    /// LoRA rank.
    pub rank: usize,
    /// LoRA alpha (scale alpha / rank).
    pub alpha: f64,
    /// Layers to adapt; the cut to the top when `None`.
    pub layers: Option<LayerSpan>,
    /// Projections to adapt (`q`, `k`, `v`, `o`, `gate`, `up`, `down`).
    pub modules: Vec<String>,
    /// The training data.
    pub data: DataOptions,
    /// The optimizer's settings.
    pub train: LoraTrainOptions,
    /// Output folder: the adapter, `checkpoint/` and `training.json`.
    pub out: PathBuf,
    /// The command line recorded in `training.json`.
    pub command: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_layers(text: Option<&str>, cut: usize, layers: usize) -> anyhow::Result<Vec<usize>> {
        let span = text
            .map(str::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        Ok(adapted_layers(span, cut, layers)?)
    }

    #[test]
    fn layers_default_to_the_cut_up_and_may_start_below_it() -> anyhow::Result<()> {
        assert_eq!(parse_layers(None, 22, 30)?, (22..30).collect::<Vec<_>>());
        assert_eq!(
            parse_layers(Some("18..30"), 22, 30)?,
            (18..30).collect::<Vec<_>>()
        );
        assert_eq!(parse_layers(Some("0..30"), 15, 30)?.len(), 30);
        Ok(())
    }

    #[test]
    fn bad_layer_ranges_are_named() {
        for (text, says) in [
            ("20..31", "within 0..30"),
            ("25..25", "within 0..30"),
            ("26..24", "within 0..30"),
            ("a..30", "\"a\" is not a layer number"),
            ("22-30", "expected A..B"),
        ] {
            let err = match parse_layers(Some(text), 22, 30) {
                Ok(v) => panic!("--layers {text} gave {v:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "--layers {text}: {err}");
        }
    }
}
