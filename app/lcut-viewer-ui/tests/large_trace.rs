//! A large synthetic trace (32 layers × 32 heads × 128 steps, 128K prompt
//! positions, one heatmap bin per position) opens, pans and zooms, and the
//! prompt-position heatmap never hands more columns to the GPU than the
//! screen has pixels (times the pan margin).
//!
//! Times are measured and printed (run with `--nocapture`), never asserted:
//! they depend on the machine and the build profile.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use lcut_viewer_ui::large::{LargeSpec, large_report};
use lcut_viewer_ui::{ViewerState, channel, show_viewer};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints min / median / mean / p95 / max: on a shared machine the minimum
/// and the median show the cost, the tail shows the neighbours.
fn stats(name: &str, v: &mut [f64]) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n as f64;
    let p95 = v[((n as f64 * 0.95).ceil() as usize).clamp(1, n) - 1];
    println!(
        "{name:<34} n={n:<4} min {:>6.2}  median {:>6.2}  mean {mean:>6.2}  p95 {p95:>7.2}  max {:>7.2} ms",
        v[0],
        v[n / 2],
        v[n - 1]
    );
}

/// One frame: UI build (`step`) and tessellation of its shapes, separately.
fn frame(h: &mut Harness<'_, ViewerState>) -> (f64, f64) {
    let t = Instant::now();
    h.step();
    let build = ms(t.elapsed());
    let shapes = h.output().shapes.clone();
    let ppp = h.ctx.pixels_per_point();
    let t = Instant::now();
    let prims = h.ctx.tessellate(shapes, ppp);
    let tess = ms(t.elapsed());
    assert!(!prims.is_empty());
    (build, tess)
}

#[test]
fn large_trace_opens_and_pans_without_drawing_every_cell() {
    let spec = LargeSpec::default();
    println!(
        "large trace: {} layers x {} heads x {} steps, {} prompt positions ({} cells in the position map)",
        spec.layers,
        spec.heads,
        spec.steps,
        spec.prompt_len,
        spec.layers * spec.prompt_len
    );
    let t = Instant::now();
    let report = large_report(spec).unwrap();
    println!(
        "{:<34} {:>8.1} ms",
        "build synthetic report",
        ms(t.elapsed())
    );

    // Through a file, as a user opens it.
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let path = lcut_report::write_report(&report, dir.path(), lcut_report::Format::Json).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    println!(
        "{:<34} {:>8.1} ms ({:.1} MB)",
        "write report.json",
        ms(t.elapsed()),
        size as f64 / 1e6
    );
    let t = Instant::now();
    let report = lcut_viewer_ui::jobs::load_report(&path).unwrap();
    println!(
        "{:<34} {:>8.1} ms (worker thread)",
        "read + validate report.json",
        ms(t.elapsed())
    );

    // The re-binning itself, as done when a pan leaves the texture: 1812
    // columns (a 906 px plot plus half a width each side) over the whole
    // prompt, then coloured.
    {
        let index = lcut_viewer_ui::grid::PositionIndex::new(&report.traces[0]);
        let range = lcut_viewer_ui::colormap::ValueRange::of(
            index.density_bounds(),
            lcut_viewer_ui::colormap::ColorScale::Log,
        );
        let mut t_rebin = Vec::new();
        let mut t_color = Vec::new();
        for i in 0..20 {
            let x0 = 1.0 + 1000.0 * i as f64;
            let t = Instant::now();
            let g = index.rebin(x0, x0 + 120_000.0, 1812);
            t_rebin.push(ms(t.elapsed()));
            let t = Instant::now();
            let colorizer = range.colorizer();
            let px: Vec<egui::Color32> = g.values.iter().map(|&v| colorizer.color(v)).collect();
            t_color.push(ms(t.elapsed()));
            assert_eq!(px.len(), 32 * 1812);
        }
        stats("rebin 32 x 1812 of 131072", &mut t_rebin);
        stats("colour 32 x 1812 cells", &mut t_color);
    }

    let (backend, _port) = channel(None);
    let mut state = ViewerState::new(backend);
    let t = Instant::now();
    state.set_report(report, path.display().to_string());
    println!(
        "{:<34} {:>8.1} ms (UI thread, once)",
        "index + grids (set_report)",
        ms(t.elapsed())
    );

    let t = Instant::now();
    let mut h = Harness::builder()
        .with_size([1280.0, 800.0])
        .build_ui_state(show_viewer, state);
    println!(
        "{:<34} {:>8.1} ms",
        "first frames (harness settles)",
        ms(t.elapsed())
    );

    let rect = {
        let l = h.state().loaded.as_ref().unwrap();
        l.caches.by_position.last_rect.unwrap()
    };
    let width_px = rect.width() as usize;
    let check_texture = |h: &Harness<'_, ViewerState>| {
        let c = &h.state().loaded.as_ref().unwrap().caches.by_position;
        let [cols, rows] = c.texture_size().unwrap();
        assert_eq!(rows, spec.layers);
        // The visible width plus half a width on each side, one column per
        // pixel: never the 128K positions.
        assert!(
            cols <= 2 * width_px + 16,
            "{cols} columns for a {width_px} px plot"
        );
        cols
    };
    let cols0 = check_texture(&h);
    println!(
        "position plot {width_px} px wide; texture {cols0} x {} (data: {} x {})",
        spec.layers, spec.prompt_len, spec.layers
    );

    // Idle frames.
    let (mut build, mut tess) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let (b, t) = frame(&mut h);
        build.push(b);
        tess.push(t);
    }
    stats("idle frame: UI build", &mut build);
    stats("idle frame: tessellation", &mut tess);

    // Drag-pan back and forth across the heatmap, 8 px per frame.
    let start = rect.center() + egui::vec2(rect.width() * 0.3, 0.0);
    h.hover_at(start);
    h.step();
    h.drag_at(start);
    h.step();
    let (mut build, mut tess) = (Vec::new(), Vec::new());
    let rebuilds0 = h
        .state()
        .loaded
        .as_ref()
        .unwrap()
        .caches
        .by_position
        .rebuilds;
    for i in 0..150 {
        let k = if i < 75 { i } else { 150 - i };
        h.hover_at(start - egui::vec2(8.0 * k as f32, 0.0));
        let (b, t) = frame(&mut h);
        build.push(b);
        tess.push(t);
    }
    h.drop_at(start);
    h.step();
    let rebuilds = h
        .state()
        .loaded
        .as_ref()
        .unwrap()
        .caches
        .by_position
        .rebuilds
        - rebuilds0;
    stats("pan frame: UI build (incl. rebin)", &mut build);
    stats("pan frame: tessellation", &mut tess);
    println!("texture rebuilt on {rebuilds} of 150 pan frames");
    check_texture(&h);

    // Zoom in (ctrl+scroll) until single tokens are wider than pixels.
    h.hover_at(rect.center());
    h.step();
    let (mut build, mut tess) = (Vec::new(), Vec::new());
    for _ in 0..14 {
        h.event(egui::Event::Zoom(2.0));
        let (b, t) = frame(&mut h);
        build.push(b);
        tess.push(t);
    }
    stats("zoom frame: UI build (incl. rebin)", &mut build);
    stats("zoom frame: tessellation", &mut tess);
    let (x0, x1) = h
        .state()
        .loaded
        .as_ref()
        .unwrap()
        .caches
        .by_position
        .placed()
        .unwrap();
    let cols = check_texture(&h);
    println!("after zoom the texture covers positions {x0:.0}..{x1:.0} in {cols} columns");
    // Zoomed in to the token level: at most one column per position.
    assert!(x1 - x0 < 10_000.0, "zoomed in: {x0}..{x1}");
    assert!(cols as f64 <= x1 - x0 + 1.0);

    // Hovering shows the token under the pointer.
    h.hover_at(rect.center() + egui::vec2(3.0, 5.0));
    h.run_steps(3);
    let tip = h.get_by(|n| {
        n.value()
            .is_some_and(|v| v.starts_with("layer ") && v.contains("position"))
    });
    let text = egui_kittest::kittest::NodeT::accesskit_node(&tip)
        .value()
        .unwrap();
    println!("hover: {}", text.replace('\n', " | "));
    assert!(text.contains('"'), "the token is quoted: {text}");
}
