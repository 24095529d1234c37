//! `lcut._lcut`: the extension module of the Python package `lcut`.
//!
//! Everything runs through lcut's own crates (lcut-engine sessions,
//! generation, lockstep, diagnose, sweep and suite eval; lcut-model's
//! forward passes; lcut-trace's reports): the package is a thin layer that
//! checks Python arguments, releases the GIL around the engine, turns its
//! results into numpy arrays and its errors into Python exceptions. The
//! Python package around it (`python/lcut`) re-exports these classes,
//! defines the exception classes and holds the type stubs.

mod arrays;
mod config;
mod diagnose;
mod errors;
mod eval;
mod forward;
mod generate;
mod inputs;
mod load;
mod progress;
mod report;
mod routing;
mod session;
mod table;
mod trace;

use pyo3::prelude::*;

/// The Rust extension of the ``lcut`` package (import ``lcut``, not this).
#[pymodule]
fn _lcut(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(session::load, m)?)?;
    m.add_class::<session::Session>()?;
    m.add_class::<config::ModelConfig>()?;
    m.add_class::<forward::Forward>()?;
    m.add_class::<trace::Trace>()?;
    m.add_class::<routing::Routing>()?;
    m.add_class::<generate::Generation>()?;
    m.add_class::<report::Report>()?;
    m.add("LAYER_METRICS", table::metric_names())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // the prefill's MiB-sized buffers stay in the heap, as the `lcut` binary
    // keeps them (LCUT_KEEP_FREED_BUFFERS=0 before the import leaves the
    // allocator as it was); whether it took, for the curious
    m.add(
        "KEEPS_FREED_BUFFERS",
        lcut_engine::heap::keep_freed_buffers(),
    )?;
    Ok(())
}
