//! Reference cases from Hugging Face transformers (`fixtures/oracle/<case>`):
//! a tiny model, the token ids, and what transformers computed for them
//! (logits at full depth and under SPEED policies). Used to check the
//! decoder on any device and dtype against an outside reference.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use lcut_policy::{Anchors, Policy, PolicyKind, TokenPhases};
use serde::Deserialize;

use lcut_model::{Decoder, LogitRows, ModelError, Result};

/// Key of the full-depth logits in `reference.safetensors`.
pub const FULL_LOGITS: &str = "logits";

/// Name of the full model's logits decoded one token at a time after a
/// prefill (held to the rows of [`FULL_LOGITS`] from the decode start).
pub const STEPPED_LOGITS: &str = "logits.steps";

/// One policy transformers was run under (an entry of `case.json`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ReferencePolicy {
    /// Tensor name of its logits (decode rows only), e.g. `logits.speed.l2.bos`.
    pub key: String,
    /// Layers in which prefill tokens exist.
    pub l_cut: usize,
    /// Anchor positions (empty, or `[0]` for BoS).
    pub anchors: Vec<usize>,
    /// SelfOnly instead of SPEED.
    pub self_only: bool,
    /// First decode-phase position.
    pub decode_start: usize,
}

#[derive(Debug, Deserialize)]
struct CaseFile {
    policies: Vec<ReferencePolicy>,
}

/// A reference case: model folder, token ids and transformers' tensors.
#[derive(Debug, Clone)]
pub struct ReferenceCase {
    /// The case's name (its folder's name).
    pub name: String,
    /// The case folder (also a model folder).
    pub dir: PathBuf,
    /// The token ids transformers was run on.
    pub ids: Vec<u32>,
    /// Every tensor of `reference.safetensors`, on the CPU.
    pub tensors: HashMap<String, Tensor>,
    /// The SPEED/SelfOnly policies with reference logits.
    pub policies: Vec<ReferencePolicy>,
}

/// Our logits for one reference tensor, both [rows, vocab] f32 on the CPU.
#[derive(Debug, Clone)]
pub struct LogitPair {
    /// `logits`, a policy's key or [`STEPPED_LOGITS`].
    pub key: String,
    /// What the decoder computed.
    pub ours: Tensor,
    /// What transformers computed.
    pub reference: Tensor,
    /// Where `reference` lies among transformers' tensors: its key and
    /// first row (`logits` from the decode start for the stepped rows).
    pub reference_rows: (String, usize),
}

impl ReferenceCase {
    /// The case folders under `root` (those holding a `case.json`), by name.
    pub fn list(root: &Path) -> Result<Vec<PathBuf>> {
        let entries = std::fs::read_dir(root).map_err(|source| ModelError::Io {
            path: root.to_path_buf(),
            source,
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("case.json").is_file())
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(ModelError::MissingFile {
                path: root.join("*/case.json"),
                what: "reference cases (folders with case.json, config.json, \
                       model.safetensors and reference.safetensors)"
                    .into(),
            });
        }
        Ok(dirs)
    }

    /// Read the case in `dir` (its tensors onto the CPU).
    pub fn load(dir: &Path) -> Result<Self> {
        let case_path = dir.join("case.json");
        let text = std::fs::read_to_string(&case_path).map_err(|source| ModelError::Io {
            path: case_path.clone(),
            source,
        })?;
        let case: CaseFile = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: case_path.clone(),
            source,
        })?;
        let ref_path = dir.join("reference.safetensors");
        let tensors = candle_core::safetensors::load(&ref_path, &Device::Cpu).map_err(|e| {
            ModelError::Safetensors {
                path: ref_path.clone(),
                reason: e.to_string(),
            }
        })?;
        let needed = std::iter::once("input_ids")
            .chain(std::iter::once(FULL_LOGITS))
            .chain(case.policies.iter().map(|p| p.key.as_str()));
        if let Some(missing) = needed.into_iter().find(|k| !tensors.contains_key(*k)) {
            return Err(ModelError::MissingTensor {
                folder: ref_path,
                name: missing.to_string(),
            });
        }
        let ids = tensors["input_ids"]
            .to_dtype(DType::U32)?
            .to_vec1::<u32>()?;
        Ok(Self {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            dir: dir.to_path_buf(),
            ids,
            tensors,
            policies: case.policies,
        })
    }

    /// The case's model, loaded onto `device` in `dtype`.
    pub fn model(&self, dtype: DType, device: &Device) -> Result<Decoder> {
        Decoder::load(&self.dir, dtype, device)
    }

    /// A reference policy resolved against the case's model depth.
    pub fn resolve(
        &self,
        policy: &ReferencePolicy,
        num_layers: usize,
    ) -> Result<(Policy, TokenPhases)> {
        let kind = if policy.self_only {
            PolicyKind::SelfOnly
        } else {
            PolicyKind::Speed
        };
        let anchors = if policy.anchors.is_empty() {
            Anchors::None
        } else {
            Anchors::Bos
        };
        let resolved = Policy::new(kind, policy.l_cut, num_layers, anchors)?;
        let phases = TokenPhases::new(self.ids.len(), policy.decode_start, anchors.len(None)?)?;
        Ok((resolved, phases))
    }

    /// Teacher-forced logits of `model` for the full-depth reference and
    /// every policy's decode rows, paired with transformers' (on the CPU).
    pub fn logit_pairs(&self, model: &Decoder) -> Result<Vec<LogitPair>> {
        let cpu = Device::Cpu;
        let mut pairs = vec![LogitPair {
            key: FULL_LOGITS.to_string(),
            ours: model
                .teacher_forced_logits(&self.ids, None)?
                .to_device(&cpu)?,
            reference: self.tensors[FULL_LOGITS].clone(),
            reference_rows: (FULL_LOGITS.to_string(), 0),
        }];
        if let Some(start) = self.policies.first().map(|p| p.decode_start) {
            // the decode step's path (one row a layer; on a GPU, the
            // experts' gathered products)
            let mut seq = model.new_full_sequence();
            let ours = model
                .incremental_logits(&mut seq, &self.ids, start, None)?
                .to_device(&cpu)?;
            let reference = self.tensors[FULL_LOGITS].narrow(0, start, ours.dim(0)?)?;
            pairs.push(LogitPair {
                key: STEPPED_LOGITS.to_string(),
                ours,
                reference,
                reference_rows: (FULL_LOGITS.to_string(), start),
            });
        }
        for policy in &self.policies {
            let (resolved, phases) = self.resolve(policy, model.config().num_layers)?;
            let s = phases.decode_start();
            let mut seq = model.new_sequence(resolved, phases)?;
            let out = model.forward(&mut seq, &self.ids, LogitRows::All, None)?;
            let first = out.positions.partition_point(|&p| p < s);
            let logits = out.logits.ok_or(ModelError::EmptyInput)?;
            pairs.push(LogitPair {
                key: policy.key.clone(),
                ours: logits
                    .narrow(0, first, self.ids.len() - s)?
                    .to_device(&cpu)?,
                reference: self.tensors[&policy.key].clone(),
                reference_rows: (policy.key.clone(), 0),
            });
        }
        Ok(pairs)
    }
}
