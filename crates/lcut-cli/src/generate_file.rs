//! `lcut generate --prompts FILE`: every prompt of a prompt set (JSON
//! Lines of `{"id": ..., "prompt": ..., "system"?: ...}`, as `lcut
//! diagnose --prompts` reads) generated under one policy, up to eight at a
//! time decoded side by side (one pass over the weights per step for all
//! of them; greedy results are those of one prompt at a time). Each result
//! is printed as it ends; `--json` writes them all.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use lcut_engine::diagnose::read_prompt_set;
use lcut_engine::{
    Generation, GenerationConfig, GenerationOutput, PreparedPrompt, TOGETHER, run_together,
};
use lcut_policy::PolicySpec;
use serde::Serialize;

use crate::common::{PendingModel, write_atomic};
use crate::memory_check::{check_before_loading, report_peak};

/// One prompt's result.
#[derive(Debug, Serialize)]
struct PromptResult {
    id: String,
    prompt_tokens: usize,
    text: String,
    #[serde(flatten)]
    output: GenerationOutput,
}

/// What `lcut generate --prompts` takes from the command line.
pub struct FileRun<'a> {
    /// The prompt set.
    pub path: &'a Path,
    /// The adapter to apply, if any.
    pub lora: &'a crate::lora_opt::LoraArgs,
    /// The policy every prompt runs under.
    pub policy: &'a PolicySpec,
    /// Generation settings but the stop tokens (the model's own are added).
    pub config: GenerationConfig,
    /// Through the chat template (when the model has one).
    pub use_template: bool,
    /// Run even when the memory the run needs is more than is free.
    pub force: bool,
    /// Where to write every result as JSON.
    pub json: Option<&'a Path>,
}

/// Generate every prompt of `run.path` with the model `pending` names.
pub fn run(pending: PendingModel, run: &FileRun<'_>) -> Result<()> {
    let specs = read_prompt_set(run.path)?;
    let prompter = pending.prompter()?;
    let prompts = specs
        .iter()
        .map(|s| {
            prompter
                .prepare_text(&s.user, s.system.as_deref(), run.use_template)
                .with_context(|| format!("prompt {:?} of {}", s.id, run.path.display()))
        })
        .collect::<Result<Vec<PreparedPrompt>>>()?;
    let longest = prompts.iter().map(PreparedPrompt::len).max().unwrap_or(0);
    let in_flight = prompts.len().min(TOGETHER);
    let mut need = crate::cmd_generate::generation_memory(
        &pending,
        longest + run.config.max_new_tokens,
        &[run.policy.kind],
    );
    need.kv *= in_flight as u64;
    let what = format!(
        "{in_flight} generations of up to {longest}+{} tokens",
        run.config.max_new_tokens
    );
    let need = check_before_loading(&what, &need, (&pending.device, pending.mode), run.force)?;
    let mut session = pending.load()?;
    run.lora
        .apply_to_session(&mut session, &[run.policy.to_string()])?;
    let policy = session.resolve_policy(run.policy)?;
    let config = GenerationConfig {
        stop_tokens: session.stop_tokens(),
        ..run.config.clone()
    };
    let bar = crate::cmd_diagnose::progress_bar();
    bar.set_length(prompts.len() as u64);
    let started = Instant::now();
    let jobs = prompts
        .iter()
        .map(|p| Generation::new(&session.model, p.clone(), policy, config.clone()));
    let mut results: Vec<Option<PromptResult>> = specs.iter().map(|_| None).collect();
    let mut tokens = 0usize;
    run_together(
        jobs,
        |_, _| true,
        |i, output| {
            let text = session.generated_text(&output.tokens);
            tokens += output.tokens.len();
            bar.suspend(|| println!("[{}] {}", specs[i].id, text.trim()));
            bar.inc(1);
            results[i] = Some(PromptResult {
                id: specs[i].id.clone(),
                prompt_tokens: prompts[i].len(),
                text,
                output,
            });
        },
    )?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} prompts under {policy}: {tokens} new tokens in {secs:.1} s ({:.1} tok/s, up to {TOGETHER} decoded side by side)",
        prompts.len(),
        tokens as f64 / secs.max(f64::MIN_POSITIVE)
    );
    if let Some(path) = run.json {
        let all: Vec<PromptResult> = results.into_iter().flatten().collect();
        write_atomic(path, serde_json::to_string_pretty(&all)?.as_bytes())?;
    }
    report_peak(&need, session.model.device());
    Ok(())
}
