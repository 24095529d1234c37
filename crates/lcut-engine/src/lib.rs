//! The lcut engine: model folders with tokenizer and chat template, prompts
//! with their decode-phase start, generation under any visibility policy
//! with timing and KV accounting, lockstep runs of several policies, and
//! LoRA adapters put into a loaded model for a run.

pub mod adapter;
mod bundled;
mod compare;
pub mod diagnose;
mod error;
pub mod forward;
mod generate;
pub mod gguf_tokenizer;
pub mod head_check;
pub mod heads;
pub mod heap;
pub mod leaderboard;
pub mod made_by;
mod prompt;
pub mod serve_shape;
mod session;
pub mod shard;
mod shared_prefix;
pub mod suite;
mod template;
mod text_prompt;
pub mod threads;
mod together;
mod tokenizer;

pub use bundled::{BUNDLED_MODEL, bundled, workspace_root};
pub use compare::{
    CompareStep, Comparison, Lockstep, LockstepEvent, compare, compare_models, kl_divergence,
};
pub use error::{EngineError, Result};
pub use generate::{
    Generation, GenerationConfig, GenerationOutput, PrefillProgress, Sampling, Step, StopReason,
    Timing,
};
pub use lcut_policy::SlimTrace;
pub use prompt::PreparedPrompt;
pub use session::Session;
pub use shared_prefix::{Route, routes};
pub use template::{ChatTemplate, Message};
pub use text_prompt::{PromptTokenizer, SplitPrompt};
pub use together::{TOGETHER, run_together};
pub use tokenizer::TextTokenizer;
