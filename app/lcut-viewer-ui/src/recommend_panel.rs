//! The recommendation: the cut, each signal's vote, the explanation text, and
//! a button that moves the chosen cut to the recommended one.

use egui::{Grid, RichText, Ui};
use lcut_trace::{Recommendation, Thresholds};

fn vote_text(v: Option<usize>) -> String {
    v.map_or_else(|| "no vote".to_string(), |c| c.to_string())
}

/// The short form for the side panel: the cut and the votes.
pub fn show_votes(ui: &mut Ui, rec: &Recommendation, l_cut: &mut usize) {
    ui.label(
        RichText::new(format!(
            "Recommended L_cut: {} of {}",
            rec.l_cut, rec.num_layers
        ))
        .strong(),
    );
    Grid::new("votes").num_columns(2).show(ui, |ui| {
        ui.label("Tail-mass vote");
        ui.label(vote_text(rec.votes.tail_mass));
        ui.end_row();
        ui.label("Selective-band vote");
        ui.label(vote_text(rec.votes.selective_band));
        ui.end_row();
        ui.label("Curvature-plateau vote");
        ui.label(vote_text(rec.votes.curvature_plateau));
        ui.end_row();
        ui.label("Prefill mass dropped");
        ui.label(format!("{:.1}%", 100.0 * rec.tail_mass_dropped));
        ui.end_row();
    });
    if ui
        .add_enabled(
            *l_cut != rec.l_cut,
            egui::Button::new("Use recommended L_cut"),
        )
        .clicked()
    {
        *l_cut = rec.l_cut;
    }
}

/// The full recommendation: votes, thresholds and the explanation.
pub fn show_recommendation(ui: &mut Ui, rec: &Recommendation, th: &Thresholds, l_cut: &mut usize) {
    show_votes(ui, rec, l_cut);
    ui.separator();
    ui.label(RichText::new("Explanation").strong());
    ui.label(&rec.explanation);
    ui.separator();
    ui.label(RichText::new("Thresholds").strong());
    Grid::new("thresholds").num_columns(2).show(ui, |ui| {
        for (name, v) in [
            ("tail mass max", th.tail_mass_max),
            ("entropy max", th.entropy_max),
            ("mass min", th.mass_min),
            ("plateau eps (rad)", th.plateau_eps),
            ("agreement drop max", th.agreement_drop_max),
        ] {
            ui.label(name);
            ui.label(format!("{v}"));
            ui.end_row();
        }
    });
}
