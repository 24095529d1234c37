//! The sweep panel: teacher-forced quality against cost for every measured
//! cut, one line per anchor setting, with the knee and the chosen cut marked,
//! and the points in a table (click a row to choose its cut).

use egui::{Color32, ScrollArea, Ui};
use egui_plot::{Legend, Line, MarkerShape, Plot, PlotPoints, Points};
use lcut_trace::Sweep;

use crate::heatmap_view::CHOSEN;

/// Which cost the x axis shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SweepAxis {
    /// K/V bytes over the full model's.
    #[default]
    KvRatio,
    /// Prefill FLOPs over the full model's.
    PrefillRatio,
}

/// Draws the sweep (or says that none was run) and lets a row choose `l_cut`.
pub fn show_sweep(ui: &mut Ui, sweep: Option<&Sweep>, l_cut: &mut usize, axis: &mut SweepAxis) {
    let Some(sweep) = sweep else {
        ui.label("No sweep in this report: run `lcut sweep` (or `lcut diagnose --sweep`) to measure quality against cost across L_cut.");
        return;
    };
    ui.horizontal(|ui| {
        ui.label(format!(
            "Quality vs cost at context length {}; knee: {}",
            sweep.context_len,
            sweep
                .knee
                .map_or("none".to_string(), |k| format!("L_cut {k}"))
        ));
        ui.separator();
        ui.label("Cost axis:");
        ui.radio_value(axis, SweepAxis::KvRatio, "KV ratio");
        ui.radio_value(axis, SweepAxis::PrefillRatio, "Prefill ratio");
    });
    let x_of = |p: &lcut_trace::SweepPoint| match axis {
        SweepAxis::KvRatio => f64::from(p.kv_ratio),
        SweepAxis::PrefillRatio => f64::from(p.prefill_ratio),
    };
    let mut anchor_sets: Vec<&str> = sweep.points.iter().map(|p| p.anchors.as_str()).collect();
    anchor_sets.sort_unstable();
    anchor_sets.dedup();
    let colors = [
        Color32::from_rgb(80, 160, 255),
        Color32::from_rgb(90, 200, 90),
    ];
    let h = (ui.available_height() * 0.55).clamp(160.0, 420.0);
    let chosen = *l_cut;
    Plot::new("sweep_plot")
        .height(h)
        .legend(Legend::default())
        .x_axis_label(match axis {
            SweepAxis::KvRatio => "KV bytes / full",
            SweepAxis::PrefillRatio => "prefill FLOPs / full",
        })
        .y_axis_label("top-1 agreement with full")
        .show(ui, |pui| {
            for (i, a) in anchor_sets.iter().enumerate() {
                let mut pts: Vec<[f64; 2]> = sweep
                    .points
                    .iter()
                    .filter(|p| p.anchors == *a)
                    .map(|p| [x_of(p), f64::from(p.top1_agreement)])
                    .collect();
                pts.sort_by(|x, y| x[0].total_cmp(&y[0]));
                let color = colors[i % colors.len()];
                pui.line(
                    Line::new(format!("anchors {a}"), PlotPoints::new(pts.clone())).color(color),
                );
                pui.points(
                    Points::new(format!("anchors {a}"), PlotPoints::new(pts))
                        .color(color)
                        .radius(3.0),
                );
            }
            let mark = |c: usize| -> Vec<[f64; 2]> {
                sweep
                    .points
                    .iter()
                    .filter(|p| p.l_cut == c)
                    .map(|p| [x_of(p), f64::from(p.top1_agreement)])
                    .collect()
            };
            pui.points(
                Points::new(
                    format!("chosen L_cut {chosen}"),
                    PlotPoints::new(mark(chosen)),
                )
                .color(CHOSEN)
                .radius(7.0)
                .shape(MarkerShape::Diamond),
            );
            if let Some(k) = sweep.knee {
                pui.points(
                    Points::new(format!("knee L_cut {k}"), PlotPoints::new(mark(k)))
                        .color(Color32::RED)
                        .radius(7.0)
                        .filled(false)
                        .shape(MarkerShape::Circle),
                );
            }
        });
    ScrollArea::vertical()
        .id_salt("sweep_table")
        .show(ui, |ui| {
            egui::Grid::new("sweep_rows")
                .striped(true)
                .num_columns(7)
                .show(ui, |ui| {
                    for h in [
                        "L_cut",
                        "anchors",
                        "top-1",
                        "KL",
                        "NLL",
                        "KV ratio",
                        "prefill ratio",
                    ] {
                        ui.strong(h);
                    }
                    ui.end_row();
                    for p in &sweep.points {
                        if ui
                            .selectable_label(p.l_cut == *l_cut, p.l_cut.to_string())
                            .clicked()
                        {
                            *l_cut = p.l_cut;
                        }
                        ui.label(&p.anchors);
                        ui.label(format!("{:.3}", p.top1_agreement));
                        ui.label(format!("{:.4}", p.mean_kl));
                        ui.label(format!("{:.3}", p.nll));
                        ui.label(format!("{:.3}", p.kv_ratio));
                        ui.label(format!("{:.3}", p.prefill_ratio));
                        ui.end_row();
                    }
                });
        });
}
