//! `lcut suite`: (re)write the project's task suite from a seed.

use std::path::PathBuf;

use anyhow::Result;
use lcut_engine::suite;

use crate::common::write_atomic;

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
    /// Chat form, or completion form for a base model.
    #[arg(long, value_enum, default_value = "chat")]
    pub form: FormArg,
    /// Where to write the JSON Lines [default: fixtures/suites/smollm2.jsonl
    /// in chat form, fixtures/suites/completion.jsonl in completion form].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Run `lcut suite`: write the suite and print its composition.
pub fn run(args: &SuiteArgs) -> Result<()> {
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
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for it in &items {
        match kinds.iter_mut().find(|(k, _)| *k == it.kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((&it.kind, 1)),
        }
    }
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!(
        "wrote {} items to {} ({})",
        items.len(),
        out.display(),
        parts.join(" ")
    );
    Ok(())
}
