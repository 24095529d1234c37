//! `lcut eval`: exact match of a bundled task model (without `--suite`), or
//! any model on a task suite under any policy (`--suite FILE`), and
//! `lcut eval-merge` of suite shards.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use lcut_engine::suite::{self, SuiteEval, SuiteEvalOptions};

use crate::common::{load_session, write_atomic};

/// Arguments of `lcut eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Model, policy and, without `--suite`, the bundled task's `--n` and `--seed`.
    #[command(flatten)]
    pub base: lcut_train::EvalArgs,
    /// A task suite (JSON Lines with answers and scoring rules): run it on
    /// any model (HF folder or .gguf) instead of the bundled task.
    #[arg(long)]
    pub suite: Option<PathBuf>,
    /// Weights with --suite: f32, bf16, f16, or q (a GGUF's matrices kept quantized).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Most new tokens per generation with --suite.
    #[arg(long, default_value_t = 24)]
    pub max_new_tokens: usize,
    /// Write the result (scores and every item) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run shard I of N (items I, I+N, ...), or auto/N to take I from
    /// SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX.
    #[arg(long)]
    pub shard: Option<String>,
}

/// Arguments of `lcut eval-merge`.
#[derive(Debug, clap::Args)]
pub struct EvalMergeArgs {
    /// The shard results (`lcut eval --suite ... --shard I/N --json FILE`).
    #[arg(required = true)]
    pub parts: Vec<PathBuf>,
    /// The merged result.
    #[arg(long)]
    pub out: PathBuf,
}

/// Run `lcut eval`.
pub fn run(args: &EvalArgs) -> Result<()> {
    match &args.suite {
        None => crate::cmd_train::eval(&args.base),
        Some(path) => {
            let result = run_suite(args, path)?;
            for line in result.summary_lines() {
                println!("{line}");
            }
            if let Some(out) = &args.json {
                write_json(out, &result)?;
            }
            Ok(())
        }
    }
}

/// Run a suite under the policy and collect its result.
fn run_suite(args: &EvalArgs, path: &Path) -> Result<SuiteEval> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let items = suite::read_suite(path)?;
    let session = load_session(&Some(args.base.model.clone()), &args.dtype, "cpu")?;
    let shard = args
        .shard
        .as_deref()
        .map(lcut_engine::shard::parse_shard)
        .transpose()?;
    let opts = SuiteEvalOptions {
        policy: args.base.policy.clone(),
        max_new_tokens: args.max_new_tokens,
        shard,
        ..SuiteEvalOptions::default()
    };
    let policy = suite::resolve_policy(&session, &opts.policy)?;
    let todo = lcut_engine::diagnose::shard_indices(items.len(), shard)?.len();
    let bar = ProgressBar::new(todo as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} items {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = std::time::Instant::now();
    let results = suite::evaluate_suite(&session, &items, &opts, &mut |r| {
        bar.set_message(format!("{} {}", r.id, if r.correct { "ok" } else { "-" }));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    Ok(SuiteEval {
        model: args.base.model.display().to_string(),
        suite: path.display().to_string(),
        suite_items: items.len(),
        suite_hash: lcut_trace::hash_bytes(&bytes),
        policy: policy.to_string(),
        dtype: args.dtype.to_ascii_lowercase(),
        max_new_tokens: args.max_new_tokens,
        shard: shard.map(|(i, n)| [i, n]),
        seconds: start.elapsed().as_secs_f64(),
        scores: suite::summarize(&results),
        items: results,
    })
}

/// Write a result as pretty JSON, atomically.
fn write_json(path: &Path, result: &SuiteEval) -> Result<()> {
    let text = serde_json::to_string_pretty(result)?;
    write_atomic(path, text.as_bytes())
}

/// Run `lcut eval-merge`.
pub fn merge(args: &EvalMergeArgs) -> Result<()> {
    let parts = args
        .parts
        .iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str::<SuiteEval>(&text)
                .with_context(|| format!("{} is not an `lcut eval --json` result", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let merged = suite::merge_evals(&parts)?;
    for line in merged.summary_lines() {
        println!("{line}");
    }
    write_json(&args.out, &merged)
}
