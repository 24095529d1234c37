//! Memory-mapped safetensors weights (one file or a sharded index) with
//! named errors for missing tensors and wrong shapes.
//!
//! A multimodal checkpoint (Gemma 4's and Qwen3.5's published folders)
//! keeps its text decoder under `model.language_model.`, or as Gemma 3's
//! were published under `language_model.model.`: its tensors are read
//! under the decoder's own names (`model.layers.0...`), beside the LM
//! head, and the towers' tensors (vision, audio, multi-token prediction)
//! are not read.
//!
//! Every file is mapped, never read whole. A tensor is copied out of the
//! mapping once, in its stored dtype (a bf16 checkpoint loaded as bf16 is
//! never widened to f32), and the mapped pages it came from are handed
//! back at once: the process holds the weights and at most one tensor's
//! pages of the file beside them, whatever the number of shards.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use safetensors::tensor::TensorInfo;
use serde_json::Value;

use crate::error::{ModelError, Result};

/// Where a decoder's tensors come from: files of a model folder, or
/// generated ones (random-weight benchmarks).
pub trait WeightSource {
    /// The folder named in error messages.
    fn folder(&self) -> &Path;
    /// Whether a tensor of this name exists.
    fn contains(&self, name: &str) -> bool;
    /// Tensor `name`, checked to have shape `expected`, in `dtype` on `device`.
    fn load(&self, name: &str, expected: &[usize], dtype: DType, device: &Device)
    -> Result<Tensor>;
    /// Matrix `name` read in place where its file is memory-mapped, in a
    /// block format the CPU kernels read; `None` for sources that hold it
    /// otherwise (dense files, other types, a GPU device).
    fn load_mapped(
        &self,
        name: &str,
        expected: &[usize],
        device: &Device,
    ) -> Result<Option<crate::mapped::MappedMatrix>> {
        let _ = (name, expected, device);
        Ok(None)
    }
    /// Tensor `name` in the quantized type it is stored in, shape checked;
    /// `None` for sources that hold only dense tensors.
    fn load_quantized(
        &self,
        name: &str,
        expected: &[usize],
        device: &Device,
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        let _ = (name, expected, device);
        Ok(None)
    }
}

/// The weight files of one model folder.
pub struct WeightFiles {
    folder: PathBuf,
    paths: Vec<PathBuf>,
    files: Vec<MappedFile>,
    /// Each tensor the decoder may ask for, by the name it asks with, and
    /// where it is stored.
    owner: HashMap<String, Stored>,
}

/// Where a tensor is stored: its file and its name in that file (a
/// multimodal checkpoint's decoder tensors are stored under
/// [`TEXT_DECODER_PREFIXES`]).
struct Stored {
    file: usize,
    name: String,
}

/// Where a multimodal checkpoint keeps its text decoder's tensors, in
/// place of `model.`: transformers 5's layout (Gemma 4's, Qwen3.5's), and
/// transformers 4's, in which Gemma 3's were published (and which
/// transformers 5 still writes for them).
pub const TEXT_DECODER_PREFIXES: [&str; 2] = ["model.language_model.", "language_model.model."];

/// Where transformers 4's multimodal layout keeps an untied LM head.
const WRAPPED_HEAD: &str = "language_model.lm_head.weight";

/// One safetensors file, memory-mapped, its header parsed once.
struct MappedFile {
    map: Mmap,
    /// Offset of the data section (after the 8-byte length and the header).
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

impl MappedFile {
    /// Map `path` and check its header against its length.
    fn open(path: &Path) -> Result<Self> {
        let bad = |reason: String| ModelError::Safetensors {
            path: path.to_path_buf(),
            reason: truncation(path).unwrap_or(reason),
        };
        let file = std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let map = crate::gguf::map_file(&file, path)?;
        // the whole file is checked: offsets inside it and covering it
        safetensors::SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
        let (header_len, metadata) =
            safetensors::SafeTensors::read_metadata(&map).map_err(|e| bad(e.to_string()))?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        Ok(Self {
            map,
            data_start: 8 + header_len,
            tensors,
        })
    }

    /// A copy of tensor `name` (known to be in the file) in its stored
    /// dtype on `device`; the mapped pages it was read from are released.
    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let info = &self.tensors[name];
        let (from, to) = info.data_offsets;
        let (from, to) = (self.data_start + from, self.data_start + to);
        let tensor = Tensor::from_raw_buffer(&self.map[from..to], dtype, &info.shape, device)?;
        self.release(from, to - from);
        Ok(tensor)
    }

    /// Drop the mapped pages of `len` bytes at `offset` from the process's
    /// resident memory (the page cache keeps them).
    fn release(&self, offset: usize, len: usize) {
        crate::gguf::release_mapped(&self.map, offset, len);
    }
}

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

impl WeightFiles {
    /// Open `model.safetensors`, or every shard named by
    /// `model.safetensors.index.json`, memory-mapped.
    pub fn open(folder: &Path) -> Result<Self> {
        let shards = shard_paths(folder)?;
        let mut files = Vec::with_capacity(shards.paths.len());
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (i, path) in shards.paths.iter().enumerate() {
            let st = MappedFile::open(path)?;
            for name in st.tensors.keys().cloned() {
                if let Some(&first) = owner.get(&name) {
                    return Err(ModelError::Safetensors {
                        path: path.clone(),
                        reason: format!(
                            "tensor `{name}` is also in {}: a tensor must be in one shard only",
                            shards.paths[first].display()
                        ),
                    });
                }
                owner.insert(name, i);
            }
            files.push(st);
        }
        for (tensor, path) in &shards.named {
            let i = shards.paths.iter().position(|p| p == path);
            if i.is_none() || i != owner.get(tensor).copied() {
                return Err(ModelError::ConfigField {
                    path: folder.join(INDEX),
                    field: format!("weight_map.{tensor}"),
                    expected: "the shard that holds the tensor".into(),
                    found: format!("{}, which does not hold it", path.display()),
                });
            }
        }
        let owner = decoder_names(owner, &shards.paths)?;
        Ok(Self {
            folder: folder.to_path_buf(),
            paths: shards.paths,
            files,
            owner,
        })
    }

    /// The shape of a tensor as stored.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.info(name)?.shape.clone())
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        let stored = self.stored(name)?;
        Ok(&self.files[stored.file].tensors[&stored.name])
    }

    fn stored(&self, name: &str) -> Result<&Stored> {
        self.owner
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                folder: self.folder.clone(),
                name: name.to_string(),
            })
    }

    /// The candle dtype a tensor is stored in; a type that is not floating
    /// point is refused: an integer tensor of the right size would
    /// otherwise be converted to floats and load as silently wrong weights.
    fn stored_float(&self, name: &str) -> Result<DType> {
        use safetensors::Dtype;
        let i = self.stored(name)?.file;
        match self.info(name)?.dtype {
            Dtype::F16 => Ok(DType::F16),
            Dtype::BF16 => Ok(DType::BF16),
            Dtype::F32 => Ok(DType::F32),
            Dtype::F64 => Ok(DType::F64),
            other => Err(ModelError::Safetensors {
                path: self.paths[i].clone(),
                reason: format!(
                    "tensor `{name}` is stored as {other:?}; model weights must be \
                     floating point (F32, F16, BF16 or F64)"
                ),
            }),
        }
    }
}

impl WeightSource for WeightFiles {
    /// The model folder the weights were opened from.
    fn folder(&self) -> &Path {
        &self.folder
    }

    /// Whether the weights hold a tensor of this name.
    fn contains(&self, name: &str) -> bool {
        self.owner.contains_key(name)
    }

    /// Load tensor `name`, check that its shape is `expected`, convert it to
    /// `dtype` and place it on `device`.
    fn load(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let found = self.shape(name)?;
        if found != expected {
            return Err(ModelError::TensorShape {
                folder: self.folder.clone(),
                config: "config.json",
                name: name.to_string(),
                expected: expected.to_vec(),
                found,
            });
        }
        let stored_dtype = self.stored_float(name)?;
        let stored = self.stored(name)?;
        let file = &self.files[stored.file];
        Ok(file
            .load(&stored.name, stored_dtype, device)?
            .to_dtype(dtype)?)
    }
}

/// The names the decoder asks for, from each stored tensor's file: the
/// stored names themselves, or, where the checkpoint is multimodal (some
/// tensor under one of [`TEXT_DECODER_PREFIXES`]), the text decoder's
/// tensors under `model.` and the LM head (`lm_head.weight`, or
/// transformers 4's `language_model.lm_head.weight`), without the towers'.
/// A checkpoint holding decoder tensors under two of those names, or two
/// heads, is refused (which would it run?).
fn decoder_names(
    owner: HashMap<String, usize>,
    paths: &[PathBuf],
) -> Result<HashMap<String, Stored>> {
    let Some(prefix) = TEXT_DECODER_PREFIXES
        .into_iter()
        .find(|p| owner.keys().any(|n| n.starts_with(p)))
    else {
        let names = owner
            .into_iter()
            .map(|(name, file)| (name.clone(), Stored { file, name }))
            .collect();
        return Ok(names);
    };
    let mixed = |stored: &str, file: usize| ModelError::Safetensors {
        path: paths[file].clone(),
        reason: format!(
            "tensor `{stored}` is a text decoder's, but this multimodal checkpoint keeps its \
             decoder under `{prefix}`: the folder mixes two layouts"
        ),
    };
    let mut names = HashMap::with_capacity(owner.len());
    for (stored, file) in owner {
        let name = match stored.strip_prefix(prefix) {
            Some(rest) => format!("model.{rest}"),
            None if stored == "lm_head.weight" || stored == WRAPPED_HEAD => "lm_head.weight".into(),
            None if is_decoder_name(&stored) => return Err(mixed(&stored, file)),
            None => continue,
        };
        if names.contains_key(&name) {
            return Err(mixed(&stored, file));
        }
        names.insert(name, Stored { file, name: stored });
    }
    Ok(names)
}

/// Whether a stored name outside the checkpoint's text-decoder prefix is
/// one a text decoder's would be (its layers, embeddings, final norm or
/// Gemma 4's per-layer inputs, under `model.` or another of
/// [`TEXT_DECODER_PREFIXES`]), not a tower's.
fn is_decoder_name(name: &str) -> bool {
    ["model."]
        .into_iter()
        .chain(TEXT_DECODER_PREFIXES)
        .any(|prefix| {
            name.strip_prefix(prefix).is_some_and(|rest| {
                ["layers.", "embed_tokens", "norm.", "per_layer_"]
                    .iter()
                    .any(|p| rest.starts_with(p))
            })
        })
}

/// The weight files of a folder, and which shard the index names for each
/// tensor (empty for a single file).
struct Shards {
    paths: Vec<PathBuf>,
    named: Vec<(String, PathBuf)>,
}

fn shard_paths(folder: &Path) -> Result<Shards> {
    let single = folder.join(SINGLE);
    if single.exists() {
        return Ok(Shards {
            paths: vec![single],
            named: vec![],
        });
    }
    let index = folder.join(INDEX);
    if !index.exists() {
        return Err(ModelError::MissingFile {
            path: single,
            what: format!("the weights (neither {SINGLE} nor {INDEX} is in the folder)"),
        });
    }
    let text = std::fs::read_to_string(&index).map_err(|source| ModelError::Io {
        path: index.clone(),
        source,
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: index.clone(),
        source,
    })?;
    let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
        return Err(ModelError::ConfigField {
            path: index,
            field: "weight_map".into(),
            expected: "an object from tensor name to shard file".into(),
            found: "nothing usable".into(),
        });
    };
    let mut shards: Vec<PathBuf> = Vec::new();
    let mut named = Vec::with_capacity(map.len());
    for (tensor, file) in map {
        let Some(file) = file.as_str().filter(|f| is_plain_file_name(f)) else {
            return Err(ModelError::ConfigField {
                path: index,
                field: format!("weight_map.{tensor}"),
                expected: "the file name of a shard in the model folder".into(),
                found: file.to_string(),
            });
        };
        let path = folder.join(file);
        if !shards.contains(&path) {
            shards.push(path.clone());
        }
        named.push((tensor.clone(), path));
    }
    for path in &shards {
        // a regular file only: a folder, a device or a pipe named by a
        // damaged index would fail late or block the open
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.clone(),
                what: format!("a shard named in {INDEX}"),
            });
        }
    }
    shards.sort();
    Ok(Shards {
        paths: shards,
        named,
    })
}

/// A shard is named by its file name alone: no folder, no `..`, not absolute.
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    )
}

/// Why `path` cannot be a whole safetensors file, when its length shows it:
/// empty, shorter than its header, or shorter than the tensors its header
/// lists. The parser's own words for these ("header too small", "incomplete
/// metadata") do not say that the file is cut short.
fn truncation(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    if len == 0 {
        return Some("the file is empty (0 bytes)".into());
    }
    if len < 8 {
        return Some(format!(
            "the file is only {len} bytes long, too short for the 8-byte header size: \
             it is truncated or not a safetensors file"
        ));
    }
    let mut size = [0u8; 8];
    file.read_exact(&mut size).ok()?;
    let header_len = u64::from_le_bytes(size);
    if header_len > len - 8 {
        return Some(format!(
            "the file is {len} bytes long but its header alone needs {} bytes: \
             it is truncated or not a safetensors file",
            header_len.saturating_add(8)
        ));
    }
    let mut header = vec![0u8; usize::try_from(header_len).ok()?];
    file.read_exact(&mut header).ok()?;
    let header: Value = serde_json::from_slice(&header).ok()?;
    let data_end = header
        .as_object()?
        .values()
        .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let needed = data_end.saturating_add(8 + header_len);
    (needed > len).then(|| {
        format!("the file is {len} bytes long but its tensors need {needed} bytes: it is truncated")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_of(stored: &[&str]) -> Result<Vec<(String, String)>> {
        let owner = stored.iter().map(|n| (n.to_string(), 0)).collect();
        let mut names: Vec<(String, String)> =
            decoder_names(owner, &[PathBuf::from("m/model.safetensors")])?
                .into_iter()
                .map(|(name, s)| (name, s.name))
                .collect();
        names.sort();
        Ok(names)
    }

    #[test]
    fn a_multimodal_checkpoint_is_read_as_its_text_decoder() {
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        // a text-only checkpoint is read by its own names
        assert_eq!(
            names_of(&["model.norm.weight", "lm_head.weight"]).unwrap(),
            vec![
                pair("lm_head.weight", "lm_head.weight"),
                pair("model.norm.weight", "model.norm.weight")
            ]
        );
        // a wrapper's decoder under its own names, the LM head kept, the
        // towers and the multi-token prediction layers not read
        assert_eq!(
            names_of(&[
                "model.language_model.layers.0.mlp.up_proj.weight",
                "model.language_model.embed_tokens.weight",
                "model.vision_tower.encoder.layers.0.mlp.up_proj.weight",
                "model.visual.blocks.0.attn.qkv.weight",
                "model.embed_vision.embedding_projection.weight",
                "mtp.layers.0.mlp.up_proj.weight",
                "lm_head.weight",
            ])
            .unwrap(),
            vec![
                pair("lm_head.weight", "lm_head.weight"),
                pair(
                    "model.embed_tokens.weight",
                    "model.language_model.embed_tokens.weight"
                ),
                pair(
                    "model.layers.0.mlp.up_proj.weight",
                    "model.language_model.layers.0.mlp.up_proj.weight"
                ),
            ]
        );
        // a decoder tensor outside the wrapper's prefix too: which to run?
        let err = names_of(&[
            "model.language_model.norm.weight",
            "model.layers.0.mlp.up_proj.weight",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("model.layers.0.mlp.up_proj.weight")
                && err.contains("model.language_model."),
            "{err}"
        );
        // transformers 4's layout (Gemma 3's published folders), its untied
        // head under the language model
        assert_eq!(
            names_of(&[
                "language_model.model.norm.weight",
                "language_model.lm_head.weight",
                "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
                "multi_modal_projector.mm_input_projection_weight",
            ])
            .unwrap(),
            vec![
                pair("lm_head.weight", "language_model.lm_head.weight"),
                pair("model.norm.weight", "language_model.model.norm.weight"),
            ]
        );
        // the two layouts, a per-layer input outside the wrapper, or two
        // heads: refused by the tensor
        for (names, culprit) in [
            (
                &[
                    "model.language_model.norm.weight",
                    "language_model.model.layers.0.x",
                ][..],
                "language_model.model.layers.0.x",
            ),
            (
                &[
                    "model.language_model.norm.weight",
                    "model.per_layer_model_projection.weight",
                ],
                "model.per_layer_model_projection.weight",
            ),
            (
                &[
                    "language_model.model.norm.weight",
                    "language_model.lm_head.weight",
                    "lm_head.weight",
                ],
                "lm_head.weight",
            ),
        ] {
            let err = names_of(names).unwrap_err().to_string();
            assert!(
                err.contains(culprit) && err.contains("two layouts"),
                "{err}"
            );
        }
    }
}
