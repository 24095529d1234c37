//! The empirical sweep: for each cutoff, SPEED teacher-forced on the full
//! model's greedy continuation (top-1 agreement, KL, NLL and, on a
//! mixture-of-experts model, the top-k overlap of its decode tokens'
//! routing with the full model's), with KV bytes and prefill FLOPs at a
//! chosen context length. One full prefill per prompt
//! gives both the full model's continuation and the prefix every cutoff
//! forks.

use candle_core::Tensor;
use lcut_diag::{FlopShape, OverlapTotals, finish_sweep, policy_prefill_flops};
use lcut_model::probes::{Beside, PromptMassProbe, PromptRecord};
use lcut_model::{Decoder, LogitRows, Probe, Sequence};
use lcut_policy::{Anchors, KvCost, Policy, PolicyKind, TokenPhases};
use lcut_trace::{Sweep, SweepPoint, Thresholds};

use super::policy_axis::{AxisPolicy, AxisTotals, measure};
use super::quality::{Totals, score};
use super::routing::{RoutingProbe, decode_step_positions};
use super::{DiagnoseEvent, LabelledPrompt, tell};
use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationConfig};
use crate::prompt::PreparedPrompt;
use crate::session::Session;
use crate::shared_prefix::SharedPrefix;

/// Settings of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepOptions {
    /// Cutoffs to try; every cutoff 1..=L when `None`.
    pub cuts: Option<Vec<usize>>,
    /// Also sweep anchor-free SPEED.
    pub anchor_free: bool,
    /// Context length for the cost columns.
    pub context_len: usize,
    /// Greedy continuation length per prompt.
    pub max_new_tokens: usize,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Other policies measured on the same prompts and continuations
    /// (SlimInfer configurations, pairs at equal K/V), each prefilled afresh.
    pub axis: Vec<AxisPolicy>,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            cuts: None,
            anchor_free: false,
            context_len: 128 * 1024,
            max_new_tokens: 16,
            prefill_chunk: GenerationConfig::default().prefill_chunk,
            axis: Vec::new(),
        }
    }
}

/// Logits [n, V] of the decode-phase tokens `tokens` fed after `prefix`.
fn decode_logits(
    model: &Decoder,
    mut seq: Sequence,
    tokens: &[u32],
    probe: Option<&mut (dyn Probe + '_)>,
) -> Result<Tensor> {
    let out = model.forward(&mut seq, tokens, LogitRows::All, probe)?;
    out.logits.ok_or(EngineError::MissingLogits {
        position: seq.len() - 1,
    })
}

/// The layers `policies`' teacher-forced passes start from (each above
/// the lower layers it runs as the full model does), ascending, once each.
pub(super) fn full_depth_starts(policies: &[Policy]) -> Vec<usize> {
    let mut starts: Vec<usize> = policies.iter().map(Policy::full_depth_below).collect();
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// The policies a sweep measures, in order.
fn sweep_policies(num_layers: usize, opts: &SweepOptions) -> Result<Vec<Policy>> {
    let cuts = opts
        .cuts
        .clone()
        .unwrap_or_else(|| (1..=num_layers).collect());
    let mut anchors = vec![Anchors::Bos];
    if opts.anchor_free {
        anchors.push(Anchors::None);
    }
    let mut out = Vec::new();
    for a in anchors {
        for &c in &cuts {
            out.push(Policy::new(PolicyKind::Speed, c, num_layers, a)?);
        }
    }
    Ok(out)
}

/// The full model's greedy continuation of prompt `index`, and the prompt
/// up to its decode start at full depth, shared by every cutoff: one
/// chunked prefill serves both (the prefix is forked off at the decode
/// start, then the generation goes on from there).
fn full_continuation(
    session: &Session,
    prompt: &PreparedPrompt,
    opts: &SweepOptions,
    (index, axis): (usize, &[Policy]),
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<(Vec<u32>, SharedPrefix)> {
    let config = GenerationConfig {
        prefill_chunk: opts.prefill_chunk,
        ..session.greedy_config(opts.max_new_tokens)
    };
    let total = prompt.decode_start;
    let sizes = (opts.max_new_tokens, opts.prefill_chunk.max(1));
    let shared = SharedPrefix::run_with(&session.model, prompt, axis, sizes, |done| {
        on_event(&DiagnoseEvent::Prefill { index, done, total })
    })?;
    let full = shared.full(prompt)?;
    let generation = Generation::from_prefix(&session.model, prompt.clone(), full, config)?;
    Ok((generation.run(|_| true)?.tokens, shared))
}

/// One prompt teacher-forced on the full model's greedy continuation: the
/// continuation, the full-depth run up to the decode start (which every
/// policy that can branches from: SPEED and bands restricted, the policy
/// axis's presses, SwiftKV and SlimInfer as [`SharedPrefix`] serves them),
/// the tokens fed after it, the full model's rows predicting the
/// continuation, and the states that pass left entering the layers a
/// policy's pass starts from ([`Decoder::forward_above`]: below them every
/// policy run here computes what the full model did).
pub(super) struct Forced {
    /// The full model's greedy continuation.
    pub(super) continuation: Vec<u32>,
    /// The prompt's one full-depth run.
    pub(super) shared: SharedPrefix,
    fed: Vec<u32>,
    first_row: usize,
    /// The full model's logits predicting each continuation token [n, V].
    pub(super) reference: Tensor,
    /// The full pass's states entering each layer asked for.
    entering: PromptRecord,
}

impl Forced {
    /// Prefill `prompt` (index `index` of the run) at full depth for the
    /// full model and the policies of `axis` that can branch from that run,
    /// generate its continuation and take the full model's rows, with
    /// `probe` (when given) seeing the pass of the decode-phase tokens
    /// (where its decode queries read the prompt, how they route) and the
    /// states entering each layer of `starts` recorded (where the model
    /// lets a pass start there: [`Decoder::runs_above`]).
    pub(super) fn new(
        session: &Session,
        prompt: &PreparedPrompt,
        opts: &SweepOptions,
        (index, axis, starts): (usize, &[Policy], &[usize]),
        probe: Option<&mut dyn Probe>,
        on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
    ) -> Result<Self> {
        let (continuation, shared) =
            full_continuation(session, prompt, opts, (index, axis), on_event)?;
        let model = &session.model;
        Self::on_prefix(model, prompt, (continuation, shared), starts, probe)
    }

    /// [`Forced::new`] on a continuation already known (a diagnostic run's
    /// greedy tokens): the prompt up to its decode start is prefilled at
    /// full depth in chunks of `chunk`, for the full model and the policies
    /// of `branches` that can branch from that run; nothing is generated.
    pub(super) fn given(
        session: &Session,
        prompt: &PreparedPrompt,
        (continuation, chunk): (Vec<u32>, usize),
        branches: &[Policy],
        probe: Option<&mut dyn Probe>,
    ) -> Result<Self> {
        let model = &session.model;
        let shared = SharedPrefix::run(model, prompt, branches, (continuation.len(), chunk))?;
        Self::on_prefix(model, prompt, (continuation, shared), &[], probe)
    }

    /// The full model's rows predicting `continuation`, its decode-phase
    /// tokens run in one pass on the full model's state from `shared` (the
    /// full-depth prompt up to its decode start) with `probe` attached and
    /// the states entering `starts` recorded.
    fn on_prefix(
        model: &Decoder,
        prompt: &PreparedPrompt,
        (continuation, shared): (Vec<u32>, SharedPrefix),
        starts: &[usize],
        probe: Option<&mut dyn Probe>,
    ) -> Result<Self> {
        let s = prompt.decode_start;
        let mut fed: Vec<u32> = prompt.ids[s..].to_vec();
        fed.extend_from_slice(&continuation[..continuation.len().saturating_sub(1)]);
        // rows of `fed` that predict the continuation: positions P-1 .. P+n-2
        let first_row = prompt.len() - 1 - s;
        // each start's state, and those of the lower layers whose K/V the
        // layers above it read
        let recorded = starts
            .iter()
            .filter(|&&l| model.runs_above(l, fed.len()).is_ok())
            .flat_map(|&l| model.entering_layers_above(l));
        let mut entering = PromptRecord::entering(recorded);
        let full = shared.full(prompt)?;
        let all = match entering.is_empty() {
            true => decode_logits(model, full, &fed, probe)?,
            false => {
                let mut beside = Beside {
                    probe,
                    recorder: &mut entering,
                };
                decode_logits(model, full, &fed, Some(&mut beside))?
            }
        };
        let reference = all.narrow(0, first_row, continuation.len())?;
        Ok(Self {
            continuation,
            shared,
            fed,
            first_row,
            reference,
            entering,
        })
    }

    /// `policy`'s own state before the decode start, taken from the shared
    /// prompt run (`None` where the run cannot serve it:
    /// [`SharedPrefix::branch`]).
    pub(super) fn branch(
        &self,
        model: &Decoder,
        prompt: &PreparedPrompt,
        policy: Policy,
    ) -> Result<Option<Sequence>> {
        self.shared.branch(model, policy, prompt.phases(&policy)?)
    }

    /// The rows of a run over `fed` that predict the continuation.
    fn rows(&self, logits: Tensor) -> Result<Tensor> {
        Ok(logits.narrow(0, self.first_row, self.continuation.len())?)
    }

    /// `policy` (one that reuses the full prefill: SPEED, a knockout band)
    /// on the prefix restricted to what it keeps, its decode-phase tokens
    /// in one pass, scored against the full model.
    pub(super) fn restricted(
        &self,
        model: &Decoder,
        prompt: &PreparedPrompt,
        policy: Policy,
    ) -> Result<Totals> {
        self.restricted_with(model, prompt, policy, None)
    }

    /// [`Forced::restricted`] with `probe` seeing the decode-phase pass.
    pub(super) fn restricted_with(
        &self,
        model: &Decoder,
        prompt: &PreparedPrompt,
        policy: Policy,
        probe: Option<&mut dyn Probe>,
    ) -> Result<Totals> {
        let seq = self.shared.restricted(policy, prompt.phases(&policy)?)?;
        // below the layers it runs as the full model does, the full pass's
        // states (the same bits); `probe` sees only the layers run
        let from = policy.full_depth_below();
        let recorded = model
            .entering_layers_above(from)
            .into_iter()
            .all(|l| self.entering.chunks(l).is_some());
        let logits = match recorded {
            true => model
                .forward_above(seq, &self.fed, from, &self.entering, LogitRows::All, probe)?
                .logits
                .ok_or(EngineError::MissingLogits {
                    position: prompt.decode_start + self.fed.len() - 1,
                })?,
            false => decode_logits(model, seq, &self.fed, probe)?,
        };
        score(&self.reference, &self.rows(logits)?, &self.continuation)
    }
}

/// A SPEED point: its quality sums and its costs at the context length.
fn speed_point(
    policy: &Policy,
    t: &Totals,
    opts: &SweepOptions,
    shape: &FlopShape,
    model: &Decoder,
) -> SweepPoint {
    let layers = policy.num_layers();
    let full = Policy::full(layers);
    let anchors = policy.anchors().len(None).unwrap_or(0);
    let ctx = opts.context_len.max(anchors + 1);
    let cost = KvCost {
        anchors,
        prefill: ctx - anchors - 1,
        decode: 1 + opts.max_new_tokens,
    };
    // a windowed layer holds and reads at most its window; a layer that
    // reads another's K/V holds none (Gemma 4)
    let kv = model.kv_bytes_for(policy, &cost);
    let kv_full = model.kv_bytes_for(&full, &cost);
    let phases = TokenPhases::raw_prompt(ctx, anchors).unwrap_or(TokenPhases::all_decode());
    let flops = policy_prefill_flops(shape, policy.visibility(phases).as_ref(), ctx);
    let flops_full = policy_prefill_flops(shape, full.visibility(phases).as_ref(), ctx);
    let n = t.tokens.max(1) as f64;
    SweepPoint {
        policy: policy.spec(),
        top1_agreement: (t.agree / n) as f32,
        mean_kl: (t.kl / n) as f32,
        nll: (t.nll / n) as f32,
        kv_bytes: kv,
        kv_ratio: kv as f32 / kv_full.max(1) as f32,
        prefill_flops: flops,
        prefill_ratio: (flops / flops_full.max(1.0)) as f32,
        tokens: Some(t.tokens),
        routing_overlap: None,
    }
}

/// What the sweep measures on every prompt, and its running sums.
struct SweepRun<'a> {
    session: &'a Session,
    opts: &'a SweepOptions,
    /// The SPEED points' policies.
    policies: Vec<Policy>,
    /// The comparison axis, resolved.
    axis: Vec<Policy>,
    totals: Vec<Totals>,
    /// Per SPEED point, its routing's top-k overlap with the full model's
    /// (a mixture-of-experts model only).
    overlaps: Vec<OverlapTotals>,
    axis_totals: Vec<AxisTotals>,
}

impl SweepRun<'_> {
    /// Measure every policy on prompt `i`, adding to the sums.
    fn prompt(
        &mut self,
        i: usize,
        prompt: &PreparedPrompt,
        on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
    ) -> Result<()> {
        let model = &self.session.model;
        let layers = model.config().num_layers;
        let steps = self.policies.len() + self.axis.len();
        let step_done = |step: usize, on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool| {
            let max_steps = steps;
            tell(
                on_event,
                &DiagnoseEvent::Step {
                    index: i,
                    step,
                    max_steps,
                },
            )
        };
        let mut mass = PromptMassProbe::new(layers, prompt.decode_start);
        // on a mixture-of-experts model the full pass also records routing
        let moe = model.config().experts.is_some();
        let from = prompt.len() - 1;
        let mut full_routing = RoutingProbe::new(from);
        let mut with = Beside {
            probe: (!self.axis.is_empty()).then_some(&mut mass as &mut dyn Probe),
            recorder: &mut full_routing,
        };
        let probe: Option<&mut dyn Probe> = match moe {
            true => Some(&mut with),
            false => with.probe.take(),
        };
        // every cutoff's pass starts above the layers it shares with the
        // full model's
        let starts = full_depth_starts(&self.policies);
        let forced = Forced::new(
            self.session,
            prompt,
            self.opts,
            (i, &self.axis, &starts),
            probe,
            on_event,
        )?;
        let positions = decode_step_positions(prompt, forced.continuation.len());
        let full = full_routing.trace(model.config(), &positions)?;
        for (k, policy) in self.policies.iter().enumerate() {
            // below its start a pass routes as the full model's did
            let mut routing = full_routing.below(policy.full_depth_below());
            let probe = full.is_some().then_some(&mut routing as &mut dyn Probe);
            let t = forced.restricted_with(model, prompt, *policy, probe)?;
            if let (Some(full), Some(under)) = (&full, routing.trace(model.config(), &positions)?) {
                self.overlaps[k].add(&lcut_diag::routing_overlap(&under, full)?);
            }
            let acc = &mut self.totals[k];
            acc.agree += t.agree;
            acc.kl += t.kl;
            acc.nll += t.nll;
            acc.tokens += t.tokens;
            step_done(k + 1, on_event)?;
        }
        let (continuation, reference) = (&forced.continuation, &forced.reference);
        let chunk = self.opts.prefill_chunk.max(1);
        for (k, policy) in self.axis.iter().enumerate() {
            measure(
                model,
                (prompt, &forced.shared),
                *policy,
                continuation,
                (reference, &mass),
                chunk,
                &mut self.axis_totals[k],
            )?;
            step_done(self.policies.len() + k + 1, on_event)?;
        }
        Ok(())
    }
}

/// Run the sweep over `prompts`; `on_event` returns false to cancel. The
/// sweep names this build and its kernels' level (`made_by`).
pub fn sweep(
    session: &Session,
    prompts: &[LabelledPrompt],
    opts: &SweepOptions,
    thresholds: &Thresholds,
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<Sweep> {
    let model = &session.model;
    let layers = model.config().num_layers;
    let policies = sweep_policies(layers, opts)?;
    let axis = opts
        .axis
        .iter()
        .map(|a| session.resolve_policy(&a.spec))
        .collect::<Result<Vec<_>>>()?;
    let mut run = SweepRun {
        session,
        opts,
        totals: vec![Totals::default(); policies.len()],
        overlaps: vec![OverlapTotals::default(); policies.len()],
        axis_totals: vec![AxisTotals::default(); axis.len()],
        policies,
        axis,
    };
    let total = prompts.len();
    for (i, lp) in prompts.iter().enumerate() {
        let id = lp.id.clone();
        tell(
            on_event,
            &DiagnoseEvent::PromptStarted {
                index: i,
                total,
                id,
            },
        )?;
        run.prompt(i, &lp.prompt, on_event)?;
        tell(on_event, &DiagnoseEvent::PromptDone { index: i, total })?;
    }
    let shape = super::policy_axis::flop_shape(model);
    let points = run
        .policies
        .iter()
        .zip(&run.totals)
        .zip(&run.overlaps)
        .map(|((policy, t), o)| {
            let mut point = speed_point(policy, t, opts, &shape, model);
            point.routing_overlap = o.mean();
            point
        })
        .collect();
    let mut result = finish_sweep(opts.context_len, points, thresholds);
    result.policies = opts
        .axis
        .iter()
        .zip(&run.axis_totals)
        .map(|(a, t)| t.point(a))
        .collect();
    result.made_by = vec![crate::made_by::current()];
    Ok(result)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;

    /// Every cutoff's teacher-forced pass (with BoS and without), started
    /// above the layers it shares with the full model, scores exactly as
    /// its whole pass, and on a mixture-of-experts model routes its decode
    /// steps as the whole pass does (the layers below its start taken from
    /// the full pass's routing): the sweep's numbers do not depend on where
    /// it starts.
    #[test]
    fn forced_passes_started_above_score_as_whole_passes() {
        let cases = ["llama-gqa", "gemma3-sliding", lcut_testkit::GEMMA4_CASE];
        let moe_cases = [
            "moe/qwen3moe-sparse",
            "moe/gptoss-sinks",
            lcut_testkit::GEMMA4MOE_CASE,
        ];
        for case in cases.into_iter().chain(moe_cases) {
            let dir = lcut_testkit::oracle_case(case);
            let session = Session::load(&dir, DType::F32, &Device::Cpu).unwrap();
            let cfg = session.model.config();
            let ids = lcut_testkit::oracle_ids(case).unwrap();
            let prompt = PreparedPrompt::from_ids(ids[..24].to_vec(), Some(20)).unwrap();
            let opts = SweepOptions {
                max_new_tokens: 6,
                anchor_free: true,
                ..SweepOptions::default()
            };
            let policies = sweep_policies(cfg.num_layers, &opts).unwrap();
            let starts = full_depth_starts(&policies);
            let from = prompt.len() - 1;
            let mut full_routing = RoutingProbe::new(from);
            let run = |starts: &[usize], probe: Option<&mut dyn Probe>| {
                Forced::new(
                    &session,
                    &prompt,
                    &opts,
                    (0, &[], starts),
                    probe,
                    &mut |_| true,
                )
                .unwrap()
            };
            let above = run(&starts, Some(&mut full_routing));
            let whole = run(&[], None);
            assert!(!above.entering.is_empty() && whole.entering.is_empty());
            let positions = decode_step_positions(&prompt, above.continuation.len());
            assert_eq!(
                full_routing.trace(cfg, &positions).unwrap().is_some(),
                moe_cases.contains(&case)
            );
            for p in &policies {
                let mut routed_above = full_routing.below(p.full_depth_below());
                let mut routed_whole = RoutingProbe::new(from);
                let a = above
                    .restricted_with(&session.model, &prompt, *p, Some(&mut routed_above))
                    .unwrap();
                let w = whole
                    .restricted_with(&session.model, &prompt, *p, Some(&mut routed_whole))
                    .unwrap();
                let bits =
                    |t: Totals| (t.agree.to_bits(), t.kl.to_bits(), t.nll.to_bits(), t.tokens);
                assert_eq!(bits(a), bits(w), "{case} {p}");
                assert!(a.tokens > 0);
                let trace = |r: &RoutingProbe| r.trace(cfg, &positions).unwrap();
                assert_eq!(trace(&routed_above), trace(&routed_whole), "{case} {p}");
            }
        }
    }
}
