//! The same prompt under two policies, side by side, step by step: tokens,
//! agreement and KL divergence of the next-token distributions.

use candle_core::Tensor;
use lcut_model::Decoder;
use lcut_policy::Policy;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::generate::{Generation, GenerationConfig, GenerationOutput};
use crate::prompt::PreparedPrompt;

/// One step of a side-by-side run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareStep {
    /// Output index.
    pub index: usize,
    /// Token of the reference policy (usually full), if it is still running.
    pub reference: Option<u32>,
    /// Token of the other policy, if it is still running.
    pub other: Option<u32>,
    /// Both produced the same token at this step.
    pub agree: bool,
    /// KL(reference || other) of the next-token distributions, nats; only
    /// while both continuations are still identical (same conditioning).
    pub kl: Option<f32>,
}

/// A finished side-by-side run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The reference policy's generation.
    pub reference: GenerationOutput,
    /// The other policy's generation.
    pub other: GenerationOutput,
    /// Per-step agreement.
    pub steps: Vec<CompareStep>,
}

/// KL(p || q) between the softmax distributions of two logit vectors.
pub fn kl_divergence(p_logits: &Tensor, q_logits: &Tensor) -> Result<f32> {
    let lp = log_softmax_rows(&p_logits.flatten_all()?.unsqueeze(0)?)?;
    let lq = log_softmax_rows(&q_logits.flatten_all()?.unsqueeze(0)?)?;
    let p = lp.exp()?;
    Ok((p * (lp - lq)?)?.sum_all()?.to_scalar::<f32>()?.max(0.0))
}

/// Row-wise log-softmax of logits [rows, vocab], in f32.
pub(crate) fn log_softmax_rows(x: &Tensor) -> Result<Tensor> {
    let x = x.to_dtype(candle_core::DType::F32)?;
    let max = x.max_keepdim(1)?;
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// Run `prompt` under `reference` and `other` in lockstep. `on_step` gets
/// each step as it is produced and returns false to cancel.
pub fn compare(
    model: &Decoder,
    prompt: &PreparedPrompt,
    reference: Policy,
    other: Policy,
    config: &GenerationConfig,
    mut on_step: impl FnMut(&CompareStep) -> bool,
) -> Result<Comparison> {
    let mut a = Generation::new(model, prompt.clone(), reference, config.clone())?;
    let mut b = Generation::new(model, prompt.clone(), other, config.clone())?;
    let mut steps = Vec::new();
    let mut same_prefix = true;
    loop {
        let sa = a.step(None)?;
        let sb = b.step(None)?;
        if sa.is_none() && sb.is_none() {
            break;
        }
        let kl = match (&sa, &sb) {
            (Some(x), Some(y)) if same_prefix => Some(kl_divergence(&x.logits, &y.logits)?),
            _ => None,
        };
        let step = CompareStep {
            index: steps.len(),
            reference: sa.as_ref().map(|s| s.token),
            other: sb.as_ref().map(|s| s.token),
            agree: matches!((&sa, &sb), (Some(x), Some(y)) if x.token == y.token),
            kl,
        };
        same_prefix &= step.agree;
        let go_on = on_step(&step);
        steps.push(step);
        if !go_on {
            break;
        }
    }
    Ok(Comparison {
        reference: a.output(),
        other: b.output(),
        steps,
    })
}
