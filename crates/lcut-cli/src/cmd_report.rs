//! `lcut report` and `lcut merge`: render a run's report, combine shards.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use lcut_report::{Format, write_report};
use lcut_trace::{read_report_json, write_report_json};

use crate::cmd_diagnose::print_summary;

/// Arguments of `lcut report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run folder holding report.json.
    run_dir: PathBuf,
    /// html, md, csv or json (comma-separated for several).
    #[arg(long, default_value = "html")]
    format: String,
}

/// Run `lcut report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let report = read_report_json(&args.run_dir.join("report.json"))?;
    for f in args.format.split(',') {
        let format: Format = f.trim().parse()?;
        let path = write_report(&report, &args.run_dir, format)
            .with_context(|| format!("writing the {f} report into {}", args.run_dir.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Arguments of `lcut merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Shard run folders, each holding report.json.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
    /// Output folder for the merged report.json.
    #[arg(long)]
    out: PathBuf,
}

/// Run `lcut merge`; says so when the shards (their traces or their
/// sweeps) were made by several builds or instruction-set levels.
pub fn merge(args: &MergeArgs) -> Result<()> {
    let shards = args
        .shards
        .iter()
        .map(|d| read_report_json(&d.join("report.json")))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = lcut_diag::merge(shards)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("report.json");
    write_report_json(&path, &merged)?;
    print_summary(&merged);
    // shards from several builds or levels: the merged report need not be
    // the unsharded run's bits
    let sweep_made_by = merged.sweep.as_ref().map(|s| s.made_by.as_slice());
    let made_by =
        lcut_trace::made_by::union([merged.made_by.as_slice()].into_iter().chain(sweep_made_by));
    if let Some(note) = lcut_trace::made_by::several_note(&made_by) {
        println!("{note}");
    }
    println!("wrote {} ({} prompts)", path.display(), merged.traces.len());
    Ok(())
}
