//! The UI of the lcut desktop viewer, as plain state structs and functions
//! that draw them with egui and egui_plot. No candle: the engine lives behind
//! the [`backend`] seam (commands out, events in), served by the
//! `lcut-viewer` binary's worker thread or, with the `demo` feature, by
//! `fake` in tests (the feature also brings `large`, the large synthetic trace).
//!
//! Entry point: [`show_viewer`] over a [`ViewerState`], once per frame.
//!
//! - [`heatmap_view`]: layer × decode step, layer × prompt position (binned to
//!   the screen, tokens on hover), layer × head, BoS apart; linear or log scale.
//! - [`curves`]: per-layer masses, entropy, curvature, the cut lines (drag).
//! - [`recommend_panel`], [`cost_panel`], [`sweep_panel`], [`live`].
//! - [`heads_view`] over [`head_picks`] and [`head_data`]: pick the
//!   (layer, K/V head) pairs kept above the cut, their K/V share and mass,
//!   a budget's plan, and `speed:C+bos+heads:FILE` run beside full.
//! - [`frontier_view`]: accuracy against K/V held (or the compression
//!   ratio), one line per family, from `lcut eval` results.
//! - [`slim_data`], [`slim_views`]: a live SlimInfer run: positions that
//!   exist per layer, score bars per cut, active sets and overlap per step.
//! - [`routing_view`]: a mixture-of-experts model's routing: layer × expert
//!   load, router entropy and a policy's overlap with the full model per
//!   layer and per sweep cut (offered only for a model that routes).

// Tests unwrap freely; the library itself is still linted (clippy builds both).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod backend;
pub mod colormap;
pub mod controls;
pub mod cost_panel;
pub mod curves;
pub mod dialog;
pub mod failure;
#[cfg(feature = "demo")]
pub mod fake;
pub mod files;
pub mod frames;
pub mod frontier_view;
pub mod grid;
pub mod head_data;
pub mod head_picks;
pub mod heads_view;
pub mod heatmap;
pub mod heatmap_view;
pub mod jobs;
#[cfg(feature = "demo")]
pub mod large;
pub mod live;
pub mod live_state;
pub mod loaded;
pub mod recommend_panel;
pub mod routing_view;
pub mod settings;
pub mod slim_data;
pub mod slim_views;
pub mod state;
pub mod sweep_panel;
#[cfg(feature = "testing")]
pub mod testing;
pub mod theme;
pub mod viewer;

pub use backend::{Backend, Command, Event, WorkerPort, channel};
pub use failure::{FailureKind, JobError};
pub use state::{Tab, ViewerState};
pub use viewer::show_viewer;
