//! The control bar: model (folder, `.gguf` or store name), prompts, run /
//! cancel with progress, open a report, export; and the status bar.

use std::path::{Path, PathBuf};

use egui::{ComboBox, DragValue, ProgressBar, RichText, TextEdit, Ui};
use lcut_report::Format;

use crate::files::{DialogPurpose, dialog_start, open_dialog};
use crate::state::{PromptChoice, ViewerState};
use crate::theme::ERROR_TEXT;

fn model_row(ui: &mut Ui, state: &mut ViewerState) {
    let idle = !state.busy();
    ui.horizontal(|ui| {
        let l = ui.label("Model (folder, .gguf or name):");
        ui.add(
            TextEdit::singleline(&mut state.inputs.model_path)
                .desired_width(320.0)
                .hint_text("a folder, a .gguf file, ORG/NAME or NAME:TAG"),
        )
        .labelled_by(l.id)
        .on_hover_text(
            "a model folder or a GGUF file; or a name already on disk: ORG/NAME[@REV][:FILE] \
             from the Hugging Face hub cache, NAME[:TAG] from Ollama's store (nothing is downloaded)",
        );
        if ui
            .add_enabled(idle, egui::Button::new("Browse folder…"))
            .on_hover_text("pick a model folder (config.json, safetensors, tokenizer)")
            .clicked()
        {
            let start = dialog_start(&state.inputs.model_path);
            open_dialog(state, DialogPurpose::ModelDir, start.as_deref());
        }
        if ui
            .add_enabled(idle, egui::Button::new("Browse .gguf…"))
            .on_hover_text("pick a GGUF model file (tokenizer and chat template inside)")
            .clicked()
        {
            let start = dialog_start(&state.inputs.model_path);
            open_dialog(state, DialogPurpose::ModelFile, start.as_deref());
        }
        if ui
            .add_enabled(idle, egui::Button::new("Open model"))
            .clicked()
        {
            let path = PathBuf::from(state.inputs.model_path.trim());
            state.open_model(path);
        }
        if ui
            .add_enabled(idle, egui::Button::new("Bundled model"))
            .on_hover_text(state.inputs.bundled_model.display().to_string())
            .clicked()
        {
            let dir = state.inputs.bundled_model.clone();
            state.open_model(dir);
        }
        match &state.model {
            Some(m) => ui.label(format!(
                "{}: {} layers × {} heads ({} KV){}",
                m.arch,
                m.num_layers,
                m.num_heads,
                m.num_kv_heads,
                if m.has_tokenizer {
                    ""
                } else {
                    ", no tokenizer"
                }
            )),
            None => ui.label(RichText::new("no model open").weak()),
        };
    });
}

fn prompts_row(ui: &mut Ui, state: &mut ViewerState) {
    let idle = !state.busy();
    ui.horizontal(|ui| {
        ui.label("Prompts:");
        let p = &mut state.inputs.prompts;
        ui.radio_value(p, PromptChoice::Bundled, "Bundled set");
        ui.radio_value(p, PromptChoice::File, "Prompt file");
        ui.radio_value(p, PromptChoice::Typed, "Typed prompt");
        match state.inputs.prompts {
            PromptChoice::Bundled => {}
            PromptChoice::File => {
                let l = ui.label("path:");
                ui.add(TextEdit::singleline(&mut state.inputs.prompts_file).desired_width(240.0))
                    .labelled_by(l.id);
                if ui.add_enabled(idle, egui::Button::new("Browse prompts…")).clicked() {
                    let start = Path::new(&state.inputs.prompts_file)
                        .parent()
                        .map(Path::to_path_buf);
                    open_dialog(state, DialogPurpose::PromptFile, start.as_deref());
                }
            }
            PromptChoice::Typed => {
                let l = ui.label("text:");
                ui.add(
                    TextEdit::singleline(&mut state.inputs.typed_prompt)
                        .desired_width(280.0)
                        .hint_text("a prompt"),
                )
                .labelled_by(l.id);
            }
        }
        ui.separator();
        let l = ui.label("Max new tokens");
        ui.add(DragValue::new(&mut state.inputs.max_new_tokens).range(1..=4096))
            .labelled_by(l.id);
        ui.checkbox(&mut state.inputs.use_chat_template, "Chat template");
        ui.checkbox(&mut state.inputs.with_sweep, "With sweep")
            .on_hover_text("also measure quality against cost at every L_cut (context length from the cost panel)");
        let can_run = idle && state.model.is_some();
        let run = ui
            .add_enabled(can_run, egui::Button::new("Run diagnostics"))
            .on_disabled_hover_text(if state.model.is_none() {
                "open a model first"
            } else {
                "a job is running"
            });
        if run.clicked() {
            state.run_diagnose();
        }
    });
}

fn job_row(ui: &mut Ui, state: &mut ViewerState) {
    let idle = !state.busy();
    ui.horizontal(|ui| {
        if ui
            .add_enabled(idle, egui::Button::new("Open report…"))
            .clicked()
        {
            open_dialog(state, DialogPurpose::Report, None);
        }
        ui.separator();
        let l = ui.label("Export as");
        ComboBox::from_id_salt("export_format")
            .selected_text(state.export.format.extension())
            .show_ui(ui, |ui| {
                for f in Format::ALL {
                    ui.selectable_value(&mut state.export.format, f, f.extension());
                }
            })
            .response
            .labelled_by(l.id);
        let l = ui.label("to folder");
        ui.add(TextEdit::singleline(&mut state.export.dir).desired_width(200.0))
            .labelled_by(l.id);
        if ui
            .add_enabled(idle, egui::Button::new("Browse export folder…"))
            .clicked()
        {
            let start = PathBuf::from(&state.export.dir);
            open_dialog(state, DialogPurpose::ExportDir, Some(&start));
        }
        let can_export = idle && state.loaded.is_some();
        if ui
            .add_enabled(can_export, egui::Button::new("Export"))
            .clicked()
        {
            state.export();
        }
        if let Some(p) = &state.export.last {
            ui.label(RichText::new(format!("wrote {}", p.display())).weak());
        }
    });
    if let Some(job) = state.job.clone() {
        ui.horizontal(|ui| {
            let text = if job.total > 0 {
                format!("{} ({}/{})", job.message, job.done, job.total)
            } else {
                job.message.clone()
            };
            ui.add(
                ProgressBar::new(job.fraction())
                    .desired_width(360.0)
                    .text(text)
                    .animate(true),
            );
            if job.kind.cancellable()
                && ui
                    .add_enabled(!job.cancelling, egui::Button::new("Cancel"))
                    .clicked()
            {
                state.cancel();
            }
        });
    }
    if let Some(e) = &state.error {
        ui.label(RichText::new(e).color(ERROR_TEXT));
    }
}

/// The control bar at the top of the window.
pub fn show_controls(ui: &mut Ui, state: &mut ViewerState) {
    model_row(ui, state);
    prompts_row(ui, state);
    job_row(ui, state);
}

/// The status bar: the latest message and frame times.
pub fn show_status(ui: &mut Ui, state: &ViewerState) {
    ui.horizontal(|ui| {
        if let Some(b) = state.frames.build() {
            ui.label(
                RichText::new(format!(
                    "UI build {:.1} ms mean, {:.1} ms p95, {:.1} ms max ({} frames)",
                    b.mean_ms, b.p95_ms, b.max_ms, b.frames
                ))
                .weak(),
            );
            ui.separator();
        }
        if let Some(l) = &state.loaded {
            ui.label(RichText::new(format!("report: {}", l.source)).weak());
            ui.separator();
        }
        if let Some(m) = state.log.last() {
            ui.label(m);
        }
    });
}
