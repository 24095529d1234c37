//! Reference logits of the policies defined by attention masks alone
//! (`masks.safetensors`, made by `fixtures/oracle/masks_reference.py`):
//! prompt knockout (`knockout:l`, `band:a..b`) and SPEED with kept heads
//! (`speed:C+bos+heads:FILE`, `+window:W`). The file's metadata lists each
//! policy's text and, for a head policy, its kept (layer, K/V head) pairs;
//! [`MaskedReference::load`] writes those pairs to head files so that each
//! policy is written as a user writes it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use lcut_policy::{Anchors, HeadFile, ModelDims, Policy, PolicySpec, TokenPhases};
use serde::Deserialize;

use lcut_model::{ModelError, Result};

/// One policy of `masks.safetensors`, as its metadata gives it.
#[derive(Debug, Deserialize)]
struct MetaPolicy {
    policy: String,
    heads: Option<Vec<(usize, usize)>>,
}

/// One masked policy with its reference.
#[derive(Debug, Clone)]
pub struct MaskedPolicy {
    /// Its key (`knockout.l1`, `heads.c2.bos`, ...): the tensors are
    /// `logits.{key}` (oracle cases) or `{case}.{key}.top_idx` (SmolLM2).
    pub key: String,
    /// The policy as a user writes it (a head file named where it is one).
    pub spec: PolicySpec,
}

impl MaskedPolicy {
    /// The policy resolved for a model of `num_layers` layers and
    /// `kv_heads` K/V heads, and the phases of a sequence of `len` tokens
    /// whose decode phase starts at `decode_start`.
    pub fn resolve(
        &self,
        num_layers: usize,
        kv_heads: usize,
        len: usize,
        decode_start: usize,
    ) -> Result<(Policy, TokenPhases)> {
        let dims = ModelDims {
            num_layers,
            kv_heads: Some(kv_heads),
            config_hash: None,
        };
        let policy = self.spec.resolve_for(&dims, None)?;
        let anchors = match policy.anchors() {
            Anchors::Bos => 1,
            Anchors::Prefix(n) => n,
            Anchors::None | Anchors::System => 0,
        };
        Ok((policy, TokenPhases::new(len, decode_start, anchors)?))
    }
}

/// The masked policies of one reference file and its tensors.
#[derive(Debug, Clone)]
pub struct MaskedReference {
    /// The policies, by key.
    pub policies: Vec<MaskedPolicy>,
    /// Every tensor of the file, on the CPU.
    pub tensors: HashMap<String, Tensor>,
}

impl MaskedReference {
    /// Read `path`; head policies' pairs are written as head files into
    /// `heads_dir` (which must exist).
    pub fn load(path: &Path, heads_dir: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let meta = policies_metadata(path, &bytes)?;
        let tensors = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| {
            ModelError::Safetensors {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        let mut policies = Vec::new();
        for (key, p) in meta {
            let mut text = p.policy.clone();
            if let Some(heads) = p.heads {
                let file = heads_dir.join(format!("{key}.json"));
                write_heads(&file, heads)?;
                // the window, if any, stays after the file
                let (base, window) = match text.split_once("+window:") {
                    Some((b, w)) => (b.to_string(), format!("+window:{w}")),
                    None => (text.clone(), String::new()),
                };
                text = format!("{base}+heads:{}{window}", file.display());
            }
            let spec = text.parse::<PolicySpec>()?;
            policies.push(MaskedPolicy { key, spec });
        }
        Ok(Self { policies, tensors })
    }
}

/// The "policies" entry of a safetensors file's metadata.
fn policies_metadata(path: &Path, bytes: &[u8]) -> Result<BTreeMap<String, MetaPolicy>> {
    let policies = metadata_entry(path, bytes, "policies")?;
    serde_json::from_str(&policies).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        reason: format!("\"policies\" metadata: {e}"),
    })
}

/// The string `key` of a safetensors file's metadata (`bytes`: the file).
pub(crate) fn metadata_entry(path: &Path, bytes: &[u8], key: &str) -> Result<String> {
    let bad = |reason: String| ModelError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
        .ok_or_else(|| bad("shorter than its header length".into()))?;
    let header = bytes
        .get(8..8 + n)
        .ok_or_else(|| bad("its header runs past the end".into()))?;
    let header: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    header
        .get("__metadata__")
        .and_then(|m| m.get(key))
        .and_then(|p| p.as_str())
        .map(str::to_string)
        .ok_or_else(|| bad(format!("no {key:?} in its metadata")))
}

fn write_heads(file: &PathBuf, heads: Vec<(usize, usize)>) -> Result<()> {
    let head_file = HeadFile {
        heads,
        ..HeadFile::default()
    };
    let text = serde_json::to_string(&head_file).map_err(|source| ModelError::Json {
        path: file.clone(),
        source,
    })?;
    std::fs::write(file, text).map_err(|source| ModelError::Io {
        path: file.clone(),
        source,
    })
}
