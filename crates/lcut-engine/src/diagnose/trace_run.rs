//! One prompt's greedy run with the diagnostic probe, turned into its
//! trace: phase masses, the prompt map, curvature, a mixture-of-experts
//! model's routing and, when asked, the logit lens of every decode step
//! (and its logits, streamed to a file).

use lcut_model::{Decoder, LensProbe, LensRecord};
use lcut_policy::{Policy, TokenPhases};
use lcut_trace::{LensTrace, PromptTrace, Series, Tensor3, TraceHeader};

use super::{DeviceCurvature, DiagnoseOptions, DiagnosticProbe, LabelledPrompt, LensLogitsFile};
use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationConfig, PrefillProgress, Sampling};
use crate::prompt::PreparedPrompt;

/// Progress within one prompt's diagnostic run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptProgress {
    /// A prefill chunk is done.
    Prefill(PrefillProgress),
    /// This many decode steps are done.
    Step(usize),
}

/// What every traced prompt of a run shares: the model, the policy of its
/// greedy runs, the options, the stop tokens and how ids become strings.
pub struct TracedRun<'a> {
    /// The model.
    pub model: &'a Decoder,
    /// The policy the greedy runs are made under.
    pub policy: Policy,
    /// The run's options (token budget, prompt bins, lens).
    pub opts: &'a DiagnoseOptions,
    /// Tokens that end a generation.
    pub stop_tokens: &'a [u32],
    /// Token strings of ids, for the trace.
    pub token_strings: &'a dyn Fn(&[u32]) -> Vec<String>,
}

impl TracedRun<'_> {
    /// Greedy generation of `lp` with the diagnostic probe; `lens_file`
    /// receives each step's lens logits when the run keeps them;
    /// `on_progress` hears of every prefill chunk and decode step and
    /// returns false to cancel.
    pub fn trace(
        &self,
        lp: &LabelledPrompt,
        mut lens_file: Option<&mut LensLogitsFile>,
        on_progress: &mut dyn FnMut(PromptProgress) -> bool,
    ) -> Result<PromptTrace> {
        let cfg = self.model.config();
        let prompt = &lp.prompt;
        let (p, s) = (prompt.len(), prompt.decode_start);
        // BoS is the anchor the diagnostics report apart (m_bos = a[0]).
        let phases = TokenPhases::new(p, s, usize::from(s > 0))?;
        let (probe, ids) = self.generate(lp, phases, lens_file.as_deref_mut(), on_progress)?;
        let header = TraceHeader {
            index: lp.index,
            id: lp.id.clone(),
            prompt_tokens: (self.token_strings)(&prompt.ids),
            prompt_len: p,
            decode_start: s,
            anchor_len: phases.anchor_len(),
        };
        let n = ids.len();
        let heads = cfg.num_heads;
        let mut trace =
            PromptTrace::zeroed(header, cfg.num_layers, heads, n, self.opts.max_prompt_bins);
        trace.query_positions = (0..n).map(|k| probe.first_step() + k).collect();
        trace.generated = (self.token_strings)(&ids);
        if let Some(file) = lens_file {
            let tokens: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
            let positions: Vec<i64> = trace.query_positions.iter().map(|&q| q as i64).collect();
            let sites = cfg.num_layers + 1;
            let name = format!("prompt.{}", lp.index);
            file.close(
                &format!("{name}.logits"),
                "F32",
                &[n, sites, cfg.vocab_size],
            )?;
            file.write_i64(&format!("{name}.tokens"), &tokens)?;
            file.write_i64(&format!("{name}.positions"), &positions)?;
        }
        trace.generated_ids = ids;
        if cfg.attention_sinks {
            trace.sink = Some(Tensor3::zeros([cfg.num_layers, n, heads]));
        }
        record_masses(&mut trace, &probe, n)?;
        if let Some(routing) = probe.routing() {
            trace.routing = routing.trace(cfg, &trace.query_positions)?;
        }
        if self.opts.lens {
            trace.lens = Some(lens_trace(
                probe.lens_records(),
                probe.first_step(),
                n,
                cfg.num_layers + 1,
            ));
        }
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

    /// Greedy generation of `lp` under the run's policy with the diagnostic
    /// probe attached: the probe and the generated ids.
    fn generate(
        &self,
        lp: &LabelledPrompt,
        phases: TokenPhases,
        mut lens_file: Option<&mut LensLogitsFile>,
        on_progress: &mut dyn FnMut(PromptProgress) -> bool,
    ) -> Result<(DiagnosticProbe<'_>, Vec<u32>)> {
        let prompt = &lp.prompt;
        let layers = self.model.config().num_layers;
        let mut generation =
            traced_generation(self.model, prompt, self.policy, self.opts, self.stop_tokens)?;
        let mut probe = DiagnosticProbe::new(phases, prompt.len(), layers);
        if self.model.config().experts.is_some() {
            probe = probe.with_routing();
        }
        if self.model.config().linear_attention.is_some() {
            probe = probe.with_state_split(self.model.config().num_heads);
        }
        if self.opts.lens {
            let lens = LensProbe::new(self.model, prompt.len() - 1);
            probe = probe.with_lens(match lens_file {
                Some(_) => lens.keeping_logits(),
                None => lens,
            });
        }
        if !generation.prefill_with(Some(&mut probe), |p| {
            on_progress(PromptProgress::Prefill(p))
        })? {
            return Err(EngineError::Cancelled);
        }
        let mut ids = Vec::new();
        while let Some(step) = generation.step(Some(&mut probe))? {
            ids.push(step.token);
            if let (Some(file), Some(lens)) = (lens_file.as_deref_mut(), probe.lens_mut()) {
                for (_, z) in lens.take_logits() {
                    file.append_f32(&z.flatten_all()?.to_vec1::<f32>()?)?;
                }
            }
            if !on_progress(PromptProgress::Step(ids.len())) {
                return Err(EngineError::Cancelled);
            }
        }
        Ok((probe, ids))
    }
}

/// The greedy generation a trace records: `policy`, the run's token budget
/// and the model's stop tokens, the default prefill chunk.
pub(super) fn traced_generation<'m>(
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

/// Copy the probe's per-(layer, step, head) masses (the sink's where
/// `trace` holds them; a linear layer's state split, listed in
/// `state_split_layers`) and entropies of the first `n` generated tokens
/// into `trace`, and its layer x prompt-bin
/// attention map (mean over heads and steps).
fn record_masses(trace: &mut PromptTrace, probe: &DiagnosticProbe<'_>, n: usize) -> Result<()> {
    let heads = trace.num_heads;
    let mut split_layers = std::collections::BTreeSet::new();
    for rec in probe.records() {
        let k = rec.position - probe.first_step();
        if k >= n {
            continue;
        }
        if rec.state_split {
            split_layers.insert(rec.layer);
        }
        for h in 0..heads {
            let at = [rec.layer, k, h];
            trace.bos.view_mut()[at] = rec.bos[h];
            trace.anchor.view_mut()[at] = rec.anchor[h];
            trace.prefill.view_mut()[at] = rec.prefill[h];
            trace.decode.view_mut()[at] = rec.decode[h];
            trace.self_mass.view_mut()[at] = rec.self_mass[h];
            trace.prefill_entropy.view_mut()[at] = rec.prefill_entropy[h];
            if let Some(sink) = trace.sink.as_mut() {
                sink.view_mut()[at] = rec.sink[h];
            }
        }
    }
    trace.state_split_layers = split_layers.into_iter().collect();
    let sums = probe.prompt_bin_sums(&trace.bin_edges)?;
    let scale = 1.0 / (heads * n.max(1)) as f32;
    for (l, row) in sums.iter().enumerate() {
        for (b, v) in row.iter().enumerate() {
            trace.prompt_attention.view_mut()[[l, b]] = v * scale;
        }
    }
    Ok(())
}

/// The lens records of the first `n` steps (step k at position
/// `first_step + k`) as a trace's `[sites, n]` lens; a site a policy kept
/// a step out of stays NaN.
fn lens_trace(records: &[LensRecord], first_step: usize, n: usize, sites: usize) -> LensTrace {
    let mut lens = LensTrace::empty(sites, n);
    for rec in records {
        let Some(k) = rec.position.checked_sub(first_step).filter(|&k| k < n) else {
            continue;
        };
        for i in 0..sites.min(rec.rank.len()) {
            if rec.rank[i] == 0 {
                continue;
            }
            lens.logprob.view_mut()[[i, k]] = rec.logprob[i];
            lens.rank.view_mut()[[i, k]] = rec.rank[i] as f32;
            lens.top1.view_mut()[[i, k]] = f32::from(u8::from(rec.top[i] == rec.target));
            lens.kl.view_mut()[[i, k]] = rec.kl[i];
            lens.top_ids[i * n + k] = rec.top[i];
        }
    }
    lens
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
    let policy = super::run_policy(opts, model.config().num_layers)?;
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
    let run = TracedRun {
        model,
        policy,
        opts,
        stop_tokens,
        token_strings,
    };
    run.trace(lp, None, on_progress)
}
