//! Driving the viewer headless in tests (egui_kittest), shared by this
//! crate's tests against the fake worker and the binary's tests against the
//! real engine. Only built with the `testing` feature.

use std::time::{Duration, Instant};

use egui_kittest::Harness;

use crate::{ViewerState, show_viewer};

/// A headless viewer over `state`, 1400 x 900. `real_tokens`: the run
/// shows a real model's tokens, which may hold characters the bundled fonts
/// lack (with the fake worker every glyph must exist).
pub fn harness(state: ViewerState, real_tokens: bool) -> Harness<'static, ViewerState> {
    let builder = Harness::builder().with_size([1400.0, 900.0]);
    let builder = if real_tokens {
        builder.allow_missing_glyphs()
    } else {
        builder
    };
    builder.build_ui_state(show_viewer, state)
}

/// Step the viewer until `done` holds (the worker runs on its own thread),
/// failing with the viewer's log after `limit`; then one more frame.
pub fn step_until(
    h: &mut Harness<'_, ViewerState>,
    what: &str,
    limit: Duration,
    done: impl Fn(&ViewerState) -> bool,
) {
    let start = Instant::now();
    while !done(h.state()) {
        assert!(
            start.elapsed() < limit,
            "timed out waiting for {what}; log: {:?}",
            h.state().log
        );
        std::thread::sleep(Duration::from_millis(2));
        h.step();
    }
    h.step();
}

/// Clicks the head view's cell of query head `q` at `layer` (press and
/// release without moving, where the heatmap was last drawn).
pub fn click_head_cell(h: &mut Harness<'_, ViewerState>, layer: usize, q: usize) {
    let t = h
        .state()
        .heads
        .transform
        .expect("the head view has been drawn");
    let at = t.position_from_point(&egui_plot::PlotPoint::new(
        q as f64 + 0.5,
        layer as f64 + 0.5,
    ));
    h.hover_at(at);
    h.step();
    h.drag_at(at);
    h.step();
    h.drop_at(at);
    h.run_steps(2);
}

/// A file dropped on the window in a test: the path, read on demand.
#[derive(Debug)]
pub struct Dropped(pub std::path::PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}
