//! The files a random model is written as, one module per format. Every
//! file goes to a temporary name and is renamed when complete, and a model
//! written to a new path appears there whole or not at all; the weights are
//! drawn and written a slice of rows at a time, so writing an 8B model holds
//! a few tens of MB, never the model.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{Result, SynthError};
use crate::shapes::ModelShape;

pub mod gguf;
pub mod gguf_file;
pub mod hf_folder;
pub mod safetensors;

/// A format a random model can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Hugging Face folder, weights in f32.
    SafetensorsF32,
    /// A Hugging Face folder, weights in bfloat16 (as checkpoints are
    /// published).
    SafetensorsBf16,
    /// A GGUF file, matrices in Q4_0 (the LM head in Q6_K, as llama.cpp
    /// quantizes it).
    GgufQ4_0,
    /// A GGUF file, matrices in Q4_K (the LM head in Q6_K).
    GgufQ4K,
    /// A GGUF file mixed as llama.cpp's Q4_K_M (what Ollama serves):
    /// matrices in Q4_K, the LM head in Q6_K, and the V and down
    /// projections (experts' too) of the first and last eighth of the
    /// layers and of every third layer between in Q6_K
    /// ([`gguf::more_bits`]); with exactly 8 experts, K and V in Q8_0 and
    /// the attention output in Q5_K ([`gguf::eight_experts_type`]).
    GgufQ4KM,
    /// A GGUF file, every matrix in Q8_0, the output matrix too (as
    /// llama.cpp's Q8_0 keeps it).
    GgufQ8_0,
    /// A GGUF file as gpt-oss's own are: the experts in MXFP4, every other
    /// matrix in Q8_0 (what llama.cpp's converter writes from gpt-oss's
    /// checkpoint); a shape without experts is written as in Q8_0.
    GgufMxfp4,
}

impl Format {
    /// Every format, in the order help lists them.
    pub const ALL: [Format; 7] = [
        Format::SafetensorsBf16,
        Format::SafetensorsF32,
        Format::GgufQ4_0,
        Format::GgufQ4K,
        Format::GgufQ4KM,
        Format::GgufQ8_0,
        Format::GgufMxfp4,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::SafetensorsF32 => "safetensors-f32",
            Format::SafetensorsBf16 => "safetensors-bf16",
            Format::GgufQ4_0 => "gguf-q4_0",
            Format::GgufQ4K => "gguf-q4_k",
            Format::GgufQ4KM => "gguf-q4_k_m",
            Format::GgufQ8_0 => "gguf-q8_0",
            Format::GgufMxfp4 => "gguf-mxfp4",
        }
    }

    /// Whether it is a single GGUF file (otherwise a model folder).
    pub fn is_gguf(self) -> bool {
        matches!(
            self,
            Format::GgufQ4_0
                | Format::GgufQ4K
                | Format::GgufQ4KM
                | Format::GgufQ8_0
                | Format::GgufMxfp4
        )
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        Format::ALL
            .into_iter()
            .find(|f| f.name() == wanted)
            .ok_or_else(|| SynthError::UnknownFormat {
                name: s.to_string(),
                known: Format::ALL.map(Format::name).join(", "),
            })
    }
}

/// Hugging Face's default largest shard (`max_shard_size="5GB"`).
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

/// How a random model is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Seed of the weights.
    pub seed: u64,
    /// Largest safetensors shard, bytes; a larger model is split into
    /// `model-0000i-of-0000n.safetensors` with an index, as Hugging Face
    /// writes it.
    pub max_shard_bytes: u64,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            seed: 0,
            max_shard_bytes: DEFAULT_SHARD_BYTES,
        }
    }
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The model: a folder or a GGUF file.
    pub path: PathBuf,
    /// Bytes of weights written.
    pub weight_bytes: u64,
    /// The files, relative to `path` for a folder.
    pub files: Vec<PathBuf>,
}

/// Progress of a write: bytes of weights written and in all.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// Write a random model of `shape` in `format` to `out`, a path that must
/// not exist yet (a folder for safetensors, a file for GGUF). The model is
/// assembled under a temporary name beside `out` and renamed into place
/// when complete; on an error the temporary is removed and nothing is left.
pub fn write_model(
    shape: &ModelShape,
    format: Format,
    out: &Path,
    opts: &WriteOptions,
    progress: Progress<'_>,
) -> Result<Written> {
    shape.config()?;
    let partial = Partial::beside(out)?;
    let files = if format.is_gguf() {
        gguf::write(shape, format, partial.path(), opts.seed, progress)?;
        vec![]
    } else {
        std::fs::create_dir(partial.path()).map_err(|e| SynthError::io(partial.path(), e))?;
        hf_folder::write(shape, format, partial.path(), opts, progress)?
    };
    let weight_bytes = match format {
        Format::SafetensorsF32 => shape.parameter_count() * 4,
        Format::SafetensorsBf16 => shape.parameter_count() * 2,
        _ => gguf::plan(shape, format)?.data_bytes(),
    };
    partial.commit()?;
    Ok(Written {
        path: out.to_path_buf(),
        weight_bytes,
        files,
    })
}

/// A temporary path beside the output, removed unless committed.
struct Partial {
    tmp: PathBuf,
    out: PathBuf,
    committed: bool,
}

impl Partial {
    /// `.NAME.partial-PID` in `out`'s folder, after checking that `out` is
    /// free and its folder exists.
    fn beside(out: &Path) -> Result<Self> {
        if out.symlink_metadata().is_ok() {
            return Err(SynthError::OutputExists {
                path: out.to_path_buf(),
            });
        }
        let name = out.file_name().ok_or_else(|| {
            SynthError::io(
                out,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file"),
            )
        })?;
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            return Err(SynthError::io(
                &parent,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder"),
            ));
        }
        let tmp = parent.join(format!(
            ".{}.partial-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        Ok(Self {
            tmp,
            out: out.to_path_buf(),
            committed: false,
        })
    }

    fn path(&self) -> &Path {
        &self.tmp
    }

    /// Rename the finished temporary to the output.
    fn commit(mut self) -> Result<()> {
        if self.out.symlink_metadata().is_ok() {
            return Err(SynthError::OutputExists {
                path: self.out.clone(),
            });
        }
        std::fs::rename(&self.tmp, &self.out).map_err(|e| SynthError::io(&self.out, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            // best effort: the temporary may never have been created
            let _ = std::fs::remove_dir_all(&self.tmp);
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Rename `from` to `to`, the error naming `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| SynthError::io(to, e))
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    lcut_model::lora::write_atomic(path, bytes).map_err(|e| SynthError::io(path, e))
}

/// Rows per slice of a tensor with rows of `cols` values: about 8M values
/// (32 MB of f32) at a time.
pub(crate) fn rows_per_slice(cols: usize) -> usize {
    ((8 << 20) / cols.max(1)).max(1)
}
