//! The files a random model is written as, one module per format; every
//! file is written to a temporary name and renamed, so a reader never sees
//! a half-written one.

use std::path::Path;

use lcut_model::{ModelError, Result};

pub mod hf_folder;

/// Write `bytes` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    lcut_model::lora::write_atomic(path, bytes).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Rename `from` to `to`, the error naming `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| ModelError::Io {
        path: to.to_path_buf(),
        source,
    })
}
