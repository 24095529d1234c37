//! How a policy's teacher-forced logits are scored against the full
//! model's on its own continuation: top-1 agreement, KL(full || policy) and
//! the NLL of the continuation, summed over its tokens. The sweep's cutoffs
//! and its comparison axis both add these up.

use candle_core::{D, Tensor};

use crate::compare::log_softmax_rows;
use crate::error::Result;

/// Sums of the quality metrics over continuation tokens.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Totals {
    pub agree: f64,
    pub kl: f64,
    pub nll: f64,
    pub tokens: usize,
}

impl Totals {
    /// Add `other`'s sums (rows scored apart, one at a time).
    pub fn add(&mut self, other: Totals) {
        self.agree += other.agree;
        self.kl += other.kl;
        self.nll += other.nll;
        self.tokens += other.tokens;
    }
}

/// Agreement, KL(ref || other) and NLL of `targets` under `other`.
pub(crate) fn score(reference: &Tensor, other: &Tensor, targets: &[u32]) -> Result<Totals> {
    let lp = log_softmax_rows(reference)?;
    let lq = log_softmax_rows(other)?;
    let kl: f32 = (lp.exp()? * (&lp - &lq)?)?.sum_all()?.to_scalar()?;
    let idx = Tensor::new(targets, other.device())?.unsqueeze(1)?;
    let nll: f32 = lq.gather(&idx, 1)?.sum_all()?.neg()?.to_scalar()?;
    let top: Vec<u32> = other.argmax(D::Minus1)?.to_vec1()?;
    let agree = top.iter().zip(targets).filter(|(a, b)| a == b).count();
    Ok(Totals {
        agree: agree as f64,
        kl: f64::from(kl.max(0.0)),
        nll: f64::from(nll),
        tokens: targets.len(),
    })
}
