//! The whole window: control bar on top, status bar below, the cutoff panel
//! (slider, recommendation, cost) on the right, and the tabbed views.

use std::path::Path;
use std::time::Duration;

use egui::{CentralPanel, Panel, RichText, ScrollArea, Slider, Ui};

use crate::controls::{show_controls, show_status};
use crate::cost_panel::show_cost_panel;
use crate::curves::show_curves;
use crate::files::{DialogPurpose, handle_dropped, open_dialog, show_dialog};
use crate::frontier_view::show_frontier;
use crate::heads_view::show_heads;
use crate::heatmap_view::show_heatmaps;
use crate::live::show_live;
use crate::recommend_panel::{show_recommendation, show_votes};
use crate::routing_view::{has_routing, show_routing};
use crate::slim_views::show_slim_views;
use crate::state::{JobKind, Tab, ViewerState};
use crate::sweep_panel::{SweepRunning, show_sweep};

/// What cutting at `l_cut` of `layers` means, in words.
pub fn cut_sentence(l_cut: usize, layers: usize) -> String {
    if l_cut >= layers {
        format!("Every layer (0..{}) keeps the prompt: no cut.", layers - 1)
    } else if l_cut + 1 == layers {
        format!(
            "Layers 0..{} keep the prompt; layer {l_cut} sees only BoS and decode-phase tokens.",
            l_cut - 1
        )
    } else {
        format!(
            "Layers 0..{} keep the prompt; {l_cut}..{} see only BoS and decode-phase tokens.",
            l_cut - 1,
            layers - 1
        )
    }
}

/// The right-hand panel: the chosen L_cut, the votes and the cost panel.
pub fn show_cutoff_panel(ui: &mut Ui, state: &mut ViewerState) {
    let Some(loaded) = state.loaded.as_ref() else {
        return;
    };
    let report = std::sync::Arc::clone(&loaded.report);
    let layers = report.model.num_layers.max(1);
    state.view.l_cut = state.view.l_cut.clamp(1, layers);
    ui.heading("Cutoff");
    ui.add(Slider::new(&mut state.view.l_cut, 1..=layers).text("L_cut"));
    ui.label(cut_sentence(state.view.l_cut, layers));
    ui.separator();
    show_votes(ui, &report.recommendation, &mut state.view.l_cut);
    ui.separator();
    // the open model's context length bounds the cost when the report is of it
    let max_context = state
        .model
        .as_ref()
        .filter(|m| {
            let r = &report.model;
            (m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim)
                == (r.num_layers, r.num_heads, r.num_kv_heads, r.head_dim)
        })
        .map(|m| m.max_positions);
    show_cost_panel(
        ui,
        &report.model,
        state.view.l_cut,
        max_context,
        &mut state.cost,
    );
}

fn show_empty(ui: &mut Ui) {
    ui.vertical_centered(|ui| {
        ui.add_space(60.0);
        ui.label(RichText::new("No report open").heading());
        ui.label(
            "Open a model (a folder or a .gguf file; drop either on this window) and press \
             Run diagnostics, or open a saved report (Open report…, or drop a report.json or \
             a run folder on this window).",
        );
    });
}

/// Whether tab `t` is offered: the routing view only for a report whose
/// model routes (a mixture-of-experts model).
fn offered(t: Tab, state: &ViewerState) -> bool {
    t != Tab::Routing || state.loaded.as_ref().is_some_and(has_routing)
}

fn show_tabs(ui: &mut Ui, state: &mut ViewerState) {
    if !offered(state.view.tab, state) {
        state.view.tab = Tab::Heatmaps;
    }
    ui.horizontal(|ui| {
        for t in Tab::ALL {
            if offered(t, state) {
                ui.selectable_value(&mut state.view.tab, t, t.label());
            }
        }
    });
    ui.separator();
}

fn show_live_tab(ui: &mut Ui, state: &mut ViewerState) {
    let why_not = match &state.model {
        None => "open a model to generate",
        Some(m) if !m.has_tokenizer => "the model has no tokenizer",
        Some(_) if state.busy() => "a job is running",
        Some(_) => "",
    };
    let can_run = why_not.is_empty();
    let layers = state.model.as_ref().map_or(0, |m| m.num_layers);
    ScrollArea::vertical()
        .id_salt("live_scroll")
        .show(ui, |ui| {
            // the control shows the cut of the run on screen, not the
            // report's chosen cut (a report arriving, or a cut picked in the
            // report's views, leaves it alone)
            let mut cut = state.live_cut();
            let go = show_live(ui, &mut state.live, &mut cut, layers, can_run, why_not);
            if cut != state.live_cut() {
                state.live.chosen_cut = Some(cut);
            }
            if go {
                state.run_generate();
            }
            if state
                .job
                .as_ref()
                .is_some_and(|j| j.kind == JobKind::Generate)
                && ui.button("Cancel generation").clicked()
            {
                state.cancel();
            }
            if let Some(v) = &state.live.slim {
                ui.separator();
                show_slim_views(ui, v);
            }
        });
}

/// The central area: tabs and the selected view.
pub fn show_central(ui: &mut Ui, state: &mut ViewerState) {
    show_tabs(ui, state);
    if state.view.tab == Tab::Live {
        show_live_tab(ui, state);
        return;
    }
    if state.view.tab == Tab::Frontier {
        let (action, error) = show_frontier(ui, &mut state.frontier);
        if let Some(e) = error {
            state.error = Some(e);
        }
        if action.open {
            let start = state
                .frontier
                .files
                .last()
                .and_then(|f| f.parent().map(Path::to_path_buf));
            open_dialog(state, DialogPurpose::EvalResult, start.as_deref());
        }
        return;
    }
    if state.view.tab == Tab::Heads && state.loaded.is_some() {
        show_heads(ui, state);
        return;
    }
    let Some(loaded) = state.loaded.as_mut() else {
        show_empty(ui);
        return;
    };
    let view = &mut state.view;
    match view.tab {
        Tab::Heatmaps => show_heatmaps(ui, loaded, view, state.live.slim.as_ref()),
        Tab::Curves => {
            crate::heatmap_view::show_selectors(ui, loaded, view);
            let th = loaded.report.settings.thresholds;
            let rec = loaded.report.recommendation.l_cut;
            show_curves(ui, &loaded.curves, &mut view.l_cut, rec, th.entropy_max);
        }
        Tab::Recommendation => {
            let report = std::sync::Arc::clone(&loaded.report);
            ScrollArea::vertical().show(ui, |ui| {
                show_recommendation(
                    ui,
                    &report.recommendation,
                    &report.settings.thresholds,
                    &mut view.l_cut,
                );
            });
        }
        Tab::Sweep => {
            let running = state
                .job
                .as_ref()
                .filter(|_| loaded.sweep_pending)
                .map(|j| SweepRunning {
                    fraction: j.fraction(),
                    message: &j.message,
                });
            show_sweep(
                ui,
                loaded.report.sweep.as_ref(),
                running,
                &mut view.l_cut,
                &mut view.sweep_axis,
            );
        }
        Tab::Routing => show_routing(ui, loaded, view),
        Tab::Heads | Tab::Live | Tab::Frontier => {}
    }
}

/// Draws the viewer for one frame: polls the backend, handles dropped files,
/// lays out the panels and the file dialog, and records the frame time.
pub fn show_viewer(ui: &mut Ui, state: &mut ViewerState) {
    let start = state.frames.begin();
    state.poll();
    let ctx = ui.ctx().clone();
    handle_dropped(&ctx, state);
    Panel::top("controls").show(ui, |ui| show_controls(ui, state));
    Panel::bottom("status").show(ui, |ui| show_status(ui, state));
    if state.loaded.is_some() {
        Panel::right("cutoff").default_size(300.0).show(ui, |ui| {
            ScrollArea::vertical()
                .id_salt("cutoff_scroll")
                .show(ui, |ui| show_cutoff_panel(ui, state));
        });
    }
    CentralPanel::default().show(ui, |ui| show_central(ui, state));
    show_dialog(&ctx, state);
    if state.busy() {
        // Events also wake the UI; this keeps the progress bar animating.
        ctx.request_repaint_after(Duration::from_millis(100));
    }
    state.frames.end(start);
}

#[cfg(test)]
mod tests {
    use super::cut_sentence;

    #[test]
    fn the_cut_in_words() {
        assert_eq!(
            cut_sentence(3, 30),
            "Layers 0..2 keep the prompt; 3..29 see only BoS and decode-phase tokens."
        );
        assert_eq!(
            cut_sentence(29, 30),
            "Layers 0..28 keep the prompt; layer 29 sees only BoS and decode-phase tokens."
        );
        assert_eq!(
            cut_sentence(30, 30),
            "Every layer (0..29) keeps the prompt: no cut."
        );
    }
}
