//! Per-layer curves: attention mass by phase with the tail mass R(c),
//! conditional prompt entropy, curvature and straightening, and the logit
//! lens (where the answer forms) and the causal prompt knockout (where the
//! prompt matters) when the report has them, and a mixture-of-experts
//! model's routing entropy and overlap; the recommended cut (dashed),
//! the chosen one (solid, drag in any plot to move it) and, on the lens and
//! knockout plots, the formation layer (dotted).
//!
//! x is the layer boundary: layer `l` spans `[l, l + 1)`, per-layer values sit
//! at `l + 0.5`, and series indexed by boundary (tail mass, curvature, index 0
//! = embeddings) sit at their index. The cut `c` is the line `x = c`.

use egui::Ui;
use egui_plot::{HLine, Legend, Line, LineStyle, Plot, PlotPoints, PlotUi, VLine};
use lcut_trace::{LAYER_METRICS, LayerCurves, LayerMetric, MetricAxis};

use crate::theme::{
    CHOSEN, RECOMMENDED, REFERENCE, chosen_label, metric_colour, metric_line_style,
    recommended_label,
};

/// The curve plots, top to bottom: id and the kind whose unit labels the y
/// axis (the lens's rank shares the KL plot: lower is nearer the answer in
/// both; the knockout's agreement shares its KL plot; a mixture-of-experts
/// model's routing entropy and overlap share one).
const PLOTS: [(&str, MetricAxis); 7] = [
    ("curves_mass", MetricAxis::Mass),
    ("curves_entropy", MetricAxis::Entropy),
    ("curves_curvature", MetricAxis::Curvature),
    ("curves_lens", MetricAxis::Lens),
    ("curves_lens_kl", MetricAxis::LensKl),
    ("curves_knockout", MetricAxis::Knockout),
    ("curves_routing", MetricAxis::Routing),
];

/// The plot that draws metrics of kind `axis` (the tail mass, a share of
/// the prompt's mass, is drawn with the masses).
fn plot_of(axis: MetricAxis) -> usize {
    match axis {
        MetricAxis::Mass | MetricAxis::TailMass => 0,
        MetricAxis::Entropy => 1,
        MetricAxis::Curvature => 2,
        MetricAxis::Lens => 3,
        MetricAxis::LensKl | MetricAxis::LensRank => 4,
        MetricAxis::Knockout | MetricAxis::KnockoutTop1 => 5,
        MetricAxis::Routing => 6,
    }
}

/// The y label of plot `i` of [`PLOTS`].
fn y_label(i: usize) -> String {
    match PLOTS[i].1 {
        MetricAxis::LensKl => format!(
            "{} · {}",
            MetricAxis::LensKl.unit(),
            MetricAxis::LensRank.unit()
        ),
        MetricAxis::Knockout => format!(
            "{} · {}",
            MetricAxis::Knockout.unit(),
            MetricAxis::KnockoutTop1.unit()
        ),
        axis => axis.unit().to_string(),
    }
}

/// The metrics of [`LAYER_METRICS`] each plot of [`PLOTS`] draws, in table order.
pub fn plotted_metrics() -> [Vec<&'static LayerMetric>; 7] {
    let mut out: [Vec<&'static LayerMetric>; 7] = Default::default();
    for m in LAYER_METRICS {
        out[plot_of(m.axis)].push(m);
    }
    out
}

/// One metric's curve: per-layer values half a layer right of the boundary
/// before the layer, boundary values on the boundary; NaN left out.
fn metric_line(m: &LayerMetric, curves: &LayerCurves) -> Line<'static> {
    let pts: Vec<[f64; 2]> = m
        .series(curves)
        .iter()
        .enumerate()
        .filter(|(_, y)| y.is_finite())
        .map(|(i, &y)| [m.indexing.boundary_x(i), f64::from(y)])
        .collect();
    Line::new(m.label.to_string(), PlotPoints::new(pts))
        .color(metric_colour(m.name))
        .style(metric_line_style(m.name))
}

/// The cutoff for a drag or click at data x: `round(x)` in `1..=layers`.
pub fn cut_at(x: f64, layers: usize) -> usize {
    (x.round().max(1.0) as usize).min(layers.max(1))
}

/// The cut lines shared by the curve plots.
struct Cuts<'a> {
    layers: usize,
    l_cut: &'a mut usize,
    recommended: usize,
}

/// The label of the formation layer's line on the lens plots.
pub fn formation_label(layer: usize) -> String {
    format!("answer formed {layer}")
}

/// One curve plot with the cut lines; moves the chosen cut when dragged or clicked.
fn curve_plot(
    ui: &mut Ui,
    (id, y_label, height): (&str, &str, f32),
    cuts: &mut Cuts<'_>,
    add: impl FnOnce(&mut PlotUi<'_>),
) {
    let (layers, recommended) = (cuts.layers, cuts.recommended);
    let l_cut = &mut *cuts.l_cut;
    let link = egui::Id::unique("lcut_curves_x");
    let r = Plot::new(id)
        .height(height)
        .legend(Legend::default())
        .allow_drag(false)
        .allow_boxed_zoom(false)
        .allow_scroll(false)
        .allow_zoom(false)
        .link_axis(link, [true, false])
        .include_x(0.0)
        .include_x(layers as f64)
        .x_axis_label("layer boundary (L_cut)")
        .y_axis_label(y_label)
        .show(ui, |pui| {
            add(pui);
            pui.vline(
                VLine::new(recommended_label(recommended), recommended as f64)
                    .color(RECOMMENDED)
                    .style(LineStyle::dashed_loose())
                    .width(1.5),
            );
            pui.vline(
                VLine::new(chosen_label(*l_cut), *l_cut as f64)
                    .color(CHOSEN)
                    .width(2.5),
            );
            pui.pointer_coordinate()
        });
    let resp = &r.response;
    if (resp.dragged() || resp.clicked())
        && let Some(p) = r.inner
    {
        *l_cut = cut_at(p.x, layers);
    }
}

/// Draws the curve plots for `curves` (every metric of [`LAYER_METRICS`],
/// see [`plotted_metrics`]) and lets the user drag `l_cut`.
pub fn show_curves(
    ui: &mut Ui,
    curves: &LayerCurves,
    l_cut: &mut usize,
    recommended: usize,
    entropy_max: f32,
) {
    ui.label("Drag or click in a plot to move the chosen L_cut (orange); dashed: recommended.");
    let shown: Vec<(usize, Vec<&LayerMetric>)> = plotted_metrics()
        .into_iter()
        .map(|ms| {
            ms.into_iter()
                .filter(|m| m.present(curves))
                .collect::<Vec<_>>()
        })
        .enumerate()
        .filter(|(_, ms)| !ms.is_empty())
        .collect();
    let formation = curves.formation();
    match formation {
        Some(f) => ui.label(format!(
            "Logit lens: half the decode steps' answers stay top-1 from layer boundary {} of {} \
             on (dotted line; mean {:.1}).",
            f.median, curves.num_layers, f.mean
        )),
        None => ui.label("No logit lens in this report."),
    };
    if let Some(&(a, kl)) = curves.most_causal(1).first() {
        let top1 = curves.knockout_top1.get(a).copied().unwrap_or(f32::NAN);
        ui.label(format!(
            "Prompt knockout: the answer moves most when the prompt is hidden from the band \
             starting at layer {a} (KL {kl:.3} nats, top-1 agreement {top1:.3})."
        ));
    }
    let h = ((ui.available_height() - 60.0) / shown.len().max(1) as f32).clamp(120.0, 400.0);
    let mut cuts = Cuts {
        layers: curves.num_layers,
        l_cut,
        recommended,
    };
    for (i, metrics) in shown {
        let lens = matches!(
            PLOTS[i].1,
            MetricAxis::Lens | MetricAxis::LensKl | MetricAxis::LensRank | MetricAxis::Knockout
        );
        curve_plot(ui, (PLOTS[i].0, &y_label(i), h), &mut cuts, |pui| {
            for m in &metrics {
                pui.line(metric_line(m, curves));
            }
            if let (true, Some(f)) = (lens, formation) {
                pui.vline(
                    VLine::new(formation_label(f.median), f.median as f64)
                        .color(REFERENCE)
                        .style(LineStyle::dotted_loose())
                        .width(1.5),
                );
            }
            if metrics.iter().any(|m| m.axis == MetricAxis::Entropy) {
                pui.hline(
                    HLine::new(
                        format!("selective <= {entropy_max}"),
                        f64::from(entropy_max),
                    )
                    .color(REFERENCE)
                    .style(LineStyle::dotted_loose()),
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_snaps_to_a_boundary_inside_the_model() {
        assert_eq!(cut_at(3.4, 8), 3);
        assert_eq!(cut_at(3.6, 8), 4);
        assert_eq!(cut_at(-2.0, 8), 1);
        assert_eq!(cut_at(99.0, 8), 8);
    }

    #[test]
    fn the_plots_draw_every_metric_of_the_table_once() {
        let drawn: Vec<&str> = plotted_metrics().iter().flatten().map(|m| m.name).collect();
        let mut sorted = drawn.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let mut table: Vec<&str> = LAYER_METRICS.iter().map(|m| m.name).collect();
        table.sort_unstable();
        assert_eq!(sorted, table);
        assert_eq!(drawn.len(), LAYER_METRICS.len(), "none drawn twice");
        for ((_, axis), metrics) in PLOTS.iter().zip(plotted_metrics()) {
            assert!(metrics.iter().any(|m| m.axis == *axis), "{axis:?}");
        }
    }
}
