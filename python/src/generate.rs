//! `Session.generate`: greedy generation under a policy with its timing
//! and K/V bytes, optionally in lockstep with another policy (the engine's
//! `Lockstep`) for per-step agreement.

use lcut_engine::{Comparison, GenerationOutput, LockstepEvent, StopReason, compare};
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::arrays::f32_array;
use crate::errors::{detached, engine_err};
use crate::inputs::{PromptArg, budget, policy, prepare};
use crate::progress::Progress;

/// A finished greedy generation.
///
/// With ``compare``, ``compare`` is the other policy's generation of the
/// same prompt, run in lockstep, and ``agreement[k]`` says whether this
/// generation's token at step ``k`` is the other's (``kl[k]`` the KL
/// divergence from the other's next-token distribution to this one's,
/// nats, while both continuations are still the same; NaN after).
#[pyclass(module = "lcut", name = "Generation", frozen)]
pub struct Generation {
    /// The generated text, stop token left out.
    #[pyo3(get)]
    pub text: String,
    /// The generated token ids (a final stop token included).
    #[pyo3(get)]
    pub ids: Vec<u32>,
    /// The prompt's token ids.
    #[pyo3(get)]
    pub prompt_ids: Vec<u32>,
    /// The policy, resolved against the model's depth.
    #[pyo3(get)]
    pub policy: String,
    /// Why it ended: ``stop_token``, ``max_tokens`` or ``cancelled``.
    #[pyo3(get)]
    pub stop: String,
    /// Time to first token (prefill and first sampling), seconds.
    #[pyo3(get)]
    pub ttft_s: f64,
    /// Mean time per output token after the first, seconds.
    #[pyo3(get)]
    pub tpot_s: f64,
    /// Total time, seconds.
    #[pyo3(get)]
    pub total_s: f64,
    /// K/V cache bytes held at the end.
    #[pyo3(get)]
    pub kv_bytes: u64,
    /// K/V bytes the full model would hold for the same tokens.
    #[pyo3(get)]
    pub kv_bytes_full: u64,
    /// The other policy's generation (with ``compare``), else None.
    #[pyo3(get)]
    pub compare: Option<Py<Generation>>,
    /// bool [steps]: this generation's token equals the other's (with ``compare``).
    #[pyo3(get)]
    pub agreement: Option<Py<PyAny>>,
    /// float32 [steps]: KL(other || this) of the next-token distributions,
    /// NaN once the continuations differ (with ``compare``).
    #[pyo3(get)]
    pub kl: Option<Py<PyAny>>,
}

#[pymethods]
impl Generation {
    /// Share of steps where the tokens agree (with ``compare``), else None.
    #[getter]
    fn agreement_rate(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        match &self.agreement {
            Some(a) => Ok(Some(a.bind(py).call_method0("mean")?.extract()?)),
            None => Ok(None),
        }
    }

    /// K/V bytes held over the full model's.
    #[getter]
    fn kv_ratio(&self) -> f64 {
        if self.kv_bytes_full == 0 {
            0.0
        } else {
            self.kv_bytes as f64 / self.kv_bytes_full as f64
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Generation(policy={:?}, tokens={}, ttft_s={:.4}, tpot_s={:.4}, kv_bytes={}, text={:?})",
            self.policy,
            self.ids.len(),
            self.ttft_s,
            self.tpot_s,
            self.kv_bytes,
            self.text
        )
    }
}

/// What `Session.generate` was asked for.
pub struct GenerateArgs {
    /// The prompt.
    pub prompt: PromptArg,
    /// The policy string.
    pub policy: String,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// The policy to run beside it, when any.
    pub compare: Option<String>,
    /// Through the chat template.
    pub chat: bool,
    /// A system message.
    pub system: Option<String>,
    /// Show a progress bar.
    pub progress: bool,
}

fn stop_name(stop: StopReason) -> &'static str {
    match stop {
        StopReason::StopToken => "stop_token",
        StopReason::MaxTokens => "max_tokens",
        StopReason::Cancelled => "cancelled",
    }
}

fn generation_of(
    session: &lcut_engine::Session,
    out: &GenerationOutput,
    prompt: &[u32],
) -> Generation {
    Generation {
        text: session.generated_text(&out.tokens),
        ids: out.tokens.clone(),
        prompt_ids: prompt.to_vec(),
        policy: out.policy.clone(),
        stop: stop_name(out.stop).into(),
        ttft_s: out.timing.ttft_s,
        tpot_s: out.timing.tpot_s,
        total_s: out.timing.total_s,
        kv_bytes: out.kv_bytes_held,
        kv_bytes_full: out.kv_bytes_full,
        compare: None,
        agreement: None,
        kl: None,
    }
}

/// Generate `args.prompt` on `session`.
pub fn run(
    py: Python<'_>,
    session: &lcut_engine::Session,
    args: GenerateArgs,
) -> PyResult<Generation> {
    let layers = session.model.config().num_layers;
    let prompt = prepare(session, &args.prompt, args.chat, args.system.as_deref())?;
    let (_, main) = policy(&args.policy, layers)?;
    // the reference of the lockstep run comes first
    let mut policies = Vec::new();
    if let Some(other) = &args.compare {
        policies.push(policy(other, layers)?.1);
    }
    policies.push(main);
    let config = session.greedy_config(budget(args.max_new_tokens)?);
    let mut bar = Progress::new(py, args.progress, args.max_new_tokens, "generate", "tok");
    let result = detached(py, || {
        compare(
            &session.model,
            &prompt,
            &policies,
            &config,
            |event| match event {
                LockstepEvent::Prefill { progress, .. } => bar.tick(
                    0,
                    Some(&format!("prefill {}/{}", progress.done, progress.total)),
                ),
                LockstepEvent::Prefilled { .. } => bar.tick(0, None),
                LockstepEvent::Step { step, .. } => bar.tick(step.index + 1, None),
            },
        )
        .map_err(engine_err)
    });
    let run: Comparison = bar.finish(py, result)?;
    let last = run.outputs.len() - 1;
    let mut main = generation_of(session, &run.outputs[last], &prompt.ids);
    if last > 0 {
        let agree: Vec<bool> = run.steps.iter().map(|s| s.agree[last]).collect();
        let kl: Vec<f32> = run
            .steps
            .iter()
            .map(|s| s.kl[last].unwrap_or(f32::NAN))
            .collect();
        let n = kl.len();
        main.agreement = Some(PyArray1::from_vec(py, agree).into_any().unbind());
        main.kl = Some(f32_array(py, kl, &[n])?);
        let other = generation_of(session, &run.outputs[0], &prompt.ids);
        main.compare = Some(Py::new(py, other)?);
    }
    Ok(main)
}
