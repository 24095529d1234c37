//! LoRA adapters in PEFT's layout (`adapter_config.json` +
//! `adapter_model.safetensors`): read, checked against a loaded model,
//! merged into its weights or applied on the fly, and written. An adapter
//! records the visibility policy it was trained for (`lcut_policy`).

mod adapter;
mod apply;
mod config;
mod error;
mod fingerprint;
mod write;

pub use crate::linear::LoraLinear;
pub use adapter::{LoraAdapter, LoraPair, Site, WEIGHTS_FILE, tensor_name};
pub use apply::LoraMode;
pub use config::{CONFIG_FILE, LoraConfig, Targets};
pub use error::LoraError;
pub use write::{write_adapter, write_atomic};
