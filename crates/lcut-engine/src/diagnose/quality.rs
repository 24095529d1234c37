//! How a policy's teacher-forced logits are scored against the full
//! model's on its own continuation: top-1 agreement, KL(full || policy) and
//! the NLL of the continuation, summed over its tokens. The sweep's cutoffs
//! and its comparison axis both add these up.

use candle_core::{DType, Tensor};

use crate::error::{EngineError, Result};

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

/// Agreement, KL(ref || other) and NLL of `targets` under `other`, logits
/// `[rows, vocab]` (row `i` of `other` predicting `targets[i]`), scored row
/// by row on the host ([`score_row`]).
pub(crate) fn score(reference: &Tensor, other: &Tensor, targets: &[u32]) -> Result<Totals> {
    let reference = host_rows(reference)?;
    let other = host_rows(other)?;
    if reference.len() != targets.len() || other.len() != targets.len() {
        return Err(EngineError::ForcedRows {
            scored: other.len(),
            continuation: targets.len(),
        });
    }
    let mut totals = Totals::default();
    let mut scratch = RowScratch::default();
    for ((p, q), &target) in reference.iter().zip(&other).zip(targets) {
        let row = score_row(p, q, target as usize, &mut scratch)?;
        totals.add(Totals {
            agree: f64::from(u8::from(row.top == target as usize)),
            kl: row.kl,
            nll: -row.log_prob,
            tokens: 1,
        });
    }
    Ok(totals)
}

/// Logits `[rows, vocab]` (or `[vocab]`, one row) as f32 rows on the host.
fn host_rows(x: &Tensor) -> Result<Vec<Vec<f32>>> {
    let x = x.to_dtype(DType::F32)?;
    Ok(match x.rank() {
        1 => vec![x.to_vec1()?],
        _ => x.flatten_to(x.rank() - 2)?.to_vec2()?,
    })
}

/// One row of a policy's logits against the full model's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RowScore {
    /// KL(full || policy) of the two softmax distributions, nats (at least 0).
    pub kl: f64,
    /// The policy's log-probability of the target token.
    pub log_prob: f64,
    /// The policy's top-1 token: the first index of its largest logit, as
    /// the model's greedy step chooses it.
    pub top: usize,
}

/// Buffers [`score_row`] reuses from row to row.
#[derive(Debug, Default)]
pub(crate) struct RowScratch {
    p: Vec<f32>,
    q: Vec<f32>,
}

/// A row's first maximum and its index (NaN never wins), and
/// `log(sum e^(x - max))` in f64, leaving `e^(x - max)` in `exp`.
fn softmax_parts(x: &[f32], exp: &mut Vec<f32>) -> (f32, usize, f64) {
    let (mut top, mut max) = (0, x[0]);
    for (i, &v) in x.iter().enumerate() {
        if max < v {
            (top, max) = (i, v);
        }
    }
    exp.clear();
    exp.extend_from_slice(x);
    lcut_kernels::attention::exp_sum(lcut_kernels::Isa::detect(), exp, max);
    let sum: f64 = exp.iter().map(|&e| f64::from(e)).sum();
    (max, top, sum.ln())
}

/// Scores `other`, a policy's logits over the vocabulary, against
/// `reference`, the full model's, for the token `target`: one pass each
/// for the two log-sum-exps (the vectorized `exp` of the attention
/// kernels) and one for the KL, `KL = E_p[r - o] - lse(r) + lse(o)`, summed
/// in f64. Refused where the rows' widths differ, are empty, or `target`
/// is past them.
pub(crate) fn score_row(
    reference: &[f32],
    other: &[f32],
    target: usize,
    scratch: &mut RowScratch,
) -> Result<RowScore> {
    if reference.len() != other.len() || target >= other.len() {
        return Err(EngineError::OutOfRange {
            what: format!(
                "token {target} of a {}-logit row scored against a {}-logit row",
                other.len(),
                reference.len()
            ),
            limit: "both rows must have the vocabulary's width".into(),
        });
    }
    let (max_p, _, log_sum_p) = softmax_parts(reference, &mut scratch.p);
    let (max_q, top, log_sum_q) = softmax_parts(other, &mut scratch.q);
    let lse_p = f64::from(max_p) + log_sum_p;
    let lse_q = f64::from(max_q) + log_sum_q;
    let mut mass = 0f64;
    let mut gap = 0f64;
    for ((&e, &r), &o) in scratch.p.iter().zip(reference).zip(other) {
        // a token the reference gives no probability adds nothing: its
        // logit may be -inf in both rows (the vectorized `exp` may leave a
        // denormal for it, not 0)
        if e > 0.0 && r > f32::NEG_INFINITY {
            mass += f64::from(e);
            gap += f64::from(e) * (f64::from(r) - f64::from(o));
        }
    }
    let kl = gap / mass - lse_p + lse_q;
    Ok(RowScore {
        kl: kl.max(0.0),
        log_prob: f64::from(other[target]) - lse_q,
        top,
    })
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// The definition, term by term in f64: sum p (log p - log q).
    fn by_definition(r: &[f32], o: &[f32], target: usize) -> (f64, f64) {
        let lse = |x: &[f32]| {
            let m = x
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            m + x
                .iter()
                .map(|&v| (f64::from(v) - m).exp())
                .sum::<f64>()
                .ln()
        };
        let (lp, lq) = (lse(r), lse(o));
        let kl = r
            .iter()
            .zip(o)
            .map(|(&a, &b)| {
                let log_p = f64::from(a) - lp;
                log_p.exp() * (log_p - (f64::from(b) - lq))
            })
            .sum();
        (kl, f64::from(o[target]) - lq)
    }

    /// Rows of a vocabulary's width (the vectorized `exp`'s lanes and its
    /// tail both used), near and far apart, with ties for the top and a
    /// token the reference rules out: the KL and log-probability equal the
    /// definition's to rounding, the top is the first largest logit.
    #[test]
    fn a_row_scores_as_the_definition_does() {
        let width = 1003;
        let logits = |seed: f32, scale: f32| -> Vec<f32> {
            (0..width)
                .map(|i| ((i as f32 * seed).sin() * scale).round() / 4.0)
                .collect()
        };
        let mut scratch = RowScratch::default();
        for (r, o) in [
            (logits(0.7, 30.0), logits(0.7, 30.0)),
            (logits(0.7, 30.0), logits(0.71, 30.0)),
            (logits(0.7, 30.0), logits(1.3, 50.0)),
        ] {
            for target in [0, 17, width - 1] {
                let got = score_row(&r, &o, target, &mut scratch).unwrap();
                let (kl, log_prob) = by_definition(&r, &o, target);
                assert!(
                    (got.kl - kl.max(0.0)).abs() <= 1e-6 * (1.0 + kl),
                    "{got:?} {kl}"
                );
                assert!((got.log_prob - log_prob).abs() <= 1e-6 * (1.0 + log_prob.abs()));
                let max = o.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(got.top, o.iter().position(|&v| v == max).unwrap());
            }
        }
        // a token the reference rules out adds nothing; the same row scores 0
        let mut r = logits(0.7, 30.0);
        r[5] = f32::NEG_INFINITY;
        let mut o = r.clone();
        let same = score_row(&r, &o, 3, &mut scratch).unwrap();
        assert_eq!(same.kl, 0.0);
        o[5] = 2.0;
        assert!(score_row(&r, &o, 3, &mut scratch).unwrap().kl > 0.0);
        // rows of other widths, or a target past them: refused
        assert!(score_row(&r, &o[1..], 3, &mut scratch).is_err());
        assert!(score_row(&r, &o, width, &mut scratch).is_err());
    }

    /// The tensor entry scores each row and sums, as candle's log-softmax
    /// did, and refuses a row count other than the targets'.
    #[test]
    fn rows_of_a_tensor_sum_their_scores() {
        let dev = Device::Cpu;
        let values = |seed: f32| -> Vec<f32> {
            (0..3 * 40).map(|i| (i as f32 * seed).cos() * 5.0).collect()
        };
        let (r, o) = (values(0.3), values(0.9));
        let reference = Tensor::from_vec(r.clone(), (3, 40), &dev).unwrap();
        let other = Tensor::from_vec(o.clone(), (3, 40), &dev).unwrap();
        let targets = [1u32, 39, 7];
        let got = score(&reference, &other, &targets).unwrap();
        let mut kl = 0.0;
        let mut nll = 0.0;
        for (i, &t) in targets.iter().enumerate() {
            let (k, lp) = by_definition(&r[i * 40..][..40], &o[i * 40..][..40], t as usize);
            kl += k;
            nll -= lp;
        }
        assert_eq!(got.tokens, 3);
        assert!((got.kl - kl).abs() < 1e-6 * (1.0 + kl) && (got.nll - nll).abs() < 1e-6 * nll);
        assert!(score(&reference, &other, &targets[..2]).is_err());
    }
}
