//! The report of a leaderboard run (`lcut eval --suite ... --ratios ...`):
//! one self-contained HTML page with the plot of score against compression
//! ratio per method, the mapping of each ratio to each family's knob, and
//! the tables over all tasks and per task; and the CSV in kvpress's
//! leaderboard columns (`dataset, data_dir, model, method,
//! compression_ratio, score`) followed by lcut's own; and, from the paired
//! comparisons of its configurations, which methods beat which at each
//! ratio (a "beats" column, a table per ratio, every pair as CSV).

use std::fmt::Write;

use lcut_trace::{LeaderboardCell, LeaderboardPairs, LeaderboardTable, PairComparison};

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

/// One row per configuration over `task`; with `pairs` (over all tasks),
/// a last column of the methods each beats at its ratio.
fn cells_table(t: &LeaderboardTable, task: &str, pairs: Option<&LeaderboardPairs>) -> Table {
    let mut headers = vec![
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
    if pairs.is_some() {
        headers.push("beats (95%, Holm)");
    }
    let rows = (0..t.configs.len())
        .filter_map(|c| t.cell(task, c).map(|cell| (c, cell)))
        .map(|(c, cell): (usize, &LeaderboardCell)| {
            let mut row = vec![
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
            ];
            if let Some(pairs) = pairs {
                row.push(beats_text(t, pairs, c));
            }
            row
        })
        .collect();
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// The methods `config` beats, named, at each ratio it is compared at
/// (the full model at every ratio, each prefixed by its ratio); `-` for
/// none.
pub fn beats_text(t: &LeaderboardTable, pairs: &LeaderboardPairs, config: usize) -> String {
    let names = |cs: Vec<usize>| {
        cs.into_iter()
            .map(|c| method_name(t, c))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let groups: Vec<&str> = pairs
        .groups()
        .into_iter()
        .filter(|g| pairs.members(g).contains(&config))
        .collect();
    let parts: Vec<String> = groups
        .iter()
        .filter_map(|g| {
            let beaten = pairs.beats(g, config);
            match (beaten.is_empty(), groups.len()) {
                (true, _) => None,
                (false, 1) => Some(names(beaten)),
                (false, _) => Some(format!("{g}: {}", names(beaten))),
            }
        })
        .collect();
    match parts.is_empty() {
        true => "-".into(),
        false => parts.join("; "),
    }
}

/// The columns of the pairs' CSV (`leaderboard-pairs.csv`): McNemar's `b`
/// (items the first method scored higher on) and `c` (the second), the
/// items both scored (`n`) and those only one did, the p-value and its
/// Holm adjustment over the ratio's pairs, and the verdict.
pub const PAIR_COLUMNS: [&str; 18] = [
    "ratio", "method_a", "policy_a", "method_b", "policy_b", "test", "n", "only_a", "only_b",
    "score_a", "score_b", "b", "c", "p", "p_holm", "alpha", "verdict", "winner",
];

/// A p-value for a table: six decimals, or three significant digits in
/// exponent form below 1e-4; empty when there is none.
fn p_text(p: Option<f64>) -> String {
    match p {
        None => String::new(),
        Some(p) if p != 0.0 && p < 1e-4 => format!("{p:.2e}"),
        Some(p) => format!("{p:.6}"),
    }
}

/// Every pair of configurations compared as CSV, one row a pair, group
/// by group (the full model as kvpress's `no_press`; scores 0 to 100 as in
/// the leaderboard's CSV; `winner` the method the verdict names, empty for
/// a tie).
pub fn render_leaderboard_pairs_csv(t: &LeaderboardTable, pairs: &LeaderboardPairs) -> String {
    let mut out = PAIR_COLUMNS.join(",");
    out.push('\n');
    for p in &pairs.pairs {
        let row = [
            p.group.clone(),
            method_name(t, p.config_a),
            t.configs[p.config_a].policy.clone(),
            method_name(t, p.config_b),
            t.configs[p.config_b].policy.clone(),
            p.test.label().to_string(),
            p.n.to_string(),
            p.only_a.to_string(),
            p.only_b.to_string(),
            format!("{:.2}", p.score_a * 100.0),
            format!("{:.2}", p.score_b * 100.0),
            p.b.to_string(),
            p.c.to_string(),
            p_text(p.p),
            p_text(p.p_holm),
            format!("{}", pairs.alpha),
            p.verdict.name().to_string(),
            p.winner().map_or_else(String::new, |w| method_name(t, w)),
        ];
        let row: Vec<String> = row.iter().map(|s| csv_field(s)).collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// One ratio's configurations, best score first: each one's score over all
/// tasks with its interval, the methods it beats, those that beat it and
/// those it is tied with.
fn group_table(t: &LeaderboardTable, pairs: &LeaderboardPairs, group: &str) -> Table {
    let names = |cs: Vec<usize>| match cs.is_empty() {
        true => "-".to_string(),
        false => cs
            .into_iter()
            .map(|c| method_name(t, c))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let score = |c: usize| t.cell("all", c).map_or(f64::NEG_INFINITY, |x| x.score);
    let mut members = pairs.members(group);
    members.sort_by(|&x, &y| score(y).total_cmp(&score(x)));
    let rows = members
        .into_iter()
        .map(|c| {
            vec![
                method_name(t, c),
                t.configs[c].policy.clone(),
                t.cell("all", c).map_or_else(String::new, |x| {
                    format!(
                        "{:.1} [{:.1}, {:.1}]",
                        x.score * 100.0,
                        x.ci95[0] * 100.0,
                        x.ci95[1] * 100.0
                    )
                }),
                names(pairs.beats(group, c)),
                names(pairs.beaten_by(group, c)),
                names(pairs.tied_with(group, c)),
            ]
        })
        .collect();
    Table {
        headers: [
            "method",
            "policy",
            "score [95%]",
            "beats",
            "beaten by",
            "tied with",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    }
}

/// Every pair of one group: the test, the items, the discordant counts,
/// the p-values and the verdict.
fn pairs_table(t: &LeaderboardTable, pairs: &[&PairComparison]) -> Table {
    let rows = pairs
        .iter()
        .map(|p| {
            let items = match (p.only_a, p.only_b) {
                (0, 0) => p.n.to_string(),
                (a, b) => format!("{} ({a} only a, {b} only b)", p.n),
            };
            vec![
                method_name(t, p.config_a),
                method_name(t, p.config_b),
                p.test.label().to_string(),
                items,
                format!("{:.1} / {:.1}", p.score_a * 100.0, p.score_b * 100.0),
                format!("{} / {}", p.b, p.c),
                p_text(p.p),
                p_text(p.p_holm),
                match p.winner() {
                    Some(w) => format!("{} beats", method_name(t, w)),
                    None => p.verdict.name().replace('_', " "),
                },
            ]
        })
        .collect();
    Table {
        headers: [
            "a",
            "b",
            "test",
            "items",
            "score a / b",
            "b / c (a higher / b higher)",
            "p",
            "p (Holm)",
            "verdict",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    }
}

/// The section of the page that says which methods beat which.
fn pairs_section(out: &mut String, t: &LeaderboardTable, pairs: &LeaderboardPairs) {
    let _ = write!(
        out,
        "<h2>Which methods beat which (paired, 95%, Holm)</h2><p>At each ratio every pair of \
         methods, the full model among them, is compared on the items both scored: the exact \
         McNemar test where every one of those items scored 0 or 1 under both, else a paired \
         bootstrap of the mean score difference ({r} resamples, seed {s}). The p-values of one \
         ratio's pairs are adjusted together by Holm's step-down; a method <em>beats</em> \
         another when its score is higher and the adjusted p-value is at most {a}, and two \
         methods are <em>tied</em> when this run cannot tell them apart. Tied is not equal: \
         more items may part them.</p>",
        r = pairs.bootstrap_resamples,
        s = pairs.bootstrap_seed,
        a = pairs.alpha,
    );
    for group in pairs.groups() {
        let title = match pairs
            .pairs
            .iter()
            .find(|p| p.group == group)
            .and_then(|p| p.ratio)
        {
            Some(_) => format!("Ratio {group}"),
            None => "Methods with their own knob".to_string(),
        };
        let _ = write!(out, "<h3>{}</h3>", escape(&title));
        crate::html::table(out, &group_table(t, pairs, group));
        let of_group: Vec<&PairComparison> =
            pairs.pairs.iter().filter(|p| p.group == group).collect();
        let _ = write!(
            out,
            "<details><summary>every pair ({})</summary>",
            of_group.len()
        );
        crate::html::table(out, &pairs_table(t, &of_group));
        out.push_str("</details>");
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

/// The leaderboard run as one HTML document: the figures, the table over
/// all tasks with what each method beats, which methods beat which at
/// each ratio (`pairs`), each task's scores and each ratio's knob.
pub fn render_leaderboard_html(t: &LeaderboardTable, pairs: &LeaderboardPairs) -> String {
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
         against the compression ratio, one line per method, each point's whisker its 95% \
         interval; the horizontal line is the full model's. Intervals that overlap do not \
         make a tie, nor do apart ones a win: the paired comparisons below say which \
         differences are real.</figcaption></figure>",
        leaderboard_chart(t, "all").to_svg()
    );
    let _ = write!(
        out,
        "<figure>{}<figcaption>The same scores against the K/V each method holds, measured \
         (a share of the full model's, the decode phase's K/V included).</figcaption></figure>",
        leaderboard_kv_chart(t).to_svg()
    );
    out.push_str("<h2>All tasks</h2>");
    crate::html::table(&mut out, &cells_table(t, "all", Some(pairs)));
    pairs_section(&mut out, t, pairs);
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
        crate::html::table(&mut out, &cells_table(t, task, None));
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
    use lcut_diag::{PairSettings, PairedScores, compare_configs};
    use lcut_trace::{LeaderboardConfig, PairVerdict};

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
        // every point has its 95% interval as an error bar
        assert_eq!(chart.whiskers.len(), 2);
        assert!(chart.to_svg().matches("class=\"ci\"").count() == 2);
        let html = render_leaderboard_html(&t, &pairs(&t));
        assert!(html.contains("<svg") && html.contains("speed:15+bos") && html.contains("how"));
    }

    /// 40 right-or-wrong items: the full model right on 30, SPEED at 0.25
    /// on 29 of them, SPEED at 0.5 on 3.
    fn pairs(t: &LeaderboardTable) -> LeaderboardPairs {
        let mut s = PairedScores::new(3);
        for i in 0..40 {
            let id = format!("vt-{i:03}");
            for (c, right) in [i < 30, i < 29, i < 3].into_iter().enumerate() {
                s.insert(c, &id, f64::from(u8::from(right))).unwrap();
            }
        }
        compare_configs(&t.configs, &s, &PairSettings::default()).unwrap()
    }

    #[test]
    fn the_table_says_which_methods_beat_which() {
        let t = table();
        let pairs = pairs(&t);
        // the full model beats SPEED at 0.5 (27 items against none) and is
        // tied with it at 0.25 (one item)
        assert_eq!(
            pairs.pair("0.5", 0, 2).unwrap().verdict,
            PairVerdict::ABeatsB
        );
        assert_eq!(pairs.pair("0.25", 0, 1).unwrap().verdict, PairVerdict::Tied);
        assert_eq!(beats_text(&t, &pairs, 0), "0.5: speed+bos");
        assert_eq!(beats_text(&t, &pairs, 1), "-");
        assert_eq!(beats_text(&t, &pairs, 2), "-");
        let all = cells_table(&t, "all", Some(&pairs));
        assert_eq!(all.headers.last().unwrap(), "beats (95%, Holm)");
        assert_eq!(all.rows[0].last().unwrap(), "0.5: speed+bos");
        // a task's table has no such column: the pairs are over all items
        assert_eq!(
            cells_table(&t, "vt", None).headers.len() + 1,
            all.headers.len()
        );
        let at_half = group_table(&t, &pairs, "0.5");
        assert_eq!(
            at_half.rows[0][..4],
            ["no_press", "full", "100.0 [50.0, 100.0]", "speed+bos"]
        );
        assert_eq!(at_half.rows[1][4], "no_press");
        let at_quarter = group_table(&t, &pairs, "0.25");
        assert_eq!(at_quarter.rows[0][5], "speed+bos");
        let html = render_leaderboard_html(&t, &pairs);
        assert!(
            html.contains("Which methods beat which (paired, 95%, Holm)"),
            "html"
        );
        assert!(
            html.contains("Ratio 0.5") && html.contains("McNemar (exact)"),
            "html"
        );
        assert!(html.contains("no_press beats"), "html");
    }

    #[test]
    fn the_pairs_csv_has_b_c_n_p_p_holm_and_the_verdict() {
        let t = table();
        let csv = render_leaderboard_pairs_csv(&t, &pairs(&t));
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], PAIR_COLUMNS.join(","));
        assert_eq!(lines.len(), 1 + 2);
        assert_eq!(
            lines[1],
            "0.25,no_press,full,speed+bos,speed:22+bos,McNemar (exact),40,0,0,75.00,72.50,1,0,\
             1.000000,1.000000,0.05,tied,"
        );
        // 27 discordant items one way: p = 2 / 2^27, the only pair at 0.5 (Holm
        // leaves it as it is)
        assert!(
            lines[2].starts_with(
                "0.5,no_press,full,speed+bos,speed:15+bos,McNemar (exact),40,0,0,75.00,7.50,27,0,\
                 1.49e-8,1.49e-8,0.05,a_beats_b,no_press"
            ),
            "{}",
            lines[2]
        );
    }
}
