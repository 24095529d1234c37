//! The heatmap view: decode→prefill mass by layer × decode step, attention
//! by layer × prompt position (tokens on hover), prefill mass by layer × head,
//! and the BoS mass in a column of its own (sinks would drown the rest).

use egui::{Color32, ComboBox, RichText, Ui};
use lcut_trace::PromptTrace;

use crate::colormap::{ColorScale, ValueRange, show_legend};
use crate::grid::Grid;
use crate::heatmap::{FixedGrid, HeatmapOptions, PositionGrid, show_heatmap};
use crate::loaded::LoadedReport;
use crate::slim_data::SlimRunView;
use crate::slim_views::{CUT, pruned_rects};
use crate::state::ViewSettings;

/// Colour of the chosen cut's line.
pub const CHOSEN: Color32 = Color32::from_rgb(255, 140, 0);
/// Colour of the recommended cut's line.
pub const RECOMMENDED: Color32 = Color32::from_rgb(230, 230, 230);

/// The cut lines for a heatmap.
pub fn cut_lines(chosen: usize, recommended: usize) -> Vec<(usize, Color32, String, bool)> {
    vec![
        (
            recommended,
            RECOMMENDED,
            format!("recommended L_cut {recommended}"),
            true,
        ),
        (chosen, CHOSEN, format!("chosen L_cut {chosen}"), false),
    ]
}

/// The prompt selector and the colour-scale toggle.
pub fn show_selectors(ui: &mut Ui, loaded: &mut LoadedReport, view: &mut ViewSettings) {
    ui.horizontal(|ui| {
        let label = |i: Option<usize>| match i {
            None => "All prompts (mean)".to_string(),
            Some(i) => {
                let t = &loaded.report.traces[i];
                format!(
                    "{} ({} tokens, {} steps)",
                    t.id,
                    t.prompt_len,
                    t.num_steps()
                )
            }
        };
        let mut choice = loaded.prompt;
        ComboBox::from_label("Prompt")
            .selected_text(label(choice))
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut choice, None, label(None));
                for i in 0..loaded.report.traces.len().min(500) {
                    ui.selectable_value(&mut choice, Some(i), label(Some(i)));
                }
            });
        if choice != loaded.prompt {
            loaded.select(choice);
        }
        ui.separator();
        ui.label("Colour scale:");
        for s in [ColorScale::Linear, ColorScale::Log] {
            ui.radio_value(&mut view.scale, s, s.label());
        }
    });
}

fn step_hover(loaded: &LoadedReport) -> impl Fn(usize, usize, f32) -> String + '_ {
    move |l, k, v| {
        let tok = loaded
            .selected_trace()
            .and_then(|t| t.generated.get(k))
            .map_or(String::new(), |g| format!(" -> {g:?}"));
        format!("layer {l}, decode step {k}{tok}\nprefill mass {v:.4}")
    }
}

/// Whether a live SlimInfer run is of the prompt of `trace` (same depth,
/// length, decode start and, when both are known, tokens), so that its
/// existence mask can lie over the trace's prompt-position map.
pub fn overlay_fits(trace: &PromptTrace, v: &SlimRunView) -> bool {
    let tokens_match = trace.prompt_tokens.is_empty()
        || v.prompt_tokens.is_empty()
        || trace.prompt_tokens == v.prompt_tokens;
    trace.num_layers == v.num_layers
        && trace.prompt_len == v.prompt_len
        && trace.decode_start == v.decode_start()
        && tokens_match
}

/// The overlay switch for a live SlimInfer run, and whether it fits the
/// selected prompt.
fn show_overlay_toggle(
    ui: &mut Ui,
    loaded: &LoadedReport,
    view: &mut ViewSettings,
    v: &SlimRunView,
) {
    ui.horizontal(|ui| {
        ui.checkbox(
            &mut view.slim_overlay,
            format!("Shade what {} prunes (live run)", v.policy),
        );
        let fits = loaded.position_trace().is_some_and(|t| overlay_fits(t, v));
        if view.slim_overlay && !fits {
            ui.label(
                RichText::new(format!(
                    "the live SlimInfer run's prompt ({} tokens) is not the prompt shown here: \
                     run diagnostics on the live prompt (typed) to compare",
                    v.prompt_len
                ))
                .weak(),
            );
        }
    });
}

/// Draws the heatmap view for `loaded`; `slim`, the live view's SlimInfer
/// run, shades what it prunes over the prompt-position map when it ran on
/// the same prompt.
pub fn show_heatmaps(
    ui: &mut Ui,
    loaded: &mut LoadedReport,
    view: &mut ViewSettings,
    slim: Option<&SlimRunView>,
) {
    show_selectors(ui, loaded, view);
    if let Some(v) = slim {
        show_overlay_toggle(ui, loaded, view, v);
    }
    let recommended = loaded.report.recommendation.l_cut;
    let cuts = cut_lines(view.l_cut, recommended);
    let scale = view.scale;
    let h = ((ui.available_height() - 140.0) / 3.0).clamp(110.0, 400.0);
    let key = loaded.data_key;

    // Row 1: BoS apart, then layer × decode step.
    let by_step = loaded.grids.by_step.clone();
    let bos = Grid::column(&loaded.grids.bos);
    let step_range = ValueRange::of(by_step.values.iter().copied(), scale);
    let bos_range = ValueRange::of(bos.values.iter().copied(), scale);
    ui.label(match loaded.prompt {
        Some(_) => "Decode-to-prefill attention mass, layer × decode step (mean over heads)",
        None => {
            "Decode-to-prefill attention mass, layer × decode step (mean over heads and prompts)"
        }
    });
    ui.horizontal(|ui| {
        ui.vertical(|ui| {
            ui.set_width(110.0);
            let src = FixedGrid {
                grid: &bos,
                x0: 0.0,
                hover: |l: usize, _c: usize, v: f32| format!("layer {l}\nBoS mass {v:.4}"),
            };
            let opts = HeatmapOptions {
                id: "heatmap_bos",
                x_label: "BoS",
                height: h,
                range: bos_range,
                data_key: key,
                cuts: cuts.clone(),
                shade: None,
            };
            show_heatmap(ui, &mut loaded.caches.bos, &src, &opts);
        });
        ui.vertical(|ui| {
            let mut cache = std::mem::take(&mut loaded.caches.by_step);
            {
                let hover = step_hover(loaded);
                let src = FixedGrid {
                    grid: &by_step,
                    x0: 0.0,
                    hover,
                };
                let opts = HeatmapOptions {
                    id: "heatmap_step",
                    x_label: "decode step",
                    height: h,
                    range: step_range,
                    data_key: key,
                    cuts: cuts.clone(),
                    shade: None,
                };
                show_heatmap(ui, &mut cache, &src, &opts);
            }
            loaded.caches.by_step = cache;
        });
    });
    ui.horizontal(|ui| {
        show_legend(ui, "BoS mass", &bos_range);
        ui.separator();
        show_legend(ui, "prefill mass", &step_range);
    });

    // Row 2: layer × prompt position.
    let mut pos_cache = std::mem::take(&mut loaded.caches.by_position);
    if let (Some(index), Some(trace)) = (loaded.position.as_ref(), loaded.position_trace()) {
        let [lo, hi] = index.density_bounds();
        let pos_range = ValueRange::of([lo, hi, 0.0], scale);
        ui.label(format!(
            "Attention per prompt token, layer × prompt position (prompt {:?}, {} positions; BoS left out; drag or scroll to pan, ctrl+scroll to zoom)",
            trace.id, trace.prompt_len
        ));
        let src = PositionGrid {
            index,
            tokens: &trace.prompt_tokens,
        };
        let overlay = slim
            .filter(|v| view.slim_overlay && overlay_fits(trace, v))
            .map(|v| (format!("pruned by {}", v.policy), pruned_rects(v)));
        let mut pos_cuts = cuts.clone();
        if let Some(v) = slim.filter(|_| overlay.is_some()) {
            pos_cuts.extend(
                v.cut_layers()
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| (c, CUT, format!("SlimInfer cut {}: layer {c}", i + 1), true)),
            );
        }
        let opts = HeatmapOptions {
            id: "heatmap_position",
            x_label: "prompt position",
            height: h,
            range: pos_range,
            data_key: key ^ 0x5151,
            cuts: pos_cuts,
            shade: overlay,
        };
        show_heatmap(ui, &mut pos_cache, &src, &opts);
        show_legend(ui, "attention per token", &pos_range);
    }

    loaded.caches.by_position = pos_cache;

    // Row 3: layer × head.
    let by_head = &loaded.grids.by_head;
    let head_range = ValueRange::of(by_head.values.iter().copied(), scale);
    ui.label("Decode-to-prefill attention mass, layer × query head (mean over steps)");
    let src = FixedGrid {
        grid: by_head,
        x0: 0.0,
        hover: |l: usize, hd: usize, v: f32| format!("layer {l}, head {hd}\nprefill mass {v:.4}"),
    };
    let opts = HeatmapOptions {
        id: "heatmap_head",
        x_label: "query head",
        height: h,
        range: head_range,
        data_key: key,
        cuts,
        shade: None,
    };
    show_heatmap(ui, &mut loaded.caches.by_head, &src, &opts);
    show_legend(ui, "prefill mass", &head_range);
}
