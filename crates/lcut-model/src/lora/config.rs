//! `adapter_config.json` in PEFT's layout: the fields lcut reads, checks and
//! writes, plus the policy the adapter was trained for (`lcut_policy`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::error::LoraError;

/// File name of the config in an adapter folder.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// The linear layers an adapter targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Module names, matched against the last component of a layer's path
    /// (`q_proj`, `down_proj`, ...).
    Modules(Vec<String>),
    /// PEFT's `"all-linear"`: every linear layer of the decoder layers.
    AllLinear,
}

/// What lcut reads from (and writes to) `adapter_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` of every pair of matrices.
    pub r: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `target_modules`.
    pub targets: Targets,
    /// `base_model_name_or_path`.
    pub base_model: Option<String>,
    /// `use_rslora`: scale alpha/sqrt(r) instead of alpha/r.
    pub use_rslora: bool,
    /// `layers_to_transform`: the layers adapted (all when `None`).
    pub layers: Option<Vec<usize>>,
    /// `lcut_policy`: the visibility policy the adapter was trained for.
    pub policy: Option<String>,
    /// `lcut_base_fingerprint`: a digest of the base model's norms, to
    /// tell another base of the same shape.
    pub base_fingerprint: Option<String>,
}

impl LoraConfig {
    /// A config for rank `r` and `alpha` on `modules` of every layer.
    pub fn new(r: usize, alpha: f64, modules: &[&str]) -> Self {
        Self {
            r,
            alpha,
            targets: Targets::Modules(modules.iter().map(|m| m.to_string()).collect()),
            base_model: None,
            use_rslora: false,
            layers: None,
            policy: None,
            base_fingerprint: None,
        }
    }

    /// The factor on B·A: alpha/r, or alpha/sqrt(r) with rsLoRA (as PEFT).
    pub fn scale(&self) -> f64 {
        let r = self.r as f64;
        if self.use_rslora {
            self.alpha / r.sqrt()
        } else {
            self.alpha / r
        }
    }

    /// Whether layer `l` is adapted.
    pub fn adapts_layer(&self, l: usize) -> bool {
        self.layers.as_ref().is_none_or(|ls| ls.contains(&l))
    }

    /// Read and check `adapter_config.json` in `folder`.
    pub fn read(folder: &Path) -> Result<Self, LoraError> {
        Self::read_with_bytes(folder).map(|(config, _)| config)
    }

    /// [`LoraConfig::read`], also giving the file's bytes as read.
    pub(crate) fn read_with_bytes(folder: &Path) -> Result<(Self, Vec<u8>), LoraError> {
        let path = folder.join(CONFIG_FILE);
        let io = |source| LoraError::Io {
            action: "read",
            path: path.clone(),
            source,
        };
        let bytes = std::fs::read(&path).map_err(io)?;
        // as read_to_string: text that is not UTF-8 is an I/O error
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        let value: Value = serde_json::from_str(text).map_err(|source| LoraError::Json {
            path: path.clone(),
            source,
        })?;
        let Some(map) = value.as_object() else {
            return Err(bad(&path, "(top level)", "a JSON object", &value));
        };
        let config = Self::from_map(&path, map)?;
        Ok((config, bytes))
    }

    fn from_map(path: &Path, map: &Map<String, Value>) -> Result<Self, LoraError> {
        check_supported(path, map)?;
        let r = match map.get("r") {
            Some(Value::Number(n)) if n.as_u64().is_some_and(|r| r > 0) => n.as_u64().unwrap_or(0),
            other => {
                return Err(bad(
                    path,
                    "r",
                    "a positive integer",
                    other.unwrap_or(&Value::Null),
                ));
            }
        };
        let alpha = match map.get("lora_alpha") {
            Some(Value::Number(n)) if n.as_f64().is_some_and(f64::is_finite) => {
                n.as_f64().unwrap_or(0.0)
            }
            other => {
                return Err(bad(
                    path,
                    "lora_alpha",
                    "a number",
                    other.unwrap_or(&Value::Null),
                ));
            }
        };
        Ok(Self {
            r: usize::try_from(r)
                .map_err(|_| bad(path, "r", "a rank that fits in memory", &json!(r)))?,
            alpha,
            targets: targets(path, map.get("target_modules"))?,
            base_model: opt_string(path, map, "base_model_name_or_path")?,
            use_rslora: opt_bool(path, map, "use_rslora")?,
            layers: layers(path, map.get("layers_to_transform"))?,
            policy: opt_string(path, map, "lcut_policy")?,
            base_fingerprint: opt_string(path, map, "lcut_base_fingerprint")?,
        })
    }

    /// The config as PEFT writes it for a causal LM, plus lcut's fields.
    pub fn to_json(&self) -> Value {
        let targets = match &self.targets {
            Targets::Modules(m) => json!(m),
            Targets::AllLinear => json!("all-linear"),
        };
        let mut v = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_model,
            "r": self.r,
            "lora_alpha": self.alpha,
            "target_modules": targets,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": self.use_rslora,
            "use_dora": false,
            "init_lora_weights": true,
            "layers_to_transform": self.layers,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "modules_to_save": null,
            "inference_mode": true,
        });
        if let Some(map) = v.as_object_mut() {
            if let Some(p) = &self.policy {
                map.insert("lcut_policy".into(), json!(p));
            }
            if let Some(f) = &self.base_fingerprint {
                map.insert("lcut_base_fingerprint".into(), json!(f));
            }
        }
        v
    }
}

fn bad(path: &Path, field: &str, expected: &str, found: &Value) -> LoraError {
    LoraError::ConfigField {
        path: path.to_path_buf(),
        field: field.into(),
        expected: expected.into(),
        found: found.to_string(),
    }
}

/// How a field of a PEFT feature lcut does not implement must look.
enum Allowed {
    /// Exactly this string.
    Str(&'static str),
    /// false or null.
    Off,
    /// null, or an empty object or list.
    Empty,
}

/// The PEFT fields lcut checks, what it allows in each, and why.
const UNSUPPORTED: [(&str, Allowed, &str); 12] = [
    ("peft_type", Allowed::Str("LORA"), "\"LORA\""),
    (
        "fan_in_fan_out",
        Allowed::Off,
        "false (Llama-style linear layers)",
    ),
    ("use_dora", Allowed::Off, "false (DoRA is not supported)"),
    (
        "bias",
        Allowed::Str("none"),
        "\"none\" (LoRA biases are not supported)",
    ),
    (
        "lora_bias",
        Allowed::Off,
        "false (LoRA biases are not supported)",
    ),
    (
        "rank_pattern",
        Allowed::Empty,
        "an empty object (per-module ranks are not supported)",
    ),
    (
        "alpha_pattern",
        Allowed::Empty,
        "an empty object (per-module alphas are not supported)",
    ),
    (
        "modules_to_save",
        Allowed::Empty,
        "null (fully trained modules are not supported)",
    ),
    (
        "exclude_modules",
        Allowed::Empty,
        "null (excluded modules are not supported)",
    ),
    (
        "layer_replication",
        Allowed::Empty,
        "null (layer replication is not supported)",
    ),
    (
        "trainable_token_indices",
        Allowed::Empty,
        "null (trainable tokens are not supported)",
    ),
    (
        "target_parameters",
        Allowed::Empty,
        "null (LoRA on parameters is not supported)",
    ),
];

/// Refuse the PEFT features lcut does not implement, by name.
fn check_supported(path: &Path, map: &Map<String, Value>) -> Result<(), LoraError> {
    for (field, allowed, expected) in &UNSUPPORTED {
        let Some(v) = map.get(*field) else { continue };
        let ok = match allowed {
            Allowed::Str(s) => v.as_str() == Some(*s),
            Allowed::Off => matches!(v, Value::Null | Value::Bool(false)),
            Allowed::Empty => empty(v),
        };
        if !ok {
            return Err(bad(path, field, expected, v));
        }
    }
    Ok(())
}

fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn targets(path: &Path, v: Option<&Value>) -> Result<Targets, LoraError> {
    const EXPECTED: &str = "a non-empty list of module names, or \"all-linear\"";
    match v {
        Some(Value::String(s)) if s == "all-linear" => Ok(Targets::AllLinear),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|m| m.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(Targets::Modules)
            .ok_or_else(|| {
                bad(
                    path,
                    "target_modules",
                    EXPECTED,
                    &Value::Array(items.clone()),
                )
            }),
        other => Err(bad(
            path,
            "target_modules",
            EXPECTED,
            other.unwrap_or(&Value::Null),
        )),
    }
}

fn layers(path: &Path, v: Option<&Value>) -> Result<Option<Vec<usize>>, LoraError> {
    const EXPECTED: &str = "null, a layer index or a list of layer indices";
    let index = |v: &Value| v.as_u64().and_then(|i| usize::try_from(i).ok());
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(index)
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| {
                bad(
                    path,
                    "layers_to_transform",
                    EXPECTED,
                    &Value::Array(items.clone()),
                )
            }),
        Some(v) => index(v)
            .map(|i| Some(vec![i]))
            .ok_or_else(|| bad(path, "layers_to_transform", EXPECTED, v)),
    }
}

fn opt_string(
    path: &Path,
    map: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, LoraError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(bad(path, key, "a string or null", v)),
    }
}

fn opt_bool(path: &Path, map: &Map<String, Value>, key: &str) -> Result<bool, LoraError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(path, key, "true or false", v)),
    }
}

/// The config file of an adapter folder.
pub fn config_path(folder: &Path) -> PathBuf {
    folder.join(CONFIG_FILE)
}
