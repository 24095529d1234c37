//! The live SlimInfer run's views: which prompt positions exist at each
//! layer (layer × prompt position), each cut's block scores with the
//! budget line, the active blocks of every cut over decode steps (step ×
//! block raster) and each cut's overlap ratio with γ marked.

use egui::{Color32, ColorImage, RichText, TextureHandle, TextureOptions, Ui};
use egui_plot::{
    Bar, BarChart, Corner, HLine, Legend, Line, LineStyle, Plot, PlotImage, PlotPoint, PlotPoints,
    PlotTransform, Points,
};

use crate::heatmap::rect_polygon;
use crate::slim_data::{BlockActivity, PositionState, SlimRunView};
use crate::theme::{
    BELOW, CUT, DECODE, ENTERING, INACTIVE, KEPT, PRUNED, SERIES, SINK, human_bytes,
};

/// The colour of a position state.
pub fn state_color(s: PositionState) -> Color32 {
    match s {
        PositionState::Sink => SINK,
        PositionState::BelowFirstCut => BELOW,
        PositionState::Kept => KEPT,
        PositionState::Pruned => PRUNED,
        PositionState::DecodePhase => DECODE,
    }
}

/// The colour of a block's activity in the raster.
pub fn activity_color(a: BlockActivity) -> Color32 {
    match a {
        BlockActivity::Absent => PRUNED,
        BlockActivity::Inactive => INACTIVE,
        BlockActivity::Active => KEPT,
        BlockActivity::Entering => ENTERING,
    }
}

/// The layer × position map as rectangles `[x0, x1, y0, y1]` (positions,
/// layers) by state, in drawing order: later ones cover earlier ones.
pub fn existence_rects(v: &SlimRunView) -> Vec<(PositionState, [f64; 4])> {
    let l = v.num_layers as f64;
    let (sink, ds, p) = (
        v.trace.sink_tokens as f64,
        v.decode_start() as f64,
        v.prompt_len as f64,
    );
    let c1 = v.trace.cuts.first().map_or(l, |c| c.layer as f64);
    let mut out = Vec::new();
    if sink > 0.0 {
        out.push((PositionState::Sink, [0.0, sink, 0.0, l]));
    }
    if ds > sink {
        out.push((PositionState::BelowFirstCut, [sink, ds, 0.0, c1]));
        out.push((PositionState::Kept, [sink, ds, c1, l]));
    }
    out.extend(
        pruned_rects(v)
            .into_iter()
            .map(|r| (PositionState::Pruned, r)),
    );
    if p > ds {
        out.push((PositionState::DecodePhase, [ds, p, 0.0, l]));
    }
    out
}

/// The pruned regions `[x0, x1, y0, y1]`: runs of blocks, each from the
/// cut that pruned it to the top.
pub fn pruned_rects(v: &SlimRunView) -> Vec<[f64; 4]> {
    let l = v.num_layers as f64;
    v.pruned_runs()
        .iter()
        .map(|r| {
            let x0 = v.block_positions(r.first).start.max(v.trace.sink_tokens);
            let x1 = v.block_positions(r.end - 1).end;
            [x0 as f64, x1 as f64, r.layer as f64, l]
        })
        .collect()
}

/// The cut lines `y = c_i` of a SlimInfer run, for any layer plot.
pub fn cut_hlines(v: &SlimRunView) -> Vec<HLine> {
    v.trace
        .cuts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            HLine::new(
                format!(
                    "cut {}: layer {}, {} tokens kept",
                    i + 1,
                    c.layer,
                    c.kept_tokens
                ),
                c.layer as f64,
            )
            .color(CUT)
            .style(LineStyle::dashed_loose())
            .width(1.5)
        })
        .collect()
}

/// Hover text of the existence map at data `(x, y)`.
fn existence_hover(v: &SlimRunView, x: f64, y: f64) -> Option<String> {
    if x < 0.0 || y < 0.0 || x >= v.prompt_len as f64 || y >= v.num_layers as f64 {
        return None;
    }
    let (pos, layer) = (x.floor() as usize, y.floor() as usize);
    let token = v.token(pos).map_or(String::new(), |t| format!(" {t:?}"));
    let block = match pos < v.decode_start() {
        true => format!(", block {}", pos / v.trace.block.max(1)),
        false => String::new(),
    };
    Some(format!(
        "layer {layer}, position {pos}{token}{block}\n{}",
        v.state(layer, pos).label()
    ))
}

/// The layer × prompt-position existence map; returns the plot's
/// transform (data to screen), hover text under the pointer.
pub fn show_existence(ui: &mut Ui, v: &SlimRunView, height: f32) -> PlotTransform {
    ui.label("Which prompt positions exist at each layer (dashed: the cuts)");
    show_swatches(ui, &EXISTENCE_KEY.map(|s| (state_color(s), s.label())));
    let r = Plot::new("slim_existence")
        .height(height)
        .allow_boxed_zoom(false)
        .allow_zoom(egui::Vec2b::new(true, false))
        .allow_drag(egui::Vec2b::new(true, false))
        .include_x(0.0)
        .include_x(v.prompt_len as f64)
        .include_y(0.0)
        .include_y(v.num_layers as f64)
        .x_axis_label("prompt position")
        .y_axis_label("layer")
        .label_formatter(|_| None)
        .show(ui, |pui| {
            for (s, r) in existence_rects(v) {
                pui.polygon(rect_polygon(s.label(), r, state_color(s)));
            }
            for l in cut_hlines(v) {
                pui.hline(l);
            }
            pui.pointer_coordinate()
        });
    if let Some(p) = r.inner
        && r.response.hovered()
        && let Some(text) = existence_hover(v, p.x, p.y)
    {
        r.response.on_hover_text_at_pointer(text);
    }
    r.transform
}

/// The states of the existence map, in the order of its key.
const EXISTENCE_KEY: [PositionState; 5] = [
    PositionState::Sink,
    PositionState::BelowFirstCut,
    PositionState::Kept,
    PositionState::Pruned,
    PositionState::DecodePhase,
];

/// A colour key: a swatch and a name per entry, on one wrapped line.
pub fn show_swatches(ui: &mut Ui, entries: &[(Color32, &str)]) {
    ui.horizontal_wrapped(|ui| {
        for (color, name) in entries {
            ui.label(RichText::new("■").color(*color));
            ui.label(RichText::new(*name).small());
            ui.add_space(6.0);
        }
    });
}

/// One cut's block scores r(j), kept blocks highlighted, with the budget
/// line at the k-th best score.
fn show_cut_scores(ui: &mut Ui, v: &SlimRunView, i: usize, height: f32) {
    let c = &v.trace.cuts[i];
    let k = v.budget_blocks(i);
    ui.label(format!(
        "cut {}: layer {}, budget {} tokens = {k} blocks, kept {} of {}",
        i + 1,
        c.layer,
        c.budget_tokens,
        c.kept.len(),
        c.scores.len()
    ));
    let bar = |&(b, s): &(usize, f32), fill: Color32| {
        Bar::new(b as f64, f64::from(s))
            .width(0.8)
            .fill(fill)
            .name(format!("block {b}"))
    };
    let (kept, pruned): (Vec<_>, Vec<_>) = c
        .scores
        .iter()
        .partition(|(b, _)| c.kept.binary_search(b).is_ok());
    Plot::new(("slim_scores", i))
        .height(height)
        .allow_boxed_zoom(false)
        .include_y(0.0)
        .x_axis_label("block")
        .y_axis_label("score r(j)")
        .show(ui, |pui| {
            let kept: Vec<Bar> = kept.into_iter().map(|s| bar(s, KEPT)).collect();
            let pruned: Vec<Bar> = pruned.into_iter().map(|s| bar(s, Color32::GRAY)).collect();
            pui.bar_chart(BarChart::new("kept", kept).color(KEPT));
            pui.bar_chart(BarChart::new("pruned", pruned).color(Color32::GRAY));
            if let Some(line) = v.budget_score(i) {
                pui.hline(
                    HLine::new(format!("budget: {k} blocks"), f64::from(line))
                        .color(DECODE)
                        .style(LineStyle::dashed_loose())
                        .width(1.5),
                );
            }
        });
}

/// Every cut's score bars, side by side.
pub fn show_scores(ui: &mut Ui, v: &SlimRunView, height: f32) {
    let n = v.trace.cuts.len();
    if n == 0 {
        ui.label("no cuts decided");
        return;
    }
    ui.label("Block scores r(j) at each cut (dashed: the budget's k-th best score)");
    show_swatches(
        ui,
        &[
            (KEPT, "kept"),
            (Color32::GRAY, "pruned"),
            (DECODE, "budget line"),
        ],
    );
    ui.columns(n, |cols| {
        for (i, ui) in cols.iter_mut().enumerate() {
            show_cut_scores(ui, v, i, height);
        }
    });
}

/// The rows of the raster: per cut, the prunable blocks (a gap row
/// between cuts); `(cut, block)` per row, bottom to top.
pub fn raster_rows(v: &SlimRunView) -> Vec<Option<(usize, usize)>> {
    let blocks = v.sink_blocks()..v.num_blocks();
    let mut rows = Vec::new();
    for i in 0..v.trace.cuts.len() {
        if i > 0 {
            rows.push(None);
        }
        rows.extend(blocks.clone().map(|b| Some((i, b))));
    }
    rows
}

/// Most columns (steps) and rows (blocks) of the raster's texture: larger
/// runs are sampled.
const RASTER_MAX: usize = 2048;

fn sample(n: usize) -> Vec<usize> {
    let m = n.min(RASTER_MAX);
    (0..m).map(|k| k * n / m.max(1)).collect()
}

/// The step × block raster as an image (column = step, top row = the last
/// cut's last block).
pub fn raster_image(v: &SlimRunView) -> ColorImage {
    let rows = raster_rows(v);
    let (steps, picked) = (sample(v.trace.steps.len()), sample(rows.len()));
    let (w, h) = (steps.len().max(1), picked.len().max(1));
    let mut pixels = Vec::with_capacity(w * h);
    for &r in picked.iter().rev() {
        for c in 0..w {
            let color = match (rows[r], steps.get(c)) {
                (Some((i, b)), Some(&k)) => activity_color(v.activity(i, k, b)),
                _ => Color32::BLACK,
            };
            pixels.push(color);
        }
    }
    ColorImage::new([w, h], pixels)
}

/// What the raster's texture depends on: the policy, the prompt length,
/// the steps and cuts so far.
type RasterKey = (String, usize, usize, usize);

/// The raster's texture, rebuilt when the run or its step count changes
/// (kept in egui's memory between frames).
fn raster_texture(ui: &Ui, v: &SlimRunView) -> TextureHandle {
    let id = egui::Id::unique("slim_raster_texture");
    let key: RasterKey = (
        v.policy.clone(),
        v.prompt_len,
        v.trace.steps.len(),
        v.trace.cuts.len(),
    );
    let cached = ui
        .ctx()
        .data(|d| d.get_temp::<(RasterKey, TextureHandle)>(id));
    if let Some((k, t)) = cached
        && k == key
    {
        return t;
    }
    let t = ui
        .ctx()
        .load_texture("slim_raster", raster_image(v), TextureOptions::NEAREST);
    ui.ctx().data_mut(|d| d.insert_temp(id, (key, t.clone())));
    t
}

fn raster_hover(
    v: &SlimRunView,
    rows: &[Option<(usize, usize)>],
    x: f64,
    y: f64,
) -> Option<String> {
    let steps = v.trace.steps.len();
    if x < 0.0 || y < 0.0 || x >= steps as f64 || y >= rows.len() as f64 {
        return None;
    }
    let k = x.floor() as usize;
    let (i, b) = rows[y.floor() as usize]?;
    Some(format!(
        "decode step {k}, cut {} (layer {}), block {b}\n{}",
        i + 1,
        v.trace.cuts[i].layer,
        v.activity(i, k, b).label()
    ))
}

/// The step × block raster of every cut's active set.
pub fn show_activity(ui: &mut Ui, v: &SlimRunView, height: f32) {
    ui.label("Active blocks by decode step, one band of blocks per cut (cut 1 at the bottom)");
    show_swatches(
        ui,
        &[
            BlockActivity::Active,
            BlockActivity::Entering,
            BlockActivity::Inactive,
            BlockActivity::Absent,
        ]
        .map(|a| (activity_color(a), a.label())),
    );
    let rows = raster_rows(v);
    let steps = v.trace.steps.len();
    if steps == 0 || rows.is_empty() {
        ui.label(RichText::new("no decode steps yet").weak());
        return;
    }
    let tex = raster_texture(ui, v);
    let size = egui::vec2(steps as f32, rows.len() as f32);
    let r = Plot::new("slim_raster")
        .height(height)
        .allow_boxed_zoom(false)
        .include_x(0.0)
        .include_x(steps as f64)
        .include_y(0.0)
        .include_y(rows.len() as f64)
        .x_axis_label("decode step")
        .y_axis_label("cut · block")
        .label_formatter(|_| None)
        .show(ui, |pui| {
            let center = PlotPoint::new(size.x as f64 / 2.0, size.y as f64 / 2.0);
            pui.image(PlotImage::new("active sets", tex.id(), center, size));
            pui.pointer_coordinate()
        });
    if let Some(p) = r.inner
        && r.response.hovered()
        && let Some(text) = raster_hover(v, &rows, p.x, p.y)
    {
        r.response.on_hover_text_at_pointer(text);
    }
}

/// Every cut's overlap ratio over decode steps, the swaps as points, γ as
/// a line.
pub fn show_overlap(ui: &mut Ui, v: &SlimRunView, height: f32) {
    ui.label(format!(
        "Overlap of the candidate blocks with the active ones per decode step; below γ = {} the candidates replace the active set (dots: swaps)",
        v.gamma
    ));
    Plot::new("slim_overlap")
        .height(height)
        .legend(Legend::default().position(Corner::RightBottom))
        .allow_boxed_zoom(false)
        .include_y(0.0)
        .include_y(1.05)
        .include_x(0.0)
        .x_axis_label("decode step")
        .y_axis_label("overlap")
        .show(ui, |pui| {
            for i in 0..v.trace.cuts.len() {
                let color = SERIES[i % SERIES.len()];
                let name = format!("cut {} (layer {})", i + 1, v.trace.cuts[i].layer);
                let series = v.overlap_series(i);
                let swaps: Vec<[f64; 2]> = v
                    .swap_steps(i)
                    .into_iter()
                    .filter_map(|k| series.get(k).copied())
                    .collect();
                pui.line(Line::new(name.clone(), PlotPoints::from(series)).color(color));
                pui.points(Points::new(name, swaps).color(color).radius(3.0));
            }
            pui.hline(
                HLine::new(format!("γ = {}", v.gamma), v.gamma)
                    .color(DECODE)
                    .style(LineStyle::dashed_loose())
                    .width(1.5),
            );
        });
}

/// One line about the run: cuts, kept tokens, block size, γ, L_eq and the
/// latest step's resident K/V.
pub fn slim_summary(v: &SlimRunView) -> String {
    let cuts: Vec<String> = v
        .trace
        .cuts
        .iter()
        .map(|c| format!("layer {} keeps {}", c.layer, c.kept_tokens))
        .collect();
    let resident = v.trace.steps.last().map_or(String::new(), |s| {
        let b = v.trace.bytes_per_token_layer;
        format!(
            " · now {} resident of {} held",
            human_bytes(b * s.resident_token_layers as u64),
            human_bytes(b * s.held_token_layers as u64)
        )
    });
    format!(
        "SlimInfer {}: {} sink + {} prunable prompt tokens in blocks of {}; {}; γ = {}; \
         SPEED with the same prompt K/V: L_cut {:.1}{resident}",
        v.policy,
        v.trace.sink_tokens,
        v.trace.prefill_tokens,
        v.trace.block,
        cuts.join(", "),
        v.gamma,
        v.trace.equal_kv_cutoff,
    )
}

/// The SlimInfer views of a live run: the summary, then existence and
/// scores side by side, then the raster and the overlap curve.
pub fn show_slim_views(ui: &mut Ui, v: &SlimRunView) {
    ui.label(RichText::new(slim_summary(v)).strong());
    let h = 190.0;
    ui.columns(2, |cols| {
        show_existence(&mut cols[0], v, h);
        show_scores(&mut cols[1], v, h - 20.0);
    });
    ui.columns(2, |cols| {
        show_activity(&mut cols[0], v, h);
        show_overlap(&mut cols[1], v, h);
    });
}
