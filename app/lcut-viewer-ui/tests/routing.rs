//! The routing view, driven headless (egui_kittest): a mixture-of-experts
//! model's report dropped on the window offers a Routing tab that draws the
//! layer × expert load heatmap, the entropy and overlap per layer, the
//! sweep's overlap per cut and a row per sparse layer; a dense model's
//! report offers no such tab, and leaves it when it was open.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use lcut_diag::synthetic::{synthetic_moe_report, synthetic_report};
use lcut_report::{Format, write_report};
use lcut_viewer_ui::fake::{self, FakeOptions};
use lcut_viewer_ui::testing::Dropped;
use lcut_viewer_ui::{Tab, ViewerState, channel, testing};

fn harness() -> Harness<'static, ViewerState> {
    let (backend, port) = channel(None);
    fake::spawn(port, FakeOptions::default());
    testing::harness(ViewerState::new(backend), false)
}

/// Drop the report file at `path` and wait until it is the one shown.
fn drop_report(h: &mut Harness<'_, ViewerState>, path: PathBuf) {
    let shown = path.display().to_string();
    h.input_mut().dropped_files.push(Arc::new(Dropped(path)));
    h.step();
    testing::step_until(h, "the dropped report", Duration::from_secs(20), |s| {
        s.loaded.as_ref().is_some_and(|l| l.source == shown)
    });
    h.run_steps(2);
}

#[test]
fn a_moe_report_offers_the_routing_view_and_a_dense_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let moe = synthetic_moe_report(3, 6, 2, true).unwrap();
    let moe_dir = dir.path().join("moe");
    let path = write_report(&moe, &moe_dir, Format::Json).unwrap();
    let mut h = harness();
    drop_report(&mut h, path);

    h.get_by_label("Routing").click();
    h.run_steps(3);
    assert_eq!(h.state().view.tab, Tab::Routing);
    let c = moe.curves.routing.as_ref().unwrap();
    // the sentence, the heatmap's and the plots' captions
    for text in [
        "Routing (gpt_oss: top 2 of 8 experts",
        "Expert load, layer × expert",
        "Per layer: the router's entropy / ln 8",
        "Sweep: mean top-k overlap",
    ] {
        assert!(h.query_by_label_contains(text).is_some(), "{text}");
    }
    // the load heatmap drew all 8 experts of all 6 layers
    let cache = &h.state().loaded.as_ref().unwrap().caches.routing_load;
    assert!(cache.rebuilds >= 1);
    assert_eq!(cache.texture_size(), Some([8, 6]));
    // a row per sparse layer (layer 1 is dense), with its entropy and busiest expert
    for &l in &c.sparse_layers {
        assert!(
            h.query_by_label(&format!("layer {l}")).is_some(),
            "layer {l}"
        );
        let e = format!("{:.3}", c.entropy[l]);
        assert!(h.query_all_by_label(&e).count() > 0, "entropy {e}");
    }
    assert!(
        h.query_by_label("layer 1").is_none(),
        "dense layers have no row"
    );

    // a dense model's report: no Routing tab, and the view leaves it
    let dense = synthetic_report(3, 6, 2, false).unwrap();
    let path = write_report(&dense, &dir.path().join("dense"), Format::Json).unwrap();
    drop_report(&mut h, path);
    assert_ne!(h.state().view.tab, Tab::Routing);
    assert!(h.query_by_label("Routing").is_none());
    assert!(h.query_by_label("Heatmaps").is_some());
}

/// A report of a model with attention sinks (the synthetic one is gpt-oss)
/// shows the sink's share per layer beside BoS's on the heatmaps; a dense
/// model's report shows BoS alone.
#[test]
fn a_report_with_sinks_shows_the_sink_share_beside_bos() {
    let dir = tempfile::tempdir().unwrap();
    let moe = synthetic_moe_report(3, 6, 2, false).unwrap();
    assert_eq!(moe.curves.sink.len(), 6);
    let path = write_report(&moe, &dir.path().join("moe"), Format::Json).unwrap();
    let mut h = harness();
    drop_report(&mut h, path);
    h.get_by_label("Heatmaps").click();
    h.run_steps(3);
    assert!(h.query_by_label_contains("sink share (no key)").is_some());
    let caches = &h.state().loaded.as_ref().unwrap().caches;
    assert!(caches.sink.rebuilds >= 1);
    assert_eq!(caches.sink.texture_size(), Some([1, 6]));

    let dense = synthetic_report(3, 6, 2, false).unwrap();
    assert!(dense.curves.sink.is_empty());
    let path = write_report(&dense, &dir.path().join("dense"), Format::Json).unwrap();
    drop_report(&mut h, path);
    h.run_steps(3);
    assert!(h.query_by_label_contains("BoS mass").is_some());
    assert!(h.query_by_label_contains("sink share (no key)").is_none());
}
