//! Markdown export: the recommendation and every table (no figures).

use std::fmt::Write;

use lcut_trace::Report;

use crate::knockout::knockout_sentence;
use crate::lens::{lens_prompt_table, report_formation_sentence};
use crate::routing::routing_sentence;
use crate::svg::num;
use crate::tables::{
    Table, accuracy_table, expected_accuracy_line, layer_table, made_by_line, model_table,
    policy_axis_table, prompt_table, recall_table, state_split_sentence, sweep_table, votes_table,
};

/// Escapes text for a Markdown table cell.
pub(crate) fn cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('\n', " ")
}

/// Writes `t` as a Markdown table.
pub(crate) fn table(out: &mut String, t: &Table) {
    let row = |cells: &[String]| {
        format!(
            "| {} |\n",
            cells
                .iter()
                .map(|c| cell(c))
                .collect::<Vec<_>>()
                .join(" | ")
        )
    };
    out.push_str(&row(&t.headers));
    out.push_str(&format!("|{}\n", "---|".repeat(t.headers.len())));
    for r in &t.rows {
        out.push_str(&row(r));
    }
    out.push('\n');
}

/// Renders the report as Markdown.
pub fn render_markdown(r: &Report) -> String {
    let rec = &r.recommendation;
    let mut out = format!("# lcut report: {}\n\n", cell(&r.model.path));
    let _ = writeln!(
        out,
        "**Recommended L_cut = {} of {} layers** (SPEED drops {}% of decode-to-prefill attention).\n",
        rec.l_cut,
        rec.num_layers,
        num(100.0 * rec.tail_mass_dropped, 2)
    );
    if let Some(line) = made_by_line(&r.made_by) {
        let _ = writeln!(out, "{line}\n");
    }
    out.push_str("## Recommendation\n\n");
    for line in rec.explanation.lines() {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    table(&mut out, &votes_table(r));
    if let Some(line) = report_formation_sentence(r) {
        out.push_str("## Where the answer forms\n\n");
        let _ = writeln!(out, "{line}\n");
        if let Some(t) = lens_prompt_table(r) {
            table(&mut out, &t);
        }
    }
    if let Some(line) = knockout_sentence(r) {
        out.push_str("## Where the prompt matters\n\n");
        let _ = writeln!(out, "{line}\n");
    }
    if let Some(line) = routing_sentence(r) {
        out.push_str("## How the experts route\n\n");
        let _ = writeln!(out, "{line}\n");
    }
    out.push_str("## Per-layer curves\n\n");
    if let Some(line) = state_split_sentence(r) {
        let _ = writeln!(out, "{line}\n");
    }
    table(&mut out, &layer_table(r));
    if let Some(s) = &r.sweep {
        let _ = writeln!(
            out,
            "## Sweep at {} tokens\n\nKnee: {}.\n",
            s.context_len,
            s.knee
                .map_or_else(|| "none".to_string(), |k| format!("L_cut = {k}"))
        );
        if let Some(line) = made_by_line(&s.made_by) {
            let _ = writeln!(out, "{line}\n");
        }
        table(&mut out, &sweep_table(s));
        if let Some(t) = policy_axis_table(s) {
            out.push_str("## Other policies on the same prompts\n\n");
            table(&mut out, &t);
        }
        if let Some(t) = accuracy_table(s) {
            out.push_str("## Accuracy on the task suite\n\n");
            if let Some(line) = expected_accuracy_line(r) {
                let _ = writeln!(out, "{line}\n");
            }
            table(&mut out, &t);
        }
        if let Some(t) = recall_table(s) {
            out.push_str("## Attention recall per layer\n\n");
            table(&mut out, &t);
        }
    }
    out.push_str("## Prompts\n\n");
    table(&mut out, &prompt_table(r));
    out.push_str("## Model and settings\n\n");
    table(&mut out, &model_table(r));
    out
}
