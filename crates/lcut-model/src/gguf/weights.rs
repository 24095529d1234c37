//! Tensors of a memory-mapped GGUF file under the Hugging Face names the
//! decoder asks for, dequantized to a dtype or kept in their ggml type.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor, ggml_file::qtensor_from_ggml};
use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::config::model_config;
use crate::gguf::header::{GgufHeader, ggml_type_name};
use crate::mapped::MappedMatrix;
use crate::weights::WeightSource;
use lcut_kernels::quant::QuantFormat;

/// A GGUF model file, memory-mapped, with its parsed header.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    header: GgufHeader,
    /// The model configuration the metadata describes.
    config: ModelConfig,
    /// Query/key heads whose projection rows llama.cpp permuted for its
    /// interleaved RoPE (llama-family files); `None` when not permuted.
    permuted_heads: Option<(usize, usize)>,
}

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

impl GgufFile {
    /// Open and memory-map `path`, parse and check its header.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "the GGUF model file".into(),
            },
            _ => ModelError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let map = Arc::new(map_file(&file, path)?);
        let header = GgufHeader::parse(&map, path)?;
        let config = model_config(&header, path, &map)?;
        let permuted_heads = config
            .arch
            .gguf_permutes_qk()
            .then_some((config.num_heads, config.num_kv_heads));
        Ok(Self {
            path: path.to_path_buf(),
            map,
            header,
            config,
            permuted_heads,
        })
    }

    /// The parsed header (metadata and tensor directory).
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The header's bytes (metadata and tensor directory), which identify
    /// the model without its tensor data.
    pub fn header_bytes(&self) -> &[u8] {
        &self.map[..self.header.header_len]
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model configuration the metadata describes.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Where the tensor of a Hugging Face name lies in the file, its shape
    /// checked against `expected`: a whole tensor, or one expert's matrix
    /// of llama.cpp's 3-D expert tensors (`blk.N.ffn_*_exps`, [experts,
    /// rows, columns], each expert's rows contiguous).
    fn view(&self, hf_name: &str, expected: &[usize]) -> Result<TensorView> {
        let (name, expert) = gguf_location(hf_name);
        if let (Some(x), Some((fused, half))) = (expert, self.fused_half(&name)) {
            return self.half_view(&fused, (x, half), expected);
        }
        let Some(e) = self.header.tensors.get(&name) else {
            return Err(ModelError::MissingTensor {
                folder: self.path.clone(),
                name: format!("{name} (for {hf_name})"),
            });
        };
        let shape_error = |name: String, expected: Vec<usize>| ModelError::TensorShape {
            folder: self.path.clone(),
            config: "the file's metadata",
            name,
            expected,
            found: e.shape.clone(),
        };
        let Some(expert) = expert else {
            // llama.cpp's converter squeezes unit axes (Qwen3.5's
            // convolution, [channels, 1, kernel] in Hugging Face's files):
            // the same values in the same order
            if squeezed(&e.shape) != squeezed(expected) {
                return Err(shape_error(name, expected.to_vec()));
            }
            return Ok(TensorView {
                name,
                type_id: e.type_id,
                dtype: e.dtype,
                start: e.start,
                len: e.len,
            });
        };
        let count = self.config.experts.map_or(0, |x| x.num_experts);
        let whole: Vec<usize> = std::iter::once(count)
            .chain(expected.iter().copied())
            .collect();
        if e.shape != whole || expert >= count {
            return Err(shape_error(format!("{name} (expert {expert})"), whole));
        }
        let len = e.len / count;
        Ok(TensorView {
            name: format!("{name} (expert {expert})"),
            type_id: e.type_id,
            dtype: e.dtype,
            start: e.start + expert * len,
            len,
        })
    }

    /// Where an expert's gate or up matrix (`blk.N.ffn_{gate,up}_exps`) lies
    /// when the file holds neither but the two fused (`ffn_gate_up_exps`,
    /// [experts, 2 inner, columns], each expert's gate rows then its up
    /// rows: Gemma 4): the fused tensor's name and the half (0 gate, 1 up).
    fn fused_half(&self, name: &str) -> Option<(String, usize)> {
        if self.header.tensors.contains_key(name) {
            return None;
        }
        let (half, part) = [(0, "ffn_gate_exps"), (1, "ffn_up_exps")]
            .into_iter()
            .find(|(_, p)| name.contains(p))?;
        let fused = name.replace(part, "ffn_gate_up_exps");
        self.header
            .tensors
            .contains_key(&fused)
            .then_some((fused, half))
    }

    /// Expert `x`'s `half` (0 gate, 1 up) of the fused tensor `fused`,
    /// checked against `expected` [inner, columns].
    fn half_view(
        &self,
        fused: &str,
        (x, half): (usize, usize),
        expected: &[usize],
    ) -> Result<TensorView> {
        let e = &self.header.tensors[fused];
        let count = self.config.experts.map_or(0, |c| c.num_experts);
        let whole: Vec<usize> = match expected {
            [rows, cols] => vec![count, 2 * rows, *cols],
            _ => expected.to_vec(),
        };
        let name = format!(
            "{fused} (expert {x}, {} rows)",
            if half == 0 { "gate" } else { "up" }
        );
        if e.shape != whole || x >= count {
            return Err(ModelError::TensorShape {
                folder: self.path.clone(),
                config: "the file's metadata",
                name,
                expected: whole,
                found: e.shape.clone(),
            });
        }
        // each expert's rows are contiguous, its gate rows then its up rows
        let len = e.len / count / 2;
        Ok(TensorView {
            name,
            type_id: e.type_id,
            dtype: e.dtype,
            start: e.start + (2 * x + half) * len,
            len,
        })
    }

    /// A matrix read in place from the mapping, when the CPU kernels read its
    /// ggml type; `None` for other types. Shape checked; llama.cpp's Q/K row
    /// permutation is kept and undone on the products' outputs.
    pub fn mapped(&self, hf_name: &str, expected: &[usize]) -> Result<Option<MappedMatrix>> {
        let v = self.view(hf_name, expected)?;
        let Some(format) = QuantFormat::from_ggml_type(v.type_id) else {
            return Ok(None);
        };
        if expected.len() != 2 {
            return Err(ModelError::TensorShape {
                folder: self.path.clone(),
                config: "the file's metadata",
                name: v.name,
                expected: expected.to_vec(),
                found: expected.to_vec(),
            });
        }
        let heads = match (self.permuted_heads, projection_of(hf_name)) {
            (Some((q, _)), Some(Projection::Query)) => Some(q),
            (Some((_, kv)), Some(Projection::Key)) => Some(kv),
            _ => None,
        };
        let dims = (expected[0], expected[1]);
        MappedMatrix::new(self.map.clone(), v.start, format, dims, heads).map(Some)
    }

    /// The raw bytes of a tensor in its ggml type, checked against the
    /// expected shape, with llama.cpp's Q/K row permutation undone.
    fn raw(&self, hf_name: &str, expected: &[usize]) -> Result<(GgmlDType, Cow<'_, [u8]>)> {
        let v = self.view(hf_name, expected)?;
        let dtype = v.dtype.ok_or_else(|| ModelError::UnsupportedQuantization {
            path: self.path.clone(),
            tensor: v.name.clone(),
            type_name: ggml_type_name(v.type_id),
        })?;
        let bytes = &self.map[v.start..v.start + v.len];
        let heads = match (self.permuted_heads, projection_of(hf_name)) {
            (Some((q, _)), Some(Projection::Query)) => Some(q),
            (Some((_, kv)), Some(Projection::Key)) => Some(kv),
            _ => None,
        };
        Ok(match heads {
            Some(n_heads) => (
                dtype,
                Cow::Owned(unpermute_rows(bytes, expected[0], n_heads)),
            ),
            None => (dtype, Cow::Borrowed(bytes)),
        })
    }

    /// Drop the mapped pages of the tensor of this Hugging Face name from
    /// the process's resident memory, once a copy of it is made.
    fn release(&self, hf_name: &str, expected: &[usize]) {
        if let Ok(v) = self.view(hf_name, expected) {
            release_mapped(&self.map, v.start, v.len);
        }
    }
}

/// A shape without its unit axes.
fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// The Hugging Face name suffix of Qwen3.5's decay rates `A_log`, which
/// llama.cpp's converter stores as `ssm_a = -exp(A_log)`: read back as
/// `ln(-ssm_a)`, every entry of which must be negative and finite.
const A_LOG: &str = ".linear_attn.A_log";

/// Where one Hugging Face tensor's data lies in a GGUF file.
struct TensorView {
    /// llama.cpp's name (with the expert, for one expert of a 3-D tensor).
    name: String,
    /// The ggml type id.
    type_id: u32,
    /// The type, when candle implements it.
    dtype: Option<GgmlDType>,
    /// Absolute byte offset of the data.
    start: usize,
    /// Bytes of data.
    len: usize,
}

#[allow(unsafe_code)]
pub(crate) fn map_file(file: &std::fs::File, path: &Path) -> Result<Mmap> {
    // SAFETY: the file is mapped read-only; lcut never writes to a model file
    // while a model from it is loaded. A file changed underneath by another
    // process is the one case memory mapping cannot guard against.
    unsafe { Mmap::map(file) }.map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Drop the mapped pages of `len` bytes at `offset` of `map` from the
/// process's resident memory (the page cache keeps them): a tensor copied
/// out of a mapping would otherwise count twice.
#[allow(unsafe_code)]
pub(crate) fn release_mapped(map: &Mmap, offset: usize, len: usize) {
    // SAFETY: the map is a read-only shared mapping of a file, so
    // MADV_DONTNEED discards nothing: a later read of the range faults the
    // same bytes back in from the file. Callers hold no borrow of the
    // range: the tensor owns a copy. A failure only leaves the pages
    // resident.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
}

enum Projection {
    Query,
    Key,
}

fn projection_of(hf_name: &str) -> Option<Projection> {
    if hf_name.contains(".self_attn.q_proj.") {
        Some(Projection::Query)
    } else if hf_name.contains(".self_attn.k_proj.") {
        Some(Projection::Key)
    } else {
        None
    }
}

/// Undo llama.cpp's `permute` of a Q or K projection: within each head of
/// `hd` rows it stored Hugging Face row `half * hd/2 + i` at row `2 i + half`.
/// Rows are independent in every ggml type, so this works on the raw bytes
/// of a quantized matrix as well (a bias is a matrix of one-value rows).
fn unpermute_rows(bytes: &[u8], rows: usize, n_heads: usize) -> Vec<u8> {
    let row_bytes = bytes.len() / rows;
    let hd = rows / n_heads;
    let half = hd / 2;
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        let (h, within) = (r / hd, r % hd);
        let (part, i) = (within / half, within % half);
        let g = h * hd + 2 * i + part;
        out[r * row_bytes..(r + 1) * row_bytes]
            .copy_from_slice(&bytes[g * row_bytes..(g + 1) * row_bytes]);
    }
    out
}

/// llama.cpp's name of a Hugging Face tensor name (for one expert's
/// matrix, the name of the 3-D tensor that holds every expert's).
pub fn gguf_name(hf_name: &str) -> String {
    gguf_location(hf_name).0
}

/// llama.cpp's name of a Hugging Face tensor name and, for one expert's
/// matrix (`mlp.experts.I.gate_proj`, Mixtral's `block_sparse_moe.experts.I.w1`),
/// the expert's index in the 3-D tensor (`ffn_gate_exps`).
fn gguf_location(hf_name: &str) -> (String, Option<usize>) {
    const TOP: [(&str, &str); 6] = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        // Gemma 4's per-layer inputs
        (
            "model.embed_tokens_per_layer.weight",
            "per_layer_token_embd.weight",
        ),
        (
            "model.per_layer_model_projection.weight",
            "per_layer_model_proj.weight",
        ),
        (
            "model.per_layer_projection_norm.weight",
            "per_layer_proj_norm.weight",
        ),
    ];
    const LAYER: [(&str, &str); 36] = [
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.qkv_proj", "attn_qkv"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("pre_feedforward_layernorm", "ffn_norm"),
        ("post_feedforward_layernorm", "post_ffw_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("mlp.gate_up_proj", "ffn_up"),
        ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate", "ffn_gate_inp"),
        ("block_sparse_moe.gate", "ffn_gate_inp"),
        ("mlp.router", "ffn_gate_inp"),
        // Qwen3.5's linear-attention layers (`qwen35`)
        ("linear_attn.in_proj_qkv", "attn_qkv"),
        ("linear_attn.in_proj_z", "attn_gate"),
        ("linear_attn.in_proj_b", "ssm_beta"),
        ("linear_attn.in_proj_a", "ssm_alpha"),
        ("linear_attn.conv1d", "ssm_conv1d"),
        ("linear_attn.norm", "ssm_norm"),
        ("linear_attn.out_proj", "ssm_out"),
        // Qwen3.5-MoE's shared expert
        ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
        ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
        ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
        ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
        // Gemma 4's expert block beside the dense MLP
        ("router.proj", "ffn_gate_inp"),
        ("pre_feedforward_layernorm_2", "pre_ffw_norm_2"),
        ("post_feedforward_layernorm_1", "post_ffw_norm_1"),
        ("post_feedforward_layernorm_2", "post_ffw_norm_2"),
        // Gemma 4's per-layer inputs
        ("per_layer_input_gate", "inp_gate"),
        ("per_layer_projection", "proj"),
        ("post_per_layer_input_norm", "post_norm"),
    ];
    const EXPERT: [(&str, &str); 6] = [
        ("gate_proj", "ffn_gate_exps"),
        ("up_proj", "ffn_up_exps"),
        ("down_proj", "ffn_down_exps"),
        ("w1", "ffn_gate_exps"),
        ("w3", "ffn_up_exps"),
        ("w2", "ffn_down_exps"),
    ];
    let verbatim = || (hf_name.to_string(), None);
    if let Some((_, g)) = TOP.iter().find(|(hf, _)| *hf == hf_name) {
        return (g.to_string(), None);
    }
    let Some(rest) = hf_name.strip_prefix("model.layers.") else {
        return verbatim();
    };
    let Some((layer, rest)) = rest.split_once('.') else {
        return verbatim();
    };
    // parameters of a module itself: gpt-oss's sink logits, Qwen3.5's
    // decay rates (stored as -exp(A_log): [`A_LOG`]) and step biases,
    // Gemma 4's layer scalars
    match rest {
        "self_attn.sinks" => return (format!("blk.{layer}.attn_sinks.weight"), None),
        "linear_attn.A_log" => return (format!("blk.{layer}.ssm_a"), None),
        "linear_attn.dt_bias" => return (format!("blk.{layer}.ssm_dt.bias"), None),
        // Gemma 4's scale of each layer's output, its router's scales and
        // its stacked experts
        "layer_scalar" => return (format!("blk.{layer}.layer_output_scale.weight"), None),
        "router.scale" => return (format!("blk.{layer}.ffn_gate_inp.scale"), None),
        "router.per_expert_scale" => return (format!("blk.{layer}.ffn_down_exps.scale"), None),
        "experts.gate_up_proj" => return (format!("blk.{layer}.ffn_gate_up_exps.weight"), None),
        "experts.down_proj" => return (format!("blk.{layer}.ffn_down_exps.weight"), None),
        _ => {}
    }
    let Some((module, param)) = rest.rsplit_once('.') else {
        return verbatim();
    };
    let expert = ["mlp.experts.", "block_sparse_moe.experts.", "experts."]
        .iter()
        .find_map(|p| module.strip_prefix(p))
        .and_then(|e| e.split_once('.'))
        .and_then(|(i, proj)| Some((i.parse::<usize>().ok()?, proj)))
        .and_then(|(i, proj)| Some((i, EXPERT.iter().find(|(hf, _)| *hf == proj)?.1)));
    if let Some((i, g)) = expert {
        return (format!("blk.{layer}.{g}.{param}"), Some(i));
    }
    let module = LAYER
        .iter()
        .find(|(hf, _)| *hf == module)
        .map_or(module, |(_, g)| g);
    (format!("blk.{layer}.{module}.{param}"), None)
}

/// A GGUF file as a source of Hugging Face-named tensors. Gemma 2/3 and
/// OLMo 2/3 files name the norm after attention `post_attention_norm`, and
/// so do gpt-oss and Qwen3.5 files the norm before the MLP; the decoder asks for it
/// as `post_attention_layernorm`, which other architectures use for the
/// norm before the MLP (`ffn_norm`).
pub struct GgufWeights {
    file: GgufFile,
    /// The layers have a norm after the attention.
    norm_after_attention: bool,
}

impl GgufWeights {
    /// Wrap an opened file.
    pub fn new(file: GgufFile) -> Self {
        let norm_after_attention = file.config.arch.gguf_post_attention_norm();
        Self {
            file,
            norm_after_attention,
        }
    }

    /// The underlying file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    fn name<'a>(&self, hf_name: &'a str) -> Cow<'a, str> {
        if self.norm_after_attention && hf_name.ends_with(".post_attention_layernorm.weight") {
            let layer = hf_name
                .trim_start_matches("model.layers.")
                .split('.')
                .next()
                .unwrap_or_default();
            // mapped verbatim by gguf_name (not a known module)
            return Cow::Owned(format!("blk.{layer}.post_attention_norm.weight"));
        }
        Cow::Borrowed(hf_name)
    }
}

impl WeightSource for GgufWeights {
    /// The GGUF file (named in error messages).
    fn folder(&self) -> &Path {
        self.file.path()
    }

    /// Whether the file holds the tensor of this Hugging Face name.
    fn contains(&self, name: &str) -> bool {
        let name = self.name(name);
        let (gguf, expert) = gguf_location(&name);
        self.file.header.tensors.contains_key(&gguf)
            || (expert.is_some() && self.file.fused_half(&gguf).is_some())
    }

    /// Dequantize tensor `name` (shape checked) to `dtype` on `device`:
    /// by candle, or by lcut's kernels for the types only they read
    /// (MXFP4); Qwen3.5's decay rates back from what the converter stored.
    fn load(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let stored = self.load_stored(name, expected, dtype, device)?;
        if !name.ends_with(A_LOG) {
            return Ok(stored);
        }
        // ln(-ssm_a), from values that must be negative and finite
        let values = stored
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if let Some(bad) = values.iter().find(|x| !(x.is_finite() && **x < 0.0)) {
            return Err(ModelError::GgufMalformed {
                path: self.file.path.clone(),
                offset: self.file.view(&self.name(name), expected)?.start,
                reason: format!(
                    "tensor `{}`: a decay rate -exp(A_log) must be negative and finite, found {bad}",
                    gguf_name(name)
                ),
            });
        }
        Ok(stored.neg()?.log()?)
    }

    /// The matrix read in place, on the CPU, when the kernels read its type.
    fn load_mapped(
        &self,
        name: &str,
        expected: &[usize],
        device: &Device,
    ) -> Result<Option<MappedMatrix>> {
        if !device.is_cpu() {
            return Ok(None);
        }
        self.file.mapped(&self.name(name), expected)
    }

    /// The tensor in its ggml type, for quantized matrix products; `None`
    /// for an F32 tensor (a router), which is read as a dense matrix.
    fn load_quantized(
        &self,
        name: &str,
        expected: &[usize],
        device: &Device,
    ) -> Result<Option<QTensor>> {
        let hf = self.name(name);
        let v = self.file.view(&hf, expected)?;
        // a type candle does not hold (MXFP4) is read in place by the
        // kernels on the CPU, or dequantized
        if v.dtype == Some(GgmlDType::F32) || v.dtype.is_none() {
            return Ok(None);
        }
        self.quantized(name, expected, device).map(Some)
    }
}

impl GgufWeights {
    /// Tensor `name` as the file stores it (shape checked), dequantized to
    /// `dtype` on `device`.
    fn load_stored(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let hf = self.name(name);
        let v = self.file.view(&hf, expected)?;
        if v.dtype.is_none()
            && let Some(format) = QuantFormat::from_ggml_type(v.type_id)
        {
            let mut values = vec![0f32; expected.iter().product()];
            let bytes = &self.file.map[v.start..v.start + v.len];
            lcut_kernels::quant::dequantize(format, bytes, &mut values).map_err(|e| {
                ModelError::GgufMalformed {
                    path: self.file.path.clone(),
                    offset: v.start,
                    reason: format!("tensor `{}`: {e}", v.name),
                }
            })?;
            return Ok(Tensor::from_vec(values, expected, device)?.to_dtype(dtype)?);
        }
        let q = self.quantized(name, expected, device)?;
        Ok(q.dequantize(device)?.to_dtype(dtype)?)
    }

    fn quantized(&self, name: &str, expected: &[usize], device: &Device) -> Result<QTensor> {
        let name = self.name(name);
        let (dtype, bytes) = self.file.raw(&name, expected)?;
        let tensor = qtensor_from_ggml(dtype, &bytes, expected.to_vec(), device)?;
        drop(bytes);
        // the QTensor owns a copy (candle has no mapped storage)
        self.file.release(&name, expected);
        Ok(tensor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(gguf_name("model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(
            gguf_name("model.layers.3.self_attn.o_proj.weight"),
            "blk.3.attn_output.weight"
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.q_proj.bias"),
            "blk.0.attn_q.bias"
        );
        assert_eq!(
            gguf_name("model.layers.12.post_attention_layernorm.weight"),
            "blk.12.ffn_norm.weight"
        );
        assert_eq!(gguf_name("rope_freqs.weight"), "rope_freqs.weight");
        assert_eq!(
            gguf_location("model.layers.2.mlp.gate.weight"),
            ("blk.2.ffn_gate_inp.weight".into(), None)
        );
        assert_eq!(
            gguf_location("model.layers.2.mlp.experts.7.down_proj.weight"),
            ("blk.2.ffn_down_exps.weight".into(), Some(7))
        );
        assert_eq!(
            gguf_location("model.layers.0.block_sparse_moe.experts.3.w3.weight"),
            ("blk.0.ffn_up_exps.weight".into(), Some(3))
        );
        assert_eq!(
            gguf_location("model.layers.0.block_sparse_moe.gate.weight"),
            ("blk.0.ffn_gate_inp.weight".into(), None)
        );
        // gpt-oss: the router and its bias, the sinks, an expert's bias
        assert_eq!(
            gguf_location("model.layers.1.mlp.router.bias"),
            ("blk.1.ffn_gate_inp.bias".into(), None)
        );
        assert_eq!(
            gguf_location("model.layers.1.self_attn.sinks"),
            ("blk.1.attn_sinks.weight".into(), None)
        );
        assert_eq!(
            gguf_location("model.layers.1.mlp.experts.2.up_proj.bias"),
            ("blk.1.ffn_up_exps.bias".into(), Some(2))
        );
    }

    /// llama.cpp's permute: reshape(n_head, 2, hd/2, ...).swapaxes(1, 2).
    fn llama_cpp_permute(rows: &[u32], n_heads: usize) -> Vec<u32> {
        let hd = rows.len() / n_heads;
        let mut out = Vec::with_capacity(rows.len());
        for h in 0..n_heads {
            for i in 0..hd / 2 {
                for part in 0..2 {
                    out.push(rows[h * hd + part * hd / 2 + i]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let rows: Vec<u32> = (0..24).collect();
        for heads in [1, 2, 3] {
            let permuted = llama_cpp_permute(&rows, heads);
            let bytes: Vec<u8> = permuted.iter().flat_map(|r| r.to_le_bytes()).collect();
            let back = unpermute_rows(&bytes, rows.len(), heads);
            let back: Vec<u32> = back
                .chunks(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(back, rows, "{heads} heads");
        }
    }
}
