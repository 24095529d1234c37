//! Progress and Ctrl-C for long engine calls.
//!
//! A long call runs with the GIL released; the engine calls back after
//! every prefill chunk, decode step or prompt. The callback takes the GIL
//! for a moment: it moves a tqdm bar (when tqdm is installed and progress
//! is on) and lets Python run its signal handlers. A KeyboardInterrupt (or
//! any exception a handler raises) is kept and the callback answers false,
//! which is the engine's own way to stop; the call then raises it.

use pyo3::prelude::*;

/// A tqdm bar (or none) and the exception that stopped the run, if any.
pub struct Progress {
    bar: Option<Py<PyAny>>,
    position: usize,
    interrupted: Option<PyErr>,
}

impl Progress {
    /// A bar of `total` `unit`s described by `desc` when `show` is set and
    /// tqdm can be imported; otherwise only the Ctrl-C check.
    pub fn new(py: Python<'_>, show: bool, total: usize, desc: &str, unit: &str) -> Self {
        let bar = show
            .then(|| -> PyResult<Py<PyAny>> {
                let tqdm = py.import("tqdm.auto")?.getattr("tqdm")?;
                let kwargs = pyo3::types::PyDict::new(py);
                kwargs.set_item("total", total)?;
                kwargs.set_item("desc", desc)?;
                kwargs.set_item("unit", unit)?;
                kwargs.set_item("leave", false)?;
                Ok(tqdm.call((), Some(&kwargs))?.unbind())
            })
            .and_then(Result::ok);
        Self {
            bar,
            position: 0,
            interrupted: None,
        }
    }

    /// Called from an engine callback, without the GIL: move the bar to
    /// `position`, show `note`, and check for Ctrl-C. Returns false once
    /// the run must stop.
    pub fn tick(&mut self, position: usize, note: Option<&str>) -> bool {
        if self.interrupted.is_some() {
            return false;
        }
        Python::attach(|py| {
            if let Err(e) = py.check_signals() {
                self.interrupted = Some(e);
                return false;
            }
            if let Some(bar) = &self.bar {
                let bar = bar.bind(py);
                // a failing bar is only a missing display, never a failed run
                if position > self.position {
                    let _ = bar.call_method1("update", (position - self.position,));
                    self.position = position;
                }
                if let Some(note) = note {
                    let _ = bar.call_method1("set_postfix_str", (note,));
                }
            }
            true
        })
    }

    /// Close the bar; the result of the run, or the exception that stopped it.
    pub fn finish<T>(self, py: Python<'_>, result: PyResult<T>) -> PyResult<T> {
        if let Some(bar) = &self.bar {
            let _ = bar.bind(py).call_method0("close");
        }
        match self.interrupted {
            Some(e) => Err(e),
            None => result,
        }
    }
}
