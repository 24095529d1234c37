//! The diagnostic run: greedy generation over a prompt set with the
//! diagnostic probe attached, turned into per-prompt traces and a report.
//! The run is at full depth; under another policy (`DiagnoseOptions::policy`)
//! the same probe records what decode attends to under that policy (the
//! paper's decode-time attention under SPEED+BoS): at a layer where a
//! policy drops the prompt, its mass and map show what is left. On a
//! mixture-of-experts model the probe also records how each decode step
//! routes, and a policy's routing is compared with the full model's on the
//! run's own tokens (`DiagnoseOptions::routing_policy`, or the run's policy).

mod attention_row;
mod curvature;
mod knockout;
mod lens_file;
pub mod memory;
mod policy_axis;
mod probe;
mod prompts;
mod quality;
mod routing;
mod sweep;
mod teacher;
mod trace_run;

use std::path::{Path, PathBuf};

use lcut_policy::{Policy, PolicySpec};
use lcut_trace::{ModelIdentity, Report, RunSettings, Thresholds};

pub use attention_row::{AttentionRow, attention_row};
pub use curvature::DeviceCurvature;
pub use knockout::{knockout_policies, knockout_trace};
pub use lens_file::LensLogitsFile;
pub use policy_axis::{AxisPolicy, equal_kv_pairs, predicted_prefill_flops_ratio};
pub use probe::DiagnosticProbe;
pub use prompts::{BUNDLED_PROMPTS, PromptSpec, read_prompt_set, shard_indices};
pub(crate) use quality::{RowScratch, score_row};
pub use routing::{RoutingProbe, decode_step_positions, routing_overlap_of};
pub use sweep::{SweepOptions, sweep};
pub(crate) use teacher::{ForcedQuality, ForcedScore, forced_quality};
pub use trace_run::{PromptProgress, TracedRun, trace_prompt, trace_prompt_under};

use crate::error::{EngineError, Result};
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
    /// Record the logit lens of every decode step: an LM-head product per
    /// hidden state per step, off by default (on SmolLM2, 31 products with
    /// its 49152 x 576 head: about 6.5 times a decode step's arithmetic).
    pub lens: bool,
    /// Also write every step's lens logits [L + 1, vocab] to this
    /// safetensors file (needs `lens`).
    pub lens_logits: Option<PathBuf>,
    /// After the greedy runs, measure causal prompt knockout per band of
    /// this many layers, teacher-forced on the full model's continuation
    /// (one pass per band and prompt); off when absent.
    pub knockout: Option<usize>,
    /// On a mixture-of-experts model, after the greedy runs, compare the
    /// decode tokens' routing under this policy with the full model's,
    /// both teacher-forced on the run's tokens (top-k overlap per layer;
    /// two more passes per prompt). A run under `policy` compares that
    /// policy without it; naming both, or naming this for a model without
    /// experts, is refused.
    pub routing_policy: Option<PolicySpec>,
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
            lens: false,
            lens_logits: None,
            knockout: None,
            routing_policy: None,
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
        sliding_window: match cfg.sliding_window.iter().any(Option::is_some) {
            true => cfg.sliding_window.clone(),
            false => Vec::new(),
        },
        layer_flops: policy_axis::flop_shape(&session.model).layers,
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
    if let Some(band) = opts.knockout {
        // a band the model cannot hold, or whose meaning its layout does
        // not define, is refused before the first prompt
        for policy in knockout_policies(session.model.config().num_layers, band)? {
            session.model.check_layout(&policy)?;
        }
    }
    let compared = routing_comparison(session, opts)?;
    let mut traces = Vec::with_capacity(total);
    let mut lens_file = match (&opts.lens_logits, opts.lens) {
        (Some(path), true) => Some(open_lens_file(session, path, total)?),
        _ => None,
    };
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
        let policy = run_policy(opts, session.model.config().num_layers)?;
        let run = TracedRun {
            model: &session.model,
            policy,
            opts,
            stop_tokens: &stops,
            token_strings: &tokens,
        };
        let trace = run.trace(lp, lens_file.as_mut(), &mut |progress| {
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
    if let Some(file) = lens_file {
        file.finish()?;
    }
    if let Some(band) = opts.knockout {
        add_knockout(
            session,
            prompts,
            (band, opts.max_new_tokens),
            &mut traces,
            on_event,
        )?;
    }
    if let Some(policy) = compared {
        add_routing_overlap(session, prompts, policy, &mut traces, on_event)?;
    }
    let policy = run_policy(opts, session.model.config().num_layers)?;
    let settings = RunSettings {
        policy: (!policy.is_full_depth()).then(|| policy.to_string()),
        routing_policy: compared.map(|p| p.to_string()),
        max_new_tokens: opts.max_new_tokens,
        prompts_file: opts.prompts_file.clone(),
        shard: opts.shard,
        thresholds: opts.thresholds,
        chat_template_used: opts.use_chat_template && session.has_chat_template(),
        max_prompt_bins: opts.max_prompt_bins,
    };
    let report = lcut_diag::build_report(
        &tool_version(),
        model_identity(session)?,
        settings,
        traces,
        None,
    )?;
    Ok(Report {
        made_by: vec![crate::made_by::current()],
        ..report
    })
}

/// Measure the knockout of every prompt into its trace, telling
/// `on_event` of each prompt again (a second pass over the prompt set).
fn add_knockout(
    session: &Session,
    prompts: &[LabelledPrompt],
    (band, max_new_tokens): (usize, usize),
    traces: &mut [lcut_trace::PromptTrace],
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<()> {
    let total = prompts.len();
    for (i, (lp, trace)) in prompts.iter().zip(traces.iter_mut()).enumerate() {
        tell(
            on_event,
            &DiagnoseEvent::PromptStarted {
                index: i,
                total,
                id: format!("knockout {}", lp.id),
            },
        )?;
        trace.knockout = Some(knockout_trace(
            session,
            &lp.prompt,
            (band, max_new_tokens),
            i,
            on_event,
        )?);
        tell(on_event, &DiagnoseEvent::PromptDone { index: i, total })?;
    }
    Ok(())
}

/// The policy whose routing a run compares with the full model's: the one
/// `opts.routing_policy` names (the run at full depth) or the run's own
/// policy; `None` for a run at full depth that names none, and for a run
/// under a policy on a model without experts. Naming a policy to compare on
/// a model without experts, or beside a run's own policy, is refused.
fn routing_comparison(session: &Session, opts: &DiagnoseOptions) -> Result<Option<Policy>> {
    let run = run_policy(opts, session.model.config().num_layers)?;
    let moe = session.model.config().experts.is_some();
    match (&opts.routing_policy, run.is_full_depth()) {
        (None, true) => Ok(None),
        (None, false) => Ok(moe.then_some(run)),
        (Some(spec), _) if !moe => Err(EngineError::RoutingComparison {
            policy: spec.to_string(),
            reason: "the model has no experts: only a mixture-of-experts model routes its tokens"
                .to_string(),
        }),
        (Some(spec), true) => Ok(Some(session.resolve_policy(spec)?)),
        (Some(spec), false) => Err(EngineError::RoutingComparison {
            policy: spec.to_string(),
            reason: format!(
                "the run is under {run}, whose own routing is compared with the full model's; \
                 name one policy"
            ),
        }),
    }
}

/// Compare every prompt's routing under `policy` with the full model's,
/// teacher-forced on the trace's own tokens, into its trace (a second pass
/// over the prompt set, `on_event` told of each prompt again).
fn add_routing_overlap(
    session: &Session,
    prompts: &[LabelledPrompt],
    policy: Policy,
    traces: &mut [lcut_trace::PromptTrace],
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<()> {
    let total = prompts.len();
    let chunk = crate::GenerationConfig::default().prefill_chunk;
    for (i, (lp, trace)) in prompts.iter().zip(traces.iter_mut()).enumerate() {
        tell(
            on_event,
            &DiagnoseEvent::PromptStarted {
                index: i,
                total,
                id: format!("routing {}", lp.id),
            },
        )?;
        let overlap = routing_overlap_of(session, &lp.prompt, &trace.generated_ids, policy, chunk)?;
        if let Some(routing) = trace.routing.as_mut() {
            routing.overlap = overlap;
        }
        tell(on_event, &DiagnoseEvent::PromptDone { index: i, total })?;
    }
    Ok(())
}

/// The policy of the greedy runs: `opts.policy` resolved for a model of
/// `layers` layers, the full model when none is given.
fn run_policy(opts: &DiagnoseOptions, layers: usize) -> Result<Policy> {
    Ok(match &opts.policy {
        Some(spec) => spec.resolve(layers)?,
        None => Policy::full(layers),
    })
}

/// The file `--save-lens-logits` streams a run's lens logits into, for
/// `prompts` prompts of `session`'s model.
fn open_lens_file(session: &Session, path: &Path, prompts: usize) -> Result<LensLogitsFile> {
    let cfg = session.model.config();
    LensLogitsFile::create(
        path,
        3 * prompts,
        &[
            ("model", session.name().to_string()),
            ("sites", (cfg.num_layers + 1).to_string()),
            (
                "layout",
                "prompt.I.logits [steps, num_layers + 1, vocab]: site 0 the embeddings, site l + 1 \
                 the output of layer l, through the final norm and LM head"
                    .to_string(),
            ),
        ],
    )
}
