//! The sweep panel: teacher-forced quality against cost for every measured
//! cut, one line per anchor setting, with the knee and the chosen cut marked,
//! and the points in a table (click a row to choose its cut).

use egui::{ScrollArea, Ui};
use egui_plot::{Legend, Line, MarkerShape, Plot, PlotPoints, PlotUi, Points};
use lcut_trace::{Sweep, SweepPoint};

pub use crate::settings::SweepAxis;
use crate::theme::{CHOSEN, KNEE, SERIES, chosen_label};

/// The sweep still being measured: its run's progress (`[0, 1]`) and message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepRunning<'a> {
    /// Progress in `[0, 1]`.
    pub fraction: f32,
    /// What the run is doing.
    pub message: &'a str,
}

/// Draws the sweep (or its progress while the run measures it, or says that
/// none was run) and lets a row choose `l_cut`.
pub fn show_sweep(
    ui: &mut Ui,
    sweep: Option<&Sweep>,
    running: Option<SweepRunning<'_>>,
    l_cut: &mut usize,
    axis: &mut SweepAxis,
) {
    let Some(sweep) = sweep else {
        match running {
            Some(r) => {
                ui.label("Sweep running: quality against cost at every L_cut; the other views already show this run's diagnostics.");
                ui.add(egui::ProgressBar::new(r.fraction).text(r.message));
            }
            None => {
                ui.label("No sweep in this report: run `lcut sweep` (or `lcut diagnose --sweep`) to measure quality against cost across L_cut.");
            }
        }
        return;
    };
    show_header(ui, sweep, axis);
    let h = (ui.available_height() * 0.55).clamp(160.0, 420.0);
    let (axis, chosen) = (*axis, *l_cut);
    Plot::new("sweep_plot")
        .height(h)
        .legend(Legend::default())
        .x_axis_label(axis.label())
        .y_axis_label("top-1 agreement with full")
        .show(ui, |pui| {
            anchor_lines(pui, sweep, axis);
            marks(pui, sweep, axis, chosen);
        });
    show_table(ui, sweep, l_cut);
}

/// The context length, the knee and the cost axis switch.
fn show_header(ui: &mut Ui, sweep: &Sweep, axis: &mut SweepAxis) {
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
}

/// One line with dots per anchor setting, ordered by cost.
fn anchor_lines(pui: &mut PlotUi<'_>, sweep: &Sweep, axis: SweepAxis) {
    let mut anchor_sets: Vec<String> = sweep.points.iter().map(SweepPoint::anchors_label).collect();
    anchor_sets.sort_unstable();
    anchor_sets.dedup();
    for (i, a) in anchor_sets.iter().enumerate() {
        let mut pts: Vec<[f64; 2]> = sweep
            .points
            .iter()
            .filter(|p| p.anchors_label() == *a)
            .map(|p| [axis.x(p), f64::from(p.top1_agreement)])
            .collect();
        pts.sort_by(|x, y| x[0].total_cmp(&y[0]));
        let color = SERIES[i % 2];
        pui.line(Line::new(format!("anchors {a}"), PlotPoints::new(pts.clone())).color(color));
        pui.points(
            Points::new(format!("anchors {a}"), PlotPoints::new(pts))
                .color(color)
                .radius(3.0),
        );
    }
}

/// The chosen cut's points (diamonds) and the knee's (rings).
fn marks(pui: &mut PlotUi<'_>, sweep: &Sweep, axis: SweepAxis, chosen: usize) {
    let at = |c: usize| -> PlotPoints<'static> {
        let pts: Vec<[f64; 2]> = sweep
            .points
            .iter()
            .filter(|p| p.l_cut() == Some(c))
            .map(|p| [axis.x(p), f64::from(p.top1_agreement)])
            .collect();
        PlotPoints::new(pts)
    };
    pui.points(
        Points::new(chosen_label(chosen), at(chosen))
            .color(CHOSEN)
            .radius(7.0)
            .shape(MarkerShape::Diamond),
    );
    if let Some(k) = sweep.knee {
        pui.points(
            Points::new(format!("knee L_cut {k}"), at(k))
                .color(KNEE)
                .radius(7.0)
                .filled(false)
                .shape(MarkerShape::Circle),
        );
    }
}

/// The points as a table (with a mixture-of-experts model's routing
/// overlap per point); clicking a row's cut chooses it.
fn show_table(ui: &mut Ui, sweep: &Sweep, l_cut: &mut usize) {
    let routed = sweep.points.iter().any(|p| p.routing_overlap.is_some());
    ScrollArea::vertical()
        .id_salt("sweep_table")
        .show(ui, |ui| {
            egui::Grid::new("sweep_rows")
                .striped(true)
                .num_columns(7 + usize::from(routed))
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
                    if routed {
                        ui.strong("routing overlap");
                    }
                    ui.end_row();
                    for p in &sweep.points {
                        let cut = p.l_cut();
                        if ui
                            .selectable_label(cut == Some(*l_cut), p.cut_label())
                            .clicked()
                            && let Some(c) = cut
                        {
                            *l_cut = c;
                        }
                        ui.label(p.anchors_label());
                        ui.label(format!("{:.3}", p.top1_agreement));
                        ui.label(format!("{:.4}", p.mean_kl));
                        ui.label(format!("{:.3}", p.nll));
                        ui.label(format!("{:.3}", p.kv_ratio));
                        ui.label(format!("{:.3}", p.prefill_ratio));
                        if routed {
                            ui.label(
                                p.routing_overlap
                                    .map_or("–".to_string(), |o| format!("{o:.3}")),
                            );
                        }
                        ui.end_row();
                    }
                });
        });
}
