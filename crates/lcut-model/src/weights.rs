//! Memory-mapped safetensors weights (one file or a sharded index) with
//! named errors for missing tensors and wrong shapes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// The weight files of one model folder.
pub struct WeightFiles {
    folder: PathBuf,
    files: Vec<MmapedSafetensors>,
    owner: HashMap<String, usize>,
}

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

impl WeightFiles {
    /// Open `model.safetensors`, or every shard named by
    /// `model.safetensors.index.json`, memory-mapped.
    pub fn open(folder: &Path) -> Result<Self> {
        let paths = shard_paths(folder)?;
        let mut files = Vec::with_capacity(paths.len());
        let mut owner = HashMap::new();
        for (i, path) in paths.iter().enumerate() {
            let st = open_mmaped(path)?;
            for (name, _) in st.tensors() {
                owner.insert(name, i);
            }
            files.push(st);
        }
        Ok(Self {
            folder: folder.to_path_buf(),
            files,
            owner,
        })
    }

    /// Whether the weights hold a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.owner.contains_key(name)
    }

    /// The shape of a tensor as stored.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        let file = self.file_of(name)?;
        let view = file.get(name)?;
        Ok(view.shape().to_vec())
    }

    /// Load tensor `name`, check that its shape is `expected`, convert it to
    /// `dtype` and place it on `device`.
    pub fn load(
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
                name: name.to_string(),
                expected: expected.to_vec(),
                found,
            });
        }
        let tensor = self.file_of(name)?.load(name, device)?;
        Ok(tensor.to_dtype(dtype)?)
    }

    fn file_of(&self, name: &str) -> Result<&MmapedSafetensors> {
        self.owner
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| ModelError::MissingTensor {
                folder: self.folder.clone(),
                name: name.to_string(),
            })
    }
}

fn shard_paths(folder: &Path) -> Result<Vec<PathBuf>> {
    let single = folder.join(SINGLE);
    if single.exists() {
        return Ok(vec![single]);
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
    for (tensor, file) in map {
        let Some(file) = file.as_str() else {
            return Err(ModelError::ConfigField {
                path: index,
                field: format!("weight_map.{tensor}"),
                expected: "a shard file name".into(),
                found: file.to_string(),
            });
        };
        let path = folder.join(file);
        if !shards.contains(&path) {
            shards.push(path);
        }
    }
    for path in &shards {
        if !path.exists() {
            return Err(ModelError::MissingFile {
                path: path.clone(),
                what: format!("a shard named in {INDEX}"),
            });
        }
    }
    shards.sort();
    Ok(shards)
}

#[allow(unsafe_code)]
fn open_mmaped(path: &Path) -> Result<MmapedSafetensors> {
    // SAFETY: the file is mapped read-only; lcut never writes to a model
    // folder while a model from it is loaded. A file changed underneath by
    // another process is the one case memory mapping cannot guard against.
    unsafe { MmapedSafetensors::new(path) }.map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
