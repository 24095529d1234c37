//! One policy teacher-forced on one prompt and the full model's
//! continuation, scored as the sweep's axis scores it ([`add_forced`]),
//! for callers outside the sweep (`lcut eval` on a suite, which runs the
//! forced rows itself beside the other generations of an item).

use candle_core::Tensor;
use lcut_model::probes::PromptMassProbe;
use lcut_model::{Decoder, Sequence};

use super::policy_axis::{AxisTotals, add_forced};
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

/// Score `logits`, the rows of the run in `seq` teacher-forced on
/// `continuation` from `prompt`, against `reference`, the full model's rows
/// that chose it.
pub(crate) fn forced_quality(
    model: &Decoder,
    seq: &Sequence,
    prompt: &PreparedPrompt,
    (logits, continuation): (&Tensor, &[u32]),
    reference: &Tensor,
) -> Result<ForcedQuality> {
    // attention recall is not reported here: an empty probe serves
    let mass = PromptMassProbe::new(model.config().num_layers, prompt.decode_start);
    let mut t = AxisTotals::default();
    if !continuation.is_empty() {
        add_forced(
            model,
            seq,
            prompt,
            (logits, continuation),
            (reference, &mass),
            &mut t,
        )?;
    }
    Ok(ForcedQuality {
        tokens: t.quality.tokens,
        agree: t.quality.agree.round() as usize,
        kl: t.quality.kl,
        kv_held: t.held.round() as u64,
        kv_full: t.full.round() as u64,
    })
}
