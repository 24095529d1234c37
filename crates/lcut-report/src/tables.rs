//! The report's tables as rows of text, shared by the HTML and Markdown writers.

use lcut_trace::{
    LAYER_METRICS, LayerCurves, LayerMetric, MadeBy, MetricAxis, PromptTrace, Report, Sweep,
};

use crate::svg::num;

/// A table: header cells and rows of cells.
pub struct Table {
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows, each as long as `headers`.
    pub rows: Vec<Vec<String>>,
}

fn strings<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

/// Model identity and run settings, one field per row.
pub fn model_table(r: &Report) -> Table {
    let m = &r.model;
    let s = &r.settings;
    let rows = [
        ("model path", m.path.clone()),
        ("architecture", m.arch.clone()),
        ("dtype", m.dtype.clone()),
        ("config hash", m.config_hash.clone()),
        ("layers", m.num_layers.to_string()),
        (
            "heads (query / KV)",
            format!("{} / {}", m.num_heads, m.num_kv_heads),
        ),
        (
            "head dim / hidden",
            format!("{} / {}", m.head_dim, m.hidden_size),
        ),
        ("prompts", r.traces.len().to_string()),
        (
            "prompts file",
            s.prompts_file.clone().unwrap_or_else(|| "–".into()),
        ),
        ("max new tokens", s.max_new_tokens.to_string()),
        ("chat template", s.chat_template_used.to_string()),
        ("tool version", r.tool_version.clone()),
        ("schema version", r.schema_version.to_string()),
    ];
    Table {
        headers: strings(["field", "value"]),
        rows: rows
            .into_iter()
            .map(|(k, v)| vec![k.to_string(), v])
            .collect(),
    }
}

/// Each signal's vote and its threshold.
pub fn votes_table(r: &Report) -> Table {
    let v = &r.recommendation.votes;
    let t = &r.settings.thresholds;
    let vote = |x: Option<usize>| x.map_or_else(|| "no vote".to_string(), |c| c.to_string());
    Table {
        headers: strings(["signal", "vote", "threshold"]),
        rows: vec![
            vec![
                "tail mass R(c)".into(),
                vote(v.tail_mass),
                format!("R(c) ≤ {}", t.tail_mass_max),
            ],
            vec![
                "selective reading band".into(),
                vote(v.selective_band),
                format!("entropy ≤ {}, prefill mass ≥ {}", t.entropy_max, t.mass_min),
            ],
            vec![
                "curvature plateau".into(),
                vote(v.curvature_plateau),
                format!("|ΔC| < {} rad", t.plateau_eps),
            ],
            vec![
                "chosen L_cut".into(),
                r.recommendation.l_cut.to_string(),
                format!(
                    "drops {}% of prefill mass",
                    num(100.0 * r.recommendation.tail_mass_dropped, 2)
                ),
            ],
        ],
    }
}

/// Whether the per-layer table shows `m`: every metric, but a
/// mixture-of-experts model's routing and a learned sink's share only where
/// the report has them (a dense model's table is as it always was).
fn in_layer_table(m: &LayerMetric, c: &LayerCurves) -> bool {
    (m.axis != MetricAxis::Routing && m.name != "sink") || m.present(c)
}

/// The per-layer curves, one row per layer, one column per entry of
/// [`LAYER_METRICS`] (the routing's only for a model that routes);
/// curvature is that of the layer's output.
pub fn layer_table(r: &Report) -> Table {
    let c = &r.curves;
    let shown: Vec<&LayerMetric> = LAYER_METRICS
        .iter()
        .filter(|m| in_layer_table(m, c))
        .collect();
    let mut headers = strings(["layer"]);
    headers.extend(shown.iter().map(|m| m.label.to_string()));
    let rows = (0..c.num_layers)
        .map(|l| {
            let mut row = vec![match c.state_split_layers.contains(&l) {
                true => format!("{l} (linear)"),
                false => l.to_string(),
            }];
            row.extend(shown.iter().map(|m| num(m.row_value(c, l), 4)));
            row
        })
        .collect();
    Table { headers, rows }
}

/// What a hybrid model's layers without attention rows show, for the
/// per-layer table (marked "(linear)" there); `None` where every layer
/// attends.
pub fn state_split_sentence(r: &Report) -> Option<String> {
    let layers = &r.curves.state_split_layers;
    if layers.is_empty() {
        return None;
    }
    let list: Vec<String> = layers.iter().map(usize::to_string).collect();
    Some(format!(
        "Layers {} ({} of {}) are linear-attention layers: they have no attention rows, so \
         their prefill column is the prompt's share of the layer's output, |p| / (|p| + |d|) of \
         the parts the prompt's state and the decode-phase tokens give (BoS included), their \
         decode column the rest; BoS, anchor and self read 0 and the entropy is undefined. The \
         tail-mass vote reads both measures; the selective-reading vote reads the attention \
         layers only.",
        list.join(", "),
        layers.len(),
        r.curves.num_layers
    ))
}

/// Which build and instruction-set level measured a diagnosis or a sweep
/// (each, when its shards were measured by several); none for one written
/// before they recorded it.
pub(crate) fn made_by_line(made_by: &[MadeBy]) -> Option<String> {
    match made_by {
        [] => None,
        [one] => Some(format!("Measured by {one}.")),
        several => lcut_trace::made_by::several_note(several),
    }
}

/// The sweep's points, sorted by anchors and cut; with a mixture-of-experts
/// model's routing overlap per point when the sweep has it.
pub fn sweep_table(s: &Sweep) -> Table {
    let mut pts: Vec<_> = s.points.iter().collect();
    pts.sort_by_cached_key(|p| (p.anchors_label(), p.l_cut()));
    let routed = pts.iter().any(|p| p.routing_overlap.is_some());
    let mut headers = strings([
        "anchors",
        "L_cut",
        "top-1 agreement",
        "mean KL",
        "NLL",
        "KV ratio",
        "prefill FLOPs ratio",
        "KV bytes",
    ]);
    if routed {
        headers.push("routing overlap".to_string());
    }
    Table {
        headers,
        rows: pts
            .iter()
            .map(|p| {
                let mut row = vec![
                    p.anchors_label(),
                    p.cut_label(),
                    num(p.top1_agreement, 4),
                    num(p.mean_kl, 4),
                    num(p.nll, 4),
                    num(p.kv_ratio, 4),
                    num(p.prefill_ratio, 4),
                    p.kv_bytes.to_string(),
                ];
                if routed {
                    row.push(num(p.routing_overlap.unwrap_or(f32::NAN), 4));
                }
                row
            })
            .collect(),
    }
}

/// The sweep's comparison axis (SlimInfer, pairs at equal K/V), measured
/// on the prompts; `None` when the sweep has none.
pub fn policy_axis_table(s: &Sweep) -> Option<Table> {
    if s.policies.is_empty() {
        return None;
    }
    Some(Table {
        headers: strings([
            "policy",
            "paired with",
            "top-1 agreement",
            "mean KL",
            "NLL",
            "held KV ratio",
            "resident KV ratio",
            "prefill FLOPs ratio",
            "L_eq",
            "swap rate",
            "scorer precision per cut",
        ]),
        rows: s
            .policies
            .iter()
            .map(|p| {
                vec![
                    p.policy.clone(),
                    p.paired_with.clone().unwrap_or_default(),
                    num(p.top1_agreement, 4),
                    num(p.mean_kl, 4),
                    num(p.nll, 4),
                    num(p.kv_ratio, 4),
                    num(p.resident_ratio, 4),
                    num(p.prefill_ratio, 4),
                    num(p.equal_kv_cutoff, 2),
                    num(p.swap_rate, 3),
                    p.scorer_precision
                        .iter()
                        .map(|&x| num(x, 2))
                        .collect::<Vec<_>>()
                        .join(" / "),
                ]
            })
            .collect(),
    })
}

/// SPEED's accuracy on a task suite at each cutoff, with its interval.
pub fn accuracy_table(s: &Sweep) -> Option<Table> {
    if s.accuracy.is_empty() {
        return None;
    }
    Some(Table {
        headers: strings([
            "L_cut",
            "anchors",
            "correct",
            "items",
            "accuracy",
            "95% interval",
        ]),
        rows: s
            .accuracy
            .iter()
            .map(|p| {
                vec![
                    p.l_cut.to_string(),
                    p.anchors.clone(),
                    p.correct.to_string(),
                    p.n.to_string(),
                    num(p.accuracy, 3),
                    format!("[{}, {}]", num(p.interval[0], 3), num(p.interval[1], 3)),
                ]
            })
            .collect(),
    })
}

/// The SPEED+BoS accuracy expected at the recommended cutoff against the
/// deepest BoS cutoff scored, in words (`None` without a BoS point at that
/// cut; anchor-free points are not read).
pub fn expected_accuracy_line(r: &Report) -> Option<String> {
    let sweep = r.sweep.as_ref()?;
    let rec = r.recommendation.l_cut;
    let bos = || sweep.accuracy.iter().filter(|p| p.keeps_bos());
    let at = bos().find(|p| p.l_cut == rec)?;
    let full = bos().max_by_key(|p| p.l_cut)?;
    // the K/V it holds at the sweep's context length, as the cost model
    // counts it (a sliding-window layer at its window)
    let kv = sweep
        .points
        .iter()
        .find(|p| p.keeps_bos() && p.l_cut() == Some(rec))
        .map_or_else(String::new, |p| {
            format!(
                " It holds {} of the full model's K/V at {} tokens ({}% saved).",
                num(p.kv_ratio, 3),
                sweep.context_len,
                num((1.0 - p.kv_ratio) * 100.0, 1)
            )
        });
    Some(format!(
        "At the recommended L_cut {rec}, accuracy on the suite is {} [{}, {}] against {} at L_cut {}: an expected loss of {} points.{kv}",
        num(at.accuracy, 3),
        num(at.interval[0], 3),
        num(at.interval[1], 3),
        num(full.accuracy, 3),
        full.l_cut,
        num((full.accuracy - at.accuracy) * 100.0, 1)
    ))
}

/// Attention recall per layer (rows) for each policy of the sweep's axis
/// (columns): the share of the full model's decode attention on prompt
/// tokens that lands on tokens the policy keeps there.
pub fn recall_table(s: &Sweep) -> Option<Table> {
    let layers = s.policies.iter().map(|p| p.attention_recall.len()).max()?;
    if layers == 0 {
        return None;
    }
    let mut headers = strings(["layer"]);
    headers.extend(s.policies.iter().map(|p| p.policy.clone()));
    let rows = (0..layers)
        .map(|l| {
            let mut row = vec![l.to_string()];
            row.extend(s.policies.iter().map(|p| {
                p.attention_recall
                    .get(l)
                    .map_or_else(String::new, |&r| num(r, 3))
            }));
            row
        })
        .collect();
    Some(Table { headers, rows })
}

/// Mean prefill mass of one trace over layers, steps and heads.
pub fn mean_prefill(t: &PromptTrace) -> f32 {
    let d = t.prefill.data();
    if d.is_empty() {
        f32::NAN
    } else {
        d.iter().sum::<f32>() / d.len() as f32
    }
}

/// Shortens `s` to at most `max` characters, marking the cut with `…`.
pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// One row per prompt.
pub fn prompt_table(r: &Report) -> Table {
    Table {
        headers: strings([
            "index",
            "id",
            "prompt tokens",
            "decode start",
            "steps",
            "mean prefill mass",
            "generated",
        ]),
        rows: r
            .traces
            .iter()
            .map(|t| {
                vec![
                    t.index.to_string(),
                    t.id.clone(),
                    t.prompt_len.to_string(),
                    t.decode_start.to_string(),
                    t.num_steps().to_string(),
                    num(mean_prefill(t), 4),
                    shorten(&t.generated.concat(), 60),
                ]
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorten_counts_characters() {
        assert_eq!(shorten("héllo", 10), "héllo");
        assert_eq!(shorten("héllo wörld", 6), "héllo…");
    }

    #[test]
    fn the_expected_accuracy_line_reads_bos_points_only() {
        let mut r = lcut_diag::synthetic::synthetic_report(3, 5, 2, true).unwrap();
        let rec = r.recommendation.l_cut;
        let sweep = r.sweep.as_mut().unwrap();
        // anchor-free points first and deeper: a reader that mixed the two
        // would quote them
        sweep.accuracy = vec![
            lcut_diag::accuracy_point(rec, "none", 1, 10),
            lcut_diag::accuracy_point(rec + 9, "none", 2, 10),
            lcut_diag::accuracy_point(rec, "bos", 7, 10),
            lcut_diag::accuracy_point(rec + 1, "bos", 8, 10),
        ];
        let line = expected_accuracy_line(&r).unwrap();
        assert!(
            line.contains("is 0.700") && line.contains(&format!("0.800 at L_cut {}", rec + 1)),
            "{line}"
        );
        // the K/V the sweep's point at the recommendation holds
        let sweep = r.sweep.as_ref().unwrap();
        let point = sweep
            .points
            .iter()
            .find(|p| p.keeps_bos() && p.l_cut() == Some(rec))
            .unwrap();
        let held = format!(
            "holds {} of the full model's K/V at {} tokens",
            num(point.kv_ratio, 3),
            sweep.context_len
        );
        assert!(line.contains(&held), "{line}");
        r.sweep
            .as_mut()
            .unwrap()
            .accuracy
            .retain(|p| !p.keeps_bos());
        assert_eq!(expected_accuracy_line(&r), None);
    }

    #[test]
    fn a_hybrid_models_linear_layers_are_marked_and_explained() {
        let mut r = lcut_diag::synthetic::synthetic_report(3, 5, 2, false).unwrap();
        assert_eq!(state_split_sentence(&r), None);
        assert!(
            layer_table(&r)
                .rows
                .iter()
                .all(|row| !row[0].contains("linear"))
        );
        r.curves.state_split_layers = vec![0, 1, 3];
        let layers: Vec<String> = layer_table(&r)
            .rows
            .iter()
            .map(|row| row[0].clone())
            .collect();
        assert_eq!(layers, ["0 (linear)", "1 (linear)", "2", "3 (linear)", "4"]);
        let line = state_split_sentence(&r).unwrap();
        assert!(line.starts_with("Layers 0, 1, 3 (3 of 5) are linear-attention layers"));
        let md = crate::render_markdown(&r);
        assert!(md.contains(&line) && md.contains("| 3 (linear) |"));
        let html = crate::render_html(&r, &crate::HtmlOptions::default());
        assert!(html.contains("are linear-attention layers") && html.contains("3 (linear)"));
    }

    #[test]
    fn tables_have_rectangular_rows() {
        let r = lcut_diag::synthetic::synthetic_report(3, 5, 2, true).unwrap();
        let sweep = r.sweep.as_ref().unwrap();
        for t in [
            model_table(&r),
            votes_table(&r),
            layer_table(&r),
            sweep_table(sweep),
            prompt_table(&r),
        ] {
            assert!(t.rows.iter().all(|row| row.len() == t.headers.len()));
        }
        assert_eq!(layer_table(&r).rows.len(), 5);
        // a dense model's table: every metric but the routing and the sink's share
        let mut labels = vec!["layer"];
        labels.extend(
            LAYER_METRICS
                .iter()
                .filter(|m| m.axis != MetricAxis::Routing && m.name != "sink")
                .map(|m| m.label),
        );
        assert_eq!(layer_table(&r).headers, labels);
        let moe = lcut_diag::synthetic::synthetic_moe_report(3, 5, 2, true).unwrap();
        let mut labels = vec!["layer"];
        labels.extend(LAYER_METRICS.iter().map(|m| m.label));
        assert_eq!(layer_table(&moe).headers, labels);
        let swept = sweep_table(moe.sweep.as_ref().unwrap());
        assert!(
            swept
                .rows
                .iter()
                .all(|row| row.len() == swept.headers.len())
        );
        assert_eq!(
            swept.headers.last().map(String::as_str),
            Some("routing overlap")
        );
        assert!(policy_axis_table(sweep).is_none() && recall_table(sweep).is_none());
        let mut with_axis = sweep.clone();
        with_axis.policies.push(lcut_trace::PolicyPoint {
            policy: "slim:2@50%".into(),
            paired_with: Some("speed:3+bos".into()),
            top1_agreement: 0.5,
            mean_kl: 0.1,
            nll: 1.0,
            kv_ratio: 0.7,
            resident_ratio: 0.6,
            prefill_ratio: 0.7,
            equal_kv_cutoff: 3.0,
            swap_rate: 0.2,
            attention_recall: vec![1.0, 1.0, 0.4, 0.3, 0.2],
            scorer_precision: vec![0.5],
            counts: None,
        });
        let axis = policy_axis_table(&with_axis).unwrap();
        let recall = recall_table(&with_axis).unwrap();
        assert_eq!((axis.rows.len(), recall.rows.len()), (1, 5));
        assert_eq!(recall.rows[2], vec!["2", "0.400"]);
        assert_eq!(prompt_table(&r).rows.len(), 3);
    }
}
