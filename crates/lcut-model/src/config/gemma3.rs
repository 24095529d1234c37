//! What a Gemma 3 config says beyond Gemma-2's rules: the fields it may
//! leave to transformers' class defaults (as the published multimodal
//! Gemma 3 configs do), which layers slide (`layer_types`, or the older
//! `sliding_window_pattern`), the RoPE defaults of each layer type (read
//! by `layer_ropes.rs`), and the variant lcut refuses by name: a
//! bidirectional encoder (EmbeddingGemma).

use serde_json::{Map, Value};

use super::Fields;
use super::layer_ropes::RopeDefaults;
use crate::error::Result;

/// transformers' `Gemma3TextConfig` defaults (5.24, as 4.50's) of the
/// fields where lcut's generic reading would differ or require the field:
/// a `gemma3_text` config that omits one means this value. The published
/// multimodal Gemma 3 configs name little more than the sizes that differ
/// (gemma-3-4b's `text_config`: its width, MLP, depth, window and RoPE
/// scaling), leaving its 8 heads, 4 K/V heads 256 wide and 262,208 tokens
/// here. The other fields' defaults (RMSNorm eps, positions, window, the
/// query scale, the RoPE bases, the tie) are read where lcut reads them.
pub const TEXT_CLASS_DEFAULTS: [(&str, u64); 10] = [
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("bos_token_id", 2),
    ("eos_token_id", 1),
    ("pad_token_id", 0),
];

/// `map` (a `gemma3_text` config) with [`TEXT_CLASS_DEFAULTS`] for the
/// fields it does not name (a `null` counts as named: it is read, and
/// refused where a size is required).
pub(super) fn with_class_defaults(map: &Map<String, Value>) -> Map<String, Value> {
    let mut out = map.clone();
    for (field, value) in TEXT_CLASS_DEFAULTS {
        out.entry(field).or_insert_with(|| Value::from(value));
    }
    out
}

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
