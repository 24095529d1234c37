//! `lcut suite`: (re)write the project's task suite from a seed, or
//! (`--ruler LEN`) RULER-style long-context tasks sized in a model's tokens.

use std::path::PathBuf;

use anyhow::{Context, Result};
use lcut_engine::suite::{self, RulerOptions, RulerTask, SuiteItem};

use crate::args::{KvDtypeArg, WeightArg};
use crate::common::{ModelArgs, parse_len, write_atomic};

/// Arguments of `lcut suite`.
#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// Seed of the generators.
    #[arg(long, default_value_t = suite::SMOLLM2_SUITE_SEED)]
    pub seed: u64,
    /// Where to write the JSON Lines (the project's suite,
    /// fixtures/suites/smollm2.jsonl, by default; --ruler needs it given).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write RULER-style tasks instead, each prompt with its task's new
    /// tokens at most this many of the model's tokens (4k, 8k, 4096; up
    /// to the model's context).
    #[arg(long)]
    pub ruler: Option<String>,
    /// The model whose tokenizer sizes the RULER tasks and whose chat
    /// template they are written for (a folder, a GGUF file, a hub cache or
    /// Ollama name; the bundled model by default).
    #[arg(long, requires = "ruler")]
    pub model: Option<PathBuf>,
    /// RULER tasks, comma-separated, or `all`: niah_single_1, niah_single_2,
    /// niah_single_3, niah_multikey_1, niah_multikey_2, niah_multikey_3,
    /// niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_1, qa_2.
    #[arg(long, default_value = "all", requires = "ruler")]
    pub tasks: String,
    /// RULER samples per task.
    #[arg(long, default_value_t = 10, requires = "ruler")]
    pub samples: usize,
    /// Write the RULER tasks as completions (BoS, context, question, answer
    /// stem) even for a model with a chat template (the form of a model
    /// without one).
    #[arg(long, requires = "ruler")]
    pub completion: bool,
}

/// Run `lcut suite`: write the suite and print its composition.
pub fn run(args: &SuiteArgs) -> Result<()> {
    if let Some(len) = &args.ruler {
        return ruler(args, len);
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(suite::SMOLLM2_SUITE));
    let items = suite::generate(args.seed);
    write_atomic(&out, suite::to_jsonl(&items).as_bytes())?;
    println!(
        "wrote {} items to {} ({})",
        items.len(),
        out.display(),
        composition(&items)
    );
    Ok(())
}

/// `kind=count ...` in order of first appearance.
fn composition(items: &[SuiteItem]) -> String {
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for it in items {
        match kinds.iter_mut().find(|(k, _)| *k == it.kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((&it.kind, 1)),
        }
    }
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}={n}")).collect();
    parts.join(" ")
}

/// `lcut suite --ruler LEN`: every input checked (length, tasks, samples,
/// the model's context) before any task is written.
fn ruler(args: &SuiteArgs, len: &str) -> Result<()> {
    let target = parse_len(len).with_context(|| format!("--ruler {len}"))?;
    let tasks = RulerTask::parse_list(&args.tasks)?;
    let out = args
        .out
        .clone()
        .context("--ruler needs --out FILE (the suite to write)")?;
    let pending = ModelArgs::cpu(
        args.model.clone(),
        WeightArg::Dense(crate::args::DtypeArg::F32),
        KvDtypeArg::Auto,
    )
    .open()?;
    let context = pending.config().max_position_embeddings;
    let tok = pending.prompter()?;
    let completion = args.completion || !tok.has_chat_template();
    let opts = RulerOptions {
        target,
        context,
        samples: args.samples,
        seed: args.seed,
        tasks,
        completion,
    };
    let items = suite::generate_ruler(&tok, &opts)?;
    let lengths = items
        .iter()
        .map(|it| Ok(it.prepare_tokenized(&tok)?.len() + it.max_new_tokens.unwrap_or(0)))
        .collect::<Result<Vec<_>>>()?;
    write_atomic(&out, suite::to_jsonl(&items).as_bytes())?;
    println!(
        "wrote {} RULER items ({} form) to {}: {} of the model's tokens at most with each task's \
         new tokens (written: {} to {}); {}",
        items.len(),
        if completion { "completion" } else { "chat" },
        out.display(),
        target,
        lengths.iter().min().unwrap_or(&0),
        lengths.iter().max().unwrap_or(&0),
        composition(&items)
    );
    Ok(())
}
