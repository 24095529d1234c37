//! A LoRA adapter (PEFT layout) put into a loaded model for a run: what a
//! report records of it, one line that says what it is and which policy it
//! was trained for (`lcut_policy`), and a warning for each of the run's
//! policies that is another one (an adapter belongs to the policy it was
//! trained for).

use std::path::Path;

use lcut_model::Decoder;
use lcut_model::lora::{LoraAdapter, LoraMode};
use lcut_policy::PolicySpec;
use lcut_trace::AdapterIdentity;

use crate::error::{EngineError, Result};
use crate::session::Session;

/// An adapter put into a model.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterInUse {
    /// What a report records of it.
    pub identity: AdapterIdentity,
    /// One line: folder, rank, scale, sites, how it was put in, trained-for policy.
    pub description: String,
    /// One line per run policy that is not the one it was trained for.
    pub warnings: Vec<String>,
}

/// Put the adapter in `dir` into `model` by `mode`, for a run under
/// `policies` (as written).
pub fn put_adapter(
    model: &mut Decoder,
    dir: &Path,
    mode: LoraMode,
    policies: &[String],
) -> Result<AdapterInUse> {
    let adapter = LoraAdapter::read(dir).map_err(|e| EngineError::Adapter {
        what: format!("reading LoRA adapter {}", dir.display()),
        source: Box::new(e.into()),
    })?;
    model
        .apply_lora(&adapter, mode)
        .map_err(|source| EngineError::Adapter {
            what: format!("putting LoRA adapter {} into the model", dir.display()),
            source: Box::new(source),
        })?;
    Ok(AdapterInUse {
        identity: identity(dir, &adapter, mode),
        description: describe(dir, &adapter, mode),
        warnings: policy_warnings(&adapter, model.config().num_layers, policies),
    })
}

impl Session {
    /// Put the adapter in `dir` into this session's model (see
    /// [`put_adapter`]) and record it in the session, so reports name it.
    pub fn put_adapter(
        &mut self,
        dir: &Path,
        mode: LoraMode,
        policies: &[String],
    ) -> Result<AdapterInUse> {
        let used = put_adapter(&mut self.model, dir, mode, policies)?;
        self.adapter = Some(used.identity.clone());
        Ok(used)
    }
}

/// The name a mode is given by on the command line.
fn mode_name(mode: LoraMode) -> &'static str {
    match mode {
        LoraMode::Merge => "merge",
        LoraMode::OnTheFly => "fly",
    }
}

/// What a report records of the adapter in `dir`: its files' hash (taken
/// by [`LoraAdapter::read`]), its trained-for policy, its rank and how it
/// was put in.
fn identity(dir: &Path, adapter: &LoraAdapter, mode: LoraMode) -> AdapterIdentity {
    AdapterIdentity {
        path: dir.display().to_string(),
        hash: adapter.hash.clone(),
        policy: adapter.config.policy.clone(),
        rank: adapter.config.r,
        mode: mode_name(mode).into(),
    }
}

/// One line about the adapter: folder, rank, scale, sites, trained-for policy.
fn describe(dir: &Path, adapter: &LoraAdapter, mode: LoraMode) -> String {
    let c = &adapter.config;
    let policy = c.policy.as_deref().unwrap_or("unknown (no lcut_policy)");
    let how = match mode {
        LoraMode::Merge => "merged",
        LoraMode::OnTheFly => "on the fly",
    };
    format!(
        "LoRA adapter {}: rank {}, alpha {} (scale {:.4}), {} matrix pairs, {how}; trained for policy {policy}",
        dir.display(),
        c.r,
        c.alpha,
        c.scale(),
        adapter.pairs.len(),
    )
}

/// A warning per run policy that is not the adapter's (compared resolved
/// for a model of `layers` layers, so `speed:22+bos` equals `speed:22/30+bos`).
pub fn policy_warnings(adapter: &LoraAdapter, layers: usize, policies: &[String]) -> Vec<String> {
    let Some(trained) = &adapter.config.policy else {
        return vec![];
    };
    let resolve = |s: &str| {
        s.parse::<PolicySpec>()
            .ok()
            .and_then(|p| p.resolve(layers).ok())
    };
    let Some(want) = resolve(trained) else {
        return vec![format!(
            "the adapter's lcut_policy {trained:?} is not a policy lcut reads"
        )];
    };
    policies
        .iter()
        .filter(|p| resolve(p).is_none_or(|got| got != want))
        .map(|p| {
            format!(
                "this run uses policy {p}, but the adapter was trained for {trained}: \
                 an adapter is meant for the policy it was trained for"
            )
        })
        .collect()
}
