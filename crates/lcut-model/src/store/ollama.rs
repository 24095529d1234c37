//! Ollama's model store: `manifests/HOST/NAMESPACE/NAME/TAG` is a JSON
//! manifest whose model layer names `sha256:HEX`; the GGUF file is
//! `blobs/sha256-HEX` (without an extension).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::{MODEL_LAYER, StoreError, StoreResult, io};
use super::reference::OllamaRef;
use super::{ModelFormat, ModelSource, ResolvedModel};

/// The model `r` names in the store at `root`; `None` when there is no
/// manifest for it.
pub(crate) fn find(root: &Path, r: &OllamaRef) -> StoreResult<Option<ResolvedModel>> {
    let manifest = root.join("manifests").join(r.manifest_path());
    if !manifest.is_file() {
        return Ok(None);
    }
    let blob = model_blob(root, &manifest)?;
    Ok(Some(ResolvedModel {
        path: blob,
        format: ModelFormat::Gguf,
        source: ModelSource::Ollama {
            name: r.display_name(),
            manifest,
        },
    }))
}

/// The blob holding the model layer of `manifest`, checked to exist.
pub(crate) fn model_blob(root: &Path, manifest: &Path) -> StoreResult<PathBuf> {
    let bad = |reason: String| StoreError::BadManifest {
        path: manifest.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(manifest).map_err(io(manifest))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let layers = value
        .get("layers")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("it has no `layers` list".into()))?;
    let media_type = |l: &Value| {
        l.get("mediaType")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let Some(layer) = layers
        .iter()
        .find(|l| media_type(l).as_deref() == Some(MODEL_LAYER))
    else {
        return Err(StoreError::NoModelLayer {
            path: manifest.to_path_buf(),
            media_types: layers
                .iter()
                .map(|l| media_type(l).unwrap_or_else(|| "(none)".into()))
                .collect(),
        });
    };
    let digest = layer
        .get("digest")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("its model layer has no `digest`".into()))?;
    let blob_name = blob_file_name(digest).ok_or_else(|| {
        bad(format!(
            "its model layer's digest {digest:?} is not `sha256:` and 64 hex digits"
        ))
    })?;
    let blob = root.join("blobs").join(blob_name);
    if !blob.is_file() {
        return Err(StoreError::MissingBlob {
            manifest: manifest.to_path_buf(),
            blob,
        });
    }
    Ok(blob)
}

/// `sha256:HEX` -> `sha256-HEX`, for a well-formed digest only (it becomes
/// a file name).
fn blob_file_name(digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| format!("sha256-{hex}"))
}

/// Every manifest in the store at `root` as (reference, manifest path), sorted.
pub(crate) fn manifests(root: &Path) -> StoreResult<Vec<(OllamaRef, PathBuf)>> {
    let base = root.join("manifests");
    let mut out = vec![];
    for host in subfolders(&base)? {
        for ns in subfolders(&base.join(&host))? {
            for name in subfolders(&base.join(&host).join(&ns))? {
                let dir = base.join(&host).join(&ns).join(&name);
                for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
                    let entry = entry.map_err(io(&dir))?;
                    if !entry.path().is_file() {
                        continue;
                    }
                    let r = OllamaRef {
                        host: host.clone(),
                        namespace: ns.clone(),
                        name: name.clone(),
                        tag: entry.file_name().to_string_lossy().into_owned(),
                    };
                    out.push((r, entry.path()));
                }
            }
        }
    }
    out.sort_by_key(|(r, _)| r.display_name());
    Ok(out)
}

/// The tags the store holds for `r`'s model (for a message when the tag
/// asked for is not there).
pub(crate) fn tags(root: &Path, r: &OllamaRef) -> Vec<String> {
    let dir = root
        .join("manifests")
        .join(&r.host)
        .join(&r.namespace)
        .join(&r.name);
    let mut tags: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    tags.sort();
    tags
}

fn subfolders(dir: &Path) -> StoreResult<Vec<String>> {
    if !dir.is_dir() {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        if entry.path().is_dir() {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}
