//! The routing view of a mixture-of-experts model's report: the run's
//! routing in a sentence, the layer × expert load heatmap (the share of the
//! decode tokens' top-k slots each expert takes), the router's normalised
//! entropy and the compared policy's top-k overlap with the full model per
//! layer, the sweep's overlap per cut when the report has a sweep, and the
//! layers as a table. Shown only for a report whose model routes; with one
//! prompt selected, that prompt's routing.

use egui::{RichText, ScrollArea, Ui};
use egui_plot::{Legend, Line, MarkerShape, Plot, PlotPoints, Points, VLine};
use lcut_trace::{Indexing, RoutingCurves, Sweep, SweepPoint};

use crate::colormap::{ColorScale, ValueRange, show_legend};
use crate::grid::Grid;
use crate::heatmap::{FixedGrid, HeatmapOptions, show_heatmap};
use crate::heatmap_view::{cut_lines, show_selectors};
use crate::loaded::LoadedReport;
use crate::settings::ViewSettings;
use crate::theme::{CHOSEN, RECOMMENDED, SERIES, chosen_label, metric_colour, recommended_label};

/// What the view says when the report's model has no experts.
pub const NO_ROUTING: &str =
    "This report's model has no experts: only a mixture-of-experts model routes its tokens.";

/// Whether a report's curves hold routing (the view is offered only then).
pub fn has_routing(loaded: &LoadedReport) -> bool {
    loaded.report.curves.routing.is_some()
}

/// The busiest expert of `layer` and its share of the top-k slots.
pub fn busiest_expert(c: &RoutingCurves, layer: usize) -> Option<(usize, f32)> {
    let load = c.load.view();
    (0..c.num_experts)
        .map(|x| (x, load[[layer, x]]))
        .filter(|(_, v)| v.is_finite())
        .reduce(|a, b| if b.1 > a.1 { b } else { a })
}

/// Draws the routing view of `loaded` (its selected prompt, or every prompt).
pub fn show_routing(ui: &mut Ui, loaded: &mut LoadedReport, view: &mut ViewSettings) {
    show_selectors(ui, loaded, view);
    let Some(c) = loaded.curves.routing.clone() else {
        ui.label(NO_ROUTING);
        return;
    };
    if let Some(line) = lcut_report::routing_sentence(&loaded.report) {
        ui.label(line);
    }
    let (chosen, recommended) = (view.l_cut, loaded.report.recommendation.l_cut);
    let height = ((ui.available_height() - 160.0) / 3.0).clamp(120.0, 360.0);
    ScrollArea::vertical()
        .id_salt("routing_scroll")
        .show(ui, |ui| {
            show_load(ui, loaded, &c, (chosen, recommended), height);
            ui.separator();
            show_by_layer(ui, &c, (chosen, recommended), height);
            if let Some(sweep) = loaded
                .report
                .sweep
                .as_ref()
                .filter(|s| s.points.iter().any(|p| p.routing_overlap.is_some()))
            {
                ui.separator();
                show_sweep_overlap(ui, sweep, chosen, height);
            }
            ui.separator();
            show_table(ui, &c);
        });
}

/// The layer × expert load heatmap, with the cut lines.
fn show_load(
    ui: &mut Ui,
    loaded: &mut LoadedReport,
    c: &RoutingCurves,
    (chosen, recommended): (usize, usize),
    height: f32,
) {
    ui.label(format!(
        "Expert load, layer × expert: share of the decode tokens' top-k slots ({} tokens, top \
         {} of {}; an even load is {:.3}; grey rows are dense layers)",
        c.tokens,
        c.top_k,
        c.num_experts,
        1.0 / c.num_experts as f32
    ));
    let grid = Grid::from_tensor(&c.load);
    let range = ValueRange::of(grid.values.iter().copied(), ColorScale::Linear);
    let src = FixedGrid {
        grid: &grid,
        x0: 0.0,
        hover: |l: usize, x: usize, v: f32| format!("layer {l}, expert {x}\nload {v:.3}"),
    };
    let opts = HeatmapOptions {
        id: "heatmap_routing_load",
        x_label: "expert",
        height,
        range,
        data_key: loaded.data_key ^ 0x7075,
        cuts: cut_lines(chosen, recommended),
        shade: None,
    };
    show_heatmap(ui, &mut loaded.caches.routing_load, &src, &opts);
    show_legend(ui, "load", &range);
}

/// The cut lines of a per-layer plot.
fn cut_vlines(pui: &mut egui_plot::PlotUi<'_>, chosen: usize, recommended: usize) {
    pui.vline(
        VLine::new(recommended_label(recommended), recommended as f64)
            .color(RECOMMENDED)
            .style(egui_plot::LineStyle::dashed_loose()),
    );
    pui.vline(VLine::new(chosen_label(chosen), chosen as f64).color(CHOSEN));
}

/// The router's entropy and the overlap with the full model per layer.
fn show_by_layer(
    ui: &mut Ui,
    c: &RoutingCurves,
    (chosen, recommended): (usize, usize),
    height: f32,
) {
    ui.label(match &c.policy {
        Some(p) => format!(
            "Per layer: the router's entropy / ln {} (1 = every expert alike) and the top-k \
             overlap of {p} with the full model on the same tokens (1 = the same experts)",
            c.num_experts
        ),
        None => format!(
            "Per layer: the router's entropy / ln {} (1 = every expert alike); no policy was \
             compared (`lcut diagnose --routing-policy P` adds the overlap)",
            c.num_experts
        ),
    });
    let line = |name: &str, series: &[f32], colour| {
        let pts: Vec<[f64; 2]> = series
            .iter()
            .enumerate()
            .filter(|(_, y)| y.is_finite())
            .map(|(l, &y)| [Indexing::Layer.boundary_x(l), f64::from(y)])
            .collect();
        (
            Line::new(name.to_string(), PlotPoints::new(pts.clone())).color(colour),
            Points::new(name.to_string(), PlotPoints::new(pts))
                .color(colour)
                .radius(3.0),
        )
    };
    Plot::new("routing_by_layer")
        .height(height)
        .legend(Legend::default())
        .x_axis_label("layer")
        .y_axis_label("H / ln(experts) · top-k overlap")
        .include_y(0.0)
        .include_y(1.0)
        .show(ui, |pui| {
            let (l, p) = line(
                "router entropy",
                &c.entropy,
                metric_colour("routing_entropy"),
            );
            pui.line(l);
            pui.points(p);
            if !c.overlap.is_empty() {
                let name = format!("overlap with full ({})", c.policy.as_deref().unwrap_or(""));
                let (l, p) = line(&name, &c.overlap, metric_colour("routing_overlap"));
                pui.line(l);
                pui.points(p);
            }
            cut_vlines(pui, chosen, recommended);
        });
}

/// The sweep's overlap per cut, one line per anchor setting, the chosen
/// cut marked.
fn show_sweep_overlap(ui: &mut Ui, sweep: &Sweep, chosen: usize, height: f32) {
    ui.label(
        "Sweep: mean top-k overlap of the decode tokens' experts with the full model's, per \
         SPEED cut (teacher-forced on the full model's continuation)",
    );
    let mut anchors: Vec<String> = sweep.points.iter().map(SweepPoint::anchors_label).collect();
    anchors.sort_unstable();
    anchors.dedup();
    Plot::new("routing_sweep")
        .height(height)
        .legend(Legend::default())
        .x_axis_label("L_cut")
        .y_axis_label("mean top-k overlap")
        .include_y(1.0)
        .show(ui, |pui| {
            for (i, a) in anchors.iter().enumerate() {
                let mut pts: Vec<[f64; 2]> = sweep
                    .points
                    .iter()
                    .filter(|p| p.anchors_label() == *a)
                    .filter_map(|p| Some([p.l_cut()? as f64, f64::from(p.routing_overlap?)]))
                    .collect();
                pts.sort_by(|x, y| x[0].total_cmp(&y[0]));
                let colour = SERIES[i % SERIES.len()];
                let name = format!("anchors {a}");
                pui.line(Line::new(name.clone(), PlotPoints::new(pts.clone())).color(colour));
                pui.points(
                    Points::new(name, PlotPoints::new(pts))
                        .color(colour)
                        .radius(3.0),
                );
            }
            let at: Vec<[f64; 2]> = sweep
                .points
                .iter()
                .filter(|p| p.l_cut() == Some(chosen))
                .filter_map(|p| Some([chosen as f64, f64::from(p.routing_overlap?)]))
                .collect();
            pui.points(
                Points::new(chosen_label(chosen), PlotPoints::new(at))
                    .color(CHOSEN)
                    .radius(7.0)
                    .shape(MarkerShape::Diamond),
            );
        });
}

/// One row per sparse layer: entropy, overlap, the busiest expert.
fn show_table(ui: &mut Ui, c: &RoutingCurves) {
    egui::Grid::new("routing_rows")
        .striped(true)
        .num_columns(4)
        .show(ui, |ui| {
            for h in ["layer", "entropy", "overlap with full", "busiest expert"] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for &l in &c.sparse_layers {
                ui.label(format!("layer {l}"));
                ui.label(format!("{:.3}", c.entropy[l]));
                ui.label(match c.overlap.get(l) {
                    Some(o) if o.is_finite() => format!("{o:.3}"),
                    _ => "–".to_string(),
                });
                ui.label(match busiest_expert(c, l) {
                    Some((x, share)) => format!("expert {x}: {share:.3}"),
                    None => "–".to_string(),
                });
                ui.end_row();
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_expert_is_the_largest_share_of_a_sparse_layer() {
        let r = lcut_diag::synthetic::synthetic_moe_report(2, 4, 2, false).unwrap();
        let c = r.curves.routing.unwrap();
        for &l in &c.sparse_layers {
            let (x, share) = busiest_expert(&c, l).unwrap();
            let row = c.load.view().row(l).to_vec();
            assert!(row.iter().all(|&v| v <= share) && row[x] == share);
        }
        assert_eq!(busiest_expert(&c, 1), None, "layer 1 is dense");
    }
}
