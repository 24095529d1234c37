//! Models by name, offline: a folder or file path, a Hugging Face hub cache
//! name (`ORG/NAME[@REV][:FILE]`) or an Ollama name (`NAME[:TAG]`) resolved
//! to a file or folder on disk and the format it is in. Nothing is ever
//! downloaded; a name not on disk is an error naming every place looked in.

mod error;
mod hub;
mod list;
mod ollama;
mod reference;
mod resolve;
mod roots;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use error::{MODEL_LAYER, StoreError, StoreResult};
pub use list::{ListedModel, Listing, StoreKind, list_models};
pub use reference::{HubRef, OLLAMA_HOST, OLLAMA_NAMESPACE, OLLAMA_TAG, OllamaRef};
pub use resolve::resolve;
pub use roots::{HUB_VARS, StoreRoot, StoreRoots};

use error::io;

/// How a model is stored, decided once when it is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    /// A Hugging Face model folder: `config.json` and safetensors weights.
    #[serde(rename = "safetensors")]
    Folder,
    /// A GGUF file (whatever its name ends in: Ollama's blobs have no extension).
    Gguf,
}

impl std::fmt::Display for ModelFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Folder => "safetensors",
            Self::Gguf => "gguf",
        })
    }
}

impl ModelFormat {
    /// The format of an existing path: a folder is a model folder; a file
    /// is GGUF when it starts with the GGUF magic or its name ends in
    /// `.gguf` (the loader then names a wrong magic); any other file is
    /// [`StoreError::NotAModel`].
    pub fn detect(path: &Path) -> StoreResult<Self> {
        let meta = std::fs::metadata(path).map_err(io(path))?;
        if meta.is_dir() {
            return Ok(Self::Folder);
        }
        let mut magic = [0u8; 4];
        let mut file = std::fs::File::open(path).map_err(io(path))?;
        let read = file.read(&mut magic).map_err(io(path))?;
        if (read == 4 && &magic == b"GGUF") || crate::gguf::is_gguf_path(path) {
            return Ok(Self::Gguf);
        }
        Err(StoreError::NotAModel {
            path: path.to_path_buf(),
            reason: format!(
                "a model is a Hugging Face folder (config.json and safetensors) or a GGUF file, \
                 and this file starts with {:?}, not \"GGUF\"",
                String::from_utf8_lossy(&magic[..read])
            ),
        })
    }
}

/// Where a resolved model was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "store", rename_all = "lowercase")]
pub enum ModelSource {
    /// A path given as such.
    Path,
    /// The Hugging Face hub cache.
    Hub {
        /// `ORG/NAME`.
        repo: String,
        /// The revision asked for (`main` when none was).
        revision: String,
        /// The commit of the snapshot used.
        commit: String,
        /// The GGUF file used, relative to the snapshot (`None` for a model folder).
        file: Option<String>,
    },
    /// Ollama's model store.
    Ollama {
        /// `NAME:TAG` as `ollama list` writes it.
        name: String,
        /// The manifest that named the blob.
        manifest: PathBuf,
    },
}

/// A model reference resolved to what is on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedModel {
    /// The model folder or GGUF file to load.
    pub path: PathBuf,
    /// Its format, so that loaders never guess from the file name.
    pub format: ModelFormat,
    /// Where it was found.
    pub source: ModelSource,
}

impl ResolvedModel {
    /// An existing path as a model, its format detected ([`ModelFormat::detect`]).
    pub fn from_path(path: &Path) -> StoreResult<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            format: ModelFormat::detect(path)?,
            source: ModelSource::Path,
        })
    }

    /// The model as a user names it: the path, `ORG/NAME@REV[:FILE]` or `NAME:TAG`.
    pub fn name(&self) -> String {
        match &self.source {
            ModelSource::Path => self.path.display().to_string(),
            ModelSource::Hub {
                repo,
                revision,
                file,
                ..
            } => {
                let mut s = repo.clone();
                if revision != "main" {
                    s = format!("{s}@{revision}");
                }
                if let Some(f) = file {
                    s = format!("{s}:{f}");
                }
                s
            }
            ModelSource::Ollama { name, .. } => name.clone(),
        }
    }
}

impl std::fmt::Display for ResolvedModel {
    /// The name, and for a store name the path it resolved to.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            ModelSource::Path => write!(f, "{}", self.path.display()),
            ModelSource::Hub { commit, .. } => write!(
                f,
                "{} (hub cache, commit {}: {})",
                self.name(),
                short(commit),
                self.path.display()
            ),
            ModelSource::Ollama { .. } => {
                write!(f, "{} (Ollama: {})", self.name(), self.path.display())
            }
        }
    }
}

/// The first 12 characters of a commit hash.
fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
