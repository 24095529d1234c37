//! The logit lens's statistics of one row of logits against the final
//! distribution of its position, in one pass over the vocabulary with f64
//! sums: the target's log-probability and rank, the row's top token and
//! KL(final ‖ row).
//!
//! With `lse` the log-sum-exp of a row `z` and `p_f` the final
//! distribution, `KL = Σ p_f log p_f − Σ p_f z + lse`: the first term is
//! the final row's own (computed once per position), so each row needs its
//! maximum, `Σ exp(z − max)`, `Σ p_f z`, the count above the target and
//! its argmax, and nothing of size vocabulary is kept.

/// The final distribution one position's rows are read against.
#[derive(Debug, Clone)]
pub struct FinalRow {
    /// The token the statistics are of.
    pub target: u32,
    /// The final distribution's probabilities.
    p: Vec<f64>,
    /// `Σ p log p` of the final distribution (minus its entropy).
    p_log_p: f64,
}

/// One row's statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowStats {
    /// Log-probability of the target.
    pub logprob: f32,
    /// Tokens with a strictly larger logit than the target's.
    pub above: u32,
    /// The row's first largest logit's token.
    pub top: u32,
    /// KL(final ‖ row), nats (clamped at 0 against rounding).
    pub kl: f32,
}

/// `max` and `ln Σ exp(z − max) + max` of a row.
fn log_sum_exp(z: &[f32]) -> f64 {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = z.iter().map(|&x| f64::from(x - max).exp()).sum();
    f64::from(max) + sum.ln()
}

/// The first index of the largest value.
fn argmax(z: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in z.iter().enumerate() {
        if x > z[best] {
            best = i;
        }
    }
    best as u32
}

impl FinalRow {
    /// The final distribution of logits `z`; the target is `target`, or
    /// the token `z` ranks first.
    pub fn new(z: &[f32], target: Option<u32>) -> Self {
        let lse = log_sum_exp(z);
        let p: Vec<f64> = z.iter().map(|&x| (f64::from(x) - lse).exp()).collect();
        let p_log_p = p
            .iter()
            .zip(z)
            .map(|(&pv, &x)| pv * (f64::from(x) - lse))
            .sum();
        Self {
            target: target.unwrap_or_else(|| argmax(z)),
            p,
            p_log_p,
        }
    }

    /// The statistics of row `z` (a hidden state's lens logits of this
    /// position) against this final distribution.
    pub fn stats(&self, z: &[f32]) -> RowStats {
        let lse = log_sum_exp(z);
        let t = self.target as usize;
        let zt = z.get(t).copied().unwrap_or(f32::NAN);
        let above = z.iter().filter(|&&x| x > zt).count() as u32;
        let cross: f64 = self.p.iter().zip(z).map(|(&p, &x)| p * f64::from(x)).sum();
        RowStats {
            logprob: (f64::from(zt) - lse) as f32,
            above,
            top: argmax(z),
            kl: (self.p_log_p - cross + lse).max(0.0) as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(final_z: &[f32], z: &[f32], t: usize) -> (f64, f64) {
        let ls = |v: &[f32]| {
            let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let s: f64 = v.iter().map(|&x| (x as f64 - m).exp()).sum();
            v.iter()
                .map(|&x| x as f64 - m - s.ln())
                .collect::<Vec<f64>>()
        };
        let (lf, lz) = (ls(final_z), ls(z));
        let kl = lf.iter().zip(&lz).map(|(a, b)| a.exp() * (a - b)).sum();
        (lz[t], kl)
    }

    #[test]
    fn one_pass_equals_the_definitions() {
        let final_z = [2.0f32, -1.0, 0.5, 3.0, 3.0, -4.0];
        let z = [0.1f32, 2.5, 0.5, 0.5, -3.0, 1.0];
        let f = FinalRow::new(&final_z, None);
        assert_eq!(f.target, 3, "the first of two equal largest");
        let s = f.stats(&z);
        let (lp, kl) = naive(&final_z, &z, 3);
        assert!(
            (f64::from(s.logprob) - lp).abs() < 1e-6,
            "{} vs {lp}",
            s.logprob
        );
        assert!((f64::from(s.kl) - kl).abs() < 1e-6, "{} vs {kl}", s.kl);
        // 2.5 and 1.0 are above the target's 0.5; the other 0.5 is not
        assert_eq!((s.above, s.top), (2, 1));
        let own = f.stats(&final_z);
        assert!(own.kl < 1e-12 && own.above == 0 && own.top == 3);
        let named = FinalRow::new(&final_z, Some(5)).stats(&z);
        assert_eq!(named.above, 1);
    }
}
