//! Reference runs of kvpress's presses (`kvpress.safetensors`, made by
//! `fixtures/oracle/kvpress_reference.py` with kvpress itself): for each
//! press, the logits of the decode-phase rows and the prompt positions each
//! (layer, K/V head) kept. The file's metadata lists each press's policy
//! text and kvpress class, and the decode start.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use lcut_policy::PolicySpec;
use serde::Deserialize;

use lcut_model::{ModelError, Result};

use crate::masked::metadata_entry;

/// One press of the file, as its metadata gives it.
#[derive(Debug, Deserialize)]
struct MetaPress {
    policy: String,
    press: String,
}

/// One press with its reference.
#[derive(Debug, Clone)]
pub struct PressPolicy {
    /// Its key (`snapkv.r50.w8`): the tensors are `logits.{key}` and
    /// `kept.{key}` (oracle cases) or `{case}.{key}.top_idx` and
    /// `{case}.kept.{key}` (SmolLM2).
    pub key: String,
    /// The policy as a user writes it.
    pub spec: PolicySpec,
    /// kvpress's class that made the reference.
    pub kvpress_class: String,
}

/// The presses of one reference file and its tensors.
#[derive(Debug, Clone)]
pub struct PressReference {
    /// The presses, by key.
    pub policies: Vec<PressPolicy>,
    /// The decode start of the file's sequences (the prompt's length).
    pub decode_start: usize,
    /// Every tensor of the file, on the CPU.
    pub tensors: HashMap<String, Tensor>,
}

impl PressReference {
    /// Read `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |reason: String| ModelError::Safetensors {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let meta: BTreeMap<String, MetaPress> =
            serde_json::from_str(&metadata_entry(path, &bytes, "policies")?)
                .map_err(|e| bad(format!("\"policies\" metadata: {e}")))?;
        let decode_start = metadata_entry(path, &bytes, "decode_start")?
            .parse()
            .map_err(|e| bad(format!("\"decode_start\" metadata: {e}")))?;
        let tensors =
            candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        let policies = meta
            .into_iter()
            .map(|(key, p)| {
                Ok(PressPolicy {
                    key,
                    spec: p.policy.parse()?,
                    kvpress_class: p.press,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            policies,
            decode_start,
            tensors,
        })
    }

    /// The prompt positions kvpress kept, `[layer][kv_head]` ascending,
    /// from the bits of tensor `name` ([layers, kv_heads, ceil(s / 8)]).
    pub fn kept(&self, name: &str) -> Result<Vec<Vec<Vec<usize>>>> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::Safetensors {
                path: name.into(),
                reason: "no such tensor in the press reference".into(),
            })?;
        let bits: Vec<Vec<Vec<u8>>> = t.to_dtype(DType::U8)?.to_vec3()?;
        let s = self.decode_start;
        Ok(bits
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .map(|head| {
                        (0..s)
                            .filter(|&p| head[p / 8] >> (p % 8) & 1 == 1)
                            .collect()
                    })
                    .collect()
            })
            .collect())
    }
}
