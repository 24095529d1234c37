//! The GGUF container (version 3), written the way llama.cpp reads it:
//! magic, version, counts, metadata key/values, tensor infos (dimensions in
//! ggml's innermost-first order), padding to the alignment, then each
//! tensor's data at its aligned offset. The header is written from a plan,
//! so the data can be streamed after it.

use std::io::Write;

/// ggml's default alignment of tensor data (`general.alignment`).
pub const ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `UINT32`.
    U32(u32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING`.
    Str(String),
    /// `ARRAY` of `STRING`.
    Strs(Vec<String>),
    /// `ARRAY` of `INT32`.
    I32s(Vec<i32>),
    /// `ARRAY` of `BOOL` (a byte each).
    Bools(Vec<bool>),
}

impl MetaValue {
    fn type_id(&self) -> u32 {
        match self {
            MetaValue::U32(_) => 4,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Strs(_) | MetaValue::I32s(_) | MetaValue::Bools(_) => 9,
        }
    }

    fn write(&self, w: &mut dyn Write) -> std::io::Result<()> {
        match self {
            MetaValue::U32(v) => w.write_all(&v.to_le_bytes()),
            MetaValue::F32(v) => w.write_all(&v.to_le_bytes()),
            MetaValue::Bool(v) => w.write_all(&[u8::from(*v)]),
            MetaValue::Str(s) => write_str(w, s),
            MetaValue::Strs(xs) => {
                w.write_all(&8u32.to_le_bytes())?;
                w.write_all(&(xs.len() as u64).to_le_bytes())?;
                xs.iter().try_for_each(|s| write_str(w, s))
            }
            MetaValue::I32s(xs) => {
                w.write_all(&5u32.to_le_bytes())?;
                w.write_all(&(xs.len() as u64).to_le_bytes())?;
                xs.iter().try_for_each(|v| w.write_all(&v.to_le_bytes()))
            }
            MetaValue::Bools(xs) => {
                w.write_all(&7u32.to_le_bytes())?;
                w.write_all(&(xs.len() as u64).to_le_bytes())?;
                let bytes: Vec<u8> = xs.iter().map(|b| u8::from(*b)).collect();
                w.write_all(&bytes)
            }
        }
    }
}

fn write_str(w: &mut dyn Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

/// A tensor's entry in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// llama.cpp's name.
    pub name: String,
    /// Dimensions rows first (written innermost first).
    pub dims: Vec<usize>,
    /// ggml type id.
    pub type_id: u32,
    /// Bytes of its data.
    pub bytes: u64,
}

/// `n` rounded up to the alignment.
pub fn align(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Each tensor's data offset (from the start of the data section) and the
/// section's length.
pub fn offsets(tensors: &[TensorInfo]) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offsets = tensors
        .iter()
        .map(|t| {
            let o = align(at);
            at = o + t.bytes;
            o
        })
        .collect();
    (offsets, at)
}

/// Write the header (through the padding before the data) and return its
/// length.
pub fn write_header(
    w: &mut dyn Write,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorInfo],
) -> std::io::Result<u64> {
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        write_str(&mut head, key)?;
        head.extend_from_slice(&value.type_id().to_le_bytes());
        value.write(&mut head)?;
    }
    let (offs, _) = offsets(tensors);
    for (t, off) in tensors.iter().zip(offs) {
        write_str(&mut head, &t.name)?;
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in t.dims.iter().rev() {
            head.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        head.extend_from_slice(&t.type_id.to_le_bytes());
        head.extend_from_slice(&off.to_le_bytes());
    }
    let padded = align(head.len() as u64);
    head.resize(padded as usize, 0);
    w.write_all(&head)?;
    Ok(padded)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header reads back through lcut's GGUF parser with the values,
    /// shapes, types and offsets written.
    #[test]
    fn the_header_reads_back() {
        let meta = vec![
            (
                "general.architecture".to_string(),
                MetaValue::Str("llama".into()),
            ),
            ("llama.block_count".to_string(), MetaValue::U32(2)),
            ("llama.rope.freq_base".to_string(), MetaValue::F32(10000.0)),
            (
                "tokenizer.ggml.add_bos_token".to_string(),
                MetaValue::Bool(true),
            ),
            (
                "tokenizer.ggml.tokens".to_string(),
                MetaValue::Strs(vec!["a".into(), "b".into()]),
            ),
            (
                "tokenizer.ggml.token_type".to_string(),
                MetaValue::I32s(vec![1, 3]),
            ),
            (
                "olmo2.attention.sliding_window_pattern".to_string(),
                MetaValue::Bools(vec![true, false, true]),
            ),
        ];
        let tensors = vec![
            TensorInfo {
                name: "a".into(),
                dims: vec![3, 2],
                type_id: 0,
                bytes: 24,
            },
            TensorInfo {
                name: "b".into(),
                dims: vec![2, 32],
                type_id: 2,
                bytes: 36,
            },
        ];
        let mut bytes = Vec::new();
        let head = write_header(&mut bytes, &meta, &tensors).unwrap();
        assert_eq!(head % ALIGNMENT, 0);
        let (offs, len) = offsets(&tensors);
        assert_eq!(offs, vec![0, 32]);
        bytes.resize((head + len) as usize, 0);
        let parsed =
            lcut_model::gguf::GgufHeader::parse(&bytes, std::path::Path::new("t.gguf")).unwrap();
        assert_eq!(parsed.metadata["llama.block_count"].as_u64(), Some(2));
        assert_eq!(
            parsed.metadata["llama.rope.freq_base"].as_f64(),
            Some(10000.0)
        );
        assert_eq!(
            parsed.metadata["tokenizer.ggml.add_bos_token"].as_bool(),
            Some(true)
        );
        assert_eq!(
            parsed.metadata["tokenizer.ggml.tokens"]
                .as_array()
                .map(<[_]>::len),
            Some(2)
        );
        let flags: Vec<Option<bool>> = parsed.metadata["olmo2.attention.sliding_window_pattern"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_bool())
            .collect();
        assert_eq!(flags, vec![Some(true), Some(false), Some(true)]);
        let b = &parsed.tensors["b"];
        assert_eq!(b.shape, vec![2, 32]);
        assert_eq!(b.start as u64, head + 32);
    }
}
