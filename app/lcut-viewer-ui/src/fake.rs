//! A worker without an engine, for tests and the demo mode: it answers every
//! [`Command`] the way the real worker does, with progress, cancellation and
//! synthetic reports from `lcut_diag::synthetic` and synthetic SlimInfer runs
//! ([`synthetic_slim_run`], `lcut_policy`'s block selection over made-up
//! scores).

use std::thread::JoinHandle;
use std::time::Duration;

use lcut_diag::synthetic::synthetic_report;
use lcut_policy::{
    CutRecord, Policy, PolicySpec, SlimSelection, SlimTrace, StepRecord, TokenPhases,
};

use crate::backend::{
    Command, Event, JobId, LiveMetrics, LiveRequest, LiveStep, LiveToken, ModelSummary,
    PromptSource, WorkerPort,
};
use crate::failure::{FailureKind, JobError};
use crate::jobs::{serve_export, serve_open_report};
use crate::live::DEFAULT_SLIM;
use crate::slim_data::SlimRunView;

/// How the fake worker behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FakeOptions {
    /// Progress steps of a diagnostic run.
    pub diagnose_steps: usize,
    /// Progress steps of its sweep, after the diagnostics are sent.
    pub sweep_steps: usize,
    /// Pause between steps (diagnose and generate).
    pub step_delay: Duration,
    /// Layers of the synthetic model.
    pub layers: usize,
    /// Heads of the synthetic model.
    pub heads: usize,
    /// The synthetic model's longest sequence.
    pub max_positions: usize,
}

impl Default for FakeOptions {
    fn default() -> Self {
        Self {
            diagnose_steps: 8,
            sweep_steps: 4,
            step_delay: Duration::from_millis(5),
            layers: 16,
            heads: 8,
            max_positions: 8192,
        }
    }
}

/// The summary the fake worker reports for any model path (folder or `.gguf`).
pub fn fake_model(path: &str, o: &FakeOptions) -> ModelSummary {
    ModelSummary {
        path: path.to_string(),
        arch: "llama".into(),
        num_layers: o.layers,
        num_heads: o.heads,
        num_kv_heads: o.heads.div_ceil(2),
        head_dim: 16,
        max_positions: o.max_positions,
        has_tokenizer: true,
        has_chat_template: true,
    }
}

/// `steps` progress steps of `phase`, `step_delay` apart; false (and
/// [`Event::Cancelled`] sent) once `job` is cancelled.
fn run_steps(port: &WorkerPort, job: JobId, phase: &str, steps: usize, o: &FakeOptions) -> bool {
    for i in 0..steps {
        if port.is_cancelled(job) {
            port.send(Event::Cancelled);
            return false;
        }
        port.progress(i, steps, format!("{phase} {i}/{steps}"));
        std::thread::sleep(o.step_delay);
    }
    true
}

/// A diagnostic run as the engine worker makes one: progress, then the
/// report; with a sweep, the report without it first, then the sweep's
/// progress and the sweep.
fn diagnose(port: &WorkerPort, job: JobId, prompts: &PromptSource, sweep: bool, o: &FakeOptions) {
    let n_prompts = match prompts {
        PromptSource::Typed(_) => 1,
        _ => 6,
    };
    if !run_steps(port, job, "diagnose: prompt", o.diagnose_steps, o) {
        return;
    }
    let source = "run on the fake backend".to_string();
    let mut report = match synthetic_report(n_prompts, o.layers, o.heads, sweep) {
        Ok(r) => r,
        Err(e) => {
            port.send(Event::DiagnoseFailed(JobError::new(
                FailureKind::Diagnose,
                e.to_string(),
            )));
            return;
        }
    };
    let Some(measured) = report.sweep.take() else {
        port.send(Event::ReportReady {
            report: Box::new(report),
            source,
        });
        return;
    };
    port.send(Event::DiagnoseReady {
        report: Box::new(report),
        source,
    });
    if run_steps(port, job, "sweep: cut", o.sweep_steps, o) {
        port.send(Event::SweepReady(Box::new(measured)));
    }
}

/// Prompt tokens of the fake worker's live prompt, and where its decode
/// phase starts (a chat template's generation prompt of 4 tokens).
pub const FAKE_PROMPT: (usize, usize) = (100, 96);

/// A deterministic score in [0, 1) for block `b` at cut `i`, step `k`
/// (`None` = the prefill): a fixed pattern, with every other block lifted
/// on alternate stretches of 3 steps so that decode sometimes swaps.
fn fake_score(b: usize, i: usize, k: Option<usize>) -> f32 {
    let base = ((b * 7919 + i * 104_729) % 1000) as f32 / 1000.0;
    let lift = matches!(k, Some(k) if (k / 3) % 2 == 1 && b.is_multiple_of(2));
    if lift { 0.5 + base / 2.0 } else { base / 2.0 }
}

/// The `k` best of `blocks` by score (ties to the lower block), ascending.
fn top_k(blocks: &[usize], k: usize, score: impl Fn(usize) -> f32) -> Vec<usize> {
    let mut by_score: Vec<usize> = blocks.to_vec();
    by_score.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    by_score.truncate(k);
    by_score.sort_unstable();
    by_score
}

/// A SlimInfer run of `spec` on a synthetic prompt (`prompt_len` tokens,
/// the decode phase from `decode_start`) over `steps` decode steps, made by
/// `lcut_policy`'s own block selection with synthetic scores: what the
/// viewer's SlimInfer views draw, without a model. `Ok(None)` when `spec`
/// is not a SlimInfer policy; an error when it does not fit the depth.
pub fn synthetic_slim_run(
    spec: &PolicySpec,
    num_layers: usize,
    prompt_len: usize,
    decode_start: usize,
    steps: usize,
) -> Result<Option<SlimRunView>, String> {
    let policy = spec.resolve(num_layers).map_err(|e| e.to_string())?;
    let Some(params) = policy.slim().copied() else {
        return Ok(None);
    };
    let anchors = policy
        .anchor_len(None, decode_start)
        .map_err(|e| e.to_string())?;
    let phases = TokenPhases::new(prompt_len, decode_start, anchors).map_err(|e| e.to_string())?;
    let mut sel = SlimSelection::new(params, phases, num_layers);
    let mut cuts = Vec::new();
    for (i, &layer) in params.cuts().iter().enumerate() {
        let domain = sel.candidate_domain(i);
        let k = params.kept_blocks(i, decode_start);
        let kept = top_k(&domain, k, |b| fake_score(b, i, None));
        sel.decide(i, &kept);
        cuts.push(CutRecord {
            layer,
            budget_tokens: params.budgets()[i].tokens(decode_start),
            scores: domain
                .iter()
                .map(|&b| (b, fake_score(b, i, None)))
                .collect(),
            kept,
            kept_tokens: sel.kept_tokens(i),
        });
    }
    let mut records = Vec::new();
    for k in 0..steps {
        let traffic = (0..params.cuts().len())
            .map(|i| {
                let domain = sel.candidate_domain(i);
                let n = params.kept_blocks(i, decode_start);
                let cand = top_k(&domain, n, |b| fake_score(b, i, Some(k)));
                sel.step(i, &cand)
            })
            .collect();
        let decode = prompt_len - decode_start + k + 1;
        records.push(StepRecord {
            position: prompt_len + k,
            cuts: traffic,
            resident_token_layers: sel.resident_token_layers(decode),
            held_token_layers: sel.held_token_layers(decode),
        });
    }
    let kept_tokens: Vec<usize> = cuts.iter().map(|c| c.kept_tokens).collect();
    Ok(Some(SlimRunView {
        policy: policy.to_string(),
        num_layers,
        prompt_len,
        gamma: params.options.gamma(),
        prompt_tokens: (0..prompt_len).map(|p| format!(" t{p}")).collect(),
        trace: SlimTrace {
            bytes_per_token_layer: 256,
            block: params.options.block,
            sink_tokens: anchors,
            prefill_tokens: decode_start - anchors,
            equal_kv_cutoff: params.equal_kv_cutoff(
                num_layers,
                decode_start - anchors,
                &kept_tokens,
            ),
            cuts,
            steps: records,
        },
    }))
}

/// [`synthetic_slim_run`] of [`DEFAULT_SLIM`]; `None` when it does not fit.
pub fn synthetic_slim(
    num_layers: usize,
    prompt_len: usize,
    decode_start: usize,
    steps: usize,
) -> Option<SlimRunView> {
    let spec: PolicySpec = DEFAULT_SLIM.parse().ok()?;
    synthetic_slim_run(&spec, num_layers, prompt_len, decode_start, steps)
        .ok()
        .flatten()
}

/// The live run's inputs the fake worker uses.
struct FakeRun {
    job: JobId,
    policy: Box<PolicySpec>,
    max_new_tokens: usize,
    extra: Option<Box<PolicySpec>>,
}

/// Figures of a fake policy after `k + 1` tokens, holding `prompt_layers`
/// token-layers of prompt K/V (and `resident` of them resident).
fn fake_metrics(k: usize, o: &FakeOptions, prompt_layers: u64, resident: u64) -> LiveMetrics {
    let bytes_per_token = 2 * o.heads.div_ceil(2) as u64 * 16 * 4;
    let decode = o.layers as u64 * (2 + k as u64);
    LiveMetrics {
        ttft_s: Some(0.001),
        tpot_s: (k > 0).then_some(0.001),
        tokens: k + 1,
        kv_bytes: bytes_per_token * (prompt_layers + decode),
        kv_bytes_resident: bytes_per_token * (resident + decode),
    }
}

/// The synthetic SlimInfer run (when the extra policy is one), the SPEED
/// policy and the extra policy of a fake run.
type FakePolicies = (Option<SlimRunView>, Policy, Option<Policy>);

/// The fake run's policies, resolved for the fake model (the extra one as
/// a synthetic SlimInfer run when it is one); a policy that does not fit is
/// reported to the UI as a failed generation and gives `None`.
fn fake_policies(port: &WorkerPort, run: &FakeRun, o: &FakeOptions) -> Option<FakePolicies> {
    let (prompt_len, decode_start) = FAKE_PROMPT;
    let slim = match &run.extra {
        None => None,
        Some(spec) => {
            match synthetic_slim_run(spec, o.layers, prompt_len, decode_start, run.max_new_tokens) {
                Ok(v) => v,
                Err(e) => {
                    port.send(Event::GenerationFailed(JobError::new(
                        FailureKind::Policy,
                        e,
                    )));
                    return None;
                }
            }
        }
    };
    let resolved = (
        run.policy.resolve(o.layers),
        run.extra.as_ref().map(|s| s.resolve(o.layers)).transpose(),
    );
    match resolved {
        (Ok(speed), Ok(extra)) => Some((slim, speed, extra)),
        (Err(e), _) | (_, Err(e)) => {
            port.send(Event::GenerationFailed(JobError::new(
                FailureKind::Policy,
                e.to_string(),
            )));
            None
        }
    }
}

fn generate(port: &WorkerPort, run: &FakeRun, o: &FakeOptions) {
    let (prompt_len, _) = FAKE_PROMPT;
    let Some((slim, speed, extra)) = fake_policies(port, run, o) else {
        return;
    };
    port.send(Event::GenerationStarted {
        full_policy: Box::new(Policy::full(o.layers)),
        speed_policy: Box::new(speed),
        extra_policy: extra.map(Box::new),
        prompt_len,
    });
    if let Some(v) = &slim {
        let mut decided = v.clone();
        decided.trace.steps.clear();
        port.send(Event::SlimDecided(Box::new(decided)));
    }
    let mut last = LiveStep::default();
    for k in 0..run.max_new_tokens {
        if port.is_cancelled(run.job) {
            port.send(Event::Cancelled);
            return;
        }
        std::thread::sleep(o.step_delay);
        last = fake_step(k, run, o, (&speed, slim.as_ref()));
        port.send(Event::GenerationStep(Box::new(last.clone())));
    }
    port.send(Event::GenerationDone {
        full_metrics: last.full_metrics,
        speed_metrics: last.speed_metrics,
        extra_metrics: last.extra_metrics,
        slim: slim.map(|v| Box::new(v.trace)),
    });
}

/// Step `k` of the fake run: made-up tokens (SPEED disagreeing every fifth
/// step, the extra policy every seventh) and each policy's figures.
fn fake_step(
    k: usize,
    run: &FakeRun,
    o: &FakeOptions,
    (speed, slim): (&Policy, Option<&SlimRunView>),
) -> LiveStep {
    let (prompt_len, decode_start) = FAKE_PROMPT;
    let p = prompt_len as u64;
    let agree = k % 5 != 3;
    let tok = |id: usize| {
        Some(LiveToken {
            id: id as u32,
            text: format!(" w{id}"),
        })
    };
    let slim_step = slim.and_then(|v| v.trace.steps.get(k).cloned());
    let (held, resident) = slim_step.as_ref().map_or((0, 0), |s| {
        let d = o.layers * (prompt_len - decode_start + k + 1);
        (
            s.held_token_layers.saturating_sub(d) as u64,
            s.resident_token_layers.saturating_sub(d) as u64,
        )
    });
    let full_layers = o.layers as u64 * p;
    let speed_layers = speed.l_cut() as u64 * p;
    LiveStep {
        index: k,
        full: tok(k),
        speed: tok(if agree { k } else { 1000 + k }),
        extra: run
            .extra
            .as_ref()
            .and(tok(if k % 7 != 5 { k } else { 2000 + k })),
        agree,
        extra_agree: run.extra.is_some() && k % 7 != 5,
        kl: (k < 3).then_some(0.01 * k as f32),
        full_metrics: fake_metrics(k, o, full_layers, full_layers),
        speed_metrics: fake_metrics(k, o, speed_layers, speed_layers),
        extra_metrics: match &run.extra {
            Some(_) if slim.is_some() => fake_metrics(k, o, held, resident),
            Some(_) => fake_metrics(k, o, speed_layers, speed_layers),
            None => LiveMetrics::default(),
        },
        slim_steps: slim_step.into_iter().collect(),
    }
}

/// Serves commands until `Shutdown` or until the UI's end is gone.
pub fn serve(port: WorkerPort, o: FakeOptions) {
    while let Some(cmd) = port.recv() {
        match cmd {
            Command::OpenModel(path) => {
                let p = path.display().to_string();
                if p.trim().is_empty() {
                    port.send(Event::ModelFailed(JobError::new(
                        FailureKind::LoadModel,
                        "no model folder or .gguf file given",
                    )));
                } else {
                    port.send(Event::ModelOpened(fake_model(&p, &o)));
                }
            }
            Command::OpenReport { path, .. } => serve_open_report(&port, &path),
            Command::RunDiagnose {
                job,
                prompts,
                sweep_context_len,
                ..
            } => diagnose(&port, job, &prompts, sweep_context_len.is_some(), &o),
            Command::RunGenerate(LiveRequest {
                job,
                policy,
                max_new_tokens,
                extra,
                ..
            }) => {
                let run = FakeRun {
                    job,
                    policy,
                    max_new_tokens,
                    extra,
                };
                generate(&port, &run, &o);
            }
            Command::Export {
                report,
                format,
                dir,
                ..
            } => serve_export(&port, &report, format, &dir),
            Command::Cancel(_) => {}
            Command::Shutdown => break,
        }
    }
}

/// Starts the fake worker on its own thread.
pub fn spawn(port: WorkerPort, o: FakeOptions) -> JoinHandle<()> {
    std::thread::spawn(move || serve(port, o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::channel;

    /// Events until `done` says the last one ends the exchange (or the
    /// worker is gone).
    fn events_until(backend: &mut crate::Backend, done: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut out = Vec::new();
        for _ in 0..500 {
            let got = backend.poll();
            let end = got.iter().any(&done);
            out.extend(got);
            if end {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        out
    }

    #[test]
    fn failures_come_back_typed() {
        let (mut backend, port) = channel(None);
        let worker = spawn(port, FakeOptions::default());
        backend.send(Command::OpenModel(std::path::PathBuf::from(" ")));
        let events = events_until(&mut backend, |e| matches!(e, Event::ModelFailed(_)));
        let failed = events.iter().find_map(|e| match e {
            Event::ModelFailed(e) => Some(e.clone()),
            _ => None,
        });
        assert_eq!(
            failed,
            Some(JobError::new(
                FailureKind::LoadModel,
                "no model folder or .gguf file given"
            ))
        );
        backend.send(Command::Shutdown);
        assert!(worker.join().is_ok());
    }
}
