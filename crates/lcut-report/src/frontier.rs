//! The accuracy-against-K/V frontier as a figure: one series per family
//! (the line joins its frontier, the points no other point of the family
//! beats at no more K/V, and its dominated points are open dots; each
//! point has its 95% interval as a whisker), the
//! full model's accuracy as a reference line; and as a table and an HTML
//! page (`lcut frontier`). The x axis is the K/V held or, for a
//! leaderboard run, the compression ratio.

use std::fmt::Write;

use crate::frontier_points::{Frontier, FrontierAxis};

use crate::lines::{Line, LineChart};
use crate::svg::escape;
use crate::tables::Table;

/// The frontier as a line chart titled `title`.
pub fn frontier_chart(f: &Frontier, title: &str) -> LineChart {
    let mut lines = Vec::new();
    let mut whiskers = Vec::new();
    let mut extra_dots = Vec::new();
    for (i, family) in f.families().into_iter().enumerate() {
        let series = f.series(family);
        whiskers.extend(series.iter().map(|p| (i, p.x, p.ci95[0], p.ci95[1])));
        let on = f.envelope(family);
        extra_dots.extend(
            series
                .iter()
                .filter(|p| !on.iter().any(|q| std::ptr::eq(*q, **p)))
                .map(|p| (i, p.x, p.accuracy, format!("{} (dominated)", p.policy))),
        );
        lines.push(Line::new(
            family,
            on.iter().map(|p| (p.x, p.accuracy)).collect(),
        ));
    }
    LineChart {
        title: title.to_string(),
        x_label: f.axis.label().into(),
        y_label: "accuracy (95% interval)".into(),
        lines,
        whiskers,
        extra_dots,
        hlines: f
            .full_accuracy
            .map(|a| vec![(a, format!("full {a:.3}"))])
            .unwrap_or_default(),
        dots: true,
        ..LineChart::default()
    }
}

/// One row per point: family, policy, x, accuracy with its interval, and
/// the full model's right answers kept where known.
pub fn frontier_table(f: &Frontier) -> Table {
    let x = match f.axis {
        FrontierAxis::KvHeld => "K/V held of full",
        FrontierAxis::CompressionRatio => "compression ratio",
    };
    let rows = f
        .families()
        .into_iter()
        .flat_map(|family| f.series(family))
        .map(|p| {
            vec![
                p.family.clone(),
                p.policy.clone(),
                format!("{:.3}", p.x),
                format!("{:.3} [{:.3}, {:.3}]", p.accuracy, p.ci95[0], p.ci95[1]),
                match (p.kept_of_full, p.full_correct) {
                    (Some(k), Some(n)) if n > 0 => {
                        format!("{k} of {n} ({:.0}%)", 100.0 * k as f64 / n as f64)
                    }
                    _ => String::new(),
                },
                p.n.to_string(),
            ]
        })
        .collect();
    Table {
        headers: [
            "family",
            "policy",
            x,
            "accuracy [95%]",
            "full's right answers kept",
            "items",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    }
}

/// The frontier as one self-contained HTML page: the figure and the table.
pub fn render_frontier_html(f: &Frontier) -> String {
    let title = frontier_title(f);
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{style}</style></head><body><h1>{t}</h1><figure>{svg}<figcaption>Each family's \
         line joins its best accuracy within each K/V (open dots: its policies another beats \
         at no more K/V), with 95% Wilson intervals; K/V held is measured by the cache at the \
         end of each item, as a share of the full model's.</figcaption></figure>",
        t = escape(&title),
        style = crate::html::STYLE,
        svg = frontier_chart(f, &title).to_svg()
    );
    crate::html::table(&mut out, &frontier_table(f));
    out.push_str("</body></html>\n");
    out
}

/// `Accuracy against K/V held on SUITE`.
pub fn frontier_title(f: &Frontier) -> String {
    let what = match f.axis {
        FrontierAxis::KvHeld => "K/V held",
        FrontierAxis::CompressionRatio => "compression ratio",
    };
    match f.over.is_empty() {
        true => format!("Accuracy against {what}"),
        false => format!("Accuracy against {what}: {}", f.over),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontier_points::FrontierPoint;

    fn point(family: &str, x: f64, accuracy: f64) -> FrontierPoint {
        FrontierPoint {
            family: family.into(),
            policy: format!("{family}@{x}"),
            x,
            accuracy,
            ci95: [accuracy - 0.05, accuracy + 0.05],
            n: 208,
            kept_of_full: Some(100),
            full_correct: Some(154),
        }
    }

    #[test]
    fn each_family_is_a_series_by_x_with_its_intervals() {
        let f = Frontier {
            axis: FrontierAxis::KvHeld,
            points: vec![
                point("SPEED+BoS", 0.81, 0.70),
                point("kept heads", 0.75, 0.60),
                point("SPEED+BoS", 0.75, 0.13),
                point("kept heads", 0.79, 0.50),
            ],
            full_accuracy: Some(0.74),
            over: "suite.jsonl".into(),
        };
        let chart = frontier_chart(&f, "t");
        assert_eq!(chart.lines.len(), 2);
        assert_eq!(chart.lines[0].name, "SPEED+BoS");
        assert_eq!(chart.lines[0].points, [(0.75, 0.13), (0.81, 0.70)]);
        assert_eq!(chart.whiskers.len(), 4);
        // the dominated head plan is an open dot off its family's line
        assert_eq!(chart.lines[1].points, [(0.75, 0.60)]);
        assert_eq!(chart.extra_dots.len(), 1);
        assert_eq!((chart.extra_dots[0].0, chart.extra_dots[0].1), (1, 0.79));
        let (series, x, lo, hi) = chart.whiskers[2];
        assert_eq!((series, x), (1, 0.75));
        assert!((lo - 0.55).abs() < 1e-12 && (hi - 0.65).abs() < 1e-12);
        assert_eq!(chart.hlines[0].0, 0.74);
        let svg = chart.to_svg();
        // a whisker per point, in its series' colour
        assert_eq!(svg.matches("class=\"ci\"").count(), 4, "{svg}");
        assert_eq!(svg.matches("class=\"off\"").count(), 1, "{svg}");
        let table = frontier_table(&f);
        assert_eq!(table.rows.len(), 4);
        assert_eq!(table.rows[0][3], "0.130 [0.080, 0.180]");
        assert_eq!(table.rows[0][4], "100 of 154 (65%)");
        let html = render_frontier_html(&f);
        assert!(html.contains("Accuracy against K/V held: suite.jsonl") && html.contains("<svg"));
    }
}
