//! A random model as a GGUF file that both lcut and llama.cpp load:
//! llama.cpp's architecture names (`llama`, `qwen2`, `smollm3`, `olmo2` for
//! OLMo 2 and 3), tensor names and metadata keys (as its converter writes
//! them), Llama's and SmolLM3's Q/K rows in its permuted order, Llama 3's
//! RoPE scaling as a `rope_freqs.weight` tensor and YaRN as
//! `rope.scaling.*` keys, OLMo 3's sliding layers as a window and a
//! per-layer pattern, Qwen3-MoE (`qwen3moe`) and Mixtral (`llama` with an
//! expert count) with each layer's experts as three 3-D tensors
//! (`ffn_{gate,up,down}_exps`, [experts, rows, columns]) and the router
//! (`ffn_gate_inp`) in f32, Qwen3.5 (`qwen35`, `qwen35moe`) as its
//! converter writes it ([`Stored`]: value heads in llama.cpp's tiled
//! order, `1 + w` norms, `-exp(A_log)`, the convolution without its unit
//! axis), gpt-oss (`gpt-oss`) with its fused experts split and turned as
//! the converter turns them ([`FusedPart`]) and, in [`Format::GgufMxfp4`],
//! quantized to MXFP4 as ggml's reference quantizer does, the synthetic
//! tokenizer as `gpt2` BPE, norms and biases in f32,
//! matrices in the format's type and the LM head (the embedding when tied)
//! in Q6_K, as `llama-quantize` stores it.

use std::io::{BufWriter, Write};
use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lcut_model::gguf::gguf_name;
use lcut_model::{Layout, RopeConfig, RopeScaling, inverse_frequencies};

use super::gguf_file::{MetaValue, TensorInfo, offsets, write_header};
use super::{Format, Progress, rows_per_slice};
use crate::draw;
use crate::error::{Result, SynthError};
use crate::shapes::{
    ExpertsKind, Family, Gemma4Shape, ModelShape, TensorKind, TensorSpec, yarn_params,
};
use crate::vocab::Vocabulary;

/// What a GGUF tensor holds: a weight of the shape, every expert's copy
/// of one projection, or the RoPE factors.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// A weight, stored as llama.cpp's converter stores it.
    Weight(TensorSpec, Stored),
    /// One projection of a layer's experts, expert 0 first: each expert's
    /// weight (Hugging Face name and draws its own) one after the other,
    /// as llama.cpp's 3-D `ffn_*_exps` tensors hold them.
    Experts(Vec<TensorSpec>),
    /// Llama 3's per-frequency divisors.
    RopeFactors(Vec<f32>),
    /// One part of a tensor that holds every expert's weights (gpt-oss's
    /// `mlp.experts.gate_up_proj` and the like), as llama.cpp stores it.
    Fused(TensorSpec, FusedPart),
}

/// The GGUF tensors llama.cpp's converter makes of gpt-oss's fused expert
/// tensors (from a float checkpoint): `gate_up_proj` [experts, hidden, 2
/// inner] turned to [experts, inner, hidden] and split into its even
/// (gate) and odd (up) rows, `down_proj` [experts, inner, hidden] turned
/// to [experts, hidden, inner], `gate_up_proj_bias` split likewise, and
/// `down_proj_bias` as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FusedPart {
    /// The gate projections (`ffn_gate_exps.weight`).
    Gate,
    /// The up projections (`ffn_up_exps.weight`).
    Up,
    /// The down projections (`ffn_down_exps.weight`).
    Down,
    /// The gate projections' biases (`ffn_gate_exps.bias`).
    GateBias,
    /// The up projections' biases (`ffn_up_exps.bias`).
    UpBias,
    /// The tensor as it is (`down_proj_bias`: `ffn_down_exps.bias`).
    Whole,
}

impl FusedPart {
    /// The parts llama.cpp makes of fused tensor `name` (Hugging Face
    /// name), with their GGUF names (layer `layer`) and dimensions, rows
    /// first; `None` for a tensor that is not one of gpt-oss's fused ones.
    fn of(name: &str, dims: &[usize]) -> Option<Vec<(String, Vec<usize>, FusedPart)>> {
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, param) = rest.split_once(".mlp.experts.")?;
        let blk = |t: &str| format!("blk.{layer}.{t}");
        Some(match (param, dims) {
            ("gate_up_proj", &[e, d, two_i]) => vec![
                (
                    blk("ffn_gate_exps.weight"),
                    vec![e, two_i / 2, d],
                    FusedPart::Gate,
                ),
                (
                    blk("ffn_up_exps.weight"),
                    vec![e, two_i / 2, d],
                    FusedPart::Up,
                ),
            ],
            ("down_proj", &[e, i, d]) => {
                vec![(blk("ffn_down_exps.weight"), vec![e, d, i], FusedPart::Down)]
            }
            ("gate_up_proj_bias", &[e, two_i]) => vec![
                (
                    blk("ffn_gate_exps.bias"),
                    vec![e, two_i / 2],
                    FusedPart::GateBias,
                ),
                (
                    blk("ffn_up_exps.bias"),
                    vec![e, two_i / 2],
                    FusedPart::UpBias,
                ),
            ],
            ("down_proj_bias", &[e, d]) => {
                vec![(blk("ffn_down_exps.bias"), vec![e, d], FusedPart::Whole)]
            }
            _ => return None,
        })
    }
}

/// The type a tensor is stored in: one candle writes, or MXFP4 (ggml type
/// 39, 32 values in 17 bytes), which lcut's kernels quantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoredType {
    /// A type candle quantizes (or f32).
    Ggml(GgmlDType),
    /// MXFP4 (gpt-oss's experts).
    Mxfp4,
}

impl StoredType {
    fn block_size(self) -> usize {
        match self {
            StoredType::Ggml(t) => t.block_size(),
            StoredType::Mxfp4 => 32,
        }
    }

    fn type_id(self) -> u32 {
        match self {
            StoredType::Ggml(t) => type_id(t),
            StoredType::Mxfp4 => 39,
        }
    }

    fn bytes(self, n: usize) -> u64 {
        match self {
            StoredType::Ggml(t) => type_bytes(t, n),
            StoredType::Mxfp4 => (n / 32 * 17) as u64,
        }
    }

    fn name(self) -> String {
        match self {
            StoredType::Ggml(t) => format!("{t:?}"),
            StoredType::Mxfp4 => "MXFP4".into(),
        }
    }

    /// `values` (`rows` rows of `cols`) in this type's bytes, handed to
    /// `emit`.
    fn emit(
        self,
        tensor: &str,
        (values, rows, cols): (Vec<f32>, usize, usize),
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let quantize_err = |source| SynthError::Quantize {
            tensor: tensor.to_string(),
            source,
        };
        match self {
            StoredType::Ggml(GgmlDType::F32) => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                emit(&bytes)
            }
            StoredType::Ggml(ty) => {
                let dense =
                    Tensor::from_vec(values, (rows, cols), &Device::Cpu).map_err(quantize_err)?;
                let q = QTensor::quantize(&dense, ty).map_err(quantize_err)?;
                emit(&q.data().map_err(quantize_err)?)
            }
            StoredType::Mxfp4 => {
                use rayon::prelude::*;
                let row_bytes = cols / 32 * 17;
                let mut out = vec![0u8; rows * row_bytes];
                out.par_chunks_mut(row_bytes.max(1))
                    .zip(values.par_chunks(cols.max(1)))
                    .try_for_each(|(o, v)| lcut_kernels::quant::quantize_mxfp4(v, o))
                    .map_err(|e| SynthError::Quantize {
                        tensor: tensor.to_string(),
                        source: candle_core::Error::Msg(e.to_string()),
                    })?;
                emit(&out)
            }
        }
    }
}

/// The type weight `t` of `shape` is stored in: MXFP4 for the experts'
/// matrices in [`Format::GgufMxfp4`], else [`ggml_type`]'s.
fn stored_type(shape: &ModelShape, format: Format, t: &TensorSpec) -> StoredType {
    let expert =
        crate::shapes::expert_index(&t.name).is_some() || crate::shapes::is_fused_experts(&t.name);
    if format == Format::GgufMxfp4 && expert && t.kind == TensorKind::Matrix {
        StoredType::Mxfp4
    } else {
        StoredType::Ggml(ggml_type(shape, format, t))
    }
}

/// How a weight's drawn values become the file's: the order llama.cpp
/// keeps its rows and columns in and the converter's change of its values.
#[derive(Debug, Clone, PartialEq, Default)]
struct Stored {
    /// File row `r` holds drawn row `rows[r]`; `None`: the drawn order.
    rows: Option<Vec<usize>>,
    /// File column `c` holds drawn column `cols[c]`; `None`: the drawn
    /// order.
    cols: Option<Vec<usize>>,
    /// What the converter does to each value.
    values: ValueChange,
}

/// What llama.cpp's converter does to each value of a weight.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum ValueChange {
    /// Nothing.
    #[default]
    None,
    /// Adds one: a (1 + w) norm stored as the factor it applies.
    PlusOne,
    /// `-exp(x)`: Qwen3.5's decay rates stored as `ssm_a`.
    NegExp,
}

impl ValueChange {
    fn apply(self, x: f32) -> f32 {
        match self {
            ValueChange::None => x,
            ValueChange::PlusOne => 1.0 + x,
            ValueChange::NegExp => -x.exp(),
        }
    }
}

/// The order llama.cpp's converter keeps Qwen3.5's value heads in
/// (`_reorder_v_heads`): Hugging Face groups them by the key head they
/// read (key head `k` serves value heads `k r .. k r + r`), llama.cpp
/// tiles them (value head `t` reads key head `t % key_heads`). Position `p`
/// of the `value_heads * width` tiled entries holds grouped entry
/// `order[p]`.
fn tiled_value_heads(key_heads: usize, value_heads: usize, width: usize) -> Vec<usize> {
    let per_key = value_heads / key_heads.max(1);
    (0..value_heads * width)
        .map(|p| {
            let (t, within) = (p / width, p % width);
            let (k, j) = (t % key_heads, t / key_heads);
            (k * per_key + j) * width + within
        })
        .collect()
}

/// How weight `t` of `shape` is stored ([`Stored`]): Llama's and
/// SmolLM3's Q/K rows permuted; on Qwen3.5's linear layers the value
/// heads tiled ([`tiled_value_heads`]) in the rows of the value and gate
/// projections, the step inputs and the convolution, in the columns of the
/// output projection and across the step biases and decay rates; (1 + w)
/// norms stored with the one added, decay rates as `-exp(A_log)`.
fn stored(shape: &ModelShape, t: &TensorSpec) -> Stored {
    let values = match t.kind {
        TensorKind::OffsetNorm => ValueChange::PlusOne,
        TensorKind::DecayLog => ValueChange::NegExp,
        _ => ValueChange::None,
    };
    let mut out = Stored {
        rows: permuted_heads(shape, &t.name).map(|h| permuted_rows(t.rows(), h)),
        cols: None,
        values,
    };
    let Some(la) = shape.linear.filter(|la| la.value_heads != la.key_heads) else {
        return out;
    };
    let Some(param) = t.name.split_once(".linear_attn.").map(|(_, param)| param) else {
        return out;
    };
    let tiled = |width| tiled_value_heads(la.key_heads, la.value_heads, width);
    // queries and keys first, then the values, in the fused projection
    // and the convolution
    let after_qk = |width| {
        let qk = 2 * la.key_heads * la.key_dim;
        (0..qk)
            .chain(tiled(width).into_iter().map(|i| qk + i))
            .collect()
    };
    match param {
        "in_proj_qkv.weight" | "conv1d.weight" => out.rows = Some(after_qk(la.value_dim)),
        "in_proj_z.weight" => out.rows = Some(tiled(la.value_dim)),
        "in_proj_a.weight" | "in_proj_b.weight" => out.rows = Some(tiled(1)),
        "out_proj.weight" => out.cols = Some(tiled(la.value_dim)),
        "A_log" | "dt_bias" => out.cols = Some(tiled(1)),
        _ => {}
    }
    out
}

/// The tensors of a GGUF file: header entries and where their data comes from.
pub struct GgufPlan {
    infos: Vec<TensorInfo>,
    sources: Vec<Source>,
}

impl GgufPlan {
    /// Bytes of tensor data, without alignment padding.
    pub fn data_bytes(&self) -> u64 {
        self.infos.iter().map(|t| t.bytes).sum()
    }
}

/// ggml type ids of the types written.
fn type_id(t: GgmlDType) -> u32 {
    match t {
        GgmlDType::F32 => 0,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        _ => u32::MAX,
    }
}

/// Bytes of `n` values of `t`.
fn type_bytes(t: GgmlDType, n: usize) -> u64 {
    (n / t.block_size() * t.type_size()) as u64
}

/// The ggml type of each weight: f32 for norms (plain and 1 + w), biases,
/// routers, decay rates and convolutions, Q6_K for the output matrix (Q8_0
/// in a Q8_0 or MXFP4 file, as llama.cpp keeps it), the format's type for
/// the others (Q4_K_M: Q6_K for the V and down projections, experts'
/// included, of the layers [`more_bits`] picks, Q5_K for Qwen3.5's fused
/// `attn_qkv`, and [`eight_experts_type`]'s choices for a model of 8
/// experts; an MXFP4 file's non-expert matrices in Q8_0), each in the
/// type [`fitting_rows`] gives where its rows are not whole blocks of it.
/// An MXFP4 file's experts are MXFP4, which candle has no type for: see
/// `stored_type`.
pub fn ggml_type(shape: &ModelShape, format: Format, t: &TensorSpec) -> GgmlDType {
    let output = t.name == "lm_head.weight"
        || (shape.tie_word_embeddings && t.name == "model.embed_tokens.weight");
    let eight = (format == Format::GgufQ4KM && shape.experts.is_some_and(|e| e.num_experts == 8))
        .then(|| eight_experts_type(&t.name))
        .flatten();
    let ty = match (t.kind, output, format, eight) {
        (
            TensorKind::Norm
            | TensorKind::QkScaleNorm
            | TensorKind::OffsetNorm
            | TensorKind::Bias
            | TensorKind::Router
            | TensorKind::ScaledRouter
            | TensorKind::DecayLog
            | TensorKind::Convolution,
            ..,
        ) => GgmlDType::F32,
        (_, _, Format::GgufQ8_0 | Format::GgufMxfp4, _) => GgmlDType::Q8_0,
        (_, true, ..) => GgmlDType::Q6K,
        (_, false, _, Some(ty)) => ty,
        (_, false, Format::GgufQ4KM, _) if more_bits_in(shape, &t.name) => GgmlDType::Q6K,
        // llama.cpp's Q4_K_M gives a fused `attn_qkv` Q5_K (Qwen3.5's
        // linear layers)
        (_, false, Format::GgufQ4KM, _) if t.name.ends_with(".linear_attn.in_proj_qkv.weight") => {
            GgmlDType::Q5K
        }
        (_, false, Format::GgufQ4K | Format::GgufQ4KM, _) => GgmlDType::Q4K,
        _ => GgmlDType::Q4_0,
    };
    fitting_rows(ty, t.cols())
}

/// The type llama.cpp's quantizer stores a tensor meant for `ty` in when
/// its rows of `cols` values are not whole blocks of `ty`
/// (`convert_incompatible_tensor`): a K-quant's 256-value blocks give way
/// to a type of 32-value blocks, Q4_K to Q5_0, Q5_K to Q5_1 and Q6_K to
/// Q8_0 (Gemma 3 270M's 640-wide rows, gpt-oss's 2880, Gemma 4
/// 26B-A4B's 2112 and 704); any other type stays (a row that is not whole
/// blocks of it either is refused when the file is planned).
pub fn fitting_rows(ty: GgmlDType, cols: usize) -> GgmlDType {
    if cols.is_multiple_of(ty.block_size()) {
        return ty;
    }
    match ty {
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        other => other,
    }
}

/// llama.cpp's Q4_K_M type for tensor `name` (Hugging Face name) of a
/// model of exactly 8 experts (Mixtral-8x7B's count; its rules key on
/// `n_expert == 8`), where it differs from the others': the K and V
/// projections in Q8_0 ("trades just ~128MB"), the attention output in
/// Q5_K; `None` for the other tensors.
pub fn eight_experts_type(name: &str) -> Option<GgmlDType> {
    if name.ends_with(".self_attn.k_proj.weight") || name.ends_with(".self_attn.v_proj.weight") {
        Some(GgmlDType::Q8_0)
    } else if name.ends_with(".self_attn.o_proj.weight") {
        Some(GgmlDType::Q5K)
    } else {
        None
    }
}

/// Whether llama.cpp's Q4_K_M keeps tensor `name` (Hugging Face name) of
/// a model of `layers` layers in Q6_K: the V and down projections (a
/// layer's experts' down projections too, llama.cpp's `ffn_down_exps`,
/// Gemma 4's stacked ones included) of the first and last eighth of the
/// layers and of every third layer between (llama.cpp's `use_more_bits`).
pub fn more_bits(layers: usize, name: &str) -> bool {
    let expert_down = (crate::shapes::expert_index(name).is_some()
        && (name.ends_with(".down_proj.weight") || name.ends_with(".w2.weight")))
        || name.ends_with(".experts.down_proj");
    let projection = name.ends_with(".self_attn.v_proj.weight")
        || name.ends_with(".mlp.down_proj.weight")
        || expert_down;
    let layer = name
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|i| i.parse::<usize>().ok());
    match layer {
        Some(i) if projection => {
            let eighth = layers / 8;
            i < eighth || i >= 7 * layers / 8 || (i - eighth) % 3 == 2
        }
        _ => false,
    }
}

/// [`more_bits`] for a weight of `shape`: llama.cpp counts a V
/// projection's place among the V projections the file holds, which on
/// Qwen3.5 (only its full layers have one) and Gemma 4 (none in a shared
/// layer or a full layer whose keys are its values) are fewer than the
/// layers.
fn more_bits_in(shape: &ModelShape, name: &str) -> bool {
    if !name.ends_with(".self_attn.v_proj.weight") {
        return more_bits(shape.sizes.num_layers, name);
    }
    let with_values: Vec<usize> = (0..shape.sizes.num_layers)
        .filter(|&l| shape.has_value_projection(l))
        .collect();
    let layer = name
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|i| i.parse::<usize>().ok());
    match layer.and_then(|l| with_values.iter().position(|&v| v == l)) {
        Some(i) => more_bits(
            with_values.len(),
            &format!("model.layers.{i}.self_attn.v_proj.weight"),
        ),
        None => false,
    }
}

/// The heads whose rows llama.cpp permutes in this weight (a Q or K
/// projection of an architecture whose converter permutes them: Llama and
/// SmolLM3, not Qwen2 or OLMo), or `None`.
fn permuted_heads(shape: &ModelShape, name: &str) -> Option<usize> {
    if !shape.arch().gguf_permutes_qk() || !name.ends_with(".weight") {
        return None;
    }
    if name.contains(".self_attn.q_proj.") {
        Some(shape.sizes.num_heads)
    } else if name.contains(".self_attn.k_proj.") {
        Some(shape.sizes.num_kv_heads)
    } else {
        None
    }
}

/// llama.cpp's RoPE factors for Llama 3 scaling: base over scaled inverse
/// frequency, one per rotated pair; `None` without scaling.
fn rope_factors(shape: &ModelShape) -> Option<Vec<f32>> {
    if !matches!(shape.rope_scaling, RopeScaling::Llama3 { .. }) {
        return None;
    }
    let plain = RopeConfig {
        theta: shape.sizes.rope_theta,
        scaling: RopeScaling::None,
        rotary_dim: shape.head_dim(),
    };
    let scaled = RopeConfig {
        scaling: shape.rope_scaling,
        ..plain
    };
    let factors = inverse_frequencies(&plain)
        .iter()
        .zip(inverse_frequencies(&scaled))
        .map(|(b, s)| (b / s) as f32)
        .collect();
    Some(factors)
}

/// llama.cpp's name of weight `hf_name` of `shape`: [`gguf_name`]'s, but
/// OLMo's norm after attention and Qwen3.5's and gpt-oss's norm before the
/// MLP are
/// `post_attention_norm` (llama.cpp's `ATTN_POST_NORM`), where Llama's
/// `post_attention_layernorm` is the norm before the MLP (`ffn_norm`).
pub fn tensor_name(shape: &ModelShape, hf_name: &str) -> String {
    if shape.arch().gguf_post_attention_norm()
        && let Some(layer) = hf_name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.strip_suffix(".post_attention_layernorm.weight"))
    {
        return format!("blk.{layer}.post_attention_norm.weight");
    }
    gguf_name(hf_name)
}

/// Refuse what a GGUF file cannot record, which llama.cpp (and lcut)
/// would read back as another model: a SmolLM3 NoPE interval other than
/// the 4 llama.cpp hard-codes (it has no key), and YaRN's ramp left
/// unrounded (`truncate: false`; no key either).
fn check_recordable(shape: &ModelShape, format: Format) -> Result<()> {
    let what = match (shape.sizes.layout, shape.rope_scaling) {
        (Layout::Smollm3 { nope_interval }, _) if nope_interval != 4 => format!(
            "a NoPE layer every {nope_interval} layers (llama.cpp's smollm3 has one every 4)"
        ),
        (
            _,
            RopeScaling::Yarn {
                truncate: false, ..
            },
        ) => "YaRN without truncation (llama.cpp always rounds the ramp's bounds)".into(),
        _ => return Ok(()),
    };
    Err(SynthError::Unrecordable {
        format: format.to_string(),
        what,
    })
}

/// The tensors of `shape` in `format`, checked to fit the types' blocks
/// and to be recordable in GGUF.
pub fn plan(shape: &ModelShape, format: Format) -> Result<GgufPlan> {
    plan_tensors(shape, format, shape.tensors())
}

/// [`plan`] over `tensors` (the shape's, in its order).
fn plan_tensors(shape: &ModelShape, format: Format, tensors: Vec<TensorSpec>) -> Result<GgufPlan> {
    check_recordable(shape, format)?;
    let mut infos = Vec::new();
    let mut sources = Vec::new();
    if let Some(f) = rope_factors(shape).or_else(|| proportional_factors(shape)) {
        infos.push(TensorInfo {
            name: "rope_freqs.weight".into(),
            dims: vec![f.len()],
            type_id: 0,
            bytes: 4 * f.len() as u64,
        });
        sources.push(Source::RopeFactors(f));
    }
    // each 3-D expert tensor's place in `infos`, by its GGUF name
    let mut stacks = std::collections::HashMap::new();
    let fits = |t: &TensorSpec, cols: usize, ty: StoredType| match cols % ty.block_size() {
        0 => Ok(()),
        _ => Err(SynthError::BlockSize {
            format: format.to_string(),
            tensor: t.name.clone(),
            cols,
            block: ty.block_size(),
            type_name: ty.name(),
        }),
    };
    for t in tensors {
        let ty = stored_type(shape, format, &t);
        if let Some(parts) = FusedPart::of(&t.name, &t.dims) {
            for (name, dims, part) in parts {
                let cols = dims.last().copied().unwrap_or(1);
                fits(&t, cols, ty)?;
                infos.push(TensorInfo {
                    name,
                    bytes: ty.bytes(dims.iter().product()),
                    dims,
                    type_id: ty.type_id(),
                });
                sources.push(Source::Fused(t.clone(), part));
            }
            continue;
        }
        fits(&t, t.cols(), ty)?;
        let name = tensor_name(shape, &t.name);
        let bytes = ty.bytes(t.len());
        if let Some(expert) = crate::shapes::expert_index(&t.name) {
            // one expert's matrix: a slab of the layer's 3-D tensor
            let at = *stacks.entry(name.clone()).or_insert_with(|| {
                infos.push(TensorInfo {
                    name,
                    dims: [&[0], &t.dims[..]].concat(),
                    type_id: ty.type_id(),
                    bytes: 0,
                });
                sources.push(Source::Experts(vec![]));
                infos.len() - 1
            });
            let info = &mut infos[at];
            match &mut sources[at] {
                Source::Experts(slabs) if expert == slabs.len() && info.dims[1..] == t.dims[..] => {
                    info.dims[0] += 1;
                    info.bytes += bytes;
                    slabs.push(t);
                }
                Source::Experts(slabs) => {
                    return Err(SynthError::ExpertOrder {
                        tensor: info.name.clone(),
                        expert: t.name.clone(),
                        position: slabs.len(),
                    });
                }
                _ => {
                    return Err(SynthError::ExpertOrder {
                        tensor: info.name.clone(),
                        expert: t.name.clone(),
                        position: 0,
                    });
                }
            }
            continue;
        }
        // the converter squeezes the convolution's unit axis
        let dims = match t.kind {
            TensorKind::Convolution => t.dims.iter().copied().filter(|&d| d != 1).collect(),
            _ => t.dims.clone(),
        };
        infos.push(TensorInfo {
            name,
            dims,
            type_id: ty.type_id(),
            bytes,
        });
        let how = stored(shape, &t);
        sources.push(Source::Weight(t, how));
    }
    Ok(GgufPlan { infos, sources })
}

/// The row order llama.cpp stores a Q or K projection of `rows` rows and
/// `heads` heads in: within each head, row `2 i + half` is Hugging Face
/// row `half * hd/2 + i`.
fn permuted_rows(rows: usize, heads: usize) -> Vec<usize> {
    let hd = rows / heads;
    (0..rows)
        .map(|r| {
            let (h, within) = (r / hd, r % hd);
            h * hd + (within % 2) * (hd / 2) + within / 2
        })
        .collect()
}

/// `general.file_type` of a format (llama.cpp's `LLAMA_FTYPE_MOSTLY_*`).
fn file_type(format: Format) -> u32 {
    match format {
        Format::GgufQ4K => 14,
        Format::GgufQ4KM => 15,
        Format::GgufQ8_0 => 7,
        // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
        Format::GgufMxfp4 => 38,
        _ => 2,
    }
}

/// The metadata: architecture, sizes, RoPE and norm constants, a head
/// width of its own, the experts, OLMo 3's sliding layers, YaRN,
/// tokenizer.
fn metadata(
    shape: &ModelShape,
    format: Format,
    vocab: Vocabulary,
) -> Result<Vec<(String, MetaValue)>> {
    let s = &shape.sizes;
    let a = shape.arch().gguf_name();
    let k = |suffix: &str| format!("{a}.{suffix}");
    let u = |n: usize| MetaValue::U32(n as u32);
    // the names llama.cpp's converter gives these tokenizers: SmolLM3's is
    // Llama 3's (`smollm` is SmolLM 1/2's), OLMo 2/3's is DBRX's cl100k
    let pre = match shape.family() {
        Family::Llama | Family::Smollm3 | Family::Mixtral => "llama-bpe",
        Family::Qwen2 | Family::Qwen3Moe => "qwen2",
        // Qwen2's split with combining marks joined to their letters
        Family::Qwen35 | Family::Qwen35Moe => "qwen35",
        Family::Olmo => "dbrx",
        // o200k's split, as gpt-oss's converter names it
        Family::GptOss => "gpt-4o",
        // the synthetic vocabulary's split is GPT-2's (its tokenizer.json
        // runs ByteLevel's regex); a released Gemma 4 file has its own
        // `gemma4` vocabulary
        Family::Gemma4 => "default",
    };
    let mut meta = vec![
        ("general.architecture".into(), MetaValue::Str(a.into())),
        ("general.type".into(), MetaValue::Str("model".into())),
        (
            "general.name".into(),
            MetaValue::Str(format!("{} (random weights)", shape.name)),
        ),
        (
            "general.file_type".into(),
            MetaValue::U32(file_type(format)),
        ),
        ("general.quantization_version".into(), MetaValue::U32(2)),
        (k("vocab_size"), u(s.vocab_size)),
        (k("context_length"), u(s.max_position_embeddings)),
        (k("embedding_length"), u(s.hidden_size)),
        (k("block_count"), u(s.num_layers)),
        (k("feed_forward_length"), u(s.intermediate_size)),
        (k("attention.head_count"), u(s.num_heads)),
        (k("attention.head_count_kv"), u(s.num_kv_heads)),
        (k("rope.freq_base"), MetaValue::F32(s.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(s.rms_norm_eps as f32),
        ),
        (k("rope.dimension_count"), u(shape.rotary_dim())),
    ];
    if let Some(g) = shape.gemma4 {
        gemma4_metadata(shape, g, &mut meta);
    } else if shape.family() == Family::Qwen3Moe || shape.head_dim.is_some() {
        // as the converter writes Qwen3's (whose head width is its own)
        meta.extend([
            (k("attention.key_length"), u(shape.head_dim())),
            (k("attention.value_length"), u(shape.head_dim())),
        ]);
    }
    if let Some(e) = shape.experts {
        // Mixtral's expert width is `feed_forward_length` (its
        // intermediate size); llama.cpp renormalises the top-k weights of
        // both without a key saying so
        meta.extend([
            (k("expert_count"), u(e.num_experts)),
            (k("expert_used_count"), u(e.top_k)),
        ]);
        match e.kind {
            ExpertsKind::Qwen3Moe | ExpertsKind::Gemma4 => {
                meta.push((k("expert_feed_forward_length"), u(e.inner)))
            }
            ExpertsKind::Qwen35Moe { shared_inner } => meta.extend([
                (k("expert_feed_forward_length"), u(e.inner)),
                (k("expert_shared_feed_forward_length"), u(shared_inner)),
            ]),
            ExpertsKind::GptOss { sliding_window } => meta.extend([
                (k("expert_feed_forward_length"), u(e.inner)),
                // every other layer, the first included, slides: llama.cpp's
                // period 2 when no pattern is written, as its converter writes
                (k("attention.sliding_window"), u(sliding_window)),
            ]),
            ExpertsKind::Mixtral => {}
        }
    }
    if let Some(la) = shape.linear {
        // as the converter writes Qwen3.5: the linear layers' sizes, which
        // layers are linear, and the multimodal RoPE sections its loader
        // requires (the same rotation for text positions)
        let recurrent = (0..s.num_layers).map(|l| la.is_linear(l)).collect();
        meta.extend([
            (k("ssm.conv_kernel"), u(la.conv_kernel)),
            (k("ssm.state_size"), u(la.key_dim)),
            (k("ssm.group_count"), u(la.key_heads)),
            (k("ssm.time_step_rank"), u(la.value_heads)),
            (k("ssm.inner_size"), u(la.value_heads * la.value_dim)),
            (k("attention.recurrent_layers"), MetaValue::Bools(recurrent)),
            (k("full_attention_interval"), u(la.full_interval)),
            (
                k("rope.dimension_sections"),
                MetaValue::I32s(vec![11, 11, 10, 0]),
            ),
        ]);
    }
    if let Layout::Olmo { window: Some(w) } = s.layout {
        // as the converter writes OLMo 3: which layers slide, one flag per
        // layer (as the config has them); the sliding layers' base is the
        // same, unscaled
        let pattern = shape
            .config()?
            .sliding_window
            .iter()
            .map(Option::is_some)
            .collect();
        meta.extend([
            (k("attention.sliding_window"), u(w)),
            (
                k("attention.sliding_window_pattern"),
                MetaValue::Bools(pattern),
            ),
            (k("rope.freq_base_swa"), MetaValue::F32(s.rope_theta as f32)),
        ]);
    }
    if let Some(params) = yarn_params(&shape.rope_scaling) {
        meta.push((k("rope.scaling.type"), MetaValue::Str("yarn".into())));
        for (name, value) in params {
            let (suffix, value) = match name {
                "factor" => ("factor", MetaValue::F32(value as f32)),
                "original_max_position_embeddings" => {
                    ("original_context_length", MetaValue::U32(value as u32))
                }
                "attention_factor" => ("yarn_attn_factor", MetaValue::F32(value as f32)),
                "beta_fast" => ("yarn_beta_fast", MetaValue::F32(value as f32)),
                _ => ("yarn_beta_slow", MetaValue::F32(value as f32)),
            };
            meta.push((k(&format!("rope.scaling.{suffix}")), value));
        }
    }
    meta.extend([
        ("tokenizer.ggml.model".into(), MetaValue::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), MetaValue::Str(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Strs(vocab.tokens),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::I32s(vocab.types.iter().map(|t| *t as i32).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            MetaValue::Strs(vocab.merges),
        ),
        (
            "tokenizer.ggml.bos_token_id".into(),
            MetaValue::U32(shape.tokens.bos),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            MetaValue::U32(shape.tokens.eos),
        ),
    ]);
    if let Some(pad) = shape.tokens.pad {
        meta.push((
            "tokenizer.ggml.padding_token_id".into(),
            MetaValue::U32(pad),
        ));
    }
    meta.push((
        "tokenizer.ggml.add_bos_token".into(),
        MetaValue::Bool(shape.adds_bos()),
    ));
    Ok(meta)
}

/// Gemma 4's keys into `meta` (which holds the generic ones), as
/// llama.cpp's converter writes them: one MLP width per layer where the
/// shared layers' are doubled, one K/V head count per layer where the
/// config names the full layers' (their keys being their values), the
/// full layers' head width
/// (`key_length`, and `rope.dimension_count`: their rotation spans the
/// head, `rope_freqs` saying which pairs turn) and the sliding layers'
/// (`key_length_swa`), the sliding layers' base, the window and which
/// layers slide, the shared layers, the per-layer inputs' width and the
/// soft cap.
fn gemma4_metadata(shape: &ModelShape, g: Gemma4Shape, meta: &mut Vec<(String, MetaValue)>) {
    let s = &shape.sizes;
    let a = shape.arch().gguf_name();
    let k = |suffix: &str| format!("{a}.{suffix}");
    let u = |n: usize| MetaValue::U32(n as u32);
    let sliding = (0..s.num_layers)
        .map(|l| !g.is_full(l, s.num_layers))
        .collect();
    let set = |meta: &mut Vec<(String, MetaValue)>, key: String, value: MetaValue| match meta
        .iter_mut()
        .find(|(k, _)| *k == key)
    {
        Some(entry) => entry.1 = value,
        None => meta.push((key, value)),
    };
    if g.double_wide_mlp {
        let widths = (0..s.num_layers)
            .map(|l| g.mlp_width(l, s.num_layers, s.intermediate_size) as i32)
            .collect();
        set(meta, k("feed_forward_length"), MetaValue::I32s(widths));
    }
    if g.keys_are_values {
        let kv_heads = (0..s.num_layers)
            .map(|l| g.kv_heads(l, s.num_layers, s.num_kv_heads) as i32)
            .collect();
        set(
            meta,
            k("attention.head_count_kv"),
            MetaValue::I32s(kv_heads),
        );
    }
    set(meta, k("rope.dimension_count"), u(g.full_head_dim));
    for (key, value) in [
        (k("attention.key_length"), u(g.full_head_dim)),
        (k("attention.value_length"), u(g.full_head_dim)),
        (k("attention.key_length_swa"), u(shape.head_dim())),
        (k("attention.value_length_swa"), u(shape.head_dim())),
        (k("rope.dimension_count_swa"), u(shape.head_dim())),
        (
            k("rope.freq_base_swa"),
            MetaValue::F32(g.sliding_theta as f32),
        ),
        (
            k("final_logit_softcapping"),
            MetaValue::F32(g.softcap as f32),
        ),
        (k("attention.sliding_window"), u(g.window)),
        (
            k("attention.sliding_window_pattern"),
            MetaValue::Bools(sliding),
        ),
        (k("attention.shared_kv_layers"), u(g.shared)),
        (k("embedding_length_per_layer_input"), u(g.layer_input)),
    ] {
        set(meta, key, value);
    }
}

/// Gemma 4's `rope_freqs`, as the converter writes its full layers'
/// proportional rotation: one divisor per pair `(i, i + D/2)` of a full
/// head, 1 for the first quarter of the head's pairs and 1e30 (never
/// turned) for the rest; `None` for another family.
fn proportional_factors(shape: &ModelShape) -> Option<Vec<f32>> {
    let g = shape.gemma4?;
    let half = g.full_head_dim / 2;
    let turned = (g.full_head_dim as f64 * Gemma4Shape::FULL_ROTARY) as usize / 2;
    Some(
        (0..half)
            .map(|i| if i < turned { 1.0 } else { 1e30 })
            .collect(),
    )
}

/// Write the GGUF file of `shape` in `format` to `path` (a new file), the
/// weights drawn from `seed` and quantized a slice of rows at a time.
pub fn write(
    shape: &ModelShape,
    format: Format,
    path: &Path,
    seed: u64,
    progress: Progress<'_>,
) -> Result<()> {
    let plan = plan(shape, format)?;
    let vocab = Vocabulary::for_shape(shape)?;
    let io = |e| SynthError::io(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = BufWriter::with_capacity(8 << 20, file);
    write_header(&mut w, &metadata(shape, format, vocab)?, &plan.infos).map_err(io)?;
    let (offs, _) = offsets(&plan.infos);
    let total = plan.data_bytes();
    let (mut at, mut done) = (0u64, 0u64);
    for ((info, source), off) in plan.infos.iter().zip(&plan.sources).zip(offs) {
        w.write_all(&vec![0u8; (off - at) as usize]).map_err(io)?;
        at = off;
        let mut emit = |bytes: &[u8]| -> Result<()> {
            w.write_all(bytes).map_err(io)?;
            at += bytes.len() as u64;
            done += bytes.len() as u64;
            progress(done, total);
            Ok(())
        };
        match source {
            Source::RopeFactors(f) => {
                let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
                emit(&bytes)?;
            }
            Source::Weight(t, how) => {
                let ty = stored_type(shape, format, t);
                stream_weight(t, how, (ty, seed), &mut emit)?;
            }
            Source::Experts(slabs) => {
                for t in slabs {
                    let ty = stored_type(shape, format, t);
                    stream_weight(t, &Stored::default(), (ty, seed), &mut emit)?;
                }
            }
            Source::Fused(t, part) => {
                let ty = stored_type(shape, format, t);
                stream_fused(t, *part, (ty, seed), &mut emit)?;
            }
        }
        debug_assert_eq!(at, off + info.bytes);
    }
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)
}

/// Draw weight `t` a slice of rows at a time, stored as `how` says (rows
/// and columns in llama.cpp's order, values changed as its converter
/// changes them), store each slice in `ty` and hand its bytes on.
fn stream_weight(
    t: &TensorSpec,
    how: &Stored,
    (ty, seed): (StoredType, u64),
    emit: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let (rows, cols) = (t.rows(), t.cols());
    let order: Vec<usize> = how.rows.clone().unwrap_or_else(|| (0..rows).collect());
    for slice in order.chunks(rows_per_slice(cols)) {
        let mut values = draw::rows_at(seed, &t.name, t.kind, cols, slice);
        if let Some(order) = &how.cols {
            values = values
                .chunks(cols)
                .flat_map(|row| order.iter().map(|&c| row[c]))
                .collect();
        }
        if how.values != ValueChange::None {
            values.iter_mut().for_each(|x| *x = how.values.apply(*x));
        }
        ty.emit(&t.name, (values, slice.len(), cols), emit)?;
    }
    Ok(())
}

/// Write part `part` of gpt-oss's fused expert tensor `t` as llama.cpp
/// stores it, one expert at a time: that expert's rows drawn, turned (and
/// for the gate and up projections, their alternating rows taken), then
/// stored in `ty`.
fn stream_fused(
    t: &TensorSpec,
    part: FusedPart,
    (ty, seed): (StoredType, u64),
    emit: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let experts = t.dims[0];
    let draw = |rows: std::ops::Range<usize>| draw::rows(seed, &t.name, t.kind, t.cols(), rows);
    match part {
        FusedPart::Gate | FusedPart::Up => {
            // drawn [hidden, 2 inner] per expert; stored [inner, hidden]
            let (d, two_i) = (t.dims[1], t.dims[2]);
            let (inner, odd) = (two_i / 2, usize::from(part == FusedPart::Up));
            for e in 0..experts {
                let slab = draw(e * d..(e + 1) * d);
                let turned = (0..inner * d)
                    .map(|k| slab[(k % d) * two_i + 2 * (k / d) + odd])
                    .collect();
                ty.emit(&t.name, (turned, inner, d), emit)?;
            }
        }
        FusedPart::Down => {
            // drawn [inner, hidden] per expert; stored [hidden, inner]
            let (inner, d) = (t.dims[1], t.dims[2]);
            for e in 0..experts {
                let slab = draw(e * inner..(e + 1) * inner);
                let turned = (0..d * inner)
                    .map(|k| slab[(k % inner) * d + k / inner])
                    .collect();
                ty.emit(&t.name, (turned, d, inner), emit)?;
            }
        }
        FusedPart::GateBias | FusedPart::UpBias => {
            let two_i = t.dims[1];
            let odd = usize::from(part == FusedPart::UpBias);
            let all = draw(0..experts);
            let picked = all.iter().skip(odd).step_by(2).copied().collect();
            ty.emit(&t.name, (picked, experts, two_i / 2), emit)?;
        }
        FusedPart::Whole => stream_weight(t, &Stored::default(), (ty, seed), emit)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's permute: within each head, row 2i + half holds Hugging
    /// Face row half * hd/2 + i (hd = 8: rows 0, 4, 1, 5, 2, 6, 3, 7).
    #[test]
    fn q_and_k_rows_follow_llama_cpp_order() {
        assert_eq!(permuted_rows(8, 1), vec![0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(&permuted_rows(16, 2)[8..], &[8, 12, 9, 13, 10, 14, 11, 15]);
    }

    /// Llama 3's factors keep high frequencies (1) and divide the lowest by
    /// the scaling factor.
    #[test]
    fn rope_factors_span_one_to_the_scaling_factor() {
        let f = rope_factors(&crate::shapes::llama_3_1_8b()).unwrap();
        assert_eq!(f.len(), 64);
        assert!(
            (f[0] - 1.0).abs() < 1e-6 && (f[63] - 8.0).abs() < 1e-4,
            "{f:?}"
        );
        assert!(rope_factors(&crate::shapes::qwen2_5_1_5b()).is_none());
        assert!(rope_factors(&crate::shapes::olmo_3_7b()).is_none());
    }

    /// llama.cpp permutes Llama's and SmolLM3's Q/K rows, not Qwen2's or
    /// OLMo's; OLMo's norm after attention is `post_attention_norm`, where
    /// Llama's `post_attention_layernorm` is its `ffn_norm`.
    #[test]
    fn permutation_and_names_follow_the_architecture() {
        use crate::shapes;
        let q = "model.layers.0.self_attn.q_proj.weight";
        let k = "model.layers.0.self_attn.k_proj.weight";
        assert_eq!(permuted_heads(&shapes::smollm3_3b(), q), Some(16));
        assert_eq!(permuted_heads(&shapes::smollm3_3b(), k), Some(4));
        assert_eq!(permuted_heads(&shapes::llama_3_1_8b(), k), Some(8));
        assert_eq!(permuted_heads(&shapes::olmo_3_7b(), q), None);
        assert_eq!(permuted_heads(&shapes::qwen2_5_1_5b(), q), None);
        let norm = "model.layers.7.post_attention_layernorm.weight";
        assert_eq!(
            tensor_name(&shapes::olmo_3_7b(), norm),
            "blk.7.post_attention_norm.weight"
        );
        assert_eq!(
            tensor_name(&shapes::smollm3_3b(), norm),
            "blk.7.ffn_norm.weight"
        );
        assert_eq!(
            tensor_name(
                &shapes::olmo_3_7b(),
                "model.layers.7.post_feedforward_layernorm.weight"
            ),
            "blk.7.post_ffw_norm.weight"
        );
        assert_eq!(
            tensor_name(
                &shapes::olmo_3_7b(),
                "model.layers.7.self_attn.k_norm.weight"
            ),
            "blk.7.attn_k_norm.weight"
        );
    }

    /// The full shapes' metadata: architecture, tokenizer, BoS, OLMo 3's
    /// window and pattern, YaRN's keys (its default attention factor left
    /// out, as the converter leaves it when the config does).
    #[test]
    fn metadata_names_the_architecture_and_its_layers() {
        use crate::shapes;
        let meta = |shape: &ModelShape| -> std::collections::HashMap<String, MetaValue> {
            let vocab = Vocabulary::for_shape(shape).unwrap();
            metadata(shape, Format::GgufQ4KM, vocab)
                .unwrap()
                .into_iter()
                .collect()
        };
        let str_of = |v: &MetaValue| match v {
            MetaValue::Str(s) => s.clone(),
            other => panic!("{other:?}"),
        };
        let smol = meta(&shapes::smollm3_3b());
        assert_eq!(str_of(&smol["general.architecture"]), "smollm3");
        assert_eq!(str_of(&smol["tokenizer.ggml.pre"]), "llama-bpe");
        assert_eq!(smol["tokenizer.ggml.add_bos_token"], MetaValue::Bool(false));
        assert!(
            !smol
                .keys()
                .any(|k| k.contains("sliding") || k.contains("scaling"))
        );
        let olmo = meta(&shapes::olmo_3_7b());
        assert_eq!(str_of(&olmo["general.architecture"]), "olmo2");
        assert_eq!(str_of(&olmo["tokenizer.ggml.pre"]), "dbrx");
        assert_eq!(olmo["tokenizer.ggml.add_bos_token"], MetaValue::Bool(false));
        assert_eq!(olmo["olmo2.attention.sliding_window"], MetaValue::U32(4096));
        let MetaValue::Bools(pattern) = &olmo["olmo2.attention.sliding_window_pattern"] else {
            panic!("no pattern");
        };
        assert_eq!(pattern.len(), 32);
        assert_eq!(pattern.iter().filter(|s| !**s).count(), 8);
        assert_eq!((pattern[0], pattern[3], pattern[31]), (true, false, false));
        assert_eq!(olmo["olmo2.rope.freq_base_swa"], MetaValue::F32(500_000.0));
        assert_eq!(str_of(&olmo["olmo2.rope.scaling.type"]), "yarn");
        assert_eq!(olmo["olmo2.rope.scaling.factor"], MetaValue::F32(8.0));
        assert_eq!(
            olmo["olmo2.rope.scaling.original_context_length"],
            MetaValue::U32(8192)
        );
        assert!(!olmo.contains_key("olmo2.rope.scaling.yarn_attn_factor"));
        assert_eq!(
            olmo["tokenizer.ggml.padding_token_id"],
            MetaValue::U32(100_277)
        );
        let llama = meta(&shapes::llama_3_2_1b());
        assert_eq!(llama["tokenizer.ggml.add_bos_token"], MetaValue::Bool(true));
    }

    /// The experts' keys as llama.cpp's converter writes them: Qwen3-MoE
    /// (`qwen3moe`) with its expert width and its own head width as K/V
    /// lengths, Mixtral as `llama` with an expert count and its experts
    /// as wide as `feed_forward_length`; the tokenizers' names.
    #[test]
    fn metadata_names_the_experts() {
        use crate::shapes;
        let meta = |shape: &ModelShape| -> std::collections::HashMap<String, MetaValue> {
            let vocab = Vocabulary::for_shape(shape).unwrap();
            metadata(shape, Format::GgufQ4KM, vocab)
                .unwrap()
                .into_iter()
                .collect()
        };
        let qwen = meta(&shapes::qwen3_30b_a3b());
        assert_eq!(
            qwen["general.architecture"],
            MetaValue::Str("qwen3moe".into())
        );
        for (key, value) in [
            ("qwen3moe.expert_count", 128),
            ("qwen3moe.expert_used_count", 8),
            ("qwen3moe.expert_feed_forward_length", 768),
            ("qwen3moe.feed_forward_length", 6144),
            ("qwen3moe.attention.key_length", 128),
            ("qwen3moe.attention.value_length", 128),
            ("qwen3moe.attention.head_count", 32),
            ("qwen3moe.attention.head_count_kv", 4),
            ("qwen3moe.block_count", 48),
        ] {
            assert_eq!(qwen[key], MetaValue::U32(value), "{key}");
        }
        assert_eq!(qwen["tokenizer.ggml.pre"], MetaValue::Str("qwen2".into()));
        assert_eq!(qwen["tokenizer.ggml.add_bos_token"], MetaValue::Bool(false));
        let mixtral = meta(&shapes::mixtral_8x7b());
        assert_eq!(
            mixtral["general.architecture"],
            MetaValue::Str("llama".into())
        );
        for (key, value) in [
            ("llama.expert_count", 8),
            ("llama.expert_used_count", 2),
            ("llama.feed_forward_length", 14_336),
            ("llama.rope.dimension_count", 128),
        ] {
            assert_eq!(mixtral[key], MetaValue::U32(value), "{key}");
        }
        assert!(!mixtral.contains_key("llama.expert_feed_forward_length"));
        assert!(!mixtral.contains_key("llama.attention.key_length"));
        assert_eq!(
            mixtral["tokenizer.ggml.add_bos_token"],
            MetaValue::Bool(true)
        );
    }

    /// llama.cpp's Q4_K_M on experts: routers stay f32; the experts' down
    /// projections take Q6_K where a dense down projection would
    /// (`use_more_bits` on the layer in the name); with exactly 8 experts
    /// (Mixtral) K and V are Q8_0 and the attention output Q5_K, which 128
    /// experts (Qwen3-30B-A3B) do not get. Each layer's experts are one
    /// 3-D tensor [experts, rows, columns] of the projection's type.
    #[test]
    fn experts_take_llama_cpps_q4_k_m_types_and_stack() {
        use crate::shapes;
        let type_of = |shape: &ModelShape, name: &str| {
            let t = shape
                .tensors()
                .into_iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("{name}"));
            ggml_type(shape, Format::GgufQ4KM, &t)
        };
        // 32 layers: more bits at 0-3, 6, 9, ..., 27 and 28-31
        let mixtral = shapes::mixtral_8x7b().with_layers(32);
        let l = |i: usize, rest: &str| format!("model.layers.{i}.{rest}.weight");
        for (name, ty) in [
            (l(0, "block_sparse_moe.gate"), GgmlDType::F32),
            (l(0, "block_sparse_moe.experts.3.w2"), GgmlDType::Q6K),
            (l(5, "block_sparse_moe.experts.3.w2"), GgmlDType::Q4K),
            (l(6, "block_sparse_moe.experts.0.w2"), GgmlDType::Q6K),
            (l(6, "block_sparse_moe.experts.0.w1"), GgmlDType::Q4K),
            (l(6, "block_sparse_moe.experts.0.w3"), GgmlDType::Q4K),
            (l(5, "self_attn.k_proj"), GgmlDType::Q8_0),
            (l(5, "self_attn.v_proj"), GgmlDType::Q8_0),
            (l(5, "self_attn.o_proj"), GgmlDType::Q5K),
            (l(5, "self_attn.q_proj"), GgmlDType::Q4K),
            ("lm_head.weight".into(), GgmlDType::Q6K),
            ("model.embed_tokens.weight".into(), GgmlDType::Q4K),
        ] {
            assert_eq!(type_of(&mixtral, &name), ty, "{name}");
        }
        let qwen = shapes::qwen3_30b_a3b();
        for (name, ty) in [
            (l(0, "mlp.gate"), GgmlDType::F32),
            (l(0, "mlp.experts.100.down_proj"), GgmlDType::Q6K),
            (l(7, "mlp.experts.100.down_proj"), GgmlDType::Q4K),
            (l(8, "mlp.experts.100.down_proj"), GgmlDType::Q6K),
            (l(8, "self_attn.v_proj"), GgmlDType::Q6K),
            (l(7, "self_attn.k_proj"), GgmlDType::Q4K),
            (l(7, "self_attn.v_proj"), GgmlDType::Q4K),
            (l(7, "self_attn.o_proj"), GgmlDType::Q4K),
            (l(7, "self_attn.q_norm"), GgmlDType::F32),
        ] {
            assert_eq!(type_of(&qwen, &name), ty, "{name}");
        }
        // the router stays f32 in every format
        for format in [Format::GgufQ4_0, Format::GgufQ4K, Format::GgufQ8_0] {
            let t = &qwen.tensors()[..20]
                .iter()
                .find(|t| t.kind == TensorKind::Router)
                .cloned()
                .unwrap();
            assert_eq!(ggml_type(&qwen, format, t), GgmlDType::F32, "{format}");
        }
        let plan = plan(&shapes::qwen3_30b_a3b().with_layers(2), Format::GgufQ4KM).unwrap();
        let info = |name: &str| plan.infos.iter().find(|i| i.name == name).unwrap();
        assert_eq!(
            info("blk.1.ffn_gate_exps.weight").dims,
            vec![128, 768, 2048]
        );
        assert_eq!(info("blk.1.ffn_up_exps.weight").dims, vec![128, 768, 2048]);
        let down = info("blk.1.ffn_down_exps.weight");
        assert_eq!(down.dims, vec![128, 2048, 768]);
        assert_eq!(
            (down.type_id, down.bytes),
            (14, type_bytes(GgmlDType::Q6K, 128 * 2048 * 768))
        );
        assert_eq!(info("blk.1.ffn_gate_inp.weight").dims, vec![128, 2048]);
        assert_eq!(info("blk.1.attn_q_norm.weight").dims, vec![128]);
        // 2 x (q, k, v, o, q/k norms, router, 3 stacks, 2 norms), embedding,
        // final norm, head
        assert_eq!(plan.infos.len(), 2 * (4 + 2 + 1 + 3 + 2) + 3);
        assert!(plan.infos.iter().all(|i| !i.name.contains(".experts.")));
    }

    /// A layer's experts are stacked in the order listed, so one listed
    /// out of order (or of another size) is refused by name rather than
    /// written into another expert's slab.
    #[test]
    fn an_expert_out_of_order_is_refused() {
        let shape = crate::shapes::mixtral_8x7b().with_layers(1);
        let mut tensors = shape.tensors();
        let first = tensors
            .iter()
            .position(|t| t.name.contains(".experts.0.w1."))
            .unwrap();
        let second = tensors
            .iter()
            .position(|t| t.name.contains(".experts.1.w1."))
            .unwrap();
        tensors.swap(first, second);
        let err = plan_tensors(&shape, Format::GgufQ4KM, tensors)
            .err()
            .unwrap();
        assert!(
            matches!(&err, SynthError::ExpertOrder { position: 0, expert, .. }
                if expert.contains(".experts.1.w1.")),
            "{err}"
        );
        assert!(
            err.to_string().contains("blk.0.ffn_gate_exps.weight"),
            "{err}"
        );
        let mut narrow = shape.tensors();
        if let Some(t) = narrow
            .iter_mut()
            .find(|t| t.name.contains(".experts.3.w3."))
        {
            t.dims = vec![256, 4096];
        }
        let err = plan_tensors(&shape, Format::GgufQ8_0, narrow)
            .err()
            .unwrap();
        assert!(
            matches!(err, SynthError::ExpertOrder { position: 3, .. }),
            "{err}"
        );
    }

    /// What a GGUF cannot record is refused by name rather than written as
    /// another model.
    #[test]
    fn an_unrecordable_shape_is_refused() {
        let mut smol = crate::shapes::smollm3_3b();
        smol.sizes.layout = Layout::Smollm3 { nope_interval: 3 };
        let err = plan(&smol, Format::GgufQ8_0).err().unwrap();
        assert!(matches!(err, SynthError::Unrecordable { .. }), "{err}");
        assert!(err.to_string().contains("every 3 layers"), "{err}");
        let mut olmo = crate::shapes::olmo_3_7b();
        if let RopeScaling::Yarn { truncate, .. } = &mut olmo.rope_scaling {
            *truncate = false;
        }
        assert!(plan(&olmo, Format::GgufQ4_0).is_err());
        assert!(plan(&crate::shapes::olmo_3_7b(), Format::GgufQ4_0).is_ok());
    }
}
