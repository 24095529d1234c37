//! Where the bundled model and prompts are: relative to the working folder
//! when run from the workspace, else relative to the workspace this binary was
//! built in.

use std::path::{Path, PathBuf};

/// The bundled model, relative to the workspace root.
pub const BUNDLED_MODEL: &str = "fixtures/models/copy-full";

/// The workspace root this crate was built in.
pub fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::canonicalize(&root).unwrap_or(root)
}

/// `rel` under the working folder if it exists there, else under the
/// workspace root (which may not exist either; the caller reports that).
pub fn resolve(rel: &str) -> PathBuf {
    let here = PathBuf::from(rel);
    if here.exists() {
        return here;
    }
    workspace_root().join(rel)
}
