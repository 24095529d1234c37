//! `lcut recommend`: the SPEED cut and the (layer, K/V head) pairs kept
//! above it that a K/V budget buys, from a diagnose run's report (no model
//! loaded), written as a head file for `speed:C+bos+heads:FILE`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use lcut_engine::heads::{HeadAdvice, write_head_file};
use lcut_engine::serve_shape::BudgetShape;
use lcut_trace::{Report, read_report_json};

/// Arguments of `lcut recommend`.
#[derive(Debug, Args)]
pub struct RecommendArgs {
    /// A diagnose run folder (holding report.json), or a report file.
    pub run: PathBuf,
    /// The share of the full model's K/V to keep, in (0, 1].
    #[arg(long, value_parser = parse_budget)]
    pub kv_budget: f64,
    /// The head file to write (RUN/heads-kv<BUDGET>.json by default).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A prefill (TTFT) budget as well: the prompt runs at most this many
    /// layers, so the cut is at most T and every kept pair lies below
    /// layer T (kept pairs above the cut otherwise make the prompt run up
    /// to the highest of them).
    #[arg(long, value_name = "T")]
    pub prefill_layers: Option<usize>,
}

/// A K/V budget: a share in (0, 1].
pub fn parse_budget(text: &str) -> std::result::Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(b) if b > 0.0 && b <= 1.0 => Ok(b),
        Ok(b) => Err(format!(
            "{b} is outside (0, 1]: the budget is the share of the full model's K/V to keep"
        )),
        Err(_) => Err(format!("{text:?} is not a number in (0, 1]")),
    }
}

/// The default head file of a budget in a run folder.
pub fn head_file_path(dir: &Path, budget: f64) -> PathBuf {
    dir.join(format!("heads-kv{budget}.json"))
}

/// Plan `budget` on `report`, write the head file to `out` and print what
/// it buys.
pub fn advise(
    report: &Report,
    budget: f64,
    prefill_layers: Option<usize>,
    out: &Path,
) -> Result<()> {
    let at = BudgetShape::of_report(report);
    let advice = HeadAdvice::from_report_within(report, budget, at, prefill_layers)?;
    write_head_file(out, &advice, &report.model)
        .with_context(|| format!("writing the head file {}", out.display()))?;
    println!("{}", advice.summary(out));
    if let Some(t) = prefill_layers {
        let runs = advice
            .plan
            .heads
            .iter()
            .map(|&(l, _)| l + 1)
            .max()
            .unwrap_or(0)
            .max(advice.plan.cut);
        println!(
            "prefill budget {t} of {} layers: the prompt runs {runs} layers",
            report.model.num_layers
        );
    }
    println!(
        "planned from the report's masses alone; `lcut diagnose --kv-budget {budget}` checks the \
         plans of nearby cuts and SPEED+BoS on the model"
    );
    // a knockout run also says whether a band in the middle beats the suffix
    if let Some(line) = lcut_report::knockout_sentence(report) {
        println!("{line}");
    }
    println!("wrote {}", out.display());
    Ok(())
}

/// Run `lcut recommend`.
pub fn run(args: &RecommendArgs) -> Result<()> {
    let (dir, file) = match args.run.is_dir() {
        true => (args.run.clone(), args.run.join("report.json")),
        false => (
            args.run.parent().map(Path::to_path_buf).unwrap_or_default(),
            args.run.clone(),
        ),
    };
    let report = read_report_json(&file)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| head_file_path(&dir, args.kv_budget));
    advise(&report, args.kv_budget, args.prefill_layers, &out)
}
