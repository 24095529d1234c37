//! `Session.config`: the loaded model's shape, readable as attributes or
//! as a mapping (`config.layers`, `config["layers"]`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The shape and identity of a loaded model.
///
/// Read a field as an attribute (``config.layers``) or by name
/// (``config["layers"]``); ``config.to_dict()`` gives them all.
#[pyclass(module = "lcut", name = "ModelConfig", frozen)]
pub struct ModelConfig {
    /// Decoder layers.
    #[pyo3(get)]
    pub layers: usize,
    /// Query heads per layer.
    #[pyo3(get)]
    pub heads: usize,
    /// Key/value heads per layer (fewer than ``heads`` with grouped-query attention).
    #[pyo3(get)]
    pub kv_heads: usize,
    /// Width of one attention head.
    #[pyo3(get)]
    pub head_dim: usize,
    /// Width of the residual stream.
    #[pyo3(get)]
    pub hidden: usize,
    /// Width of the MLP.
    #[pyo3(get)]
    pub intermediate: usize,
    /// Vocabulary size (token ids are ``0 .. vocab - 1``).
    #[pyo3(get)]
    pub vocab: usize,
    /// Architecture (``llama``, ``qwen2``, ``gemma2``, ...).
    #[pyo3(get)]
    pub arch: String,
    /// Whether the model has a chat template (``chat=True`` uses it).
    #[pyo3(get)]
    pub chat_template: bool,
    /// Most positions the model allows (prompt plus new tokens).
    #[pyo3(get)]
    pub max_positions: usize,
    /// The BoS token id, when the model names one.
    #[pyo3(get)]
    pub bos_token_id: Option<u32>,
    /// Token ids that end a generation.
    #[pyo3(get)]
    pub eos_token_ids: Vec<u32>,
    /// How the weights are held: ``f32``, ``bf16``, ``f16`` or ``q``.
    #[pyo3(get)]
    pub dtype: String,
}

/// The field names, in the order ``to_dict`` and ``repr`` list them.
const FIELDS: [&str; 13] = [
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "hidden",
    "intermediate",
    "vocab",
    "arch",
    "chat_template",
    "max_positions",
    "bos_token_id",
    "eos_token_ids",
    "dtype",
];

impl ModelConfig {
    /// The config of a loaded session.
    pub fn of(session: &lcut_engine::Session) -> Self {
        let cfg = session.model.config();
        Self {
            layers: cfg.num_layers,
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            hidden: cfg.hidden_size,
            intermediate: cfg.intermediate_size,
            vocab: cfg.vocab_size,
            arch: cfg.arch.model_type().to_string(),
            chat_template: session.has_chat_template(),
            max_positions: cfg.max_position_embeddings,
            bos_token_id: cfg.bos_token_id,
            eos_token_ids: session.stop_tokens(),
            dtype: session.model.weight_mode().name(),
        }
    }
}

#[pymethods]
impl ModelConfig {
    /// Every field as a dict.
    fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(slf.py());
        for name in FIELDS {
            d.set_item(name, slf.getattr(name)?)?;
        }
        Ok(d)
    }

    /// The field names.
    fn keys(&self) -> Vec<&'static str> {
        FIELDS.to_vec()
    }

    fn __getitem__<'py>(slf: &Bound<'py, Self>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        if FIELDS.contains(&key) {
            slf.getattr(key)
        } else {
            Err(pyo3::exceptions::PyKeyError::new_err(format!(
                "{key:?} is not a config field; the fields are {}",
                FIELDS.join(", ")
            )))
        }
    }

    fn __contains__(&self, key: &str) -> bool {
        FIELDS.contains(&key)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let parts = FIELDS
            .iter()
            .map(|name| Ok(format!("{name}={}", slf.getattr(*name)?.repr()?)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(format!("ModelConfig({})", parts.join(", ")))
    }
}
