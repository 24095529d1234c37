//! The head view: the layer × query head heatmap of decode-to-prefill mass
//! (mean over the report's prompts), where a click above the chosen cut
//! picks the clicked query head's K/V head (its whole group, outlined),
//! what the picks cost in K/V against full and SPEED+BoS and how much of
//! the mass they keep, the budget that fills the picks with the plan
//! `lcut recommend` makes, and "Run beside full". State: [`crate::head_picks`].

use egui::{DragValue, RichText, ScrollArea, Stroke, TextEdit, Ui};
use egui_plot::{PlotUi, Polygon, VLine};
use lcut_diag::{PromptShape, PromptSplit, kv_share};

use crate::colormap::{ValueRange, show_legend};
use crate::cost_panel::kv_bytes;
use crate::head_data::{HeadData, PickCost};
use crate::head_picks::HeadPicks;
use crate::heatmap::{FixedGrid, HeatmapOptions, show_heatmap_with};
use crate::heatmap_view::cut_lines;
use crate::loaded::LoadedReport;
use crate::settings::CostSettings;
use crate::state::ViewerState;
use crate::theme::{ERROR_TEXT, GROUP_LINE, PICKED, human_bytes};

/// The outline of each picked pair: its layer's row across its group's
/// query heads, `[x0, x1, y0, y1]` in the heatmap's coordinates.
pub fn picked_rects(data: &HeadData, picks: &HeadPicks) -> Vec<[f64; 4]> {
    picks
        .picked
        .iter()
        .map(|&(l, kv)| {
            let q = data.query_heads(kv);
            [q.start as f64, q.end as f64, l as f64, l as f64 + 1.0]
        })
        .collect()
}

/// The hover text of query head `q` at `layer` with value `v`.
fn hover_text(
    data: &HeadData,
    picks: &HeadPicks,
    cut: usize,
    layer: usize,
    q: usize,
    v: f32,
) -> String {
    let kv = data.kv_of(q);
    let mass = data.masses.get(layer).and_then(|r| r.get(kv)).copied();
    let state = if layer < cut {
        "below the cut: keeps the whole prompt".to_string()
    } else if picks.picked.contains(&(layer, kv)) {
        format!("picked: K/V head {kv} keeps the prompt (click to drop)")
    } else {
        let g = data.query_heads(kv);
        format!(
            "click to keep K/V head {kv} (query heads {}..{})",
            g.start,
            g.end - 1
        )
    };
    format!(
        "layer {layer}, query head {q} (K/V head {kv})\nprefill mass {v:.4}, K/V head {kv}: {:.4}\n{state}",
        mass.unwrap_or(f64::NAN)
    )
}

/// The group lines and the picked outlines, drawn over the heatmap.
fn overlay(pui: &mut PlotUi<'_>, data: &HeadData, rects: &[[f64; 4]]) {
    if data.group() > 1 {
        for k in 1..data.kv_heads {
            let x = (k * data.group()) as f64;
            pui.vline(
                VLine::new(format!("K/V group {k}"), x)
                    .color(GROUP_LINE)
                    .width(1.0),
            );
        }
    }
    for &[x0, x1, y0, y1] in rects {
        pui.polygon(
            Polygon::new("picked", vec![[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
                .fill_color(egui::Color32::TRANSPARENT)
                .stroke(Stroke::new(2.5, PICKED)),
        );
    }
}

/// The heatmap; a click above the cut picks or drops a pair.
fn show_map(
    ui: &mut Ui,
    loaded: &LoadedReport,
    picks: &mut HeadPicks,
    data: &HeadData,
    cut: usize,
) {
    let range = ValueRange::of(
        data.grid.values.iter().copied(),
        crate::colormap::ColorScale::Log,
    );
    let rects = picked_rects(data, picks);
    let mut cache = std::mem::take(&mut picks.cache);
    let r = {
        let picks_now: &HeadPicks = picks;
        let src = FixedGrid {
            grid: &data.grid,
            x0: 0.0,
            hover: |l: usize, q: usize, v: f32| hover_text(data, picks_now, cut, l, q, v),
        };
        let opts = HeatmapOptions {
            id: "heatmap_heads",
            x_label: "query head (lines between K/V groups)",
            height: (ui.available_height() - 60.0).clamp(160.0, 640.0),
            range,
            data_key: loaded.data_key,
            cuts: cut_lines(cut, loaded.report.recommendation.l_cut),
            shade: None,
        };
        show_heatmap_with(ui, &mut cache, &src, &opts, |pui| {
            overlay(pui, data, &rects)
        })
    };
    picks.cache = cache;
    picks.transform = Some(r.transform);
    if r.response.clicked()
        && let Some(p) = r.pointer
        && p.x >= 0.0
        && p.y >= 0.0
    {
        // a refusal is kept in `picks.refused` and shown below
        let _ = picks.click(data, cut, p.y.floor() as usize, p.x.floor() as usize);
    }
    show_legend(ui, "prefill mass", &range);
}

/// The K/V bytes of the picks at the cost panel's context length: held,
/// and the full model's.
fn bytes_at_context(
    loaded: &LoadedReport,
    data: &HeadData,
    cut: usize,
    kept: usize,
    s: &CostSettings,
) -> (u64, u64) {
    let (_, full) = kv_bytes(&loaded.report.model, cut, s);
    let split = PromptSplit::raw(s.context_len.max(1), 1);
    let shape = PromptShape {
        anchors: split.anchors as f64,
        prefill: split.prefill as f64,
        decode: (split.decode + s.new_tokens) as f64,
    };
    let share = kv_share(data.layers, data.kv_heads, cut, kept, &shape);
    ((share * full as f64).round() as u64, full)
}

/// What the picks cost and keep.
fn show_cost(ui: &mut Ui, data: &HeadData, c: &PickCost, cut: usize, bytes: (u64, u64)) {
    ui.label(format!(
        "L_cut {cut} of {}: {} (layer, K/V head) pairs picked above it",
        data.layers, c.kept
    ));
    ui.label(format!(
        "K/V share with the picks: {:.4} of full",
        c.kv_share
    ));
    ui.label(format!(
        "K/V share of SPEED+BoS at L_cut {cut}: {:.4}",
        c.speed_share
    ));
    ui.label(format!(
        "Decode-to-prefill mass kept: {:.3} (SPEED+BoS at L_cut {cut}: {:.3})",
        c.mass_kept, c.speed_mass_kept
    ));
    ui.label(format!(
        "SPEED+BoS within the same K/V: L_cut {}, keeps {:.3} of the mass",
        c.equal_cut, c.equal_mass_kept
    ));
    ui.label(format!(
        "K/V at the cost panel's context: {} of {} (full)",
        human_bytes(bytes.0),
        human_bytes(bytes.1)
    ));
    if let Some(a) = data.expected_accuracy(c.mass_kept) {
        ui.label(format!(
            "Expected accuracy from the sweep's suite calibration: {a:.3}"
        ));
    }
    ui.label(
        RichText::new(format!(
            "Shares for the report's mean prompt: {:.0} anchor, {:.0} prefill and {:.0} decode-phase tokens",
            data.shape.anchors, data.shape.prefill, data.shape.decode
        ))
        .weak(),
    );
}

/// The picks as a list.
fn show_list(ui: &mut Ui, picks: &HeadPicks) {
    let list = match picks.picked.is_empty() {
        true => "none".to_string(),
        false => picks
            .picked
            .iter()
            .map(|(l, h)| format!("({l}, {h})"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    ui.label(format!("Picked (layer, K/V head): {list}"));
}

/// The budget field and its plan; returns the plan's cut when filled.
fn show_budget(ui: &mut Ui, picks: &mut HeadPicks, data: &HeadData) -> Option<usize> {
    let mut cut = None;
    ui.horizontal(|ui| {
        let l = ui.label("K/V budget");
        ui.add(
            DragValue::new(&mut picks.budget)
                .range(0.01..=1.0)
                .speed(0.005)
                .fixed_decimals(3),
        )
        .labelled_by(l.id)
        .on_hover_text("the share of the full model's K/V to keep");
        if ui
            .button("Fill from budget")
            .on_hover_text(
                "the cut and the pairs above it that keep the most decode-to-prefill mass \
                 within the budget (lcut recommend --kv-budget)",
            )
            .clicked()
        {
            cut = picks.fill_from_budget(data).ok();
        }
        if ui.button("Clear picks").clicked() {
            picks.clear();
        }
    });
    if let Some(p) = &picks.plan {
        ui.label(format!(
            "Plan for {:.3}: L_cut {} + {} pairs hold {:.4} of full's K/V and keep {:.3} of the mass \
             (SPEED+BoS within the budget: L_cut {}, {:.3})",
            picks.budget,
            p.cut,
            p.heads.len(),
            p.kv_share,
            p.mass_kept,
            p.speed_cut,
            p.speed_mass_kept
        ));
    }
    cut
}

/// The head file's folder, "Run beside full" and what it wrote.
fn show_run(ui: &mut Ui, state: &mut ViewerState, equal_cut: usize) {
    ui.horizontal(|ui| {
        let l = ui.label("Head file folder");
        ui.add(TextEdit::singleline(&mut state.heads.folder).desired_width(260.0))
            .labelled_by(l.id);
    });
    let blocked = state.heads_run_blocked();
    let go = ui
        .add_enabled(blocked.is_none(), egui::Button::new("Run beside full"))
        .on_hover_text(format!(
            "write the picks as a head file and generate with speed:{}+bos+heads:FILE beside \
             the full model and SPEED+BoS at L_cut {equal_cut} (the same K/V), in the Live view",
            state.view.l_cut
        ))
        .clicked();
    if let Some(why) = blocked {
        ui.label(RichText::new(why).weak());
    }
    if let Some(p) = &state.heads.written {
        ui.label(format!("Head file: {}", p.display()));
    }
    if go {
        state.run_heads();
    }
}

/// The head view of the report on display.
pub fn show_heads(ui: &mut Ui, state: &mut ViewerState) {
    let Some(loaded) = state.loaded.as_ref() else {
        return;
    };
    state.heads.refresh(loaded);
    let data = match &state.heads.data {
        Some(Ok(d)) => d.clone(),
        Some(Err(e)) => {
            ui.label(RichText::new(format!("cannot pick heads: {e}")).color(ERROR_TEXT));
            return;
        }
        None => return,
    };
    let cut = state.view.l_cut.clamp(1, data.layers.max(1));
    let dropped = state.heads.drop_below(cut);
    if dropped > 0 {
        state.heads.refused = Some(format!(
            "the cut moved to {cut}: {dropped} picked pairs below it were dropped"
        ));
    }
    ui.label(
        "Click a cell above the chosen cut to keep its K/V head reading the prompt (the whole \
         group of query heads that share it, outlined); click again to drop it. Mean over the \
         report's prompts.",
    );
    let pairs = state.heads.pairs();
    let c = data.cost(cut, &pairs);
    let bytes = bytes_at_context(loaded, &data, cut, c.kept, &state.cost);
    let mut new_cut = None;
    ui.columns(2, |cols| {
        let loaded = state.loaded.as_ref();
        if let Some(loaded) = loaded {
            show_map(&mut cols[0], loaded, &mut state.heads, &data, cut);
        }
        ScrollArea::vertical()
            .id_salt("heads_scroll")
            .show(&mut cols[1], |ui| {
                ui.heading("Heads above the cut");
                show_cost(ui, &data, &c, cut, bytes);
                show_list(ui, &state.heads);
                if let Some(r) = &state.heads.refused {
                    ui.label(RichText::new(r).color(ERROR_TEXT));
                }
                ui.separator();
                new_cut = show_budget(ui, &mut state.heads, &data);
                ui.separator();
                show_run(ui, state, c.equal_cut);
            });
    });
    if let Some(cut) = new_cut {
        state.view.l_cut = cut;
    }
}
