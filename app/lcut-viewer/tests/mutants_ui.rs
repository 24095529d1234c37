//! Damaged files opened in the viewer (egui_kittest, headless, the REAL
//! engine worker): deterministic mutants from lcut's mutation harness of a
//! report (`report.json`) and of a model folder (the bundled model's
//! `config.json`, `model.safetensors`, `tokenizer.json` and
//! `tokenizer_config.json`, one damaged at a time), a quarter of each
//! file's mutants cut at its structure's boundaries and the rest damaged,
//! each dropped on the window as a user would. Every one must leave the
//! viewer running (no panic in the UI or the worker) and either open (a
//! report is drawn in every view and for each of its first prompts; a model
//! is summarised) or show an error that names the file or folder.
//! [`REPORT_MUTANTS`] report mutants (`LCUT_MUTANTS=N` runs N) and
//! [`MODEL_MUTANTS`] per model file.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use lcut_testkit::mutate::{json_boundaries, safetensors_boundaries};
use lcut_testkit::{json_mutants, mutant_count, safetensors_mutants};
use lcut_viewer::paths;
use lcut_viewer::worker::{WorkerConfig, spawn};
use lcut_viewer_ui::testing::{self, Dropped};
use lcut_viewer_ui::{Tab, ViewerState, channel};

/// Report mutants by default.
const REPORT_MUTANTS: usize = 300;
/// Mutants of each file of the model folder.
const MODEL_MUTANTS: usize = 12;
const SEED: u64 = 20261128;
/// Prompts of a report that opened selected one by one (mutants may repeat
/// the traces many times).
const PROMPTS_SHOWN: usize = 3;
/// The model folder's files, each damaged in turn.
const MODEL_FILES: [&str; 4] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

fn harness() -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    spawn(port, WorkerConfig::default()).unwrap();
    testing::harness(ViewerState::new(backend), true)
}

/// `n` mutants from a stream (`make` starts it afresh) that begins with
/// `cuts` truncations: a quarter spread over the truncations, the rest
/// from the damage after them.
fn sample<'a, I: Iterator<Item = Vec<u8>> + 'a>(
    make: impl Fn() -> I,
    cuts: usize,
    n: usize,
) -> Vec<Vec<u8>> {
    let wanted = (n / 4).max(1);
    let mut out: Vec<Vec<u8>> = make()
        .take(cuts)
        .step_by(cuts.div_ceil(wanted).max(1))
        .take(wanted)
        .collect();
    out.extend(make().skip(cuts).take(n - out.len()));
    out
}

/// `n` mutants of the JSON text `seed` (see [`sample`]).
fn json_sample(seed: &[u8], n: usize) -> Vec<Vec<u8>> {
    let cuts = json_boundaries(seed).len().min(2000);
    sample(|| json_mutants(seed, SEED), cuts, n)
}

/// Drops `path` on the window and steps until the worker has answered;
/// the worker must still be there.
fn drop_and_wait(h: &mut Harness<'_, ViewerState>, path: &Path) {
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(path.to_path_buf())));
    h.step();
    assert!(h.state().job.is_some(), "dropping {path:?} started nothing");
    testing::step_until(h, "the worker's answer", Duration::from_secs(60), |s| {
        s.job.is_none()
    });
    let gone = h
        .state()
        .backend
        .as_ref()
        .is_none_or(|b| b.is_disconnected());
    assert!(
        !gone,
        "the worker stopped on {path:?}: {:?}",
        h.state().error
    );
}

/// The error on display names `name`, and the window shows it.
fn assert_error_shown(h: &Harness<'_, ViewerState>, name: &str) {
    let e = h.state().error.clone().unwrap();
    assert!(e.contains(name), "the error does not name {name}: {e}");
    assert!(
        h.query_all_by_label(&e).next().is_some(),
        "the error is not shown: {e}"
    );
}

/// Draws the report on display in every view, then each of its first
/// prompts in the heatmaps.
fn show_every_view(h: &mut Harness<'_, ViewerState>) {
    for tab in [Tab::Heatmaps, Tab::Curves, Tab::Recommendation, Tab::Sweep] {
        h.state_mut().view.tab = tab;
        h.step();
    }
    h.state_mut().view.tab = Tab::Heatmaps;
    let prompts = h.state().loaded.as_ref().unwrap().report.traces.len();
    for i in (0..prompts.min(PROMPTS_SHOWN)).map(Some).chain([None]) {
        h.state_mut().loaded.as_mut().unwrap().select(i);
        h.step();
    }
}

#[test]
fn mutated_reports_open_or_show_their_error() {
    let dir = lcut_testkit::mutant_dir();
    let report = lcut_diag::synthetic::synthetic_report(3, 6, 2, true).unwrap();
    let good = lcut_report::write_report(&report, dir.path(), lcut_report::Format::Json).unwrap();
    let seed = std::fs::read(&good).unwrap();
    let mut h = harness();
    // the seed itself opens and is drawn
    drop_and_wait(&mut h, &good);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    show_every_view(&mut h);
    let (mut opened, mut refused) = (0, 0);
    for (i, mutant) in json_sample(&seed, mutant_count(REPORT_MUTANTS))
        .into_iter()
        .enumerate()
    {
        let name = format!("report-{i}.json");
        let path = dir.path().join(&name);
        std::fs::write(&path, &mutant).unwrap();
        drop_and_wait(&mut h, &path);
        if h.state().error.is_some() {
            assert_error_shown(&h, &name);
            refused += 1;
        } else {
            let source = &h.state().loaded.as_ref().unwrap().source;
            assert_eq!(*source, path.display().to_string(), "mutant {i}");
            assert!(
                h.query_all_by_label_contains(&name).next().is_some(),
                "mutant {i}: its source is not shown"
            );
            show_every_view(&mut h);
            opened += 1;
        }
        std::fs::remove_file(&path).unwrap();
    }
    eprintln!("report.json in the viewer: {opened} opened, {refused} refused with the error shown");
    assert!(refused > 0);
}

/// A copy of the bundled model's folder: config, weights, tokenizer.
fn model_copy(into: &Path) -> PathBuf {
    let bundled = paths::resolve(paths::BUNDLED_MODEL);
    let folder = into.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    for file in MODEL_FILES {
        std::fs::copy(bundled.join(file), folder.join(file)).unwrap();
    }
    folder
}

/// `MODEL_MUTANTS` mutants of the model file `file` (`good` its bytes).
fn model_mutants(file: &str, good: &[u8]) -> Vec<Vec<u8>> {
    if file.ends_with(".safetensors") {
        let cuts = safetensors_boundaries(good).len();
        sample(|| safetensors_mutants(good, SEED), cuts, MODEL_MUTANTS)
    } else {
        json_sample(good, MODEL_MUTANTS)
    }
}

#[test]
fn mutated_model_folders_open_or_show_their_error() {
    let dir = lcut_testkit::mutant_dir();
    let folder = model_copy(dir.path());
    let shown = folder.display().to_string();
    let mut h = harness();
    drop_and_wait(&mut h, &folder);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    for file in MODEL_FILES {
        let path = folder.join(file);
        let good = std::fs::read(&path).unwrap();
        let (mut opened, mut refused) = (0, 0);
        for mutant in model_mutants(file, &good) {
            std::fs::write(&path, &mutant).unwrap();
            h.state_mut().model = None;
            drop_and_wait(&mut h, &folder);
            if h.state().error.is_some() {
                assert_error_shown(&h, &shown);
                refused += 1;
            } else {
                let model = h.state().model.clone().unwrap();
                assert_eq!(model.path, shown);
                let summary = format!("{}: {} layers", model.arch, model.num_layers);
                assert!(
                    h.query_all_by_label_contains(&summary).next().is_some(),
                    "the model's summary is not shown"
                );
                opened += 1;
            }
        }
        std::fs::write(&path, &good).unwrap();
        eprintln!("{file} in the viewer: {opened} opened, {refused} refused with the error shown");
        assert!(refused > 0, "{file}: no mutant was refused");
    }
    // the worker still opens the intact folder
    drop_and_wait(&mut h, &folder);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
}
