//! What a Qwen3.5 config (`qwen3_5_text`, transformers 5.24) says beyond
//! the shared fields: which layers are linear-attention layers (Gated
//! DeltaNet; `layer_types`, or transformers' default of three linear layers
//! then a full one, `full_attention_interval`), the linear layers' head
//! counts and widths and their convolution's kernel (`linear_*`), and the
//! full layers' rotation of a quarter of the head by default
//! (`partial_rotary_factor`). The same fields serve the mixture-of-experts
//! variant (`qwen3_5_moe_text`, whose experts `read_experts` reads). The
//! multimodal wrappers (`qwen3_5`, `qwen3_5_moe`) are read through their
//! `text_config` (`multimodal`).

use super::{Fields, LinearAttentionConfig};
use crate::error::Result;

/// transformers' defaults of the config class.
const DEFAULT_INTERVAL: usize = 4;
const DEFAULT_KEY_HEADS: usize = 16;
const DEFAULT_VALUE_HEADS: usize = 32;
const DEFAULT_HEAD_DIM: usize = 128;
const DEFAULT_KERNEL: usize = 4;
/// transformers' default share of the head that rotates on full layers.
pub(super) const DEFAULT_PARTIAL_ROTARY: f64 = 0.25;

/// Read the linear-attention fields of `f` for a model of `num_layers`
/// layers.
pub(super) fn read(f: &Fields<'_>, num_layers: usize) -> Result<LinearAttentionConfig> {
    let layers = layer_types(f, num_layers)?;
    let count = |field: &str, default: usize| -> Result<usize> {
        match f.get(field) {
            None => Ok(default),
            Some(_) => f.positive(field),
        }
    };
    let key_heads = count("linear_num_key_heads", DEFAULT_KEY_HEADS)?;
    let value_heads = count("linear_num_value_heads", DEFAULT_VALUE_HEADS)?;
    if !value_heads.is_multiple_of(key_heads) {
        return Err(f.err(
            "linear_num_value_heads",
            &format!(
                "a multiple of linear_num_key_heads ({key_heads}): each key head serves whole value heads"
            ),
            f.get("linear_num_value_heads"),
        ));
    }
    let key_head_dim = count("linear_key_head_dim", DEFAULT_HEAD_DIM)?;
    let value_head_dim = count("linear_value_head_dim", DEFAULT_HEAD_DIM)?;
    // a kernel of 0 would convolve nothing; one wider than a size bound
    // would make the convolution state larger than any model's
    let conv_kernel = match f.get("linear_conv_kernel_dim") {
        None => DEFAULT_KERNEL,
        Some(_) => f.positive_at_most("linear_conv_kernel_dim", 1 << 16)?,
    };
    // the widths the loader multiplies: a projection of every head
    for (field, heads, dim) in [
        ("linear_key_head_dim", key_heads, key_head_dim),
        ("linear_value_head_dim", value_heads, value_head_dim),
    ] {
        if heads.saturating_mul(dim) > super::MAX_SIZE {
            return Err(f.err(
                field,
                &format!(
                    "heads x head width at most {} (a projection's width)",
                    super::MAX_SIZE
                ),
                f.get(field),
            ));
        }
    }
    Ok(LinearAttentionConfig {
        layers,
        key_heads,
        value_heads,
        key_head_dim,
        value_head_dim,
        conv_kernel,
        value_heads_tiled: false,
    })
}

/// Whether each layer is a linear-attention layer: `layer_types`, or
/// transformers' default of every `full_attention_interval`-th layer
/// (counting from 1) full and the others linear.
fn layer_types(f: &Fields<'_>, num_layers: usize) -> Result<Vec<bool>> {
    match f.get("layer_types") {
        Some(types) => {
            let Some(types) = types.as_array().filter(|t| t.len() == num_layers) else {
                return Err(f.err(
                    "layer_types",
                    &format!("a list of {num_layers} layer types (num_hidden_layers)"),
                    Some(types),
                ));
            };
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(f.err(
                        "layer_types",
                        "linear_attention or full_attention per layer",
                        Some(t),
                    )),
                })
                .collect()
        }
        None => {
            let interval = match f.get("full_attention_interval") {
                None => DEFAULT_INTERVAL,
                Some(_) => f.positive("full_attention_interval")?,
            };
            Ok((0..num_layers)
                .map(|l| !(l + 1).is_multiple_of(interval))
                .collect())
        }
    }
}
