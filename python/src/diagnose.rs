//! `Session.diagnose`: the diagnostic run over a prompt set (the bundled
//! set, a JSON Lines file or a Python list), the recommendation, and
//! optionally the empirical sweep, as `lcut diagnose` and `lcut sweep` run them.

use std::path::PathBuf;
use std::sync::Arc;

use lcut_engine::diagnose::{
    BUNDLED_PROMPTS, DiagnoseEvent, DiagnoseOptions, PromptSpec, SweepOptions, diagnose,
    prepare_prompts, read_prompt_set, sweep,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{detached, engine_err, invalid};
use crate::inputs::budget;
use crate::load::require_exists;
use crate::progress::Progress;
use crate::report::Report;

/// The prompts of a run: a JSON Lines file, or a list of prompts (each a
/// string or a dict with `prompt` and optional `id` and `system`).
#[derive(FromPyObject)]
pub enum PromptsArg<'py> {
    /// A list of prompts.
    List(Vec<Bound<'py, PyAny>>),
    /// A JSON Lines file of `{"id", "prompt", "system"?}`.
    File(PathBuf),
}

/// `sweep=`: off/on, or the cutoffs to sweep.
#[derive(FromPyObject)]
pub enum SweepArg {
    /// Every cutoff (true) or none (false).
    Flag(bool),
    /// These cutoffs.
    Cuts(Vec<usize>),
}

/// One prompt of a Python list.
fn prompt_spec(index: usize, item: &Bound<'_, PyAny>) -> PyResult<PromptSpec> {
    let default_id = format!("p{index}");
    if let Ok(text) = item.extract::<String>() {
        return Ok(PromptSpec::text(&default_id, &text));
    }
    let Ok(d) = item.cast::<PyDict>() else {
        return Err(invalid(format!(
            "prompt {index} is neither a string nor a dict with a \"prompt\" key"
        )));
    };
    let text = |key: &str| -> PyResult<Option<String>> {
        d.get_item(key)?.map(|v| v.extract::<String>()).transpose()
    };
    let Some(user) = text("prompt")? else {
        return Err(invalid(format!("prompt {index} has no \"prompt\" key")));
    };
    Ok(PromptSpec {
        id: text("id")?.unwrap_or(default_id),
        user,
        system: text("system")?,
    })
}

/// The prompts and the file they came from (recorded in the report).
fn read_prompts(prompts: Option<PromptsArg<'_>>) -> PyResult<(Vec<PromptSpec>, Option<String>)> {
    let (specs, file) = match prompts {
        None => {
            let path = lcut_engine::bundled(BUNDLED_PROMPTS);
            require_exists(&path, "the bundled prompt set")?;
            let specs = read_prompt_set(&path).map_err(engine_err)?;
            (specs, Some(BUNDLED_PROMPTS.to_string()))
        }
        Some(PromptsArg::File(path)) => {
            require_exists(&path, "prompt set")?;
            let specs = read_prompt_set(&path).map_err(engine_err)?;
            (specs, Some(path.display().to_string()))
        }
        Some(PromptsArg::List(items)) => {
            let specs = items
                .iter()
                .enumerate()
                .map(|(i, item)| prompt_spec(i, item))
                .collect::<PyResult<Vec<_>>>()?;
            (specs, None)
        }
    };
    if specs.is_empty() {
        return Err(invalid("no prompts to diagnose"));
    }
    Ok((specs, file))
}

/// What `Session.diagnose` was asked for.
pub struct DiagnoseArgs<'py> {
    /// The prompts; the bundled set when `None`.
    pub prompts: Option<PromptsArg<'py>>,
    /// Sweep the cutoffs too.
    pub sweep: SweepArg,
    /// Save the report into this folder.
    pub out: Option<PathBuf>,
    /// Greedy tokens per prompt.
    pub max_new_tokens: usize,
    /// Through the chat template.
    pub chat: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Record the logit lens.
    pub lens: bool,
}

/// A diagnose or sweep event on the bar: prompts done (after `offset`
/// prompts of an earlier phase), the current one's step as a note.
fn tick(bar: &mut Progress, offset: usize, event: &DiagnoseEvent) -> bool {
    match event {
        DiagnoseEvent::PromptStarted { index, id, .. } => bar.tick(offset + index, Some(id)),
        DiagnoseEvent::Prefill { done, total, .. } => {
            bar.tick(0, Some(&format!("prefill {done}/{total}")))
        }
        DiagnoseEvent::Step {
            step, max_steps, ..
        } => bar.tick(0, Some(&format!("step {step}/{max_steps}"))),
        DiagnoseEvent::PromptDone { index, .. } => bar.tick(offset + index + 1, None),
    }
}

/// Diagnose `args.prompts` on `session`.
pub fn run(
    py: Python<'_>,
    session: &Arc<lcut_engine::Session>,
    args: DiagnoseArgs<'_>,
) -> PyResult<Report> {
    let (prompts, file) = read_prompts(args.prompts)?;
    let opts = DiagnoseOptions {
        max_new_tokens: budget(args.max_new_tokens)?,
        use_chat_template: args.chat,
        prompts_file: file,
        lens: args.lens,
        ..DiagnoseOptions::default()
    };
    let layers = session.model.config().num_layers;
    let cuts = match args.sweep {
        SweepArg::Flag(false) => None,
        SweepArg::Flag(true) => Some(None),
        SweepArg::Cuts(cuts) => {
            if let Some(bad) = cuts.iter().find(|&&c| c == 0 || c > layers) {
                return Err(invalid(format!(
                    "sweep cutoff {bad} is out of range: expected 1..={layers}"
                )));
            }
            Some(Some(cuts))
        }
    };
    let n = prompts.len();
    // the sweep runs every prompt again
    let total = if cuts.is_some() { 2 * n } else { n };
    let mut bar = Progress::new(py, args.progress, total, "diagnose", "prompt");
    let result = detached(py, || {
        let mut report = diagnose(session, &prompts, &opts, &mut |e| tick(&mut bar, 0, e))
            .map_err(engine_err)?;
        if let Some(cuts) = cuts {
            let sweep_opts = SweepOptions {
                cuts,
                max_new_tokens: args.max_new_tokens,
                ..SweepOptions::default()
            };
            let prepared = prepare_prompts(session, &prompts, &opts).map_err(engine_err)?;
            let result = sweep(
                session,
                &prepared,
                &sweep_opts,
                &opts.thresholds,
                &mut |e| tick(&mut bar, n, e),
            )
            .map_err(engine_err)?;
            report.sweep = Some(result);
        }
        Ok(report)
    });
    let report = Report {
        report: Arc::new(bar.finish(py, result)?),
    };
    if let Some(dir) = &args.out {
        report.save_to(dir)?;
    }
    Ok(report)
}
