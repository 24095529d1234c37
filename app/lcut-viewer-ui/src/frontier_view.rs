//! The frontier view: accuracy against K/V held (or, for a leaderboard run,
//! the compression ratio), one line per family through its best accuracy
//! within each K/V, every point with its 95% interval, the full model's accuracy as a line, and the points as a
//! table; fed from `lcut eval --json` results or a leaderboard run, opened
//! with the dialog, dropped on the window or named with `--eval`.

use std::path::PathBuf;

use egui::{Color32, ScrollArea, Ui};
use egui_plot::{HLine, Legend, Line, Plot, PlotPoints, Points};
use lcut_report::{Frontier, FrontierAxis};

use crate::theme::SERIES;

/// The results on display and how they are drawn.
#[derive(Debug, Default)]
pub struct FrontierView {
    /// The files read, in the order opened.
    pub files: Vec<PathBuf>,
    /// The frontier of `files`, when they make one.
    pub frontier: Option<Frontier>,
    /// Draw against the compression ratio (a leaderboard run only).
    pub ratio_axis: bool,
}

/// Colours of the families beyond the theme's four series.
const MORE: [Color32; 4] = [
    Color32::from_rgb(230, 150, 40),
    Color32::from_rgb(140, 110, 200),
    Color32::from_rgb(120, 120, 120),
    Color32::from_rgb(60, 180, 170),
];

/// The colour of family `i`.
fn colour(i: usize) -> Color32 {
    let all: Vec<Color32> = SERIES.iter().chain(MORE.iter()).copied().collect();
    all[i % all.len()]
}

impl FrontierView {
    /// Add `path` to the results and read them all again; on an error the
    /// view is left as it was and the error returned in words.
    pub fn open(&mut self, path: PathBuf) -> Result<(), String> {
        let mut files = self.files.clone();
        // a leaderboard run is drawn alone: it replaces what was open
        if path.is_dir()
            || path
                .file_name()
                .is_some_and(|n| n == lcut_report::LEADERBOARD_FILE)
        {
            files.clear();
        }
        if !files.contains(&path) {
            files.push(path);
        }
        let frontier = Frontier::read(&files, self.axis(), "all").map_err(|e| e.to_string())?;
        self.files = files;
        self.frontier = Some(frontier);
        Ok(())
    }

    /// Forget every result.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    fn axis(&self) -> FrontierAxis {
        match self.ratio_axis {
            true => FrontierAxis::CompressionRatio,
            false => FrontierAxis::KvHeld,
        }
    }

    /// Switch the axis (a leaderboard run only), reading the files again.
    fn set_ratio_axis(&mut self, ratio: bool) -> Result<(), String> {
        let was = self.ratio_axis;
        self.ratio_axis = ratio;
        match Frontier::read(&self.files, self.axis(), "all") {
            Ok(f) => {
                self.frontier = Some(f);
                Ok(())
            }
            Err(e) => {
                self.ratio_axis = was;
                Err(e.to_string())
            }
        }
    }
}

/// What the user asked of the view this frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FrontierAction {
    /// Open the dialog to add a result.
    pub open: bool,
}

/// Draws the view; returns what the user asked for and, when switching
/// the axis failed, why.
pub fn show_frontier(ui: &mut Ui, view: &mut FrontierView) -> (FrontierAction, Option<String>) {
    let mut action = FrontierAction::default();
    let mut error = None;
    ui.horizontal(|ui| {
        action.open = ui.button("Open eval result…").clicked();
        if !view.files.is_empty() && ui.button("Clear").clicked() {
            view.clear();
        }
        ui.separator();
        ui.label("x axis:");
        let mut ratio = view.ratio_axis;
        ui.radio_value(&mut ratio, false, "K/V held");
        ui.radio_value(&mut ratio, true, "compression ratio");
        if ratio != view.ratio_axis && !view.files.is_empty() {
            error = view.set_ratio_axis(ratio).err();
        } else if view.files.is_empty() {
            view.ratio_axis = ratio;
        }
    });
    let Some(f) = view.frontier.as_ref() else {
        ui.label(
            "No results open: open `lcut eval --suite ... --json` results (one per policy, the \
             full model's for the reference line) or a leaderboard run's leaderboard.json, or \
             drop them on this window.",
        );
        return (action, error);
    };
    ui.label(format!(
        "{} policies in {} families over {}",
        f.points.len(),
        f.families().len(),
        if f.over.is_empty() {
            "the results"
        } else {
            &f.over
        }
    ));
    let h = (ui.available_height() * 0.6).clamp(180.0, 460.0);
    Plot::new("frontier_plot")
        .height(h)
        .legend(Legend::default())
        .x_axis_label(f.axis.label())
        .y_axis_label("accuracy (95% interval)")
        .show(ui, |pui| {
            if let Some(a) = f.full_accuracy {
                pui.hline(HLine::new(format!("full {a:.3}"), a).color(Color32::GRAY));
            }
            for (i, family) in f.families().into_iter().enumerate() {
                let c = colour(i);
                let series = f.series(family);
                // the line joins the family's frontier; every point is a dot
                let on: Vec<[f64; 2]> = f
                    .envelope(family)
                    .iter()
                    .map(|p| [p.x, p.accuracy])
                    .collect();
                let pts: Vec<[f64; 2]> = series.iter().map(|p| [p.x, p.accuracy]).collect();
                pui.line(Line::new(family, PlotPoints::new(on)).color(c));
                pui.points(
                    Points::new(family, PlotPoints::new(pts))
                        .color(c)
                        .radius(3.5),
                );
                for p in series {
                    let whisker = vec![[p.x, p.ci95[0]], [p.x, p.ci95[1]]];
                    pui.line(
                        Line::new(family, PlotPoints::new(whisker)).color(c.gamma_multiply(0.6)),
                    );
                }
            }
        });
    show_table(ui, f);
    (action, error)
}

/// The points, family by family.
fn show_table(ui: &mut Ui, f: &Frontier) {
    ScrollArea::vertical()
        .id_salt("frontier_table")
        .show(ui, |ui| {
            egui::Grid::new("frontier_rows")
                .striped(true)
                .num_columns(5)
                .show(ui, |ui| {
                    let x = match f.axis {
                        FrontierAxis::KvHeld => "K/V held",
                        FrontierAxis::CompressionRatio => "ratio",
                    };
                    for h in ["family", "policy", x, "accuracy [95%]", "full's right kept"] {
                        ui.strong(h);
                    }
                    ui.end_row();
                    for family in f.families() {
                        for p in f.series(family) {
                            ui.label(p.family.as_str());
                            ui.label(p.policy.as_str());
                            ui.label(format!("{:.3}", p.x));
                            ui.label(format!(
                                "{:.3} [{:.3}, {:.3}]",
                                p.accuracy, p.ci95[0], p.ci95[1]
                            ));
                            ui.label(match (p.kept_of_full, p.full_correct) {
                                (Some(k), Some(n)) => format!("{k} of {n}"),
                                _ => String::new(),
                            });
                            ui.end_row();
                        }
                    }
                });
        });
}
