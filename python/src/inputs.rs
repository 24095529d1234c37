//! What Python callers pass (prompts as text or ids, policy strings),
//! checked and turned into the engine's types, with errors that name the
//! bad value.

use lcut_engine::PreparedPrompt;
use lcut_policy::{Policy, PolicySpec};
use pyo3::prelude::*;

use crate::errors::{engine_err, invalid, policy_err};

/// A prompt given as text (tokenised by the model's tokenizer) or as ids.
#[derive(Debug, Clone, FromPyObject)]
pub enum PromptArg {
    /// Text.
    Text(String),
    /// Token ids, checked against the vocabulary.
    Ids(Vec<i64>),
}

/// `values` as token ids of a model with `vocab` tokens.
pub fn token_ids(values: &[i64], vocab: usize) -> PyResult<Vec<u32>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            u32::try_from(v)
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    invalid(format!(
                        "token id {v} at position {i} is outside the vocabulary \
                         (ids are 0..{})",
                        vocab.saturating_sub(1)
                    ))
                })
        })
        .collect()
}

/// `prompt` ready to run: text through the chat template when `chat` is
/// set and the model has one (else raw, BoS prepended when the model names
/// one), ids as given with their decode start at the last token.
pub fn prepare(
    session: &lcut_engine::Session,
    prompt: &PromptArg,
    chat: bool,
    system: Option<&str>,
) -> PyResult<PreparedPrompt> {
    match prompt {
        PromptArg::Text(text) => session.prepare_text(text, system, chat).map_err(engine_err),
        PromptArg::Ids(values) => {
            let ids = token_ids(values, session.model.config().vocab_size)?;
            PreparedPrompt::from_ids(ids, None).map_err(engine_err)
        }
    }
}

/// A policy string (`full`, `speed:3/4+bos`, `selfonly:2+bos`,
/// `slim:paper`, ...) parsed and resolved for a model of `layers` layers.
pub fn policy(text: &str, layers: usize) -> PyResult<(PolicySpec, Policy)> {
    let spec: PolicySpec = text.parse().map_err(policy_err)?;
    let resolved = spec.resolve(layers).map_err(policy_err)?;
    Ok((spec, resolved))
}

/// A Python-style index (negative counts from the end) into `0..len`.
pub fn index(i: i64, len: usize, what: &str) -> PyResult<usize> {
    let resolved = if i < 0 { i + len as i64 } else { i };
    usize::try_from(resolved)
        .ok()
        .filter(|&r| r < len)
        .ok_or_else(|| invalid(format!("{what} {i} is out of range: there are {len}")))
}

/// A token budget: at least one token.
pub fn budget(max_new_tokens: usize) -> PyResult<usize> {
    if max_new_tokens == 0 {
        Err(invalid("max_new_tokens must be at least 1"))
    } else {
        Ok(max_new_tokens)
    }
}
