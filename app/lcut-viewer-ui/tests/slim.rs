//! SlimInfer in the viewer, driven through its labels with egui_kittest
//! (headless, no model): choosing a slim policy for the live view and
//! running it beside full and SPEED on the fake worker, a malformed policy
//! showing its named error, and the SlimInfer views drawn from a SlimTrace
//! built by hand.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use egui_plot::PlotPoint;
use lcut_policy::{CutRecord, SlimTrace, StepRecord, StepTraffic};
use lcut_viewer_ui::fake::{self, FakeOptions};
use lcut_viewer_ui::live::{DEFAULT_SLIM, LiveStatus};
use lcut_viewer_ui::slim_data::{PositionState, SlimRunView};
use lcut_viewer_ui::slim_views::{existence_rects, show_existence, show_slim_views};
use lcut_viewer_ui::{Tab, ViewerState, channel, testing};

const FIELD: &str = "Third policy (SlimInfer):";

fn harness() -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    fake::spawn(port, FakeOptions::default());
    testing::harness(ViewerState::new(backend), false)
}

fn step_until(h: &mut Harness<'_, ViewerState>, what: &str, done: impl Fn(&ViewerState) -> bool) {
    testing::step_until(h, what, Duration::from_secs(20), done);
}

/// Opens the fake model and shows the live tab.
fn open_live(h: &mut Harness<'_, ViewerState>) {
    h.get_by_label("Bundled model").click();
    h.step();
    step_until(h, "the model", |s| s.model.is_some());
    h.get_by_label("Live").click();
    h.step();
    assert_eq!(h.state().view.tab, Tab::Live);
}

/// Clears the third policy's field (its None button) and types `text`.
fn type_policy(h: &mut Harness<'_, ViewerState>, text: &str) {
    // Leave the field first (Escape), as a user would.
    h.key_press(egui::Key::Escape);
    h.step();
    h.get_by_label("None").click();
    h.run_steps(2);
    assert_eq!(h.state().live.extra_text, "");
    h.get_by_label(FIELD).focus();
    h.step();
    h.get_by_label(FIELD).type_text(text);
    h.run_steps(2);
    assert_eq!(h.state().live.extra_text, text);
}

fn generate_button<'h>(h: &'h Harness<'_, ViewerState>) -> egui_kittest::Node<'h> {
    h.get_by(|n| {
        n.role() == Role::Button
            && n.label()
                .is_some_and(|l| l.starts_with("Generate at L_cut"))
    })
}

#[test]
fn a_chosen_slim_policy_runs_beside_full_and_speed() {
    let mut h = harness();
    open_live(&mut h);
    assert_eq!(h.state().live.extra_text, DEFAULT_SLIM);
    let policy = "slim:4@50%,8@25%+block:16+unit:4+swap:0.5";
    type_policy(&mut h, policy);
    h.state_mut().live.max_new_tokens = 8;
    h.step();
    generate_button(&h).click();
    h.step();
    step_until(&mut h, "the generation", |s| {
        s.live.status == LiveStatus::Done
    });
    h.run_steps(2);
    let live = &h.state().live;
    // The command carried the typed spec; the worker resolved it.
    let name = live.extra_policy.clone().unwrap();
    assert!(name.starts_with("slim:4@50%,8@25%+block:16"), "{name}");
    assert!(name.contains("swap:0.5"), "{name}");
    assert_eq!(live.extra.len(), 8);
    assert!(live.extra_metrics.kv_bytes < live.full_metrics.kv_bytes);
    assert!(live.extra_metrics.kv_bytes_resident <= live.extra_metrics.kv_bytes);
    let v = live.slim.as_ref().unwrap();
    assert_eq!(v.trace.steps.len(), 8);
    assert_eq!(v.cut_layers(), vec![4, 8]);
    assert_eq!(v.gamma, 0.5);
    // Three streams, each with its figures, held and resident K/V.
    assert!(h.query_all_by_label_contains("resident").count() >= 3);
    assert!(h.query_by_label(&format!("SlimInfer ({name})")).is_some());
    assert!(h.query_by_label_contains("third policy 8").is_some());
    // The SlimInfer views.
    assert!(
        h.query_by_label_contains("Which prompt positions exist at each layer")
            .is_some()
    );
    assert!(
        h.query_by_label_contains("cut 1: layer 4, budget 48 tokens = 2 blocks")
            .is_some()
    );
    assert!(
        h.query_by_label_contains("cut 2: layer 8, budget 24 tokens = 1 blocks")
            .is_some()
    );
    assert!(h.query_by_label_contains("below γ = 0.5").is_some());
    assert!(
        h.query_by_label_contains("Active blocks by decode step")
            .is_some()
    );
}

#[test]
fn a_malformed_slim_policy_shows_its_named_error() {
    let mut h = harness();
    open_live(&mut h);
    type_policy(&mut h, "slim:4@50%+unit:5");
    let e = h.get_by_label_contains("third policy: malformed policy");
    let text = e.accesskit_node().value().unwrap_or_default();
    assert!(
        text.contains("unit 5 must divide the block size 64"),
        "{text}"
    );
    assert!(generate_button(&h).accesskit_node().is_disabled());
    // Starting it anyway is refused with the same error, no job, no panic.
    assert!(!h.state_mut().run_generate());
    assert!(h.state().job.is_none());
    assert!(h.state().error.as_ref().unwrap().contains("unit 5"));

    // Parses, but not on 16 layers: the resolver's error.
    type_policy(&mut h, "slim:20@50%");
    assert!(
        h.query_by_label_contains("SlimInfer cut layer 20 is out of range for a model of 16")
            .is_some()
    );
    assert!(generate_button(&h).accesskit_node().is_disabled());

    // Back to a good one: Generate is enabled again, and an empty field
    // means two policies only.
    h.get_by_label("Default").click();
    h.run_steps(2);
    assert!(!generate_button(&h).accesskit_node().is_disabled());
    assert!(
        h.query_by_label_contains("SlimInfer cut layer 20")
            .is_none()
    );
    h.get_by_label("None").click();
    h.state_mut().live.max_new_tokens = 3;
    h.run_steps(2);
    generate_button(&h).click();
    h.step();
    step_until(&mut h, "the generation", |s| {
        s.live.status == LiveStatus::Done
    });
    assert!(h.state().live.extra_policy.is_none() && h.state().live.slim.is_none());
    assert_eq!(h.query_all_by_label_contains("TTFT").count(), 2);
}

fn traffic(cut: usize, overlap: f64, swapped: bool, active: Vec<usize>) -> StepTraffic {
    StepTraffic {
        cut,
        overlap,
        swapped,
        entering: if swapped { vec![active[0]] } else { vec![] },
        leaving: vec![],
        fetched_token_layers: 0,
        offloaded_token_layers: 0,
        candidates: active.clone(),
        active,
    }
}

/// 8 layers; a 36-token prompt whose decode phase starts at 32; blocks of
/// 4 with a one-block sink; cut 1 at layer 2 keeps blocks 2, 4, 6; cut 2
/// at layer 5 keeps block 4; three decode steps, a swap at step 1.
fn hand_built() -> SlimRunView {
    let step = |k: usize, overlap: f64, swapped: bool, a: Vec<usize>| StepRecord {
        position: 36 + k,
        cuts: vec![
            traffic(0, overlap, swapped, a),
            traffic(1, 1.0, false, vec![4]),
        ],
        resident_token_layers: 100,
        held_token_layers: 120,
    };
    let scores = |kept: &[usize]| {
        (1..8)
            .map(|b| {
                (
                    b,
                    if kept.contains(&b) {
                        0.9
                    } else {
                        0.1 + b as f32 / 100.0
                    },
                )
            })
            .collect()
    };
    SlimRunView {
        policy: "slim:2@16,5@8+block:4+unit:2".into(),
        num_layers: 8,
        prompt_len: 36,
        gamma: 0.9,
        prompt_tokens: (0..36).map(|p| format!("t{p}")).collect(),
        trace: SlimTrace {
            bytes_per_token_layer: 64,
            block: 4,
            sink_tokens: 4,
            prefill_tokens: 28,
            cuts: vec![
                CutRecord {
                    layer: 2,
                    budget_tokens: 16,
                    scores: scores(&[2, 4, 6]),
                    kept: vec![2, 4, 6],
                    kept_tokens: 12,
                },
                CutRecord {
                    layer: 5,
                    budget_tokens: 8,
                    scores: vec![(2, 0.2), (4, 0.8), (6, 0.3)],
                    kept: vec![4],
                    kept_tokens: 4,
                },
            ],
            steps: vec![
                step(0, 1.0, false, vec![2, 4, 6]),
                step(1, 0.33, true, vec![2, 4, 5]),
                step(2, 1.0, false, vec![2, 4, 5]),
            ],
            equal_kv_cutoff: 3.5,
        },
    }
}

#[test]
fn slim_views_draw_a_hand_built_trace() {
    let v = hand_built();
    assert_eq!(v.state(1, 9), PositionState::BelowFirstCut);
    assert_eq!(v.state(2, 9), PositionState::Kept);
    assert_eq!(v.state(2, 13), PositionState::Pruned);
    assert_eq!(v.state(5, 9), PositionState::Pruned);
    assert_eq!(v.state(7, 2), PositionState::Sink);
    assert_eq!(v.state(7, 33), PositionState::DecodePhase);
    assert_eq!(v.budget_blocks(0), 3);
    assert_eq!(v.budget_score(0), Some(0.9));
    assert_eq!(v.swap_steps(0), vec![1]);
    let pruned: Vec<_> = existence_rects(&v)
        .into_iter()
        .filter(|(s, _)| *s == PositionState::Pruned)
        .map(|(_, r)| r)
        .collect();
    // Blocks 1, 3, 5, 7 from layer 2; blocks 2 and 6 from layer 5.
    assert_eq!(pruned.len(), 6);
    assert!(pruned.contains(&[4.0, 8.0, 2.0, 8.0]));
    assert!(pruned.contains(&[8.0, 12.0, 5.0, 8.0]));

    let mut h = Harness::builder()
        .with_size([1200.0, 700.0])
        .build_ui_state(|ui, v: &mut SlimRunView| show_slim_views(ui, v), v);
    h.run();
    for label in [
        "SlimInfer slim:2@16,5@8+block:4+unit:2: 4 sink + 28 prunable prompt tokens in blocks of 4",
        "cut 1: layer 2, budget 16 tokens = 3 blocks, kept 3 of 7",
        "cut 2: layer 5, budget 8 tokens = 1 blocks, kept 1 of 3",
        "Active blocks by decode step",
        "below γ = 0.9",
    ] {
        assert!(h.query_by_label_contains(label).is_some(), "{label}");
    }
    assert!(
        h.query_by_label_contains("now 6.250 KiB resident of 7.500 KiB held")
            .is_some()
    );
}

#[test]
fn hovering_the_existence_map_names_the_position() {
    let v = hand_built();
    let mut h = Harness::builder().with_size([700.0, 400.0]).build_ui_state(
        |ui, s: &mut (SlimRunView, Option<egui_plot::PlotTransform>)| {
            s.1 = Some(show_existence(ui, &s.0, 300.0));
        },
        (v, None),
    );
    h.run();
    let t = h.state().1.unwrap();
    // Position 13 (block 3) at layer 6: pruned at cut 1.
    h.hover_at(t.position_from_point(&PlotPoint::new(13.5, 6.5)));
    h.run_steps(3);
    let tips = h.query_all_by_label_contains("layer 6, position 13 \"t13\", block 3\npruned");
    assert!(tips.count() >= 1);
    // Position 17 (block 4) at layer 6: kept by both cuts.
    h.hover_at(t.position_from_point(&PlotPoint::new(17.5, 6.5)));
    h.run_steps(3);
    let tips = h.query_all_by_label_contains("position 17 \"t17\", block 4\nkept block");
    assert!(tips.count() >= 1);
}

#[test]
fn the_existence_mask_lies_over_the_heatmap_of_the_same_prompt() {
    let report = lcut_diag::synthetic::synthetic_report(2, 16, 4, false).unwrap();
    let t = &report.traces[0];
    let mut v = hand_built();
    v.num_layers = t.num_layers;
    v.prompt_len = t.prompt_len;
    v.trace.prefill_tokens = t.decode_start - v.trace.sink_tokens;
    v.prompt_tokens.clone_from(&t.prompt_tokens);
    let (other_len, other) = (t.prompt_len + 1, v.clone());
    assert!(lcut_viewer_ui::heatmap_view::overlay_fits(t, &v));

    let mut state = ViewerState::default();
    state.set_report(report, "synthetic".into());
    state.loaded.as_mut().unwrap().select(Some(0));
    state.live.slim = Some(v);
    let mut h = testing::harness(state, false);
    h.run_steps(3);
    let toggle = format!("Shade what {} prunes (live run)", other.policy);
    assert!(h.query_by_label(&toggle).is_some());
    assert!(
        h.query_by_label_contains("is not the prompt shown here")
            .is_none()
    );

    // Another prompt's run: the toggle says it does not fit, nothing breaks.
    h.state_mut().live.slim.as_mut().unwrap().prompt_len = other_len;
    h.run_steps(2);
    assert!(
        h.query_by_label_contains(&format!(
            "prompt ({other_len} tokens) is not the prompt shown here"
        ))
        .is_some()
    );
    h.get_by_label(&toggle).click();
    h.run_steps(2);
    assert!(!h.state().view.slim_overlay);
}
