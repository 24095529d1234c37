//! The paper's tables as rows of text (HTML and Markdown share them), and
//! each part's numbers as CSV.

use lcut_trace::{LAYER_METRICS, PaperPart, PaperReport};

use crate::paper::figures::{row_name, table_groups, table_policies};
use crate::svg::num;
use crate::tables::Table;

fn strings(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

fn f(x: f64, digits: usize) -> String {
    num(x as f32, digits)
}

fn interval(ci: [f64; 2]) -> String {
    format!("[{}, {}]", f(ci[0], 2), f(ci[1], 2))
}

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |x| f(x, 3))
}

/// Figure 2's numbers: one row per policy and length.
pub fn timing_table(r: &PaperReport) -> Table {
    Table {
        headers: strings(&[
            "policy",
            "prompt",
            "TTFT s",
            "TPOT ms",
            "K/V MiB",
            "TTFT x",
            "FLOP x",
            "TPOT x",
            "bytes x",
            "K/V x",
            "formula x",
        ]),
        rows: r
            .timing
            .iter()
            .map(|t| {
                vec![
                    t.policy.clone(),
                    t.prompt_len.to_string(),
                    f(t.ttft_s, 3),
                    f(t.tpot_s * 1e3, 2),
                    f(t.kv_bytes as f64 / 1048576.0, 1),
                    f(t.ttft_ratio, 3),
                    f(t.predicted_ttft_ratio, 3),
                    f(t.tpot_ratio, 3),
                    f(t.predicted_tpot_ratio, 3),
                    f(t.kv_ratio, 3),
                    f(t.predicted_kv_ratio, 3),
                ]
            })
            .collect(),
    }
}

/// Figure 4's numbers.
pub fn retrieval_table(r: &PaperReport) -> Table {
    Table {
        headers: strings(&[
            "policy",
            "length",
            "prompt tokens",
            "correct",
            "items",
            "exact match",
            "95% interval",
        ]),
        rows: r
            .retrieval
            .iter()
            .map(|p| {
                vec![
                    p.policy.clone(),
                    p.length.clone(),
                    f(p.mean_prompt_tokens, 0),
                    p.correct.to_string(),
                    p.n.to_string(),
                    f(p.accuracy, 3),
                    interval(p.ci95),
                ]
            })
            .collect(),
    }
}

/// The category table: one row per policy (with its adapter), accuracy
/// and interval per group, then agreement, KL and the efficiency ratios of
/// the `all` group.
pub fn category_table(r: &PaperReport) -> Table {
    let groups = table_groups(&r.table);
    let mut headers = strings(&["policy"]);
    headers.extend(groups.iter().map(|g| format!("{g} accuracy")));
    let at = r
        .table_timed_at
        .map_or_else(String::new, |n| format!(" @{n}"));
    headers.extend(strings(&["top-1 agreement", "mean KL", "K/V x"]));
    headers.push(format!("TTFT x{at}"));
    headers.push(format!("TPOT x{at}"));
    let rows = table_policies(&r.table)
        .into_iter()
        .map(|name| {
            let cell = |g: &str| r.table.iter().find(|x| row_name(x) == name && x.group == g);
            let mut row = vec![name.clone()];
            for g in &groups {
                row.push(cell(g).map_or_else(
                    || "–".to_string(),
                    |x| format!("{} {}", f(x.accuracy, 3), interval(x.ci95)),
                ));
            }
            let all = cell("all");
            row.push(all.map_or_else(String::new, |x| f(x.top1_agreement, 3)));
            row.push(all.map_or_else(String::new, |x| f(x.mean_kl, 3)));
            row.push(all.map_or_else(String::new, |x| f(x.kv_ratio, 3)));
            row.push(ratio(all.and_then(|x| x.ttft_ratio)));
            row.push(ratio(all.and_then(|x| x.tpot_ratio)));
            row
        })
        .collect();
    Table { headers, rows }
}

/// The loops' numbers.
pub fn loops_table(r: &PaperReport) -> Table {
    Table {
        headers: strings(&[
            "policy",
            "anchors",
            "generations",
            "looping",
            "share",
            "95% interval",
            "mean period",
            "ended on a stop token",
        ]),
        rows: r
            .loops
            .iter()
            .map(|x| {
                vec![
                    x.policy.clone(),
                    x.anchors.clone(),
                    x.generations.to_string(),
                    x.looping.to_string(),
                    f(x.share, 3),
                    interval(x.ci95),
                    f(x.mean_period, 1),
                    x.stopped.to_string(),
                ]
            })
            .collect(),
    }
}

/// Model, suite and cut, one field per row.
pub fn setting_table(r: &PaperReport) -> Table {
    let m = &r.model;
    let shard = r.suite.shard.map_or_else(
        || "all items".to_string(),
        |[i, n]| format!("shard {i}/{n}"),
    );
    let rows = [
        ("model", m.path.clone()),
        (
            "architecture",
            format!("{}, {} layers, dtype {}", m.arch, m.num_layers, m.dtype),
        ),
        (
            "suite",
            format!("{} ({} items, {shard})", r.suite.path, r.suite.items),
        ),
        ("cut C", format!("{} ({})", r.cut, r.cut_source)),
        (
            "recommended L_cut",
            r.recommended
                .map_or_else(|| "–".to_string(), |c| c.to_string()),
        ),
        ("tool version", r.tool_version.clone()),
    ];
    Table {
        headers: strings(&["field", "value"]),
        rows: rows
            .into_iter()
            .map(|(k, v)| vec![k.to_string(), v])
            .collect(),
    }
}

/// Where the answer forms per category (the logit lens of part `layers`),
/// against the comparisons' cut C; `None` when no category has the lens.
fn formation_table(r: &PaperReport) -> Option<Table> {
    let c = r.cut;
    let rows: Vec<Vec<String>> = r
        .layers
        .iter()
        .filter_map(|cat| {
            let f = cat.curves.formation()?;
            let at = |s: &[f32]| s.get(c).map_or(String::new(), |v| num(*v, 3));
            Some(vec![
                cat.kind.clone(),
                cat.prompts.to_string(),
                f.median.to_string(),
                num(f.mean, 1),
                at(&cat.curves.lens_top1),
                at(&cat.curves.lens_prob),
                at(&cat.curves.lens_formed),
            ])
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(Table {
        headers: vec![
            "kind".into(),
            "prompts".into(),
            "formation layer (median)".into(),
            "mean formation site".into(),
            format!("lens top-1 = token at C = {c}"),
            format!("lens P(token) at C = {c}"),
            format!("answers formed by C = {c}"),
        ],
        rows,
    })
}

/// The tables of `part`, in the order the report shows them.
pub fn part_tables(r: &PaperReport, part: PaperPart) -> Vec<Table> {
    match part {
        PaperPart::Layers => formation_table(r).into_iter().collect(),
        PaperPart::Masses => vec![],
        PaperPart::Timing if !r.timing.is_empty() => vec![timing_table(r)],
        PaperPart::Retrieval if !r.retrieval.is_empty() => vec![retrieval_table(r)],
        PaperPart::Table if !r.table.is_empty() => vec![category_table(r)],
        PaperPart::Loops if !r.loops.is_empty() => vec![loops_table(r)],
        _ => vec![],
    }
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut out = headers.join(",");
    out.push('\n');
    for row in rows {
        out.push_str(
            &row.iter()
                .map(|c| csv_cell(c))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    out
}

fn full(x: f64) -> String {
    if x.is_finite() {
        x.to_string()
    } else {
        String::new()
    }
}

/// Per-layer curves of named series (Figures 1 and 3): one row per
/// (series, layer), one column per LAYER_METRICS entry.
fn curves_csv<'a>(
    key: &str,
    series: impl Iterator<Item = (&'a str, &'a lcut_trace::LayerCurves)>,
) -> String {
    let mut headers = vec![key, "layer"];
    headers.extend(LAYER_METRICS.iter().map(|m| m.name));
    let mut rows = Vec::new();
    for (name, c) in series {
        for l in 0..c.num_layers {
            let mut row = vec![name.to_string(), l.to_string()];
            row.extend(
                LAYER_METRICS
                    .iter()
                    .map(|m| full(f64::from(m.row_value(c, l)))),
            );
            rows.push(row);
        }
    }
    csv(&headers, rows)
}

/// The CSV of `part` (file stem and text), `None` when it has no numbers.
pub fn part_csv(r: &PaperReport, part: PaperPart) -> Option<(String, String)> {
    let text = match part {
        PaperPart::Masses if !r.masses.is_empty() => curves_csv(
            "policy",
            r.masses.iter().map(|p| (p.policy.as_str(), &p.curves)),
        ),
        PaperPart::Layers if !r.layers.is_empty() => curves_csv(
            "kind",
            r.layers.iter().map(|c| (c.kind.as_str(), &c.curves)),
        ),
        PaperPart::Timing if !r.timing.is_empty() => csv(
            &[
                "policy",
                "prompt_len",
                "new_tokens",
                "ttft_s",
                "tpot_s",
                "kv_bytes",
                "ttft_ratio",
                "tpot_ratio",
                "kv_ratio",
                "predicted_ttft_ratio",
                "predicted_tpot_ratio",
                "predicted_kv_ratio",
            ],
            r.timing
                .iter()
                .map(|t| {
                    vec![
                        t.policy.clone(),
                        t.prompt_len.to_string(),
                        t.new_tokens.to_string(),
                        full(t.ttft_s),
                        full(t.tpot_s),
                        t.kv_bytes.to_string(),
                        full(t.ttft_ratio),
                        full(t.tpot_ratio),
                        full(t.kv_ratio),
                        full(t.predicted_ttft_ratio),
                        full(t.predicted_tpot_ratio),
                        full(t.predicted_kv_ratio),
                    ]
                })
                .collect(),
        ),
        PaperPart::Retrieval if !r.retrieval.is_empty() => csv(
            &[
                "policy",
                "length",
                "mean_prompt_tokens",
                "correct",
                "n",
                "accuracy",
                "ci_low",
                "ci_high",
            ],
            r.retrieval
                .iter()
                .map(|p| {
                    vec![
                        p.policy.clone(),
                        p.length.clone(),
                        full(p.mean_prompt_tokens),
                        p.correct.to_string(),
                        p.n.to_string(),
                        full(p.accuracy),
                        full(p.ci95[0]),
                        full(p.ci95[1]),
                    ]
                })
                .collect(),
        ),
        PaperPart::Table if !r.table.is_empty() => csv(
            &[
                "policy",
                "adapter",
                "group",
                "n",
                "correct",
                "accuracy",
                "ci_low",
                "ci_high",
                "full_correct",
                "top1_agreement",
                "mean_kl",
                "kv_ratio",
                "ttft_ratio",
                "tpot_ratio",
            ],
            r.table
                .iter()
                .map(|x| {
                    vec![
                        x.policy.clone(),
                        x.adapter.clone().unwrap_or_default(),
                        x.group.clone(),
                        x.n.to_string(),
                        x.correct.to_string(),
                        full(x.accuracy),
                        full(x.ci95[0]),
                        full(x.ci95[1]),
                        x.full_correct.to_string(),
                        full(x.top1_agreement),
                        full(x.mean_kl),
                        full(x.kv_ratio),
                        x.ttft_ratio.map_or_else(String::new, full),
                        x.tpot_ratio.map_or_else(String::new, full),
                    ]
                })
                .collect(),
        ),
        PaperPart::Loops if !r.loops.is_empty() => csv(
            &[
                "policy",
                "family",
                "anchors",
                "generations",
                "looping",
                "share",
                "ci_low",
                "ci_high",
                "stopped",
                "mean_period",
            ],
            r.loops
                .iter()
                .map(|x| {
                    vec![
                        x.policy.clone(),
                        x.family.clone(),
                        x.anchors.clone(),
                        x.generations.to_string(),
                        x.looping.to_string(),
                        full(x.share),
                        full(x.ci95[0]),
                        full(x.ci95[1]),
                        x.stopped.to_string(),
                        full(x.mean_period),
                    ]
                })
                .collect(),
        ),
        _ => return None,
    };
    Some((format!("{}-{}", part.number(), part.name()), text))
}
