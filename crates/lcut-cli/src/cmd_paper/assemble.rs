//! The report of a `lcut paper` folder: every part file read back and
//! reduced to the figures' and tables' numbers (curves per category and
//! policy, exact match per length class, the category table with the
//! timing's ratios, the loops), with each part's command and settings.

use std::path::Path;

use anyhow::{Context, Result};
use lcut_diag::{aggregate, ends_in_loop, recommend, wilson};
use lcut_engine::suite::{ItemResult, summarize};
use lcut_policy::{Anchors, PolicyKind, PolicySpec};
use lcut_trace::{
    CategoryCurves, CategoryRow, LengthAccuracy, LoopRow, PaperPart, PaperReport, PartRecord,
    PolicyCurves, PromptTrace, Thresholds, TimingPoint,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::args::Settings;
use super::plan::default_cut;
use super::store::{Manifest, PartFile, load_part};
use super::units::{DiagUnit, LoopEntry, RetrievalUnit, TableEntry};

/// The results of `part` when its file holds every unit.
fn complete<T: DeserializeOwned>(dir: &Path, part: PaperPart) -> Result<Vec<T>> {
    Ok(match load_part::<T>(dir, part)? {
        Some(f) if f.complete() => f.done.into_iter().map(|u| u.result).collect(),
        _ => Vec::new(),
    })
}

/// The kinds of `units` in order of first appearance.
fn kinds_in<'a>(kinds: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for k in kinds {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// Figure 3: full-depth curves of each kind's traces.
fn category_curves(units: &[DiagUnit]) -> Result<Vec<CategoryCurves>> {
    kinds_in(units.iter().map(|u| u.kind.as_str()))
        .into_iter()
        .map(|kind| {
            let traces: Vec<PromptTrace> = units
                .iter()
                .filter(|u| u.kind == kind)
                .map(|u| u.trace.clone())
                .collect();
            Ok(CategoryCurves {
                kind: kind.to_string(),
                prompts: traces.len(),
                curves: aggregate(&traces)?,
            })
        })
        .collect()
}

/// Figure 1's curves of one policy's traces.
fn policy_curves(policy: String, units: &[DiagUnit]) -> Result<PolicyCurves> {
    let traces: Vec<PromptTrace> = units.iter().map(|u| u.trace.clone()).collect();
    Ok(PolicyCurves {
        policy,
        prompts: traces.len(),
        curves: aggregate(&traces)?,
    })
}

/// Figure 4: exact match per policy and length class, classes by their
/// mean prompt length.
fn length_accuracy(units: &[RetrievalUnit]) -> Vec<LengthAccuracy> {
    let policies = kinds_in(
        units
            .iter()
            .flat_map(|u| u.answers.iter().map(|a| a.0.as_str())),
    );
    let mut lengths: Vec<(&str, f64)> = kinds_in(units.iter().map(|u| u.length.as_str()))
        .into_iter()
        .map(|len| {
            let of: Vec<&RetrievalUnit> = units.iter().filter(|u| u.length == len).collect();
            let mean = of.iter().map(|u| u.prompt_tokens as f64).sum::<f64>() / of.len() as f64;
            (len, mean)
        })
        .collect();
    lengths.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out = Vec::new();
    for policy in policies {
        for &(length, mean) in &lengths {
            let answers: Vec<bool> = units
                .iter()
                .filter(|u| u.length == length)
                .flat_map(|u| u.answers.iter().filter(|a| a.0 == policy).map(|a| a.1))
                .collect();
            let correct = answers.iter().filter(|&&a| a).count();
            out.push(LengthAccuracy {
                policy: policy.to_string(),
                length: length.to_string(),
                mean_prompt_tokens: mean,
                correct,
                n: answers.len(),
                accuracy: correct as f64 / answers.len().max(1) as f64,
                ci95: wilson(correct, answers.len()),
            });
        }
    }
    out
}

/// The TTFT and TPOT ratios of `policy` at the longest timed length.
fn timed(timing: &[TimingPoint], policy: &str) -> (Option<f64>, Option<f64>) {
    timing
        .iter()
        .filter(|t| t.policy == policy)
        .max_by_key(|t| t.prompt_len)
        .map_or((None, None), |t| (Some(t.ttft_ratio), Some(t.tpot_ratio)))
}

/// The table: `all` and each kind per policy (with its adapter).
fn category_rows(units: &[Vec<TableEntry>], timing: &[TimingPoint]) -> Vec<CategoryRow> {
    let entries: Vec<&TableEntry> = units.iter().flatten().collect();
    let mut rows_of: Vec<(&str, Option<&str>)> = Vec::new();
    for e in &entries {
        let key = (e.policy.as_str(), e.adapter.as_deref());
        if !rows_of.contains(&key) {
            rows_of.push(key);
        }
    }
    let kinds = kinds_in(entries.iter().map(|e| e.result.kind.as_str()));
    let mut out = Vec::new();
    for (policy, adapter) in rows_of {
        let items: Vec<ItemResult> = entries
            .iter()
            .filter(|e| e.policy == policy && e.adapter.as_deref() == adapter)
            .map(|e| e.result.clone())
            .collect();
        let (ttft, tpot) = timed(timing, policy);
        for g in summarize(&items) {
            if g.group != "all" && !kinds.contains(&g.group.as_str()) {
                continue;
            }
            out.push(CategoryRow {
                policy: policy.to_string(),
                adapter: adapter.map(String::from),
                group: g.group,
                n: g.n,
                correct: g.correct,
                accuracy: g.accuracy,
                ci95: g.ci95,
                full_correct: g.full_correct,
                top1_agreement: g.top1_agreement,
                mean_kl: g.mean_kl,
                kv_ratio: g.kv_ratio,
                ttft_ratio: ttft,
                tpot_ratio: tpot,
            });
        }
    }
    out
}

/// `(family, anchors)` of a policy: `speed:22` and `bos` for `speed:22+bos`.
fn family(policy: &str) -> (String, String) {
    match policy.parse::<PolicySpec>() {
        Ok(spec) if spec.kind == PolicyKind::Full => ("full".into(), "full".into()),
        Ok(spec) => {
            let anchors = match spec.anchors {
                Anchors::None => "none",
                Anchors::Bos => "bos",
                _ => "other",
            };
            let bare = PolicySpec {
                anchors: Anchors::None,
                ..spec
            };
            (bare.to_string(), anchors.into())
        }
        Err(_) => (policy.to_string(), "other".into()),
    }
}

/// The loops of each policy's generations.
fn loop_rows(units: &[Vec<LoopEntry>]) -> Vec<LoopRow> {
    let entries: Vec<&LoopEntry> = units.iter().flatten().collect();
    kinds_in(entries.iter().map(|e| e.policy.as_str()))
        .into_iter()
        .map(|policy| {
            let of: Vec<&&LoopEntry> = entries.iter().filter(|e| e.policy == policy).collect();
            let loops: Vec<usize> = of
                .iter()
                .filter_map(|e| ends_in_loop(&e.tokens).map(|s| s.period))
                .collect();
            let (family, anchors) = family(policy);
            LoopRow {
                policy: policy.to_string(),
                family,
                anchors,
                generations: of.len(),
                looping: loops.len(),
                share: loops.len() as f64 / of.len().max(1) as f64,
                ci95: wilson(loops.len(), of.len()),
                stopped: of.iter().filter(|e| e.stopped).count(),
                mean_period: if loops.is_empty() {
                    0.0
                } else {
                    loops.iter().sum::<usize>() as f64 / loops.len() as f64
                },
            }
        })
        .collect()
}

/// The cut of the comparisons and where it came from: `--cut`, or the
/// recommendation on the full-depth traces.
pub fn resolve_cut(
    settings: &Settings,
    full_traces: &[DiagUnit],
    layers: usize,
) -> Result<(usize, String, Option<usize>)> {
    let recommended = if full_traces.is_empty() {
        None
    } else {
        let traces: Vec<PromptTrace> = full_traces.iter().map(|u| u.trace.clone()).collect();
        Some(recommend(&aggregate(&traces)?, &Thresholds::default(), &[]).l_cut)
    };
    if let Some(c) = settings.cut {
        return Ok((c, "--cut".into(), recommended));
    }
    let r = recommended.context("no --cut and no full-depth diagnostics to recommend one")?;
    let (c, why) = default_cut(r, layers);
    Ok((c, why, recommended))
}

/// The record of `part`: its settings and note from its file, and the
/// command that makes it again; `None` when the folder has no file of it.
fn part_record(dir: &Path, part: PaperPart, command: String) -> Result<Option<PartRecord>> {
    let Some(file) = load_part::<Value>(dir, part)? else {
        return Ok(None);
    };
    let file: PartFile<Value> = file;
    let complete = file.complete();
    let note = match (&file.note, complete) {
        (Some(n), _) => Some(n.clone()),
        (None, false) => Some(format!(
            "incomplete: {} of {} units written (rerun the command to go on)",
            file.done.len(),
            file.units.len()
        )),
        (None, true) => None,
    };
    Ok(Some(PartRecord {
        part,
        written: complete && file.note.is_none(),
        command,
        settings: file.settings,
        note,
    }))
}

/// The report of folder `dir`; `model` is the model as the commands name it.
pub fn assemble(dir: &Path, manifest: &Manifest, model: &str) -> Result<PaperReport> {
    let settings: Settings = serde_json::from_value(manifest.settings.clone())
        .context("run.json: its settings are not this version's")?;
    let layers = manifest.model.num_layers;
    let full: Vec<DiagUnit> = complete(dir, PaperPart::Layers)?;
    let (cut, cut_source, recommended) = resolve_cut(&settings, &full, layers)?;
    let speed: Vec<DiagUnit> = complete(dir, PaperPart::Masses)?;
    let masses = if speed.is_empty() || full.is_empty() {
        Vec::new()
    } else {
        vec![
            policy_curves("full".into(), &full)?,
            policy_curves(super::plan::speed_bos(cut).to_string(), &speed)?,
        ]
    };
    let timing: Vec<TimingPoint> = complete::<Vec<TimingPoint>>(dir, PaperPart::Timing)?
        .into_iter()
        .flatten()
        .collect();
    let table = category_rows(&complete(dir, PaperPart::Table)?, &timing);
    let mut parts = Vec::new();
    for part in PaperPart::ALL {
        let command = settings.command(
            (model, &manifest.suite.path, manifest.suite.shard),
            dir,
            Some(cut),
            Some(part),
        );
        parts.extend(part_record(dir, part, command)?);
    }
    Ok(PaperReport {
        schema_version: lcut_trace::PAPER_SCHEMA_VERSION,
        tool_version: manifest.tool_version.clone(),
        model: manifest.model.clone(),
        suite: manifest.suite.clone(),
        cut,
        cut_source,
        recommended,
        parts,
        masses,
        table_timed_at: timing
            .iter()
            .map(|t| t.prompt_len)
            .max()
            .filter(|_| !table.is_empty()),
        timing,
        layers: category_curves(&full)?,
        retrieval: length_accuracy(&complete(dir, PaperPart::Retrieval)?),
        table,
        loops: loop_rows(&complete(dir, PaperPart::Loops)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_pair_anchor_free_and_bos() {
        assert_eq!(family("speed:22+bos"), ("speed:22".into(), "bos".into()));
        assert_eq!(family("selfonly:3"), ("selfonly:3".into(), "none".into()));
        assert_eq!(family("full"), ("full".into(), "full".into()));
    }

    fn entry(policy: &str, tokens: &[u32]) -> LoopEntry {
        LoopEntry {
            policy: policy.into(),
            tokens: tokens.to_vec(),
            stopped: false,
            text: String::new(),
        }
    }

    #[test]
    fn loop_rows_count_each_policys_loops() {
        let units = vec![
            vec![
                entry("speed:2", &[1, 2, 2, 2]),
                entry("speed:2+bos", &[1, 2, 3]),
            ],
            vec![
                entry("speed:2", &[5, 6, 5, 6, 5, 6]),
                entry("speed:2+bos", &[4, 4, 4]),
            ],
            vec![entry("speed:2", &[1, 2]), entry("speed:2+bos", &[9])],
        ];
        let rows = loop_rows(&units);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].looping, rows[0].generations), (2, 3));
        assert!((rows[0].mean_period - 1.5).abs() < 1e-12);
        assert_eq!(
            (rows[1].family.as_str(), rows[1].anchors.as_str()),
            ("speed:2", "bos")
        );
        assert_eq!(rows[1].looping, 1);
    }

    #[test]
    fn length_classes_are_ordered_by_prompt_length() {
        let unit = |length: &str, tokens, ok| RetrievalUnit {
            length: length.into(),
            prompt_tokens: tokens,
            answers: vec![("full".into(), true), ("speed:2+bos".into(), ok)],
        };
        let pts = length_accuracy(&[
            unit("1k", 1000, false),
            unit("256", 260, true),
            unit("1k", 1100, true),
        ]);
        let labels: Vec<(&str, &str)> = pts
            .iter()
            .map(|p| (p.policy.as_str(), p.length.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("full", "256"),
                ("full", "1k"),
                ("speed:2+bos", "256"),
                ("speed:2+bos", "1k")
            ]
        );
        assert_eq!((pts[3].correct, pts[3].n), (1, 2));
        assert!((pts[1].mean_prompt_tokens - 1050.0).abs() < 1e-9);
    }
}
