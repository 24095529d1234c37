//! The RoPE of each layer type, for models whose sliding and full layers
//! rotate differently (Gemma 3: a base each; OLMo 3: scaling on full layers
//! only): transformers 5's `rope_parameters` with one object per layer type,
//! or the older `rope_theta` / `rope_scaling` with the sliding layers' base
//! in a field of its own (or the same `rope_theta`), unscaled.

use serde_json::{Map, Value};

use super::{Fields, RopeConfig, read_rope, rope_from};
use crate::error::Result;

/// What an architecture assumes where its config is silent.
pub(super) struct RopeDefaults {
    /// The full layers' base when no field names one.
    pub(super) global_theta: f64,
    /// The older top-level field holding the sliding layers' base.
    pub(super) sliding_field: &'static str,
    /// The sliding layers' base when that field is absent.
    pub(super) sliding_theta: f64,
}

/// The RoPE of global (full) and of sliding layers.
pub(super) fn ropes(
    f: &Fields<'_>,
    head_dim: usize,
    defaults: &RopeDefaults,
) -> Result<(RopeConfig, RopeConfig)> {
    if let Some(Value::Object(per_type)) = f.get("rope_parameters")
        && (per_type.contains_key("full_attention") || per_type.contains_key("sliding_attention"))
    {
        // transformers 5: one parameters object per layer type
        let global = layer_type_params(f, per_type, "full_attention")?;
        let sliding = layer_type_params(f, per_type, "sliding_attention")?;
        return Ok((
            rope_from(f, global, ("rope_theta", defaults.global_theta), head_dim)?,
            rope_from(
                f,
                sliding,
                (defaults.sliding_field, defaults.sliding_theta),
                head_dim,
            )?,
        ));
    }
    // the older keys: `rope_theta` and `rope_scaling` (or one flat
    // `rope_parameters`) for global layers, the sliding field's base
    // unscaled for sliding ones
    let global = read_rope(f, head_dim, defaults.global_theta)?;
    let sliding = rope_from(
        f,
        ("rope_scaling", None),
        (defaults.sliding_field, defaults.sliding_theta),
        head_dim,
    )?;
    Ok((global, sliding))
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
