//! The report of a leaderboard run (`lcut eval --suite ... --ratios ...`):
//! one self-contained HTML page with the plot of score against compression
//! ratio per method, the mapping of each ratio to each family's knob, and
//! the tables over all tasks and per task; and the CSV in kvpress's
//! leaderboard columns (`dataset, data_dir, model, method,
//! compression_ratio, score`) followed by lcut's own.

use std::fmt::Write;

use lcut_trace::{LeaderboardCell, LeaderboardTable};

use crate::frontier::frontier_chart;
use crate::frontier_points::{Frontier, FrontierAxis};
use crate::lines::LineChart;
use crate::svg::escape;
use crate::tables::Table;

/// kvpress's leaderboard columns, then lcut's.
pub const LEADERBOARD_COLUMNS: [&str; 20] = [
    "dataset",
    "data_dir",
    "model",
    "method",
    "compression_ratio",
    "score",
    "task",
    "policy",
    "n",
    "score_ci_low",
    "score_ci_high",
    "full_score",
    "kv_bytes_held",
    "kv_bytes_full",
    "kv_ratio",
    "prompt_kv_removed",
    "ttft_ratio",
    "tpot_ratio",
    "prefill_flops_ratio",
    "compute_saved",
];

/// kvpress's name of the uncompressed model.
const NO_PRESS: &str = "no_press";

fn method_name(t: &LeaderboardTable, config: usize) -> String {
    let c = &t.configs[config];
    if c.family == "full" {
        NO_PRESS.into()
    } else {
        c.method.clone()
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(String::new, |v| format!("{v:.4}"))
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The table as CSV: one row per (task, configuration), the `all` rows
/// (kvpress's leaderboard score: the mean over tasks) first. `score` is on
/// kvpress's scale, 0 to 100; the other shares are in [0, 1].
pub fn render_leaderboard_csv(t: &LeaderboardTable) -> String {
    let mut out = LEADERBOARD_COLUMNS.join(",");
    out.push('\n');
    let order = std::iter::once("all").chain(t.tasks.iter().map(String::as_str));
    for task in order {
        for config in 0..t.configs.len() {
            let Some(c) = t.cell(task, config) else {
                continue;
            };
            let kv_ratio = c.kv_bytes_held / c.kv_bytes_full.max(f64::MIN_POSITIVE);
            let row = [
                t.dataset.clone(),
                t.data_dir.clone(),
                t.model.clone(),
                method_name(t, config),
                format!("{:.3}", t.compression_ratio(config)),
                format!("{:.2}", c.score * 100.0),
                task.to_string(),
                t.configs[config].policy.clone(),
                c.n.to_string(),
                format!("{:.4}", c.ci95[0]),
                format!("{:.4}", c.ci95[1]),
                format!("{:.4}", c.full_score),
                format!("{:.0}", c.kv_bytes_held),
                format!("{:.0}", c.kv_bytes_full),
                format!("{kv_ratio:.4}"),
                format!("{:.4}", c.prompt_kv_removed),
                opt(c.ttft_ratio),
                opt(c.tpot_ratio),
                opt(c.prefill_flops_ratio),
                opt(c.prefill_flops_ratio.map(|f| 1.0 - f)),
            ];
            let row: Vec<String> = row.iter().map(|s| csv_field(s)).collect();
            out.push_str(&row.join(","));
            out.push('\n');
        }
    }
    out
}

/// Score against compression ratio, one line per method (the full
/// model's score as a horizontal line, each point with its 95% interval),
/// over all tasks or one: the frontier figure on the ratio axis.
pub fn leaderboard_chart(t: &LeaderboardTable, task: &str) -> LineChart {
    let f = Frontier::from_leaderboard(t, task, FrontierAxis::CompressionRatio);
    let mut chart = frontier_chart(
        &f,
        &format!("{task}: score against the share of prompt K/V removed"),
    );
    chart.y_label = "score (95% interval)".into();
    chart
}

/// Score against the K/V held (measured share of full's), one line per
/// method, over all tasks.
pub fn leaderboard_kv_chart(t: &LeaderboardTable) -> LineChart {
    let f = Frontier::from_leaderboard(t, "all", FrontierAxis::KvHeld);
    let mut chart = frontier_chart(&f, "all: score against the K/V held");
    chart.y_label = "score (95% interval)".into();
    chart
}

/// One row per configuration over `task`.
fn cells_table(t: &LeaderboardTable, task: &str) -> Table {
    let headers = [
        "method",
        "ratio",
        "policy",
        "n",
        "score [95%]",
        "full",
        "K/V held (MiB)",
        "K/V vs full",
        "prompt K/V removed",
        "TTFT x",
        "TPOT x",
        "prefill FLOPs x",
        "timed",
    ];
    let rows = (0..t.configs.len())
        .filter_map(|c| t.cell(task, c).map(|cell| (c, cell)))
        .map(|(c, cell): (usize, &LeaderboardCell)| {
            vec![
                method_name(t, c),
                format!("{:.3}", t.compression_ratio(c)),
                t.configs[c].policy.clone(),
                cell.n.to_string(),
                format!(
                    "{:.3} [{:.3}, {:.3}]",
                    cell.score, cell.ci95[0], cell.ci95[1]
                ),
                format!("{:.3}", cell.full_score),
                format!("{:.2}", cell.kv_bytes_held / (1024.0 * 1024.0)),
                format!(
                    "{:.3}",
                    cell.kv_bytes_held / cell.kv_bytes_full.max(f64::MIN_POSITIVE)
                ),
                format!("{:.3}", cell.prompt_kv_removed),
                opt(cell.ttft_ratio),
                opt(cell.tpot_ratio),
                opt(cell.prefill_flops_ratio),
                cell.timed.to_string(),
            ]
        })
        .collect();
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// Each configuration's knob and how it was chosen.
fn mapping_table(t: &LeaderboardTable) -> Table {
    Table {
        headers: ["method", "ratio", "policy", "removed by the formula", "how"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows: t
            .configs
            .iter()
            .map(|c| {
                vec![
                    c.method.clone(),
                    c.ratio.map_or_else(|| "-".into(), |r| format!("{r}")),
                    c.policy.clone(),
                    format!("{:.3}", c.formula_removed),
                    c.note.clone(),
                ]
            })
            .collect(),
    }
}

/// Score per task (rows) and configuration (columns).
fn task_grid(t: &LeaderboardTable) -> Table {
    let mut headers = vec!["task".to_string()];
    headers.extend((0..t.configs.len()).map(|c| {
        let cfg = &t.configs[c];
        match cfg.ratio {
            Some(r) => format!("{} @ {r}", cfg.method),
            None => cfg.method.clone(),
        }
    }));
    let rows = t
        .tasks
        .iter()
        .map(String::as_str)
        .chain(std::iter::once("all"))
        .map(|task| {
            let mut row = vec![task.to_string()];
            row.extend((0..t.configs.len()).map(|c| {
                t.cell(task, c)
                    .map_or_else(String::new, |cell| format!("{:.2}", cell.score * 100.0))
            }));
            row
        })
        .collect();
    Table { headers, rows }
}

/// The leaderboard run as one HTML document.
pub fn render_leaderboard_html(t: &LeaderboardTable) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>lcut leaderboard: {m}</title><style>{style}</style></head><body>\
         <h1>Leaderboard: {m} on {d} {dd}</h1>\
         <p>Suite <code>{s}</code>, {n} items, weights {dt}, {secs:.0} s of item wall time.</p>",
        m = escape(&t.model),
        d = escape(&t.dataset),
        dd = escape(&t.data_dir),
        s = escape(&t.suite),
        n = t.items,
        dt = escape(&t.dtype),
        secs = t.seconds,
        style = crate::html::STYLE
    );
    let _ = write!(
        out,
        "<figure>{}<figcaption>Mean score over the tasks (kvpress's leaderboard average) \
         against the compression ratio, one line per method; the horizontal line is the full \
         model's.</figcaption></figure>",
        leaderboard_chart(t, "all").to_svg()
    );
    let _ = write!(
        out,
        "<figure>{}<figcaption>The same scores against the K/V each method holds, measured          (a share of the full model's, the decode phase's K/V included).</figcaption></figure>",
        leaderboard_kv_chart(t).to_svg()
    );
    out.push_str("<h2>All tasks</h2>");
    crate::html::table(&mut out, &cells_table(t, "all"));
    out.push_str("<h2>Score per task (0 to 100)</h2>");
    crate::html::table(&mut out, &task_grid(t));
    out.push_str("<h2>Each ratio's knob</h2>");
    crate::html::table(&mut out, &mapping_table(t));
    for task in &t.tasks {
        let _ = write!(out, "<h2>{}</h2>", escape(task));
        let _ = write!(
            out,
            "<figure>{}</figure>",
            leaderboard_chart(t, task).to_svg()
        );
        crate::html::table(&mut out, &cells_table(t, task));
    }
    out.push_str("<h2>How it was measured</h2><ul>");
    for note in &t.notes {
        let _ = write!(out, "<li>{}</li>", escape(note));
    }
    out.push_str("</ul></body></html>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::LeaderboardConfig;

    fn config(method: &str, family: &str, ratio: Option<f64>, policy: &str) -> LeaderboardConfig {
        LeaderboardConfig {
            method: method.into(),
            family: family.into(),
            ratio,
            policy: policy.into(),
            formula_removed: ratio.unwrap_or(0.0),
            note: "n".into(),
        }
    }

    fn cell(task: &str, config: usize, score: f64) -> LeaderboardCell {
        LeaderboardCell {
            task: task.into(),
            config,
            n: 4,
            score,
            ci95: [score / 2.0, 1.0],
            full_score: 0.9,
            kv_bytes_held: 50.0,
            kv_bytes_full: 100.0,
            prompt_kv_removed: 0.5,
            timed: 1,
            ttft_ratio: Some(0.8),
            tpot_ratio: None,
            prefill_flops_ratio: Some(0.75),
        }
    }

    fn table() -> LeaderboardTable {
        LeaderboardTable {
            dataset: "ruler".into(),
            data_dir: "4096".into(),
            model: "m,1".into(),
            suite: "s".into(),
            dtype: "q".into(),
            ratios: vec![0.25, 0.5],
            configs: vec![
                config("full", "full", None, "full"),
                config("speed+bos", "speed", Some(0.25), "speed:22+bos"),
                config("speed+bos", "speed", Some(0.5), "speed:15+bos"),
            ],
            tasks: vec!["vt".into()],
            cells: (0..3)
                .flat_map(|c| [cell("vt", c, 0.5), cell("all", c, 1.0 - 0.25 * c as f64)])
                .collect(),
            items: 4,
            seconds: 1.0,
            notes: vec!["how".into()],
        }
    }

    #[test]
    fn the_csv_has_kvpress_columns_then_lcut_s() {
        let csv = render_leaderboard_csv(&table());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], LEADERBOARD_COLUMNS.join(","));
        assert!(lines[0].starts_with("dataset,data_dir,model,method,compression_ratio,score,"));
        // the `all` rows first; full as kvpress's no_press at 0; score 0-100;
        // a comma in a field quoted
        assert!(
            lines[1].starts_with("ruler,4096,\"m,1\",no_press,0.000,100.00,all,full,4,"),
            "{}",
            lines[1]
        );
        assert!(lines[3].starts_with("ruler,4096,\"m,1\",speed+bos,0.500,50.00,all,speed:15+bos"));
        assert!(lines[4].contains(",vt,"));
        assert_eq!(lines.len(), 1 + 3 * 2);
        // compute saved is 1 - the FLOP ratio; a missing TPOT stays empty
        assert!(lines[2].ends_with(",0.8000,,0.7500,0.2500"), "{}", lines[2]);
        for l in &lines[1..] {
            assert_eq!(
                l.replace("\"m,1\"", "m").split(',').count(),
                LEADERBOARD_COLUMNS.len()
            );
        }
    }

    #[test]
    fn the_page_plots_score_against_ratio_per_method() {
        let t = table();
        let chart = leaderboard_chart(&t, "all");
        assert_eq!(chart.lines.len(), 1);
        assert_eq!(chart.lines[0].points, [(0.25, 0.75), (0.5, 0.5)]);
        assert_eq!(chart.hlines[0].0, 1.0);
        let html = render_leaderboard_html(&t);
        assert!(html.contains("<svg") && html.contains("speed:15+bos") && html.contains("how"));
    }
}
