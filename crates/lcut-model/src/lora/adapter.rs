//! An adapter folder read into memory: its config and, per (layer, module),
//! the matrices A [r, in] and B [out, r] under PEFT's tensor names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::config::LoraConfig;
use super::error::LoraError;

/// File name of the weights in an adapter folder.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// PEFT's prefix of a Llama-family module inside `PeftModelForCausalLM`.
const PREFIX: &str = "base_model.model.model.layers.";

/// One adapted linear layer: y += scale · (x Aᵀ) Bᵀ.
#[derive(Debug, Clone)]
pub struct LoraPair {
    /// A [r, in], f32.
    pub a: Tensor,
    /// B [out, r], f32.
    pub b: Tensor,
}

/// Where a pair applies: a layer and its module path (`self_attn.q_proj`).
pub type Site = (usize, String);

/// A LoRA adapter read from a PEFT-layout folder.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// The folder it was read from (named in errors).
    pub folder: PathBuf,
    /// Its `adapter_config.json`.
    pub config: LoraConfig,
    /// Its matrices by site.
    pub pairs: BTreeMap<Site, LoraPair>,
    /// [`lcut_trace::hash_bytes`] of the bytes [`LoraAdapter::read`] read:
    /// `adapter_config.json` followed by `adapter_model.safetensors` (what
    /// `AdapterIdentity::hash` records).
    pub hash: String,
}

/// PEFT's name of matrix `which` ("A" or "B") of `module` in `layer`.
pub fn tensor_name(layer: usize, module: &str, which: &str) -> String {
    format!("{PREFIX}{layer}.{module}.lora_{which}.weight")
}

/// The site and matrix ("A"/"B") a PEFT tensor name stands for.
fn parse_name(name: &str) -> Option<(usize, String, &'static str)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (layer, rest) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let (module, which) = if let Some(m) = rest.strip_suffix(".lora_A.weight") {
        (m, "A")
    } else {
        (rest.strip_suffix(".lora_B.weight")?, "B")
    };
    let ok = module.split('.').count() == 2 && module.split('.').all(|p| !p.is_empty());
    ok.then(|| (layer, module.to_string(), which))
}

impl LoraAdapter {
    /// Read `adapter_config.json` and `adapter_model.safetensors` from
    /// `folder`, checking names, pairs and ranks (not yet the model).
    pub fn read(folder: &Path) -> Result<Self, LoraError> {
        let (config, config_bytes) = LoraConfig::read_with_bytes(folder)?;
        let path = folder.join(WEIGHTS_FILE);
        let weights = std::fs::read(&path).map_err(|source| LoraError::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        let hash = lcut_trace::hash_parts(&[&config_bytes, &weights]);
        let tensors = load_tensors(&path, &weights)?;
        let mut halves: BTreeMap<Site, (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
        for (name, t) in tensors {
            let Some((layer, module, which)) = parse_name(&name) else {
                return Err(LoraError::UnexpectedTensor {
                    path,
                    name,
                    why: format!(
                        "a LoRA matrix is named `{PREFIX}<layer>.<block>.<module>.lora_A.weight` (or lora_B)"
                    ),
                });
            };
            let entry = halves.entry((layer, module)).or_default();
            let slot = if which == "A" {
                &mut entry.0
            } else {
                &mut entry.1
            };
            *slot = Some(t);
        }
        let mut pairs = BTreeMap::new();
        for ((layer, module), (a, b)) in halves {
            let pair = complete(&path, &config, layer, &module, a, b)?;
            pairs.insert((layer, module), pair);
        }
        Ok(Self {
            folder: folder.to_path_buf(),
            config,
            pairs,
            hash,
        })
    }

    /// The weights file (named in errors).
    pub fn weights_path(&self) -> PathBuf {
        self.folder.join(WEIGHTS_FILE)
    }
}

/// Both matrices of a site, checked to be 2-D with the config's rank.
fn complete(
    path: &Path,
    config: &LoraConfig,
    layer: usize,
    module: &str,
    a: Option<Tensor>,
    b: Option<Tensor>,
) -> Result<LoraPair, LoraError> {
    let missing = |which: &str, other: &str| LoraError::MissingTensor {
        path: path.to_path_buf(),
        name: tensor_name(layer, module, which),
        why: format!("its partner lora_{other} is in the file"),
    };
    let a = a.ok_or_else(|| missing("A", "B"))?;
    let b = b.ok_or_else(|| missing("B", "A"))?;
    for (t, which, rank_dim) in [(&a, "A", 0), (&b, "B", 1)] {
        let name = tensor_name(layer, module, which);
        let shape = t.dims().to_vec();
        if shape.len() != 2 {
            return Err(LoraError::UnexpectedTensor {
                path: path.to_path_buf(),
                name,
                why: format!("it has shape {shape:?}; a LoRA matrix is 2-D"),
            });
        }
        if shape[rank_dim] != config.r {
            return Err(LoraError::RankMismatch {
                path: path.to_path_buf(),
                name,
                expected: config.r,
                found: shape[rank_dim],
                shape,
            });
        }
    }
    Ok(LoraPair { a, b })
}

/// Every tensor of the weights file at `path` (its `bytes`), as f32 on the CPU.
fn load_tensors(path: &Path, bytes: &[u8]) -> Result<Vec<(String, Tensor)>, LoraError> {
    let bad = |reason: String| LoraError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for (name, view) in file.tensors() {
        use safetensors::Dtype;
        if !matches!(
            view.dtype(),
            Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64
        ) {
            return Err(bad(format!(
                "tensor `{name}` is stored as {:?}; LoRA matrices must be floating point",
                view.dtype()
            )));
        }
        let t = candle_core::safetensors::Load::load(&view, &Device::Cpu)?;
        out.push((name, t.to_dtype(DType::F32)?));
    }
    Ok(out)
}
