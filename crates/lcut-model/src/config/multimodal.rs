//! The multimodal wrappers whose text decoder lcut reads, as Gemma 3's,
//! Gemma 4's and Qwen3.5's published folders hold them (`gemma3`,
//! `gemma4`, `qwen3_5`, `qwen3_5_moe`: transformers'
//! `*ForConditionalGeneration`): the decoder is the wrapper's
//! `text_config` (Gemma 3's leaving most fields to the class defaults), its
//! weights sit under `model.language_model.`, or `language_model.model.`
//! as Gemma 3's were published (read by [`crate::weights::WeightFiles`]),
//! and the towers (vision, audio) are not read. On text alone the wrapper
//! computes what its text decoder does (transformers 5.24: the placeholder
//! tokens of images, video and audio are the only ones it treats
//! otherwise).
//!
//! Two facts live outside `text_config`: whether the LM head is the
//! embedding matrix (transformers ties it by the wrapper's own
//! `tie_word_embeddings`, its class default where the file omits it), and,
//! where the text config does not name them, the BoS and EoS tokens.

use serde_json::{Map, Value};

use super::Fields;
use crate::error::{ModelError, Result};

/// A multimodal wrapper lcut reads the text decoder of.
pub(super) struct Wrapper {
    /// The wrapper's `model_type`.
    model_type: &'static str,
    /// Its text decoder's `model_type`.
    text_type: &'static str,
    /// transformers' default of the wrapper's `tie_word_embeddings`.
    ties_by_default: bool,
}

const WRAPPERS: [Wrapper; 4] = [
    Wrapper {
        model_type: "gemma3",
        text_type: "gemma3_text",
        ties_by_default: true,
    },
    Wrapper {
        model_type: "gemma4",
        text_type: "gemma4_text",
        ties_by_default: true,
    },
    Wrapper {
        model_type: "qwen3_5",
        text_type: "qwen3_5_text",
        ties_by_default: false,
    },
    Wrapper {
        model_type: "qwen3_5_moe",
        text_type: "qwen3_5_moe_text",
        ties_by_default: false,
    },
];

/// The wrapper of this `model_type`, when it is one lcut reads.
pub(super) fn wrapper(model_type: &str) -> Option<&'static Wrapper> {
    WRAPPERS.iter().find(|w| w.model_type == model_type)
}

/// The text decoder's config of wrapper `w`, whose top level `f` holds:
/// its `text_config`, with the wrapper's tie of the LM head and, where the
/// text config has none, the wrapper's BoS and EoS tokens.
pub(super) fn text_config(f: &Fields<'_>, w: &Wrapper) -> Result<Map<String, Value>> {
    let Some(Value::Object(text)) = f.get("text_config") else {
        return Err(f.err(
            "text_config",
            &format!(
                "an object: the {} decoder's config inside this {} checkpoint",
                w.text_type, w.model_type
            ),
            f.get("text_config"),
        ));
    };
    let mut text = text.clone();
    match text.get("model_type") {
        None | Some(Value::Null) => {
            text.insert("model_type".into(), Value::from(w.text_type));
        }
        Some(Value::String(t)) if t == w.text_type => {}
        Some(other) => {
            return Err(f.err(
                "text_config.model_type",
                &format!("{}, the text decoder of {}", w.text_type, w.model_type),
                Some(other),
            ));
        }
    }
    let tie = f
        .opt_bool("tie_word_embeddings")?
        .unwrap_or(w.ties_by_default);
    text.insert("tie_word_embeddings".into(), Value::Bool(tie));
    for token in ["bos_token_id", "eos_token_id"] {
        let missing = text.get(token).is_none_or(Value::is_null);
        if let (true, Some(v)) = (missing, f.get(token)) {
            text.insert(token.into(), v.clone());
        }
    }
    Ok(text)
}

/// An error met reading the text decoder's config, its field named where
/// the file has it (`text_config.<field>`).
pub(super) fn inside_text_config(err: ModelError) -> ModelError {
    match err {
        ModelError::ConfigField {
            path,
            field,
            expected,
            found,
        } => ModelError::ConfigField {
            path,
            field: format!("text_config.{field}"),
            expected,
            found,
        },
        other => other,
    }
}

/// The `model_type` of the decoder lcut runs from a `config.json` holding
/// `config`: a wrapper's text decoder's, else the file's own.
pub(crate) fn decoder_model_type(config: &Value) -> Option<&str> {
    let own = config.get("model_type")?.as_str()?;
    match wrapper(own) {
        Some(w) => match config.get("text_config")?.get("model_type") {
            None | Some(Value::Null) => Some(w.text_type),
            Some(t) => t.as_str(),
        },
        None => Some(own),
    }
}
