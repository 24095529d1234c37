//! Picking (layer, K/V head) pairs in the head view, driven through its
//! labels and by clicks on the heatmap's cells (egui_kittest, headless),
//! against the fake worker: a click picks the clicked query head's whole
//! K/V group and the K/V share follows `lcut_diag::kv_share`; a pair below
//! the cut is refused with its reason; the budget fills the plan of
//! `plan_for_budget`; "Run beside full" writes the head file and starts
//! `speed:C+bos+heads:FILE` live.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use lcut_diag::{PromptShape, kv_head_masses, kv_share, plan_for_budget};
use lcut_trace::Report;
use lcut_viewer_ui::fake::{self, FakeOptions};
use lcut_viewer_ui::live::LiveStatus;
use lcut_viewer_ui::{Tab, ViewerState, channel, testing};

fn harness() -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    fake::spawn(port, FakeOptions::default());
    testing::harness(ViewerState::new(backend), false)
}

fn step_until(h: &mut Harness<'_, ViewerState>, what: &str, done: impl Fn(&ViewerState) -> bool) {
    testing::step_until(h, what, Duration::from_secs(20), done);
}

/// The text of the one label that starts with `prefix`.
fn label_starting(h: &Harness<'_, ViewerState>, prefix: &str) -> String {
    let node =
        h.get_by(|n| n.role() == Role::Label && n.value().is_some_and(|v| v.starts_with(prefix)));
    node.accesskit_node().value().unwrap_or_default()
}

fn report(h: &Harness<'_, ViewerState>) -> Report {
    (*h.state().loaded.as_ref().unwrap().report).clone()
}

fn picked(h: &Harness<'_, ViewerState>) -> Vec<(usize, usize)> {
    h.state().heads.pairs()
}

/// The fake model (16 layers, 8 query heads sharing 4 K/V heads) with a
/// report, the cut at 10, the head view open.
fn open_heads() -> Harness<'static, ViewerState> {
    let mut h = harness();
    h.get_by_label("Bundled model").click();
    h.step();
    step_until(&mut h, "the model", |s| s.model.is_some());
    h.get_by_label("Run diagnostics").click();
    h.step();
    step_until(&mut h, "the report", |s| {
        s.loaded.is_some() && s.job.is_none()
    });
    h.state_mut().view.l_cut = 10;
    h.get_by_label("Heads").click();
    h.run_steps(3);
    assert_eq!(h.state().view.tab, Tab::Heads);
    h
}

fn share_label(share: f64) -> String {
    format!("K/V share with the picks: {share:.4} of full")
}

#[test]
fn a_click_picks_the_group_and_the_cost_is_the_formula() {
    let mut h = open_heads();
    let r = report(&h);
    let shape = PromptShape::of_report(&r);
    assert_eq!(
        label_starting(&h, "K/V share with the picks:"),
        share_label(kv_share(16, 4, 10, 0, &shape))
    );
    // query head 3 reads K/V head 1 (two query heads per K/V head)
    testing::click_head_cell(&mut h, 12, 3);
    assert_eq!(picked(&h), vec![(12, 1)]);
    assert_eq!(
        label_starting(&h, "K/V share with the picks:"),
        share_label(kv_share(16, 4, 10, 1, &shape))
    );
    assert_eq!(
        label_starting(&h, "K/V share of SPEED+BoS at L_cut 10:"),
        format!(
            "K/V share of SPEED+BoS at L_cut 10: {:.4}",
            kv_share(16, 4, 10, 0, &shape)
        )
    );
    assert_eq!(
        label_starting(&h, "Picked (layer, K/V head):"),
        "Picked (layer, K/V head): (12, 1)"
    );
    // the mass kept: every layer below the cut and the picked pair
    let masses = kv_head_masses(&r.curves.prefill_by_head, 4).unwrap();
    let total: f64 = masses.iter().flatten().sum();
    let kept = (masses[..10].iter().flatten().sum::<f64>() + masses[12][1]) / total;
    assert!(
        label_starting(&h, "Decode-to-prefill mass kept:")
            .starts_with(&format!("Decode-to-prefill mass kept: {kept:.3} ")),
        "{kept}"
    );

    // the other query head of the group drops it again
    testing::click_head_cell(&mut h, 12, 2);
    assert!(picked(&h).is_empty());
    testing::click_head_cell(&mut h, 14, 7);
    testing::click_head_cell(&mut h, 11, 0);
    assert_eq!(picked(&h), vec![(11, 0), (14, 3)]);
    assert_eq!(
        label_starting(&h, "K/V share with the picks:"),
        share_label(kv_share(16, 4, 10, 2, &shape))
    );

    // below the cut: refused, with the reason on screen
    testing::click_head_cell(&mut h, 3, 0);
    assert_eq!(picked(&h), vec![(11, 0), (14, 3)]);
    assert!(
        label_starting(&h, "layer 3 is below the cut 10").contains("pick heads in layers 10..15"),
    );

    // the cut moves up past a pick: it is dropped, and said so
    h.get_by_role_and_label(Role::Slider, "L_cut")
        .set_value_accesskit(12.0);
    h.run_steps(3);
    assert_eq!(picked(&h), vec![(14, 3)]);
    assert!(
        h.query_by_label_contains("1 picked pairs below it were dropped")
            .is_some()
    );
    assert_eq!(
        label_starting(&h, "K/V share with the picks:"),
        share_label(kv_share(16, 4, 12, 1, &shape))
    );
}

#[test]
fn the_budget_fills_the_plan_and_clear_empties_it() {
    let mut h = open_heads();
    let r = report(&h);
    let masses = kv_head_masses(&r.curves.prefill_by_head, 4).unwrap();
    let budget = 0.6;
    let plan = plan_for_budget(&masses, &PromptShape::of_report(&r), budget).unwrap();
    assert!(
        !plan.heads.is_empty(),
        "the plan keeps some heads: {plan:?}"
    );
    h.get_by_role_and_label(Role::SpinButton, "K/V budget")
        .set_value_accesskit(budget);
    h.step();
    assert_eq!(h.state().heads.budget, budget);
    h.get_by_label("Fill from budget").click();
    h.run_steps(3);
    assert_eq!(picked(&h), plan.heads);
    assert_eq!(h.state().view.l_cut, plan.cut);
    assert!(label_starting(&h, "Plan for 0.600:").contains(&format!(
        "L_cut {} + {} pairs hold {:.4}",
        plan.cut,
        plan.heads.len(),
        plan.kv_share
    )));
    assert_eq!(
        label_starting(&h, "K/V share with the picks:"),
        share_label(plan.kv_share)
    );
    h.get_by_label("Clear picks").click();
    h.run_steps(2);
    assert!(picked(&h).is_empty());
    assert!(
        h.get_by_label("Run beside full")
            .accesskit_node()
            .is_disabled()
    );
    assert!(h.query_by_label_contains("no heads picked").is_some());

    // a budget below SPEED+BoS at cut 1 is refused by name
    h.state_mut().heads.budget = 0.02;
    h.step();
    h.get_by_label("Fill from budget").click();
    h.run_steps(2);
    assert!(
        h.query_by_label_contains("below what SPEED+BoS at cut 1 holds")
            .is_some()
    );
    assert!(picked(&h).is_empty());
}

#[test]
fn run_beside_full_writes_the_head_file_and_runs_the_head_policy() {
    let mut h = open_heads();
    let r = report(&h);
    let dir = tempfile::tempdir().unwrap();
    h.state_mut().heads.folder = dir.path().join("picks").display().to_string();
    testing::click_head_cell(&mut h, 13, 2);
    testing::click_head_cell(&mut h, 15, 6);
    assert_eq!(picked(&h), vec![(13, 1), (15, 3)]);
    h.state_mut().live.max_new_tokens = 8;
    h.get_by_label("Run beside full").click();
    h.step();
    step_until(&mut h, "the live run", |s| {
        matches!(s.live.status, LiveStatus::Done | LiveStatus::Failed(_))
    });
    let path = dir.path().join("picks").join("heads-c10-n2.json");
    let live = &h.state().live;
    assert_eq!(live.status, LiveStatus::Done, "{:?}", h.state().log);
    assert_eq!(h.state().view.tab, Tab::Live);
    assert_eq!(
        live.speed_policy,
        format!("speed:10+bos+heads:{}", path.display())
    );
    // the third column is SPEED+BoS holding as much K/V (two of four K/V
    // heads of one layer: not a whole layer more)
    assert_eq!(live.extra_policy.as_deref(), Some("speed:10+bos"));
    assert_eq!(live.full.len(), 8);
    assert!(live.speed_metrics.kv_bytes < live.full_metrics.kv_bytes);
    assert_eq!(h.state().heads.written.as_deref(), Some(path.as_path()));
    assert!(
        h.query_by_label("SPEED with kept heads (speed:10+bos+heads:heads-c10-n2.json)")
            .is_some()
    );
    assert!(
        h.query_by_label(&format!("policy: speed:10+bos+heads:{}", path.display()))
            .is_some()
    );

    // the file on disk holds the picks and names the report's model
    let file = lcut_policy::read_head_file(&path.display().to_string()).unwrap();
    assert_eq!(
        file.heads.iter().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([(13, 1), (15, 3)])
    );
    assert_eq!(file.cut, Some(10));
    assert_eq!(file.model, r.model.file_model());
    // and no temporary file is left beside it
    let names: Vec<_> = std::fs::read_dir(dir.path().join("picks"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");

    // back in the head view, the file's name is shown
    h.get_by_label("Heads").click();
    h.run_steps(2);
    assert!(
        h.query_by_label(&format!("Head file: {}", path.display()))
            .is_some()
    );
}

#[test]
fn a_whole_layer_of_picks_is_priced_as_speed_one_layer_deeper() {
    let mut h = open_heads();
    for q in [0, 2, 4, 6] {
        testing::click_head_cell(&mut h, 11, q);
    }
    assert_eq!(picked(&h), vec![(11, 0), (11, 1), (11, 2), (11, 3)]);
    assert!(
        label_starting(&h, "SPEED+BoS within the same K/V:")
            .starts_with("SPEED+BoS within the same K/V: L_cut 11,")
    );
    let shape = PromptShape::of_report(&report(&h));
    assert_eq!(
        label_starting(&h, "K/V share with the picks:"),
        share_label(kv_share(16, 4, 11, 0, &shape))
    );
}

#[test]
fn a_long_head_run_shows_progress_and_cancels() {
    let mut h = open_heads();
    let dir = tempfile::tempdir().unwrap();
    h.state_mut().heads.folder = dir.path().display().to_string();
    testing::click_head_cell(&mut h, 15, 0);
    h.state_mut().live.max_new_tokens = 4000;
    h.get_by_label("Run beside full").click();
    h.step();
    step_until(&mut h, "a few tokens", |s| s.live.full.len() >= 3);
    // while it streams: a progress bar, Cancel, and no second run
    assert!(h.query_by_role(Role::ProgressIndicator).is_some());
    assert!(h.state().heads_run_blocked().is_some());
    h.get_by_label("Cancel generation").click();
    h.step();
    step_until(&mut h, "the cancel", |s| s.job.is_none());
    assert_eq!(h.state().live.status, LiveStatus::Cancelled);
    assert!(h.state().live.full.len() < 4000);
    assert!(h.state().live.speed_policy.contains("+heads:"));
}
