//! The paper's figures from a [`PaperReport`], each an SVG with the file
//! name it is written under.

use lcut_trace::{
    CategoryRow, Indexing, LAYER_METRICS, LayerCurves, LayerMetric, LoopRow, PaperPart,
    PaperReport, TimingPoint,
};
use ndarray::Array2;

use crate::bars::{BarChart, BarSeries};
use crate::figures::Figure;
use crate::frontier::frontier_title;
use crate::frontier_points::Frontier;
use crate::heatmap::Heatmap;
use crate::lines::{Line, LineChart, LineStyle};

/// One figure of the paper with the part it belongs to and the name of its
/// file (without `.svg`).
pub struct PaperFigure {
    /// The part that made it.
    pub part: PaperPart,
    /// File stem under `figures/` (`1-masses-full`).
    pub file: String,
    /// Title, SVG and caption.
    pub figure: Figure,
}

/// The phases of Figure 1's columns: the LAYER_METRICS names of the masses.
const MASS_COLUMNS: [(&str, &str); 4] = [
    ("prefill", "prefill"),
    ("bos", "BoS"),
    ("decode", "decode"),
    ("self", "self"),
];

/// The per-layer metrics of Figure 3, by their LAYER_METRICS names (the
/// logit lens's drawn when the run recorded it).
const LAYER_FIGURES: [&str; 6] = [
    "prefill",
    "entropy_head_mean",
    "curvature_prompt",
    "curvature_generated",
    "lens_prob",
    "lens_formed",
];

/// The metric of the table named `name`.
fn metric(name: &str) -> Option<&'static LayerMetric> {
    LAYER_METRICS.iter().find(|m| m.name == name)
}

/// `[layer, phase]`: the masses of Figure 1's columns.
fn mass_grid(curves: &LayerCurves) -> Array2<f32> {
    let l = curves.num_layers;
    Array2::from_shape_fn((l, MASS_COLUMNS.len()), |(layer, col)| {
        metric(MASS_COLUMNS[col].0).map_or(f32::NAN, |m| m.row_value(curves, layer))
    })
}

/// Figure 1: one heatmap per policy, layers by phase, on one colour scale.
fn masses(r: &PaperReport) -> Vec<PaperFigure> {
    r.masses
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let grid = mass_grid(&p.curves);
            let title = format!("Decode-time attention mass: {}", p.policy);
            let cut = (k > 0).then_some(r.cut);
            let svg = Heatmap {
                title: &title,
                x_label: "attention on",
                y_label: "layer",
                values: grid.view(),
                col_names: MASS_COLUMNS.iter().map(|c| c.1.to_string()).collect(),
                cut,
                range: Some((0.0, 1.0)),
                named_columns: true,
            }
            .to_svg();
            let slug = if k == 0 { "full" } else { "speed" };
            PaperFigure {
                part: PaperPart::Masses,
                file: format!("1-masses-{slug}"),
                figure: Figure {
                    title,
                    svg,
                    caption: format!(
                        "Mean share of each generated token's attention on the prompt (BoS apart), \
                         on BoS, on earlier generated tokens and on itself, per layer, over {} prompts; \
                         one colour scale (0 to 1) for both policies.",
                        p.prompts
                    ),
                },
            }
        })
        .collect()
}

/// The policies of `points` in order of first appearance.
fn policies_of<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for n in names {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// One of Figure 2's ratio charts: measured (solid) and predicted (dashed,
/// same colour) per policy against prompt length.
fn timing_chart(
    r: &PaperReport,
    what: &str,
    measured: fn(&TimingPoint) -> f64,
    predicted: fn(&TimingPoint) -> f64,
) -> LineChart {
    let names = policies_of(r.timing.iter().map(|t| t.policy.as_str()));
    let mut lines = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let pts: Vec<&TimingPoint> = r.timing.iter().filter(|t| t.policy == *name).collect();
        let at = |f: fn(&TimingPoint) -> f64| {
            pts.iter()
                .map(|t| (t.prompt_len as f64, f(t)))
                .collect::<Vec<_>>()
        };
        lines.push(Line {
            name: (*name).to_string(),
            points: at(measured),
            style: LineStyle {
                colour: Some(k),
                ..LineStyle::default()
            },
        });
        lines.push(Line {
            name: format!("{name} (model)"),
            points: at(predicted),
            style: LineStyle {
                colour: Some(k),
                dashed: true,
                unlisted: true,
            },
        });
    }
    LineChart {
        title: format!("{what} over full against prompt length"),
        x_label: "prompt tokens".into(),
        y_label: format!("{what} / full"),
        lines,
        hlines: vec![(1.0, "full".into())],
        dots: true,
        ..LineChart::default()
    }
}

/// Figure 2: TTFT, TPOT and K/V ratios, measured beside the cost model.
fn timing(r: &PaperReport) -> Vec<PaperFigure> {
    if r.timing.is_empty() {
        return vec![];
    }
    let new = r.timing.first().map_or(0, |t| t.new_tokens);
    let charts = [
        (
            "ttft",
            timing_chart(r, "TTFT", |t| t.ttft_ratio, |t| t.predicted_ttft_ratio),
            "Time to first token over full's, measured in the same run (solid), beside prefill FLOPs over full's (dashed, in the policy's colour).",
        ),
        (
            "tpot",
            timing_chart(r, "TPOT", |t| t.tpot_ratio, |t| t.predicted_tpot_ratio),
            "Time per output token over full's (solid), beside the bytes a decode step reads — every weight and the K/V decode reads — over full's (dashed, in the policy's colour).",
        ),
        (
            "kv",
            timing_chart(r, "K/V held", |t| t.kv_ratio, |t| t.predicted_kv_ratio),
            "K/V bytes held at the end over full's (solid), beside the cost formula (dashed, in the policy's colour).",
        ),
    ];
    charts
        .into_iter()
        .map(|(slug, chart, caption)| PaperFigure {
            part: PaperPart::Timing,
            file: format!("2-{slug}"),
            figure: Figure {
                title: chart.title.clone(),
                svg: chart.to_svg(),
                caption: format!("{caption} {new} new tokens per run."),
            },
        })
        .collect()
}

/// Figure 3: one chart per metric, one line per category.
fn layers(r: &PaperReport) -> Vec<PaperFigure> {
    if r.layers.is_empty() {
        return vec![];
    }
    LAYER_FIGURES
        .iter()
        .filter_map(|name| metric(name))
        .filter(|m| r.layers.iter().any(|c| m.present(&c.curves)))
        .map(|m| {
            let lines = r
                .layers
                .iter()
                .map(|c| {
                    let ys = m.series(&c.curves);
                    Line::new(
                        format!("{} ({})", c.kind, c.prompts),
                        ys.iter()
                            .enumerate()
                            .map(|(i, &y)| (m.indexing.boundary_x(i), f64::from(y)))
                            .collect(),
                    )
                })
                .collect();
            let chart = LineChart {
                title: format!("{} per layer by category", m.label),
                x_label: m.indexing.x_label().into(),
                y_label: m.axis.unit().into(),
                lines,
                // layer l sits at l + 0.5 and the output of layer l at l + 1:
                // the cut before layer C is the boundary x = C for both
                vlines: vec![(r.cut as f64, format!("C = {}", r.cut))],
                integer_x: true,
                ..LineChart::default()
            };
            let note = match m.indexing {
                Indexing::Output => " Index 0 is the embeddings.",
                _ => "",
            };
            PaperFigure {
                part: PaperPart::Layers,
                file: format!("3-{}", m.name.replace('_', "-")),
                figure: Figure {
                    title: chart.title.clone(),
                    svg: chart.to_svg(),
                    caption: format!(
                        "Full-depth greedy runs with the diagnostic probe, mean over each category's prompts (count in the legend).{note}"
                    ),
                },
            }
        })
        .collect()
}

/// Figure 4: exact match against mean prompt length, one line per policy.
fn retrieval(r: &PaperReport) -> Vec<PaperFigure> {
    if r.retrieval.is_empty() {
        return vec![];
    }
    let names = policies_of(r.retrieval.iter().map(|p| p.policy.as_str()));
    let lines = names
        .iter()
        .map(|name| {
            Line::new(
                *name,
                r.retrieval
                    .iter()
                    .filter(|p| p.policy == *name)
                    .map(|p| (p.mean_prompt_tokens, p.accuracy))
                    .collect(),
            )
        })
        .collect();
    let chart = LineChart {
        title: "Exact match on retrieval by prompt length".into(),
        x_label: "prompt tokens (mean of the length class)".into(),
        y_label: "exact match".into(),
        lines,
        dots: true,
        ..LineChart::default()
    };
    vec![PaperFigure {
        part: PaperPart::Retrieval,
        file: "4-retrieval".into(),
        figure: Figure {
            title: chart.title.clone(),
            svg: chart.to_svg(),
            caption: "Each policy's own greedy answer to the retrieval items, scored by the item's rule; one point per length class.".into(),
        },
    }]
}

/// The name a table row goes by: the policy, with its adapter.
pub fn row_name(row: &CategoryRow) -> String {
    match &row.adapter {
        Some(a) => format!("{} + {}", row.policy, adapter_name(a)),
        None => row.policy.clone(),
    }
}

/// The last component of an adapter's folder.
fn adapter_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// The table's groups (`all`, then the kinds) in order of first appearance.
pub fn table_groups(rows: &[CategoryRow]) -> Vec<&str> {
    policies_of(rows.iter().map(|r| r.group.as_str()))
}

/// The table's rows' names in order of first appearance.
pub fn table_policies(rows: &[CategoryRow]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        let n = row_name(r);
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// The table's accuracies as grouped bars with their intervals.
fn table(r: &PaperReport) -> Vec<PaperFigure> {
    if r.table.is_empty() {
        return vec![];
    }
    let groups: Vec<String> = table_groups(&r.table)
        .into_iter()
        .map(String::from)
        .collect();
    let series = table_policies(&r.table)
        .into_iter()
        .map(|name| {
            let cell = |g: &String| {
                r.table
                    .iter()
                    .find(|x| row_name(x) == name && x.group == *g)
            };
            BarSeries {
                values: groups
                    .iter()
                    .map(|g| cell(g).map_or(f64::NAN, |x| x.accuracy))
                    .collect(),
                intervals: groups.iter().map(|g| cell(g).map(|x| x.ci95)).collect(),
                name,
            }
        })
        .collect();
    let chart = BarChart {
        title: "Accuracy per category".into(),
        y_label: "accuracy".into(),
        groups,
        series,
        y_max: Some(1.0),
        ..BarChart::default()
    };
    let frontier = Frontier::from_paper_table(&r.table, &r.suite.path);
    let frontier_chart = crate::frontier::frontier_chart(&frontier, &frontier_title(&frontier));
    vec![
        PaperFigure {
            part: PaperPart::Table,
            file: "5-accuracy".into(),
            figure: Figure {
                title: chart.title.clone(),
                svg: chart.to_svg(),
                caption: "Each policy's own greedy answers scored by the items' rules, with 95% Wilson intervals.".into(),
            },
        },
        PaperFigure {
            part: PaperPart::Table,
            file: "5-frontier".into(),
            figure: Figure {
                title: frontier_chart.title.clone(),
                svg: frontier_chart.to_svg(),
                caption: "The same accuracies over all items against the K/V each policy holds \
                          (measured, a share of the full model's), one line per family; the \
                          horizontal line is the full model's."
                    .into(),
            },
        },
    ]
}

/// The loops of the anchor-free and +BoS rows of each family as bars, the
/// full model's share as a reference line.
fn loops(r: &PaperReport) -> Vec<PaperFigure> {
    if r.loops.is_empty() {
        return vec![];
    }
    let full = r.loops.iter().find(|x| x.anchors == "full");
    let families: Vec<String> = policies_of(
        r.loops
            .iter()
            .filter(|x| x.anchors != "full")
            .map(|x| x.family.as_str()),
    )
    .into_iter()
    .map(String::from)
    .collect();
    let series = [("none", "anchor-free"), ("bos", "+BoS")]
        .into_iter()
        .map(|(anchors, name)| {
            let cell = |f: &String| -> Option<&LoopRow> {
                r.loops
                    .iter()
                    .find(|x| x.family == *f && x.anchors == anchors)
            };
            BarSeries {
                name: name.into(),
                values: families
                    .iter()
                    .map(|f| cell(f).map_or(f64::NAN, |x| x.share))
                    .collect(),
                intervals: families.iter().map(|f| cell(f).map(|x| x.ci95)).collect(),
            }
        })
        .collect();
    let chart = BarChart {
        title: "Generations that end in a repetition loop".into(),
        y_label: "share of generations".into(),
        groups: families,
        series,
        hlines: full
            .map(|f| (f.share, format!("full: {:.2}", f.share)))
            .into_iter()
            .collect(),
        y_max: None,
    };
    vec![PaperFigure {
        part: PaperPart::Loops,
        file: "6-loops".into(),
        figure: Figure {
            title: chart.title.clone(),
            svg: chart.to_svg(),
            caption: "A loop: the generation ends in a span of 1 to 8 tokens repeated at least 3 times back to back; 95% Wilson intervals.".into(),
        },
    }]
}

/// Every figure of the report, in the paper's order.
pub fn paper_figures(r: &PaperReport) -> Vec<PaperFigure> {
    let mut out = masses(r);
    out.extend(timing(r));
    out.extend(layers(r));
    out.extend(retrieval(r));
    out.extend(table(r));
    out.extend(loops(r));
    out
}
