//! Running a suite under a policy: per item, the full model's greedy
//! continuation (its rows are the reference), the policy's own greedy
//! generation (scored against the answer), and the policy teacher-forced
//! on the full continuation (top-1 agreement, KL, K/V held). With an
//! adapted model the reference is the base model's full-depth run, so the
//! scores say what the adapter keeps of the model it was made from.

use std::time::Instant;

use candle_core::Tensor;
use lcut_policy::{Policy, PolicySpec};

use super::SuiteItem;
use super::result::ItemResult;
use crate::diagnose::{ForcedQuality, forced_quality};
use crate::error::{EngineError, Result};
use crate::generate::{GenerationConfig, GenerationOutput};
use crate::prompt::PreparedPrompt;
use crate::session::Session;

/// Settings of a suite run.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteEvalOptions {
    /// The policies as written (`full`, `speed:22+bos`, `slim:...`); the
    /// full model's run of an item is shared by all of them.
    pub policies: Vec<String>,
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
            policies: vec!["full".into()],
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

/// Run the items of `opts.shard` (all when unsharded) in suite order under
/// each policy of `session`; returns one list of results per policy. The
/// full-depth reference is `base`'s (the model without an adapter) when
/// given, else `session`'s own. `on_item` sees each item's results (one
/// per policy) as they are made.
pub fn evaluate_suite(
    session: &Session,
    base: Option<&Session>,
    items: &[SuiteItem],
    opts: &SuiteEvalOptions,
    on_item: &mut dyn FnMut(&[ItemResult]),
) -> Result<Vec<Vec<ItemResult>>> {
    evaluate_suite_until(session, base, items, opts, &mut |results| {
        on_item(results);
        true
    })
}

/// [`evaluate_suite`] that its caller can stop: after each item `on_item`
/// returns false to cancel ([`EngineError::Cancelled`]), so a long run
/// stops within one item.
pub fn evaluate_suite_until(
    session: &Session,
    base: Option<&Session>,
    items: &[SuiteItem],
    opts: &SuiteEvalOptions,
    on_item: &mut dyn FnMut(&[ItemResult]) -> bool,
) -> Result<Vec<Vec<ItemResult>>> {
    let policies = opts
        .policies
        .iter()
        .map(|p| resolve_policy(session, p))
        .collect::<Result<Vec<_>>>()?;
    let indices = crate::diagnose::shard_indices(items.len(), opts.shard)?;
    let mut out = vec![Vec::with_capacity(indices.len()); policies.len()];
    for index in indices {
        let results = evaluate_item((session, base), index, &items[index], &policies, opts)?;
        if !on_item(&results) {
            return Err(EngineError::Cancelled);
        }
        for (list, r) in out.iter_mut().zip(results) {
            list.push(r);
        }
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
    let (max_new, chunk) = (opts.max_new_tokens, opts.prefill_chunk.max(1));
    match rows {
        Some(rows) => session.continue_greedy(prompt, policy, max_new, chunk, |step| {
            rows.push(step.logits.clone());
            true
        }),
        None => session.continue_greedy(prompt, policy, max_new, chunk, |_| true),
    }
}

/// The full model's run of an item: its greedy continuation, the rows
/// that chose it, its text, and whether it is the evaluated session's own
/// run (then a full-depth policy is this run) or the base model's.
struct FullRun {
    output: GenerationOutput,
    reference: Tensor,
    text: String,
    of_session: bool,
}

/// One item: the reference's full greedy run once, then per policy its own
/// greedy generation and the policy teacher-forced on that continuation.
fn evaluate_item(
    (session, base): (&Session, Option<&Session>),
    index: usize,
    item: &SuiteItem,
    policies: &[Policy],
    opts: &SuiteEvalOptions,
) -> Result<Vec<ItemResult>> {
    let start = Instant::now();
    let reference = base.unwrap_or(session);
    let prompt = session.prepare_text(&item.prompt, item.system.as_deref(), true)?;
    let mut rows = Vec::new();
    let layers = session.model.config().num_layers;
    let output = greedy(
        reference,
        &prompt,
        Policy::full(layers),
        opts,
        Some(&mut rows),
    )?;
    let full = FullRun {
        text: reference.generated_text(&output.tokens),
        reference: Tensor::stack(&rows, 0)?,
        output,
        of_session: base.is_none(),
    };
    let shared_s = start.elapsed().as_secs_f64();
    policies
        .iter()
        .map(|&policy| {
            let start = Instant::now();
            let mut r = policy_result(session, &prompt, item, policy, &full, opts)?;
            r.index = index;
            r.seconds = shared_s + start.elapsed().as_secs_f64();
            Ok(r)
        })
        .collect()
}

/// One policy on one item, against the full model's run.
fn policy_result(
    session: &Session,
    prompt: &PreparedPrompt,
    item: &SuiteItem,
    policy: Policy,
    full: &FullRun,
    opts: &SuiteEvalOptions,
) -> Result<ItemResult> {
    let continuation = &full.output.tokens;
    let (generation, q) = if full.of_session && policy.is_full_depth() {
        let q = ForcedQuality {
            tokens: continuation.len(),
            agree: continuation.len(),
            kl: 0.0,
            kv_held: full.output.kv_bytes_held,
            kv_full: full.output.kv_bytes_held,
        };
        (full.text.clone(), q)
    } else {
        let own = greedy(session, prompt, policy, opts, None)?;
        let q = forced_quality(
            &session.model,
            prompt,
            policy,
            continuation,
            &full.reference,
            opts.prefill_chunk.max(1),
        )?;
        (session.generated_text(&own.tokens), q)
    };
    Ok(ItemResult {
        index: 0,
        id: item.id.clone(),
        kind: item.kind.clone(),
        length: item.length.clone(),
        correct: item.is_correct(&generation),
        full_correct: item.is_correct(&full.text),
        generation,
        full_generation: full.text.clone(),
        forced_tokens: q.tokens,
        agree: q.agree,
        kl_sum: q.kl,
        kv_bytes_held: q.kv_held,
        kv_bytes_full: q.kv_full,
        seconds: 0.0,
    })
}
