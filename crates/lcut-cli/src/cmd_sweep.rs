//! `lcut sweep`: SPEED at every cutoff, teacher-forced against the full
//! model's greedy continuation, with costs at a context length.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::path::PathBuf;

use lcut_engine::diagnose::{AxisPolicy, SweepOptions, equal_kv_pairs, shard_indices, sweep};
use lcut_engine::suite::{
    CutoffEvalOptions, accuracy_by_cutoff, read_suite_hashed, smallest_cut_within,
};
use lcut_policy::{Anchors, PolicyKind, PolicySpec};
use lcut_trace::{
    CutoffAccuracy, PolicyPoint, Report, SuiteSource, Sweep, read_report_json, write_json,
    write_report_json,
};

use crate::args::PolicyList;
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
    /// Other policies to measure on the same prompts and continuations,
    /// separated by `,` or `;` (e.g. "slim:paper,slim:9@50%,19@25%+block:16").
    #[arg(long)]
    policies: Option<PolicyList>,
    /// Pair each SPEED+BoS cutoff C with a SlimInfer run at this first cut
    /// holding the same K/V (keeping (C - c1)/(L - c1) of the prompt).
    #[arg(long)]
    equal_kv: Option<usize>,
    /// SlimInfer options for the --equal-kv pairs (e.g. "+block:16+unit:4").
    #[arg(long, default_value = "")]
    slim_options: String,
    /// Also score SPEED+BoS's own greedy answers at each cutoff on this task
    /// suite (and anchor-free SPEED's with --anchor-free; one full prefill
    /// per item reused for every cutoff; with --shard I/N items I, I+N, ...
    /// only), and compare the recommendation with the smallest BoS cutoff
    /// within 2 points of full.
    #[arg(long)]
    eval_suite: Option<PathBuf>,
    /// Most new tokens of each suite answer.
    #[arg(long, default_value_t = 24)]
    eval_max_new_tokens: usize,
}

/// SPEED+BoS's accuracy on `--eval-suite` at each cutoff of the sweep (and
/// anchor-free SPEED's with `--anchor-free`), on the items of `--shard`
/// only when given, with the suite it was scored on.
fn suite_accuracy(
    args: &SweepArgs,
    session: &lcut_engine::Session,
    cuts: &[usize],
    shard: Option<(usize, usize)>,
) -> Result<(Vec<CutoffAccuracy>, Option<SuiteSource>)> {
    let Some(path) = &args.eval_suite else {
        return Ok((Vec::new(), None));
    };
    let (items, suite_hash) = read_suite_hashed(path)?;
    let mut anchors = vec![Anchors::Bos];
    if args.anchor_free {
        anchors.push(Anchors::None);
    }
    let mut opts = CutoffEvalOptions {
        cuts: cuts.to_vec(),
        anchors,
        max_new_tokens: args.eval_max_new_tokens,
        prefill_chunk: lcut_engine::GenerationConfig::default().prefill_chunk,
        shard,
        memory_budget: None,
    };
    opts.memory_budget = crate::common::cutoff_memory_line(session, &items, &opts)?;
    let todo = shard_indices(items.len(), shard)?.len();
    let bar = progress_bar();
    bar.set_length(todo as u64);
    bar.set_message(format!("suite {}", path.display()));
    let points = accuracy_by_cutoff(session, &items, &opts, &mut |done, _| {
        bar.set_position(done as u64);
        true
    })?;
    bar.finish_and_clear();
    let source = SuiteSource {
        path: path.display().to_string(),
        hash: suite_hash,
        items: items.len(),
        shard: shard.map(|(i, n)| [i, n]),
    };
    Ok((points, Some(source)))
}

/// The suite the accuracy was scored on, and how many of its items.
fn print_suite_source(source: &SuiteSource) {
    let shard = source.shard.map(|[i, n]| (i, n));
    let todo = shard_indices(source.items, shard).map_or(0, |items| items.len());
    let shard_note = shard.map_or_else(String::new, |(i, n)| format!(", shard {i}/{n}"));
    println!(
        "\n({todo} of {} items of {}{shard_note})",
        source.items, source.path
    );
}

/// Suite accuracy per cutoff: one accuracy and interval column for each
/// anchor setting scored (BoS, then none).
fn print_accuracy(points: &[CutoffAccuracy]) {
    let mut anchors: Vec<&str> = Vec::new();
    let mut cuts: Vec<usize> = Vec::new();
    for p in points {
        if !anchors.contains(&p.anchors.as_str()) {
            anchors.push(&p.anchors);
        }
        if !cuts.contains(&p.l_cut) {
            cuts.push(p.l_cut);
        }
    }
    let mut head = format!("{:>5}", "L_cut");
    for a in &anchors {
        head += &format!(" {:>14} {:>16}", format!("accuracy {a}"), "95% interval");
    }
    println!("{head}");
    for c in cuts {
        let mut line = format!("{c:>5}");
        for a in &anchors {
            match points.iter().find(|p| p.l_cut == c && p.anchors == *a) {
                Some(p) => {
                    line += &format!(
                        " {:>14.3}   [{:.3}, {:.3}]",
                        p.accuracy, p.interval[0], p.interval[1]
                    )
                }
                None => line += &format!(" {:>14} {:>16}", "-", "-"),
            }
        }
        println!("{line}");
    }
}

/// The recommendation, the knee and the accuracy-based cutoff side by side.
fn print_calibration(report: &Report) {
    let Some(sweep) = &report.sweep else { return };
    if sweep.accuracy.is_empty() {
        return;
    }
    let rec = report.recommendation.l_cut;
    let target = smallest_cut_within(&sweep.accuracy, 0.02);
    let knee = sweep.knee.map_or_else(|| "none".into(), |k| k.to_string());
    match target {
        Some(t) => println!(
            "recommended L_cut {rec}, sweep knee {knee}, smallest cutoff within 2 points of full accuracy {t}: the recommendation is {} ({:+} layers)",
            if rec.abs_diff(t) <= 2 {
                "within +-2"
            } else {
                "OFF by more than 2"
            },
            rec as i64 - t as i64
        ),
        None => println!("recommended L_cut {rec}, sweep knee {knee}; no accuracy points"),
    }
    if let Some(line) = lcut_report::expected_accuracy_line(report) {
        println!("{line}");
    }
}

/// The sweep's comparison axis: `--policies` and the `--equal-kv` pairs.
fn axis_policies(args: &SweepArgs, num_layers: usize, cuts: &[usize]) -> Result<Vec<AxisPolicy>> {
    let mut axis = Vec::new();
    for spec in args.policies.iter().flat_map(|p| &p.0) {
        spec.resolve(num_layers)?;
        axis.push(AxisPolicy {
            spec: *spec,
            paired_with: None,
        });
    }
    if let Some(first_cut) = args.equal_kv {
        let probe: PolicySpec = format!("slim:1@1{}", args.slim_options)
            .parse()
            .with_context(|| format!("--slim-options {:?}", args.slim_options))?;
        let options = probe.slim.map(|s| s.options).unwrap_or_default();
        axis.extend(equal_kv_pairs(num_layers, cuts, first_cut, options)?);
    }
    Ok(axis)
}

/// The comparison axis as a table (measured on the prompts, not at the
/// context length).
fn print_axis(points: &[PolicyPoint]) {
    if points.is_empty() {
        return;
    }
    let width = points.iter().map(|p| p.policy.len()).max().unwrap_or(6);
    let pair = points
        .iter()
        .filter_map(|p| p.paired_with.as_ref().map(String::len))
        .max()
        .unwrap_or(11);
    println!(
        "\n{:<width$} {:>pair$} {:>8} {:>9} {:>8} {:>7} {:>7} {:>8} {:>6} {:>6}",
        "policy (on the prompts)",
        "paired with",
        "top-1",
        "KL",
        "NLL",
        "KV x",
        "res. x",
        "FLOPs x",
        "L_eq",
        "swaps"
    );
    for p in points {
        println!(
            "{:<width$} {:>pair$} {:>8.3} {:>9.4} {:>8.3} {:>7.3} {:>7.3} {:>8.3} {:>6.1} {:>6.2} {}",
            p.policy,
            p.paired_with.as_deref().unwrap_or("-"),
            p.top1_agreement,
            p.mean_kl,
            p.nll,
            p.kv_ratio,
            p.resident_ratio,
            p.prefill_ratio,
            p.equal_kv_cutoff,
            p.swap_rate,
            p.scorer_precision
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join("/")
        );
    }
}

/// Run `lcut sweep`: adds the sweep to `OUT/report.json` when one exists
/// (so the knee is reported next to the recommendation), else writes `OUT/sweep.json`.
pub fn run(args: &SweepArgs) -> Result<()> {
    let mut axis_kinds: Vec<PolicyKind> = args
        .policies
        .iter()
        .flat_map(|list| list.0.iter().map(|p| p.kind))
        .collect();
    if args.equal_kv.is_some() {
        axis_kinds.push(PolicyKind::Slim);
    }
    if args.run.save_lens_logits {
        bail!("--save-lens-logits: a sweep records no logit lens; pass it to `lcut diagnose`");
    }
    if args.run.knockout {
        bail!(
            "--knockout: a sweep takes knockout bands as policies (--policies \"knockout:0;band:2..5\"); \
             pass --knockout to `lcut diagnose` for the curve over every layer"
        );
    }
    if args.run.routing_policy.is_some() {
        bail!(
            "--routing-policy: a sweep measures the routing overlap of every cut it runs (on a \
             mixture-of-experts model); pass --routing-policy to `lcut diagnose` for one policy's \
             overlap per layer"
        );
    }
    let inputs = load_inputs(&args.run, &axis_kinds)?;
    let session = &inputs.session;
    let diag = options(&args.run, inputs.file.clone())?;
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
    let num_layers = session.model.config().num_layers;
    let all_cuts: Vec<usize> = cuts.clone().unwrap_or_else(|| (1..=num_layers).collect());
    let opts = SweepOptions {
        axis: axis_policies(args, num_layers, &all_cuts)?,
        cuts,
        anchor_free: args.anchor_free,
        context_len: parse_len(&args.context_len)?,
        max_new_tokens: args.run.max_new_tokens,
        ..SweepOptions::default()
    };
    let (accuracy, suite) = suite_accuracy(args, session, &all_cuts, diag.shard)?;
    let prepared = &inputs.prepared;
    let bar = progress_bar();
    let result = sweep(
        session,
        prepared,
        &opts,
        &diag.thresholds,
        &mut on_event(&bar),
    )?;
    bar.finish_and_clear();
    let mut result = result;
    result.accuracy = accuracy;
    result.suite = suite;
    result.prompt_shard = diag.shard.map(|(i, n)| [i, n]);
    // written before anything is printed: a closed stdout (`| head`) ends
    // the process at its first print, and the sweep must be on disk by then
    std::fs::create_dir_all(&args.run.out)
        .with_context(|| format!("creating {}", args.run.out.display()))?;
    let report_path = args.run.out.join("report.json");
    if report_path.exists() {
        let mut report = read_report_json(&report_path)?;
        report.sweep = Some(result);
        write_report_json(&report_path, &report)?;
        if let Some(sweep) = &report.sweep {
            print_sweep(sweep);
        }
        print_summary(&report);
        print_calibration(&report);
        println!("added the sweep to {}", report_path.display());
    } else {
        let path = args.run.out.join("sweep.json");
        write_json(&path, &result, "sweep")?;
        print_sweep(&result);
        match result.knee {
            Some(k) => println!("knee at L_cut = {k}"),
            None => println!("no cutoff keeps agreement within the threshold"),
        }
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The sweep's points (with the routing overlap of a mixture-of-experts
/// model's points), its comparison axis and its suite accuracy.
fn print_sweep(sweep: &Sweep) {
    let routed = sweep.points.iter().any(|p| p.routing_overlap.is_some());
    let routing_head = if routed { "  routing" } else { "" };
    println!(
        "{:>5} {:>7} {:>8} {:>9} {:>8} {:>8} {:>9}{routing_head}",
        "L_cut", "anchors", "top-1", "KL", "NLL", "KV x", "FLOPs x"
    );
    for p in &sweep.points {
        let routing = match (routed, p.routing_overlap) {
            (true, Some(o)) => format!(" {o:>8.3}"),
            (true, None) => format!(" {:>8}", "-"),
            (false, _) => String::new(),
        };
        println!(
            "{:>5} {:>7} {:>8.3} {:>9.4} {:>8.3} {:>8.3} {:>9.3}{routing}",
            p.cut_label(),
            p.anchors_label(),
            p.top1_agreement,
            p.mean_kl,
            p.nll,
            p.kv_ratio,
            p.prefill_ratio
        );
    }
    if routed {
        println!(
            "routing: mean top-k overlap of the decode tokens' experts with the full model's \
             (1 = the same experts decode)"
        );
    }
    print_axis(&sweep.policies);
    if let Some(source) = &sweep.suite {
        print_suite_source(source);
        print_accuracy(&sweep.accuracy);
    }
}
