//! Causal prompt knockout of one prompt, as a trace records it.
//!
//! For each band of `band` consecutive layers starting at layer `a` (`a` in
//! `0..=L - band`), the prompt (BoS kept) is hidden from the decode queries
//! at layers `a..a + band` only, teacher-forced on the full model's own
//! continuation; the trace keeps, per band, the sum over the continuation's
//! tokens of KL(full ‖ knocked out) and the count of tokens whose top-1 is
//! still the full model's. Sums, not means, so that shards and prompts pool
//! token by token as the sweep pools them.

use serde::{Deserialize, Serialize};

use crate::curves::LayerCurves;

/// Knockout sums of one prompt over the bands `a..a + band`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnockoutTrace {
    /// Layers per band (1: one layer at a time).
    pub band: usize,
    /// Continuation tokens scored (the same for every band).
    pub tokens: usize,
    /// Per band start `a`: Σ over tokens of KL(full ‖ knocked out), nats.
    pub kl_sum: Vec<f64>,
    /// Per band start `a`: tokens whose top-1 is the full model's token.
    pub agree: Vec<usize>,
}

impl KnockoutTrace {
    /// Number of band starts a model of `num_layers` layers has for bands
    /// of `band` layers (`L - band + 1`; 0 when the band is wider than the
    /// model or empty).
    pub fn starts(num_layers: usize, band: usize) -> usize {
        if band == 0 || band > num_layers {
            0
        } else {
            num_layers - band + 1
        }
    }

    /// Checks the band width and lengths against a model of `num_layers`
    /// layers.
    pub fn check(&self, num_layers: usize) -> Result<(), String> {
        if self.band == 0 || self.band > num_layers {
            return Err(format!(
                "knockout band of {} layers, expected 1..={num_layers}",
                self.band
            ));
        }
        let n = Self::starts(num_layers, self.band);
        if self.kl_sum.len() != n || self.agree.len() != n {
            return Err(format!(
                "knockout has {} KL sums and {} agreement counts, expected {n} \
                 (bands of {} in {num_layers} layers)",
                self.kl_sum.len(),
                self.agree.len(),
                self.band
            ));
        }
        if self.agree.iter().any(|&a| a > self.tokens) {
            return Err(format!(
                "knockout counts more agreeing tokens than its {} tokens",
                self.tokens
            ));
        }
        Ok(())
    }
}

/// The band of a knockout curve that moves the answer least, beside the
/// suffix band of the same width (the top layers: what SPEED+BoS at cut
/// `L - band` hides, at the same prompt K/V).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BandChoice {
    /// Layers per band.
    pub band: usize,
    /// First layer of the band with the lowest KL (ties to the higher band,
    /// so a suffix wins a tie: it also saves prefill).
    pub best: usize,
    /// Its KL(full ‖ knocked out), nats.
    pub best_kl: f32,
    /// The suffix band's KL, nats.
    pub suffix_kl: f32,
}

impl BandChoice {
    /// Whether a band that is not the suffix moves the answer less than the
    /// suffix at the same K/V.
    pub fn band_wins(&self) -> bool {
        self.best_kl < self.suffix_kl
    }
}

impl LayerCurves {
    /// The `n` band starts whose knockout moves the output most (highest
    /// KL first, ties to the lower layer), with their KL; empty without a
    /// knockout curve.
    pub fn most_causal(&self, n: usize) -> Vec<(usize, f32)> {
        let mut by_kl: Vec<(usize, f32)> = self
            .knockout_kl
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, kl)| kl.is_finite())
            .collect();
        by_kl.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        by_kl.truncate(n);
        by_kl
    }

    /// The best band of the knockout curve (bands of `band` layers)
    /// against the suffix; `None` without a complete curve of that width.
    pub fn best_band(&self, band: usize) -> Option<BandChoice> {
        let starts = KnockoutTrace::starts(self.num_layers, band);
        let kl = &self.knockout_kl;
        if starts == 0 || kl.len() < starts || !kl[..starts].iter().all(|x| x.is_finite()) {
            return None;
        }
        let suffix = starts - 1;
        let best = (0..starts)
            .rev()
            .min_by(|&a, &b| kl[a].total_cmp(&kl[b]))
            .unwrap_or(suffix);
        Some(BandChoice {
            band,
            best,
            best_kl: kl[best],
            suffix_kl: kl[suffix],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_and_checks_follow_the_band_width() {
        assert_eq!(KnockoutTrace::starts(30, 1), 30);
        assert_eq!(KnockoutTrace::starts(30, 8), 23);
        assert_eq!(KnockoutTrace::starts(30, 31), 0);
        assert_eq!(KnockoutTrace::starts(30, 0), 0);
        let t = KnockoutTrace {
            band: 2,
            tokens: 4,
            kl_sum: vec![0.1, 0.2, 0.3],
            agree: vec![4, 3, 2],
        };
        assert!(t.check(4).is_ok());
        assert!(t.check(5).unwrap_err().contains("expected 4"));
        let too_many = KnockoutTrace {
            agree: vec![5, 3, 2],
            ..t.clone()
        };
        assert!(too_many.check(4).is_err());
        assert!(KnockoutTrace { band: 0, ..t }.check(4).is_err());
    }

    #[test]
    fn the_most_causal_bands_and_the_best_band_read_the_kl_curve() {
        let mut curves = LayerCurves::empty(6, 1);
        assert!(curves.most_causal(2).is_empty() && curves.best_band(2).is_none());
        curves.knockout_kl = crate::Series(vec![0.5, 0.01, 0.3, 0.02, 0.01, f32::NAN]);
        assert_eq!(curves.most_causal(2), vec![(0, 0.5), (2, 0.3)]);
        // bands of 2 over 6 layers start at 0..=4: the suffix is 4
        curves.knockout_kl = crate::Series(vec![0.5, 0.01, 0.3, 0.02, 0.01, f32::NAN]);
        let b = curves.best_band(2).unwrap();
        assert_eq!((b.best, b.best_kl, b.suffix_kl), (4, 0.01, 0.01));
        assert!(!b.band_wins(), "a tie goes to the suffix");
        curves.knockout_kl.0[4] = 0.2;
        let b = curves.best_band(2).unwrap();
        assert_eq!((b.best, b.suffix_kl), (1, 0.2));
        assert!(b.band_wins());
        assert!(
            curves.best_band(1).is_none(),
            "one layer a time: 6 starts, one NaN"
        );
    }
}
