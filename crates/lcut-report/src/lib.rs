//! Export of lcut reports: one self-contained HTML file (inline SVG figures,
//! no external assets), Markdown, CSV of the per-layer curves, and the JSON
//! report itself; and the report of `lcut paper` (the SPEED paper's figures
//! and tables for one model, [`write_paper`]). Every file is written
//! atomically (temporary file + rename).
//!
//! No candle, no plotting library: the SVG is written by hand.

// Tests unwrap freely; the library itself is still linted (clippy builds both).
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod bars;
mod csv;
mod error;
mod figures;
mod frontier;
mod frontier_points;
mod heatmap;
mod html;
mod knockout;
mod leaderboard;
mod lens;
mod lines;
mod markdown;
mod paper;
mod routing;
mod svg;
mod tables;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use lcut_trace::{Report, write_atomic};

pub use bars::{BarChart, BarSeries};
pub use csv::{COLUMNS as CSV_COLUMNS, render_csv};
pub use error::ReportError;
pub use figures::{Figure, default_prompt, figures};
pub use frontier::{frontier_chart, frontier_table, frontier_title, render_frontier_html};
pub use frontier_points::{Frontier, FrontierAxis, FrontierPoint, LEADERBOARD_FILE, family_of};
pub use heatmap::Heatmap;
pub use html::{HtmlOptions, render_html};
pub use knockout::knockout_sentence;
pub use leaderboard::{
    LEADERBOARD_COLUMNS, PAIR_COLUMNS, beats_text, leaderboard_chart, leaderboard_kv_chart,
    render_leaderboard_csv, render_leaderboard_html, render_leaderboard_pairs_csv,
};
pub use lens::{formation_sentence, lens_prompt_table, report_formation_sentence};
pub use lines::{Line, LineChart, LineStyle};
pub use markdown::render_markdown;
pub use paper::{
    CSV_DIR, FIGURES_DIR, PaperFigure, paper_figures, part_csv, render_paper_html,
    render_paper_markdown, standalone_svg, write_paper,
};
pub use routing::routing_sentence;
pub use tables::expected_accuracy_line;

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// One self-contained HTML file with inline SVG figures.
    Html,
    /// Markdown tables and the recommendation.
    Md,
    /// Per-layer curves, one row per layer.
    Csv,
    /// The [`Report`] itself.
    Json,
}

impl Format {
    /// Every format.
    pub const ALL: [Format; 4] = [Format::Html, Format::Md, Format::Csv, Format::Json];

    /// The file extension (also the name accepted by [`FromStr`]).
    pub fn extension(self) -> &'static str {
        match self {
            Format::Html => "html",
            Format::Md => "md",
            Format::Csv => "csv",
            Format::Json => "json",
        }
    }
}

impl FromStr for Format {
    type Err = ReportError;
    fn from_str(s: &str) -> Result<Self, ReportError> {
        match s.to_ascii_lowercase().as_str() {
            "html" => Ok(Format::Html),
            "md" | "markdown" => Ok(Format::Md),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            _ => Err(ReportError::UnknownFormat(s.to_string())),
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.extension())
    }
}

/// The report in `format` as text (HTML with default [`HtmlOptions`]; JSON compact).
pub fn render(report: &Report, format: Format) -> Result<String, ReportError> {
    Ok(match format {
        Format::Html => render_html(report, &HtmlOptions::default()),
        Format::Md => render_markdown(report),
        Format::Csv => render_csv(report),
        Format::Json => serde_json::to_string(report)?,
    })
}

/// Writes `dir/report.{html,md,csv,json}` atomically, creating `dir` if needed,
/// and returns the file's path.
pub fn write_report(report: &Report, dir: &Path, format: Format) -> Result<PathBuf, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(format!("report.{}", format.extension()));
    let text = render(report, format)?;
    write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_diag::synthetic::synthetic_report;

    fn report() -> Report {
        synthetic_report(4, 6, 3, true).unwrap()
    }

    #[test]
    fn every_format_writes_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = report();
        for f in Format::ALL {
            let path = write_report(&r, &dir.path().join("out"), f).unwrap();
            assert_eq!(
                path.file_name().unwrap().to_str().unwrap(),
                format!("report.{f}")
            );
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.len() > 200, "{f}: {} bytes", text.len());
        }
        let names = std::fs::read_dir(dir.path().join("out")).unwrap().count();
        assert_eq!(names, 4, "no temporary files left behind");
    }

    /// The markdown and HTML reports say which build measured the sweep
    /// and the diagnosis, and name each when their shards were measured by
    /// several; what recorded none gets no line.
    #[test]
    fn a_report_names_the_builds_that_measured_it() {
        let by = |isa: &str| lcut_trace::MadeBy {
            build: "lcut 0.1.0 0123456789abcdef".into(),
            isa: isa.into(),
        };
        let mut r = report();
        let sweep = r.sweep.as_mut().expect("the synthetic report has a sweep");
        sweep.made_by = vec![by("avx2")];
        let one = "Measured by lcut 0.1.0 0123456789abcdef on avx2.";
        for f in [Format::Md, Format::Html] {
            assert!(render(&r, f).unwrap().contains(one), "{f}");
        }
        r.sweep.as_mut().unwrap().made_by = vec![by("avx2"), by("avx512")];
        for f in [Format::Md, Format::Html] {
            let text = render(&r, f).unwrap();
            assert!(
                text.contains("Made by 2 builds or instruction-set levels"),
                "{f}"
            );
            assert!(!text.contains("Measured by"), "{f}");
        }
        r.sweep.as_mut().unwrap().made_by.clear();
        for f in [Format::Md, Format::Html] {
            let text = render(&r, f).unwrap();
            assert!(
                !text.contains("Measured by") && !text.contains("Made by"),
                "{f}"
            );
        }
        // the diagnosis' own traces, apart from its sweep's
        r.made_by = vec![by("avx512")];
        let own = "Measured by lcut 0.1.0 0123456789abcdef on avx512.";
        for f in [Format::Md, Format::Html] {
            let text = render(&r, f).unwrap();
            assert_eq!(text.matches("Measured by").count(), 1, "{f}");
            assert!(text.contains(own), "{f}");
        }
    }

    #[test]
    fn json_loads_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let r = report();
        assert!(
            r.traces
                .iter()
                .any(|t| t.curvature_generated.iter().any(|c| c.is_nan())),
            "the synthetic report exercises NaN"
        );
        let path = write_report(&r, dir.path(), Format::Json).unwrap();
        let back = lcut_trace::read_report_json(&path).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn html_has_one_svg_per_figure_and_no_external_references() {
        let r = report();
        let html = render(&r, Format::Html).unwrap();
        let n_fig = figures(&r, None).len();
        assert_eq!(
            n_fig, 14,
            "8 figures, the logit lens's 3, the knockout's 2 and the sweep"
        );
        assert_eq!(html.matches("<figure>").count(), n_fig);
        assert_eq!(html.matches("<svg").count(), n_fig);
        assert_eq!(html.matches("</svg>").count(), n_fig);
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(!html.contains("<script") && !html.contains(" src=") && !html.contains("<link"));
        assert!(html.contains(&format!(
            "Recommended L_cut = <b>{}</b>",
            r.recommendation.l_cut
        )));
        assert!(html.contains("Quality against KV cost"));

        let mut no_sweep = r.clone();
        no_sweep.sweep = None;
        let html = render(&no_sweep, Format::Html).unwrap();
        assert_eq!(html.matches("<svg").count(), n_fig - 1);
    }

    #[test]
    fn a_moe_report_adds_the_load_heatmap_routing_lines_and_overlap_per_cut() {
        let moe = lcut_diag::synthetic::synthetic_moe_report(4, 6, 3, true).unwrap();
        let dense = report();
        let (n_moe, n_dense) = (figures(&moe, None).len(), figures(&dense, None).len());
        assert_eq!(
            n_moe,
            n_dense + 3,
            "load heatmap, routing lines, overlap per cut"
        );
        let html = render(&moe, Format::Html).unwrap();
        assert_eq!(html.matches("<svg").count(), n_moe);
        for part in [
            "How the experts route",
            "Expert load by layer",
            "Routing per layer",
            "Routing overlap with the full model per cut",
            "<th>routing overlap</th>",
        ] {
            assert!(html.contains(part), "{part}");
        }
        let md = render(&moe, Format::Md).unwrap();
        assert!(md.contains("## How the experts route") && md.contains("| routing overlap |"));
        let csv = render(&moe, Format::Csv).unwrap();
        assert!(
            csv.lines()
                .next()
                .unwrap()
                .ends_with("routing_entropy,routing_overlap,sink")
        );
        // its sinks' share: a column of the per-layer table and a line of
        // the masses' chart
        assert!(md.contains("| sink (no key) |") && html.contains("sink (no key)"));
        // the dense report says nothing of routing, its CSV cells stay empty
        let html = render(&dense, Format::Html).unwrap();
        assert!(!html.contains("How the experts route") && !html.contains("routing"));
        assert!(!html.contains("sink (no key)"));
        let csv = render(&dense, Format::Csv).unwrap();
        assert!(csv.lines().skip(1).all(|l| l.ends_with(",,")));
    }

    #[test]
    fn html_escapes_user_text() {
        let mut r = report();
        r.model.path = "<script>alert(1)</script>".into();
        r.traces[0].id = "a&b".into();
        let html = render_html(&r, &HtmlOptions { prompt: Some(0) });
        assert!(!html.contains("<script>"));
        assert!(html.contains("&lt;script&gt;") && html.contains("a&amp;b"));
    }

    #[test]
    fn csv_has_one_row_per_layer() {
        let r = report();
        let csv = render(&r, Format::Csv).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 1 + r.model.num_layers);
        assert_eq!(lines[0], CSV_COLUMNS.join(","));
        assert!(
            lines
                .iter()
                .all(|l| l.split(',').count() == CSV_COLUMNS.len())
        );
        let prefill0: f32 = lines[1].split(',').nth(3).unwrap().parse().unwrap();
        assert_eq!(prefill0, r.curves.prefill[0]);
    }

    #[test]
    fn markdown_has_the_recommendation_and_tables() {
        let r = report();
        let md = render(&r, Format::Md).unwrap();
        assert!(md.contains(&format!(
            "Recommended L_cut = {} of 6",
            r.recommendation.l_cut
        )));
        assert!(md.contains("| layer | BoS |"));
        assert!(md.contains("## Sweep at 4096 tokens"));
    }

    #[test]
    fn formats_parse_by_name() {
        assert_eq!("HTML".parse::<Format>().unwrap(), Format::Html);
        assert_eq!("markdown".parse::<Format>().unwrap(), Format::Md);
        let err = "pdf".parse::<Format>().unwrap_err().to_string();
        assert!(err.contains("pdf") && err.contains("html"), "{err}");
    }
}
