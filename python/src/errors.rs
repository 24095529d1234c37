//! lcut's errors as Python exceptions, and engine calls that cannot take
//! the interpreter down.
//!
//! Every error keeps lcut's own message. Its class says what kind of
//! mistake it is: `lcut.NotFoundError` (a `FileNotFoundError`) for a path
//! that is not there, `lcut.InvalidInputError` (a `ValueError`) for input
//! the caller can correct (a policy string, ids outside the vocabulary, an
//! empty or too long prompt, an index out of range), `lcut.LcutError` (the
//! base of both) for the rest. The classes live in `lcut/_errors.py`.

use std::error::Error as StdError;
use std::panic::{AssertUnwindSafe, catch_unwind};

use lcut_engine::EngineError;
use lcut_model::ModelError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// Which of lcut's exception classes an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file or folder that is not there: `lcut.NotFoundError`.
    NotFound,
    /// Input the caller can correct: `lcut.InvalidInputError`.
    Invalid,
    /// Anything else: `lcut.LcutError`.
    Other,
}

impl ErrorKind {
    fn class_name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "NotFoundError",
            ErrorKind::Invalid => "InvalidInputError",
            ErrorKind::Other => "LcutError",
        }
    }
}

/// A Python exception of `kind` carrying `message`.
pub fn lcut_error(kind: ErrorKind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let class = py
            .import("lcut._errors")
            .and_then(|m| m.getattr(kind.class_name()))
            .and_then(|c| Ok(c.cast_into::<PyType>()?));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            // the package is incomplete: still an exception, never a crash
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
        }
    })
}

/// Whether an io error with `NotFound` is anywhere in `err`'s chain.
fn missing_file(err: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::NotFound
        {
            return true;
        }
        next = e.source();
    }
    false
}

fn model_kind(err: &ModelError) -> ErrorKind {
    match err {
        ModelError::MissingFile { .. } => ErrorKind::NotFound,
        ModelError::TokenOutOfVocab { .. }
        | ModelError::SequenceTooLong { .. }
        | ModelError::EmptyInput
        | ModelError::PolicyDepth { .. }
        | ModelError::Policy(_)
        | ModelError::Phase(_) => ErrorKind::Invalid,
        _ => ErrorKind::Other,
    }
}

/// The exception class an engine error is raised as.
pub fn engine_kind(err: &EngineError) -> ErrorKind {
    if missing_file(err) {
        return ErrorKind::NotFound;
    }
    match err {
        EngineError::Model(m) => model_kind(m),
        EngineError::EmptyPrompt
        | EngineError::PromptTooLong { .. }
        | EngineError::Policy(_)
        | EngineError::Phase(_)
        | EngineError::Shard { .. }
        | EngineError::BadShard { .. }
        | EngineError::OutOfRange { .. } => ErrorKind::Invalid,
        _ => ErrorKind::Other,
    }
}

/// An engine error as a Python exception.
pub fn engine_err(err: EngineError) -> PyErr {
    lcut_error(engine_kind(&err), err.to_string())
}

/// A trace or report error as a Python exception.
pub fn trace_err(err: lcut_trace::TraceError) -> PyErr {
    let kind = if missing_file(&err) {
        ErrorKind::NotFound
    } else {
        ErrorKind::Other
    };
    lcut_error(kind, err.to_string())
}

/// A policy that does not parse or resolve, as `InvalidInputError`.
pub fn policy_err(err: lcut_policy::PolicyError) -> PyErr {
    lcut_error(ErrorKind::Invalid, err.to_string())
}

/// A tensor backend error outside the engine's own calls, as `LcutError`.
pub fn candle_err(err: candle_core::Error) -> PyErr {
    lcut_error(ErrorKind::Other, err.to_string())
}

/// Invalid input named by the bindings themselves.
pub fn invalid(message: impl Into<String>) -> PyErr {
    lcut_error(ErrorKind::Invalid, message)
}

/// Run `f` with the GIL released. A panic inside becomes an `LcutError`
/// naming it as a bug, instead of unwinding into the interpreter.
pub fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> PyResult<T> + Send) -> PyResult<T> {
    py.detach(|| match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(lcut_error(
                ErrorKind::Other,
                format!("internal error in lcut (a bug; please report it): {what}"),
            ))
        }
    })
}

/// A model name that does not resolve on disk: `NotFoundError` when nothing
/// is there by that name, `InvalidInputError` when what is there is not a
/// model lcut reads.
pub fn store_err(err: lcut_model::store::StoreError) -> PyErr {
    use lcut_model::store::StoreError as E;
    let kind = match &err {
        E::NotFound { .. } | E::DanglingRef { .. } | E::UnknownRevision { .. } => {
            ErrorKind::NotFound
        }
        _ if missing_file(&err) => ErrorKind::NotFound,
        _ => ErrorKind::Invalid,
    };
    lcut_error(kind, err.to_string())
}
