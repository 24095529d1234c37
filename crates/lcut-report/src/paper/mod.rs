//! The report of `lcut paper`: the paper's six parts for one model as one
//! self-contained HTML file (inline SVG), Markdown that links each figure's
//! SVG file, one CSV per part and the JSON report, each figure beside the
//! command and settings that made it. Every file is written atomically.

mod figures;
mod tables;

use std::fmt::Write;
use std::path::{Path, PathBuf};

use lcut_trace::{PaperPart, PaperReport, PartRecord, write_atomic};

pub use figures::{PaperFigure, paper_figures};
pub use tables::part_csv;

use crate::error::ReportError;
use crate::svg::escape;
use crate::tables::Table;

/// The figures' folder inside the report's folder.
pub const FIGURES_DIR: &str = "figures";
/// The CSV folder inside the report's folder.
pub const CSV_DIR: &str = "csv";

/// What a report says of a part it has no record of.
const NOT_RUN: &str = "Not run for this report (see --parts).";

fn html_table(out: &mut String, t: &Table) {
    crate::html::table(out, t);
}

/// The record's note, command and settings as HTML.
fn html_provenance(out: &mut String, rec: &PartRecord) {
    let _ = write!(
        out,
        "<p>Made by: <code>{}</code></p><details><summary>settings</summary><pre>{}</pre></details>",
        escape(&rec.command),
        escape(&serde_json::to_string_pretty(&rec.settings).unwrap_or_default())
    );
}

/// Renders the paper report as one HTML document.
pub fn render_paper_html(r: &PaperReport) -> String {
    let figures = paper_figures(r);
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>lcut paper: {m}</title><style>{style}</style></head><body>\
         <h1>The SPEED paper's evidence: {m}</h1>",
        m = escape(&r.model.path),
        style = crate::html::STYLE
    );
    html_table(&mut out, &tables::setting_table(r));
    for part in PaperPart::ALL {
        let _ = write!(out, "<h2>{}. {}</h2>", part.number(), escape(part.title()));
        let Some(rec) = r.record(part) else {
            let _ = write!(out, "<p>{NOT_RUN}</p>");
            continue;
        };
        if let Some(note) = &rec.note {
            let _ = write!(out, "<p class=\"cut\">{}</p>", escape(note));
        }
        for f in figures.iter().filter(|f| f.part == part) {
            let _ = write!(
                out,
                "<figure>{}<figcaption>{}</figcaption></figure>",
                f.figure.svg,
                escape(&f.figure.caption)
            );
        }
        for t in tables::part_tables(r, part) {
            html_table(&mut out, &t);
        }
        html_provenance(&mut out, rec);
    }
    out.push_str("</body></html>\n");
    out
}

/// Renders the paper report as Markdown; figures are linked as
/// `figures/NAME.svg`.
pub fn render_paper_markdown(r: &PaperReport) -> String {
    let figures = paper_figures(r);
    let mut out = format!(
        "# The SPEED paper's evidence: {}\n\n",
        crate::markdown::cell(&r.model.path)
    );
    crate::markdown::table(&mut out, &tables::setting_table(r));
    for part in PaperPart::ALL {
        let _ = writeln!(out, "## {}. {}\n", part.number(), part.title());
        let Some(rec) = r.record(part) else {
            let _ = writeln!(out, "{NOT_RUN}\n");
            continue;
        };
        if let Some(note) = &rec.note {
            let _ = writeln!(out, "> {}\n", note.replace('\n', " "));
        }
        for f in figures.iter().filter(|f| f.part == part) {
            let _ = writeln!(
                out,
                "![{}]({FIGURES_DIR}/{}.svg)\n\n{}\n",
                f.figure.title, f.file, f.figure.caption
            );
        }
        for t in tables::part_tables(r, part) {
            crate::markdown::table(&mut out, &t);
        }
        let _ = writeln!(
            out,
            "Made by:\n\n```sh\n{}\n```\n\nSettings: `{}`\n",
            rec.command,
            serde_json::to_string(&rec.settings).unwrap_or_default()
        );
    }
    out
}

/// An inline `<svg>` as a file of its own (with the SVG namespace, which
/// inline SVG in HTML takes from the parser).
pub fn standalone_svg(svg: &str) -> String {
    let body = svg.strip_prefix("<svg").unwrap_or(svg);
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"{body}\n"
    )
}

fn create_dir(dir: &Path) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `dir/paper.{html,md,json}`, `dir/figures/*.svg` and
/// `dir/csv/*.csv`, each atomically; returns the paths written.
pub fn write_paper(r: &PaperReport, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let (fig_dir, csv_dir) = (dir.join(FIGURES_DIR), dir.join(CSV_DIR));
    for d in [dir, &fig_dir, &csv_dir] {
        create_dir(d)?;
    }
    let mut files: Vec<(PathBuf, String)> = vec![
        (dir.join("paper.html"), render_paper_html(r)),
        (dir.join("paper.md"), render_paper_markdown(r)),
        (dir.join("paper.json"), serde_json::to_string_pretty(r)?),
    ];
    for f in paper_figures(r) {
        files.push((
            fig_dir.join(format!("{}.svg", f.file)),
            standalone_svg(&f.figure.svg),
        ));
    }
    for part in PaperPart::ALL {
        if let Some((stem, text)) = part_csv(r, part) {
            files.push((csv_dir.join(format!("{stem}.csv")), text));
        }
    }
    let mut written = Vec::with_capacity(files.len());
    for (path, text) in files {
        write_atomic(&path, text.as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_diag::synthetic::{synthetic_model, synthetic_report};
    use lcut_trace::{
        CategoryCurves, CategoryRow, LoopRow, PolicyCurves, SuiteSource, TimingPoint,
    };
    use serde_json::json;

    fn record(part: PaperPart, note: Option<&str>) -> PartRecord {
        PartRecord {
            part,
            written: note.is_none(),
            command: format!("lcut paper --model m --suite s --out o --parts {part}"),
            settings: json!({"cut": 3}),
            note: note.map(String::from),
        }
    }

    fn timing(policy: &str, len: usize, r: f64) -> TimingPoint {
        TimingPoint {
            policy: policy.into(),
            prompt_len: len,
            new_tokens: 8,
            ttft_s: 0.1,
            tpot_s: 0.01,
            kv_bytes: 1000,
            ttft_ratio: r,
            tpot_ratio: r,
            kv_ratio: r,
            predicted_ttft_ratio: r,
            predicted_tpot_ratio: r,
            predicted_kv_ratio: r,
        }
    }

    fn row(policy: &str, group: &str, accuracy: f64) -> CategoryRow {
        CategoryRow {
            policy: policy.into(),
            adapter: None,
            group: group.into(),
            n: 10,
            correct: (accuracy * 10.0) as usize,
            accuracy,
            ci95: [accuracy - 0.1, accuracy + 0.1],
            full_correct: 9,
            top1_agreement: 0.9,
            mean_kl: 0.1,
            kv_ratio: 0.75,
            ttft_ratio: Some(0.8),
            tpot_ratio: None,
        }
    }

    fn loops(policy: &str, family: &str, anchors: &str, looping: usize) -> LoopRow {
        LoopRow {
            policy: policy.into(),
            family: family.into(),
            anchors: anchors.into(),
            generations: 10,
            looping,
            share: looping as f64 / 10.0,
            ci95: [0.0, 0.5],
            stopped: 2,
            mean_period: 2.0,
        }
    }

    /// A report with every part: Figure 4 skipped with its note.
    fn report() -> PaperReport {
        let curves = synthetic_report(3, 4, 2, false).unwrap().curves;
        PaperReport {
            schema_version: lcut_trace::PAPER_SCHEMA_VERSION,
            tool_version: "lcut 0".into(),
            model: synthetic_model(4, 2),
            suite: SuiteSource {
                path: "suite.jsonl".into(),
                hash: "h".into(),
                items: 20,
                shard: None,
            },
            cut: 3,
            cut_source: "--cut".into(),
            recommended: Some(4),
            parts: vec![
                record(PaperPart::Masses, None),
                record(PaperPart::Timing, None),
                record(PaperPart::Layers, None),
                record(
                    PaperPart::Retrieval,
                    Some("skipped: the suite has no `retrieval` items"),
                ),
                record(PaperPart::Table, None),
                record(PaperPart::Loops, None),
            ],
            masses: vec![
                PolicyCurves {
                    policy: "full".into(),
                    prompts: 3,
                    curves: curves.clone(),
                },
                PolicyCurves {
                    policy: "speed:3+bos".into(),
                    prompts: 3,
                    curves: curves.clone(),
                },
            ],
            timing: vec![
                timing("full", 128, 1.0),
                timing("speed:3+bos", 128, 0.8),
                timing("full", 256, 1.0),
                timing("speed:3+bos", 256, 0.78),
            ],
            layers: vec![
                CategoryCurves {
                    kind: "copy".into(),
                    prompts: 2,
                    curves: curves.clone(),
                },
                CategoryCurves {
                    kind: "lookup".into(),
                    prompts: 1,
                    curves,
                },
            ],
            retrieval: vec![],
            table: vec![
                row("full", "all", 0.9),
                row("full", "copy", 1.0),
                row("speed:3+bos", "all", 0.5),
                row("speed:3+bos", "copy", 0.4),
            ],
            table_timed_at: Some(256),
            loops: vec![
                loops("full", "full", "full", 0),
                loops("speed:3", "speed:3", "none", 4),
                loops("speed:3+bos", "speed:3", "bos", 1),
            ],
        }
    }

    #[test]
    fn html_has_every_part_its_command_and_the_skip_note() {
        let r = report();
        let html = render_paper_html(&r);
        for part in PaperPart::ALL {
            assert!(html.contains(&format!("<h2>{}. ", part.number())), "{part}");
            assert!(html.contains(&format!("--parts {part}</code>")), "{part}");
        }
        assert!(html.contains("skipped: the suite has no `retrieval` items"));
        let figures = paper_figures(&r);
        // 2 mass heatmaps, 3 timing charts, 4 per-layer charts and the
        // logit lens's 2, accuracy and its frontier, loops
        assert_eq!(figures.len(), 14);
        // the frontier: SPEED+BoS at its K/V over all items, full as the line
        let frontier = figures.iter().find(|f| f.file == "5-frontier").unwrap();
        assert!(frontier.figure.svg.contains("SPEED+BoS"));
        assert!(frontier.figure.svg.contains("full 0.900"));
        assert!(
            frontier
                .figure
                .svg
                .contains("K/V held (share of full, measured)")
        );
        assert!(
            html.contains("formation layer (median)"),
            "the lens per category"
        );
        assert_eq!(html.matches("<svg").count(), figures.len());
        assert!(!html.contains("http://") && !html.contains("<script"));
        assert!(html.contains("TTFT x @256"));
    }

    #[test]
    fn a_part_without_a_record_says_it_was_not_run() {
        let mut r = report();
        r.parts.retain(|p| p.part != PaperPart::Loops);
        r.loops.clear();
        let md = render_paper_markdown(&r);
        assert!(md.contains("## 6. Repetition loops"), "{md}");
        assert!(md.contains(NOT_RUN));
    }

    #[test]
    fn files_are_written_with_standalone_svgs_and_one_csv_per_part() {
        let dir = tempfile::tempdir().unwrap();
        let r = report();
        let written = write_paper(&r, dir.path()).unwrap();
        let svgs = std::fs::read_dir(dir.path().join(FIGURES_DIR))
            .unwrap()
            .count();
        assert_eq!(svgs, paper_figures(&r).len());
        let svg = std::fs::read_to_string(dir.path().join("figures/6-loops.svg")).unwrap();
        assert!(
            svg.contains("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{svg}"
        );
        let csvs: Vec<String> = std::fs::read_dir(dir.path().join(CSV_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(csvs.len(), 5, "every part but the skipped one: {csvs:?}");
        let timing = std::fs::read_to_string(dir.path().join("csv/2-timing.csv")).unwrap();
        assert_eq!(timing.lines().count(), 1 + r.timing.len());
        let md = std::fs::read_to_string(dir.path().join("paper.md")).unwrap();
        for f in paper_figures(&r) {
            assert!(
                md.contains(&format!("(figures/{}.svg)", f.file)),
                "{}",
                f.file
            );
        }
        let back: PaperReport =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("paper.json")).unwrap())
                .unwrap();
        assert_eq!(back, r);
        assert_eq!(written.len(), 3 + svgs + csvs.len());
    }

    #[test]
    fn the_table_has_one_row_per_policy_and_a_column_per_group() {
        let t = tables::category_table(&report());
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.headers[1..3], ["all accuracy", "copy accuracy"]);
        assert_eq!(t.rows[1][1], "0.500 [0.40, 0.60]");
        assert_eq!(t.rows[1].last().unwrap(), "–", "TPOT was not timed");
    }

    #[test]
    fn figure_1_shares_one_colour_scale_and_loops_pair_the_anchors() {
        let figs = paper_figures(&report());
        let speed = figs.iter().find(|f| f.file == "1-masses-speed").unwrap();
        assert!(speed.figure.svg.contains("L_cut = 3"));
        assert!(
            speed.figure.svg.contains(">prefill</text>")
                && speed.figure.svg.contains(">BoS</text>")
        );
        let l = figs.iter().find(|f| f.file == "6-loops").unwrap();
        assert!(
            l.figure
                .svg
                .contains("<title>anchor-free, speed:3: 0.4</title>")
        );
        assert!(l.figure.svg.contains("<title>+BoS, speed:3: 0.1</title>"));
        assert!(l.figure.svg.contains("full: 0.00"));
    }
}
