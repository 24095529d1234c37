//! What a Gemma 3 config says beyond Gemma-2's rules: which layers slide
//! (`layer_types`, or the older `sliding_window_pattern`), the RoPE of each
//! layer type (transformers 5's `rope_parameters` per layer type, or the
//! older `rope_theta` / `rope_scaling` / `rope_local_base_freq`), and the
//! variants lcut refuses by name: the multimodal `gemma3` and a
//! bidirectional encoder (EmbeddingGemma).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{Fields, RopeConfig, read_rope, rope_from};
use crate::error::{ModelError, Result};

/// transformers' default period: five sliding layers, then a global one.
const DEFAULT_PATTERN: usize = 6;
/// transformers' default RoPE bases of global and sliding layers.
const GLOBAL_THETA: f64 = 1_000_000.0;
const LOCAL_THETA: f64 = 10_000.0;

/// The period of the sliding/global pattern (`sliding_window_pattern`,
/// transformers' default 6): layer `l` is global when `(l + 1) % period == 0`.
pub(super) fn pattern(f: &Fields<'_>) -> Result<usize> {
    match f.opt_usize("sliding_window_pattern")? {
        None => Ok(DEFAULT_PATTERN),
        Some(0) => Err(f.err(
            "sliding_window_pattern",
            "a positive period (every period-th layer is global)",
            f.get("sliding_window_pattern"),
        )),
        Some(p) => Ok(p),
    }
}

/// Whether layer `l` slides under a pattern of period `period`.
pub(super) fn is_sliding(l: usize, period: usize) -> bool {
    !(l + 1).is_multiple_of(period)
}

/// The RoPE of global and of sliding layers.
pub(super) fn ropes(f: &Fields<'_>, head_dim: usize) -> Result<(RopeConfig, RopeConfig)> {
    if let Some(Value::Object(per_type)) = f.get("rope_parameters")
        && (per_type.contains_key("full_attention") || per_type.contains_key("sliding_attention"))
    {
        // transformers 5: one parameters object per layer type
        let global = layer_type_params(f, per_type, "full_attention")?;
        let sliding = layer_type_params(f, per_type, "sliding_attention")?;
        return Ok((
            rope_from(f, global, ("rope_theta", GLOBAL_THETA), head_dim)?,
            rope_from(f, sliding, ("rope_local_base_freq", LOCAL_THETA), head_dim)?,
        ));
    }
    // the older keys: `rope_theta` and `rope_scaling` (or one flat
    // `rope_parameters`) for global layers, `rope_local_base_freq` unscaled
    // for sliding ones
    let mut global = read_rope(f, head_dim)?;
    if f.get("rope_theta").is_none() && !has_theta(f.get("rope_parameters")) {
        global.theta = GLOBAL_THETA;
    }
    let sliding = rope_from(
        f,
        ("rope_scaling", None),
        ("rope_local_base_freq", LOCAL_THETA),
        head_dim,
    )?;
    Ok((global, sliding))
}

/// Whether a parameters object names its own `rope_theta`.
fn has_theta(params: Option<&Value>) -> bool {
    params
        .and_then(Value::as_object)
        .is_some_and(|m| m.get("rope_theta").is_some_and(|v| !v.is_null()))
}

/// The parameters object of layer type `name` in `rope_parameters`, with
/// the name errors give it.
fn layer_type_params<'a>(
    f: &Fields<'_>,
    per_type: &'a Map<String, Value>,
    name: &str,
) -> Result<(&'static str, Option<&'a Map<String, Value>>)> {
    let field = match name {
        "full_attention" => "rope_parameters.full_attention",
        _ => "rope_parameters.sliding_attention",
    };
    match per_type.get(name) {
        None | Some(Value::Null) => Ok((field, None)),
        Some(Value::Object(m)) => Ok((field, Some(m))),
        Some(v) => Err(f.err(field, "an object", Some(v))),
    }
}

/// A Gemma 3 config with bidirectional attention is an encoder
/// (EmbeddingGemma), not a causal decoder lcut can run.
pub(super) fn refuse_bidirectional(f: &Fields<'_>) -> Result<()> {
    match f.opt_bool("use_bidirectional_attention")? {
        Some(true) => Err(f.err(
            "use_bidirectional_attention",
            "false: lcut runs causal decoders (this is a bidirectional encoder such as EmbeddingGemma)",
            f.get("use_bidirectional_attention"),
        )),
        _ => Ok(()),
    }
}

/// The error for a multimodal Gemma 3 config (`model_type` `gemma3`, text
/// and vision towers) at `path`, naming the text-only weights beside it.
pub(super) fn multimodal(path: &Path) -> ModelError {
    let folder = path.parent().unwrap_or(Path::new("."));
    ModelError::MultimodalGemma3 {
        path: path.to_path_buf(),
        text_only: text_only_beside(folder)
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
    }
}

/// Text-only weights in `folder`: GGUF files other than a vision
/// projector (`mmproj`), and sub-folders whose config is `gemma3_text`.
fn text_only_beside(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return vec![];
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_text_gguf(p) || is_text_folder(p))
        .collect();
    found.sort();
    found
}

fn is_text_gguf(p: &Path) -> bool {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    p.is_file() && name.ends_with(".gguf") && !name.contains("mmproj")
}

fn is_text_folder(p: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(p.join("config.json")) else {
        return false;
    };
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("model_type")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .is_some_and(|t| t == "gemma3_text")
}
