//! Prompt sets: JSON Lines files of `{"id": ..., "prompt": ..., "system"?: ...}`,
//! and their deterministic shards.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

use crate::error::{EngineError, Result};

/// Prompt set shipped with the bundled model, relative to the repository root.
pub const BUNDLED_PROMPTS: &str = "fixtures/prompts/copy.jsonl";

/// One prompt of a prompt set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptSpec {
    /// Identifier (unique within the set).
    pub id: String,
    /// The user message.
    pub user: String,
    /// Optional system message.
    pub system: Option<String>,
}

impl PromptSpec {
    /// A user prompt without system message.
    pub fn text(id: &str, user: &str) -> Self {
        Self {
            id: id.to_string(),
            user: user.to_string(),
            system: None,
        }
    }
}

#[derive(Deserialize)]
struct Line {
    id: Option<String>,
    prompt: String,
    system: Option<String>,
}

/// Read a JSON Lines prompt set; blank lines are skipped, a prompt without
/// `id` is named by its line number, and ids must be unique.
pub fn read_prompt_set(path: &Path) -> Result<Vec<PromptSpec>> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::PromptSet {
        path: path.to_path_buf(),
        line: 0,
        reason: e.to_string(),
    })?;
    let mut prompts = Vec::new();
    let mut seen = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(raw).map_err(|e| EngineError::PromptSet {
            path: path.to_path_buf(),
            line: i + 1,
            reason: format!("{e} (expected {{\"id\": ..., \"prompt\": ..., \"system\"?: ...}})"),
        })?;
        if line.prompt.trim().is_empty() {
            return Err(EngineError::PromptSet {
                path: path.to_path_buf(),
                line: i + 1,
                reason: "the prompt is empty".into(),
            });
        }
        let id = line.id.unwrap_or_else(|| format!("line{}", i + 1));
        // traces and reports name prompts by id: two with one id would mix
        if !seen.insert(id.clone()) {
            return Err(EngineError::PromptSet {
                path: path.to_path_buf(),
                line: i + 1,
                reason: format!("the id {id:?} is used by an earlier prompt; ids must be unique"),
            });
        }
        prompts.push(PromptSpec {
            id,
            user: line.prompt,
            system: line.system,
        });
    }
    if prompts.is_empty() {
        return Err(EngineError::PromptSet {
            path: path.to_path_buf(),
            line: 0,
            reason: "no prompts in the file".into(),
        });
    }
    Ok(prompts)
}

/// Indices of the prompts in shard `i` of `n`: every n-th prompt from i, so
/// shards are deterministic, disjoint and cover the set.
pub fn shard_indices(count: usize, shard: Option<(usize, usize)>) -> Result<Vec<usize>> {
    match shard {
        None => Ok((0..count).collect()),
        Some((i, n)) if n > 0 && i < n => Ok((i..count).step_by(n).collect()),
        Some((i, n)) => Err(EngineError::Shard { index: i, count: n }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_set() {
        let mut all: Vec<usize> = (0..3)
            .flat_map(|i| shard_indices(10, Some((i, 3))).unwrap())
            .collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert!(shard_indices(10, Some((3, 3))).is_err());
        assert!(shard_indices(10, Some((0, 0))).is_err());
    }

    #[test]
    fn reads_jsonl_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(
            &path,
            "{\"id\":\"a\",\"prompt\":\"x y\"}\n\n{\"prompt\":\"z\",\"system\":\"s\"}\n",
        )
        .unwrap();
        let p = read_prompt_set(&path).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].id, "line3");
        assert_eq!(p[1].system.as_deref(), Some("s"));
        std::fs::write(&path, "{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":1}\n").unwrap();
        let err = read_prompt_set(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
