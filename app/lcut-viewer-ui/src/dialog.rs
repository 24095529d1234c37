//! The state of the open file dialog: what it is for and the dialog itself.
//! Opened, drawn and answered by [`crate::files`].

use egui_file::FileDialog;

/// What the open dialog is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialogPurpose {
    /// Pick a model folder (Hugging Face layout, with `config.json`).
    ModelDir,
    /// Pick a GGUF model file (`.gguf`).
    ModelFile,
    /// Pick a JSONL prompt file.
    PromptFile,
    /// Pick a report (`report.json`).
    Report,
    /// Pick the export folder.
    ExportDir,
    /// Pick an `lcut eval --json` result (or a leaderboard.json) for the
    /// frontier view.
    EvalResult,
}

/// An open file dialog and what its answer is for.
pub struct FileDialogState {
    /// The purpose.
    pub purpose: DialogPurpose,
    /// The dialog (drawn and answered by [`crate::files`]).
    pub(crate) dialog: FileDialog,
}
