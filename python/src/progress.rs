//! Progress and Ctrl-C for long engine calls.
//!
//! A long call runs with the GIL released; the engine calls back after
//! every prefill chunk, decode step or prompt. The callback takes the GIL
//! for a moment: it moves a tqdm bar (when tqdm is installed and progress
//! is on) and lets Python run its signal handlers. A KeyboardInterrupt (or
//! any exception a handler raises) is kept and the callback answers false,
//! which is the engine's own way to stop; the call then raises it.

use pyo3::prelude::*;

/// Whether an exception raised inside a callback is one that stops the
/// run (KeyboardInterrupt, SystemExit: a `BaseException` that is not an
/// `Exception`) rather than a fault of the bar.
fn stops_the_run(py: Python<'_>, e: &PyErr) -> bool {
    !e.is_instance_of::<pyo3::exceptions::PyException>(py)
}

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
        let made = show.then(|| -> PyResult<Py<PyAny>> {
            let tqdm = py.import("tqdm.auto")?.getattr("tqdm")?;
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("total", total)?;
            kwargs.set_item("desc", desc)?;
            kwargs.set_item("unit", unit)?;
            kwargs.set_item("leave", false)?;
            Ok(tqdm.call((), Some(&kwargs))?.unbind())
        });
        // no tqdm is no bar; a Ctrl-C while tqdm starts stops the run
        let (bar, interrupted) = match made {
            Some(Ok(bar)) => (Some(bar), None),
            Some(Err(e)) if stops_the_run(py, &e) => (None, Some(e)),
            _ => (None, None),
        };
        Self {
            bar,
            position: 0,
            interrupted,
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
                let mut calls = Vec::with_capacity(2);
                if position > self.position {
                    calls.push(bar.call_method1("update", (position - self.position,)));
                    self.position = position;
                }
                if let Some(note) = note {
                    calls.push(bar.call_method1("set_postfix_str", (note,)));
                }
                // a failing bar is only a missing display, never a failed
                // run; but a Ctrl-C that arrives while the bar's Python code
                // runs is raised there, and must stop the run like one seen
                // by `check_signals`
                for call in calls {
                    if let Err(e) = call
                        && stops_the_run(py, &e)
                    {
                        self.interrupted = Some(e);
                        return false;
                    }
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
