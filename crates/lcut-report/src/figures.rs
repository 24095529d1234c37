//! The report's figures, each one self-contained `<svg>`.

use lcut_trace::{Indexing, MetricAxis, PromptTrace, Report, Sweep, SweepPoint};
use ndarray::{Array2, ArrayView2, Axis, s};

use crate::heatmap::Heatmap;
use crate::lines::{Line, LineChart};
use crate::tables::shorten;

/// One figure: a title, its SVG and a caption.
pub struct Figure {
    /// Title (also the SVG's heading).
    pub title: String,
    /// The `<svg>` element.
    pub svg: String,
    /// What the figure shows, in a sentence.
    pub caption: String,
}

/// The trace shown in per-prompt figures by default: the one with the most
/// decode steps (the first of those), or `None` without traces.
pub fn default_prompt(r: &Report) -> Option<usize> {
    r.traces
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.num_steps().cmp(&b.1.num_steps()).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i)
}

fn series(name: &str, xs: impl Iterator<Item = f64>, ys: &[f32]) -> Line {
    Line::new(name, xs.zip(ys).map(|(x, &y)| (x, f64::from(y))).collect())
}

fn layers(n: usize) -> impl Iterator<Item = f64> {
    (0..n).map(|l| l as f64)
}

fn cut_line(r: &Report, offset: f64) -> Vec<(f64, String)> {
    let c = r.recommendation.l_cut;
    vec![(c as f64 + offset, format!("L_cut = {c}"))]
}

/// A heatmap with one row per layer and the recommended cut drawn.
fn layer_heatmap(
    r: &Report,
    title: String,
    x_label: &str,
    values: ArrayView2<'_, f32>,
    col_names: Vec<String>,
    caption: String,
) -> Figure {
    let svg = Heatmap {
        title: &title,
        x_label,
        y_label: "layer",
        values,
        col_names,
        cut: Some(r.recommendation.l_cut),
        range: None,
        named_columns: false,
    }
    .to_svg();
    Figure {
        title,
        svg,
        caption,
    }
}

/// A line chart as a figure.
fn chart_figure(chart: LineChart, caption: &str) -> Figure {
    Figure {
        title: chart.title.clone(),
        svg: chart.to_svg(),
        caption: caption.to_string(),
    }
}

fn step_heatmap(r: &Report, t: &PromptTrace) -> Figure {
    let values = t
        .prefill
        .view()
        .mean_axis(Axis(2))
        .unwrap_or_else(|| Array2::zeros((t.num_layers, 0)));
    let names = (0..t.num_steps())
        .map(|k| {
            format!(
                "step {k} {:?}",
                t.generated.get(k).map_or("", String::as_str)
            )
        })
        .collect();
    let title = format!(
        "Prefill mass by layer and decode step: prompt {}",
        shorten(&t.id, 40)
    );
    layer_heatmap(r, title, "decode step", values.view(), names, "Attention mass that each generated token's query pays to the non-anchor prompt, mean over heads.".to_string())
}

fn mean_step_heatmap(r: &Report) -> Figure {
    let title = "Prefill mass by layer and decode step: mean over prompts".to_string();
    layer_heatmap(
        r,
        title,
        "decode step",
        r.curves.prefill_by_step.view(),
        vec![],
        "Mean over heads and over the prompts that reached each step.".to_string(),
    )
}

fn position_heatmap(r: &Report, t: &PromptTrace) -> Figure {
    // Bin 0 is position 0 (BoS): an attention sink, shown apart in the mass curves.
    let all = t.prompt_attention.view();
    let values = all.slice(s![.., 1.min(all.ncols())..]);
    let names = t
        .bin_edges
        .windows(2)
        .skip(1)
        .map(|w| {
            let text: String = t
                .prompt_tokens
                .get(w[0]..w[1])
                .map(|v| v.concat())
                .unwrap_or_default();
            let span = if w[1] - w[0] == 1 {
                format!("position {}", w[0])
            } else {
                format!("positions {}–{}", w[0], w[1] - 1)
            };
            format!("{span} {:?}", shorten(&text, 40))
        })
        .collect();
    let title = format!(
        "Attention to prompt positions by layer: prompt {}",
        shorten(&t.id, 40)
    );
    layer_heatmap(
        r,
        title,
        "prompt bin (BoS left out)",
        values.view(),
        names,
        format!(
            "Mass that decode queries pay to each prompt bin ({} bins over {} tokens), mean over heads and steps. \
             BoS is left out here (it is an attention sink); see its curve below.",
            t.num_bins(),
            t.prompt_len
        ),
    )
}

fn head_heatmap(r: &Report) -> Figure {
    let title = "Prefill mass by layer and head".to_string();
    layer_heatmap(
        r,
        title,
        "head",
        r.curves.prefill_by_head.view(),
        (0..r.curves.num_heads)
            .map(|h| format!("head {h}"))
            .collect(),
        "Mean over prompts and decode steps.".to_string(),
    )
}

/// How the report shows one kind of metric: title, caption, a threshold
/// line and whether every point gets a dot.
struct AxisStyle {
    title: &'static str,
    caption: &'static str,
    hline: Option<(f32, &'static str)>,
    dots: bool,
}

fn axis_style(r: &Report, axis: MetricAxis) -> AxisStyle {
    let t = &r.settings.thresholds;
    match axis {
        MetricAxis::Mass => AxisStyle {
            title: "Where decode queries attend, per layer",
            caption: "Mean phase masses over prompts, steps and heads; SPEED keeps the layers left of the L_cut line.",
            hline: None,
            dots: false,
        },
        MetricAxis::TailMass => AxisStyle {
            title: "Tail mass R(c): prefill attention a cut at c drops",
            caption: "Share of decode-to-prefill attention at layers ≥ c.",
            hline: Some((t.tail_mass_max, "tail_mass_max")),
            dots: true,
        },
        MetricAxis::Entropy => AxisStyle {
            title: "Normalised prefill entropy per layer",
            caption: "Low = selective reading of the prompt; 1 = uniform over the prompt.",
            hline: Some((t.entropy_max, "entropy_max")),
            dots: false,
        },
        MetricAxis::Curvature => AxisStyle {
            title: "Trajectory curvature per layer",
            caption: "Mean turning angle of consecutive hidden states; straightening = C_l − C_0 (negative = straighter).",
            hline: None,
            dots: false,
        },
        MetricAxis::Lens => AxisStyle {
            title: "Logit lens: where the answer forms",
            caption: "Each layer's output through the final norm and LM head (0 = embeddings): the probability of the step's token, the share of steps whose lens ranks it first, and the share whose answer no longer changes from there up.",
            hline: Some((0.5, "half the steps")),
            dots: false,
        },
        MetricAxis::LensKl => AxisStyle {
            title: "Logit lens: KL(final || lens) per layer",
            caption: "How far each layer's lens is from the model's next-token distribution, nats (0 at the last layer).",
            hline: None,
            dots: false,
        },
        MetricAxis::LensRank => AxisStyle {
            title: "Logit lens: rank of the step's token per layer",
            caption: "Mean log10 rank of the token the model emits under each layer's lens (0 = first).",
            hline: None,
            dots: false,
        },
        MetricAxis::Knockout => AxisStyle {
            title: "Prompt knockout: how far the answer moves, per layer",
            caption: "The prompt (BoS kept) hidden from the decode queries at the band of layers starting at each layer only, teacher-forced on the full model's answers: mean KL(full || knocked out) per token, nats.",
            hline: None,
            dots: true,
        },
        MetricAxis::KnockoutTop1 => AxisStyle {
            title: "Prompt knockout: top-1 agreement with the full model, per layer",
            caption: "Share of the full model's tokens still ranked first with the prompt knocked out of the band starting at each layer.",
            hline: None,
            dots: true,
        },
        MetricAxis::Routing => AxisStyle {
            title: "Routing per layer: router entropy and top-k overlap with the full model",
            caption: "Entropy: the router's softmax over all experts, -Σ p ln p / ln(experts), mean over the decode tokens (0 = one expert takes everything, 1 = all alike). Overlap: under the compared policy, teacher-forced on the same tokens, the share of its top-k experts the full model also chose (1 = the same experts decode). Dense layers route nothing and are left out.",
            hline: None,
            dots: true,
        },
    }
}

/// The formation layer's marker on the lens charts, when the run has one.
fn formation_line(r: &Report) -> Option<(f64, String)> {
    r.curves
        .formation()
        .map(|f| (f.median as f64, format!("formed = {}", f.median)))
}

/// The chart of one kind of metric: one line per metric of
/// [`lcut_trace::LAYER_METRICS`] with that axis,
/// x = the series index, the recommended cut between layers for per-layer
/// series and on the boundary otherwise.
fn metric_chart(r: &Report, axis: MetricAxis) -> (LineChart, &'static str) {
    let c = &r.curves;
    let style = axis_style(r, axis);
    let indexing = axis
        .metrics()
        .next()
        .map_or(Indexing::Layer, |m| m.indexing);
    let lines = axis
        .metrics()
        .filter(|m| m.present(c))
        .map(|m| {
            let n = m.indexing.len(c.num_layers);
            series(m.label, layers(n), m.series(c))
        })
        .collect();
    let mut vlines = cut_line(r, if indexing.half_layer() { -0.5 } else { 0.0 });
    if matches!(
        axis,
        MetricAxis::Lens | MetricAxis::LensKl | MetricAxis::LensRank
    ) {
        vlines.extend(formation_line(r));
    }
    let chart = LineChart {
        title: style.title.into(),
        x_label: indexing.x_label().into(),
        y_label: axis.unit().into(),
        lines,
        vlines,
        hlines: style
            .hline
            .map(|(y, name)| (f64::from(y), format!("{name} = {y}")))
            .into_iter()
            .collect(),
        dots: style.dots,
        integer_x: true,
        ..LineChart::default()
    };
    (chart, style.caption)
}

/// The per-layer metric charts, one per [`MetricAxis`] the report holds
/// (the logit lens's only when the run recorded it).
fn metric_charts(r: &Report) -> Vec<(LineChart, &'static str)> {
    MetricAxis::ALL
        .iter()
        .filter(|axis| axis.metrics().any(|m| m.present(&r.curves)))
        .map(|&axis| metric_chart(r, axis))
        .collect()
}

fn sweep_curve(r: &Report, sweep: &Sweep) -> Figure {
    let mut anchors: Vec<String> = sweep.points.iter().map(SweepPoint::anchors_label).collect();
    anchors.sort_unstable();
    anchors.dedup();
    let lines = anchors
        .iter()
        .map(|a| {
            let mut pts: Vec<_> = sweep
                .points
                .iter()
                .filter(|p| p.anchors_label() == *a)
                .collect();
            pts.sort_by_key(|p| p.l_cut());
            Line::new(
                format!("anchors: {a}"),
                pts.iter()
                    .map(|p| (f64::from(p.kv_ratio), f64::from(p.top1_agreement)))
                    .collect(),
            )
        })
        .collect();
    let labels = sweep
        .points
        .iter()
        .map(|p| {
            (
                f64::from(p.kv_ratio),
                f64::from(p.top1_agreement),
                p.cut_label(),
            )
        })
        .collect();
    let mark = |cut: usize, what: &str| {
        let p = sweep
            .points
            .iter()
            .find(|p| p.l_cut() == Some(cut) && p.keeps_bos());
        let p = p.or_else(|| sweep.points.iter().find(|p| p.l_cut() == Some(cut)))?;
        Some((f64::from(p.kv_ratio), format!("{what} {cut}")))
    };
    let vlines = [
        sweep.knee.and_then(|k| mark(k, "knee")),
        mark(r.recommendation.l_cut, "recommended"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let chart = LineChart {
        title: format!("Quality against KV cost at {} tokens", sweep.context_len),
        x_label: "KV bytes / full model".into(),
        y_label: "top-1 agreement with the full model".into(),
        lines,
        vlines,
        dots: true,
        labels,
        ..LineChart::default()
    };
    chart_figure(
        chart,
        "Each point is a SPEED cut (labelled with L_cut), teacher-forced on the full model's greedy continuation.",
    )
}

/// Every figure of the report; per-prompt figures show trace `prompt`
/// (default [`default_prompt`]).
pub fn figures(r: &Report, prompt: Option<usize>) -> Vec<Figure> {
    let chosen = prompt
        .or_else(|| default_prompt(r))
        .and_then(|i| r.traces.get(i));
    let mut out = Vec::new();
    if let Some(t) = chosen {
        out.push(step_heatmap(r, t));
    }
    out.push(mean_step_heatmap(r));
    if let Some(t) = chosen {
        out.push(position_heatmap(r, t));
    }
    out.push(head_heatmap(r));
    out.extend(crate::routing::load_heatmap(r));
    out.extend(
        metric_charts(r)
            .into_iter()
            .map(|(chart, caption)| chart_figure(chart, caption)),
    );
    if let Some(s) = &r.sweep {
        out.push(sweep_curve(r, s));
        out.extend(crate::routing::sweep_overlap_chart(r, s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::LAYER_METRICS;

    /// The line names of the metric charts, sorted.
    fn line_names(r: &Report) -> Vec<String> {
        let mut names: Vec<String> = metric_charts(r)
            .into_iter()
            .flat_map(|(chart, _)| chart.lines.into_iter().map(|l| l.name))
            .collect();
        names.sort_unstable();
        names
    }

    fn sorted<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        let mut v: Vec<&str> = labels.collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn metric_charts_draw_exactly_the_table() {
        let r = lcut_diag::synthetic::synthetic_moe_report(2, 4, 2, false).unwrap();
        let labels = sorted(LAYER_METRICS.iter().map(|m| m.label));
        assert_eq!(line_names(&r), labels);
        // a dense model's report draws everything but the routing and the
        // sink's share
        let dense = lcut_diag::synthetic::synthetic_report(2, 4, 2, false).unwrap();
        let labels = sorted(
            LAYER_METRICS
                .iter()
                .filter(|m| m.axis != MetricAxis::Routing && m.name != "sink")
                .map(|m| m.label),
        );
        assert_eq!(line_names(&dense), labels);
    }
}
