//! The model folder's tokenizer (`tokenizer.json`) and its settings from
//! `tokenizer_config.json` (special tokens, chat template).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use lcut_model::gguf::GgufHeader;

use crate::error::{EngineError, Result};
use crate::gguf_tokenizer::tokenizer_from_gguf;

/// A tokenizer with the special tokens and chat template of its model.
pub struct TextTokenizer {
    inner: Tokenizer,
    config_path: PathBuf,
    tokenizer_path: PathBuf,
    /// Jinja chat template, if the model has one.
    pub chat_template: Option<String>,
    /// Text of the BoS token, if any.
    pub bos_token: Option<String>,
    /// Text of the EoS token, if any.
    pub eos_token: Option<String>,
}

fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Parse `tokenizer.json`. The file is checked to be JSON first, and a
/// panic inside the tokenizers library (it panics on some damaged files,
/// e.g. a decoder cut short) becomes an error naming the file.
fn read_tokenizer(path: &Path) -> Result<Tokenizer> {
    let err = |reason: String| EngineError::Tokenizer {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| err(format!("not valid JSON: {e}")))?;
    let parsed = std::panic::catch_unwind(|| text.parse::<Tokenizer>());
    match parsed {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(err(e.to_string())),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(err(format!("the tokenizers library failed on it ({why})")))
        }
    }
}

impl TextTokenizer {
    /// Load `tokenizer.json` (required) and `tokenizer_config.json`
    /// (optional) from a model folder; `Ok(None)` when there is no tokenizer.
    pub fn from_folder(folder: &Path) -> Result<Option<Self>> {
        let path = folder.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let inner = read_tokenizer(&path)?;
        let config_path = folder.join("tokenizer_config.json");
        let config: Value = if config_path.exists() {
            let text =
                std::fs::read_to_string(&config_path).map_err(|e| EngineError::Tokenizer {
                    path: config_path.clone(),
                    reason: e.to_string(),
                })?;
            serde_json::from_str(&text).map_err(|e| EngineError::Tokenizer {
                path: config_path.clone(),
                reason: format!("not valid JSON: {e}"),
            })?
        } else {
            Value::Null
        };
        let chat_template = match config.get("chat_template") {
            Some(Value::String(t)) => Some(t.clone()),
            // a list of named templates: take the default one
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        Ok(Some(Self {
            inner,
            config_path,
            tokenizer_path: path,
            chat_template,
            bos_token: special_token(&config, "bos_token"),
            eos_token: special_token(&config, "eos_token"),
        }))
    }

    /// The tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata.
    pub fn from_gguf(header: &GgufHeader, path: &Path) -> Result<Self> {
        let t = tokenizer_from_gguf(header, path)?;
        // the build's transient merges and maps (over 100 MiB for a
        // 262k-token vocabulary) would stay in the heap for the whole run
        crate::heap::release_free_memory();
        Ok(Self {
            inner: t.tokenizer,
            config_path: path.to_path_buf(),
            tokenizer_path: path.to_path_buf(),
            chat_template: t.chat_template,
            bos_token: t.bos_token,
            eos_token: t.eos_token,
        })
    }

    /// Path of `tokenizer_config.json` (for messages about the template).
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Token ids of `text`, without adding special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_as(text, false)
    }

    /// Token ids of `text` with the special tokens the tokenizer adds by
    /// itself (a BoS where the model asks for one), as transformers'
    /// `tokenizer(text)` gives them.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_as(text, true)
    }

    fn encode_as(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| EngineError::Tokenizer {
                path: self.tokenizer_path.clone(),
                reason: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of a token sequence.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }

    /// The text of each id on its own (for hover labels and streamed
    /// output): a byte-level piece such as `Ġrarely` reads ` rarely`; a
    /// piece that decodes to nothing shows as the piece itself.
    pub fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .zip(self.token_pieces(ids))
            .map(|(&id, piece)| match self.inner.decode(&[id], false) {
                Ok(text) if !text.is_empty() => text,
                _ => piece,
            })
            .collect()
    }

    /// The vocabulary entry of each id, as the tokenizer spells it.
    pub fn token_pieces(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| {
                self.inner
                    .id_to_token(id)
                    .unwrap_or_else(|| format!("<{id}>"))
            })
            .collect()
    }

    /// The id of a token string, if in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
