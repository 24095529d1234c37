//! `lcut sweep`: SPEED at every cutoff, teacher-forced against the full
//! model's greedy continuation, with costs at a context length.

use anyhow::{Context, Result};
use clap::Args;
use lcut_engine::diagnose::{SweepOptions, prepare_prompts, sweep};
use lcut_trace::{read_report_json, write_json, write_report_json};

use crate::cmd_diagnose::{
    DiagnoseArgs, load_inputs, on_event, options, print_summary, progress_bar,
};
use crate::common::parse_len;

/// Arguments of `lcut sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    run: DiagnoseArgs,
    /// Cutoffs to try, comma-separated (all 1..=L by default).
    #[arg(long)]
    cuts: Option<String>,
    /// Also sweep anchor-free SPEED.
    #[arg(long)]
    anchor_free: bool,
    /// Context length for KV bytes and prefill FLOPs (e.g. 128k).
    #[arg(long, default_value = "128k")]
    context_len: String,
}

/// Run `lcut sweep`: adds the sweep to `OUT/report.json` when one exists
/// (so the knee is reported next to the recommendation), else writes `OUT/sweep.json`.
pub fn run(args: &SweepArgs) -> Result<()> {
    let (session, prompts, file) = load_inputs(&args.run)?;
    let diag = options(&args.run, file)?;
    let cuts = args
        .cuts
        .as_deref()
        .map(|c| {
            c.split(',')
                .map(|x| {
                    x.trim()
                        .parse::<usize>()
                        .with_context(|| format!("cutoff {x:?}"))
                })
                .collect::<Result<Vec<_>>>()
        })
        .transpose()?;
    let opts = SweepOptions {
        cuts,
        anchor_free: args.anchor_free,
        context_len: parse_len(&args.context_len)?,
        max_new_tokens: args.run.max_new_tokens,
        ..SweepOptions::default()
    };
    let prepared = prepare_prompts(&session, &prompts, &diag)?;
    let bar = progress_bar();
    let result = sweep(
        &session,
        &prepared,
        &opts,
        &diag.thresholds,
        &mut on_event(&bar),
    )?;
    bar.finish_and_clear();
    println!(
        "{:>5} {:>7} {:>8} {:>9} {:>8} {:>8} {:>9}",
        "L_cut", "anchors", "top-1", "KL", "NLL", "KV x", "FLOPs x"
    );
    for p in &result.points {
        println!(
            "{:>5} {:>7} {:>8.3} {:>9.4} {:>8.3} {:>8.3} {:>9.3}",
            p.l_cut, p.anchors, p.top1_agreement, p.mean_kl, p.nll, p.kv_ratio, p.prefill_ratio
        );
    }
    std::fs::create_dir_all(&args.run.out)
        .with_context(|| format!("creating {}", args.run.out.display()))?;
    let report_path = args.run.out.join("report.json");
    if report_path.exists() {
        let mut report = read_report_json(&report_path)?;
        report.sweep = Some(result);
        write_report_json(&report_path, &report)?;
        print_summary(&report);
        println!("added the sweep to {}", report_path.display());
    } else {
        let path = args.run.out.join("sweep.json");
        write_json(&path, &result, "sweep")?;
        match result.knee {
            Some(k) => println!("knee at L_cut = {k}"),
            None => println!("no cutoff keeps agreement within the threshold"),
        }
        println!("wrote {}", path.display());
    }
    Ok(())
}
