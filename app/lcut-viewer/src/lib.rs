//! The lcut desktop viewer: an eframe window over `lcut-viewer-ui`, with a
//! worker thread that owns the engine (model, diagnostics, live generation).

// Tests unwrap freely; the library itself is still linted (clippy builds both).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod app;
pub mod live_run;
pub mod paths;
pub mod worker;
