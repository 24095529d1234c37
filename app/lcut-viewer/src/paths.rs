//! Where the bundled model and prompts are (see `lcut_engine::bundled`).

pub use lcut_engine::{BUNDLED_MODEL, bundled as resolve, workspace_root};
