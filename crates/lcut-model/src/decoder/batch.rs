//! Decoding several sequences together: one new token for each, the
//! sequences that can take the fused step sharing each pass over the
//! weights (up to the kernels' batch of activation rows), so that an
//! evaluation that runs several generations side by side reads the weights
//! once per step instead of once per generation.

use candle_core::Tensor;
use lcut_kernels::quant::MAX_BATCH;

use super::{Decoder, LogitRows};
use crate::error::{ModelError, Result};
use crate::sequence::Sequence;

impl Decoder {
    /// One new token for each sequence (`tokens[i]` for `seqs[i]`): the
    /// logits [1, vocab] of each, as [`Decoder::forward`] with
    /// [`LogitRows::Last`] and no probe gives them one at a time. Sequences
    /// that can take the fused step run together, up to eight per pass
    /// (each product over all their rows at once; each reads its own cache
    /// under its own policy); the others run one at a time. A row's
    /// products are the same sums whichever rows share its pass, so the
    /// logits are those of one-at-a-time steps.
    pub fn forward_batch(&self, seqs: &mut [&mut Sequence], tokens: &[u32]) -> Result<Vec<Tensor>> {
        if seqs.len() != tokens.len() {
            return Err(ModelError::BatchMismatch {
                sequences: seqs.len(),
                tokens: tokens.len(),
            });
        }
        let count = seqs.len();
        let mut fused = Vec::new();
        let mut alone = Vec::new();
        for (i, (seq, &token)) in seqs.iter_mut().zip(tokens).enumerate() {
            self.check_next(seq, &[token])?;
            if self.takes_fused_step(seq)? {
                fused.push((i, &mut **seq, token));
            } else {
                alone.push((i, &mut **seq, token));
            }
        }
        let mut out: Vec<Option<Tensor>> = vec![None; count];
        if let Ok(model) = self.step_model()? {
            while fused.len() > 1 {
                let take = fused.len().min(MAX_BATCH);
                let group: Vec<_> = fused.drain(..take).collect();
                let (index, mut group_seqs, group_tokens) = unzip3(group);
                let logits = self.fused_batch(model, &mut group_seqs, &group_tokens)?;
                for seq in group_seqs.iter_mut() {
                    self.drop_unread(seq)?;
                }
                for (k, i) in index.into_iter().enumerate() {
                    out[i] = Some(logits.narrow(0, k, 1)?);
                }
            }
        }
        for (i, seq, token) in fused.into_iter().chain(alone) {
            let step = self.forward(seq, &[token], LogitRows::Last, None)?;
            out[i] = Some(step.logits.ok_or(ModelError::MissingLogits)?);
        }
        out.into_iter()
            .map(|l| l.ok_or(ModelError::MissingLogits))
            .collect()
    }
}

/// A group's indices, sequences and tokens.
type Group<'s> = (Vec<usize>, Vec<&'s mut Sequence>, Vec<u32>);

/// Indices, sequences and tokens of a group, as three lists.
fn unzip3(group: Vec<(usize, &mut Sequence, u32)>) -> Group<'_> {
    let mut index = Vec::with_capacity(group.len());
    let mut seqs = Vec::with_capacity(group.len());
    let mut tokens = Vec::with_capacity(group.len());
    for (i, s, t) in group {
        index.push(i);
        seqs.push(s);
        tokens.push(t);
    }
    (index, seqs, tokens)
}
