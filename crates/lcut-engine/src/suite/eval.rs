//! Running a suite under a policy: per item, the full model's greedy
//! continuation (its rows are the reference), the policy's own greedy
//! generation (scored against the answer), and the policy teacher-forced
//! on the full continuation (top-1 agreement, KL, K/V held).

use std::time::Instant;

use candle_core::Tensor;
use lcut_policy::{Policy, PolicySpec};

use super::SuiteItem;
use super::result::ItemResult;
use crate::diagnose::forced_quality;
use crate::error::Result;
use crate::generate::{Generation, GenerationConfig, GenerationOutput};
use crate::prompt::PreparedPrompt;
use crate::session::Session;

/// Settings of a suite run.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteEvalOptions {
    /// The policy as written (`full`, `speed:22+bos`, `slim:...`).
    pub policy: String,
    /// Most new tokens per generation.
    pub max_new_tokens: usize,
    /// Run only shard `(i, n)`: items i, i+n, ...
    pub shard: Option<(usize, usize)>,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
}

impl Default for SuiteEvalOptions {
    fn default() -> Self {
        Self {
            policy: "full".into(),
            max_new_tokens: 24,
            shard: None,
            prefill_chunk: GenerationConfig::default().prefill_chunk,
        }
    }
}

/// Resolve `text` against the session's model.
pub fn resolve_policy(session: &Session, text: &str) -> Result<Policy> {
    let spec: PolicySpec = text.parse()?;
    Ok(spec.resolve(session.model.config().num_layers)?)
}

/// Run the items of `opts.shard` (all when unsharded) in suite order;
/// `on_item` sees each result as it is made.
pub fn evaluate_suite(
    session: &Session,
    items: &[SuiteItem],
    opts: &SuiteEvalOptions,
    on_item: &mut dyn FnMut(&ItemResult),
) -> Result<Vec<ItemResult>> {
    let policy = resolve_policy(session, &opts.policy)?;
    let indices = crate::diagnose::shard_indices(items.len(), opts.shard)?;
    let mut out = Vec::with_capacity(indices.len());
    for index in indices {
        let r = evaluate_item(session, index, &items[index], policy, opts)?;
        on_item(&r);
        out.push(r);
    }
    Ok(out)
}

/// Greedy generation of `prompt` under `policy`; with `rows`, the logits
/// each token was chosen from are collected there.
fn greedy(
    session: &Session,
    prompt: &PreparedPrompt,
    policy: Policy,
    opts: &SuiteEvalOptions,
    rows: Option<&mut Vec<Tensor>>,
) -> Result<GenerationOutput> {
    let config = GenerationConfig {
        max_new_tokens: opts.max_new_tokens,
        stop_tokens: session.stop_tokens(),
        prefill_chunk: opts.prefill_chunk.max(1),
        ..GenerationConfig::default()
    };
    let generation = Generation::new(&session.model, prompt.clone(), policy, config)?;
    match rows {
        Some(rows) => generation.run(|step| {
            rows.push(step.logits.clone());
            true
        }),
        None => generation.run(|_| true),
    }
}

/// The text of generated `tokens`, stop tokens left out.
fn text_of(session: &Session, tokens: &[u32]) -> String {
    let stops = session.stop_tokens();
    let kept: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|t| !stops.contains(t))
        .collect();
    session
        .tokenizer
        .as_ref()
        .map_or_else(String::new, |tok| tok.decode(&kept))
}

/// One item: full greedy, the policy greedy, the policy teacher-forced.
fn evaluate_item(
    session: &Session,
    index: usize,
    item: &SuiteItem,
    policy: Policy,
    opts: &SuiteEvalOptions,
) -> Result<ItemResult> {
    let start = Instant::now();
    let model = &session.model;
    let prompt = session.prepare_text(&item.prompt, item.system.as_deref(), true)?;
    let mut rows = Vec::new();
    let full = greedy(
        session,
        &prompt,
        Policy::full(model.config().num_layers),
        opts,
        Some(&mut rows),
    )?;
    let full_generation = text_of(session, &full.tokens);
    let full_correct = item.is_correct(&full_generation);
    let continuation = &full.tokens;
    let (generation, q) = if policy.is_full_depth() && policy.slim().is_none() {
        let q = crate::diagnose::ForcedQuality {
            tokens: continuation.len(),
            agree: continuation.len(),
            kl: 0.0,
            kv_held: full.kv_bytes_held,
            kv_full: full.kv_bytes_full,
        };
        (full_generation.clone(), q)
    } else {
        let own = greedy(session, &prompt, policy, opts, None)?;
        let reference = Tensor::stack(&rows, 0)?;
        let q = forced_quality(
            model,
            &prompt,
            policy,
            continuation,
            &reference,
            opts.prefill_chunk.max(1),
        )?;
        (text_of(session, &own.tokens), q)
    };
    Ok(ItemResult {
        index,
        id: item.id.clone(),
        kind: item.kind.clone(),
        length: item.length.clone(),
        correct: item.is_correct(&generation),
        full_correct,
        generation,
        full_generation,
        forced_tokens: q.tokens,
        agree: q.agree,
        kl_sum: q.kl,
        kv_bytes_held: q.kv_held,
        kv_bytes_full: q.kv_full,
        seconds: start.elapsed().as_secs_f64(),
    })
}
