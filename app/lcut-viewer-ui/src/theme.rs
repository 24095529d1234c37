//! The viewer's colours and shared text formatting, in one place: the cut
//! lines, the series palette, the per-layer metrics' line styles, the
//! SlimInfer views' states, and bytes, FLOPs and cut labels.

use egui::Color32;
use egui_plot::LineStyle;

/// Colour of the chosen cut's line.
pub const CHOSEN: Color32 = Color32::from_rgb(255, 140, 0);
/// Colour of the recommended cut's line.
pub const RECOMMENDED: Color32 = Color32::from_rgb(230, 230, 230);
/// Colour of the sweep's knee.
pub const KNEE: Color32 = Color32::RED;
/// Colour of error text.
pub const ERROR_TEXT: Color32 = Color32::from_rgb(255, 110, 110);
/// Colour of reference lines (thresholds).
pub const REFERENCE: Color32 = Color32::DARK_GRAY;

/// Series colour: blue.
pub const BLUE: Color32 = Color32::from_rgb(80, 160, 255);
/// Series colour: green.
pub const GREEN: Color32 = Color32::from_rgb(90, 200, 90);
/// Series colour: magenta.
pub const MAGENTA: Color32 = Color32::from_rgb(200, 80, 200);
/// Series colour: red.
pub const RED: Color32 = Color32::from_rgb(255, 90, 90);
/// Series colour: yellow.
pub const YELLOW: Color32 = Color32::from_rgb(200, 200, 80);
/// Series colour: orange.
pub const ORANGE: Color32 = Color32::from_rgb(255, 170, 60);
/// Colours of series told apart by order (anchor settings, cuts).
pub const SERIES: [Color32; 4] = [BLUE, GREEN, MAGENTA, RED];

/// Background of a token where two policies disagree.
pub const DISAGREE: Color32 = Color32::from_rgb(150, 40, 40);

/// Colour of heatmap cells with no value (NaN).
pub const MISSING: Color32 = Color32::from_rgb(90, 90, 90);
/// Fill of regions shaded over a heatmap: dark, see-through.
pub const SHADE: Color32 = Color32::from_rgba_premultiplied(0, 0, 0, 170);

/// Colour of positions below the first cut (every token present).
pub const BELOW: Color32 = Color32::from_rgb(70, 110, 160);
/// Colour of kept blocks above a cut.
pub const KEPT: Color32 = Color32::from_rgb(60, 170, 90);
/// Colour of pruned positions (no hidden state, no K/V).
pub const PRUNED: Color32 = Color32::from_rgb(40, 40, 40);
/// Colour of the sink.
pub const SINK: Color32 = Color32::from_rgb(210, 170, 60);
/// Colour of the decode phase's prompt tokens.
pub const DECODE: Color32 = Color32::from_rgb(225, 110, 50);
/// Colour of the SlimInfer cut lines.
pub const CUT: Color32 = Color32::from_rgb(255, 255, 255);
/// Colour of kept but inactive blocks in the raster.
pub const INACTIVE: Color32 = Color32::from_rgb(60, 75, 100);
/// Colour of blocks entering the active set in the raster.
pub const ENTERING: Color32 = Color32::from_rgb(250, 230, 90);
/// Outline of the (layer, K/V head) pairs picked in the head view.
pub const PICKED: Color32 = Color32::from_rgb(80, 255, 220);
/// Lines between K/V head groups of query heads.
pub const GROUP_LINE: Color32 = Color32::from_rgb(150, 150, 150);

/// The colour of a per-layer metric's curve, by its name in
/// [`lcut_trace::LAYER_METRICS`]: a prompt span in blue, a generated span in
/// green (curvature and straightening share them); a metric without a
/// colour of its own is light grey.
pub fn metric_colour(name: &str) -> Color32 {
    match name {
        "bos" => MAGENTA,
        "anchor" => Color32::GRAY,
        "prefill" | "entropy_head_mean" | "curvature_prompt" | "straightening_prompt" => BLUE,
        "decode" | "curvature_generated" | "straightening_generated" => GREEN,
        "self" => YELLOW,
        "tail_mass" => RED,
        "entropy_weighted" => ORANGE,
        "lens_prob" => BLUE,
        "lens_top1" => GREEN,
        "lens_formed" => RED,
        "lens_kl" => ORANGE,
        "lens_log_rank" => MAGENTA,
        "knockout_kl" => RED,
        "knockout_top1" => GREEN,
        "routing_entropy" => BLUE,
        "routing_overlap" => ORANGE,
        "sink" => ORANGE,
        _ => Color32::LIGHT_GRAY,
    }
}

/// The dashing of a per-layer metric's curve: the tail mass (a share of
/// the masses it is drawn with) and the straightening (a difference of the
/// curvature beside it) are dashed, the rest solid.
pub fn metric_line_style(name: &str) -> LineStyle {
    match name {
        "tail_mass" | "lens_formed" => LineStyle::dashed_dense(),
        "straightening_prompt" | "straightening_generated" => LineStyle::dashed_loose(),
        _ => LineStyle::Solid,
    }
}

/// The label of the recommended cut's line.
pub fn recommended_label(l_cut: usize) -> String {
    format!("recommended L_cut {l_cut}")
}

/// The label of the chosen cut's line.
pub fn chosen_label(l_cut: usize) -> String {
    format!("chosen L_cut {l_cut}")
}

/// Bytes in binary units, e.g. `1.25 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.3} {}", UNITS[u])
    }
}

/// FLOPs with an SI prefix, e.g. `3.1 TFLOP`.
pub fn human_flops(f: f64) -> String {
    const UNITS: [&str; 6] = ["", "k", "M", "G", "T", "P"];
    let mut v = f;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.3} {}FLOP", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::LAYER_METRICS;

    #[test]
    fn every_metric_has_a_colour_of_its_own() {
        for m in LAYER_METRICS {
            assert_ne!(metric_colour(m.name), Color32::LIGHT_GRAY, "{}", m.name);
        }
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(3 << 30), "3.000 GiB");
    }
}
