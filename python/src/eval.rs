//! `Session.eval`: a task suite under a policy, scored as `lcut eval
//! --suite` scores it, returned as the dict its `--json` file holds with
//! the whole suite's scores also at the top level.

use std::path::PathBuf;
use std::sync::Arc;

use lcut_engine::suite::{
    SuiteEval, SuiteEvalOptions, evaluate_suite_until, read_suite_hashed, resolve_policy, summarize,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{detached, engine_err};
use crate::inputs::budget;
use crate::load::{LoadSource, open, require_exists};
use crate::progress::Progress;
use crate::report::to_python;

/// What `Session.eval` was asked for.
pub struct EvalArgs {
    /// The suite file (JSON Lines with answers and scoring rules).
    pub suite: PathBuf,
    /// The policies as written.
    pub policies: Vec<String>,
    /// Most new tokens per answer.
    pub max_new_tokens: usize,
    /// Show a progress bar.
    pub progress: bool,
}

/// Run the suite; one result dict per policy.
pub fn run(
    py: Python<'_>,
    session: &Arc<lcut_engine::Session>,
    source: &LoadSource,
    args: EvalArgs,
) -> PyResult<Vec<Py<PyAny>>> {
    require_exists(&args.suite, "task suite")?;
    budget(args.max_new_tokens)?;
    let (items, suite_hash) = read_suite_hashed(&args.suite).map_err(|e| engine_err(e.into()))?;
    let names = args
        .policies
        .iter()
        .map(|p| Ok(resolve_policy(session, p).map_err(engine_err)?.to_string()))
        .collect::<PyResult<Vec<_>>>()?;
    // an adapted model is compared with the model it was made from
    let base = match &source.lora {
        Some(_) => Some(open(
            py,
            &LoadSource {
                lora: None,
                ..source.clone()
            },
        )?),
        None => None,
    };
    let opts = SuiteEvalOptions {
        policies: args.policies.clone(),
        max_new_tokens: args.max_new_tokens,
        ..SuiteEvalOptions::default()
    };
    let mut bar = Progress::new(py, args.progress, items.len(), "eval", "item");
    let mut done = 0;
    let result = detached(py, || {
        evaluate_suite_until(session, base.as_ref(), &items, &opts, &mut |rs| {
            done += 1;
            let marks: String = rs
                .iter()
                .map(|r| if r.correct { '+' } else { '-' })
                .collect();
            let id = rs.first().map_or("", |r| r.id.as_str());
            bar.tick(done, Some(&format!("{id} {marks}")))
        })
        .map_err(engine_err)
    });
    let lists = bar.finish(py, result)?;
    names
        .into_iter()
        .zip(lists)
        .map(|(policy, results)| {
            let eval = SuiteEval {
                model: source.path.display().to_string(),
                suite: args.suite.display().to_string(),
                suite_items: items.len(),
                suite_hash: suite_hash.clone(),
                policy,
                dtype: source.mode.name(),
                adapter: session.adapter.clone(),
                max_new_tokens: args.max_new_tokens,
                item_budgets: false,
                shard: None,
                made_by: vec![lcut_engine::made_by::current()],
                seconds: results.iter().map(|r| r.seconds).sum(),
                scores: summarize(&results),
                items: results,
            };
            with_overall_scores(py, &eval)
        })
        .collect()
}

/// The eval as a dict, with the `all` group's scores (accuracy,
/// kept_of_full, top1_agreement, ...) copied to the top level.
fn with_overall_scores(py: Python<'_>, eval: &SuiteEval) -> PyResult<Py<PyAny>> {
    let value = to_python(py, eval)?;
    let d = value.bind(py).cast::<PyDict>()?;
    if let Some(all) = eval.scores.first() {
        let overall = to_python(py, all)?;
        for (k, v) in overall.bind(py).cast::<PyDict>()?.iter() {
            if k.extract::<String>()? != "group" {
                d.set_item(k, v)?;
            }
        }
    }
    Ok(value)
}
