//! `--lora DIR` and `--lora-mode`, shared by the commands that load a model:
//! a LoRA adapter (PEFT layout) put into the decoder after loading (see
//! `lcut_engine::adapter`), its trained-for policy (`lcut_policy`) shown,
//! and a warning when the run's policy is another one.

use std::path::PathBuf;

use anyhow::Result;
use lcut_engine::Session;
use lcut_engine::adapter::{AdapterInUse, put_adapter};
use lcut_model::Decoder;
use lcut_model::lora::LoraMode;

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

impl LoraModeArg {
    /// How the model takes the adapter.
    fn mode(self) -> LoraMode {
        match self {
            LoraModeArg::Merge => LoraMode::Merge,
            LoraModeArg::Fly => LoraMode::OnTheFly,
        }
    }
}

impl LoraArgs {
    /// Put the adapter (if any) into the session's model and record it in
    /// the session (reports name it), as [`LoraArgs::apply`] does.
    pub fn apply_to_session(&self, session: &mut Session, policies: &[String]) -> Result<()> {
        let Some(dir) = &self.lora else {
            return Ok(());
        };
        tell(&session.put_adapter(dir, self.lora_mode.mode(), policies)?);
        Ok(())
    }

    /// Put the adapter (if any) into `model`, say on stderr what it is and
    /// which policy it was trained for, and warn for each of `policies`
    /// (the run's, as written) that is not that one.
    pub fn apply(&self, model: &mut Decoder, policies: &[String]) -> Result<()> {
        let Some(dir) = &self.lora else {
            return Ok(());
        };
        tell(&put_adapter(model, dir, self.lora_mode.mode(), policies)?);
        Ok(())
    }
}

/// Say on stderr what the adapter is, then each warning.
fn tell(used: &AdapterInUse) {
    eprintln!("{}", used.description);
    for line in &used.warnings {
        eprintln!("warning: {line}");
    }
}
