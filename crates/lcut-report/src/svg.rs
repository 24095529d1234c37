//! Small SVG building blocks: escaping, number formatting, colour maps, axes.

use std::fmt::Write;

/// Escapes text for HTML/SVG content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// A number with `digits` decimals, or `–` for NaN.
pub fn num(x: f32, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "–".to_string()
    }
}

/// Viridis, sampled at nine points.
const VIRIDIS: [(u8, u8, u8); 9] = [
    (68, 1, 84),
    (71, 44, 122),
    (59, 81, 139),
    (44, 113, 142),
    (33, 144, 141),
    (39, 173, 129),
    (92, 200, 99),
    (170, 220, 50),
    (253, 231, 37),
];

/// Colour of NaN cells.
pub const NAN_COLOUR: &str = "#d9d9d9";

/// The viridis colour of `t` in `[0, 1]` (clamped), as `#rrggbb`.
pub fn viridis(t: f32) -> String {
    if !t.is_finite() {
        return NAN_COLOUR.to_string();
    }
    let x = t.clamp(0.0, 1.0) * (VIRIDIS.len() - 1) as f32;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f32;
    let mix = |a: u8, b: u8| (f32::from(a) + f * (f32::from(b) - f32::from(a))).round() as u8;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(a.0, b.0),
        mix(a.1, b.1),
        mix(a.2, b.2)
    )
}

/// Categorical colours for line series.
pub const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Colour of markers (the recommended L_cut, the knee).
pub const MARKER: &str = "#d62728";

/// Range of the finite values, `None` when there are none. A flat range is
/// widened so that it has non-zero width.
pub fn finite_range(values: impl IntoIterator<Item = f32>) -> Option<(f32, f32)> {
    let (lo, hi) = values
        .into_iter()
        .filter(|x| x.is_finite())
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if lo > hi {
        None
    } else if lo == hi {
        Some((lo - 0.5, hi + 0.5))
    } else {
        Some((lo, hi))
    }
}

/// About `n` round tick values covering `[lo, hi]`.
pub fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo || n == 0 {
        return vec![];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Short text for a tick value.
pub fn tick_label(v: f64) -> String {
    if v == v.round() && v.abs() < 1e6 {
        format!("{}", v as i64)
    } else if v.abs() >= 0.01 {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.1e}")
    }
}

/// The opening `<svg>` tag with a white background and a title line. No
/// `xmlns`: inline SVG in HTML gets its namespace from the parser.
pub fn open(width: f64, height: f64, title: &str) -> String {
    format!(
        "<svg width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"{width}\" height=\"{height}\" fill=\"#ffffff\"/>\
         <text x=\"{x}\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">{t}</text>",
        x = width / 2.0,
        t = escape(title)
    )
}

/// A vertical colour legend of `steps` stacked cells from `lo` (bottom) to `hi`
/// (top) at `(x, y)`, `height` tall, with end labels.
pub fn colour_legend(out: &mut String, x: f64, y: f64, height: f64, lo: f32, hi: f32) {
    let steps = 32;
    let h = height / steps as f64;
    for i in 0..steps {
        let t = i as f32 / (steps - 1) as f32;
        let cy = y + height - (i + 1) as f64 * h;
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{cy:.2}\" width=\"12\" height=\"{:.2}\" fill=\"{}\"/>",
            h + 0.3,
            viridis(t)
        );
    }
    let _ = write!(
        out,
        "<rect x=\"{x}\" y=\"{y}\" width=\"12\" height=\"{height}\" fill=\"none\" stroke=\"#555\"/>\
         <text x=\"{tx}\" y=\"{y1}\">{hi}</text><text x=\"{tx}\" y=\"{y2}\">{lo}</text>",
        tx = x + 16.0,
        y1 = y + 8.0,
        y2 = y + height,
        hi = escape(&tick_label(f64::from(hi))),
        lo = escape(&tick_label(f64::from(lo)))
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viridis_ends_and_nan() {
        assert_eq!(viridis(0.0), "#440154");
        assert_eq!(viridis(1.0), "#fde725");
        assert_eq!(viridis(2.0), "#fde725");
        assert_eq!(viridis(f32::NAN), NAN_COLOUR);
    }

    #[test]
    fn escaping_covers_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(escape("\u{1}"), "\\u{1}");
    }

    #[test]
    fn ticks_are_round_and_inside() {
        let t = ticks(0.0, 1.0, 5);
        let want = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0];
        assert_eq!(t.len(), want.len());
        assert!(
            t.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{t:?}"
        );
        let t = ticks(3.0, 97.0, 4);
        assert_eq!(t, vec![25.0, 50.0, 75.0]);
        assert!(ticks(1.0, 1.0, 4).is_empty());
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(3.0), "3");
    }

    #[test]
    fn finite_range_skips_nan_and_widens_flat() {
        assert_eq!(finite_range([f32::NAN, 1.0, 3.0]), Some((1.0, 3.0)));
        assert_eq!(finite_range([2.0, 2.0]), Some((1.5, 2.5)));
        assert_eq!(finite_range([f32::NAN]), None);
    }
}
