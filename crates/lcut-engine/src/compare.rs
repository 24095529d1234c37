//! Several policies on the same prompt, stepped in lockstep: each one's
//! tokens and timing (its own steps only, so the others' work does not count
//! against it), agreement with the first policy and the KL divergence of the
//! next-token distributions, with progress through the prompts and a cancel.

use candle_core::{DType, Tensor};
use lcut_model::Decoder;
use lcut_policy::Policy;
use serde::{Deserialize, Serialize};

use crate::diagnose::{RowScratch, score_row};
use crate::error::Result;
use crate::generate::{Generation, GenerationConfig, GenerationOutput, PrefillProgress};
use crate::prompt::PreparedPrompt;

/// One step of a lockstep run; every list has one entry per policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareStep {
    /// Output index.
    pub index: usize,
    /// Each policy's token, while it is still running.
    pub tokens: Vec<Option<u32>>,
    /// Each policy produced the reference's (the first policy's) token at
    /// this step (true for the reference itself while it runs).
    pub agree: Vec<bool>,
    /// KL(reference || policy) of the next-token distributions, nats; only
    /// while the policy's continuation is still the reference's (same
    /// conditioning); `None` for the reference itself.
    pub kl: Vec<Option<f32>>,
}

/// A finished (or cancelled) lockstep run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Each policy's generation, in the order asked for.
    pub outputs: Vec<GenerationOutput>,
    /// Per-step tokens, agreement and KL.
    pub steps: Vec<CompareStep>,
}

impl Comparison {
    /// True when the caller cancelled the run.
    pub fn cancelled(&self) -> bool {
        self.outputs
            .iter()
            .any(|o| o.stop == crate::generate::StopReason::Cancelled)
    }
}

/// What a lockstep run tells its caller as it goes; the caller's answer
/// (false) cancels the run.
pub enum LockstepEvent<'a, 'm> {
    /// Policy `lane` is about to run its prompt (`done` 0) or has run
    /// another chunk of it.
    Prefill {
        /// Index of the policy.
        lane: usize,
        /// Prompt tokens done and in all.
        progress: PrefillProgress,
    },
    /// Every policy has run its prompt; nothing is produced yet (a
    /// SlimInfer policy has decided its cuts).
    Prefilled {
        /// Each policy's generation.
        lanes: &'a [Generation<'m>],
    },
    /// One step of every policy still running.
    Step {
        /// The step.
        step: &'a CompareStep,
        /// Each policy's generation after it.
        lanes: &'a [Generation<'m>],
    },
}

/// KL(p || q) between the softmax distributions of two logit vectors.
pub fn kl_divergence(p_logits: &Tensor, q_logits: &Tensor) -> Result<f32> {
    let p: Vec<f32> = p_logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let q: Vec<f32> = q_logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let row = score_row(&p, &q, 0, &mut RowScratch::default())?;
    Ok(row.kl as f32)
}

/// Several generations of one prompt run in lockstep, the first one the
/// reference of the agreement and the KL. [`compare`] runs one to the end;
/// a caller that wants each generation's state after the run (the viewer's
/// final figures) drives one itself.
pub struct Lockstep<'m> {
    lanes: Vec<Generation<'m>>,
    /// Per policy: its tokens so far equal the reference's.
    same_prefix: Vec<bool>,
    steps: Vec<CompareStep>,
}

impl<'m> Lockstep<'m> {
    /// Prepare `prompt` under every policy of `policies` (the first is the
    /// reference), each with `config`.
    pub fn new(
        model: &'m Decoder,
        prompt: &PreparedPrompt,
        policies: &[Policy],
        config: &GenerationConfig,
    ) -> Result<Self> {
        let models = vec![model; policies.len()];
        Self::with_models(&models, prompt, policies, config)
    }

    /// [`Lockstep::new`] with each policy on its own model (`models[i]`
    /// runs `policies[i]`): an adapted model beside the base model it was
    /// made from, say. The models must share a tokenizer's vocabulary.
    pub fn with_models(
        models: &[&'m Decoder],
        prompt: &PreparedPrompt,
        policies: &[Policy],
        config: &GenerationConfig,
    ) -> Result<Self> {
        let lanes = models
            .iter()
            .zip(policies)
            .map(|(model, p)| Generation::new(model, prompt.clone(), *p, config.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            same_prefix: vec![true; lanes.len()],
            lanes,
            steps: Vec::new(),
        })
    }

    /// Each policy's generation.
    pub fn lanes(&self) -> &[Generation<'m>] {
        &self.lanes
    }

    /// Run every prompt chunk by chunk (so that a cancel takes within a
    /// long prompt; the time counts toward each policy's first token), then
    /// step every policy until all have ended. `on_event` hears of every
    /// chunk and step and returns false to cancel; returns false when
    /// cancelled.
    pub fn drive(
        &mut self,
        mut on_event: impl FnMut(LockstepEvent<'_, 'm>) -> bool,
    ) -> Result<bool> {
        let finished = self.prefill(&mut on_event)?
            && on_event(LockstepEvent::Prefilled { lanes: &self.lanes })
            && self.step_all(&mut on_event)?;
        if !finished {
            self.lanes.iter_mut().for_each(Generation::cancel);
        }
        Ok(finished)
    }

    fn prefill(
        &mut self,
        on_event: &mut impl FnMut(LockstepEvent<'_, 'm>) -> bool,
    ) -> Result<bool> {
        for (lane, generation) in self.lanes.iter_mut().enumerate() {
            let total = generation.prompt().len();
            let start = PrefillProgress { done: 0, total };
            if !on_event(LockstepEvent::Prefill {
                lane,
                progress: start,
            }) || !generation.prefill_with(None, |progress| {
                on_event(LockstepEvent::Prefill { lane, progress })
            })? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn step_all(
        &mut self,
        on_event: &mut impl FnMut(LockstepEvent<'_, 'm>) -> bool,
    ) -> Result<bool> {
        while self.step()? {
            let step = self.steps.last().expect("a step was just taken");
            if !on_event(LockstepEvent::Step {
                step,
                lanes: &self.lanes,
            }) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One step of every policy still running; false once all have ended.
    fn step(&mut self) -> Result<bool> {
        let produced = self
            .lanes
            .iter_mut()
            .map(|g| g.step(None))
            .collect::<Result<Vec<_>>>()?;
        if produced.iter().all(Option::is_none) {
            return Ok(false);
        }
        let reference = produced[0].as_ref();
        let mut agree = Vec::with_capacity(produced.len());
        let mut kl = Vec::with_capacity(produced.len());
        for (k, other) in produced.iter().enumerate() {
            let same = matches!((reference, other), (Some(x), Some(y)) if x.token == y.token);
            kl.push(match (reference, other) {
                (Some(x), Some(y)) if k > 0 && self.same_prefix[k] => {
                    Some(kl_divergence(&x.logits, &y.logits)?)
                }
                _ => None,
            });
            self.same_prefix[k] &= same;
            agree.push(same);
        }
        self.steps.push(CompareStep {
            index: self.steps.len(),
            tokens: produced
                .iter()
                .map(|s| s.as_ref().map(|s| s.token))
                .collect(),
            agree,
            kl,
        });
        Ok(true)
    }

    /// Each policy's output and the steps.
    pub fn finish(self) -> Comparison {
        Comparison {
            outputs: self.lanes.iter().map(Generation::output).collect(),
            steps: self.steps,
        }
    }
}

/// Run `prompt` under every policy of `policies` in lockstep (the first is
/// the reference); `on_event` hears of every prompt chunk and step and
/// returns false to cancel (the outputs so far then end as cancelled).
pub fn compare<'m>(
    model: &'m Decoder,
    prompt: &PreparedPrompt,
    policies: &[Policy],
    config: &GenerationConfig,
    on_event: impl FnMut(LockstepEvent<'_, 'm>) -> bool,
) -> Result<Comparison> {
    let models = vec![model; policies.len()];
    compare_models(&models, prompt, policies, config, on_event)
}

/// [`compare`] with each policy on its own model (see
/// [`Lockstep::with_models`]).
pub fn compare_models<'m>(
    models: &[&'m Decoder],
    prompt: &PreparedPrompt,
    policies: &[Policy],
    config: &GenerationConfig,
    on_event: impl FnMut(LockstepEvent<'_, 'm>) -> bool,
) -> Result<Comparison> {
    let mut run = Lockstep::with_models(models, prompt, policies, config)?;
    run.drive(on_event)?;
    Ok(run.finish())
}
