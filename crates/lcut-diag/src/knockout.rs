//! Causal prompt knockout over prompts: per band of layers, the mean
//! KL(full ‖ knocked out) and top-1 agreement pooled token by token over
//! every prompt's continuation (as the sweep pools its points, so a curve
//! entry equals what `sweep --policies band:a..b` measures on the same
//! prompts), and the cut the knockout curve votes for (the layers where
//! the prompt matters most and the best band are read off the curves:
//! [`LayerCurves::most_causal`], [`LayerCurves::best_band`]).

use lcut_trace::{KnockoutTrace, LayerCurves, PromptTrace, Series};

use crate::error::DiagError;

/// The knockout curves `[kl, top1]` of `traces` for a model of
/// `num_layers` layers: `L` entries each, entry `a` the band starting at
/// layer `a`, NaN where the band runs past the last layer; both empty when
/// no trace measured a knockout. Traces whose knockout bands differ in
/// width cannot be pooled: an error.
pub fn knockout_curves(
    traces: &[PromptTrace],
    num_layers: usize,
) -> Result<[Series; 2], DiagError> {
    let with: Vec<&KnockoutTrace> = traces.iter().filter_map(|t| t.knockout.as_ref()).collect();
    let Some(first) = with.first() else {
        return Ok(Default::default());
    };
    let band = first.band;
    if let Some(other) = with.iter().find(|k| k.band != band) {
        return Err(DiagError::mismatch(
            "knockout band widths",
            format!(
                "{band} and {} layers: run every shard with the same --knockout-band",
                other.band
            ),
        ));
    }
    let starts = KnockoutTrace::starts(num_layers, band);
    let tokens: usize = with.iter().map(|k| k.tokens).sum();
    let mut kl = vec![f32::NAN; num_layers];
    let mut top1 = vec![f32::NAN; num_layers];
    if tokens > 0 {
        for a in 0..starts {
            let sum: f64 = with.iter().filter_map(|k| k.kl_sum.get(a)).sum();
            let agree: usize = with.iter().filter_map(|k| k.agree.get(a)).sum();
            kl[a] = (sum / tokens as f64) as f32;
            top1[a] = (agree as f64 / tokens as f64) as f32;
        }
    }
    Ok([Series(kl), Series(top1)])
}

/// The band width of the traces' knockout (`None` when none has one).
pub fn knockout_band(traces: &[PromptTrace]) -> Option<usize> {
    traces
        .iter()
        .find_map(|t| t.knockout.as_ref().map(|k| k.band))
}

/// The KL (nats) above which a knockout band counts as reading the prompt
/// for [`vote_knockout`] as the diagnose summary reports it.
pub const KNOCKOUT_KL_MIN: f32 = 0.05;

/// The cut the knockout curve votes for: 1 + the last layer of the highest
/// band whose knockout moves the output by more than `kl_min` nats (the
/// prompt matters there, so SPEED should keep it); `band` is the curve's
/// band width. `None` without a curve or when no band moves it that much.
pub fn vote_knockout(curves: &LayerCurves, band: usize, kl_min: f32) -> Option<usize> {
    let l = curves.num_layers;
    curves
        .knockout_kl
        .iter()
        .enumerate()
        .filter(|(_, kl)| kl.is_finite() && **kl > kl_min)
        .map(|(a, _)| (a + band).min(l))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::TraceHeader;

    fn trace(index: usize, knockout: Option<KnockoutTrace>) -> PromptTrace {
        let header = TraceHeader {
            index,
            id: format!("p{index}"),
            prompt_tokens: vec!["a".into(); 4],
            prompt_len: 4,
            decode_start: 3,
            anchor_len: 1,
        };
        let mut t = PromptTrace::zeroed(header, 3, 1, 0, 4);
        t.knockout = knockout;
        t
    }

    fn ko(band: usize, tokens: usize, kl_sum: &[f64], agree: &[usize]) -> KnockoutTrace {
        KnockoutTrace {
            band,
            tokens,
            kl_sum: kl_sum.to_vec(),
            agree: agree.to_vec(),
        }
    }

    #[test]
    fn curves_pool_tokens_over_prompts_and_mark_missing_bands() {
        let traces = [
            trace(0, Some(ko(2, 2, &[1.0, 0.0], &[2, 1]))),
            trace(1, None),
            trace(2, Some(ko(2, 6, &[3.0, 2.0], &[4, 6]))),
        ];
        let [kl, top1] = knockout_curves(&traces, 3).unwrap();
        // token-weighted: (1 + 3) / 8, (0 + 2) / 8; the band at 2 would pass layer 2
        assert_eq!(kl.0[..2], [0.5, 0.25]);
        assert!(kl.0[2].is_nan());
        assert_eq!(top1.0[..2], [0.75, 0.875]);
        assert_eq!(knockout_band(&traces), Some(2));
    }

    #[test]
    fn no_knockout_gives_empty_curves_and_mixed_widths_are_refused() {
        let [kl, top1] = knockout_curves(&[trace(0, None)], 3).unwrap();
        assert!(kl.is_empty() && top1.is_empty());
        let mixed = [
            trace(0, Some(ko(1, 1, &[0.0; 3], &[1; 3]))),
            trace(1, Some(ko(2, 1, &[0.0; 2], &[1; 2]))),
        ];
        let err = knockout_curves(&mixed, 3).unwrap_err();
        assert!(err.to_string().contains("--knockout-band"), "{err}");
    }

    #[test]
    fn the_vote_reads_the_kl_curve() {
        let mut curves = LayerCurves::empty(6, 1);
        curves.knockout_kl = Series(vec![0.5, 0.01, 0.3, 0.02, 0.01, f32::NAN]);
        // highest band over 0.1 starts at 2; bands of 2 end at layer 3
        assert_eq!(vote_knockout(&curves, 1, 0.1), Some(3));
        assert_eq!(vote_knockout(&curves, 2, 0.1), Some(4));
        assert_eq!(vote_knockout(&curves, 1, 0.015), Some(4));
        assert_eq!(vote_knockout(&curves, 1, 1.0), None);
    }
}
