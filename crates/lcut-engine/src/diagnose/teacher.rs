//! One policy teacher-forced on one prompt and the full model's
//! continuation, scored as the sweep's axis scores it ([`add_scored`]),
//! for callers outside the sweep (`lcut eval` on a suite, which runs the
//! forced rows itself beside the other generations of an item and scores
//! each row as it comes, [`ForcedScore`], rather than keeping them: a row
//! is the vocabulary's width, 1 MiB on Gemma 3).

use candle_core::Tensor;
use lcut_model::probes::PromptMassProbe;
use lcut_model::{Decoder, Sequence};

use super::policy_axis::{AxisTotals, add_scored};
use super::quality::{Totals, score};
use crate::error::Result;
use crate::prompt::PreparedPrompt;

/// The running score of a teacher-forced run's rows against the full
/// model's, one row at a time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ForcedScore(Totals);

impl ForcedScore {
    /// Score one row: `row`, the policy's logits `[V]` (or `[1, V]`) that
    /// predict `target`, against `reference`, the full model's row that
    /// chose it.
    pub fn add_row(&mut self, reference: &Tensor, row: &Tensor, target: u32) -> Result<()> {
        self.0.add(score(reference, row, &[target])?);
        Ok(())
    }

    /// Rows scored.
    pub fn rows(&self) -> usize {
        self.0.tokens
    }
}

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

/// The quality of the run in `seq`, teacher-forced on the full model's
/// continuation from `prompt`, whose rows `scored` holds, and the K/V it
/// held (nothing counted where no row was scored).
pub(crate) fn forced_quality(
    model: &Decoder,
    seq: &Sequence,
    prompt: &PreparedPrompt,
    scored: ForcedScore,
) -> ForcedQuality {
    // attention recall is not reported here: an empty probe serves
    let mass = PromptMassProbe::new(model.config().num_layers, prompt.decode_start);
    let mut t = AxisTotals::default();
    if scored.rows() > 0 {
        add_scored(model, seq, prompt, (scored.0, &mass), &mut t);
    }
    ForcedQuality {
        tokens: t.quality.tokens,
        agree: t.quality.agree.round() as usize,
        kl: t.quality.kl,
        kv_held: t.held.round() as u64,
        kv_full: t.full.round() as u64,
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn rows_scored_one_at_a_time_sum_to_the_whole_continuation_s_score() {
        let dev = Device::Cpu;
        let values = |seed: f32| -> Vec<f32> {
            (0..5 * 7)
                .map(|i| ((i as f32 * seed).sin() * 3.0).round())
                .collect()
        };
        let reference = Tensor::from_vec(values(0.7), (5, 7), &dev).unwrap();
        let other = Tensor::from_vec(values(1.3), (5, 7), &dev).unwrap();
        let targets = [3u32, 0, 6, 6, 1];
        let whole = score(&reference, &other, &targets).unwrap();
        let mut rows = ForcedScore::default();
        for (i, &t) in targets.iter().enumerate() {
            let r = reference.get(i).unwrap();
            // the rank the model's steps give ([V]) and a kept row ([1, V])
            let o = other.narrow(0, i, 1).unwrap();
            rows.add_row(&r, &o, t).unwrap();
        }
        let one = rows.0;
        assert_eq!((one.tokens, one.agree), (whole.tokens, whole.agree));
        assert!(whole.kl > 0.0 && (one.kl - whole.kl).abs() < 1e-4 * whole.kl);
        assert!((one.nll - whole.nll).abs() < 1e-4 * whole.nll.abs());
    }
}
