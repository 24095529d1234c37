//! Safetensors files written a slice of rows at a time: the header (every
//! tensor's dtype, shape and offsets) is known from the shape before any
//! weight is drawn, so the data can follow as it is drawn. A model larger
//! than the shard size is split as Hugging Face splits it, with
//! `model.safetensors.index.json` naming each tensor's shard.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::bf16;
use serde_json::{Map, Value, json};

use super::{Progress, rename, rows_per_slice, write_atomic};
use crate::draw;
use crate::error::{Result, SynthError};
use crate::shapes::TensorSpec;

/// The dtype weights are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredDtype {
    /// 32-bit floats.
    F32,
    /// bfloat16 (rounded to nearest even, as torch rounds).
    Bf16,
}

impl StoredDtype {
    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::Bf16 => 2,
        }
    }

    fn header_name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::Bf16 => "BF16",
        }
    }

    fn push_bytes(self, values: &[f32], out: &mut Vec<u8>) {
        out.clear();
        match self {
            StoredDtype::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
            StoredDtype::Bf16 => {
                out.extend(values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()))
            }
        }
    }
}

/// The shards of a model: tensor indices per file, split as Hugging Face's
/// `split_torch_state_dict_into_shards` splits them (a new shard when the
/// next tensor would take the current one past `max_bytes`).
pub fn plan_shards(tensors: &[TensorSpec], dtype: StoredDtype, max_bytes: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = vec![];
    let mut size = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let bytes = (t.len() * dtype.size()) as u64;
        match shards.last_mut() {
            Some(current) if size + bytes <= max_bytes => current.push(i),
            _ => {
                shards.push(vec![i]);
                size = 0;
            }
        }
        size += bytes;
    }
    shards
}

/// The file names of `n` shards (`model.safetensors` when there is one).
pub fn shard_names(n: usize) -> Vec<String> {
    if n == 1 {
        return vec!["model.safetensors".into()];
    }
    (1..=n)
        .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
        .collect()
}

/// Write the weights of `tensors` drawn from `seed` into `folder` in
/// `dtype`, split into shards of at most `max_bytes`; returns the files
/// written (the index last, when there is one).
pub fn write_weights(
    folder: &Path,
    tensors: &[TensorSpec],
    (dtype, seed, max_bytes): (StoredDtype, u64, u64),
    progress: Progress<'_>,
) -> Result<Vec<PathBuf>> {
    let shards = plan_shards(tensors, dtype, max_bytes);
    let names = shard_names(shards.len());
    let total: u64 = tensors
        .iter()
        .map(|t| (t.len() * dtype.size()) as u64)
        .sum();
    let mut done = 0u64;
    let mut weight_map = Map::new();
    for (shard, name) in shards.iter().zip(&names) {
        let members: Vec<&TensorSpec> = shard.iter().map(|&i| &tensors[i]).collect();
        let path = folder.join(name);
        write_file(&path, &members, (dtype, seed), &mut |n| {
            done += n;
            progress(done, total);
        })?;
        for t in members {
            weight_map.insert(t.name.clone(), json!(name));
        }
    }
    let mut files: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    if shards.len() > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let text = serde_json::to_string_pretty(&index).unwrap_or_default();
        write_atomic(
            &folder.join("model.safetensors.index.json"),
            text.as_bytes(),
        )?;
        files.push("model.safetensors.index.json".into());
    }
    Ok(files)
}

/// The header of a file holding `tensors` in order: its JSON, padded with
/// spaces to a multiple of 8 bytes as the safetensors writer pads it.
fn header(tensors: &[&TensorSpec], dtype: StoredDtype) -> Vec<u8> {
    let mut map = Map::new();
    map.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for t in tensors {
        let end = offset + t.len() * dtype.size();
        map.insert(
            t.name.clone(),
            json!({"dtype": dtype.header_name(), "shape": t.dims, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut bytes = Value::Object(map).to_string().into_bytes();
    while !bytes.len().is_multiple_of(8) {
        bytes.push(b' ');
    }
    bytes
}

/// One safetensors file: header, then each tensor's rows as drawn.
fn write_file(
    path: &Path,
    tensors: &[&TensorSpec],
    (dtype, seed): (StoredDtype, u64),
    on_bytes: &mut dyn FnMut(u64),
) -> Result<()> {
    let tmp = path.with_extension("safetensors.partial");
    let io = |e| SynthError::io(&tmp, e);
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = BufWriter::with_capacity(8 << 20, file);
    let head = header(tensors, dtype);
    w.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&head).map_err(io)?;
    let mut bytes = Vec::new();
    for t in tensors {
        let (rows, cols) = (t.rows(), t.cols());
        let step = rows_per_slice(cols);
        for start in (0..rows).step_by(step) {
            let values = draw::rows(seed, &t.name, t.kind, cols, start..(start + step).min(rows));
            dtype.push_bytes(&values, &mut bytes);
            w.write_all(&bytes).map_err(io)?;
            on_bytes(bytes.len() as u64);
        }
    }
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    drop(file);
    rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::TensorKind;

    fn spec(name: &str, rows: usize) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dims: vec![rows, 1],
            kind: TensorKind::Matrix,
        }
    }

    /// Shards fill up to the limit in order; a tensor larger than the
    /// limit gets a shard of its own.
    #[test]
    fn shards_split_as_hugging_face_splits_them() {
        let t = [spec("a", 10), spec("b", 10), spec("c", 30), spec("d", 1)];
        // 40, 40, 120, 4 bytes in f32 against a limit of 100
        let plan = plan_shards(&t, StoredDtype::F32, 100);
        assert_eq!(plan, vec![vec![0, 1], vec![2], vec![3]]);
        assert_eq!(
            plan_shards(&t, StoredDtype::F32, 1000),
            vec![vec![0, 1, 2, 3]]
        );
        assert_eq!(shard_names(1), vec!["model.safetensors"]);
        assert_eq!(shard_names(3)[1], "model-00002-of-00003.safetensors");
    }
}
