//! What a Gemma 4 config (`gemma4_text`, transformers 5.24) says beyond the
//! shared fields: which layers slide (`layer_types`, transformers' default
//! of five sliding layers then a full one, the last layer always full), the
//! head width and K/V head count of each layer (`per_layer_config` as
//! transformers 5 saves it, or the released checkpoints' `global_head_dim`
//! and `num_global_key_value_heads`), the RoPE of each layer type (the full
//! layers' proportional rotation), the keys that are the values on full
//! layers (`attention_k_eq_v`), the per-layer inputs
//! (`hidden_size_per_layer_input`), and which layers read another layer's
//! K/V (`num_kv_shared_layers`). Its experts (`enable_moe_block`) are read
//! with the other families' (`read_experts`). The variants lcut does not
//! run yet are refused by name: bidirectional attention. The shared layers'
//! MLPs twice as wide (`use_double_wide_mlp`) are read as transformers runs
//! them.

use serde_json::{Map, Value};

use super::{Fields, LayerAttention, PerLayerInput, RopeConfig, RopeScaling, rope_from};
use crate::error::Result;

/// transformers' default period: five sliding layers, then a full one.
const PATTERN: usize = 6;
/// transformers' defaults of the config class.
const DEFAULT_WINDOW: usize = 512;
const DEFAULT_GLOBAL_HEAD_DIM: usize = 512;
const DEFAULT_PER_LAYER_WIDTH: usize = 256;
const DEFAULT_PER_LAYER_VOCAB: usize = 262_144;
const SLIDING_THETA: f64 = 10_000.0;
const FULL_THETA: f64 = 1_000_000.0;
const FULL_PARTIAL: f64 = 0.25;

/// Everything a Gemma 4 config decides per layer.
pub(super) struct Layout {
    /// The sliding window of each layer (`None`: a full layer).
    pub(super) windows: Vec<Option<usize>>,
    /// Each layer's attention shape and K/V source.
    pub(super) attention: Vec<LayerAttention>,
    /// The full layers' RoPE.
    pub(super) full_rope: RopeConfig,
    /// The sliding layers' RoPE.
    pub(super) sliding_rope: RopeConfig,
    /// The per-layer inputs, where the model has them.
    pub(super) per_layer_input: Option<PerLayerInput>,
    /// The layers whose MLP is twice as wide (`use_double_wide_mlp`: the
    /// layers that read another layer's K/V).
    pub(super) double_wide_mlp: Vec<bool>,
}

/// Read the Gemma 4 fields of `f` for a model of `num_layers` layers of
/// `num_heads` query heads whose sliding layers have `kv_heads` K/V heads of
/// `head_dim` values.
pub(super) fn read(
    f: &Fields<'_>,
    num_layers: usize,
    num_heads: usize,
    (kv_heads, head_dim): (usize, usize),
    vocab_size: usize,
) -> Result<Layout> {
    refuse_unrun(f)?;
    let full = layer_types(f, num_layers)?;
    let window = match f.opt_usize("sliding_window")? {
        None => DEFAULT_WINDOW,
        Some(0) => {
            return Err(f.err(
                "sliding_window",
                "a positive window (tokens a query reads)",
                f.get("sliding_window"),
            ));
        }
        Some(w) => w,
    };
    let windows = full
        .iter()
        .map(|&is_full| (!is_full).then_some(window))
        .collect();
    let k_eq_v = f.opt_bool("attention_k_eq_v")?.unwrap_or(false);
    let full_shape = full_layer_shape(f, num_heads, kv_heads, k_eq_v)?;
    let overrides = per_layer_config(f, num_layers, num_heads)?;
    let mut attention: Vec<LayerAttention> = (0..num_layers)
        .map(|l| {
            let (mut kv, mut hd) = match full[l] {
                true => full_shape,
                false => (kv_heads, head_dim),
            };
            if let Some(&(o_kv, o_hd)) = overrides.get(&l) {
                kv = o_kv.unwrap_or(kv);
                hd = o_hd.unwrap_or(hd);
            }
            LayerAttention {
                kv_heads: kv,
                head_dim: hd,
                values_from_keys: k_eq_v && full[l],
                value_norm: true,
                kv_source: None,
            }
        })
        .collect();
    let full_dims: Vec<usize> = (0..num_layers)
        .filter(|&l| full[l])
        .map(|l| attention[l].head_dim)
        .collect();
    if full_dims.windows(2).any(|w| w[0] != w[1]) {
        return Err(f.err(
            "per_layer_config",
            "one head width for every full_attention layer (they share one RoPE)",
            f.get("per_layer_config"),
        ));
    }
    let sliding_dims: Vec<usize> = (0..num_layers)
        .filter(|&l| !full[l])
        .map(|l| attention[l].head_dim)
        .collect();
    if sliding_dims.windows(2).any(|w| w[0] != w[1]) {
        return Err(f.err(
            "per_layer_config",
            "one head width for every sliding_attention layer (they share one RoPE)",
            f.get("per_layer_config"),
        ));
    }
    // a rotated pair is (i, i + D/2): a head of an odd or single value has none
    let odd = (0..num_layers)
        .find(|&l| attention[l].head_dim < 2 || !attention[l].head_dim.is_multiple_of(2));
    if let Some(l) = odd {
        let a = attention[l];
        let field = match (overrides.contains_key(&l), full[l]) {
            (true, _) => "per_layer_config",
            (false, true) => "global_head_dim",
            (false, false) => "head_dim",
        };
        return Err(f.err(
            field,
            &format!("even head widths of at least 2 (found {})", a.head_dim),
            f.get(field),
        ));
    }
    share_kv(f, &full, &mut attention)?;
    let (full_rope, sliding_rope) = ropes(
        f,
        full_dims.first().copied().unwrap_or(full_shape.1),
        sliding_dims.first().copied().unwrap_or(head_dim),
    )?;
    let double_wide = f.opt_bool("use_double_wide_mlp")?.unwrap_or(false);
    let double_wide_mlp = attention
        .iter()
        .map(|a| double_wide && a.kv_source.is_some())
        .collect();
    Ok(Layout {
        double_wide_mlp,
        windows,
        attention,
        full_rope,
        sliding_rope,
        per_layer_input: per_layer_input(f, vocab_size, num_layers)?,
    })
}

/// Refuse by name what lcut does not run of Gemma 4 yet.
fn refuse_unrun(f: &Fields<'_>) -> Result<()> {
    match f.opt_str("use_bidirectional_attention")? {
        // "vision" changes only image tokens' attention: text stays causal
        None | Some("vision") => Ok(()),
        Some(_) => Err(f.err(
            "use_bidirectional_attention",
            "null or \"vision\": lcut runs causal decoders",
            f.get("use_bidirectional_attention"),
        )),
    }
}

/// Whether each layer is a full-attention layer: `layer_types`, or
/// transformers' default pattern; the last layer is full either way
/// (transformers forces it).
fn layer_types(f: &Fields<'_>, num_layers: usize) -> Result<Vec<bool>> {
    let mut full: Vec<bool> = match f.get("layer_types") {
        None => (0..num_layers)
            .map(|l| (l + 1).is_multiple_of(PATTERN))
            .collect(),
        Some(Value::Array(types)) if types.len() == num_layers => types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(true),
                Some("sliding_attention") => Ok(false),
                _ => Err(f.err(
                    "layer_types",
                    "full_attention or sliding_attention",
                    Some(t),
                )),
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(f.err(
                "layer_types",
                &format!("a list of {num_layers} layer types (num_hidden_layers)"),
                Some(v),
            ));
        }
    };
    if let Some(last) = full.last_mut() {
        *last = true;
    }
    Ok(full)
}

/// The full layers' K/V heads and head width: `global_head_dim` (default
/// 512) and, where keys are the values, `num_global_key_value_heads`
/// (default the sliding layers' count).
fn full_layer_shape(
    f: &Fields<'_>,
    num_heads: usize,
    kv_heads: usize,
    k_eq_v: bool,
) -> Result<(usize, usize)> {
    let head_dim = match f.get("global_head_dim") {
        None => DEFAULT_GLOBAL_HEAD_DIM,
        Some(_) => f.positive("global_head_dim")?,
    };
    let kv = match (k_eq_v, f.get("num_global_key_value_heads")) {
        (true, Some(_)) => f.positive("num_global_key_value_heads")?,
        _ => kv_heads,
    };
    if !num_heads.is_multiple_of(kv) {
        return Err(f.err(
            "num_global_key_value_heads",
            &format!("a divisor of num_attention_heads ({num_heads})"),
            f.get("num_global_key_value_heads"),
        ));
    }
    Ok((kv, head_dim))
}

/// Per layer index, the K/V heads and head width `per_layer_config` sets.
type Overrides = std::collections::BTreeMap<usize, (Option<usize>, Option<usize>)>;

/// transformers 5's `per_layer_config`: per layer index, its
/// `num_key_value_heads` and `head_dim` where they are not the type's.
fn per_layer_config(f: &Fields<'_>, num_layers: usize, num_heads: usize) -> Result<Overrides> {
    let mut out = std::collections::BTreeMap::new();
    let Some(v) = f.get("per_layer_config") else {
        return Ok(out);
    };
    let Value::Object(per) = v else {
        return Err(f.err("per_layer_config", "an object of layer indices", Some(v)));
    };
    for (key, entry) in per {
        let field = format!("per_layer_config.{key}");
        let layer = match key.parse::<usize>() {
            Ok(l) if l < num_layers => l,
            _ => {
                return Err(f.err(
                    "per_layer_config",
                    &format!("layer indices below num_hidden_layers ({num_layers})"),
                    Some(&Value::String(key.clone())),
                ));
            }
        };
        let Value::Object(map) = entry else {
            return Err(f.err(&field, "an object", Some(entry)));
        };
        let sub = Fields { path: f.path, map };
        let size = |name: &str| -> Result<Option<usize>> {
            match sub.get(name) {
                None => Ok(None),
                Some(_) => sub.positive(name).map(Some).map_err(|_| {
                    f.err(
                        &format!("{field}.{name}"),
                        "a positive integer",
                        sub.get(name),
                    )
                }),
            }
        };
        let kv = size("num_key_value_heads")?;
        if let Some(kv) = kv
            && !num_heads.is_multiple_of(kv)
        {
            return Err(f.err(
                &format!("{field}.num_key_value_heads"),
                &format!("a divisor of num_attention_heads ({num_heads})"),
                sub.get("num_key_value_heads"),
            ));
        }
        out.insert(layer, (kv, size("head_dim")?));
    }
    Ok(out)
}

/// The last `num_kv_shared_layers` layers read the K/V of the last
/// unshared layer of their own type, as transformers' `kv_sharing_modes`
/// says; that layer's K/V shape is theirs.
fn share_kv(f: &Fields<'_>, full: &[bool], attention: &mut [LayerAttention]) -> Result<()> {
    let num_layers = full.len();
    let shared = f.opt_usize("num_kv_shared_layers")?.unwrap_or(0);
    if shared == 0 {
        return Ok(());
    }
    if shared >= num_layers {
        return Err(f.err(
            "num_kv_shared_layers",
            &format!(
                "fewer than num_hidden_layers ({num_layers}): a shared layer reads the K/V of an unshared one"
            ),
            f.get("num_kv_shared_layers"),
        ));
    }
    let first = num_layers - shared;
    for l in first..num_layers {
        let source = (0..first).rev().find(|&s| full[s] == full[l]);
        let kind = if full[l] {
            "full_attention"
        } else {
            "sliding_attention"
        };
        let Some(source) = source else {
            return Err(f.err(
                "num_kv_shared_layers",
                &format!(
                    "a count that leaves a {kind} layer below layer {first} for shared layer {l} to read (layer_types has none)"
                ),
                f.get("num_kv_shared_layers"),
            ));
        };
        let (src, reader) = (attention[source], attention[l]);
        if (src.kv_heads, src.head_dim) != (reader.kv_heads, reader.head_dim) {
            return Err(f.err(
                "per_layer_config",
                &format!(
                    "the K/V shape of layer {source} ({} heads of {}) for shared layer {l}, which reads its K/V",
                    src.kv_heads, src.head_dim
                ),
                f.get("per_layer_config"),
            ));
        }
        attention[l].kv_source = Some(source);
        attention[l].values_from_keys = src.values_from_keys;
    }
    Ok(())
}

/// The per-layer inputs: `hidden_size_per_layer_input` values per layer
/// (default 256; 0 or null: none) from a table of
/// `vocab_size_per_layer_input` rows, which must cover the vocabulary.
fn per_layer_input(
    f: &Fields<'_>,
    vocab_size: usize,
    num_layers: usize,
) -> Result<Option<PerLayerInput>> {
    let width = match f.map.get("hidden_size_per_layer_input") {
        None => DEFAULT_PER_LAYER_WIDTH,
        Some(Value::Null) => return Ok(None),
        Some(_) => match f.opt_usize("hidden_size_per_layer_input")? {
            Some(0) | None => return Ok(None),
            Some(_) => f.positive("hidden_size_per_layer_input")?,
        },
    };
    // one table row holds every layer's input
    if width.saturating_mul(num_layers) > super::MAX_SIZE {
        return Err(f.err(
            "hidden_size_per_layer_input",
            &format!(
                "a width whose product with num_hidden_layers ({num_layers}) is at most {}",
                super::MAX_SIZE
            ),
            f.get("hidden_size_per_layer_input"),
        ));
    }
    let vocab = match f.get("vocab_size_per_layer_input") {
        None => DEFAULT_PER_LAYER_VOCAB,
        Some(_) => f.positive("vocab_size_per_layer_input")?,
    };
    if vocab < vocab_size {
        return Err(f.err(
            "vocab_size_per_layer_input",
            &format!(
                "at least vocab_size ({vocab_size}): every token has a row of per-layer inputs"
            ),
            f.get("vocab_size_per_layer_input"),
        ));
    }
    Ok(Some(PerLayerInput { width, vocab }))
}

/// The RoPE of full and of sliding layers: `rope_parameters` per layer
/// type, transformers' defaults for a type it does not name (sliding: base
/// 1e4; full: proportional over a quarter of the pairs, base 1e6).
fn ropes(f: &Fields<'_>, full_dim: usize, sliding_dim: usize) -> Result<(RopeConfig, RopeConfig)> {
    let per_type = match f.get("rope_parameters") {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => return Err(f.err("rope_parameters", "an object per layer type", Some(v))),
    };
    let params = |name: &str| -> Result<Option<&Map<String, Value>>> {
        match per_type.and_then(|m| m.get(name)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(f.err(&format!("rope_parameters.{name}"), "an object", Some(v))),
        }
    };
    let full = layer_rope(f, "full_attention", params("full_attention")?, full_dim)?;
    let sliding = layer_rope(
        f,
        "sliding_attention",
        params("sliding_attention")?,
        sliding_dim,
    )?;
    Ok((full, sliding))
}

/// One layer type's RoPE from its parameters object (`None`: the type's
/// defaults): `proportional` (frequencies over the whole head width, zero
/// past the rotated share, every one divided by `factor`) or what
/// [`rope_from`] reads.
fn layer_rope(
    f: &Fields<'_>,
    name: &str,
    params: Option<&Map<String, Value>>,
    head_dim: usize,
) -> Result<RopeConfig> {
    let field = format!("rope_parameters.{name}");
    let proportional_default = name == "full_attention";
    let Some(map) = params else {
        return Ok(match proportional_default {
            true => proportional(FULL_THETA, 1.0, FULL_PARTIAL, head_dim),
            false => RopeConfig {
                theta: SLIDING_THETA,
                scaling: RopeScaling::None,
                rotary_dim: head_dim,
            },
        });
    };
    let sub = Fields { path: f.path, map };
    let kind = sub.opt_str("rope_type")?.unwrap_or("default");
    if kind != "proportional" {
        let default_theta = match proportional_default {
            true => FULL_THETA,
            false => SLIDING_THETA,
        };
        return rope_from(
            f,
            (&field, Some(map)),
            ("rope_theta", default_theta),
            head_dim,
        );
    }
    let named =
        |what: &str, v: Option<&Value>| f.err(&format!("{field}.{what}"), "a positive number", v);
    let theta = sub.opt_f64("rope_theta")?.unwrap_or(FULL_THETA);
    if theta <= 0.0 {
        return Err(named("rope_theta", sub.get("rope_theta")));
    }
    let factor = sub.opt_f64("factor")?.unwrap_or(1.0);
    if factor <= 0.0 {
        return Err(named("factor", sub.get("factor")));
    }
    let partial = sub.opt_f64("partial_rotary_factor")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&partial) {
        return Err(f.err(
            &format!("{field}.partial_rotary_factor"),
            "a fraction in [0, 1]",
            sub.get("partial_rotary_factor"),
        ));
    }
    Ok(proportional(theta, factor, partial, head_dim))
}

/// The proportional RoPE of a head of `head_dim` values: the first
/// `floor(partial * head_dim / 2)` pairs `(i, i + head_dim / 2)` rotate at
/// `theta^(-2i / head_dim) / factor`, the others not at all.
fn proportional(theta: f64, factor: f64, partial: f64, head_dim: usize) -> RopeConfig {
    RopeConfig {
        theta,
        scaling: RopeScaling::Proportional {
            factor,
            rotated_pairs: ((partial * head_dim as f64) / 2.0).floor() as usize,
        },
        rotary_dim: head_dim & !1,
    }
}
