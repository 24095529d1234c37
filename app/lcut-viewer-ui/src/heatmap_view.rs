//! The heatmap view: decode→prefill mass by layer × decode step, attention
//! by layer × prompt position (tokens on hover), prefill mass by layer × head,
//! and the BoS mass in a column of its own (sinks would drown the rest).

use egui::{ComboBox, RichText, Ui};
use lcut_trace::PromptTrace;

use crate::colormap::{ColorScale, ValueRange, show_legend};
use crate::grid::Grid;
use crate::heatmap::{CutLine, FixedGrid, HeatmapOptions, PositionGrid, show_heatmap};
use crate::loaded::LoadedReport;
use crate::settings::ViewSettings;
use crate::slim_data::SlimRunView;
use crate::slim_views::pruned_rects;
use crate::theme::{CHOSEN, CUT, RECOMMENDED, chosen_label, recommended_label};

/// The cut lines for a heatmap.
pub fn cut_lines(chosen: usize, recommended: usize) -> Vec<CutLine> {
    vec![
        (
            recommended,
            RECOMMENDED,
            recommended_label(recommended),
            true,
        ),
        (chosen, CHOSEN, chosen_label(chosen), false),
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
        match loaded.report.curves.state_split_layers.contains(&l) {
            true => format!(
                "layer {l} (linear attention), decode step {k}{tok}\nprompt's share of the output {v:.4}"
            ),
            false => format!("layer {l}, decode step {k}{tok}\nprefill mass {v:.4}"),
        }
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

/// What every heatmap of one frame shares: the cut lines, the colour
/// scale, the height and the data key.
struct Frame {
    cuts: Vec<CutLine>,
    scale: ColorScale,
    height: f32,
    key: u64,
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
    let frame = Frame {
        cuts: cut_lines(view.l_cut, loaded.report.recommendation.l_cut),
        scale: view.scale,
        height: ((ui.available_height() - 140.0) / 3.0).clamp(110.0, 400.0),
        key: loaded.data_key,
    };
    show_step_row(ui, loaded, &frame);
    let slim = slim.filter(|_| view.slim_overlay);
    show_position_row(ui, loaded, &frame, slim);
    show_head_row(ui, loaded, &frame);
}

/// Row 1: BoS apart (and a learned sink's share beside it, where the model
/// has sinks), then layer × decode step.
fn show_step_row(ui: &mut Ui, loaded: &mut LoadedReport, frame: &Frame) {
    let by_step = loaded.grids.by_step.clone();
    let bos = Grid::column(&loaded.grids.bos);
    let sink = loaded.grids.sink.as_deref().map(Grid::column);
    let step_range = ValueRange::of(by_step.values.iter().copied(), frame.scale);
    let bos_range = ValueRange::of(bos.values.iter().copied(), frame.scale);
    let sink_range = sink
        .as_ref()
        .map(|s| ValueRange::of(s.values.iter().copied(), frame.scale));
    ui.label(match loaded.prompt {
        Some(_) => "Decode-to-prefill attention mass, layer × decode step (mean over heads)",
        None => {
            "Decode-to-prefill attention mass, layer × decode step (mean over heads and prompts)"
        }
    });
    let opts = |id, x_label, range| HeatmapOptions {
        id,
        x_label,
        height: frame.height,
        range,
        data_key: frame.key,
        cuts: frame.cuts.clone(),
        shade: None,
    };
    ui.horizontal(|ui| {
        ui.vertical(|ui| {
            ui.set_width(110.0);
            let src = FixedGrid {
                grid: &bos,
                x0: 0.0,
                hover: |l: usize, _c: usize, v: f32| format!("layer {l}\nBoS mass {v:.4}"),
            };
            let opts = opts("heatmap_bos", "BoS", bos_range);
            show_heatmap(ui, &mut loaded.caches.bos, &src, &opts);
        });
        if let (Some(sink), Some(range)) = (&sink, sink_range) {
            ui.vertical(|ui| {
                ui.set_width(110.0);
                let src = FixedGrid {
                    grid: sink,
                    x0: 0.0,
                    hover: |l: usize, _c: usize, v: f32| format!("layer {l}\nsink share {v:.4}"),
                };
                let opts = opts("heatmap_sink", "sink", range);
                show_heatmap(ui, &mut loaded.caches.sink, &src, &opts);
            });
        }
        ui.vertical(|ui| {
            let mut cache = std::mem::take(&mut loaded.caches.by_step);
            {
                let hover = step_hover(loaded);
                let src = FixedGrid {
                    grid: &by_step,
                    x0: 0.0,
                    hover,
                };
                let opts = opts("heatmap_step", "decode step", step_range);
                show_heatmap(ui, &mut cache, &src, &opts);
            }
            loaded.caches.by_step = cache;
        });
    });
    let linear = &loaded.report.curves.state_split_layers;
    if !linear.is_empty() {
        let list: Vec<String> = linear.iter().map(usize::to_string).collect();
        ui.label(format!(
            "Layers {} are linear-attention layers: no attention rows, so their rows show the \
             prompt's share of the layer's output (the state split), BoS included.",
            list.join(", ")
        ));
    }
    ui.horizontal(|ui| {
        show_legend(ui, "BoS mass", &bos_range);
        ui.separator();
        if let Some(range) = &sink_range {
            show_legend(ui, "sink share (no key)", range);
            ui.separator();
        }
        show_legend(ui, "prefill mass", &step_range);
    });
}

/// The pruned regions of a live SlimInfer run of the shown prompt, and
/// its cut lines, for the prompt-position map (`None` when it does not fit).
fn slim_overlay(
    trace: &PromptTrace,
    slim: Option<&SlimRunView>,
) -> Option<(ShadedRegions, Vec<CutLine>)> {
    let v = slim.filter(|v| overlay_fits(trace, v))?;
    let cuts = v
        .cut_layers()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c, CUT, format!("SlimInfer cut {}: layer {c}", i + 1), true))
        .collect();
    Some(((format!("pruned by {}", v.policy), pruned_rects(v)), cuts))
}

/// Regions shaded over a heatmap, with their name.
type ShadedRegions = (String, Vec<[f64; 4]>);

/// Row 2: layer × prompt position, with a live SlimInfer run's pruned
/// regions shaded when `slim` is of the prompt shown.
fn show_position_row(
    ui: &mut Ui,
    loaded: &mut LoadedReport,
    frame: &Frame,
    slim: Option<&SlimRunView>,
) {
    let mut pos_cache = std::mem::take(&mut loaded.caches.by_position);
    if let (Some(index), Some(trace)) = (loaded.position.as_ref(), loaded.position_trace()) {
        let [lo, hi] = index.density_bounds();
        let pos_range = ValueRange::of([lo, hi, 0.0], frame.scale);
        ui.label(format!(
            "Attention per prompt token, layer × prompt position (prompt {:?}, {} positions; BoS left out; drag or scroll to pan, ctrl+scroll to zoom)",
            trace.id, trace.prompt_len
        ));
        let src = PositionGrid {
            index,
            tokens: &trace.prompt_tokens,
        };
        let mut cuts = frame.cuts.clone();
        let shade = slim_overlay(trace, slim).map(|(shade, slim_cuts)| {
            cuts.extend(slim_cuts);
            shade
        });
        let opts = HeatmapOptions {
            id: "heatmap_position",
            x_label: "prompt position",
            height: frame.height,
            range: pos_range,
            data_key: frame.key ^ 0x5151,
            cuts,
            shade,
        };
        show_heatmap(ui, &mut pos_cache, &src, &opts);
        show_legend(ui, "attention per token", &pos_range);
    }
    loaded.caches.by_position = pos_cache;
}

/// Row 3: layer × head.
fn show_head_row(ui: &mut Ui, loaded: &mut LoadedReport, frame: &Frame) {
    let by_head = &loaded.grids.by_head;
    let head_range = ValueRange::of(by_head.values.iter().copied(), frame.scale);
    ui.label("Decode-to-prefill attention mass, layer × query head (mean over steps)");
    let src = FixedGrid {
        grid: by_head,
        x0: 0.0,
        hover: |l: usize, hd: usize, v: f32| format!("layer {l}, head {hd}\nprefill mass {v:.4}"),
    };
    let opts = HeatmapOptions {
        id: "heatmap_head",
        x_label: "query head",
        height: frame.height,
        range: head_range,
        data_key: frame.key,
        cuts: frame.cuts.clone(),
        shade: None,
    };
    show_heatmap(ui, &mut loaded.caches.by_head, &src, &opts);
    show_legend(ui, "prefill mass", &head_range);
}
