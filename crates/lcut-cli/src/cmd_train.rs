//! `lcut train` and `lcut eval` (without `--suite`): the bundled task
//! models (see `lcut-train`). The arguments are parsed here and handed to
//! the library as its options.

use anyhow::Result;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use lcut_train::{EvalOptions, TaskKind, TrainOptions};
use std::path::PathBuf;

/// Arguments of `lcut train`: train (or fine-tune) a small Llama on the
/// copy/reverse task family and save it as a Hugging Face model folder.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct TrainArgs {
    /// Output model folder (created; existing model files are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Visibility policy of the training mask: `full`, or SPEED such as
    /// `speed:3/4+bos` (anchor-free: `speed:3/4`).
    #[arg(long, default_value = "full")]
    pub policy: String,
    /// Start from this model folder's weights (fine-tuning) instead of a
    /// fresh initialisation; its config.json fixes the shape.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Seed of the initial weights and of the training batches.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Optimiser steps.
    #[arg(long, default_value_t = 2000)]
    pub steps: usize,
    /// Sequences per step (at most; see `--batch-tokens`).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Standard deviation of the initial weight matrices.
    #[arg(long, default_value_t = 0.1)]
    pub init_std: f32,
    /// Linear warm-up steps; then cosine decay to a tenth of the peak.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Decoder layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Residual width.
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// MLP inner width.
    #[arg(long, default_value_t = 256)]
    pub intermediate: usize,
    /// Query heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Key/value heads.
    #[arg(long, default_value_t = 2)]
    pub kv_heads: usize,
    /// Layer layout: `llama`, `smollm3[:N]` (every N-th layer without RoPE,
    /// default 4), `olmo2` (norms after the blocks, whole-projection q/k
    /// norms), `olmo3[:W]` (OLMo 2's layer, three layers sliding over W
    /// tokens then a full one), `mixtral[:E/K]` (each MLP a mixture of E
    /// experts, each token reading its router's top K; default 8/2),
    /// `qwen35[:N[/E/K]]` (Qwen3.5: every N-th layer full attention with a
    /// gated output, the others Gated DeltaNet linear attention; default 4;
    /// with E/K Qwen3.5-MoE: every MLP E experts half as wide of which each
    /// token reads K, and a shared expert),
    /// `gemma4[:W[/S[/E/K]]]` (Gemma 4: two layers sliding over W tokens
    /// then a full one whose keys are its values, per-layer inputs, the last
    /// S layers reading earlier layers' K/V, and with E/K every MLP beside
    /// E experts half as wide of which each token reads K; default 512/0).
    /// Ignored with `--init` (its config fixes it).
    #[arg(long, default_value = "llama")]
    pub layout: lcut_model::Layout,
    /// Tasks to train on (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "copy", value_parser = task_kind())]
    pub tasks: Vec<TaskKind>,
    /// Shortest prompt in tokens.
    #[arg(long, default_value_t = 16)]
    pub min_prompt: usize,
    /// Longest prompt in tokens.
    #[arg(long, default_value_t = 200)]
    pub max_prompt: usize,
    /// Shortest span.
    #[arg(long, default_value_t = 2)]
    pub min_span: usize,
    /// Longest span.
    #[arg(long, default_value_t = 8)]
    pub max_span: usize,
    /// Curriculum: the longest prompt grows linearly from `--start-prompt`
    /// to `--max-prompt` over this many steps (0: no curriculum). Short
    /// prompts are cheap, and the copy circuit found on them carries over.
    #[arg(long, default_value_t = 800)]
    pub curriculum_steps: usize,
    /// The longest prompt at step 0 of the curriculum.
    #[arg(long, default_value_t = 24)]
    pub start_prompt: usize,
    /// The longest span at step 0 of the curriculum (grows to `--max-span`).
    /// Short spans teach the copy circuit in a few hundred steps; long ones
    /// alone stall on a bag-of-words plateau for thousands.
    #[arg(long, default_value_t = 3)]
    pub start_span: usize,
    /// Token budget of a batch: sequences per step shrink to fit
    /// `batch_tokens / longest sequence` (at least 8, at most
    /// `--batch-size`). 0: always `--batch-size` sequences.
    #[arg(long, default_value_t = 4096)]
    pub batch_tokens: usize,
    /// Steps between progress lines.
    #[arg(long, default_value_t = 50)]
    pub log_every: usize,
    /// Steps between teacher-forced validations (0: only at the end).
    #[arg(long, default_value_t = 250)]
    pub val_every: usize,
    /// Held-out instances of the final greedy evaluation (0: skip it).
    #[arg(long, default_value_t = 200)]
    pub eval_n: usize,
}

impl TrainArgs {
    /// The library's options.
    pub fn options(&self) -> TrainOptions {
        TrainOptions {
            out: self.out.clone(),
            policy: self.policy.clone(),
            init: self.init.clone(),
            seed: self.seed,
            steps: self.steps,
            batch_size: self.batch_size,
            lr: self.lr,
            init_std: self.init_std,
            warmup: self.warmup,
            weight_decay: self.weight_decay,
            clip: self.clip,
            layers: self.layers,
            hidden: self.hidden,
            intermediate: self.intermediate,
            heads: self.heads,
            kv_heads: self.kv_heads,
            layout: self.layout,
            tasks: self.tasks.clone(),
            min_prompt: self.min_prompt,
            max_prompt: self.max_prompt,
            min_span: self.min_span,
            max_span: self.max_span,
            curriculum_steps: self.curriculum_steps,
            start_prompt: self.start_prompt,
            start_span: self.start_span,
            batch_tokens: self.batch_tokens,
            log_every: self.log_every,
            val_every: self.val_every,
            eval_n: self.eval_n,
        }
    }
}

/// `--tasks`: the task names (each shown with what it asks), each parsed
/// into a [`TaskKind`].
fn task_kind() -> impl TypedValueParser<Value = TaskKind> {
    let values = TaskKind::ALL.map(|k| PossibleValue::new(k.name()).help(k.description()));
    PossibleValuesParser::new(values).try_map(|s| s.parse::<TaskKind>())
}

/// Arguments of `lcut eval`: greedy exact match on held-out task instances.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct EvalArgs {
    /// Model folder (config.json, model.safetensors; training.json, when
    /// present, gives the task distribution the model was trained on).
    #[arg(long)]
    pub model: PathBuf,
    /// Visibility policy: `full`, `speed:3+bos`, `speed:3/4`, `selfonly:3+bos`, ...
    /// (with --suite, several, comma-separated; with --ratios, methods).
    #[arg(long, visible_alias = "policies", default_value = "full")]
    pub policy: String,
    /// Number of held-out instances.
    #[arg(long, default_value_t = 200)]
    pub n: usize,
    /// Seed of the held-out instances.
    #[arg(long, default_value_t = lcut_train::eval::DEFAULT_EVAL_SEED)]
    pub seed: u64,
}

impl EvalArgs {
    /// The library's options.
    pub fn options(&self) -> EvalOptions {
        EvalOptions {
            model: self.model.clone(),
            policy: self.policy.clone(),
            n: self.n,
            seed: self.seed,
        }
    }
}

/// Run `lcut train`.
pub fn train(args: &TrainArgs) -> Result<()> {
    Ok(lcut_train::run_train(&args.options())?)
}

/// Run `lcut eval`; the last line printed is `exact_match=...`.
pub fn eval(args: &EvalArgs) -> Result<()> {
    let result = lcut_train::run_eval(&args.options())?;
    println!("{}", result.exact_match_line());
    Ok(())
}
