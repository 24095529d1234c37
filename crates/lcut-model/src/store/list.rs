//! What the hub cache and Ollama's store hold, named as a user would type
//! it, with each model's format, size, architecture and depth read from its
//! `config.json` or GGUF header (never the weights).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::error::StoreError;
use super::hub::{self, Picked};
use super::roots::{StoreRoot, StoreRoots};
use super::{ModelFormat, StoreResult, ollama};
use crate::config::Arch;

/// Which store a listed model is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The Hugging Face hub cache.
    Hub,
    /// Ollama's model store.
    Ollama,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Hub => "hub",
            Self::Ollama => "ollama",
        })
    }
}

/// One model found in a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedModel {
    /// The name to give `--model`.
    pub name: String,
    /// The store it is in.
    pub store: StoreKind,
    /// Its format; `None` when the entry is damaged (see `problem`).
    pub format: Option<ModelFormat>,
    /// The folder or file that would be loaded (the store entry when damaged).
    pub path: PathBuf,
    /// Bytes on disk: the GGUF file, or every file of the model folder.
    pub size_bytes: u64,
    /// `model_type` of `config.json` or `general.architecture` of the GGUF.
    pub architecture: Option<String>,
    /// Whether lcut implements the architecture.
    pub supported: bool,
    /// Decoder layers.
    pub layers: Option<usize>,
    /// Why the entry cannot be loaded or described, when it cannot.
    pub problem: Option<String>,
}

/// Everything found, and the places looked in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// Each store's folder and how it was found.
    pub places: Vec<String>,
    /// Places skipped (absent folders, unset variables).
    pub notes: Vec<String>,
    /// The models, hub cache first, each store's sorted by name.
    pub models: Vec<ListedModel>,
}

/// List the models in both stores. A store whose folder does not exist is
/// skipped with a note; a damaged entry is listed with its problem.
pub fn list_models(roots: &StoreRoots) -> Listing {
    let mut listing = Listing {
        places: vec![],
        notes: vec![],
        models: vec![],
    };
    let stores: [(&str, &Option<StoreRoot>, StoreKind); 2] = [
        ("Hugging Face hub cache", &roots.hub, StoreKind::Hub),
        ("Ollama store", &roots.ollama, StoreKind::Ollama),
    ];
    for (label, root, kind) in stores {
        let Some(root) = root else {
            listing.notes.push(format!(
                "{label}: skipped, no variable or home folder names it"
            ));
            continue;
        };
        let place = format!("{label} {} ({})", root.path.display(), root.origin);
        if !root.path.is_dir() {
            listing
                .notes
                .push(format!("{place}: does not exist, skipped"));
            continue;
        }
        listing.places.push(place);
        let found = match kind {
            StoreKind::Hub => list_hub(&root.path),
            StoreKind::Ollama => list_ollama(&root.path),
        };
        match found {
            Ok(models) => listing.models.extend(models),
            Err(e) => listing.notes.push(format!("{label}: {e}")),
        }
    }
    listing
}

fn list_hub(root: &Path) -> StoreResult<Vec<ListedModel>> {
    let mut out = vec![];
    let mut repos: Vec<(String, PathBuf)> = vec![];
    for entry in std::fs::read_dir(root).map_err(super::error::io(root))? {
        let entry = entry.map_err(super::error::io(root))?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = file_name.strip_prefix("models--")
            && entry.path().is_dir()
        {
            repos.push((rest.replacen("--", "/", 1), entry.path()));
        }
    }
    repos.sort();
    for (repo, dir) in repos {
        if let Err(e) = list_repo(&repo, &dir, &mut out) {
            out.push(broken(repo, StoreKind::Hub, dir, &e));
        }
    }
    Ok(out)
}

/// One row per snapshot (named by `main`, another branch, or its commit),
/// one per GGUF file where a snapshot holds several, one per dangling branch.
fn list_repo(repo: &str, dir: &Path, out: &mut Vec<ListedModel>) -> StoreResult<()> {
    let branches = hub::branches(dir)?;
    let snapshots = hub::snapshot_names(dir)?;
    if snapshots.is_empty() && branches.is_empty() {
        // the resolver's own words for it
        hub::snapshot_of(dir, repo, None)?;
    }
    for (branch, commit) in &branches {
        if !snapshots.contains(commit) {
            let r = Some(branch.as_str());
            if let Err(e) = hub::snapshot_of(dir, repo, r) {
                out.push(broken(
                    hub_name(repo, branch),
                    StoreKind::Hub,
                    dir.into(),
                    &e,
                ));
            }
        }
    }
    let has_main = branches.iter().any(|(b, _)| b == "main");
    for commit in &snapshots {
        let pointing: Vec<&str> = branches
            .iter()
            .filter(|(_, c)| c == commit)
            .map(|(b, _)| b.as_str())
            .collect();
        let name = match pointing.first() {
            _ if pointing.contains(&"main") => repo.to_string(),
            Some(branch) => hub_name(repo, branch),
            None if !has_main && snapshots.len() == 1 => repo.to_string(),
            None => format!("{repo}@{}", super::short(commit)),
        };
        list_snapshot(&name, &dir.join("snapshots").join(commit), out);
    }
    Ok(())
}

fn hub_name(repo: &str, branch: &str) -> String {
    if branch == "main" {
        repo.to_string()
    } else {
        format!("{repo}@{branch}")
    }
}

fn list_snapshot(name: &str, snapshot: &Path, out: &mut Vec<ListedModel>) {
    match hub::model_in_snapshot(snapshot, None, name) {
        Ok(picked) => out.push(described(name.to_string(), StoreKind::Hub, &picked)),
        Err(StoreError::SeveralGguf { files, .. }) => {
            for file in files {
                let full = format!("{name}:{file}");
                match hub::model_in_snapshot(snapshot, Some(&file), name) {
                    Ok(picked) => out.push(described(full, StoreKind::Hub, &picked)),
                    Err(e) => out.push(broken(full, StoreKind::Hub, snapshot.join(&file), &e)),
                }
            }
        }
        Err(e) => out.push(broken(name.into(), StoreKind::Hub, snapshot.into(), &e)),
    }
}

fn list_ollama(root: &Path) -> StoreResult<Vec<ListedModel>> {
    let mut out = vec![];
    for (r, manifest) in ollama::manifests(root)? {
        let name = r.display_name();
        match ollama::model_blob(root, &manifest) {
            Ok(blob) => {
                let picked = Picked {
                    path: blob,
                    format: ModelFormat::Gguf,
                    file: None,
                };
                out.push(described(name, StoreKind::Ollama, &picked));
            }
            Err(e) => out.push(broken(name, StoreKind::Ollama, manifest, &e)),
        }
    }
    Ok(out)
}

fn broken(name: String, store: StoreKind, path: PathBuf, e: &dyn std::fmt::Display) -> ListedModel {
    ListedModel {
        name,
        store,
        format: None,
        path,
        size_bytes: 0,
        architecture: None,
        supported: false,
        layers: None,
        problem: Some(e.to_string()),
    }
}

/// A loadable entry with its size and what its config or header says.
fn described(name: String, store: StoreKind, picked: &Picked) -> ListedModel {
    let path = &picked.path;
    let (size, summary) = match picked.format {
        ModelFormat::Folder => (folder_size(path), folder_summary(path)),
        ModelFormat::Gguf => (
            std::fs::metadata(path).map_or(0, |m| m.len()),
            gguf_summary(path),
        ),
    };
    let (architecture, layers, problem) = match summary {
        Ok((arch, layers)) => (arch, layers, None),
        Err(e) => (None, None, Some(e)),
    };
    ListedModel {
        name,
        store,
        format: Some(picked.format),
        path: path.clone(),
        size_bytes: size,
        // GGUF names text-only Gemma 3 `gemma3`, a folder `gemma3_text`
        // (its `gemma3` has a vision tower)
        supported: architecture
            .as_deref()
            .is_some_and(|a| match picked.format {
                ModelFormat::Folder => Arch::from_model_type(a).is_some(),
                ModelFormat::Gguf => Arch::from_gguf_name(a).is_some(),
            }),
        architecture,
        layers,
        problem,
    }
}

/// Bytes of every file under `dir`, links followed (the hub's blobs).
fn folder_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                folder_size(&p)
            } else {
                std::fs::metadata(&p).map_or(0, |m| m.len())
            }
        })
        .sum()
}

type Summary = Result<(Option<String>, Option<usize>), String>;

/// `model_type` and `num_hidden_layers` of the decoder a folder's
/// `config.json` describes (a multimodal checkpoint's `text_config`, where
/// lcut reads its decoder; else the file's own, or its `text_config`'s
/// layers).
fn folder_summary(dir: &Path) -> Summary {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    let field = |key: &str| {
        value
            .get(key)
            .or_else(|| value.get("text_config").and_then(|t| t.get(key)))
            .cloned()
    };
    let arch = crate::config::decoder_model_type(&value).map(str::to_string);
    let layers = field("num_hidden_layers")
        .and_then(|v| v.as_u64())
        .and_then(|n| usize::try_from(n).ok());
    Ok((arch, layers))
}

/// `general.architecture` and `ARCH.block_count` of a GGUF header; the file
/// is mapped, and only the header's pages are read.
fn gguf_summary(path: &Path) -> Summary {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let map = crate::gguf::map_file(&file, path).map_err(|e| e.to_string())?;
    let header = crate::gguf::GgufHeader::parse(&map, path).map_err(|e| e.to_string())?;
    let arch = header
        .metadata
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let layers = arch
        .as_ref()
        .and_then(|a| header.metadata.get(&format!("{a}.block_count")))
        .and_then(|v| v.as_u64())
        .and_then(|n| usize::try_from(n).ok());
    Ok((arch, layers))
}
