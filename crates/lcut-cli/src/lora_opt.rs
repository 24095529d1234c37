//! `--lora DIR` and `--lora-mode`, shared by the commands that load a model:
//! a LoRA adapter (PEFT layout) put into the decoder after loading, its
//! trained-for policy (`lcut_policy`) shown, and a warning when the run's
//! policy is another one (an adapter belongs to the policy it was trained for).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lcut_engine::Session;
use lcut_model::Decoder;
use lcut_model::lora::{LoraAdapter, LoraMode};
use lcut_policy::PolicySpec;
use lcut_trace::AdapterIdentity;

/// How `--lora` puts the adapter in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LoraModeArg {
    /// Merged into the weights at load (W + scale·B·A; quantized matrices
    /// it touches become dense).
    #[default]
    Merge,
    /// Kept apart and added at every call: scale·(x Aᵀ) Bᵀ.
    Fly,
}

/// The adapter options of a command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LoraArgs {
    /// A LoRA adapter folder in PEFT's layout (adapter_config.json +
    /// adapter_model.safetensors) to put into the model.
    #[arg(long, value_name = "DIR")]
    pub lora: Option<PathBuf>,
    /// How the adapter is put in: merge (at load) or fly (on the fly).
    #[arg(long, value_enum, default_value_t = LoraModeArg::Merge, requires = "lora")]
    pub lora_mode: LoraModeArg,
}

impl LoraArgs {
    /// Put the adapter (if any) into the session's model and record it in
    /// the session (reports name it), as [`LoraArgs::apply`] does.
    pub fn apply_to_session(&self, session: &mut Session, policies: &[String]) -> Result<()> {
        session.adapter = self.apply(&mut session.model, policies)?;
        Ok(())
    }

    /// Put the adapter (if any) into `model`, say on stderr what it is and
    /// which policy it was trained for, and warn for each of `policies`
    /// (the run's, as written) that is not that one. Returns its identity.
    pub fn apply(
        &self,
        model: &mut Decoder,
        policies: &[String],
    ) -> Result<Option<AdapterIdentity>> {
        let Some(dir) = &self.lora else {
            return Ok(None);
        };
        let adapter = LoraAdapter::read(dir)
            .with_context(|| format!("reading LoRA adapter {}", dir.display()))?;
        let mode = match self.lora_mode {
            LoraModeArg::Merge => LoraMode::Merge,
            LoraModeArg::Fly => LoraMode::OnTheFly,
        };
        model
            .apply_lora(&adapter, mode)
            .with_context(|| format!("putting LoRA adapter {} into the model", dir.display()))?;
        eprintln!("{}", describe(dir, &adapter, self.lora_mode));
        for line in warnings(&adapter, model.config().num_layers, policies) {
            eprintln!("warning: {line}");
        }
        Ok(Some(lcut_engine::adapter_identity(dir, &adapter, mode)))
    }
}

/// One line about the adapter: folder, rank, scale, sites, trained-for policy.
fn describe(dir: &Path, adapter: &LoraAdapter, mode: LoraModeArg) -> String {
    let c = &adapter.config;
    let policy = c.policy.as_deref().unwrap_or("unknown (no lcut_policy)");
    let how = match mode {
        LoraModeArg::Merge => "merged",
        LoraModeArg::Fly => "on the fly",
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
pub fn warnings(adapter: &LoraAdapter, layers: usize, policies: &[String]) -> Vec<String> {
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
