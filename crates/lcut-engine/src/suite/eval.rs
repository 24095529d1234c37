//! Running a suite under a policy: per item, the full model's greedy
//! continuation (its rows are the reference), the policy's own greedy
//! generation (scored against the answer), and the policy teacher-forced
//! on the full continuation (top-1 agreement, KL, K/V held). The prompt is
//! run once for the full model and every policy that can branch from that
//! run ([`SharedPrefix`]: SPEED and the kept-head plans restrict it, the
//! presses decide from it, SwiftKV projects its upper K/V from it), and
//! once for any other policy (its greedy and forced runs fork one state
//! before the decode start); an item's generations then decode side by
//! side, one pass over the weights per token for all of them. With an
//! adapted model the reference is the base model's full-depth run, so the
//! scores say what the adapter keeps of the model it was made from.

use std::time::Instant;

use candle_core::Tensor;
use lcut_model::{Decoder, Sequence};
use lcut_policy::{Policy, PolicySpec};

use super::SuiteItem;
use super::branch_memory::ItemMemory;
use super::result::ItemResult;
use crate::diagnose::{ForcedQuality, ForcedScore, forced_quality};
use crate::error::{EngineError, Result};
use crate::generate::{
    Generation, GenerationConfig, GenerationOutput, Sampling, check_fits, prefill_prefix,
};
use crate::prompt::PreparedPrompt;
use crate::session::Session;
use crate::shared_prefix::SharedPrefix;

/// Settings of a suite run.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteEvalOptions {
    /// The policies as written (`full`, `speed:22+bos`, `slim:...`); the
    /// full model's run of an item is shared by all of them.
    pub policies: Vec<String>,
    /// Most new tokens per generation (of an item that names no budget, or
    /// of every item without `item_budgets`).
    pub max_new_tokens: usize,
    /// An item's own `max_new_tokens` (RULER's per task) wins over
    /// `max_new_tokens`.
    pub item_budgets: bool,
    /// Run only shard `(i, n)`: items i, i+n, ...
    pub shard: Option<(usize, usize)>,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Bytes an item's run may hold beside the weights; its policies run
    /// in groups that fit ([`ItemMemory::groups`]). `None`: what the
    /// model's device has free as the item begins.
    pub memory_budget: Option<u64>,
}

impl Default for SuiteEvalOptions {
    fn default() -> Self {
        Self {
            policies: vec!["full".into()],
            max_new_tokens: 24,
            item_budgets: false,
            shard: None,
            prefill_chunk: GenerationConfig::default().prefill_chunk,
            memory_budget: None,
        }
    }
}

impl SuiteEvalOptions {
    /// The bytes an item's run may hold: the budget given, else the
    /// [planned share](super::planned_share) of what the session's device
    /// has free now (`None` when it cannot say).
    pub fn memory_budget_or_free(&self, session: &Session) -> Option<u64> {
        super::branch_memory::budget_or_free(self.memory_budget, session)
    }

    /// The new-token budget of `item` in this run.
    pub fn budget(&self, item: &SuiteItem) -> usize {
        let run = (!self.item_budgets).then_some(self.max_new_tokens);
        item.budget(run, self.max_new_tokens)
    }
}

/// Resolve `text` against the session's model.
pub fn resolve_policy(session: &Session, text: &str) -> Result<Policy> {
    let spec: PolicySpec = text.parse()?;
    session.resolve_policy(&spec)
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
    check_items(session, items, &indices, &policies, opts)?;
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

/// Refuse, before any item runs, a run that some of its items cannot
/// finish: a prompt that with its budget does not fit the model, or one a
/// policy cannot run (a press's window or sinks as long as the prompt).
/// Names the policy, how many items it refuses and the first, so that a
/// long run does not stop at its 49th item with nothing kept.
pub(crate) fn check_items(
    session: &Session,
    items: &[SuiteItem],
    indices: &[usize],
    policies: &[Policy],
    opts: &SuiteEvalOptions,
) -> Result<()> {
    let prompts = indices
        .iter()
        .map(|&i| Ok((i, items[i].prepare(session)?)))
        .collect::<Result<Vec<_>>>()?;
    refuse_any("the model", items, &prompts, String::new(), |i, prompt| {
        let config = GenerationConfig {
            max_new_tokens: opts.budget(&items[i]),
            ..GenerationConfig::default()
        };
        check_fits(&session.model, prompt, &config).err()
    })?;
    let shortest = prompts.iter().map(|(_, p)| p.decode_start).min();
    for (written, policy) in opts.policies.iter().zip(policies) {
        let hint = match (policy.press(), shortest) {
            (Some(_), Some(n)) => format!(
                " (the run's shortest prompt holds {n} token(s) before its decode start: \
                 leave the shorter items out, or give the press a smaller window)"
            ),
            _ => String::new(),
        };
        refuse_any(written, items, &prompts, hint, |_, prompt| {
            let phases = match prompt.phases(policy) {
                Ok(phases) => phases,
                Err(err) => return Some(err),
            };
            policy.check_phases(&phases).err().map(EngineError::from)
        })?;
    }
    let budget = opts.memory_budget_or_free(session);
    refuse_any(
        "the memory free",
        items,
        &prompts,
        String::new(),
        |i, prompt| {
            item_memory(session, &items[i], prompt, policies, opts)
                .and_then(|m| m.groups(budget))
                .err()
        },
    )
}

/// What `item`'s run under `policies` holds beside the weights.
fn item_memory(
    session: &Session,
    item: &SuiteItem,
    prompt: &PreparedPrompt,
    policies: &[Policy],
    opts: &SuiteEvalOptions,
) -> Result<ItemMemory> {
    let sizes = (opts.budget(item), opts.prefill_chunk.max(1));
    ItemMemory::of(&session.model, prompt, policies, sizes)
}

/// What the item of `opts.shard` that holds the most holds beside the
/// weights under `opts.policies` (`None` for no items): for the memory line
/// a run prints before it starts.
pub fn largest_item_memory(
    session: &Session,
    items: &[SuiteItem],
    opts: &SuiteEvalOptions,
) -> Result<Option<ItemMemory>> {
    let policies = opts
        .policies
        .iter()
        .map(|p| resolve_policy(session, p))
        .collect::<Result<Vec<_>>>()?;
    let mut largest: Option<ItemMemory> = None;
    for i in crate::diagnose::shard_indices(items.len(), opts.shard)? {
        let prompt = items[i].prepare(session)?;
        let m = item_memory(session, &items[i], &prompt, &policies, opts)?;
        if largest.as_ref().is_none_or(|l| m.total() > l.total()) {
            largest = Some(m);
        }
    }
    Ok(largest)
}

/// The refusal of the items of `prompts` for which `why` gives a reason,
/// if any.
fn refuse_any(
    what: &str,
    items: &[SuiteItem],
    prompts: &[(usize, PreparedPrompt)],
    hint: String,
    why: impl Fn(usize, &PreparedPrompt) -> Option<EngineError>,
) -> Result<()> {
    let mut refused = prompts
        .iter()
        .filter_map(|(i, prompt)| why(*i, prompt).map(|reason| (*i, reason)));
    let Some((first, reason)) = refused.next() else {
        return Ok(());
    };
    let count = 1 + refused.count();
    Err(EngineError::SuiteItemsRefused {
        what: what.to_string(),
        detail: format!(
            "{count} of the {} item(s) to run, the first being item {}: {reason}{hint}",
            prompts.len(),
            items[first].id
        ),
    })
}

/// The full model's run of an item: its greedy continuation, its text,
/// and the logits row of each of its tokens (the forced runs' reference).
struct FullRun {
    output: GenerationOutput,
    text: String,
    rows: Vec<Tensor>,
}

/// A policy's two runs of an item, from one state of the prompt before its
/// decode start: its own greedy generation, and the run teacher-forced on
/// the full model's continuation (its rows scored against the full run's
/// as they come). The two are one run until the policy's own choice first
/// differs from the full model's token: only then is the own run forked
/// off ([`Generation::fork_choosing`]), so a policy that answers as the
/// full model does decodes once, not twice.
struct PolicyRuns<'m> {
    /// The own run once it has left the forced one; `None` while the two
    /// are one (its tokens are then the forced run's).
    own: Option<Generation<'m>>,
    forced: Generation<'m>,
    forced_score: ForcedScore,
}

impl<'m> PolicyRuns<'m> {
    /// The two runs from `prefix`, their first steps taken (a press or
    /// SlimInfer decides there and lets go of its copy of the prompt's K/V
    /// before the next policy's runs begin). The rest of the prompt runs
    /// once: both runs read the same tokens until the first is produced.
    /// With settings that differ from the forced run's (an adapted model's
    /// stop tokens), the own run is a copy of the forced run's state at
    /// that point and goes its own way from the start.
    fn begin(
        model: &'m Decoder,
        prompt: &PreparedPrompt,
        prefix: Sequence,
        (own, full): (&GenerationConfig, &GenerationConfig),
        reference: &FullRun,
    ) -> Result<Self> {
        let mut forced = Generation::from_prefix(model, prompt.clone(), prefix, full.clone())?;
        forced.prefill_with(None, |_| true)?;
        let own = match own == full && own.sampling == Sampling::Greedy {
            true => None,
            false => Some(forced.fork_prefilled(own.clone())?.ok_or(
                EngineError::MissingLogits {
                    position: prompt.len().saturating_sub(1),
                },
            )?),
        };
        let mut runs = Self {
            own,
            forced,
            forced_score: ForcedScore::default(),
        };
        step_runs(&mut [&mut runs], reference, true)?;
        Ok(runs)
    }

    /// The policy's own greedy tokens so far.
    fn own_tokens(&self) -> &[u32] {
        self.own
            .as_ref()
            .map_or(self.forced.produced(), Generation::produced)
    }
}

/// Step `runs` side by side ([`Generation::step_together`]: one pass over
/// the weights per token for all of them) until each has ended, or only
/// once when `once`; each forced run takes the full run's token of its step
/// and is scored against the full run's row, and an own run still one with
/// its forced run is forked off where its choice differs.
fn step_runs(runs: &mut [&mut PolicyRuns<'_>], full: &FullRun, once: bool) -> Result<()> {
    let continuation = &full.output.tokens;
    loop {
        let mut gens: Vec<&mut Generation<'_>> = Vec::with_capacity(2 * runs.len());
        // where each run's forced generation sits in `gens`
        let mut forced_at = Vec::with_capacity(runs.len());
        for r in runs.iter_mut() {
            forced_at.push(gens.len());
            gens.push(&mut r.forced);
            if let Some(own) = r.own.as_mut() {
                gens.push(own);
            }
        }
        // the index of the token each generation produces now
        let next: Vec<usize> = gens.iter().map(|g| g.produced().len()).collect();
        // each generation's own choice of this step
        let mut chose = vec![None; gens.len()];
        let steps = Generation::step_together(&mut gens, |i, own| {
            chose[i] = Some(own);
            match forced_at.binary_search(&i) {
                Ok(_) => continuation.get(next[i]).copied().unwrap_or(own),
                Err(_) => own,
            }
        })?;
        if steps.iter().all(Option::is_none) {
            return Ok(());
        }
        for (r, &at) in runs.iter_mut().zip(&forced_at) {
            let Some(step) = &steps[at] else { continue };
            // a forced run stops where the full run does: its row is
            // scored against the full row of the same step
            let reference = full
                .rows
                .get(step.index)
                .ok_or(EngineError::MissingLogits {
                    position: r.forced.sequence().len().saturating_sub(1),
                })?;
            r.forced_score
                .add_row(reference, &step.logits, continuation[step.index])?;
            if let (None, Some(own)) = (&r.own, chose[at])
                && own != step.token
            {
                let fork = r.forced.fork_choosing(own)?;
                r.own = Some(fork.ok_or(EngineError::MissingLogits {
                    position: r.forced.sequence().len().saturating_sub(1),
                })?);
            }
        }
        if once {
            return Ok(());
        }
    }
}

/// One item: the reference's full greedy run, then per policy its own
/// greedy generation and the policy teacher-forced on the full run's
/// continuation, decoded side by side ([`Generation::step_together`]: one
/// pass over the weights per token for all of them), in as few groups of
/// policies as the memory free allows ([`ItemMemory::groups`]; the same
/// results in any grouping). The prompt runs once for the reference and
/// every policy that branches from its run ([`SharedPrefix`]), and once for
/// each other policy. Each result's seconds are the item's wall time.
pub(crate) fn evaluate_item(
    (session, base): (&Session, Option<&Session>),
    index: usize,
    item: &SuiteItem,
    policies: &[Policy],
    opts: &SuiteEvalOptions,
) -> Result<Vec<ItemResult>> {
    let start = Instant::now();
    let reference = base.unwrap_or(session);
    let prompt = item.prepare(session)?;
    let (max_new, chunk) = (opts.budget(item), opts.prefill_chunk.max(1));
    let budget = opts.memory_budget_or_free(session);
    let groups = item_memory(session, item, &prompt, policies, opts)?.groups(budget)?;
    // one prompt run serves the full model and every policy that can branch
    // from it; with an adapted model the reference is the base model's run
    let shared = match base {
        None => SharedPrefix::run(&session.model, &prompt, policies, (max_new, chunk))?,
        Some(_) => SharedPrefix::run(&reference.model, &prompt, &[], (max_new, chunk))?,
    };
    let own_config = GenerationConfig {
        prefill_chunk: chunk,
        ..session.greedy_config(max_new)
    };
    // the forced runs end where the full run ends: the same stops and budget
    let full_config = GenerationConfig {
        prefill_chunk: chunk,
        ..reference.greedy_config(max_new)
    };
    let full = {
        let prefix = shared.full(&prompt)?;
        let mut run = Generation::from_prefix(
            &reference.model,
            prompt.clone(),
            prefix,
            full_config.clone(),
        )?;
        let mut rows = Vec::new();
        while let Some(step) = run.step(None)? {
            rows.push(step.logits);
        }
        let output = run.output();
        FullRun {
            text: reference.generated_text(&output.tokens),
            output,
            rows,
        }
    };
    let mut results = Vec::with_capacity(policies.len());
    for group in groups {
        let mut runs = Vec::with_capacity(group.len());
        for &policy in &policies[group] {
            if base.is_none() && policy.is_full_depth() {
                runs.push(None);
                continue;
            }
            let branched = match base {
                None => shared.branch(&session.model, policy, prompt.phases(&policy)?)?,
                Some(_) => None,
            };
            let prefix = match branched {
                Some(seq) => seq,
                None => prefill_prefix(&session.model, &prompt, policy, max_new, chunk)?,
            };
            let configs = (&own_config, &full_config);
            let begun = PolicyRuns::begin(&session.model, &prompt, prefix, configs, &full)?;
            runs.push(Some(begun));
        }
        step_runs(
            &mut runs.iter_mut().flatten().collect::<Vec<_>>(),
            &full,
            false,
        )?;
        for r in &runs {
            results.push(policy_result(session, &prompt, item, r.as_ref(), &full)?);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    for r in &mut results {
        r.index = index;
        r.seconds = seconds;
    }
    Ok(results)
}

/// One policy on one item from its runs (none for a full-depth policy of
/// the session, which is the full run), against the full model's run.
fn policy_result(
    session: &Session,
    prompt: &PreparedPrompt,
    item: &SuiteItem,
    runs: Option<&PolicyRuns<'_>>,
    full: &FullRun,
) -> Result<ItemResult> {
    let continuation = &full.output.tokens;
    let (generation, q) = match runs {
        None => {
            let q = ForcedQuality {
                tokens: continuation.len(),
                agree: continuation.len(),
                kl: 0.0,
                kv_held: full.output.kv_bytes_held,
                kv_full: full.output.kv_bytes_held,
            };
            (full.text.clone(), q)
        }
        Some(r) => {
            let q = forced_quality(&session.model, r.forced.sequence(), prompt, r.forced_score);
            if q.tokens != continuation.len() {
                return Err(EngineError::ForcedRows {
                    scored: q.tokens,
                    continuation: continuation.len(),
                });
            }
            (session.generated_text(r.own_tokens()), q)
        }
    };
    let graded = item.scoring.is_string_match();
    Ok(ItemResult {
        index: 0,
        id: item.id.clone(),
        kind: item.kind.clone(),
        length: item.length.clone(),
        correct: item.is_correct(&generation),
        full_correct: item.is_correct(&full.text),
        score: graded.then(|| item.score(&generation)),
        full_score: graded.then(|| item.score(&full.text)),
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
