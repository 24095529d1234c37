//! The viewer driven through its labels with egui_kittest (headless, no GPU),
//! against the fake worker: open a model, run diagnostics, move the L_cut
//! slider and watch the cost panel, cancel, export, toggle the colour scale,
//! drop a report or a `.gguf` model, pick a `.gguf` in the file dialog,
//! generate live.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use lcut_viewer_ui::testing::Dropped;
use std::sync::Arc;
use std::time::Duration;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use lcut_viewer_ui::colormap::ColorScale;
use lcut_viewer_ui::fake::{self, FakeOptions};
use lcut_viewer_ui::files::{DialogPurpose, dialog_start, is_gguf_path, is_model_path};
use lcut_viewer_ui::live::LiveStatus;
use lcut_viewer_ui::{Tab, ViewerState, channel, testing};

fn harness(o: FakeOptions) -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    fake::spawn(port, o);
    testing::harness(ViewerState::new(backend), false)
}

/// Steps until `done` holds (the worker runs on its own thread), at most 20 s.
fn step_until(h: &mut Harness<'_, ViewerState>, what: &str, done: impl Fn(&ViewerState) -> bool) {
    testing::step_until(h, what, Duration::from_secs(20), done);
}

/// The text of the one label that starts with `prefix` (labels keep their
/// text in the AccessKit value).
fn label_starting(h: &Harness<'_, ViewerState>, prefix: &str) -> String {
    let node =
        h.get_by(|n| n.role() == Role::Label && n.value().is_some_and(|v| v.starts_with(prefix)));
    node.accesskit_node().value().unwrap_or_default()
}

fn open_model_and_run(h: &mut Harness<'_, ViewerState>) {
    h.get_by_label("Bundled model").click();
    h.step();
    step_until(h, "the model", |s| s.model.is_some());
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(h, "the report", |s| s.loaded.is_some() && s.job.is_none());
}

#[test]
fn open_bundled_model_and_run_diagnostics() {
    let mut h = harness(FakeOptions::default());
    assert!(h.query_by_label("No report open").is_some());
    open_model_and_run(&mut h);
    assert!(h.query_by_label("No report open").is_none());
    let rec = h
        .state()
        .loaded
        .as_ref()
        .unwrap()
        .report
        .recommendation
        .l_cut;
    assert!(
        h.query_by_label(&format!("Recommended L_cut: {rec} of 16"))
            .is_some()
    );
    // Every heatmap of the default view drew a texture.
    let caches = &h.state().loaded.as_ref().unwrap().caches;
    for c in [
        &caches.by_step,
        &caches.by_position,
        &caches.by_head,
        &caches.bos,
    ] {
        assert!(c.rebuilds >= 1 && c.texture_size().is_some());
    }
    // The other views open and show their content.
    h.get_by_label("Recommendation").click();
    h.step();
    assert!(
        h.query_by_label_contains("Tail mass: smallest cut")
            .is_some()
    );
    h.get_by_label("Sweep").click();
    h.step();
    assert!(h.query_by_label_contains("Quality vs cost").is_some());
    h.get_by_label("Curves").click();
    h.step();
    assert_eq!(h.state().view.tab, Tab::Curves);
    assert!(
        h.query_by_label_contains("Drag or click in a plot")
            .is_some()
    );
}

#[test]
fn moving_the_l_cut_slider_changes_the_cost_panel() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    let before_kv = label_starting(&h, "KV bytes (SPEED):");
    let before_ratio = label_starting(&h, "KV ratio:");
    let before_flops = label_starting(&h, "Prefill FLOPs (SPEED):");
    let full = label_starting(&h, "KV bytes (full):");
    let l0 = h.state().view.l_cut;
    let target = if l0 > 4 { 2 } else { 12 };
    h.get_by_role_and_label(Role::Slider, "L_cut")
        .set_value_accesskit(target as f64);
    h.step();
    h.step();
    assert_eq!(h.state().view.l_cut, target);
    let after_kv = label_starting(&h, "KV bytes (SPEED):");
    assert_ne!(before_kv, after_kv);
    assert_ne!(before_ratio, label_starting(&h, "KV ratio:"));
    assert_ne!(before_flops, label_starting(&h, "Prefill FLOPs (SPEED):"));
    // The full model's cost does not depend on the cut.
    assert_eq!(full, label_starting(&h, "KV bytes (full):"));
    // The slider at the top: SPEED costs what the full model costs.
    h.get_by_role_and_label(Role::Slider, "L_cut")
        .set_value_accesskit(16.0);
    h.step();
    h.step();
    assert_eq!(label_starting(&h, "KV ratio:"), "KV ratio: 1.0000");
    // Back to the recommendation with its button.
    h.get_by_label("Use recommended L_cut").click();
    h.step();
    assert_eq!(h.state().view.l_cut, l0);
}

#[test]
fn clicking_and_dragging_in_the_curves_moves_the_chosen_cut() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    h.get_by_label("Curves").click();
    h.run_steps(2);
    let hint = h.get_by_label_contains("Drag or click in a plot").rect();
    // Inside the first plot, below its legend (top right).
    let y = hint.bottom() + 100.0;
    // The plots span the central panel, which ends where the cutoff panel
    // begins. Far right of the first plot: the deepest cut.
    let panel_left = h.get_by_label("Cutoff").rect().left();
    let plot_right = egui::pos2(panel_left - 40.0, y);
    h.hover_at(plot_right);
    h.drag_at(plot_right);
    h.step();
    h.drop_at(plot_right);
    h.step();
    assert_eq!(h.state().view.l_cut, 16, "a click at the right end picks L");
    // Drag from there to the left end: the cut follows down to 1.
    let left = egui::pos2(hint.left() + 70.0, y);
    h.hover_at(plot_right);
    h.drag_at(plot_right);
    h.step();
    let mut seen = Vec::new();
    for i in 1..=10 {
        let t = i as f32 / 10.0;
        h.hover_at(plot_right + (left - plot_right) * t);
        h.step();
        seen.push(h.state().view.l_cut);
    }
    h.drop_at(left);
    h.step();
    assert_eq!(h.state().view.l_cut, 1, "dragged to the left end: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] >= w[1]), "monotone: {seen:?}");
    assert!(
        seen.iter().any(|&c| c > 1 && c < 16),
        "passes through: {seen:?}"
    );
    // The cost panel follows.
    assert_eq!(
        label_starting(&h, "SPEED at L_cut"),
        "SPEED at L_cut 1 of 16:"
    );
}

#[test]
fn cancel_stops_a_diagnostic_run() {
    let mut h = harness(FakeOptions {
        diagnose_steps: 10_000,
        step_delay: Duration::from_millis(10),
        ..FakeOptions::default()
    });
    h.get_by_label("Bundled model").click();
    h.step();
    step_until(&mut h, "the model", |s| s.model.is_some());
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "progress", |s| {
        s.job.as_ref().is_some_and(|j| j.done > 0)
    });
    // While it runs: a progress bar, Run disabled, Cancel offered.
    assert!(h.query_by_role(Role::ProgressIndicator).is_some());
    assert!(
        h.get_by_label("Run diagnostics")
            .accesskit_node()
            .is_disabled()
    );
    h.get_by_label("Cancel").click();
    h.step();
    step_until(&mut h, "the cancel", |s| s.job.is_none());
    assert!(h.state().loaded.is_none());
    assert_eq!(h.state().log.last().map(String::as_str), Some("cancelled"));
    assert!(h.query_by_label("Cancel").is_none());
    assert!(
        !h.get_by_label("Run diagnostics")
            .accesskit_node()
            .is_disabled()
    );
}

#[test]
fn export_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    h.state_mut().export.dir = out.display().to_string();
    for (format, ext) in [("md", "md"), ("html", "html")] {
        h.get_by_role_and_label(Role::ComboBox, "Export as").click();
        h.run_steps(3);
        h.get_by_label(format).click();
        h.step();
        h.get_by_label("Export").click();
        h.step();
        step_until(&mut h, "the export", |s| {
            s.job.is_none()
                && s.export
                    .last
                    .as_ref()
                    .is_some_and(|p| p.extension().is_some_and(|e| e == ext))
        });
        let path = out.join(format!("report.{ext}"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("L_cut"), "{}", path.display());
    }
    assert!(h.query_by_label_contains("wrote ").is_some());
}

#[test]
fn colour_scale_toggles_between_log_and_linear() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    assert_eq!(h.state().view.scale, ColorScale::Log);
    let rebuilds = h.state().loaded.as_ref().unwrap().caches.by_step.rebuilds;
    h.get_by_label("Linear").click();
    h.step();
    h.step();
    assert_eq!(h.state().view.scale, ColorScale::Linear);
    assert!(
        h.query_all_by_label_contains("prefill mass (linear)")
            .count()
            > 0
    );
    let after = h.state().loaded.as_ref().unwrap().caches.by_step.rebuilds;
    assert!(after > rebuilds, "the texture is recoloured");
    h.get_by_label("Log").click();
    h.step();
    assert_eq!(h.state().view.scale, ColorScale::Log);
    assert!(h.query_all_by_label_contains("prefill mass (log)").count() > 0);
}

#[test]
fn a_dropped_report_opens() {
    let dir = tempfile::tempdir().unwrap();
    let report = lcut_diag::synthetic::synthetic_report(3, 6, 2, false).unwrap();
    let path = lcut_report::write_report(&report, dir.path(), lcut_report::Format::Json).unwrap();
    let mut h = harness(FakeOptions::default());
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(path.clone())));
    h.step();
    step_until(&mut h, "the dropped report", |s| s.loaded.is_some());
    let loaded = h.state().loaded.as_ref().unwrap();
    assert_eq!(loaded.report.model.num_layers, 6);
    assert_eq!(loaded.source, path.display().to_string());
    // A bad file gives a message that names it, not a crash.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, b"{}").unwrap();
    h.input_mut().dropped_files.push(Arc::new(Dropped(bad)));
    h.step();
    step_until(&mut h, "the error", |s| s.error.is_some());
    assert!(h.state().error.as_ref().unwrap().contains("bad.json"));
    assert_eq!(
        h.state().loaded.as_ref().unwrap().report.model.num_layers,
        6
    );
}

#[test]
fn live_generation_streams_and_cancels() {
    let mut h = harness(FakeOptions {
        step_delay: Duration::from_millis(20),
        ..FakeOptions::default()
    });
    open_model_and_run(&mut h);
    h.get_by_label("Live").click();
    h.step();
    h.state_mut().live.max_new_tokens = 8;
    h.step();
    let l_cut = h.state().view.l_cut;
    h.get_by_label(&format!("Generate at L_cut {l_cut}"))
        .click();
    h.step();
    step_until(&mut h, "the generation", |s| {
        s.live.status == LiveStatus::Done
    });
    let live = &h.state().live;
    assert_eq!(live.full.len(), 8);
    assert_eq!(live.speed.len(), 8);
    assert_eq!(live.first_divergence(), Some(3));
    assert!(live.speed_metrics.kv_bytes < live.full_metrics.kv_bytes);
    assert!(
        h.query_by_label_contains("prompt tokens, agreement 88%")
            .is_some()
    );
    // Full, SPEED and the default SlimInfer policy.
    assert_eq!(h.query_all_by_label_contains("TTFT").count(), 3);

    // A long one, cancelled while tokens stream.
    h.state_mut().live.max_new_tokens = 4000;
    h.step();
    h.get_by_label(&format!("Generate at L_cut {l_cut}"))
        .click();
    h.step();
    step_until(&mut h, "tokens", |s| s.live.full.len() >= 2);
    h.get_by_label("Cancel generation").click();
    h.step();
    step_until(&mut h, "the cancel", |s| s.job.is_none());
    assert_eq!(h.state().live.status, LiveStatus::Cancelled);
    assert!(h.state().live.full.len() < 4000);
}

#[test]
fn a_dropped_gguf_file_opens_as_a_model() {
    let dir = tempfile::tempdir().unwrap();
    // The fake worker does not read it: the name alone makes it a model.
    let gguf = dir.path().join("tiny.Q4_1.GGUF");
    std::fs::write(&gguf, b"GGUF").unwrap();
    let mut h = harness(FakeOptions::default());
    assert!(h.query_by_label("Model (folder, .gguf or name):").is_some());
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(gguf.clone())));
    h.step();
    step_until(&mut h, "the dropped model", |s| {
        s.model.is_some() || s.error.is_some()
    });
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    assert!(
        h.state().loaded.is_none(),
        "opened as a model, not a report"
    );
    let shown = gguf.display().to_string();
    assert_eq!(h.state().model.as_ref().unwrap().path, shown);
    assert_eq!(h.state().inputs.model_path, shown);
    assert!(h.query_by_label_contains("llama: 16 layers").is_some());
    // Run diagnostics on it: the model is usable.
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.loaded.is_some() && s.job.is_none()
    });

    // A dropped model folder opens as a model too, a run folder as a report.
    let folder = dir.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("config.json"), b"{}").unwrap();
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(folder.clone())));
    h.step();
    step_until(&mut h, "the dropped folder", |s| {
        s.job.is_none() && s.model.as_ref().is_some_and(|m| m.path.ends_with("model"))
    });
    assert_eq!(h.state().inputs.model_path, folder.display().to_string());
}

#[test]
fn the_gguf_picker_lists_gguf_files_and_opens_one() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("small.gguf");
    std::fs::write(&gguf, b"GGUF").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not a model").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let mut h = harness(FakeOptions::default());
    // The typed path is a file: the dialog starts in its folder.
    h.state_mut().inputs.model_path = dir.path().join("other.gguf").display().to_string();
    h.step();
    h.get_by_label("Browse .gguf…").click();
    h.run_steps(3);
    let purpose = h.state().dialog.as_ref().map(|d| d.purpose);
    assert_eq!(purpose, Some(DialogPurpose::ModelFile));
    assert!(h.query_by_label_contains("small.gguf").is_some());
    assert!(
        h.query_by_label_contains("sub").is_some(),
        "folders to browse"
    );
    assert!(h.query_by_label_contains("notes.txt").is_none());
    h.get_by_label_contains("small.gguf").click();
    h.run_steps(2);
    h.get_by_label("Open").click();
    h.run_steps(2);
    step_until(&mut h, "the picked model", |s| {
        s.model.is_some() && s.job.is_none()
    });
    assert!(h.state().dialog.is_none());
    assert_eq!(
        h.state().model.as_ref().unwrap().path,
        gguf.display().to_string()
    );
}

#[test]
fn model_paths_are_folders_or_gguf_files() {
    let dir = tempfile::tempdir().unwrap();
    assert!(is_gguf_path(Path::new("m.gguf")));
    assert!(is_gguf_path(Path::new("a/b/M.Q8_0.GGUF")));
    assert!(!is_gguf_path(Path::new("m.gguf.json")));
    assert!(!is_gguf_path(Path::new("gguf")));
    // A missing .gguf is still a model path, so loading it names the file.
    assert!(is_model_path(&dir.path().join("missing.gguf")));
    assert!(!is_model_path(dir.path()), "a folder without config.json");
    std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
    assert!(is_model_path(dir.path()));
    assert!(!is_model_path(&dir.path().join("config.json")));
    // Dialogs start in the folder of a typed file, or in a typed folder.
    let f = dir.path().join("x.gguf");
    assert_eq!(
        dialog_start(&f.display().to_string()),
        Some(dir.path().into())
    );
    assert_eq!(
        dialog_start(&dir.path().display().to_string()),
        Some(dir.path().into())
    );
    assert_eq!(dialog_start(""), None);
    assert_eq!(dialog_start("model.gguf"), None);
}

#[test]
fn a_newline_in_live_text_shows_as_an_escape_and_breaks_the_line() {
    use lcut_viewer_ui::backend::{LiveStep, LiveToken};
    use lcut_viewer_ui::live::{LiveState, show_live};
    let mut live = LiveState::default();
    live.begin(2);
    let tok = |id: u32, text: &str| {
        Some(LiveToken {
            id,
            text: text.into(),
        })
    };
    let step = |full, speed, agree| LiveStep {
        full,
        speed,
        agree,
        ..LiveStep::default()
    };
    live.step(step(tok(1, "Dear"), tok(1, "Dear"), true));
    live.step(step(tok(2, " Sam,\n"), tok(3, " Kim,\n"), false));
    live.step(step(tok(4, "Thanks"), tok(4, "Thanks"), true));
    let mut h = Harness::builder().with_size([900.0, 400.0]).build_ui_state(
        |ui, live: &mut LiveState| {
            let mut l_cut = 2;
            show_live(ui, live, &mut l_cut, 4, true, "");
        },
        live,
    );
    h.run();
    for text in [" Sam,\\n", " Kim,\\n"] {
        assert_eq!(h.query_all_by_label(text).count(), 1, "{text}");
    }
    assert_eq!(h.query_all_by_label("Thanks").count(), 2);
    // The token after the newline starts a new line, below "Dear".
    let dear = h.query_all_by_label("Dear").next().unwrap().rect();
    let thanks = h.query_all_by_label("Thanks").next().unwrap().rect();
    assert!(thanks.top() >= dear.bottom(), "{dear:?} {thanks:?}");
    assert!(thanks.left() <= dear.left() + 1.0, "{dear:?} {thanks:?}");
}

#[test]
fn diagnostics_show_while_the_sweep_still_runs() {
    let mut h = harness(FakeOptions {
        sweep_steps: 1_000_000,
        step_delay: Duration::from_millis(5),
        ..FakeOptions::default()
    });
    h.get_by_label("Bundled model").click();
    h.step();
    step_until(&mut h, "the model", |s| s.model.is_some());
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the diagnostics", |s| s.loaded.is_some());
    h.run_steps(2);
    // The run goes on (its sweep), and its diagnostics are on screen.
    let job = h.state().job.clone().expect("the run is still going");
    assert_eq!(job.kind, lcut_viewer_ui::state::JobKind::Diagnose);
    assert!(h.query_by_label("No report open").is_none());
    let loaded = h.state().loaded.as_ref().unwrap();
    assert!(loaded.report.sweep.is_none() && loaded.sweep_pending);
    let rec = loaded.report.recommendation.l_cut;
    assert!(
        h.query_by_label(&format!("Recommended L_cut: {rec} of 16"))
            .is_some()
    );
    let caches = &h.state().loaded.as_ref().unwrap().caches;
    for c in [&caches.by_step, &caches.by_position, &caches.by_head] {
        assert!(c.rebuilds >= 1 && c.texture_size().is_some());
    }
    h.get_by_label("Curves").click();
    h.step();
    assert!(
        h.query_by_label_contains("Drag or click in a plot")
            .is_some()
    );
    // The sweep view says it is being measured, with the run's progress.
    h.get_by_label("Sweep").click();
    h.step();
    assert!(h.query_by_label_contains("Sweep running").is_some());
    step_until(&mut h, "sweep progress", |s| {
        s.job
            .as_ref()
            .is_some_and(|j| j.message.starts_with("sweep"))
    });
    // one bar in the status line, one in the sweep view
    assert_eq!(h.query_all_by_role(Role::ProgressIndicator).count(), 2);
    assert!(h.state().job.is_some(), "the sweep is still running");
    // Cancelled, the diagnostics stay and the sweep view says there is none.
    h.get_by_label("Cancel").click();
    h.step();
    step_until(&mut h, "the cancel", |s| s.job.is_none());
    let loaded = h.state().loaded.as_ref().unwrap();
    assert!(loaded.report.sweep.is_none() && !loaded.sweep_pending);
    assert!(
        h.query_by_label_contains("No sweep in this report")
            .is_some()
    );
}

#[test]
fn a_finished_sweep_joins_the_report_on_display() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    let loaded = h.state().loaded.as_ref().unwrap();
    assert!(!loaded.sweep_pending);
    assert!(
        loaded.report.sweep.is_some(),
        "the sweep came after the report"
    );
    assert!(
        h.state()
            .log
            .iter()
            .any(|l| l.contains("diagnostics ready; the sweep is running")),
        "{:?}",
        h.state().log
    );
}

/// The value of the slider labelled `label`.
fn slider_value(h: &Harness<'_, ViewerState>, label: &str) -> f64 {
    h.get_by_role_and_label(Role::Slider, label)
        .accesskit_node()
        .numeric_value()
        .unwrap()
}

#[test]
fn the_live_l_cut_control_shows_the_cut_of_the_run_on_screen() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    let rec = h.state().view.l_cut;
    let cut = if rec == 5 { 6 } else { 5 };
    h.get_by_label("Live").click();
    h.step();
    h.state_mut().live.max_new_tokens = 4;
    // Before any live run the control starts from the report's chosen cut.
    assert_eq!(slider_value(&h, "SPEED L_cut"), rec as f64);
    h.get_by_role_and_label(Role::Slider, "SPEED L_cut")
        .set_value_accesskit(cut as f64);
    h.run_steps(2);
    h.get_by_label(&format!("Generate at L_cut {cut}")).click();
    h.step();
    step_until(&mut h, "the generation", |s| {
        s.live.status == LiveStatus::Done
    });
    assert!(
        h.query_by_label(&format!("SPEED (speed:{cut}+bos)"))
            .is_some()
    );
    // A new report (its recommendation) and a cut picked in the report's
    // views leave the control at the cut of the outputs on screen.
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| s.job.is_none());
    assert_eq!(h.state().view.l_cut, rec);
    h.get_by_role_and_label(Role::Slider, "L_cut")
        .set_value_accesskit(2.0);
    h.run_steps(2);
    assert_eq!(h.state().view.l_cut, 2);
    assert_eq!(slider_value(&h, "SPEED L_cut"), cut as f64);
    assert!(
        h.query_by_label(&format!("Generate at L_cut {cut}"))
            .is_some()
    );
    assert!(
        h.query_by_label(&format!("SPEED (speed:{cut}+bos)"))
            .is_some()
    );
}

#[test]
fn the_cost_panel_starts_from_the_models_context_length() {
    let mut h = harness(FakeOptions {
        max_positions: 4096,
        ..FakeOptions::default()
    });
    open_model_and_run(&mut h);
    assert_eq!(h.state().cost.context_len, 4096);
    let context = |h: &Harness<'_, ViewerState>| {
        h.get_by_label("Context length")
            .accesskit_node()
            .numeric_value()
            .unwrap()
    };
    assert_eq!(context(&h), 4096.0);
    let model = h.state().loaded.as_ref().unwrap().report.model.clone();
    let kv_full = |len: usize| {
        let settings = lcut_viewer_ui::settings::CostSettings {
            context_len: len,
            ..lcut_viewer_ui::settings::CostSettings::default()
        };
        let c = lcut_viewer_ui::cost_panel::cost_numbers(&model, 16, &settings);
        format!(
            "KV bytes (full): {}",
            lcut_viewer_ui::theme::human_bytes(c.kv_full)
        )
    };
    assert_eq!(label_starting(&h, "KV bytes (full):"), kv_full(4096));
    // The numbers are computed when an input changes, not on every frame
    // (the prefill FLOPs walk every position of a 128K context).
    let computed = lcut_viewer_ui::cost_panel::cost_computations();
    h.run_steps(5);
    assert_eq!(lcut_viewer_ui::cost_panel::cost_computations(), computed);
    // The control goes no further than the model takes.
    h.get_by_label("Context length")
        .set_value_accesskit(1_000_000.0);
    h.run_steps(2);
    assert_eq!(h.state().cost.context_len, 4096);
    h.get_by_label("Context length").set_value_accesskit(1024.0);
    h.run_steps(2);
    assert_eq!(h.state().cost.context_len, 1024);
    assert_eq!(label_starting(&h, "KV bytes (full):"), kv_full(1024));
    assert!(lcut_viewer_ui::cost_panel::cost_computations() > computed);
}

/// The curves tab draws the logit lens beside the masses: a plot of the
/// lens's probability, top-1 share and formed share, and one of its KL and
/// rank, each with the cut lines and the formation layer; a report without
/// the lens says so and draws neither.
#[test]
fn the_curves_show_where_the_answer_forms() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    h.get_by_label("Curves").click();
    h.run_steps(2);
    let curves = h.state().loaded.as_ref().unwrap().curves.clone();
    let f = curves.formation().expect("the synthetic run has a lens");
    let line = label_starting(&h, "Logit lens:");
    assert!(
        line.contains(&format!(
            "layer boundary {} of {}",
            f.median, curves.num_layers
        )),
        "{line}"
    );
    for legend in [
        "lens: P(token)",
        "lens: answer formed",
        "lens: KL(final || lens)",
    ] {
        assert!(
            h.query_by_label(legend).is_some(),
            "no legend entry {legend:?}"
        );
    }
    let loaded = h.state_mut().loaded.as_mut().unwrap();
    for s in [
        &mut loaded.curves.lens_prob,
        &mut loaded.curves.lens_top1,
        &mut loaded.curves.lens_formed,
        &mut loaded.curves.lens_kl,
        &mut loaded.curves.lens_log_rank,
    ] {
        s.0.clear();
    }
    h.run_steps(2);
    assert!(h.query_by_label("No logit lens in this report.").is_some());
    assert!(h.query_by_label("lens: P(token)").is_none());
    assert!(
        h.query_by_label("prefill (prompt)").is_some(),
        "the masses stay"
    );
}

/// With a knockout curve the curves tab draws it (KL and top-1 agreement,
/// with the cut lines) and names the band where the prompt matters most;
/// a report without one draws neither and the other curves stay.
#[test]
fn the_curves_show_where_the_prompt_matters_only_with_a_knockout() {
    let mut h = harness(FakeOptions::default());
    open_model_and_run(&mut h);
    h.get_by_label("Curves").click();
    h.run_steps(2);
    let curves = h.state().loaded.as_ref().unwrap().curves.clone();
    let (a, kl) = curves.most_causal(1)[0];
    let kl_legend = "knockout: KL(full || knocked out)";
    for legend in [kl_legend, "knockout: top-1 agreement"] {
        assert!(h.query_by_label(legend).is_some(), "no legend {legend:?}");
    }
    let line = label_starting(&h, "Prompt knockout:");
    assert!(
        line.contains(&format!("starting at layer {a} (KL {kl:.3}")),
        "{line}"
    );
    let loaded = h.state_mut().loaded.as_mut().unwrap();
    loaded.curves.knockout_kl.0.clear();
    loaded.curves.knockout_top1.0.clear();
    h.run_steps(2);
    assert!(h.query_by_label(kl_legend).is_none());
    assert!(h.query_by_label("knockout: top-1 agreement").is_none());
    assert!(
        h.query_by(|n| n.value().is_some_and(|v| v.starts_with("Prompt knockout:")))
            .is_none()
    );
    assert!(h.query_by_label("prefill (prompt)").is_some());
}

/// On a model whose layers slide (five in six, as Gemma 3), the cost panel
/// counts each sliding layer at the window it holds, so its K/V figures
/// are the windowed ones and SPEED's saving is the global layers' share.
#[test]
fn the_cost_panel_counts_a_sliding_layer_at_its_window() {
    let mut h = harness(FakeOptions {
        max_positions: 4096,
        ..FakeOptions::default()
    });
    open_model_and_run(&mut h);
    let blind_full = label_starting(&h, "KV bytes (full):");
    let blind_ratio = label_starting(&h, "KV ratio:");
    let window = 64;
    let layers = h.state().loaded.as_ref().unwrap().report.model.num_layers;
    let windows: Vec<Option<usize>> = (0..layers)
        .map(|l| (l % 6 != 5).then_some(window))
        .collect();
    let loaded = h.state_mut().loaded.as_mut().unwrap();
    std::sync::Arc::make_mut(&mut loaded.report)
        .model
        .sliding_window = windows.clone();
    h.run_steps(2);
    let model = h.state().loaded.as_ref().unwrap().report.model.clone();
    let s = h.state().cost;
    // by hand: the cost panel counts the prompt and the new tokens; a
    // sliding layer holds the last window - 1 of them, a global one all
    let tokens = s.context_len + s.new_tokens;
    let rows: usize = windows
        .iter()
        .map(|w| w.map_or(tokens, |w| (w - 1).min(tokens)))
        .sum();
    let row = 2 * model.num_kv_heads * model.head_dim * s.dtype_bytes;
    let full = format!(
        "KV bytes (full): {}",
        lcut_viewer_ui::theme::human_bytes((rows * row) as u64)
    );
    assert_eq!(label_starting(&h, "KV bytes (full):"), full);
    assert_ne!(full, blind_full);
    assert_ne!(label_starting(&h, "KV ratio:"), blind_ratio);
}
