//! Random-weight models of a given shape, for benchmarks (`lcut bench`,
//! `lcut synth`) and tests that need a model of some size rather than a
//! trained one.
//!
//! - [`shapes`]: named shapes of real checkpoints (Llama-3.2-1B,
//!   Qwen2.5-1.5B, SmolLM3-3B, OLMo-3-7B, Llama-3.1-8B, and the mixtures
//!   of experts Qwen3-30B-A3B and Mixtral-8x7B) and their weights.
//! - [`model`]: [`RandomModel`] (any shape) and [`RandomLlama`] (plain Llama
//!   sizes), a shape and a seed, built onto a device or written to files.
//! - [`draw`]: how the weights are drawn, row by row.
//! - [`vocab`]: the synthetic tokenizer every written model carries.
//! - [`write`](mod@write): the formats (safetensors f32/bf16, GGUF Q4_0/Q4_K), one
//!   module each, streamed and written atomically.
//! - [`error`]: what can go wrong ([`SynthError`]).

pub mod draw;
pub mod error;
pub mod model;
pub mod shapes;
pub mod vocab;
pub mod write;

pub use error::SynthError;
pub use model::{RandomLlama, RandomModel};
pub use shapes::ModelShape;
pub use write::{Format, WriteOptions, Written, write_model};
