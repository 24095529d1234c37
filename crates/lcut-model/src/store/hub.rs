//! The Hugging Face hub cache: `models--ORG--NAME/` with `refs/BRANCH`
//! (a commit hash) and `snapshots/COMMIT/` (the files, usually links into
//! `blobs/`). A snapshot is a model folder or holds GGUF files.

use std::path::{Path, PathBuf};

use super::error::{StoreError, StoreResult, io};
use super::reference::HubRef;
use super::{ModelFormat, ModelSource, ResolvedModel};

const CONFIG: &str = "config.json";
const WEIGHTS: [&str; 2] = ["model.safetensors", "model.safetensors.index.json"];
/// How deep GGUF files are looked for inside a snapshot.
const GGUF_DEPTH: usize = 3;

/// The model `r` names in the cache at `root`; `None` when the cache has
/// no folder for the repository.
pub(crate) fn find(root: &Path, r: &HubRef) -> StoreResult<Option<ResolvedModel>> {
    let repo_dir = root.join(r.folder_name());
    if !repo_dir.is_dir() {
        return Ok(None);
    }
    let rev = snapshot_of(&repo_dir, &r.repo(), r.revision.as_deref())?;
    let mut asked = r.repo();
    if let Some(v) = &r.revision {
        asked = format!("{asked}@{v}");
    }
    let picked = model_in_snapshot(&rev.snapshot, r.file.as_deref(), &asked)?;
    Ok(Some(ResolvedModel {
        path: picked.path,
        format: picked.format,
        source: ModelSource::Hub {
            repo: r.repo(),
            revision: rev.revision,
            commit: rev.commit,
            file: picked.file,
        },
    }))
}

/// A revision of a repository and its snapshot folder.
pub(crate) struct Revision {
    /// The revision as asked (`main` by default; the commit when the
    /// repository has no `refs/main` and a single snapshot).
    pub revision: String,
    /// The commit.
    pub commit: String,
    /// `snapshots/COMMIT`.
    pub snapshot: PathBuf,
}

/// The snapshot a revision names: `refs/REV` when there is one, else a
/// commit of which `REV` is a unique prefix; with no revision and no
/// `refs/main`, the only snapshot there is.
pub(crate) fn snapshot_of(
    repo_dir: &Path,
    repo: &str,
    revision: Option<&str>,
) -> StoreResult<Revision> {
    let rev = revision.unwrap_or("main");
    let ref_file = repo_dir.join("refs").join(rev);
    if ref_file.is_file() {
        let commit = read_ref(&ref_file)?;
        let snapshot = repo_dir.join("snapshots").join(&commit);
        if !snapshot.is_dir() {
            return Err(StoreError::DanglingRef {
                repo: repo.to_string(),
                ref_file,
                commit,
                snapshot,
            });
        }
        return Ok(Revision {
            revision: rev.to_string(),
            commit,
            snapshot,
        });
    }
    let snapshots_dir = repo_dir.join("snapshots");
    let snapshots = snapshot_names(repo_dir)?;
    if snapshots.is_empty() {
        return Err(StoreError::NoSnapshot {
            repo: repo.to_string(),
            repo_dir: repo_dir.to_path_buf(),
            snapshots: snapshots_dir,
        });
    }
    let found = |commit: &String| Revision {
        revision: revision.unwrap_or(commit).to_string(),
        commit: commit.clone(),
        snapshot: snapshots_dir.join(commit),
    };
    let matches: Vec<&String> = match revision {
        Some(r) if r.chars().all(|c| c.is_ascii_hexdigit()) => {
            let r = r.to_ascii_lowercase();
            snapshots.iter().filter(|s| s.starts_with(&r)).collect()
        }
        Some(_) => vec![],
        None if snapshots.len() == 1 => snapshots.iter().collect(),
        None => vec![],
    };
    match matches.as_slice() {
        [one] => Ok(found(one)),
        [] => Err(StoreError::UnknownRevision {
            repo_dir: repo_dir.to_path_buf(),
            revision: rev.to_string(),
            available: available(repo_dir, &snapshots)?,
        }),
        several => Err(StoreError::AmbiguousRevision {
            repo_dir: repo_dir.to_path_buf(),
            prefix: rev.to_string(),
            matches: several.iter().map(|s| s.to_string()).collect(),
        }),
    }
}

fn read_ref(ref_file: &Path) -> StoreResult<String> {
    let text = std::fs::read_to_string(ref_file).map_err(io(ref_file))?;
    let commit = text.trim();
    if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(StoreError::BadRef {
            ref_file: ref_file.to_path_buf(),
            found: commit.chars().take(80).collect(),
        });
    }
    Ok(commit.to_string())
}

/// The branches and snapshots of a repository, in words.
fn available(repo_dir: &Path, snapshots: &[String]) -> StoreResult<String> {
    let branches: Vec<String> = branches(repo_dir)?.into_iter().map(|(b, _)| b).collect();
    let branches = if branches.is_empty() {
        "no branches (refs/ is empty)".to_string()
    } else {
        format!("branches {}", branches.join(", "))
    };
    Ok(format!(
        "{branches}; snapshots {}; name one with @BRANCH or @COMMIT",
        snapshots.join(", ")
    ))
}

/// The commits that have a snapshot folder, sorted.
pub(crate) fn snapshot_names(repo_dir: &Path) -> StoreResult<Vec<String>> {
    let dir = repo_dir.join("snapshots");
    if !dir.is_dir() {
        return Ok(vec![]);
    }
    let mut names = vec![];
    for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
        let entry = entry.map_err(io(&dir))?;
        if entry.path().is_dir() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Every branch of a repository (`main`, `pr/1`) with the commit its file
/// holds, sorted; unreadable branch files are errors.
pub(crate) fn branches(repo_dir: &Path) -> StoreResult<Vec<(String, String)>> {
    let refs = repo_dir.join("refs");
    let mut out = vec![];
    for rel in files_under(&refs, 4)? {
        let commit = read_ref(&refs.join(&rel))?;
        out.push((rel, commit));
    }
    out.sort();
    Ok(out)
}

/// What a snapshot holds for a reference.
pub(crate) struct Picked {
    /// The folder or GGUF file.
    pub path: PathBuf,
    /// Its format.
    pub format: ModelFormat,
    /// The GGUF file, relative to the snapshot.
    pub file: Option<String>,
}

/// The model in `snapshot`: the GGUF file `file` names (a file name or a
/// quantization tag), else the model folder, else its only GGUF file.
/// `asked` is the reference without a file, for the message that asks for one.
pub(crate) fn model_in_snapshot(
    snapshot: &Path,
    file: Option<&str>,
    asked: &str,
) -> StoreResult<Picked> {
    let ggufs = gguf_files(snapshot)?;
    let gguf = |rel: &String| -> StoreResult<Picked> {
        let path = snapshot.join(rel);
        check_link(&path)?;
        Ok(Picked {
            path,
            format: ModelFormat::Gguf,
            file: Some(rel.clone()),
        })
    };
    if let Some(want) = file {
        return match pick_gguf(&ggufs, want).as_slice() {
            [one] => gguf(one),
            [] => Err(StoreError::NoSuchGguf {
                snapshot: snapshot.to_path_buf(),
                file: want.to_string(),
                available: ggufs,
            }),
            several => Err(StoreError::SeveralGguf {
                snapshot: snapshot.to_path_buf(),
                reference: asked.to_string(),
                files: several.iter().map(|s| s.to_string()).collect(),
            }),
        };
    }
    let present = |name: &str| std::fs::symlink_metadata(snapshot.join(name)).is_ok();
    if present(CONFIG) && (WEIGHTS.iter().any(|w| present(w)) || ggufs.is_empty()) {
        for entry in std::fs::read_dir(snapshot).map_err(io(snapshot))? {
            check_link(&entry.map_err(io(snapshot))?.path())?;
        }
        return Ok(Picked {
            path: snapshot.to_path_buf(),
            format: ModelFormat::Folder,
            file: None,
        });
    }
    match ggufs.as_slice() {
        [one] => gguf(one),
        [] => Err(StoreError::EmptySnapshot {
            snapshot: snapshot.to_path_buf(),
        }),
        several => Err(StoreError::SeveralGguf {
            snapshot: snapshot.to_path_buf(),
            reference: asked.to_string(),
            files: several.to_vec(),
        }),
    }
}

/// The GGUF files `want` names: by relative path or file name (with or
/// without `.gguf`); failing that, those whose name ends in the
/// quantization tag `want` (`Q4_K_M` for `model-Q4_K_M.gguf`), any case.
fn pick_gguf<'a>(files: &'a [String], want: &str) -> Vec<&'a String> {
    let with_ext = format!("{want}.gguf");
    let name = |f: &'a String| f.rsplit('/').next().unwrap_or(f);
    let exact: Vec<&String> = files
        .iter()
        .filter(|f| {
            [want, with_ext.as_str()]
                .iter()
                .any(|w| *f == w || name(f) == *w)
        })
        .collect();
    if !exact.is_empty() {
        return exact;
    }
    let tag = want.to_ascii_lowercase();
    files
        .iter()
        .filter(|f| {
            let stem = name(f).to_ascii_lowercase();
            let stem = stem.strip_suffix(".gguf").unwrap_or(&stem);
            stem == tag
                || ['-', '.', '_']
                    .iter()
                    .any(|s| stem.ends_with(&format!("{s}{tag}")))
        })
        .collect()
}

/// The `.gguf` files of a snapshot (links included, dangling or not),
/// relative to it, sorted.
pub(crate) fn gguf_files(snapshot: &Path) -> StoreResult<Vec<String>> {
    Ok(files_under(snapshot, GGUF_DEPTH)?
        .into_iter()
        .filter(|f| crate::gguf::is_gguf_path(Path::new(f)))
        .collect())
}

/// Files (and links to anything but folders) under `dir` down to `depth`
/// folders, as `/`-separated relative paths, sorted; none if `dir` is absent.
fn files_under(dir: &Path, depth: usize) -> StoreResult<Vec<String>> {
    let mut out = vec![];
    if !dir.is_dir() {
        return Ok(out);
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type().map_err(io(entry.path()))?;
        if kind.is_dir() {
            if depth > 0 {
                let inner = files_under(&entry.path(), depth - 1)?;
                out.extend(inner.into_iter().map(|f| format!("{name}/{f}")));
            }
        } else if !entry.path().is_dir() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Refuse a link whose target is missing (a blob of an unfinished download).
pub(crate) fn check_link(path: &Path) -> StoreResult<()> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if is_link && std::fs::metadata(path).is_err() {
        let target = std::fs::read_link(path).map_err(io(path))?;
        let target = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
        return Err(StoreError::DanglingLink {
            link: path.to_path_buf(),
            target,
        });
    }
    Ok(())
}
