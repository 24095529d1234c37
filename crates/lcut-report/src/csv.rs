//! CSV export of the per-layer curves, one row per layer.
//!
//! Columns: `layer, bos, anchor, prefill, decode, self, entropy_head_mean,
//! entropy_weighted, tail_mass, curvature_prompt, curvature_generated,
//! straightening_prompt, straightening_generated`. `tail_mass` is R(layer), the
//! share dropped by a cut at this layer; curvature and straightening are those
//! of the layer's output (index `layer + 1`; C_0 = curvature − straightening).
//! Values are written at full `f32` precision; NaN is an empty cell.

use lcut_trace::Report;

/// The CSV header line's columns.
pub const COLUMNS: [&str; 13] = [
    "layer",
    "bos",
    "anchor",
    "prefill",
    "decode",
    "self",
    "entropy_head_mean",
    "entropy_weighted",
    "tail_mass",
    "curvature_prompt",
    "curvature_generated",
    "straightening_prompt",
    "straightening_generated",
];

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
        let cells = [
            c.bos[l],
            c.anchor[l],
            c.prefill[l],
            c.decode[l],
            c.self_mass[l],
            c.entropy_head_mean[l],
            c.entropy_weighted[l],
            c.tail_mass[l],
            c.curvature_prompt[l + 1],
            c.curvature_generated[l + 1],
            c.straightening_prompt[l + 1],
            c.straightening_generated[l + 1],
        ];
        out.push_str(&l.to_string());
        for x in cells {
            out.push(',');
            out.push_str(&value(x));
        }
        out.push('\n');
    }
    out
}
