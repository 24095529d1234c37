//! A model's files, their kind decided once: a Hugging Face folder (config
//! and safetensors) or a GGUF file (header, metadata and tensors in one).
//! The decoder, the tokenizer and the model's identity are all read from the
//! same opened files.

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, is_gguf_path};
use crate::store::ModelFormat;
use crate::weights::WeightFiles;

/// A Hugging Face model folder: its parsed config and opened weight files.
pub struct FolderFiles {
    /// The folder.
    pub path: PathBuf,
    /// `config.json`, parsed.
    pub config: ModelConfig,
    /// The safetensors files (one, or the shards of an index).
    pub weights: WeightFiles,
}

/// A model's files, opened.
pub enum ModelFiles {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A Hugging Face folder.
    Folder(FolderFiles),
}

impl ModelFiles {
    /// Open `path`: a file whose name ends in `.gguf` is a GGUF file, a
    /// folder is a Hugging Face folder, any other file is an error.
    pub fn open(path: &Path) -> Result<Self> {
        if is_gguf_path(path) {
            return Self::open_gguf(path);
        }
        if path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "a model is a Hugging Face folder (config.json, model.safetensors) or a \
                       file ending in .gguf"
                    .into(),
            });
        }
        Self::open_folder(path)
    }

    /// Open `path` in a format already known (a resolved model reference:
    /// a store may keep a GGUF file under a content hash).
    pub fn open_format(path: &Path, format: ModelFormat) -> Result<Self> {
        match format {
            ModelFormat::Gguf => Self::open_gguf(path),
            ModelFormat::Folder => Self::open_folder(path),
        }
    }

    /// Open `path` as a GGUF file, whatever its name (a store may keep GGUF
    /// files under content hashes).
    pub fn open_gguf(path: &Path) -> Result<Self> {
        Ok(Self::Gguf(GgufFile::open(path)?))
    }

    /// Open `path` as a Hugging Face model folder.
    pub fn open_folder(path: &Path) -> Result<Self> {
        Ok(Self::Folder(FolderFiles {
            path: path.to_path_buf(),
            config: ModelConfig::from_folder(path)?,
            weights: WeightFiles::open(path)?,
        }))
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Self::Gguf(file) => file.config(),
            Self::Folder(folder) => &folder.config,
        }
    }
}
