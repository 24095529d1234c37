//! Typed failures the worker reports to the UI: the kind of work that failed
//! and the message the UI shows for it.

use std::fmt;

/// What kind of work failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The job needs an open model and none is open.
    NoModel,
    /// Loading a model folder or `.gguf` file.
    LoadModel,
    /// Reading a saved report.
    ReadReport,
    /// Reading or checking the prompts of a run.
    Prompts,
    /// A diagnostic run or its sweep.
    Diagnose,
    /// Resolving a live generation's policies against the model.
    Policy,
    /// A live generation.
    Generate,
    /// Writing an export.
    Export,
}

/// A failed job: its kind and its message (what the UI shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// What kind of work failed.
    pub kind: FailureKind,
    /// What went wrong, in words.
    pub message: String,
}

impl JobError {
    /// A failure of `kind` saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The job needs a model and none is open.
    pub fn no_model() -> Self {
        Self::new(FailureKind::NoModel, "open a model first")
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JobError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_its_message_and_keeps_its_kind() {
        let e = JobError::new(FailureKind::Export, "exporting html to /x: denied");
        assert_eq!(e.to_string(), "exporting html to /x: denied");
        assert_eq!(e.kind, FailureKind::Export);
        let none = JobError::no_model();
        assert_eq!(
            (none.kind, none.to_string().as_str()),
            (FailureKind::NoModel, "open a model first")
        );
    }
}
