//! `--save-lens-logits`: every decode step's logit-lens logits [sites,
//! vocab] streamed into one safetensors file, so that memory holds one
//! step's logits, never the run's.
//!
//! The file is written as `NAME.partial` and renamed when complete. Its
//! header's place is reserved at the start (the safetensors format allows
//! the header's JSON to be padded with spaces), the data follows as it
//! comes, and the header is written last. Per prompt `I` (its index in the
//! prompt set) the file holds `prompt.I.logits` f32 [steps, L + 1, vocab]
//! (site 0 the embeddings, site `l + 1` the output of layer `l`),
//! `prompt.I.tokens` i64 [steps] (each step's token) and
//! `prompt.I.positions` i64 [steps] (its query position).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::error::{EngineError, Result};

/// Header bytes reserved per tensor (a name, dtype, shape and offsets take
/// well under this).
const HEADER_PER_TENSOR: usize = 160;

/// A safetensors file being written tensor by tensor.
pub struct LensLogitsFile {
    path: PathBuf,
    partial: PathBuf,
    out: BufWriter<File>,
    reserved: usize,
    header: Map<String, Value>,
    /// Bytes of data written so far.
    offset: u64,
    /// Where the open tensor's data began, and its bytes so far.
    open: Option<(u64, u64)>,
}

fn io_err<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> EngineError + 'a {
    move |source| EngineError::LensLogits {
        path: path.to_path_buf(),
        reason: format!("{action}: {source}"),
    }
}

impl LensLogitsFile {
    /// Start `path` for at most `max_tensors` tensors; `metadata` goes into
    /// the header's `__metadata__`.
    pub fn create(path: &Path, max_tensors: usize, metadata: &[(&str, String)]) -> Result<Self> {
        let partial = path.with_extension("safetensors.partial");
        let file = File::create(&partial).map_err(io_err(&partial, "creating"))?;
        let meta: Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::String(v.clone())))
            .collect();
        let reserved = (1024
            + meta
                .iter()
                .map(|(k, v)| k.len() + v.to_string().len() + 8)
                .sum::<usize>()
            + HEADER_PER_TENSOR * max_tensors)
            .next_multiple_of(8);
        let mut header = Map::new();
        header.insert("__metadata__".into(), Value::Object(meta));
        let mut out = BufWriter::new(file);
        out.write_all(&vec![b' '; 8 + reserved])
            .map_err(io_err(&partial, "writing"))?;
        Ok(Self {
            path: path.to_path_buf(),
            partial,
            out,
            reserved,
            header,
            offset: 0,
            open: None,
        })
    }

    /// Append f32 values to the open tensor (opening one when none is).
    pub fn append_f32(&mut self, values: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.append(&bytes)
    }

    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(io_err(&self.partial, "writing"))?;
        let (start, len) = self.open.unwrap_or((self.offset, 0));
        self.open = Some((start, len + bytes.len() as u64));
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// Close the open tensor as `name` of `dtype` (`F32`, `I64`) and
    /// `shape`, which must account for exactly the bytes appended.
    pub fn close(&mut self, name: &str, dtype: &str, shape: &[usize]) -> Result<()> {
        let (start, len) = self.open.take().unwrap_or((self.offset, 0));
        let width = if dtype == "I64" { 8 } else { 4 };
        let want = shape.iter().product::<usize>() as u64 * width;
        if want != len {
            return Err(EngineError::LensLogits {
                path: self.path.clone(),
                reason: format!(
                    "tensor {name}: shape {shape:?} of {dtype} needs {want} bytes, {len} were written"
                ),
            });
        }
        self.header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, start + len]}),
        );
        Ok(())
    }

    /// Write `values` as the i64 tensor `name` `[len]`.
    pub fn write_i64(&mut self, name: &str, values: &[i64]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.append(&bytes)?;
        self.close(name, "I64", &[values.len()])
    }

    /// Write the header into its reserved place and rename the file into
    /// place; returns the path and the bytes written.
    pub fn finish(mut self) -> Result<(PathBuf, u64)> {
        let text = serde_json::to_string(&Value::Object(std::mem::take(&mut self.header)))
            .map_err(|e| EngineError::LensLogits {
                path: self.path.clone(),
                reason: format!("encoding the header: {e}"),
            })?;
        if text.len() > self.reserved {
            return Err(EngineError::LensLogits {
                path: self.path.clone(),
                reason: format!(
                    "the header of {} bytes outgrew the {} reserved",
                    text.len(),
                    self.reserved
                ),
            });
        }
        let mut header = text.into_bytes();
        header.resize(self.reserved, b' ');
        let partial = self.partial.clone();
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| io_err(&partial, "writing")(e.into_error()))?;
        file.seek(SeekFrom::Start(0))
            .map_err(io_err(&partial, "writing"))?;
        file.write_all(&(self.reserved as u64).to_le_bytes())
            .and_then(|()| file.write_all(&header))
            .and_then(|()| file.sync_all())
            .map_err(io_err(&partial, "writing"))?;
        drop(file);
        std::fs::rename(&partial, &self.path).map_err(io_err(&self.path, "renaming onto"))?;
        Ok((self.path, 8 + self.reserved as u64 + self.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_tensors_read_back_with_candle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lens.safetensors");
        let mut f = LensLogitsFile::create(&path, 4, &[("sites", "3".into())]).unwrap();
        f.append_f32(&[1.0, 2.0, 3.0]).unwrap();
        f.append_f32(&[4.0, 5.0, 6.0]).unwrap();
        f.close("prompt.0.logits", "F32", &[2, 3]).unwrap();
        f.write_i64("prompt.0.tokens", &[7, 9]).unwrap();
        assert!(
            f.close("bad", "F32", &[1]).is_err(),
            "nothing open: 0 bytes"
        );
        assert!(!path.exists(), "only the partial file exists before finish");
        let (p, bytes) = f.finish().unwrap();
        assert_eq!(p, path);
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        let t = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
        let logits: Vec<Vec<f32>> = t["prompt.0.logits"].to_vec2().unwrap();
        assert_eq!(logits, vec![vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0]]);
        let tokens: Vec<i64> = t["prompt.0.tokens"].to_vec1().unwrap();
        assert_eq!(tokens, vec![7, 9]);
    }
}
