//! `lcut paper`: for one model, the SPEED paper's evidence in one report —
//! decode-time attention mass per layer, full beside SPEED+BoS (Figure 1);
//! TTFT, TPOT and K/V held against prompt length beside the cost model
//! (Figure 2); prefill mass, prompt entropy and curvature per layer for
//! each category of a suite (Figure 3); exact match by prompt length on
//! retrieval (Figure 4); the category table with the efficiency columns;
//! and the repetition loops, anchor-free against +BoS — and `lcut
//! paper-merge`, which joins the folders of `--shard` runs.
//!
//! Each part is written to `OUT/parts/` as it runs (resumable; a rerun
//! skips what is done and refuses a folder of other settings), then the
//! report: `OUT/paper.{html,md,json}`, `OUT/figures/*.svg`, `OUT/csv/*.csv`.

mod answers;
mod args;
mod assemble;
mod diag;
mod loops;
mod parts;
mod plan;
mod progress;
mod setup;
mod store;
mod timing;
mod units;

use std::path::Path;

use anyhow::{Context, Result, bail};
use lcut_trace::PaperPart;
use serde_json::Value;

pub use args::{PaperArgs, PaperMergeArgs};

use assemble::{assemble, resolve_cut};
use parts::Ctx;
use setup::{Setup, model_arg};
use store::{Manifest, PartFile, claim_folder, load_part, read_manifest, save_part};
use units::DiagUnit;

/// The parts to run: `--parts`, or all of them.
fn wanted(args: &PaperArgs) -> Vec<PaperPart> {
    if args.parts.is_empty() {
        PaperPart::ALL.to_vec()
    } else {
        PaperPart::ALL
            .into_iter()
            .filter(|p| args.parts.contains(p))
            .collect()
    }
}

/// Run one part (the full-depth diagnostics are run first, elsewhere).
fn run_one(ctx: &Ctx, part: PaperPart) -> Result<()> {
    match part {
        PaperPart::Layers => diag::diag_part(ctx, part).map(drop),
        PaperPart::Masses => diag::diag_part(ctx, part).map(drop),
        PaperPart::Retrieval => answers::retrieval_part(ctx).map(drop),
        PaperPart::Table => answers::table_part(ctx).map(drop),
        PaperPart::Loops => loops::loops_part(ctx).map(drop),
        PaperPart::Timing => timing::timing_part(ctx).map(drop),
    }
}

/// The order parts run in: the full-depth diagnostics first (they give the
/// recommended cut), the timing last (the longest prompts).
const RUN_ORDER: [PaperPart; 6] = [
    PaperPart::Layers,
    PaperPart::Masses,
    PaperPart::Retrieval,
    PaperPart::Table,
    PaperPart::Loops,
    PaperPart::Timing,
];

/// Run `lcut paper`.
pub fn run(args: &PaperArgs) -> Result<()> {
    let setup = Setup::load(args)?;
    claim_folder(&args.out, &setup.manifest)?;
    let wanted = wanted(args);
    let layers = setup.session.model.config().num_layers;
    // the full-depth diagnostics come first: Figure 1 reads them, and
    // without --cut they recommend the cut
    let needs_layers = wanted.contains(&PaperPart::Layers)
        || wanted.contains(&PaperPart::Masses)
        || setup.settings.cut.is_none();
    let placeholder = Ctx {
        setup: &setup,
        dir: &args.out,
        cut: setup.settings.cut.unwrap_or(layers),
    };
    let full: Vec<DiagUnit> = if needs_layers {
        let file: PartFile<DiagUnit> = diag::diag_part(&placeholder, PaperPart::Layers)?;
        file.done.into_iter().map(|u| u.result).collect()
    } else {
        Vec::new()
    };
    let (cut, source, _) = resolve_cut(&setup.settings, &full, layers)?;
    eprintln!("comparing at C = {cut} of {layers} ({source})");
    let ctx = Ctx { cut, ..placeholder };
    for (spec, why) in ctx.compared().1 {
        eprintln!("left out on this model: {spec}: {why}");
    }
    answers::memory_lines(&ctx, &wanted)?;
    for part in RUN_ORDER
        .into_iter()
        .filter(|p| *p != PaperPart::Layers && wanted.contains(p))
    {
        run_one(&ctx, part)?;
    }
    write_report(&args.out, &setup.manifest, &model_arg(args))
}

/// Assemble the folder's report and write it; print each part's outcome.
fn write_report(dir: &Path, manifest: &Manifest, model: &str) -> Result<()> {
    let report = assemble(dir, manifest, model)?;
    let written = lcut_report::write_paper(&report, dir)
        .with_context(|| format!("writing the report into {}", dir.display()))?;
    for part in PaperPart::ALL {
        let line = match report.record(part) {
            None => "not run".to_string(),
            Some(r) if r.written => "written".to_string(),
            Some(r) => r.note.clone().unwrap_or_default(),
        };
        println!("{}. {}: {line}", part.number(), part.name());
    }
    println!(
        "wrote {} files into {} (paper.html, paper.md, paper.json, figures/, csv/)",
        written.len(),
        dir.display()
    );
    Ok(())
}

/// The manifests of the shards, checked to be shards of one run; the
/// manifest of the whole run.
fn whole_run(shards: &[(&Path, Manifest)]) -> Result<Manifest> {
    let Some((first_dir, first)) = shards.first() else {
        bail!("no shard folders given");
    };
    let mut seen = Vec::new();
    for (dir, m) in shards {
        let Some([i, n]) = m.suite.shard else {
            bail!(
                "{} is not a shard (it was run without --shard)",
                dir.display()
            );
        };
        if seen.iter().any(|&(j, _)| j == i) || seen.iter().any(|&(_, m)| m != n) {
            bail!(
                "shard {i}/{n} of {} is given twice or with another count",
                dir.display()
            );
        }
        seen.push((i, n));
        let (mut a, mut b) = (first.clone(), m.clone());
        a.suite.shard = None;
        b.suite.shard = None;
        b.model.path.clone_from(&a.model.path);
        let diff = store::differences(&serde_json::to_value(&a)?, &serde_json::to_value(&b)?);
        if !diff.is_empty() {
            bail!(
                "{} and {} are not shards of one run: {}",
                first_dir.display(),
                dir.display(),
                diff.join("; ")
            );
        }
    }
    let n = seen[0].1;
    if seen.len() != n {
        bail!("{} of {n} shards given; every shard is needed", seen.len());
    }
    let mut whole = first.clone();
    whole.suite.shard = None;
    Ok(whole)
}

/// One part joined over the shards, `None` when no shard has it.
fn join_part(shards: &[(&Path, Manifest)], part: PaperPart) -> Result<Option<PartFile<Value>>> {
    let mut joined: Option<PartFile<Value>> = None;
    for (dir, _) in shards {
        let file = load_part::<Value>(dir, part)?;
        let Some(file) = file else {
            if joined.is_some() {
                bail!(
                    "{} has no `{part}` part while other shards do",
                    dir.display()
                );
            }
            continue;
        };
        if !file.complete() {
            bail!(
                "{}: part `{part}` has {} of its {} units (run that shard again to finish it)",
                dir.display(),
                file.done.len(),
                file.units.len()
            );
        }
        joined = Some(match joined {
            None => file,
            Some(mut j) => {
                let diff = store::differences(&j.settings, &file.settings);
                if !diff.is_empty() {
                    bail!(
                        "{}: part `{part}` has other settings: {}",
                        dir.display(),
                        diff.join("; ")
                    );
                }
                j.units.extend(file.units);
                j.done.extend(file.done);
                j
            }
        });
    }
    if let Some(j) = &mut joined {
        j.units.sort_unstable();
        j.done.sort_by_key(|u| u.index);
        if j.units.windows(2).any(|w| w[0] == w[1]) {
            bail!("part `{part}`: a unit appears in two shards");
        }
    }
    Ok(joined)
}

/// Run `lcut paper-merge`.
pub fn merge(args: &PaperMergeArgs) -> Result<()> {
    let shards = args
        .shards
        .iter()
        .map(|d| Ok((d.as_path(), read_manifest(d)?)))
        .collect::<Result<Vec<_>>>()?;
    let whole = whole_run(&shards)?;
    claim_folder(&args.out, &whole)?;
    for part in PaperPart::ALL {
        if let Some(file) = join_part(&shards, part)? {
            save_part(&args.out, &file)?;
        }
    }
    write_report(&args.out, &whole, &whole.model.path)
}
