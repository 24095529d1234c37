//! What a Gemma 3 config says beyond Gemma-2's rules: which layers slide
//! (`layer_types`, or the older `sliding_window_pattern`), the RoPE
//! defaults of each layer type (read by `layer_ropes.rs`), and the
//! variants lcut refuses by name: the multimodal `gemma3` and a
//! bidirectional encoder (EmbeddingGemma).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::Fields;
use super::layer_ropes::RopeDefaults;
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

/// Gemma 3's RoPE defaults: global layers 1e6, sliding layers their own
/// base (`rope_local_base_freq`, 1e4), unscaled.
pub(super) const ROPES: RopeDefaults = RopeDefaults {
    global_theta: GLOBAL_THETA,
    sliding_field: "rope_local_base_freq",
    sliding_theta: LOCAL_THETA,
};

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
