//! Errors of the engine: model, tokenizer, template and prompt problems,
//! each naming what was wrong and where.

use std::path::PathBuf;

/// Errors raised by sessions and generation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] lcut_model::ModelError),
    /// The tokenizer files are missing or unreadable.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer {
        /// The file at fault.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The chat template does not compile or render.
    #[error("chat template in {path}: {reason}")]
    Template {
        /// The tokenizer_config.json holding the template.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty: give some text or token ids")]
    EmptyPrompt,
    /// Prompt plus the new-token budget does not fit the model.
    #[error(
        "the prompt has {prompt_len} tokens and {max_new_tokens} new tokens are asked for, \
         but the model allows {max_positions} positions (max_position_embeddings)"
    )]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_len: usize,
        /// Budget of new tokens.
        max_new_tokens: usize,
        /// The model's limit.
        max_positions: usize,
    },
    /// An item's run does not fit the memory free even with its policies
    /// run one group at a time.
    #[error(
        "an item's run needs about {need} beside the weights, more than the {free} free; \
         run fewer or shorter items, or fewer policies"
    )]
    ItemOutOfMemory {
        /// The least the item needs, and its parts.
        need: String,
        /// The memory free.
        free: String,
    },
    /// Some items of a suite cannot run under a policy (a prompt too long
    /// for the model, or too short for a press): found before any item runs.
    #[error("{what} cannot run {detail}; nothing was run")]
    SuiteItemsRefused {
        /// The policy as written, or "the model" for a prompt too long.
        what: String,
        /// How many items of how many, the first of them and why, and
        /// what to change when lcut can say.
        detail: String,
    },
    /// The text needs a tokenizer, but the model folder has none.
    #[error("{folder} has no tokenizer.json: pass token ids instead of text")]
    NoTokenizer {
        /// The model folder.
        folder: PathBuf,
    },
    /// A policy problem (malformed, cutoff out of range, ...).
    #[error(transparent)]
    Policy(#[from] lcut_policy::PolicyError),
    /// Phases that do not fit the prompt.
    #[error(transparent)]
    Phase(#[from] lcut_policy::PhaseError),
    /// A generation was asked to go on from a state that does not hold
    /// exactly the prompt's tokens before its decode start.
    #[error(
        "a prefix holding {held} tokens cannot continue a prompt whose decode start is token {decode_start}"
    )]
    PrefixMismatch {
        /// Tokens the state holds.
        held: usize,
        /// The prompt's decode start.
        decode_start: usize,
    },
    /// The caller cancelled the run.
    #[error("cancelled")]
    Cancelled,
    /// The model returned no logits for a row it must produce (a token the
    /// policy let fall out before the top layer; a bug if it ever shows).
    #[error(
        "the model gave no logits for position {position}: its token did not reach the top layer"
    )]
    MissingLogits {
        /// The position whose logits were asked for.
        position: usize,
    },
    /// A prompt-set file is unreadable or has a bad line.
    #[error("prompt set {path}, line {line}: {reason}")]
    PromptSet {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 for the whole file).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A shard spec outside 0..n.
    #[error("shard {index}/{count} is out of range: expected I/N with 0 <= I < N")]
    Shard {
        /// Shard index.
        index: usize,
        /// Number of shards.
        count: usize,
    },
    /// Building or checking a trace or report failed.
    #[error(transparent)]
    Trace(#[from] lcut_trace::TraceError),
    /// The diagnostics failed.
    #[error(transparent)]
    Diag(#[from] lcut_diag::DiagError),
    /// A task suite file is unreadable or has a bad line.
    #[error(transparent)]
    Suite(#[from] crate::suite::SuiteError),
    /// A RULER-style suite cannot be written as asked.
    #[error(transparent)]
    Ruler(#[from] crate::suite::RulerError),
    /// A leaderboard run cannot go as asked (a ratio, a family, its journal).
    #[error(transparent)]
    Leaderboard(#[from] crate::leaderboard::LeaderboardError),
    /// Shard results that do not make one whole run.
    #[error("merging eval shards: {0}")]
    Merge(String),
    /// A K/V budget's plan that cannot be checked as asked.
    #[error("checking the plan of a K/V budget: {0}")]
    HeadCheck(String),
    /// A shard written other than `I/N` or `auto/N`.
    #[error("shard {text:?}: expected I/N (e.g. 0/4) or auto/N (index from the job array)")]
    BadShard {
        /// The shard as written.
        text: String,
    },
    /// A shard index was to come from the environment, but none is set.
    #[error(
        "--shard auto/{count}: neither SLURM_ARRAY_TASK_ID nor JOB_COMPLETION_INDEX is set \
         (run inside a Slurm job array or a Kubernetes Indexed Job, or give I/N)"
    )]
    NoShardIndex {
        /// Number of shards asked for.
        count: usize,
    },
    /// A shard index variable that is not a number.
    #[error("{var}={value:?} is not a shard index (a non-negative integer)")]
    BadShardIndex {
        /// The environment variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A LoRA adapter could not be read or put into the model (`what`
    /// says which adapter and which step).
    #[error("{what}")]
    Adapter {
        /// `reading LoRA adapter DIR` or `putting LoRA adapter DIR into the model`.
        what: String,
        /// Why.
        #[source]
        source: Box<lcut_model::ModelError>,
    },
    /// An index a caller asked for is outside what exists (a layer of the
    /// model, a step of a trace).
    #[error("{what} is out of range: {limit}")]
    OutOfRange {
        /// What was asked for (`layer 31`).
        what: String,
        /// What exists (`the model has 30 layers`).
        limit: String,
    },
    /// A teacher-forced run ended before (or after) the full run it follows.
    #[error(
        "the teacher-forced run gave {scored} rows for the full model's {continuation}-token \
         continuation"
    )]
    ForcedRows {
        /// Rows the forced run gave.
        scored: usize,
        /// Tokens of the full run's continuation.
        continuation: usize,
    },
    /// A run repeated to record more of it produced other tokens than the
    /// run it repeats.
    #[error(
        "repeating the traced run produced token {replayed} at step {step}, where the trace has \
         {traced}: the model or policy is not the one traced"
    )]
    ReplayDiverged {
        /// The decode step.
        step: usize,
        /// The token the repeat produced.
        replayed: u32,
        /// The token the trace holds.
        traced: u32,
    },
    /// A decode token's routing is missing at a layer of experts.
    #[error(
        "no routing was recorded at layer {layer} for position {position}: a decode token \
         must be routed at every layer of experts"
    )]
    MissingRouting {
        /// The layer of experts.
        layer: usize,
        /// The token's position.
        position: usize,
    },
    /// Routing was asked of a model without experts, or of a run that
    /// cannot compare it.
    #[error("comparing routing under {policy}: {reason}")]
    RoutingComparison {
        /// The policy whose routing was to be compared.
        policy: String,
        /// Why it cannot be, in plain words.
        reason: String,
    },
    /// The logit lens's logits could not be written.
    #[error("lens logits file {path}: {reason}")]
    LensLogits {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Tensor backend error outside the model (sampling).
    #[error("tensor backend: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, EngineError>;
