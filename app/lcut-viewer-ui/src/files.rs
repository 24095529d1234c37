//! Opening files: a pure-egui file dialog (`egui_file`, no GTK or portal) for
//! model folders, GGUF model files, prompt files, reports and export folders,
//! and reports or models dropped onto the window.

use std::path::{Path, PathBuf};

use egui_file::{FileDialog, State};

pub use crate::dialog::DialogPurpose;
use crate::dialog::FileDialogState;
use crate::state::{PromptChoice, ViewerState};

/// Opens a file dialog for `purpose`, starting in `start` when it exists.
pub fn open_dialog(state: &mut ViewerState, purpose: DialogPurpose, start: Option<&Path>) {
    let dialog = match purpose {
        DialogPurpose::ModelDir | DialogPurpose::ExportDir => FileDialog::select_folder(),
        // Folders (to browse into) and `.gguf` files only.
        DialogPurpose::ModelFile => FileDialog::open_file()
            .title("Open a .gguf model")
            .show_files_filter(Box::new(is_gguf_path))
            .filename_filter(Box::new(|name: &str| is_gguf_path(Path::new(name)))),
        DialogPurpose::PromptFile | DialogPurpose::Report | DialogPurpose::EvalResult => {
            FileDialog::open_file()
        }
    };
    let mut dialog = match start.filter(|p| p.exists()) {
        Some(p) => dialog.initial_path(p),
        None => dialog,
    }
    .id(egui::Id::unique(("lcut_file_dialog", purpose as u8)));
    dialog.open();
    state.dialog = Some(FileDialogState { purpose, dialog });
}

/// Shows the open dialog, if any, and acts on a selection.
pub fn show_dialog(ctx: &egui::Context, state: &mut ViewerState) {
    let Some(d) = state.dialog.as_mut() else {
        return;
    };
    let picked: Option<PathBuf> = match d.dialog.show(ctx).state() {
        State::Selected => d.dialog.path().map(Path::to_path_buf),
        State::Open => return,
        State::Closed | State::Cancelled => None,
    };
    let purpose = d.purpose;
    state.dialog = None;
    if let Some(path) = picked {
        apply_pick(state, purpose, path);
    }
}

/// Acts on a path picked for `purpose`.
pub fn apply_pick(state: &mut ViewerState, purpose: DialogPurpose, path: PathBuf) {
    match purpose {
        DialogPurpose::ModelDir | DialogPurpose::ModelFile => {
            state.open_model(path);
        }
        DialogPurpose::PromptFile => {
            state.inputs.prompts_file = path.display().to_string();
            state.inputs.prompts = PromptChoice::File;
        }
        DialogPurpose::Report => {
            state.open_report(path);
        }
        DialogPurpose::ExportDir => state.export.dir = path.display().to_string(),
        DialogPurpose::EvalResult => open_eval_result(state, path),
    }
}

/// Adds an eval result to the frontier view and shows it; an error is
/// shown instead when the file is no result (or of another suite).
pub fn open_eval_result(state: &mut ViewerState, path: PathBuf) {
    match state.frontier.open(path) {
        Ok(()) => state.view.tab = crate::state::Tab::Frontier,
        Err(e) => state.error = Some(e),
    }
}

/// True for a file that reads as an `lcut eval --json` result or a
/// leaderboard run (a report is neither).
fn is_eval_result(path: &Path) -> bool {
    path.is_file()
        && path.file_name().is_none_or(|n| n != "report.json")
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        && lcut_report::Frontier::read(&[path], lcut_report::FrontierAxis::KvHeld, "all").is_ok()
}

/// True for a path named like a GGUF model file (extension `.gguf`, any
/// case), whether or not it exists. The same rule as
/// `lcut_model::gguf::is_gguf_path`, which this crate does not depend on.
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// True for a folder that looks like a model (has `config.json`).
pub fn is_model_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// True for what the viewer opens as a model: a model folder or a `.gguf`
/// file (a missing or damaged `.gguf` too, so that loading it reports why).
pub fn is_model_path(path: &Path) -> bool {
    is_model_dir(path) || is_gguf_path(path)
}

/// Where a dialog starts, given the path typed for it: the path itself when
/// it is a folder, else the folder holding it (a `.gguf` file's folder).
pub fn dialog_start(typed: &str) -> Option<PathBuf> {
    let p = PathBuf::from(typed.trim());
    if p.is_dir() {
        Some(p)
    } else {
        p.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(Path::to_path_buf)
    }
}

/// Opens what was dropped on the window: a model folder or a `.gguf` file
/// loads the model; `lcut eval` results (one or several) go to the frontier
/// view; anything else is read as a report (a `report.json` or a run
/// folder).
pub fn handle_dropped(ctx: &egui::Context, state: &mut ViewerState) {
    let dropped: Vec<PathBuf> = ctx.input(|i| {
        i.raw
            .dropped_files
            .iter()
            .map(|f| f.path().to_path_buf())
            .collect()
    });
    if !dropped.is_empty() && dropped.iter().all(|p| is_eval_result(p)) {
        for path in dropped {
            open_eval_result(state, path);
        }
        return;
    }
    if let Some(path) = dropped.into_iter().next() {
        if is_model_path(&path) {
            state.open_model(path);
        } else {
            state.open_report(path);
        }
    }
}
