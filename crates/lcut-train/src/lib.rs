//! lcut's own small trained models: a synthetic task family whose answers
//! can only come from reading the prompt (copy or reverse a bracketed span
//! hidden among filler words), a word-level tokenizer with a chat template
//! that renders exactly the training format, a differentiable Llama trainer
//! whose attention mask is a full or SPEED visibility policy, and greedy
//! exact-match evaluation with `lcut_model::Decoder`.
//!
//! Also SPEED-aware LoRA adapters for any model ([`lora_train`]). The `lcut`
//! binary parses the command line and calls [`run_train`] (`lcut train`),
//! [`run_eval`] (`lcut eval`) and [`lora_train::train_adapter`]
//! (`lcut train-lora`).

mod error;
pub mod eval;
pub mod lora_train;
pub mod net;
pub mod task;
pub mod train;
pub mod vocab;

pub use error::{Result, TrainError};
pub use eval::{EvalOptions, EvalResult, TaskScore, run_eval};
pub use net::{BatchMasks, ModelShape, TrainModel};
pub use task::{Instance, Stream, TaskKind, TaskSpec};
pub use train::{TrainOptions, run_train};

/// Index of the largest value in each row of a [rows, n] tensor.
pub fn argmax(logits: &candle_core::Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?)
}
