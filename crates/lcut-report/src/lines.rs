//! Line charts as SVG, with reference lines, point labels and a legend.

use std::fmt::Write;

use crate::svg::{MARKER, PALETTE, escape, open, tick_label, ticks};

/// One named series of `(x, y)` points; non-finite points break the line.
pub struct Line {
    /// Legend name.
    pub name: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub style: LineStyle,
}

/// How a line is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineStyle {
    /// Its colour's index in the palette; the series' own index when `None`
    /// (two lines of one colour pair a measurement with its prediction).
    pub colour: Option<usize>,
    /// Dashed (a prediction beside the measurement it predicts).
    pub dashed: bool,
    /// Left out of the legend (a prediction in its measurement's colour,
    /// which the caption explains).
    pub unlisted: bool,
}

impl Line {
    /// A solid line in its series' colour.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            style: LineStyle::default(),
        }
    }
}

/// A line chart.
#[derive(Default)]
pub struct LineChart {
    /// Figure title.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// The series.
    pub lines: Vec<Line>,
    /// Vertical marker lines `(x, label)` (for example the recommended L_cut).
    pub vlines: Vec<(f64, String)>,
    /// Horizontal reference lines `(y, label)` (for example a threshold).
    pub hlines: Vec<(f64, String)>,
    /// Draw a dot with a hover title at every point.
    pub dots: bool,
    /// Text labels at points `(x, y, text)`.
    pub labels: Vec<(f64, f64, String)>,
    /// Label only whole numbers on the x axis (layers, cuts).
    pub integer_x: bool,
    /// Vertical intervals `(series, x, low, high)` drawn in the series'
    /// colour (a point's 95% interval).
    pub whiskers: Vec<(usize, f64, f64, f64)>,
    /// Points off the lines `(series, x, y, title)`, drawn as open dots in
    /// the series' colour (a family's dominated points beside its frontier).
    pub extra_dots: Vec<(usize, f64, f64, String)>,
}

const W: f64 = 560.0;
const H: f64 = 260.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 42.0;
const LEGEND: f64 = 170.0;
/// A white outline behind marker labels, so lines do not cross them.
const HALO: &str = "paint-order=\"stroke\" stroke=\"#fff\" stroke-width=\"3\"";

fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if lo > hi {
        return None;
    }
    let pad = if hi > lo { 0.05 * (hi - lo) } else { 0.5 };
    Some((lo - pad, hi + pad))
}

/// Data ranges mapped onto the plot area.
struct Scale {
    x: (f64, f64),
    y: (f64, f64),
}

impl Scale {
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x.0) / (self.x.1 - self.x.0) * W
    }

    fn py(&self, y: f64) -> f64 {
        TOP + H - (y - self.y.0) / (self.y.1 - self.y.0) * H
    }
}

fn finite_pt(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

impl LineChart {
    /// The figure as one `<svg>` element.
    pub fn to_svg(&self) -> String {
        let mut s = open(LEFT + W + LEGEND, TOP + H + BOTTOM, &self.title);
        let Some(scale) = self.scale() else {
            let _ = write!(
                s,
                "<text x=\"{LEFT}\" y=\"{}\">no data</text></svg>",
                TOP + 20.0
            );
            return s;
        };
        self.write_grid(&mut s, &scale);
        self.write_hlines(&mut s, &scale);
        self.write_whiskers(&mut s, &scale);
        self.write_extra_dots(&mut s, &scale);
        for (i, line) in self.lines.iter().enumerate() {
            self.write_line(&mut s, &scale, i, line);
        }
        self.write_labels(&mut s, &scale);
        self.write_vlines(&mut s, &scale);
        self.write_axis_labels(&mut s);
        s
    }

    /// The ranges of the data and reference lines, `None` without a finite point.
    fn scale(&self) -> Option<Scale> {
        let xs = self.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
        let ys = self.lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
        let ys = ys.chain(self.whiskers.iter().flat_map(|w| [w.2, w.3]));
        let ys = ys.chain(self.extra_dots.iter().map(|d| d.2));
        let xs = xs.chain(self.extra_dots.iter().map(|d| d.1));
        let has_data = self.lines.iter().any(|l| l.points.iter().any(finite_pt));
        let x = range(xs.chain(self.vlines.iter().map(|v| v.0)))?;
        let y = range(ys.chain(self.hlines.iter().map(|h| h.0)))?;
        has_data.then_some(Scale { x, y })
    }

    /// The frame, the grid lines and the tick labels.
    fn write_grid(&self, s: &mut String, sc: &Scale) {
        let _ = write!(
            s,
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{W}\" height=\"{H}\" fill=\"none\" stroke=\"#999\"/>"
        );
        let x_ticks = ticks(sc.x.0, sc.x.1, 8)
            .into_iter()
            .filter(|t| !self.integer_x || t.fract() == 0.0);
        for t in x_ticks {
            let _ = write!(
                s,
                "<line x1=\"{x:.2}\" x2=\"{x:.2}\" y1=\"{TOP}\" y2=\"{b}\" stroke=\"#eee\"/>\
                 <text x=\"{x:.2}\" y=\"{ty}\" text-anchor=\"middle\">{}</text>",
                tick_label(t),
                x = sc.px(t),
                b = TOP + H,
                ty = TOP + H + 13.0
            );
        }
        for t in ticks(sc.y.0, sc.y.1, 6) {
            let _ = write!(
                s,
                "<line x1=\"{LEFT}\" x2=\"{r}\" y1=\"{y:.2}\" y2=\"{y:.2}\" stroke=\"#eee\"/>\
                 <text x=\"{tx}\" y=\"{ly:.2}\" text-anchor=\"end\">{}</text>",
                tick_label(t),
                r = LEFT + W,
                y = sc.py(t),
                tx = LEFT - 4.0,
                ly = sc.py(t) + 4.0
            );
        }
    }

    /// The horizontal reference lines with their labels.
    fn write_hlines(&self, s: &mut String, sc: &Scale) {
        for (y, label) in &self.hlines {
            let _ = write!(
                s,
                "<line x1=\"{LEFT}\" x2=\"{r}\" y1=\"{yy:.2}\" y2=\"{yy:.2}\" stroke=\"#666\" \
                 stroke-dasharray=\"2,3\"/><text x=\"{tx}\" y=\"{ly:.2}\" text-anchor=\"end\" fill=\"#444\" {HALO}>{}</text>",
                escape(label),
                r = LEFT + W,
                yy = sc.py(*y),
                tx = LEFT + W - 4.0,
                ly = sc.py(*y) - 3.0
            );
        }
    }

    /// Series `i`: its path (broken at non-finite points), its dots when
    /// asked for, and its legend entry.
    fn write_line(&self, s: &mut String, sc: &Scale, i: usize, line: &Line) {
        let colour = PALETTE[line.style.colour.unwrap_or(i) % PALETTE.len()];
        let dash = if line.style.dashed {
            " stroke-dasharray=\"6,4\""
        } else {
            ""
        };
        let mut d = String::new();
        let mut pen_down = false;
        for &(x, y) in &line.points {
            if x.is_finite() && y.is_finite() {
                let _ = write!(
                    d,
                    "{}{:.2} {:.2} ",
                    if pen_down { "L" } else { "M" },
                    sc.px(x),
                    sc.py(y)
                );
                pen_down = true;
            } else {
                pen_down = false;
            }
        }
        let _ = write!(
            s,
            "<path d=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.8\"{dash}/>",
            d.trim_end()
        );
        if self.dots {
            for &(x, y) in line.points.iter().filter(|p| finite_pt(p)) {
                let _ = write!(
                    s,
                    "<circle cx=\"{:.2}\" cy=\"{:.2}\" r=\"3\" fill=\"{colour}\"><title>{}: ({}, {})</title></circle>",
                    sc.px(x),
                    sc.py(y),
                    escape(&line.name),
                    tick_label(x),
                    tick_label(y)
                );
            }
        }
        if line.style.unlisted {
            return;
        }
        // the legend's slot: listed lines before this one
        let slot = self.lines[..i].iter().filter(|l| !l.style.unlisted).count();
        let ly = TOP + 10.0 + 16.0 * slot as f64;
        let lx = LEFT + W + 12.0;
        let _ = write!(
            s,
            "<line x1=\"{lx}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"3\"{dash}/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            escape(&line.name)
        );
    }

    /// The colour of series `i` (its own when set).
    fn series_colour(&self, i: usize) -> &'static str {
        let c = self.lines.get(i).and_then(|l| l.style.colour).unwrap_or(i);
        PALETTE[c % PALETTE.len()]
    }

    /// The points off the lines, as open dots with a hover title.
    fn write_extra_dots(&self, s: &mut String, sc: &Scale) {
        for (series, x, y, title) in &self.extra_dots {
            if x.is_finite() && y.is_finite() {
                let _ = write!(
                    s,
                    "<circle class=\"off\" cx=\"{:.2}\" cy=\"{:.2}\" r=\"3\" fill=\"#fff\" \
                     stroke=\"{}\" stroke-width=\"1.5\"><title>{}</title></circle>",
                    sc.px(*x),
                    sc.py(*y),
                    self.series_colour(*series),
                    escape(title)
                );
            }
        }
    }

    /// The intervals, each a vertical line with short caps.
    fn write_whiskers(&self, s: &mut String, sc: &Scale) {
        for &(series, x, lo, hi) in &self.whiskers {
            if !(x.is_finite() && lo.is_finite() && hi.is_finite()) {
                continue;
            }
            let colour = self.series_colour(series);
            let (xx, y0, y1) = (sc.px(x), sc.py(lo), sc.py(hi));
            let _ = write!(
                s,
                "<path class=\"ci\" d=\"M{xx:.2} {y0:.2} L{xx:.2} {y1:.2} M{a:.2} {y0:.2} L{b:.2} {y0:.2} \
                 M{a:.2} {y1:.2} L{b:.2} {y1:.2}\" stroke=\"{colour}\" stroke-width=\"1\" \
                 stroke-opacity=\"0.6\" fill=\"none\"/>",
                a = xx - 3.0,
                b = xx + 3.0
            );
        }
    }

    /// The text labels at points.
    fn write_labels(&self, s: &mut String, sc: &Scale) {
        for (x, y, text) in &self.labels {
            if x.is_finite() && y.is_finite() {
                let _ = write!(
                    s,
                    "<text x=\"{:.2}\" y=\"{:.2}\" font-size=\"9\" fill=\"#333\">{}</text>",
                    sc.px(*x) + 4.0,
                    sc.py(*y) - 4.0,
                    escape(text)
                );
            }
        }
    }

    /// The vertical marker lines, their labels stacked upwards.
    fn write_vlines(&self, s: &mut String, sc: &Scale) {
        for (i, (x, label)) in self.vlines.iter().enumerate() {
            let _ = write!(
                s,
                "<line x1=\"{xx:.2}\" x2=\"{xx:.2}\" y1=\"{TOP}\" y2=\"{b}\" stroke=\"{MARKER}\" \
                 stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\
                 <text x=\"{tx:.2}\" y=\"{ty}\" fill=\"{MARKER}\" {HALO}>{}</text>",
                escape(label),
                xx = sc.px(*x),
                b = TOP + H,
                tx = sc.px(*x) + 4.0,
                ty = TOP + H - 6.0 - 13.0 * i as f64
            );
        }
    }

    /// The axis titles, and the end of the `<svg>`.
    fn write_axis_labels(&self, s: &mut String) {
        let _ = write!(
            s,
            "<text x=\"{:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text transform=\"translate(14 {:.2}) rotate(-90)\" text-anchor=\"middle\">{}</text></svg>",
            LEFT + W / 2.0,
            TOP + H + 32.0,
            escape(&self.x_label),
            TOP + H / 2.0,
            escape(&self.y_label)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_breaks_the_line_into_two_subpaths() {
        let chart = LineChart {
            title: "t".into(),
            lines: vec![Line::new(
                "a",
                vec![
                    (0.0, 1.0),
                    (1.0, 2.0),
                    (2.0, f64::NAN),
                    (3.0, 1.0),
                    (4.0, 0.0),
                ],
            )],
            vlines: vec![(2.5, "L_cut = 3".into())],
            hlines: vec![(0.5, "threshold".into())],
            dots: true,
            integer_x: true,
            ..LineChart::default()
        };
        let svg = chart.to_svg();
        // x runs from -0.2 to 4.2: whole-number ticks only
        for t in ["0", "1", "2", "3", "4"] {
            assert!(
                svg.contains(&format!("text-anchor=\"middle\">{t}</text>")),
                "tick {t}"
            );
        }
        assert!(!svg.contains("\"middle\">0.5</text>") && !svg.contains("\"middle\">2.5</text>"));
        let path = svg
            .split("<path d=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(path.matches('M').count(), 2, "{path}");
        assert_eq!(path.matches('L').count(), 2, "{path}");
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("L_cut = 3") && svg.contains("threshold"));
    }

    #[test]
    fn no_finite_points_says_no_data() {
        let chart = LineChart {
            lines: vec![Line::new("a", vec![(0.0, f64::NAN)])],
            ..LineChart::default()
        };
        assert!(chart.to_svg().contains("no data"));
    }

    #[test]
    fn a_prediction_shares_its_measurements_colour_and_stays_out_of_the_legend() {
        let measured = Line::new("speed", vec![(0.0, 1.0), (1.0, 0.8)]);
        let predicted = Line {
            name: "speed (model)".into(),
            points: vec![(0.0, 1.0), (1.0, 0.75)],
            style: LineStyle {
                colour: Some(0),
                dashed: true,
                unlisted: true,
            },
        };
        let other = Line::new("full", vec![(0.0, 1.0), (1.0, 1.0)]);
        let svg = LineChart {
            lines: vec![measured, predicted, other],
            ..LineChart::default()
        }
        .to_svg();
        let paths: Vec<&str> = svg.split("<path ").skip(1).collect();
        assert_eq!(paths.len(), 3);
        assert!(paths[0].contains(PALETTE[0]) && !paths[0].contains("dasharray"));
        assert!(paths[1].contains(PALETTE[0]) && paths[1].contains("dasharray"));
        assert!(paths[2].contains(PALETTE[2]));
        assert!(!svg.contains("speed (model)"));
        // the third line takes the second legend slot
        assert!(svg.contains(&format!("y=\"{}\">full</text>", TOP + 10.0 + 16.0 + 4.0)));
    }
}
