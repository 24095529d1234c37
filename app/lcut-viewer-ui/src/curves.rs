//! Per-layer curves: attention mass by phase with the tail mass R(c),
//! conditional prompt entropy, curvature and straightening; the recommended
//! cut (dashed) and the chosen one (solid, drag in any plot to move it).
//!
//! x is the layer boundary: layer `l` spans `[l, l + 1)`, per-layer values sit
//! at `l + 0.5`, and series indexed by boundary (tail mass, curvature, index 0
//! = embeddings) sit at their index. The cut `c` is the line `x = c`.

use egui::{Color32, Ui};
use egui_plot::{HLine, Legend, Line, LineStyle, Plot, PlotPoints, VLine};
use lcut_trace::LayerCurves;

use crate::heatmap_view::{CHOSEN, RECOMMENDED};

fn per_layer(name: &str, ys: &[f32], color: Color32) -> Line<'static> {
    let pts: Vec<[f64; 2]> = ys
        .iter()
        .enumerate()
        .filter(|(_, y)| y.is_finite())
        .map(|(l, &y)| [l as f64 + 0.5, f64::from(y)])
        .collect();
    Line::new(name.to_string(), PlotPoints::new(pts)).color(color)
}

fn per_boundary(name: &str, ys: &[f32], color: Color32) -> Line<'static> {
    let pts: Vec<[f64; 2]> = ys
        .iter()
        .enumerate()
        .filter(|(_, y)| y.is_finite())
        .map(|(i, &y)| [i as f64, f64::from(y)])
        .collect();
    Line::new(name.to_string(), PlotPoints::new(pts)).color(color)
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

/// One curve plot with the cut lines; moves the chosen cut when dragged or clicked.
fn curve_plot(
    ui: &mut Ui,
    (id, y_label, height): (&str, &str, f32),
    cuts: &mut Cuts<'_>,
    add: impl FnOnce(&mut egui_plot::PlotUi<'_>),
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
                VLine::new(
                    format!("recommended L_cut {recommended}"),
                    recommended as f64,
                )
                .color(RECOMMENDED)
                .style(LineStyle::dashed_loose())
                .width(1.5),
            );
            pui.vline(
                VLine::new(format!("chosen L_cut {}", *l_cut), *l_cut as f64)
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

/// Draws the three curve plots for `curves` and lets the user drag `l_cut`.
pub fn show_curves(
    ui: &mut Ui,
    curves: &LayerCurves,
    l_cut: &mut usize,
    recommended: usize,
    entropy_max: f32,
) {
    let layers = curves.num_layers;
    ui.label("Drag or click in a plot to move the chosen L_cut (orange); dashed: recommended.");
    let h = ((ui.available_height() - 40.0) / 3.0).clamp(120.0, 400.0);
    let mut cuts = Cuts {
        layers,
        l_cut,
        recommended,
    };
    curve_plot(ui, ("curves_mass", "attention mass", h), &mut cuts, |pui| {
        pui.line(per_layer(
            "BoS",
            &curves.bos,
            Color32::from_rgb(200, 80, 200),
        ));
        pui.line(per_layer(
            "prefill",
            &curves.prefill,
            Color32::from_rgb(80, 160, 255),
        ));
        pui.line(per_layer(
            "decode",
            &curves.decode,
            Color32::from_rgb(90, 200, 90),
        ));
        pui.line(per_layer(
            "self",
            &curves.self_mass,
            Color32::from_rgb(200, 200, 80),
        ));
        if curves.anchor.iter().any(|&a| a > 0.0) {
            pui.line(per_layer("anchors", &curves.anchor, Color32::GRAY));
        }
        pui.line(
            per_boundary(
                "tail mass R(c)",
                &curves.tail_mass,
                Color32::from_rgb(255, 90, 90),
            )
            .style(LineStyle::dashed_dense()),
        );
    });
    curve_plot(
        ui,
        ("curves_entropy", "normalised entropy", h),
        &mut cuts,
        |pui| {
            pui.line(per_layer(
                "entropy (head mean)",
                &curves.entropy_head_mean,
                Color32::from_rgb(80, 160, 255),
            ));
            pui.line(per_layer(
                "entropy (mass-weighted)",
                &curves.entropy_weighted,
                Color32::from_rgb(255, 170, 60),
            ));
            pui.hline(
                HLine::new(
                    format!("selective <= {entropy_max}"),
                    f64::from(entropy_max),
                )
                .color(Color32::DARK_GRAY)
                .style(LineStyle::dotted_loose()),
            );
        },
    );
    curve_plot(ui, ("curves_curvature", "radians", h), &mut cuts, |pui| {
        pui.line(per_boundary(
            "curvature (prompt)",
            &curves.curvature_prompt,
            Color32::from_rgb(80, 160, 255),
        ));
        pui.line(per_boundary(
            "curvature (generated)",
            &curves.curvature_generated,
            Color32::from_rgb(90, 200, 90),
        ));
        pui.line(
            per_boundary(
                "straightening (prompt)",
                &curves.straightening_prompt,
                Color32::from_rgb(80, 160, 255),
            )
            .style(LineStyle::dashed_loose()),
        );
        pui.line(
            per_boundary(
                "straightening (generated)",
                &curves.straightening_generated,
                Color32::from_rgb(90, 200, 90),
            )
            .style(LineStyle::dashed_loose()),
        );
    });
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
}
