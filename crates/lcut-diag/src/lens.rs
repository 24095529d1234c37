//! The logit lens over prompts: per hidden state (index 0 the embeddings,
//! `l + 1` the output of layer `l`), the mean probability and log10 rank of
//! each decode step's token, the share of steps whose token the hidden
//! state ranks first, the share whose answer has formed there, and the mean
//! KL(final ‖ lens); and the formation layer those curves summarise.
//!
//! As with the masses, a per-prompt mean over its steps comes first, then
//! the mean over prompts (NaN skipped), so every prompt counts equally.
//!
//! A step's answer has formed at hidden state `i` when the lens of state `i`
//! and of every later state ranks the step's token first
//! ([`lcut_trace::LensTrace::formation`]); `lens_formed` is the share of
//! steps formed by each state, and [`lcut_trace::LayerCurves::formation`]
//! reads the run's formation layer off it.

use lcut_trace::{LensTrace, PromptTrace, Series};

/// The five lens curves in the order of their fields: prob, top1, formed,
/// kl, log_rank; all empty when no trace has a lens.
pub fn lens_curves(traces: &[PromptTrace], num_layers: usize) -> [Series; 5] {
    let sites = num_layers + 1;
    let with_lens: Vec<&LensTrace> = traces
        .iter()
        .filter_map(|t| t.lens.as_ref())
        .filter(|lens| lens.steps() > 0 && lens.sites() == sites)
        .collect();
    if with_lens.is_empty() {
        return Default::default();
    }
    let mut per_prompt: [Vec<Vec<f32>>; 5] = Default::default();
    for lens in with_lens {
        let steps = lens.steps();
        let mean_of = |f: &dyn Fn(usize, usize) -> f32| -> Vec<f32> {
            (0..sites)
                .map(|i| nan_mean((0..steps).map(|k| f(i, k))))
                .collect()
        };
        let (lp, rank, top1, kl) = (
            lens.logprob.view(),
            lens.rank.view(),
            lens.top1.view(),
            lens.kl.view(),
        );
        let formation: Vec<usize> = (0..steps).filter_map(|k| lens.formation(k)).collect();
        per_prompt[0].push(mean_of(&|i, k| lp[[i, k]].exp()));
        per_prompt[1].push(mean_of(&|i, k| top1[[i, k]]));
        per_prompt[2].push(
            (0..sites)
                .map(|i| formation.iter().filter(|&&f| f <= i).count() as f32 / steps as f32)
                .collect(),
        );
        per_prompt[3].push(mean_of(&|i, k| kl[[i, k]]));
        per_prompt[4].push(mean_of(&|i, k| rank[[i, k]].log10()));
    }
    per_prompt.map(|rows| {
        Series(
            (0..sites)
                .map(|i| nan_mean(rows.iter().map(|r| r[i])))
                .collect(),
        )
    })
}

/// Mean of the finite values; NaN when there are none.
fn nan_mean(values: impl IntoIterator<Item = f32>) -> f32 {
    let (sum, n) = values
        .into_iter()
        .filter(|x| x.is_finite())
        .fold((0.0f64, 0usize), |(s, n), x| (s + f64::from(x), n + 1));
    if n == 0 {
        f32::NAN
    } else {
        (sum / n as f64) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::TraceHeader;

    /// A trace of 2 layers (3 sites) whose lens ranks the step's token
    /// first from `forms[k]` on at step k.
    fn trace(index: usize, forms: &[usize]) -> PromptTrace {
        let header = TraceHeader {
            index,
            id: format!("p{index}"),
            prompt_tokens: vec![],
            prompt_len: 4,
            decode_start: 3,
            anchor_len: 1,
        };
        let steps = forms.len();
        let mut t = PromptTrace::zeroed(header, 2, 1, steps, 4);
        let mut lens = LensTrace::empty(3, steps);
        for (k, &f) in forms.iter().enumerate() {
            for i in 0..3 {
                let first = i >= f;
                lens.top1.view_mut()[[i, k]] = f32::from(u8::from(first));
                lens.rank.view_mut()[[i, k]] = if first { 1.0 } else { 100.0 };
                lens.logprob.view_mut()[[i, k]] = if first { 0.5f32.ln() } else { 0.1f32.ln() };
                lens.kl.view_mut()[[i, k]] = if i == 2 { 0.0 } else { 1.0 };
            }
        }
        lens.top_ids = vec![7; 3 * steps];
        t.lens = Some(lens);
        t
    }

    #[test]
    fn curves_weigh_prompts_equally_and_formation_is_the_median() {
        // prompt a: one step formed at 1; prompt b: three steps formed at 2, 2, 0
        let [prob, top1, formed, kl, rank] =
            lens_curves(&[trace(0, &[1]), trace(1, &[2, 2, 0])], 2);
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        // formed at site 1: a 1.0, b 1/3 -> 2/3
        assert!(close(formed[0], 1.0 / 6.0), "{formed:?}");
        assert!(close(formed[1], 2.0 / 3.0), "{formed:?}");
        assert!(close(formed[2], 1.0));
        assert!(close(top1[1], 2.0 / 3.0));
        assert!(close(prob[2], 0.5) && close(prob[0], (0.1 + (0.1 + 0.1 + 0.5) / 3.0) / 2.0));
        assert!(close(kl[2], 0.0) && close(kl[0], 1.0));
        assert!(close(rank[2], 0.0) && close(rank[0], 2.0 * 5.0 / 6.0));
        let curves = crate::aggregate(&[trace(0, &[1]), trace(1, &[2, 2, 0])]).unwrap();
        assert_eq!(curves.lens_formed, formed);
        assert_eq!(curves.lens_top1, top1);
        let f = curves.formation().unwrap();
        assert_eq!(f.median, 1);
        assert!(close(f.mean, (1.0 - 1.0 / 6.0) + (1.0 - 2.0 / 3.0)));
        assert!(close(f.top1_before_last, 2.0 / 3.0));
    }

    #[test]
    fn no_lens_no_curves() {
        let mut t = trace(0, &[1]);
        t.lens = None;
        let curves = lens_curves(std::slice::from_ref(&t), 2);
        assert!(curves.iter().all(|c| c.is_empty()));
        let c = crate::aggregate(&[t]).unwrap();
        assert!(c.lens_formed.is_empty());
        assert_eq!(c.formation(), None);
    }
}
