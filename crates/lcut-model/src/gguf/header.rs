//! The GGUF header (versions 2 and 3): metadata and tensor directory, read
//! from a memory-mapped file with every length checked against the bytes
//! that remain before anything is allocated for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use lcut_kernels::quant::QuantFormat;

use crate::error::{ModelError, Result};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the tensor data when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on tensor rank.
const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are refused (real files nest at most once).
const MAX_NESTING: usize = 2;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Unsigned integer (u8, u16, u32 or u64 in the file).
    UInt(u64),
    /// Signed integer (i8, i16, i32 or i64 in the file).
    Int(i64),
    /// Float (f32 or f64 in the file).
    Float(f64),
    /// Boolean.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of values.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as a non-negative integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::UInt(n) => Some(n),
            MetaValue::Int(n) => u64::try_from(n).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::Float(x) => Some(x),
            MetaValue::UInt(n) => Some(n as f64),
            MetaValue::Int(n) => Some(n as f64),
            _ => None,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(xs) => Some(xs),
            _ => None,
        }
    }

    /// A short description of the value for error messages (arrays by length).
    pub fn describe(&self) -> String {
        match self {
            MetaValue::UInt(n) => n.to_string(),
            MetaValue::Int(n) => n.to_string(),
            MetaValue::Float(x) => x.to_string(),
            MetaValue::Bool(b) => b.to_string(),
            MetaValue::Str(s) if s.len() > 60 => format!("a string of {} bytes", s.len()),
            MetaValue::Str(s) => format!("{s:?}"),
            MetaValue::Array(xs) => format!("an array of {} values", xs.len()),
        }
    }
}

/// Where one tensor lies in the file and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Dimensions in candle's order (outermost first: [rows, columns]);
    /// the file stores them innermost first.
    pub shape: Vec<usize>,
    /// The storage type as the file names it (ggml type id).
    pub type_id: u32,
    /// The type, when candle implements it.
    pub dtype: Option<GgmlDType>,
    /// Absolute byte offset of the data in the file.
    pub start: usize,
    /// Bytes of data (0 when the type is unknown).
    pub len: usize,
}

/// The parsed header of a GGUF file.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata, by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensors, by name.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// Bytes from the start of the file to the end of the tensor directory
    /// (what identifies the model, without its tensor data).
    pub header_len: usize,
}

/// The ggml type of a type id, for the types candle implements.
pub fn ggml_dtype(type_id: u32) -> Option<GgmlDType> {
    Some(match type_id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// ggml's name of a type id (for messages about types lcut cannot run).
pub fn ggml_type_name(type_id: u32) -> String {
    const NAMES: [&str; 42] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
        "NVFP4",
        "Q1_0",
    ];
    NAMES.get(type_id as usize).map_or_else(
        || format!("type {type_id}"),
        |n| format!("{n} (type {type_id})"),
    )
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn truncated(&self, what: &str, needed: usize) -> ModelError {
        ModelError::GgufTruncated {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            offset: self.pos,
            needed,
            file_len: self.bytes.len(),
        }
    }

    fn malformed(&self, reason: String) -> ModelError {
        ModelError::GgufMalformed {
            path: self.path.to_path_buf(),
            offset: self.pos,
            reason,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count that must fit in what remains, `unit` bytes each at least.
    fn count(&mut self, what: &str, unit: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .is_some_and(|bytes| bytes <= self.remaining());
        if !fits {
            return Err(self.malformed(format!(
                "{what} claims {n} (at least {unit} byte(s) each) but only {} bytes remain in the file",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.count(&format!("the length of {what}"), 1)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ModelError::GgufMalformed {
            path: self.path.to_path_buf(),
            offset: at,
            reason: format!("{what} is not valid UTF-8"),
        })
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<MetaValue> {
        let what = || format!("the value of `{key}`");
        Ok(match type_id {
            0 => MetaValue::UInt(u64::from(self.array::<1>(&what())?[0])),
            1 => MetaValue::Int(i64::from(i8::from_le_bytes(self.array(&what())?))),
            2 => MetaValue::UInt(u64::from(u16::from_le_bytes(self.array(&what())?))),
            3 => MetaValue::Int(i64::from(i16::from_le_bytes(self.array(&what())?))),
            4 => MetaValue::UInt(u64::from(self.u32(&what())?)),
            5 => MetaValue::Int(i64::from(i32::from_le_bytes(self.array(&what())?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.array(&what())?))),
            7 => match self.array::<1>(&what())?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.malformed(format!("`{key}` is a bool of value {b}"))),
            },
            8 => MetaValue::Str(self.string(&what())?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self
                        .malformed(format!("`{key}` nests arrays more than {MAX_NESTING} deep")));
                }
                let elem_type = self.u32(&format!("the element type of `{key}`"))?;
                let unit = elem_size(elem_type).ok_or_else(|| {
                    self.malformed(format!("`{key}` has elements of unknown type {elem_type}"))
                })?;
                let n = self.count(&format!("the element count of `{key}`"), unit)?;
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.value(elem_type, key, depth + 1)?);
                }
                MetaValue::Array(out)
            }
            10 => MetaValue::UInt(self.u64(&what())?),
            11 => MetaValue::Int(i64::from_le_bytes(self.array(&what())?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.array(&what())?)),
            other => {
                return Err(self.malformed(format!("`{key}` has unknown value type {other}")));
            }
        })
    }
}

/// The fewest bytes one value of a metadata type takes in the file.
fn elem_size(type_id: u32) -> Option<usize> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8..=12 => 8,
        _ => return None,
    })
}

impl GgufHeader {
    /// Parse the header of `bytes`, the whole file at `path`; checks that
    /// every tensor's data lies inside the file.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let mut c = Cursor {
            bytes,
            pos: 0,
            path,
        };
        let version = c.magic_and_version()?;
        // a tensor entry takes at least 8 (name) + 4 (rank) + 4 (type) + 8 (offset) bytes
        let n_tensors = c.count("the tensor count", 24)?;
        // a metadata entry takes at least 8 (key) + 4 (type) + 1 bytes
        let n_kv = c.count("the metadata count", 13)?;
        let metadata = c.metadata(n_kv)?;
        let raw = (0..n_tensors)
            .map(|i| c.raw_tensor(i))
            .collect::<Result<Vec<_>>>()?;
        let alignment = alignment(&metadata, path)?;
        let header_len = c.pos;
        let data_start = (header_len as u64).div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for t in raw {
            let entry = tensor_entry(path, bytes.len(), data_start, &t)?;
            if tensors.insert(t.name.clone(), entry).is_some() {
                return Err(ModelError::GgufMalformed {
                    path: path.to_path_buf(),
                    offset: t.at,
                    reason: format!("tensor `{}` appears twice", t.name),
                });
            }
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            header_len,
        })
    }
}

impl Cursor<'_> {
    /// The magic number (refused when it is not GGUF's) and the version
    /// (2 or 3).
    fn magic_and_version(&mut self) -> Result<u32> {
        let magic: [u8; 4] = self.array("the magic number")?;
        if magic != GGUF_MAGIC {
            return Err(ModelError::NotGguf {
                path: self.path.to_path_buf(),
                found: magic,
            });
        }
        let version = self.u32("the version")?;
        if version != 2 && version != 3 {
            return Err(ModelError::GgufVersion {
                path: self.path.to_path_buf(),
                version,
            });
        }
        Ok(version)
    }

    /// `n_kv` metadata entries; a key that appears twice is refused.
    fn metadata(&mut self, n_kv: usize) -> Result<BTreeMap<String, MetaValue>> {
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = self.string(&format!("metadata key #{i}"))?;
            let type_id = self.u32(&format!("the type of `{key}`"))?;
            let value = self.value(type_id, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(self.malformed(format!("metadata key `{key}` appears twice")));
            }
        }
        Ok(metadata)
    }

    /// Entry `i` of the tensor directory, its rank checked.
    fn raw_tensor(&mut self, i: usize) -> Result<RawTensor> {
        let at = self.pos;
        let name = self.string(&format!("the name of tensor #{i}"))?;
        let rank = self.u32(&format!("the rank of `{name}`"))?;
        if rank == 0 || rank > MAX_DIMS {
            return Err(self.malformed(format!(
                "tensor `{name}` has rank {rank}; ggml allows 1 to {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            dims.push(self.u64(&format!("the dimensions of `{name}`"))?);
        }
        let type_id = self.u32(&format!("the type of `{name}`"))?;
        let offset = self.u64(&format!("the data offset of `{name}`"))?;
        Ok(RawTensor {
            at,
            name,
            dims,
            type_id,
            offset,
        })
    }
}

/// The data section's alignment: `general.alignment` (a power of two from 8
/// to 2^20) or the default.
fn alignment(metadata: &BTreeMap<String, MetaValue>, path: &Path) -> Result<u64> {
    Ok(match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a >= 8 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                return Err(ModelError::GgufMetadata {
                    path: path.to_path_buf(),
                    key: "general.alignment".into(),
                    expected: "a power of two from 8 to 2^20".into(),
                    found: v.describe(),
                });
            }
        },
    })
}

/// One entry of the tensor directory as the file states it.
struct RawTensor {
    /// Byte offset of the entry in the file.
    at: usize,
    name: String,
    /// Dimensions, innermost first.
    dims: Vec<u64>,
    type_id: u32,
    /// Offset of the data from the start of the data section.
    offset: u64,
}

/// Check one tensor's dimensions, type and data range against the file.
fn tensor_entry(
    path: &Path,
    file_len: usize,
    data_start: u64,
    t: &RawTensor,
) -> Result<TensorEntry> {
    let (name, dims, type_id, offset) = (&t.name, &t.dims, t.type_id, t.offset);
    let bad = |reason: String| ModelError::GgufMalformed {
        path: PathBuf::from(path),
        offset: t.at,
        reason: format!("tensor `{name}`: {reason}"),
    };
    if dims.contains(&0) {
        return Err(bad(format!("has a zero dimension {dims:?}")));
    }
    let elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= file_len as u64 * 64)
        .ok_or_else(|| {
            bad(format!(
                "dimensions {dims:?} are larger than the file can hold"
            ))
        })?;
    let shape: Vec<usize> = dims.iter().rev().map(|&d| d as usize).collect();
    let dtype = ggml_dtype(type_id);
    // candle's types, and those only lcut's kernels read (MXFP4)
    let blocks = match (dtype, QuantFormat::from_ggml_type(type_id)) {
        (Some(dt), _) => Some((dt.block_size(), dt.type_size(), format!("{dt:?}"))),
        (None, Some(f)) => Some((f.block_len(), f.block_bytes(), f.name().to_string())),
        (None, None) => None,
    };
    let len = match blocks {
        None => 0,
        Some((block, bytes, type_name)) => {
            let block = block as u64;
            if !dims[0].is_multiple_of(block) {
                return Err(bad(format!(
                    "its rows of {} values are not whole blocks of {block} ({type_name})",
                    dims[0]
                )));
            }
            elems / block * bytes as u64
        }
    };
    let start = data_start
        .checked_add(offset)
        .filter(|s| s % 8 == 0)
        .ok_or_else(|| bad(format!("data offset {offset} is not 8-byte aligned")))?;
    let end = start.saturating_add(len);
    if end > file_len as u64 {
        return Err(ModelError::GgufTruncated {
            path: path.to_path_buf(),
            what: format!("the data of tensor `{name}`"),
            offset: usize::try_from(start).unwrap_or(usize::MAX),
            needed: usize::try_from(len).unwrap_or(usize::MAX),
            file_len,
        });
    }
    Ok(TensorEntry {
        shape,
        type_id,
        dtype,
        start: start as usize,
        len: len as usize,
    })
}
