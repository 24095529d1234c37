//! The viewer driven through its labels (egui_kittest, headless) with the
//! REAL engine worker: the bundled model when it is there (else a small
//! model folder made from the llama-gqa oracle with a word-level tokenizer),
//! diagnostics with a few new tokens, a cancelled run, live generation and
//! export.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use lcut_viewer::paths;
use lcut_viewer::worker::{WorkerConfig, spawn};
use lcut_viewer_ui::live::LiveStatus;
use lcut_viewer_ui::state::PromptChoice;
use lcut_viewer_ui::{ViewerState, channel, testing};

/// A model folder with a tokenizer and a chat template, and a prompt set.
struct Fixture {
    _dir: tempfile::TempDir,
    model: PathBuf,
    prompts: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let bundled = paths::resolve(paths::BUNDLED_MODEL);
    let model = if bundled.join("tokenizer.json").is_file() {
        bundled
    } else {
        let m = dir.path().join("model");
        std::fs::create_dir_all(&m).unwrap();
        let words = [
            "copy", "this", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "a",
            "b", "c",
        ];
        lcut_testkit::chat_model("llama-gqa", &m, &words).unwrap();
        m
    };
    let bundled_prompts = paths::resolve(lcut_engine::diagnose::BUNDLED_PROMPTS);
    let prompts = if bundled_prompts.is_file() {
        bundled_prompts
    } else {
        let p = dir.path().join("prompts.jsonl");
        std::fs::write(
            &p,
            "{\"id\": \"fox\", \"prompt\": \"copy this the quick brown fox\"}\n\
             {\"id\": \"dog\", \"prompt\": \"copy this over the lazy dog\", \"system\": \"a b c\"}\n",
        )
        .unwrap();
        p
    };
    Fixture {
        _dir: dir,
        model,
        prompts,
    }
}

fn harness(f: &Fixture) -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    spawn(
        port,
        WorkerConfig {
            bundled_prompts: f.prompts.clone(),
        },
    )
    .unwrap();
    let mut state = ViewerState::new(backend);
    state.inputs.bundled_model = f.model.clone();
    state.inputs.max_new_tokens = 4;
    state.inputs.with_sweep = false;
    testing::harness(state, true)
}

/// Steps until `done` holds, at most two minutes (a debug build on a busy machine).
fn step_until(h: &mut Harness<'_, ViewerState>, what: &str, done: impl Fn(&ViewerState) -> bool) {
    testing::step_until(h, what, Duration::from_secs(120), done);
}

fn open_bundled(h: &mut Harness<'_, ViewerState>) {
    h.get_by_label("Bundled model").click();
    h.step();
    step_until(h, "the model", |s| s.model.is_some() || s.error.is_some());
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
}

#[test]
fn open_the_bundled_model_run_diagnostics_and_see_the_views() {
    let f = fixture();
    let mut h = harness(&f);
    open_bundled(&mut h);
    let layers = h.state().model.as_ref().unwrap().num_layers;
    assert!(
        h.query_all_by_label_contains(&format!("{layers} layers"))
            .count()
            >= 1
    );
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.loaded.is_some() || s.error.is_some()
    });
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let loaded = h.state().loaded.as_ref().unwrap();
    let report = loaded.report.clone();
    assert_eq!(report.model.num_layers, layers);
    assert!(!report.traces.is_empty());
    assert!(
        report
            .traces
            .iter()
            .all(|t| t.num_steps() >= 1 && t.num_steps() <= 4)
    );
    // The heatmaps are drawn from the run.
    for c in [
        &loaded.caches.by_step,
        &loaded.caches.by_position,
        &loaded.caches.by_head,
    ] {
        assert!(c.texture_size().is_some());
    }
    let rec = report.recommendation.l_cut;
    assert!(
        h.query_by_label(&format!("Recommended L_cut: {rec} of {layers}"))
            .is_some()
    );
    h.get_by_label("Curves").click();
    h.step();
    h.get_by_label("Recommendation").click();
    h.step();
    assert!(
        h.query_by_label_contains("Tail mass: smallest cut")
            .is_some()
    );
    // The slider moves the cost panel.
    let kv = |h: &Harness<'_, ViewerState>| {
        h.get_by(|n| {
            n.role() == Role::Label
                && n.value()
                    .is_some_and(|v| v.starts_with("KV bytes (SPEED):"))
        })
        .accesskit_node()
        .value()
        .unwrap()
    };
    let before = kv(&h);
    let other = if rec == 1 { layers } else { 1 };
    h.get_by_role_and_label(Role::Slider, "L_cut")
        .set_value_accesskit(other as f64);
    h.run_steps(2);
    assert_ne!(before, kv(&h));
}

#[test]
fn a_started_run_can_be_cancelled() {
    let f = fixture();
    let mut h = harness(&f);
    open_bundled(&mut h);
    h.state_mut().inputs.max_new_tokens = 200;
    h.state_mut().inputs.prompts = PromptChoice::Typed;
    h.state_mut().inputs.typed_prompt =
        "copy this the quick brown fox jumps over the lazy dog".into();
    h.step();
    h.get_by_label("Run diagnostics").click();
    h.step();
    assert!(h.state().job.is_some());
    h.get_by_label("Cancel").click();
    h.step();
    step_until(&mut h, "the cancel", |s| s.job.is_none());
    assert!(
        h.state().loaded.is_none(),
        "the run was cancelled, no report"
    );
    assert_eq!(h.state().log.last().map(String::as_str), Some("cancelled"));
    // The worker is free again: a short run completes.
    h.state_mut().inputs.max_new_tokens = 3;
    h.step();
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.loaded.is_some() || s.error.is_some()
    });
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
}

#[test]
fn live_generation_side_by_side_and_export() {
    let f = fixture();
    let mut h = harness(&f);
    open_bundled(&mut h);
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.loaded.is_some() || s.error.is_some()
    });
    let layers = h.state().model.as_ref().unwrap().num_layers;
    h.state_mut().view.l_cut = (layers / 2).max(1);
    h.get_by_label("Live").click();
    h.step();
    h.state_mut().live.max_new_tokens = 6;
    h.state_mut().live.prompt = "copy this the quick brown fox".into();
    h.step();
    let l_cut = h.state().view.l_cut;
    h.get_by_label(&format!("Generate at L_cut {l_cut}"))
        .click();
    h.step();
    step_until(&mut h, "the generation", |s| {
        matches!(s.live.status, LiveStatus::Done | LiveStatus::Failed(_))
    });
    let live = &h.state().live;
    assert_eq!(live.status, LiveStatus::Done, "{:?}", h.state().log);
    assert!(!live.full.is_empty() && live.full.len() <= 6);
    assert_eq!(live.full_metrics.tokens, live.full.len());
    assert!(live.full_metrics.ttft_s.is_some() && live.speed_metrics.ttft_s.is_some());
    assert!(live.speed_metrics.kv_bytes < live.full_metrics.kv_bytes);
    assert_eq!(live.speed_policy, format!("speed:{l_cut}+bos"));
    assert_eq!(h.query_all_by_label_contains("TTFT").count(), 2);

    // A long generation, cancelled.
    h.state_mut().live.max_new_tokens = 200;
    h.step();
    h.get_by_label(&format!("Generate at L_cut {l_cut}"))
        .click();
    h.step();
    h.get_by_label("Cancel generation").click();
    h.step();
    step_until(&mut h, "the cancel", |s| s.job.is_none());
    assert!(matches!(
        h.state().live.status,
        LiveStatus::Cancelled | LiveStatus::Done
    ));

    // Export the run in every format.
    let out = tempfile::tempdir().unwrap();
    for format in lcut_report::Format::ALL {
        h.state_mut().export.dir = out.path().display().to_string();
        h.state_mut().export.format = format;
        h.step();
        h.get_by_label("Export").click();
        h.step();
        step_until(&mut h, "the export", |s| s.job.is_none());
        let path = out.path().join(format!("report.{format}"));
        assert!(path.is_file(), "{}", path.display());
    }
    let back = lcut_trace::read_report_json(&out.path().join("report.json")).unwrap();
    assert_eq!(*h.state().loaded.as_ref().unwrap().report, back);
}

#[test]
fn a_missing_model_folder_is_named_in_the_error() {
    let f = fixture();
    let mut h = harness(&f);
    h.state_mut().inputs.model_dir = "/nonexistent/model-folder".into();
    h.step();
    h.get_by_label("Open model").click();
    h.step();
    step_until(&mut h, "the error", |s| s.error.is_some());
    let e = h.state().error.clone().unwrap();
    assert!(e.contains("/nonexistent/model-folder"), "{e}");
    assert!(
        h.query_all_by_label_contains("/nonexistent/model-folder")
            .count()
            >= 1
    );
}
