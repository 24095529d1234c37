//! One policy teacher-forced on one prompt and the full model's
//! continuation, through the sweep's axis measurement ([`measure`]), for
//! callers outside the sweep (`lcut eval` on a suite).

use candle_core::Tensor;
use lcut_model::Decoder;
use lcut_model::probes::PromptMassProbe;
use lcut_policy::Policy;

use super::policy_axis::{AxisTotals, measure};
use crate::error::Result;
use crate::prompt::PreparedPrompt;

/// Quality and K/V of a policy on one continuation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct ForcedQuality {
    /// Continuation tokens scored.
    pub tokens: usize,
    /// Tokens whose top-1 under the policy is the full model's token.
    pub agree: usize,
    /// Sum over tokens of KL(full || policy), nats.
    pub kl: f64,
    /// K/V bytes the policy's caches hold at the end.
    pub kv_held: u64,
    /// K/V bytes the full model holds for the same tokens.
    pub kv_full: u64,
}

/// Run `prompt` under `policy` teacher-forced on `continuation` and score
/// it against `reference`, the full model's rows that chose it.
pub(crate) fn forced_quality(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: Policy,
    continuation: &[u32],
    reference: &Tensor,
    chunk: usize,
) -> Result<ForcedQuality> {
    // attention recall is not reported here: an empty probe serves
    let mass = PromptMassProbe::new(model.config().num_layers, prompt.decode_start);
    let mut t = AxisTotals::default();
    measure(
        model,
        prompt,
        policy,
        continuation,
        (reference, &mass),
        chunk,
        &mut t,
    )?;
    Ok(ForcedQuality {
        tokens: t.quality.tokens,
        agree: t.quality.agree.round() as usize,
        kl: t.quality.kl,
        kv_held: t.held.round() as u64,
        kv_full: t.full.round() as u64,
    })
}
