//! The report's figures, each one self-contained `<svg>`.

use lcut_trace::{PromptTrace, Report, Sweep};
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
    Line {
        name: name.to_string(),
        points: xs.zip(ys).map(|(x, &y)| (x, f64::from(y))).collect(),
    }
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

fn mass_curves(r: &Report) -> Figure {
    let c = &r.curves;
    let l = c.num_layers;
    let chart = LineChart {
        title: "Where decode queries attend, per layer".into(),
        x_label: "layer".into(),
        y_label: "attention mass".into(),
        lines: vec![
            series("BoS", layers(l), &c.bos),
            series("other anchors", layers(l), &c.anchor),
            series("prefill (prompt)", layers(l), &c.prefill),
            series("decode phase", layers(l), &c.decode),
            series("self", layers(l), &c.self_mass),
        ],
        vlines: cut_line(r, -0.5),
        integer_x: true,
        ..LineChart::default()
    };
    chart_figure(
        chart,
        "Mean phase masses over prompts, steps and heads; SPEED keeps the layers left of the L_cut line.",
    )
}

fn tail_curve(r: &Report) -> Figure {
    let c = &r.curves;
    let chart = LineChart {
        title: "Tail mass R(c): prefill attention a cut at c drops".into(),
        x_label: "cut c".into(),
        y_label: "R(c)".into(),
        lines: vec![series("R(c)", layers(c.num_layers + 1), &c.tail_mass)],
        vlines: cut_line(r, 0.0),
        hlines: vec![(
            f64::from(r.settings.thresholds.tail_mass_max),
            format!("tail_mass_max = {}", r.settings.thresholds.tail_mass_max),
        )],
        dots: true,
        integer_x: true,
        ..LineChart::default()
    };
    chart_figure(chart, "Share of decode-to-prefill attention at layers ≥ c.")
}

fn entropy_curves(r: &Report) -> Figure {
    let c = &r.curves;
    let l = c.num_layers;
    let chart = LineChart {
        title: "Normalised prefill entropy per layer".into(),
        x_label: "layer".into(),
        y_label: "H / ln(n_prefill)".into(),
        lines: vec![
            series("head mean", layers(l), &c.entropy_head_mean),
            series("prefill-mass weighted", layers(l), &c.entropy_weighted),
        ],
        vlines: cut_line(r, -0.5),
        hlines: vec![(
            f64::from(r.settings.thresholds.entropy_max),
            format!("entropy_max = {}", r.settings.thresholds.entropy_max),
        )],
        integer_x: true,
        ..LineChart::default()
    };
    chart_figure(
        chart,
        "Low = selective reading of the prompt; 1 = uniform over the prompt.",
    )
}

fn curvature_curves(r: &Report) -> Figure {
    let c = &r.curves;
    let n = c.num_layers + 1;
    let chart = LineChart {
        title: "Trajectory curvature per layer".into(),
        x_label: "layer output (0 = embeddings)".into(),
        y_label: "radians".into(),
        lines: vec![
            series("C prompt", layers(n), &c.curvature_prompt),
            series("C generated", layers(n), &c.curvature_generated),
            series("straightening prompt", layers(n), &c.straightening_prompt),
            series(
                "straightening generated",
                layers(n),
                &c.straightening_generated,
            ),
        ],
        vlines: cut_line(r, 0.0),
        integer_x: true,
        ..LineChart::default()
    };
    chart_figure(
        chart,
        "Mean turning angle of consecutive hidden states; straightening = C_l − C_0 (negative = straighter).",
    )
}

fn sweep_curve(r: &Report, sweep: &Sweep) -> Figure {
    let mut anchors: Vec<&str> = sweep.points.iter().map(|p| p.anchors.as_str()).collect();
    anchors.sort_unstable();
    anchors.dedup();
    let lines = anchors
        .iter()
        .map(|a| {
            let mut pts: Vec<_> = sweep.points.iter().filter(|p| p.anchors == *a).collect();
            pts.sort_by_key(|p| p.l_cut);
            Line {
                name: format!("anchors: {a}"),
                points: pts
                    .iter()
                    .map(|p| (f64::from(p.kv_ratio), f64::from(p.top1_agreement)))
                    .collect(),
            }
        })
        .collect();
    let labels = sweep
        .points
        .iter()
        .map(|p| {
            (
                f64::from(p.kv_ratio),
                f64::from(p.top1_agreement),
                p.l_cut.to_string(),
            )
        })
        .collect();
    let mark = |cut: usize, what: &str| {
        let p = sweep
            .points
            .iter()
            .find(|p| p.l_cut == cut && p.anchors == "bos");
        let p = p.or_else(|| sweep.points.iter().find(|p| p.l_cut == cut))?;
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
    out.push(mass_curves(r));
    out.push(tail_curve(r));
    out.push(entropy_curves(r));
    out.push(curvature_curves(r));
    if let Some(s) = &r.sweep {
        out.push(sweep_curve(r, s));
    }
    out
}
