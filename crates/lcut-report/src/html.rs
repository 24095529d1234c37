//! One self-contained HTML file: inline CSS and SVG, no scripts, no external assets.

use std::fmt::Write;

use lcut_trace::Report;

use crate::figures::figures;
use crate::knockout::knockout_sentence;
use crate::lens::{lens_prompt_table, report_formation_sentence};
use crate::routing::routing_sentence;
use crate::svg::{escape, num};
use crate::tables::{
    Table, accuracy_table, expected_accuracy_line, layer_table, made_by_line, model_table,
    policy_axis_table, prompt_table, recall_table, state_split_sentence, sweep_table, votes_table,
};

/// Options of the HTML export.
#[derive(Debug, Clone, Default)]
pub struct HtmlOptions {
    /// Index into `report.traces` of the prompt shown in per-prompt figures;
    /// `None` picks the one with the most decode steps.
    pub prompt: Option<usize>,
}

pub(crate) const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}\
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}\
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}\
td:first-child,th:first-child{text-align:left}\
figure{margin:1.5em 0}figcaption{font-size:.85em;color:#555}\
.cut{font-size:1.3em;padding:.6em 1em;background:#fdf1f1;border-left:4px solid #d62728}\
pre{white-space:pre-wrap;background:#f7f7f7;padding:.8em}";

/// Writes `t` as an HTML table.
pub(crate) fn table(out: &mut String, t: &Table) {
    out.push_str("<table><thead><tr>");
    for h in &t.headers {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in &t.rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", escape(cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

/// Renders the report as one HTML document.
pub fn render_html(r: &Report, opts: &HtmlOptions) -> String {
    let rec = &r.recommendation;
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>lcut report: {model}</title><style>{STYLE}</style></head><body>\
         <h1>lcut report: {model}</h1>\
         <p class=\"cut\">Recommended L_cut = <b>{cut}</b> of {l} layers \
         (SPEED drops {drop}% of decode-to-prefill attention)</p>",
        model = escape(&r.model.path),
        cut = rec.l_cut,
        l = rec.num_layers,
        drop = num(100.0 * rec.tail_mass_dropped, 2)
    );
    if let Some(line) = made_by_line(&r.made_by) {
        let _ = write!(out, "<p>{}</p>", escape(&line));
    }
    out.push_str("<h2>Recommendation</h2>");
    let _ = write!(out, "<pre>{}</pre>", escape(&rec.explanation));
    table(&mut out, &votes_table(r));
    if let Some(s) = &r.sweep {
        let knee = s.knee.map_or_else(|| "none".to_string(), |k| k.to_string());
        let _ = write!(
            out,
            "<p>Empirical knee of the sweep: L_cut = {} (recommended {}).</p>",
            escape(&knee),
            rec.l_cut
        );
        if let Some(line) = made_by_line(&s.made_by) {
            let _ = write!(out, "<p>{}</p>", escape(&line));
        }
    }
    if let Some(line) = report_formation_sentence(r) {
        out.push_str("<h2>Where the answer forms</h2>");
        let _ = write!(out, "<p>{}</p>", escape(&line));
        if let Some(t) = lens_prompt_table(r) {
            table(&mut out, &t);
        }
    }
    if let Some(line) = knockout_sentence(r) {
        out.push_str("<h2>Where the prompt matters</h2>");
        let _ = write!(out, "<p>{}</p>", escape(&line));
    }
    if let Some(line) = routing_sentence(r) {
        out.push_str("<h2>How the experts route</h2>");
        let _ = write!(out, "<p>{}</p>", escape(&line));
    }
    out.push_str("<h2>Figures</h2>");
    for f in figures(r, opts.prompt) {
        let _ = write!(
            out,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            f.svg,
            escape(&f.caption)
        );
    }
    out.push_str("<h2>Per-layer curves</h2>");
    if let Some(line) = state_split_sentence(r) {
        let _ = write!(out, "<p>{}</p>", escape(&line));
    }
    table(&mut out, &layer_table(r));
    if let Some(s) = &r.sweep {
        out.push_str("<h2>Sweep</h2>");
        table(&mut out, &sweep_table(s));
        if let Some(t) = policy_axis_table(s) {
            out.push_str("<h2>Other policies on the same prompts</h2>");
            table(&mut out, &t);
        }
        if let Some(t) = accuracy_table(s) {
            out.push_str("<h2>Accuracy on the task suite</h2>");
            if let Some(line) = expected_accuracy_line(r) {
                let _ = write!(out, "<p>{}</p>", escape(&line));
            }
            table(&mut out, &t);
        }
        if let Some(t) = recall_table(s) {
            out.push_str("<h2>Attention recall per layer</h2>");
            table(&mut out, &t);
        }
    }
    out.push_str("<h2>Prompts</h2>");
    table(&mut out, &prompt_table(r));
    out.push_str("<h2>Model and settings</h2>");
    table(&mut out, &model_table(r));
    out.push_str("</body></html>\n");
    out
}
