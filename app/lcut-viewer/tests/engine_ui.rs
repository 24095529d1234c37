//! The viewer driven through its labels (egui_kittest, headless) with the
//! REAL engine worker: the bundled model when it is there (else a small
//! model folder made from the llama-gqa oracle with a word-level tokenizer),
//! diagnostics with a few new tokens, a cancelled run, live generation and
//! export; GGUF files as models (the llama-gqa oracle's, damaged ones, and
//! the real SmolLM2 model when it has been fetched).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use lcut_viewer_ui::testing::Dropped;
use std::sync::Arc;
use std::time::Duration;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use lcut_model::StoreRoots;
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
    harness_with(f, WorkerConfig::default().store_roots)
}

/// The harness with model names looked up in `store_roots`.
fn harness_with(f: &Fixture, store_roots: StoreRoots) -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    spawn(
        port,
        WorkerConfig {
            bundled_prompts: f.prompts.clone(),
            store_roots,
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
    // SlimInfer as the third policy: one cut at half depth keeping half the
    // prompt in 4-token blocks.
    let slim = format!("slim:{}@50%+block:4+unit:2", (layers / 2).max(1));
    h.state_mut().live.extra_text.clone_from(&slim);
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
    assert_eq!(h.query_all_by_label_contains("TTFT").count(), 3);
    // The SlimInfer column and its run: what its prefill kept, per-step
    // records, and fewer bytes held than the full model.
    let name = live.extra_policy.clone().unwrap();
    assert!(name.starts_with(&slim), "{name}");
    assert_eq!(live.extra_metrics.tokens, live.extra.len());
    assert!(live.extra_metrics.kv_bytes < live.full_metrics.kv_bytes);
    assert!(live.extra_metrics.kv_bytes_resident <= live.extra_metrics.kv_bytes);
    let v = live.slim.as_ref().unwrap();
    assert_eq!(v.cut_layers(), vec![(layers / 2).max(1)]);
    assert!(!v.trace.cuts[0].kept.is_empty() && !v.trace.cuts[0].scores.is_empty());
    assert_eq!(v.prompt_len, live.prompt_len);
    assert!(!v.pruned_runs().is_empty());
    assert!(
        h.query_by_label_contains("Which prompt positions exist")
            .is_some()
    );

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
    h.state_mut().inputs.model_path = "/nonexistent/model-folder".into();
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

/// The model field takes the names of models on disk: a hub cache name and
/// an Ollama name open their models (the field keeps the name), and a name
/// on disk nowhere fails with the resolver's message naming where it looked.
#[test]
fn the_model_field_takes_hub_cache_and_ollama_names() {
    let f = fixture();
    let stores = tempfile::tempdir().unwrap();
    let repo = stores.path().join("hub/models--org--m");
    let snapshot = repo.join("snapshots/abc123");
    std::fs::create_dir_all(&snapshot).unwrap();
    for entry in std::fs::read_dir(&f.model).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_file() {
            std::fs::copy(entry.path(), snapshot.join(entry.file_name())).unwrap();
        }
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc123").unwrap();
    let ollama = stores.path().join("ollama");
    let digest = "ab".repeat(32);
    std::fs::create_dir_all(ollama.join("blobs")).unwrap();
    std::fs::copy(oracle_gguf(), ollama.join(format!("blobs/sha256-{digest}"))).unwrap();
    let manifest = ollama.join("manifests/registry.ollama.ai/library/gqa/f32");
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(
        &manifest,
        format!(
            r#"{{"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{digest}"}}]}}"#
        ),
    )
    .unwrap();
    let mut h = harness_with(&f, StoreRoots::at(stores.path().join("hub"), &ollama));

    open_typed_model(&mut h, Path::new("org/m"));
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    assert_eq!(h.state().model.as_ref().unwrap().path, "org/m");
    assert_eq!(h.state().inputs.model_path, "org/m");
    open_typed_model(&mut h, Path::new("gqa:f32"));
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    assert_eq!(h.state().model.as_ref().unwrap().num_layers, 6);

    open_typed_model(&mut h, Path::new("org/absent"));
    let e = h.state().error.clone().expect("an error");
    for part in ["org/absent", "never downloads", "models--org--absent"] {
        assert!(e.contains(part), "the error does not mention {part:?}: {e}");
    }
    assert!(h.state().model.is_none());
    assert!(h.query_all_by_label_contains("models--org--absent").count() >= 1);
}

/// The llama-gqa oracle as a GGUF file (f32 weights, SentencePiece vocab, no
/// chat template): 6 layers, 4 heads, 2 KV heads.
fn oracle_gguf() -> PathBuf {
    lcut_testkit::oracle_case("llama-gqa").join("model.f32.gguf")
}

/// Types `path` into the model field and presses Open model; steps until
/// the worker answers.
fn open_typed_model(h: &mut Harness<'_, ViewerState>, path: &Path) {
    h.state_mut().inputs.model_path = path.display().to_string();
    h.step();
    h.get_by_label("Open model").click();
    h.step();
    step_until(h, "the model", |s| s.job.is_none());
}

#[test]
fn a_gguf_file_opens_as_a_model_and_runs() {
    let f = fixture();
    let mut h = harness(&f);
    let gguf = oracle_gguf();
    open_typed_model(&mut h, &gguf);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let m = h.state().model.clone().unwrap();
    assert_eq!(m.path, gguf.display().to_string());
    assert_eq!(
        (m.arch.as_str(), m.num_layers, m.num_heads, m.num_kv_heads),
        ("llama", 6, 4, 2)
    );
    assert!(m.has_tokenizer, "the tokenizer comes from the GGUF");
    assert!(!m.has_chat_template);
    assert!(
        h.query_by_label("llama: 6 layers × 4 heads (2 KV)")
            .is_some()
    );
    // Diagnostics on a typed prompt, tokenized by the GGUF's vocabulary.
    h.state_mut().inputs.prompts = PromptChoice::Typed;
    h.state_mut().inputs.typed_prompt = "the quick brown fox jumps over the lazy dog".into();
    h.state_mut().inputs.max_new_tokens = 3;
    h.step();
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.job.is_none() && (s.loaded.is_some() || s.error.is_some())
    });
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let report = h.state().loaded.as_ref().unwrap().report.clone();
    assert_eq!(report.model.num_layers, 6);
    assert_eq!(report.traces.len(), 1);
    let tokens = report.traces[0].prompt_tokens.concat();
    assert!(tokens.contains("fox"), "prompt tokens: {tokens:?}");
    let rec = report.recommendation.l_cut;
    assert!(
        h.query_by_label(&format!("Recommended L_cut: {rec} of 6"))
            .is_some()
    );

    // Dropped on the window, a .gguf loads as a model again (not a report).
    h.state_mut().model = None;
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(gguf.clone())));
    h.step();
    step_until(&mut h, "the dropped model", |s| {
        s.job.is_none() && (s.model.is_some() || s.error.is_some())
    });
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    assert_eq!(h.state().model.as_ref().unwrap().num_layers, 6);
    assert_eq!(h.state().loaded.as_ref().unwrap().report, report);
}

#[test]
fn a_damaged_gguf_is_named_in_the_error() {
    let f = fixture();
    let mut h = harness(&f);
    let dir = tempfile::tempdir().unwrap();
    // Wrong magic.
    let bad = dir.path().join("wrong-magic.gguf");
    let mut bytes = b"NOPE".to_vec();
    bytes.extend_from_slice(&[0u8; 60]);
    std::fs::write(&bad, &bytes).unwrap();
    // The real header, cut short.
    let cut = dir.path().join("truncated.gguf");
    let whole = std::fs::read(oracle_gguf()).unwrap();
    std::fs::write(&cut, &whole[..200]).unwrap();
    // Not there at all.
    let missing = dir.path().join("missing.gguf");
    for (path, name) in [
        (&bad, "wrong-magic.gguf"),
        (&cut, "truncated.gguf"),
        (&missing, "missing.gguf"),
    ] {
        // Dropped: still read as a model, so the error is the model's.
        h.input_mut()
            .dropped_files
            .push(Arc::new(Dropped(path.clone())));
        h.step();
        step_until(&mut h, "the error", |s| s.job.is_none());
        let e = h.state().error.clone().expect("an error");
        assert!(e.contains(name) && e.contains("GGUF file"), "{e}");
        assert!(h.state().model.is_none());
        assert!(h.state().loaded.is_none(), "not read as a report: {e}");
        assert!(h.query_all_by_label_contains(name).count() >= 1);
    }
    // The worker is still there: a good file loads after the bad ones.
    open_typed_model(&mut h, &oracle_gguf());
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    assert_eq!(h.state().model.as_ref().unwrap().num_layers, 6);
}

#[test]
fn the_real_gguf_model_opens_and_generates_text() {
    let Some(model) = lcut_testkit::real_model() else {
        return;
    };
    let f = fixture();
    let mut h = harness(&f);
    open_typed_model(&mut h, &model);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let m = h.state().model.clone().unwrap();
    assert_eq!((m.num_layers, m.num_heads, m.num_kv_heads), (30, 9, 3));
    assert!(m.has_tokenizer && m.has_chat_template);
    assert!(
        h.query_by_label("llama: 30 layers × 9 heads (3 KV)")
            .is_some()
    );
    // Full model and SPEED at L_cut 24, side by side, in English.
    h.state_mut().view.l_cut = 24;
    h.get_by_label("Live").click();
    h.step();
    h.state_mut().live.prompt = "What is the capital of France?".into();
    h.state_mut().live.max_new_tokens = 8;
    h.step();
    h.get_by_label("Generate at L_cut 24").click();
    h.step();
    step_until(&mut h, "the generation", |s| {
        matches!(s.live.status, LiveStatus::Done | LiveStatus::Failed(_))
    });
    let live = &h.state().live;
    assert_eq!(live.status, LiveStatus::Done, "{:?}", h.state().log);
    let text: String = live.full.iter().map(|t| t.text.as_str()).collect();
    assert!(text.contains("Paris"), "full model: {text:?}");
    assert!(live.speed_metrics.kv_bytes < live.full_metrics.kv_bytes);
}

/// The worker's failures come back typed: the kind of work that failed and
/// the message the UI shows.
#[test]
fn worker_failures_carry_their_kind() {
    use lcut_viewer_ui::backend::{Command, Event, PromptSource};
    use lcut_viewer_ui::{FailureKind, JobError};

    let (mut backend, port) = channel(None);
    let worker = spawn(port, WorkerConfig::default()).unwrap();
    let next = |backend: &mut lcut_viewer_ui::Backend| {
        for _ in 0..1000 {
            if let Some(e) = backend.poll().into_iter().find(|e| {
                matches!(
                    e,
                    Event::ModelFailed(_) | Event::DiagnoseFailed(_) | Event::GenerationFailed(_)
                )
            }) {
                return Some(e);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    };
    backend.send(Command::RunDiagnose {
        job: 1,
        prompts: PromptSource::Bundled,
        max_new_tokens: 2,
        use_chat_template: false,
        sweep_context_len: None,
    });
    match next(&mut backend) {
        Some(Event::DiagnoseFailed(e)) => assert_eq!(e, JobError::no_model()),
        other => panic!("expected a typed no-model failure, got {other:?}"),
    }
    let missing = tempfile::tempdir().unwrap().path().join("no-such-model");
    backend.send(Command::OpenModel(missing));
    match next(&mut backend) {
        Some(Event::ModelFailed(e)) => {
            assert_eq!(e.kind, FailureKind::LoadModel);
            assert!(e.to_string().contains("no-such-model"), "{e}");
        }
        other => panic!("expected a typed load failure, got {other:?}"),
    }
    backend.send(Command::Shutdown);
    assert!(worker.join().is_ok());
}

/// With a sweep, the engine worker sends the diagnostics as soon as they
/// exist (no sweep in them), then the sweep's progress, then the sweep at
/// the context length asked for; the model's own context length reaches
/// the UI with the model.
#[test]
fn the_worker_sends_the_diagnostics_before_the_sweep() {
    use lcut_viewer_ui::backend::{Command, Event, PromptSource};

    let f = fixture();
    let (mut backend, port) = channel(None);
    let worker = spawn(
        port,
        WorkerConfig {
            bundled_prompts: f.prompts.clone(),
            ..WorkerConfig::default()
        },
    )
    .unwrap();
    let mut events = Vec::new();
    let mut wait_for = |backend: &mut lcut_viewer_ui::Backend, done: fn(&Event) -> bool| {
        for _ in 0..12_000 {
            let got = backend.poll();
            let end = got.iter().any(done);
            events.extend(got);
            if end {
                return events.clone();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("timed out; events so far: {}", events.len());
    };
    backend.send(Command::OpenModel(f.model.clone()));
    let opened = wait_for(&mut backend, |e| {
        matches!(e, Event::ModelOpened(_) | Event::ModelFailed(_))
    });
    let max_positions = match opened.last() {
        Some(Event::ModelOpened(m)) => m.max_positions,
        other => panic!("{other:?}"),
    };
    let config = lcut_model::ModelConfig::from_folder(&f.model).unwrap();
    assert_eq!(max_positions, config.max_position_embeddings);
    backend.send(Command::RunDiagnose {
        job: 1,
        prompts: PromptSource::Typed("copy this the quick brown fox".into()),
        max_new_tokens: 2,
        use_chat_template: false,
        sweep_context_len: Some(max_positions),
    });
    let all = wait_for(&mut backend, |e| {
        matches!(
            e,
            Event::SweepReady(_) | Event::DiagnoseFailed(_) | Event::ReportReady { .. }
        )
    });
    let run = &all[opened.len()..];
    let ready = run
        .iter()
        .position(|e| matches!(e, Event::DiagnoseReady { report, .. } if report.sweep.is_none()))
        .expect("the diagnostics came on their own");
    let first_sweep_progress = run
        .iter()
        .position(|e| matches!(e, Event::Progress { message, .. } if message.starts_with("sweep")))
        .expect("sweep progress");
    assert!(ready < first_sweep_progress, "the diagnostics came first");
    match run.last() {
        Some(Event::SweepReady(sweep)) => {
            assert_eq!(sweep.context_len, max_positions);
            assert!(!sweep.points.is_empty());
        }
        other => panic!("expected the sweep last, got {other:?}"),
    }
    assert!(!run.iter().any(|e| matches!(e, Event::ReportReady { .. })));
    backend.send(Command::Shutdown);
    assert!(worker.join().is_ok());
}

/// Heads picked in the head view run on the real engine as
/// `speed:C+bos+heads:FILE` beside the full model and SPEED+BoS at equal
/// K/V: one pair per K/V head holds exactly what SPEED one layer deeper
/// holds; a head file made for another model is refused by name.
#[test]
fn picked_heads_run_beside_full_on_the_engine() {
    let f = fixture();
    let mut h = harness(&f);
    open_bundled(&mut h);
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.loaded.is_some() || s.error.is_some()
    });
    let m = h.state().model.clone().unwrap();
    assert_eq!((m.num_heads, m.num_kv_heads), (4, 2), "{m:?}");
    let cut = m.num_layers / 2;
    h.state_mut().view.l_cut = cut;
    let dir = tempfile::tempdir().unwrap();
    h.state_mut().heads.folder = dir.path().display().to_string();
    h.state_mut().live.prompt = "copy this the quick brown fox".into();
    h.state_mut().live.max_new_tokens = 6;
    h.get_by_label("Heads").click();
    h.run_steps(3);
    // K/V head 1 at the cut (query head 2), K/V head 0 at the top (query head 1)
    testing::click_head_cell(&mut h, cut, 2);
    testing::click_head_cell(&mut h, m.num_layers - 1, 1);
    let picks = vec![(cut, 1), (m.num_layers - 1, 0)];
    assert_eq!(h.state().heads.pairs(), picks);
    h.get_by_label("Run beside full").click();
    h.step();
    step_until(&mut h, "the head run", |s| {
        matches!(s.live.status, LiveStatus::Done | LiveStatus::Failed(_))
    });
    let path = dir.path().join(format!("heads-c{cut}-n2.json"));
    let live = &h.state().live;
    assert_eq!(live.status, LiveStatus::Done, "{:?}", h.state().log);
    assert_eq!(
        live.speed_policy,
        format!("speed:{cut}+bos+heads:{}", path.display())
    );
    assert_eq!(
        live.extra_policy.as_deref(),
        Some(format!("speed:{}+bos", cut + 1).as_str())
    );
    assert!(!live.speed.is_empty() && live.speed.len() <= 6);
    assert_eq!(live.speed_metrics.tokens, live.speed.len());
    assert!(live.speed_metrics.ttft_s.is_some());
    assert!(live.speed_metrics.kv_bytes < live.full_metrics.kv_bytes);
    // two kept pairs on a model of two K/V heads hold one layer's prompt
    // K/V: what SPEED+BoS one layer deeper holds, but for the decode tokens
    // of lanes that stopped at different lengths (f32 K/V, every layer and
    // head keeps a decode token)
    let per_token = (2 * m.num_layers * m.num_kv_heads * m.head_dim * 4) as i64;
    assert_eq!(live.full_metrics.kv_bytes as i64 % per_token, 0);
    assert_eq!(
        live.speed_metrics.kv_bytes as i64 - live.extra_metrics.kv_bytes as i64,
        (live.speed.len() as i64 - live.extra.len() as i64) * per_token,
        "{} tokens against {}",
        live.speed.len(),
        live.extra.len()
    );
    let file = lcut_policy::read_head_file(&path.display().to_string()).unwrap();
    assert_eq!(file.heads, picks);

    // the same picks in a head file naming another model: refused by name
    {
        let loaded = h.state_mut().loaded.as_mut().unwrap();
        Arc::make_mut(&mut loaded.report).model.config_hash = "another model".into();
    }
    h.get_by_label("Heads").click();
    h.run_steps(2);
    h.get_by_label("Run beside full").click();
    h.step();
    step_until(&mut h, "the refusal", |s| {
        matches!(s.live.status, LiveStatus::Done | LiveStatus::Failed(_))
    });
    let error = h.state().error.clone().unwrap_or_default();
    assert!(
        error.contains("was made for another model") && error.contains(&path.display().to_string()),
        "{error}"
    );
}

/// A mixture-of-experts model (the Qwen3-MoE reference case's Q8_0 GGUF,
/// tokenizer inside) run in the window with its sweep: the Routing tab
/// appears, with the expert load of every sparse layer and the sweep's
/// routing overlap per cut.
#[test]
fn a_moe_model_run_in_the_window_shows_its_routing() {
    let f = fixture();
    let mut h = harness(&f);
    let gguf = lcut_testkit::oracle_case("moe/qwen3moe-sparse").join("model.q8_0.gguf");
    open_typed_model(&mut h, &gguf);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    assert!(h.query_by_label("Routing").is_none(), "no report yet");
    h.state_mut().inputs.prompts = PromptChoice::Typed;
    h.state_mut().inputs.typed_prompt = "the cat sat on the mat".into();
    h.state_mut().inputs.max_new_tokens = 4;
    h.state_mut().inputs.with_sweep = true;
    h.step();
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report and its sweep", |s| {
        s.job.is_none()
            && (s.error.is_some() || s.loaded.as_ref().is_some_and(|l| l.report.sweep.is_some()))
    });
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let report = h.state().loaded.as_ref().unwrap().report.clone();
    let c = report
        .curves
        .routing
        .clone()
        .expect("a MoE run records routing");
    assert_eq!((c.num_experts, c.top_k, c.sparse_layers.len()), (8, 3, 6));
    let sweep = report.sweep.as_ref().unwrap();
    assert!(sweep.points.iter().all(|p| p.routing_overlap.is_some()));
    h.get_by_label("Routing").click();
    h.run_steps(3);
    assert!(
        h.query_by_label_contains("Expert load, layer × expert")
            .is_some()
    );
    assert!(
        h.query_by_label_contains("Sweep: mean top-k overlap")
            .is_some()
    );
    let cache = &h.state().loaded.as_ref().unwrap().caches.routing_load;
    assert_eq!(cache.texture_size(), Some([8, 6]));
}
