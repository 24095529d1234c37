//! `lcut suite`: (re)write the project's task suite from a seed, or
//! (`--ruler LEN`) RULER-style long-context tasks sized in a model's tokens.

use std::path::PathBuf;

use anyhow::{Context, Result};
use lcut_engine::suite::{self, RulerOptions, RulerTask, SuiteItem};

use crate::args::{KvDtypeArg, WeightArg};
use crate::common::{ModelArgs, parse_len, write_atomic};

/// How the prompts are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormArg {
    /// Questions for a chat template (SmolLM2-Instruct and other chat models).
    Chat,
    /// Each question followed by an answer stem the model continues, for a
    /// base model without a chat template (Gemma 3 270M).
    Completion,
}

/// Arguments of `lcut suite`.
#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// Seed of the generators.
    #[arg(long, default_value_t = suite::SMOLLM2_SUITE_SEED)]
    pub seed: u64,
    /// Chat form, or completion form for a base model (each question
    /// followed by an answer stem; RULER tasks take completion form for a
    /// model without a chat template whatever this says).
    #[arg(long, value_enum, default_value = "chat")]
    pub form: FormArg,
    /// Where to write the JSON Lines [default: fixtures/suites/smollm2.jsonl
    /// in chat form, fixtures/suites/completion.jsonl in completion form;
    /// --ruler needs it given].
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
}

/// Run `lcut suite`: write the suite and print its composition.
pub fn run(args: &SuiteArgs) -> Result<()> {
    if let Some(len) = &args.ruler {
        return ruler(args, len);
    }
    let (form, default_out) = match args.form {
        FormArg::Chat => (suite::Form::Chat, suite::SMOLLM2_SUITE),
        FormArg::Completion => (suite::Form::Completion, suite::COMPLETION_SUITE),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(default_out));
    let items = suite::generate_in(args.seed, form);
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
    let completion = args.form == FormArg::Completion || !tok.has_chat_template();
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
