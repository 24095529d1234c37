//! From a model reference to a model on disk: an existing path first, then
//! the hub cache, then Ollama's store.

use std::ffi::OsStr;
use std::path::Path;

use super::error::{StoreError, StoreResult};
use super::reference::{HubRef, OllamaRef};
use super::roots::{HUB_VARS, StoreRoot, StoreRoots};
use super::{ResolvedModel, hub, ollama};

/// Resolve a model reference, offline: an existing path (folder or file)
/// always wins; then `[ORG/]NAME[@REV][:FILE]` in the hub cache; then
/// `[[HOST/]NAMESPACE/]NAME[:TAG]` in Ollama's store. The first store that
/// holds the repository or manifest decides: a damaged entry there is its
/// own error, never a fall-through. When nothing matches, the error names
/// every place looked in and how its root was found.
pub fn resolve(reference: impl AsRef<OsStr>, roots: &StoreRoots) -> StoreResult<ResolvedModel> {
    let reference = reference.as_ref();
    let path = Path::new(reference);
    if path.exists() {
        return ResolvedModel::from_path(path);
    }
    let has_file_part = reference.to_str().is_some_and(|t| t.contains(':'));
    if crate::gguf::is_gguf_path(path) && !has_file_part {
        // a name ending in .gguf is a file, unless it is a hub name's `:FILE`
        let looked = vec![format!("path {}: no such GGUF file", path.display())];
        return Err(not_found(path, looked));
    }
    let mut looked = vec![format!("path {}: no such file or folder", path.display())];
    let Some(text) = reference.to_str() else {
        return Err(not_found(path, looked));
    };
    let hub_ref = HubRef::parse(text);
    if let Some(r) = &hub_ref {
        match &roots.hub {
            Some(root) => match hub::find(&root.path, r)? {
                Some(model) => return Ok(model),
                None => looked.push(format!(
                    "Hugging Face hub cache {}: {}",
                    place(root),
                    missing(root, &r.folder_name())
                )),
            },
            None => looked.push(format!(
                "Hugging Face hub cache: not looked in, none of {HUB_VARS}, HOME is set"
            )),
        }
    }
    let ollama_ref = OllamaRef::parse(text);
    if let Some(r) = &ollama_ref {
        match &roots.ollama {
            Some(root) => match ollama::find(&root.path, r)? {
                Some(model) => return Ok(model),
                None => looked.push(format!(
                    "Ollama store {}: {}",
                    place(root),
                    missing_manifest(root, r)
                )),
            },
            None => looked
                .push("Ollama store: not looked in, neither OLLAMA_MODELS nor HOME is set".into()),
        }
    }
    if hub_ref.is_none() && ollama_ref.is_none() {
        looked.push(format!(
            "`{text}` is no store name: neither ORG/NAME[@REV][:FILE] (hub cache) \
             nor [NAMESPACE/]NAME[:TAG] (Ollama)"
        ));
    }
    Err(not_found(path, looked))
}

fn not_found(path: &Path, looked: Vec<String>) -> StoreError {
    StoreError::NotFound {
        reference: path.display().to_string(),
        looked,
    }
}

/// `PATH (from $VAR)`.
fn place(root: &StoreRoot) -> String {
    format!("{} ({})", root.path.display(), root.origin)
}

/// `what` is missing under a root, or the root itself is.
fn missing(root: &StoreRoot, what: &str) -> String {
    if root.path.is_dir() {
        format!("no {what}")
    } else {
        format!("no {what} (the folder itself does not exist)")
    }
}

fn missing_manifest(root: &StoreRoot, r: &OllamaRef) -> String {
    let manifest = Path::new("manifests").join(r.manifest_path());
    let tags = ollama::tags(&root.path, r);
    let base = missing(root, &manifest.display().to_string());
    if tags.is_empty() {
        base
    } else {
        format!("{base} (tags of {} there: {})", r.name, tags.join(", "))
    }
}
