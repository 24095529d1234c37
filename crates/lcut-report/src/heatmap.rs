//! Heatmaps as SVG: rows are layers (layer 0 at the bottom), columns are decode
//! steps, prompt bins or heads; every cell carries a hover title.

use std::fmt::Write;

use ndarray::ArrayView2;

use crate::svg::{MARKER, colour_legend, escape, finite_range, num, open, viridis};

/// A heatmap of `values[[row, col]]`.
pub struct Heatmap<'a> {
    /// Figure title.
    pub title: &'a str,
    /// Axis label under the columns.
    pub x_label: &'a str,
    /// Axis label beside the rows.
    pub y_label: &'a str,
    /// The values; NaN cells are grey.
    pub values: ArrayView2<'a, f32>,
    /// Hover name of each column (for example `step 3 "the"`); may be empty.
    pub col_names: Vec<String>,
    /// Draw a line between rows `cut - 1` and `cut` (the recommended L_cut).
    pub cut: Option<usize>,
    /// The values the colour scale runs between (so that several heatmaps
    /// share one scale); the data's own range when `None`.
    pub range: Option<(f32, f32)>,
    /// Label the columns with `col_names` instead of their numbers (a few
    /// named columns, such as attention phases).
    pub named_columns: bool,
}

const LEFT: f64 = 56.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 42.0;
const LEGEND: f64 = 80.0;

fn label_every(n: usize, max_labels: usize) -> usize {
    n.div_ceil(max_labels.max(1)).max(1)
}

/// Where the cells go: `rows` x `cols` cells of `cw` x `ch` pixels, a plot
/// area of `pw` x `ph`.
#[derive(Debug, Clone, Copy)]
struct Grid {
    rows: usize,
    cols: usize,
    cw: f64,
    ch: f64,
    pw: f64,
    ph: f64,
}

impl Grid {
    /// Cells sized to fill about 640 x 320 pixels, within readable bounds
    /// (wide enough for a name under each column when `named`).
    fn new(rows: usize, cols: usize, named: bool) -> Self {
        let widest = if named { 72.0 } else { 24.0 };
        let cw = (640.0 / cols.max(1) as f64).clamp(2.0, widest);
        let ch = (320.0 / rows.max(1) as f64).clamp(3.0, 18.0);
        Self {
            rows,
            cols,
            cw,
            ch,
            pw: cw * cols as f64,
            ph: ch * rows as f64,
        }
    }
}

impl Heatmap<'_> {
    /// The figure as one `<svg>` element.
    pub fn to_svg(&self) -> String {
        let (rows, cols) = self.values.dim();
        let g = Grid::new(rows, cols, self.named_columns);
        // Wide enough for the title (about 7.5 px per bold 13 px character).
        let title_width = 7.5 * self.title.chars().count() as f64 + 40.0;
        let width = (LEFT + g.pw.max(160.0) + LEGEND).max(title_width);
        let height = TOP + g.ph.max(40.0) + BOTTOM;
        let mut s = open(width, height, self.title);
        let Some(data) = finite_range(self.values.iter().copied()) else {
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\">no data</text></svg>",
                LEFT,
                TOP + 20.0
            );
            return s;
        };
        let (lo, hi) = self.range.filter(|(lo, hi)| hi > lo).unwrap_or(data);
        self.cells(&mut s, &g, (lo, hi));
        let names = self.named_columns.then_some(self.col_names.as_slice());
        tick_labels(&mut s, &g, names);
        self.cut_line(&mut s, &g);
        let _ = write!(
            s,
            "<text x=\"{:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text transform=\"translate(14 {:.2}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            LEFT + g.pw / 2.0,
            TOP + g.ph + 32.0,
            escape(self.x_label),
            TOP + g.ph / 2.0,
            escape(self.y_label)
        );
        colour_legend(
            &mut s,
            LEFT + g.pw.max(160.0) + 14.0,
            TOP,
            g.ph.clamp(40.0, 240.0),
            lo,
            hi,
        );
        s.push_str("</svg>");
        s
    }

    /// One coloured cell per value (layer 0 at the bottom), its hover
    /// title naming the layer, the column and the value.
    fn cells(&self, s: &mut String, g: &Grid, (lo, hi): (f32, f32)) {
        let (rows, cw, ch) = (g.rows, g.cw, g.ch);
        for ((r, c), &v) in self.values.indexed_iter() {
            let x = LEFT + c as f64 * cw;
            let y = TOP + (rows - 1 - r) as f64 * ch;
            let name = self
                .col_names
                .get(c)
                .cloned()
                .unwrap_or_else(|| c.to_string());
            let _ = write!(
                s,
                "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"{}\">\
                 <title>layer {r}, {}: {}</title></rect>",
                cw + 0.05,
                ch + 0.05,
                viridis((v - lo) / (hi - lo)),
                escape(&name),
                num(v, 4)
            );
        }
    }

    /// The dashed line between rows `cut - 1` and `cut`, labelled.
    fn cut_line(&self, s: &mut String, g: &Grid) {
        let (rows, ch, pw) = (g.rows, g.ch, g.pw);
        if let Some(cut) = self.cut.filter(|&c| c > 0 && c < rows) {
            let y = TOP + (rows - cut) as f64 * ch;
            let _ = write!(
                s,
                "<line x1=\"{}\" x2=\"{}\" y1=\"{y:.2}\" y2=\"{y:.2}\" stroke=\"{MARKER}\" \
                 stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\
                 <text x=\"{}\" y=\"{:.2}\" fill=\"{MARKER}\" text-anchor=\"end\">L_cut = {cut}</text>",
                LEFT - 2.0,
                LEFT + pw + 2.0,
                LEFT + pw,
                y - 3.0
            );
        }
    }
}

/// Row numbers on the left (at most 16) and column numbers (or `names`)
/// below (at most 12).
fn tick_labels(s: &mut String, g: &Grid, names: Option<&[String]>) {
    let (rows, cols, cw, ch, ph) = (g.rows, g.cols, g.cw, g.ch, g.ph);
    let every = label_every(rows, 16);
    for r in (0..rows).step_by(every) {
        let y = TOP + (rows - r) as f64 * ch - ch / 2.0 + 4.0;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{y:.2}\" text-anchor=\"end\">{r}</text>",
            LEFT - 4.0
        );
    }
    let every = label_every(cols, 12);
    for c in (0..cols).step_by(every) {
        let x = LEFT + c as f64 * cw + cw / 2.0;
        let _ = write!(
            s,
            "<text x=\"{x:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            TOP + ph + 13.0,
            names
                .and_then(|n| n.get(c))
                .map_or_else(|| c.to_string(), |n| escape(n))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn one_rect_per_cell_with_titles_and_cut_line() {
        let v = array![[0.0f32, 1.0, 2.0], [3.0, f32::NAN, 5.0]];
        let svg = Heatmap {
            title: "t <x>",
            x_label: "step",
            y_label: "layer",
            values: v.view(),
            col_names: vec!["a".into(), "b&c".into(), "c".into()],
            cut: Some(1),
            range: None,
            named_columns: false,
        }
        .to_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<title>layer").count(), 6);
        assert!(svg.contains("layer 1, b&amp;c: –"), "NaN cell hover");
        assert!(svg.contains("L_cut = 1"));
        assert!(svg.contains("t &lt;x&gt;"));
        // the largest value gets the top colour, the smallest the bottom one
        assert!(svg.contains("#fde725\"><title>layer 1, c: 5.0000"));
        assert!(svg.contains("#440154\"><title>layer 0, a: 0.0000"));
    }

    #[test]
    fn empty_heatmap_says_so() {
        let v = ndarray::Array2::<f32>::zeros((3, 0));
        let svg = Heatmap {
            title: "t",
            x_label: "",
            y_label: "",
            values: v.view(),
            col_names: vec![],
            cut: None,
            range: None,
            named_columns: false,
        }
        .to_svg();
        assert!(svg.contains("no data") && svg.ends_with("</svg>"));
    }

    #[test]
    fn a_fixed_range_and_named_columns() {
        let v = array![[0.25f32, 0.5]];
        let svg = Heatmap {
            title: "t",
            x_label: "",
            y_label: "",
            values: v.view(),
            col_names: vec!["prefill".into(), "B&S".into()],
            cut: None,
            range: Some((0.0, 1.0)),
            named_columns: true,
        }
        .to_svg();
        // 0.5 on a 0..1 scale is viridis' middle, not its top
        assert!(svg.contains(&format!("{}\"><title>layer 0, B&amp;S", viridis(0.5))));
        assert!(svg.contains(">prefill</text>") && svg.contains(">B&amp;S</text>"));
    }
}
