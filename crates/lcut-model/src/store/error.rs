//! Errors of finding a model by name: each names the place at fault.

use std::path::PathBuf;

/// Why a model reference did not resolve to a model on disk.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Nothing on disk answers to the reference.
    #[error(
        "model `{reference}` is not on disk (lcut never downloads); looked in:\n{}",
        bullets(looked)
    )]
    NotFound {
        /// The reference as given.
        reference: String,
        /// Each place looked in, with what was missing there.
        looked: Vec<String>,
    },
    /// A path that exists but is neither a model folder nor a GGUF file.
    #[error("{path} is not a model: {reason}")]
    NotAModel {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        reason: String,
    },
    /// A branch file in a hub cache repository names a commit that has no
    /// snapshot.
    #[error(
        "{ref_file} names commit {commit}, but {snapshot} is missing \
         (an interrupted or removed download of {repo}; fetch it again)"
    )]
    DanglingRef {
        /// `ORG/NAME`.
        repo: String,
        /// The `refs/BRANCH` file.
        ref_file: PathBuf,
        /// The commit it names.
        commit: String,
        /// The snapshot folder that should hold it.
        snapshot: PathBuf,
    },
    /// A branch file in a hub cache repository that holds no commit hash.
    #[error("{ref_file} should hold a commit hash, but holds {found:?}")]
    BadRef {
        /// The `refs/BRANCH` file.
        ref_file: PathBuf,
        /// What it holds.
        found: String,
    },
    /// A revision that is neither a branch nor a commit of the repository.
    #[error("{repo_dir} has no revision `{revision}`: {available}")]
    UnknownRevision {
        /// The repository folder in the cache.
        repo_dir: PathBuf,
        /// The revision asked for (`main` when none was).
        revision: String,
        /// The branches and snapshots there are, in words.
        available: String,
    },
    /// A commit prefix that several snapshots start with.
    #[error(
        "{repo_dir}: revision `{prefix}` matches several snapshots ({}); give more of the commit",
        matches.join(", ")
    )]
    AmbiguousRevision {
        /// The repository folder in the cache.
        repo_dir: PathBuf,
        /// The prefix given.
        prefix: String,
        /// The commits it matches.
        matches: Vec<String>,
    },
    /// A hub cache repository without any snapshot.
    #[error(
        "{repo_dir} holds no snapshot ({snapshots} is missing or empty): \
         an interrupted download of {repo}; fetch it again"
    )]
    NoSnapshot {
        /// `ORG/NAME`.
        repo: String,
        /// The repository folder in the cache.
        repo_dir: PathBuf,
        /// Its `snapshots` folder.
        snapshots: PathBuf,
    },
    /// A snapshot that holds neither a model folder's config nor a GGUF file.
    #[error("{snapshot} holds neither config.json nor a .gguf file")]
    EmptySnapshot {
        /// The snapshot folder.
        snapshot: PathBuf,
    },
    /// A file of a snapshot is a link to a blob that is missing.
    #[error("{link} links to {target}, which is missing (an incomplete download)")]
    DanglingLink {
        /// The link.
        link: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// Several GGUF files and no choice among them.
    #[error(
        "{snapshot} holds several GGUF files; name one as `{reference}:FILE`: {}",
        files.join(", ")
    )]
    SeveralGguf {
        /// The snapshot folder.
        snapshot: PathBuf,
        /// The reference without a file, to write the choice after.
        reference: String,
        /// The GGUF files (relative to the snapshot).
        files: Vec<String>,
    },
    /// A GGUF file asked for by name that the snapshot does not hold.
    #[error(
        "{snapshot} has no GGUF file `{file}` (it has: {})",
        or_none(available)
    )]
    NoSuchGguf {
        /// The snapshot folder.
        snapshot: PathBuf,
        /// The file (or quantization tag) asked for.
        file: String,
        /// The GGUF files there are.
        available: Vec<String>,
    },
    /// An Ollama manifest that is not JSON of the expected shape.
    #[error("{path} is not a valid Ollama manifest: {reason}")]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An Ollama manifest without a layer holding model weights.
    #[error(
        "{path} has no model layer (mediaType {MODEL_LAYER}); its layers: {}",
        or_none(media_types)
    )]
    NoModelLayer {
        /// The manifest file.
        path: PathBuf,
        /// The media types of the layers it has.
        media_types: Vec<String>,
    },
    /// An Ollama manifest naming a blob that is not in the store.
    #[error(
        "{manifest} names the model blob {blob}, which is missing \
         (an interrupted `ollama pull`; pull it again)"
    )]
    MissingBlob {
        /// The manifest file.
        manifest: PathBuf,
        /// The blob it names.
        blob: PathBuf,
    },
    /// A file or folder of a store could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The media type of an Ollama manifest's model layer (a GGUF blob).
pub const MODEL_LAYER: &str = "application/vnd.ollama.image.model";

fn bullets(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| format!("  - {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// Result alias for the store module.
pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// An [`StoreError::Io`] for `path`.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.into();
    move |source| StoreError::Io { path, source }
}
