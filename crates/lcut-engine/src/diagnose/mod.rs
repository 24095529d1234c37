//! The diagnostic run: greedy generation over a prompt set with the
//! diagnostic probe attached, turned into per-prompt traces and a report.
//! The run is at full depth; under another policy (`DiagnoseOptions::policy`)
//! the same probe records what decode attends to under that policy (the
//! paper's decode-time attention under SPEED+BoS): at a layer where a
//! policy drops the prompt, its mass and map show what is left.

mod attention_row;
mod curvature;
pub mod memory;
mod policy_axis;
mod probe;
mod prompts;
mod quality;
mod sweep;
mod teacher;

use lcut_model::Decoder;
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use lcut_trace::{
    ModelIdentity, PromptTrace, Report, RunSettings, Series, Thresholds, TraceHeader,
};

pub use attention_row::{AttentionRow, attention_row};
pub use curvature::DeviceCurvature;
pub use policy_axis::{AxisPolicy, equal_kv_pairs, predicted_prefill_flops_ratio};
pub use probe::DiagnosticProbe;
pub use prompts::{BUNDLED_PROMPTS, PromptSpec, read_prompt_set, shard_indices};
pub use sweep::{SweepOptions, sweep};
pub(crate) use teacher::{ForcedQuality, forced_quality};

use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationConfig, PrefillProgress, Sampling};
use crate::prompt::PreparedPrompt;
use crate::session::Session;

/// Settings of a diagnostic run.
#[derive(Debug, Clone, PartialEq)]
pub struct DiagnoseOptions {
    /// Greedy tokens per prompt (EoS may stop earlier).
    pub max_new_tokens: usize,
    /// Thresholds of the recommender.
    pub thresholds: Thresholds,
    /// Most columns of the layer x prompt-position map.
    pub max_prompt_bins: usize,
    /// Run only shard `(i, n)`: prompts i, i+n, i+2n, ...
    pub shard: Option<(usize, usize)>,
    /// Wrap prompts in the model's chat template when it has one.
    pub use_chat_template: bool,
    /// The prompts file, recorded in the report.
    pub prompts_file: Option<String>,
    /// The policy the greedy runs are made under; the full model when absent.
    pub policy: Option<PolicySpec>,
}

impl Default for DiagnoseOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 16,
            thresholds: Thresholds::default(),
            max_prompt_bins: 128,
            shard: None,
            use_chat_template: true,
            prompts_file: None,
            policy: None,
        }
    }
}

/// Tell `on_event` of `event`; its false (cancel) becomes
/// [`EngineError::Cancelled`].
pub(super) fn tell(
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
    event: &DiagnoseEvent,
) -> Result<()> {
    if on_event(event) {
        Ok(())
    } else {
        Err(EngineError::Cancelled)
    }
}

/// Progress of a diagnostic run or sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiagnoseEvent {
    /// Prompt `index` (of `total` in this run) has started.
    PromptStarted {
        /// Index within this run (0-based).
        index: usize,
        /// Prompts in this run.
        total: usize,
        /// The prompt's id.
        id: String,
    },
    /// The current prompt's prefill has processed `done` of its `total`
    /// tokens (one event per chunk, the last with `done == total`).
    Prefill {
        /// Index of the prompt within this run.
        index: usize,
        /// Prompt tokens processed.
        done: usize,
        /// Prompt tokens in all.
        total: usize,
    },
    /// A decode step of the current prompt is done.
    Step {
        /// Index of the prompt within this run.
        index: usize,
        /// Steps done.
        step: usize,
        /// Most steps.
        max_steps: usize,
    },
    /// Prompt `index` is finished.
    PromptDone {
        /// Index within this run.
        index: usize,
        /// Prompts in this run.
        total: usize,
    },
}

/// A prepared prompt with its place in the prompt set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelledPrompt {
    /// Position in the prompt set (orders merged shards).
    pub index: usize,
    /// The prompt's id.
    pub id: String,
    /// Token ids and phase boundaries.
    pub prompt: PreparedPrompt,
}

/// Tokenise the prompts of `opts.shard` (all when unsharded).
pub fn prepare_prompts(
    session: &Session,
    prompts: &[PromptSpec],
    opts: &DiagnoseOptions,
) -> Result<Vec<LabelledPrompt>> {
    prepare_prompts_with(prompts, opts, &|user, system, template| {
        session.prepare_text(user, system, template)
    })
}

/// Turns a prompt's user text, system text and whether to apply the chat
/// template into the model's tokens.
pub type PrepareText<'a> = dyn Fn(&str, Option<&str>, bool) -> Result<PreparedPrompt> + 'a;

/// Tokenise the prompts of `opts.shard` with `prepare` (user text, system
/// text, whether to apply the chat template): a model's
/// [`crate::PromptTokenizer`] does it before the weights are loaded, so
/// that the run's memory is known first.
pub fn prepare_prompts_with(
    prompts: &[PromptSpec],
    opts: &DiagnoseOptions,
    prepare: &PrepareText<'_>,
) -> Result<Vec<LabelledPrompt>> {
    shard_indices(prompts.len(), opts.shard)?
        .into_iter()
        .map(|index| {
            let p = &prompts[index];
            Ok(LabelledPrompt {
                index,
                id: p.id.clone(),
                prompt: prepare(&p.user, p.system.as_deref(), opts.use_chat_template)?,
            })
        })
        .collect()
}

/// The identity of the session's model for reports.
pub fn model_identity(session: &Session) -> Result<ModelIdentity> {
    let cfg = session.model.config();
    Ok(ModelIdentity {
        path: session.name().to_string(),
        config_hash: session.config_hash().to_string(),
        arch: cfg.arch.model_type().to_string(),
        dtype: session.model.weight_mode().name(),
        num_layers: cfg.num_layers,
        num_heads: cfg.num_heads,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        hidden_size: cfg.hidden_size,
        intermediate_size: cfg.intermediate_size,
        vocab_size: cfg.vocab_size,
        adapter: session.adapter.clone(),
    })
}

/// The version written into reports.
pub fn tool_version() -> String {
    format!("lcut {}", env!("CARGO_PKG_VERSION"))
}

/// Run the diagnostics over a prompt set (the shard in `opts`) and build the report.
pub fn diagnose(
    session: &Session,
    prompts: &[PromptSpec],
    opts: &DiagnoseOptions,
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<Report> {
    let prepared = prepare_prompts(session, prompts, opts)?;
    diagnose_prepared(session, &prepared, opts, on_event)
}

/// Run the diagnostics over already tokenised prompts and build the report.
pub fn diagnose_prepared(
    session: &Session,
    prompts: &[LabelledPrompt],
    opts: &DiagnoseOptions,
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<Report> {
    let total = prompts.len();
    let mut traces = Vec::with_capacity(total);
    for (i, lp) in prompts.iter().enumerate() {
        tell(
            on_event,
            &DiagnoseEvent::PromptStarted {
                index: i,
                total,
                id: lp.id.clone(),
            },
        )?;
        let stops = session.stop_tokens();
        let tokens = |ids: &[u32]| match &session.tokenizer {
            Some(t) => t.token_strings(ids),
            None => ids.iter().map(u32::to_string).collect(),
        };
        let trace = trace_prompt(&session.model, lp, opts, &stops, &tokens, &mut |progress| {
            on_event(&match progress {
                PromptProgress::Prefill(p) => DiagnoseEvent::Prefill {
                    index: i,
                    done: p.done,
                    total: p.total,
                },
                PromptProgress::Step(step) => DiagnoseEvent::Step {
                    index: i,
                    step,
                    max_steps: opts.max_new_tokens,
                },
            })
        })?;
        traces.push(trace);
        tell(on_event, &DiagnoseEvent::PromptDone { index: i, total })?;
    }
    let policy = run_policy(opts, session.model.config().num_layers)?;
    let settings = RunSettings {
        policy: (!policy.is_full_depth()).then(|| policy.to_string()),
        max_new_tokens: opts.max_new_tokens,
        prompts_file: opts.prompts_file.clone(),
        shard: opts.shard,
        thresholds: opts.thresholds,
        chat_template_used: opts.use_chat_template && session.has_chat_template(),
        max_prompt_bins: opts.max_prompt_bins,
    };
    Ok(lcut_diag::build_report(
        &tool_version(),
        model_identity(session)?,
        settings,
        traces,
        None,
    )?)
}

/// The policy of the greedy runs: `opts.policy` resolved for a model of
/// `layers` layers, the full model when none is given.
fn run_policy(opts: &DiagnoseOptions, layers: usize) -> Result<Policy> {
    Ok(match &opts.policy {
        Some(spec) => spec.resolve(layers)?,
        None => Policy::full(layers),
    })
}

/// The greedy generation a trace records: `policy`, the run's token budget
/// and the model's stop tokens, the default prefill chunk.
fn traced_generation<'m>(
    model: &'m Decoder,
    prompt: &PreparedPrompt,
    policy: Policy,
    opts: &DiagnoseOptions,
    stop_tokens: &[u32],
) -> Result<Generation<'m>> {
    let config = GenerationConfig {
        max_new_tokens: opts.max_new_tokens,
        sampling: Sampling::Greedy,
        stop_tokens: stop_tokens.to_vec(),
        ..GenerationConfig::default()
    };
    Generation::new(model, prompt.clone(), policy, config)
}

/// Greedy generation of `prompt` under `policy` with the diagnostic probe
/// attached: the probe and the generated ids.
fn generate_probed(
    model: &Decoder,
    prompt: &PreparedPrompt,
    (policy, phases): (Policy, TokenPhases),
    (opts, stop_tokens): (&DiagnoseOptions, &[u32]),
    on_progress: &mut dyn FnMut(PromptProgress) -> bool,
) -> Result<(DiagnosticProbe, Vec<u32>)> {
    let layers = model.config().num_layers;
    let mut generation = traced_generation(model, prompt, policy, opts, stop_tokens)?;
    let mut probe = DiagnosticProbe::new(phases, prompt.len(), layers);
    if !generation.prefill_with(Some(&mut probe), |p| {
        on_progress(PromptProgress::Prefill(p))
    })? {
        return Err(EngineError::Cancelled);
    }
    let mut ids = Vec::new();
    while let Some(step) = generation.step(Some(&mut probe))? {
        ids.push(step.token);
        if !on_progress(PromptProgress::Step(ids.len())) {
            return Err(EngineError::Cancelled);
        }
    }
    Ok((probe, ids))
}

/// Copy the probe's per-(layer, step, head) masses and entropies of the
/// first `n` generated tokens into `trace`, and its layer x prompt-bin
/// attention map (mean over heads and steps).
fn record_masses(trace: &mut PromptTrace, probe: &DiagnosticProbe, n: usize) -> Result<()> {
    let heads = trace.num_heads;
    for rec in probe.records() {
        let k = rec.position - probe.first_step();
        if k >= n {
            continue;
        }
        for h in 0..heads {
            let at = [rec.layer, k, h];
            trace.bos.view_mut()[at] = rec.bos[h];
            trace.anchor.view_mut()[at] = rec.anchor[h];
            trace.prefill.view_mut()[at] = rec.prefill[h];
            trace.decode.view_mut()[at] = rec.decode[h];
            trace.self_mass.view_mut()[at] = rec.self_mass[h];
            trace.prefill_entropy.view_mut()[at] = rec.prefill_entropy[h];
        }
    }
    let sums = probe.prompt_bin_sums(&trace.bin_edges)?;
    let scale = 1.0 / (heads * n.max(1)) as f32;
    for (l, row) in sums.iter().enumerate() {
        for (b, v) in row.iter().enumerate() {
            trace.prompt_attention.view_mut()[[l, b]] = v * scale;
        }
    }
    Ok(())
}

/// Progress within one prompt's diagnostic run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptProgress {
    /// A prefill chunk is done.
    Prefill(PrefillProgress),
    /// This many decode steps are done.
    Step(usize),
}

/// Greedy generation of one prompt with the diagnostic probe, at full depth
/// or under `opts.policy`; `on_progress` hears of every prefill chunk and
/// decode step and returns false to cancel.
pub fn trace_prompt(
    model: &Decoder,
    lp: &LabelledPrompt,
    opts: &DiagnoseOptions,
    stop_tokens: &[u32],
    token_strings: &dyn Fn(&[u32]) -> Vec<String>,
    on_progress: &mut dyn FnMut(PromptProgress) -> bool,
) -> Result<PromptTrace> {
    let policy = run_policy(opts, model.config().num_layers)?;
    trace_prompt_under(
        model,
        lp,
        policy,
        opts,
        stop_tokens,
        token_strings,
        on_progress,
    )
}

/// [`trace_prompt`] under `policy` whatever `opts.policy` says (the Python
/// package traces one prompt under the policy its caller names): the
/// greedy generation runs under `policy` (the masses then show what its decode tokens read of what it
/// keeps), the masses are split by the same phases as at full depth.
pub fn trace_prompt_under(
    model: &Decoder,
    lp: &LabelledPrompt,
    policy: Policy,
    opts: &DiagnoseOptions,
    stop_tokens: &[u32],
    token_strings: &dyn Fn(&[u32]) -> Vec<String>,
    on_progress: &mut dyn FnMut(PromptProgress) -> bool,
) -> Result<PromptTrace> {
    let cfg = model.config();
    let prompt = &lp.prompt;
    let (p, s) = (prompt.len(), prompt.decode_start);
    // BoS is the anchor the diagnostics report apart (m_bos = a[0]).
    let phases = TokenPhases::new(p, s, usize::from(s > 0))?;
    let (probe, ids) = generate_probed(
        model,
        prompt,
        (policy, phases),
        (opts, stop_tokens),
        on_progress,
    )?;
    let header = TraceHeader {
        index: lp.index,
        id: lp.id.clone(),
        prompt_tokens: token_strings(&prompt.ids),
        prompt_len: p,
        decode_start: s,
        anchor_len: phases.anchor_len(),
    };
    let n = ids.len();
    let heads = cfg.num_heads;
    let mut trace = PromptTrace::zeroed(header, cfg.num_layers, heads, n, opts.max_prompt_bins);
    trace.query_positions = (0..n).map(|k| probe.first_step() + k).collect();
    trace.generated = token_strings(&ids);
    trace.generated_ids = ids;
    record_masses(&mut trace, &probe, n)?;
    let curve = |accs: &[DeviceCurvature]| -> Result<Series> {
        let means = accs
            .iter()
            .map(|a| Ok(a.finish()?.0.unwrap_or(f32::NAN)))
            .collect::<Result<Vec<f32>>>()?;
        Ok(Series(means))
    };
    trace.curvature_prompt = curve(&probe.curvature_prompt)?;
    trace.curvature_generated = curve(&probe.curvature_generated)?;
    trace.validate(&format!("trace of prompt {:?}", lp.id))?;
    Ok(trace)
}
