//! Where the files lcut ships (bundled model, prompt set) are found.

use std::path::{Path, PathBuf};

/// The bundled full-depth model, relative to the repository root.
pub const BUNDLED_MODEL: &str = "fixtures/models/copy-full";

/// The repository root these sources were built from.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `relative` under the working folder when it exists there (so a run from
/// a clone's root shows short paths), else under the repository root this
/// binary was built from.
pub fn bundled(relative: &str) -> PathBuf {
    let here = PathBuf::from(relative);
    if here.exists() {
        return here;
    }
    workspace_root().join(relative)
}
