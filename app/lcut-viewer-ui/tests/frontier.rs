//! The frontier view, driven headless (egui_kittest): `lcut eval --json`
//! results dropped on the window draw accuracy against K/V held, one line
//! per family, with each point in the table; a result of another suite,
//! or the ratio axis without a leaderboard run, is an error in words that
//! leaves the view as it was.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use lcut_viewer_ui::fake::{self, FakeOptions};
use lcut_viewer_ui::testing::Dropped;
use lcut_viewer_ui::{Tab, ViewerState, channel, testing};

fn harness() -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    fake::spawn(port, FakeOptions::default());
    testing::harness(ViewerState::new(backend), false)
}

/// An `lcut eval --json` result's summary: the fields the frontier reads.
fn result(dir: &Path, name: &str, policy: &str, suite: &str, acc: f64, kv: f64) -> PathBuf {
    let text = format!(
        r#"{{"model":"m.gguf","suite":"{suite}","suite_items":10,"policy":"{policy}","items":[],
        "scores":[{{"group":"all","n":10,"correct":0,"accuracy":{acc},"ci95":[{lo},{hi}],
        "full_correct":8,"kept_of_full":{kept},"top1_agreement":0.9,"mean_kl":0.1,
        "kv_ratio":{kv},"kv_bytes_held":1.0,"kv_bytes_full":1.0}}]}}"#,
        lo = acc - 0.1,
        hi = acc + 0.1,
        kept = (acc * 10.0) as usize,
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn drop_files(h: &mut Harness<'_, ViewerState>, files: &[PathBuf]) {
    for f in files {
        h.input_mut()
            .dropped_files
            .push(Arc::new(Dropped(f.clone())));
    }
    h.run_steps(3);
}

#[test]
fn dropped_eval_results_draw_one_line_per_family_with_their_points() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness();
    h.get_by_label("Frontier").click();
    h.run_steps(2);
    assert_eq!(h.state().view.tab, Tab::Frontier);
    assert!(h.query_by_label_contains("No results open").is_some());

    let files = [
        result(dir.path(), "full.json", "full", "s.jsonl", 0.8, 1.0),
        result(
            dir.path(),
            "s24.json",
            "speed:24+bos",
            "s.jsonl",
            0.7,
            0.811,
        ),
        result(
            dir.path(),
            "s22.json",
            "speed:22+bos",
            "s.jsonl",
            0.1,
            0.748,
        ),
        result(
            dir.path(),
            "h.json",
            "speed:19+bos+heads:h.json",
            "s.jsonl",
            0.6,
            0.748,
        ),
    ];
    drop_files(&mut h, &files);
    let f = h.state().frontier.frontier.clone().unwrap();
    assert_eq!(f.families(), vec!["SPEED+BoS", "kept heads"]);
    assert_eq!(f.full_accuracy, Some(0.8));
    assert!(
        h.query_by_label_contains("3 policies in 2 families over s.jsonl")
            .is_some()
    );
    // each point in the table: its K/V held, accuracy with interval, answers kept
    for text in [
        "speed:22+bos",
        "speed:24+bos",
        "speed:19+bos+heads:h.json",
        "0.811",
        "0.700 [0.600, 0.800]",
        "6 of 8",
    ] {
        assert!(h.query_by_label(text).is_some(), "{text}");
    }

    // another suite's result is refused by name; the view keeps its points
    let other = result(dir.path(), "other.json", "knorm:0.25", "t.jsonl", 0.5, 0.76);
    drop_files(&mut h, &[other]);
    let err = h.state().error.clone().unwrap();
    assert!(
        err.contains("other.json") && err.contains("t.jsonl"),
        "{err}"
    );
    assert_eq!(
        h.state().frontier.frontier.as_ref().unwrap().points.len(),
        3
    );

    // the ratio axis needs a leaderboard run
    h.state_mut().error = None;
    // (a frame without the error's message first: the layout moves)
    h.run_steps(2);
    h.get_by_label("compression ratio").click();
    h.run_steps(2);
    let err = h.state().error.clone().unwrap();
    assert!(err.contains("leaderboard"), "{err}");
    assert!(!h.state().frontier.ratio_axis);

    // a press at the same suite joins as its own family
    let press = result(
        dir.path(),
        "knorm.json",
        "knorm:0.25",
        "s.jsonl",
        0.7,
        0.761,
    );
    drop_files(&mut h, &[press]);
    let f = h.state().frontier.frontier.clone().unwrap();
    assert_eq!(
        f.families(),
        vec!["SPEED+BoS", "kept heads", "press: knorm"]
    );
}
