//! CSV export of the per-layer curves, one row per layer.
//!
//! Columns: `layer`, then one per entry of [`LAYER_METRICS`], named by it
//! (`bos, anchor, prefill, decode, self, entropy_head_mean, entropy_weighted,
//! tail_mass, curvature_prompt, curvature_generated, straightening_prompt,
//! straightening_generated`, the logit lens's and the knockout's, and a
//! mixture-of-experts model's `routing_entropy, routing_overlap`, and a
//! model with attention sinks' `sink`, empty for a run without them). A row reads each series at the table's row index:
//! `tail_mass` is R(layer), the share dropped by a cut at this layer; curvature
//! and straightening are those of the layer's output (index `layer + 1`;
//! C_0 = curvature − straightening). Values are written at full `f32`
//! precision; NaN is an empty cell.

use lcut_trace::{LAYER_METRICS, Report};

/// The CSV header line's columns: `layer` and the table's metric names.
pub const COLUMNS: [&str; 1 + LAYER_METRICS.len()] = columns();

const fn columns() -> [&'static str; 1 + LAYER_METRICS.len()] {
    let mut out = ["layer"; 1 + LAYER_METRICS.len()];
    let mut i = 0;
    while i < LAYER_METRICS.len() {
        out[i + 1] = LAYER_METRICS[i].name;
        i += 1;
    }
    out
}

fn value(x: f32) -> String {
    if x.is_finite() {
        x.to_string()
    } else {
        String::new()
    }
}

/// Renders the per-layer curves as CSV.
pub fn render_csv(r: &Report) -> String {
    let c = &r.curves;
    let mut out = COLUMNS.join(",");
    out.push('\n');
    for l in 0..c.num_layers {
        out.push_str(&l.to_string());
        for m in LAYER_METRICS {
            out.push(',');
            out.push_str(&value(m.row_value(c, l)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_the_metric_table() {
        let names: Vec<&str> = LAYER_METRICS.iter().map(|m| m.name).collect();
        assert_eq!(COLUMNS[0], "layer");
        assert_eq!(COLUMNS[1..], names[..]);
        let r = lcut_diag::synthetic::synthetic_report(2, 3, 2, false).unwrap();
        let csv = render_csv(&r);
        let row: Vec<&str> = csv.lines().nth(2).unwrap().split(',').collect();
        for (m, cell) in LAYER_METRICS.iter().zip(&row[1..]) {
            let idx = m.indexing.row_index(1);
            let want = m.series(&r.curves).get(idx).copied().unwrap_or(f32::NAN);
            assert_eq!(*cell, value(want), "{}", m.name);
        }
    }
}
