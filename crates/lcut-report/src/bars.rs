//! Grouped bar charts as SVG: one group per category on the x axis, one bar
//! per series in each group, with optional 95% interval whiskers, reference
//! lines and a legend.

use std::fmt::Write;

use crate::svg::{PALETTE, escape, open, tick_label, ticks};

/// One named series: a value per group (NaN: no bar) and, optionally, an
/// interval per group drawn as a whisker.
pub struct BarSeries {
    /// Legend name.
    pub name: String,
    /// One value per group.
    pub values: Vec<f64>,
    /// One `[low, high]` per group, or empty for none.
    pub intervals: Vec<Option<[f64; 2]>>,
}

/// A grouped bar chart.
#[derive(Default)]
pub struct BarChart {
    /// Figure title.
    pub title: String,
    /// Y axis label.
    pub y_label: String,
    /// The groups' names, left to right.
    pub groups: Vec<String>,
    /// The series, drawn side by side within each group.
    pub series: Vec<BarSeries>,
    /// Horizontal reference lines `(y, label)`.
    pub hlines: Vec<(f64, String)>,
    /// The top of the y axis when it is known (1 for shares); the data's
    /// largest value (interval or reference line included) otherwise.
    pub y_max: Option<f64>,
}

const W: f64 = 560.0;
const H: f64 = 240.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 52.0;
const LEGEND: f64 = 170.0;

impl BarChart {
    /// The largest finite value drawn: bars, interval tops and reference lines.
    fn data_max(&self) -> Option<f64> {
        let bars = self.series.iter().flat_map(|s| s.values.iter().copied());
        let tops = self
            .series
            .iter()
            .flat_map(|s| s.intervals.iter().flatten().map(|i| i[1]));
        let lines = self.hlines.iter().map(|h| h.0);
        bars.chain(tops)
            .chain(lines)
            .filter(|v| v.is_finite())
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    }

    /// The figure as one `<svg>` element.
    pub fn to_svg(&self) -> String {
        let mut s = open(LEFT + W + LEGEND, TOP + H + BOTTOM, &self.title);
        let has_bars = self
            .series
            .iter()
            .any(|x| x.values.iter().any(|v| v.is_finite()));
        let top = self.y_max.or_else(|| self.data_max()).filter(|t| *t > 0.0);
        let (Some(top), true, false) = (top, has_bars, self.groups.is_empty()) else {
            let _ = write!(
                s,
                "<text x=\"{LEFT}\" y=\"{}\">no data</text></svg>",
                TOP + 20.0
            );
            return s;
        };
        let py = |v: f64| TOP + H - (v / top).clamp(0.0, 1.0) * H;
        self.write_axes(&mut s, top, &py);
        let group_w = W / self.groups.len() as f64;
        let bar_w = group_w * 0.8 / self.series.len().max(1) as f64;
        for (k, series) in self.series.iter().enumerate() {
            let colour = PALETTE[k % PALETTE.len()];
            for (g, &v) in series.values.iter().enumerate().take(self.groups.len()) {
                if !v.is_finite() {
                    continue;
                }
                let x = LEFT + g as f64 * group_w + group_w * 0.1 + k as f64 * bar_w;
                let y = py(v.max(0.0));
                let _ = write!(
                    s,
                    "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"{colour}\">\
                     <title>{}, {}: {}</title></rect>",
                    bar_w * 0.92,
                    TOP + H - y,
                    escape(&series.name),
                    escape(&self.groups[g]),
                    tick_label(v)
                );
                if let Some(Some([lo, hi])) = series.intervals.get(g) {
                    let cx = x + bar_w * 0.46;
                    let _ = write!(
                        s,
                        "<line x1=\"{cx:.2}\" x2=\"{cx:.2}\" y1=\"{:.2}\" y2=\"{:.2}\" stroke=\"#333\"/>",
                        py(*lo),
                        py(*hi)
                    );
                }
            }
            self.write_legend(&mut s, k, colour, &series.name);
        }
        self.write_hlines(&mut s, &py);
        s.push_str("</svg>");
        s
    }

    /// Frame, y ticks, group names and the y label.
    fn write_axes(&self, s: &mut String, top: f64, py: &dyn Fn(f64) -> f64) {
        let _ = write!(
            s,
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{W}\" height=\"{H}\" fill=\"none\" stroke=\"#999\"/>"
        );
        for t in ticks(0.0, top, 5) {
            let _ = write!(
                s,
                "<line x1=\"{LEFT}\" x2=\"{r}\" y1=\"{y:.2}\" y2=\"{y:.2}\" stroke=\"#eee\"/>\
                 <text x=\"{tx}\" y=\"{ly:.2}\" text-anchor=\"end\">{}</text>",
                tick_label(t),
                r = LEFT + W,
                y = py(t),
                tx = LEFT - 4.0,
                ly = py(t) + 4.0
            );
        }
        let group_w = W / self.groups.len() as f64;
        for (g, name) in self.groups.iter().enumerate() {
            let _ = write!(
                s,
                "<text x=\"{:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                LEFT + (g as f64 + 0.5) * group_w,
                TOP + H + 14.0,
                escape(name)
            );
        }
        let _ = write!(
            s,
            "<text transform=\"translate(14 {:.2}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            TOP + H / 2.0,
            escape(&self.y_label)
        );
    }

    /// The legend entry of series `k`.
    fn write_legend(&self, s: &mut String, k: usize, colour: &str, name: &str) {
        let (lx, ly) = (LEFT + W + 12.0, TOP + 4.0 + 16.0 * k as f64);
        let _ = write!(
            s,
            "<rect x=\"{lx}\" y=\"{ly}\" width=\"12\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            lx + 18.0,
            ly + 9.0,
            escape(name)
        );
    }

    /// The horizontal reference lines with their labels.
    fn write_hlines(&self, s: &mut String, py: &dyn Fn(f64) -> f64) {
        for (y, label) in &self.hlines {
            let _ = write!(
                s,
                "<line x1=\"{LEFT}\" x2=\"{r}\" y1=\"{yy:.2}\" y2=\"{yy:.2}\" stroke=\"#666\" \
                 stroke-dasharray=\"4,3\"/><text x=\"{tx}\" y=\"{ly:.2}\" text-anchor=\"end\" fill=\"#444\">{}</text>",
                escape(label),
                r = LEFT + W,
                yy = py(*y),
                tx = LEFT + W - 4.0,
                ly = py(*y) - 3.0
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> BarChart {
        BarChart {
            title: "loops".into(),
            y_label: "share".into(),
            groups: vec!["speed:3".into(), "selfonly:3".into()],
            series: vec![
                BarSeries {
                    name: "anchor-free".into(),
                    values: vec![0.5, 0.25],
                    intervals: vec![Some([0.2, 0.8]), None],
                },
                BarSeries {
                    name: "+BoS".into(),
                    values: vec![0.1, f64::NAN],
                    intervals: vec![],
                },
            ],
            hlines: vec![(0.05, "full".into())],
            y_max: Some(1.0),
        }
    }

    #[test]
    fn one_bar_per_finite_value_with_whiskers_and_legend() {
        let svg = chart().to_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<title>").count(), 3, "NaN draws no bar");
        assert!(svg.contains("<title>anchor-free, speed:3: 0.5</title>"));
        assert_eq!(svg.matches("stroke=\"#333\"").count(), 1, "one interval");
        assert!(svg.contains(">+BoS</text>") && svg.contains(">full</text>"));
        assert!(svg.contains(">selfonly:3</text>"));
    }

    #[test]
    fn a_bar_of_half_the_axis_is_half_the_plot_high() {
        let svg = chart().to_svg();
        let bar = svg
            .split("<rect")
            .find(|r| r.contains("anchor-free, speed:3"))
            .unwrap();
        let height: f64 = bar
            .split("height=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((height - H / 2.0).abs() < 0.01, "{height}");
    }

    #[test]
    fn no_values_say_no_data() {
        let mut c = chart();
        for s in &mut c.series {
            s.values = vec![f64::NAN, f64::NAN];
        }
        assert!(c.to_svg().contains("no data"));
        assert!(BarChart::default().to_svg().contains("no data"));
    }
}
