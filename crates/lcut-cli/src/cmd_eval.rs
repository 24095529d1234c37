//! `lcut eval`: exact match of a bundled task model (without `--suite`), or
//! any model on a task suite under any policy (`--suite FILE`), and
//! `lcut eval-merge` of suite shards.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lcut_engine::suite::{self, SuiteEval, SuiteEvalOptions};
use lcut_policy::split_list;

use crate::args::{KvDtypeArg, WeightArg};
use crate::common::{ModelArgs, write_atomic};

/// Arguments of `lcut eval`.
#[derive(Debug, clap::Args)]
pub struct EvalCommand {
    /// Model, policy and, without `--suite`, the bundled task's `--n` and `--seed`.
    #[command(flatten)]
    pub base: crate::cmd_train::EvalArgs,
    /// A task suite (JSON Lines with answers and scoring rules): run it on
    /// any `--model` (a folder, a GGUF file, a hub cache or Ollama name) instead
    /// of the bundled task.
    #[arg(long)]
    pub suite: Option<PathBuf>,
    /// Weights with --suite: f32, bf16, f16, or q (a GGUF's matrices kept quantized).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: WeightArg,
    /// K/V cache storage: auto (f16 for `--dtype q`, else the weights'
    /// dtype), f32, f16 or bf16.
    #[arg(long, value_enum, default_value = "auto", ignore_case = true)]
    pub kv_dtype: KvDtypeArg,
    /// Most new tokens per generation with --suite, for every item (24 by
    /// default, or the item's own `max_new_tokens` where it names one, as
    /// RULER's tasks do).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// The leaderboard run: every method of --policy at each of these
    /// compression ratios (the share of the prompt's K/V removed, in (0, 1);
    /// kvpress's leaderboard: 0.25,0.5,0.75,0.875), the ratio mapped to
    /// each family's knob; a method is a family and its options (`speed+bos`,
    /// `slim`, `swiftkv`) or a policy with its own knob. Needs --out.
    #[arg(long, requires = "suite")]
    pub ratios: Option<String>,
    /// With --ratios: the run's folder (its journal `items.jsonl`, from
    /// which a rerun resumes, and leaderboard.json, .csv, .html).
    #[arg(long, requires = "ratios")]
    pub out: Option<PathBuf>,
    /// With --ratios: items timed per task (the first ones), each policy
    /// run alone after the full model for TTFT and TPOT.
    #[arg(long, default_value_t = 1)]
    pub timing_items: usize,
    /// With --ratios: time only these tasks (comma-separated, as the
    /// suite names them; default: every task). One task's items time a
    /// grid at one prompt length at a fraction of the cost.
    #[arg(long, value_delimiter = ',', requires = "ratios")]
    pub timing_tasks: Vec<String>,
    /// With --ratios: new tokens of each timed run.
    #[arg(long, default_value_t = 16)]
    pub timing_tokens: usize,
    /// With --ratios: rounds of every policy per timed item (the median kept).
    #[arg(long, default_value_t = 1)]
    pub timing_rounds: usize,
    /// Write the result (scores and every item) as JSON to this file; with
    /// several policies (`--policy full,speed:22+bos`), one file each, named
    /// OUT with the policy inserted before the extension.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run shard I of N (items I, I+N, ...), or auto/N to take I from
    /// SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX.
    #[arg(long)]
    pub shard: Option<String>,
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
}

/// Arguments of `lcut eval-merge`.
#[derive(Debug, clap::Args)]
pub struct EvalMergeArgs {
    /// The shard results (`lcut eval --suite ... --shard I/N --json FILE`),
    /// or the folders of `lcut eval --ratios ... --shard I/N --out DIR` runs.
    #[arg(required = true)]
    pub parts: Vec<PathBuf>,
    /// The merged result (a folder for leaderboard runs).
    #[arg(long)]
    pub out: PathBuf,
    /// Leaderboard runs not finished (still going, or stopped): merge the
    /// items their folders' journals hold so far into a table of those
    /// items, marked partial.
    #[arg(long)]
    pub partial: bool,
}

/// Most new tokens per answer when neither the run nor the item says.
pub const DEFAULT_NEW_TOKENS: usize = 24;

/// Run `lcut eval`.
pub fn run(args: &EvalCommand) -> Result<()> {
    if let (Some(path), Some(ratios)) = (&args.suite, &args.ratios) {
        return crate::cmd_leaderboard::run(args, path, ratios);
    }
    let Some(path) = &args.suite else {
        anyhow::ensure!(
            args.lora.lora.is_none(),
            "--lora needs --suite (the bundled task's eval runs without adapters)"
        );
        return crate::cmd_train::eval(&args.base);
    };
    let results = run_suite(args, path)?;
    let several = results.len() > 1;
    // every result on disk before anything is printed: a closed stdout
    // (`| head`) ends the process at its first print
    if let Some(out) = &args.json {
        for result in &results {
            let out = if several {
                per_policy_path(out, &result.policy)
            } else {
                out.clone()
            };
            write_json(&out, result)?;
        }
    }
    for line in results.iter().flat_map(SuiteEval::summary_lines) {
        println!("{line}");
    }
    Ok(())
}

/// `runs/eval.json` for `speed:22+bos` -> `runs/eval.speed-22-bos.json`.
pub fn per_policy_path(out: &Path, policy: &str) -> PathBuf {
    let slug: String = policy
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let stem = out
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match out.extension() {
        Some(ext) => format!("{stem}.{slug}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{slug}"),
    };
    out.with_file_name(name)
}

/// Run a suite under the policies and collect one result per policy.
fn run_suite(args: &EvalCommand, path: &Path) -> Result<Vec<SuiteEval>> {
    let (items, suite_hash) = suite::read_suite_hashed(path)?;
    let model = Some(args.base.model.clone());
    let load = ModelArgs::cpu(model, args.dtype, args.kv_dtype);
    let mut session = load.load()?;
    args.lora
        .apply_to_session(&mut session, &split_list(&args.base.policy))?;
    // an adapted model is compared with the model it was made from
    let base = match &session.adapter {
        Some(_) => Some(load.load()?),
        None => None,
    };
    let shard = args
        .shard
        .as_deref()
        .map(lcut_engine::shard::parse_shard)
        .transpose()?;
    let opts = SuiteEvalOptions {
        policies: split_list(&args.base.policy),
        max_new_tokens: args.max_new_tokens.unwrap_or(DEFAULT_NEW_TOKENS),
        item_budgets: args.max_new_tokens.is_none(),
        shard,
        ..SuiteEvalOptions::default()
    };
    let resolved = opts
        .policies
        .iter()
        .map(|p| suite::resolve_policy(&session, p))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(note) = crate::common::press_layers_note(&session.model, &resolved) {
        eprintln!("{note}");
    }
    // an adapted model's policies each run their own prompt beside the base
    if base.is_none()
        && let Some(note) = crate::common::shared_run_note(&session, &items, &resolved)?
    {
        eprintln!("{note}");
    }
    let names: Vec<String> = resolved.iter().map(ToString::to_string).collect();
    let todo = lcut_engine::diagnose::shard_indices(items.len(), shard)?.len();
    let bar = crate::common::count_bar(todo, "items");
    // a job array's log is no terminal: one line per item there instead
    let log_lines = !std::io::stderr().is_terminal();
    let mut done = 0;
    let opts = SuiteEvalOptions {
        memory_budget: crate::common::suite_memory_line(&session, &items, &opts)?,
        ..opts
    };
    let lists = suite::evaluate_suite(&session, base.as_ref(), &items, &opts, &mut |rs| {
        let marks: String = rs
            .iter()
            .map(|r| match r.score() {
                s if s >= 1.0 => '+',
                s if s > 0.0 => '~',
                _ => '-',
            })
            .collect();
        let id = rs.first().map_or("", |r| r.id.as_str());
        done += 1;
        if log_lines {
            eprintln!("item {done}/{todo} {id} {marks}");
        }
        bar.set_message(format!("{id} {marks}"));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    crate::common::suite_memory_peak();
    Ok(names
        .into_iter()
        .zip(lists)
        .map(|(policy, results)| SuiteEval {
            model: args.base.model.display().to_string(),
            suite: path.display().to_string(),
            suite_items: items.len(),
            suite_hash: suite_hash.clone(),
            policy,
            dtype: args.dtype.name(),
            adapter: session.adapter.clone(),
            max_new_tokens: opts.max_new_tokens,
            item_budgets: opts.item_budgets,
            shard: shard.map(|(i, n)| [i, n]),
            made_by: vec![lcut_engine::made_by::current()],
            seconds: results.iter().map(|r| r.seconds).sum(),
            scores: suite::summarize(&results),
            items: results,
        })
        .collect())
}

/// Write a result as pretty JSON, atomically.
fn write_json(path: &Path, result: &SuiteEval) -> Result<()> {
    let text = serde_json::to_string_pretty(result)?;
    write_atomic(path, text.as_bytes())
}

/// Run `lcut eval-merge`: suite results, or leaderboard runs (their
/// `leaderboard.json` or their folders) into the whole run's folder.
pub fn merge(args: &EvalMergeArgs) -> Result<()> {
    if args.partial {
        return crate::cmd_leaderboard::merge_partial(&args.parts, &args.out);
    }
    if let Some(first) = args.parts.first()
        && crate::cmd_leaderboard::read_run(first)?.is_some()
    {
        let runs = args
            .parts
            .iter()
            .map(|p| {
                crate::cmd_leaderboard::read_run(p)?.with_context(|| {
                    format!("{} is not an `lcut eval --ratios` result", p.display())
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // each item in one shard, named where not (before the engine's
        // own count of them)
        let shards: Vec<_> = args
            .parts
            .iter()
            .zip(&runs)
            .map(|(p, run)| (p.as_path(), &run.header, &run.items[..]))
            .collect();
        crate::cmd_leaderboard::check_shards(&shards, true)?;
        let merged = lcut_engine::leaderboard::merge_runs(&runs)?;
        crate::cmd_leaderboard::write_run(&args.out, &merged)?;
        println!(
            "merged {} shards ({} items) into {}",
            runs.len(),
            merged.items.len(),
            args.out.display()
        );
        return Ok(());
    }
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
    write_json(&args.out, &merged)?;
    for line in merged.summary_lines() {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_policy_files_are_named_after_the_policy() {
        let p = per_policy_path(Path::new("runs/eval.json"), "speed:22+bos");
        assert_eq!(p, PathBuf::from("runs/eval.speed-22-bos.json"));
        let p = per_policy_path(Path::new("out"), "full");
        assert_eq!(p, PathBuf::from("out.full"));
    }
}
