//! Per-layer curves aggregated from many prompt traces.
//!
//! Every prompt counts equally: a per-prompt mean over decode steps and heads is
//! taken first, then the mean over prompts (prompts without decode steps, and
//! NaN values, are skipped). The prefill-mass-weighted entropy is pooled:
//! `Σ m_prefill · H / Σ m_prefill` over all prompts, steps and heads where `H`
//! is defined. Entropies are normalised (see `PromptTrace::entropy_normalised`).
//! A mixture-of-experts model's routing is pooled over every decode token
//! instead ([`routing_curves`]): its load is a share of all the tokens' slots.

use lcut_trace::{LayerCurves, PromptTrace, Series, Tensor2, Tensor3};
use ndarray::{Array1, Array2, ArrayView2, Axis, Zip};
use ndarray_stats::SummaryStatisticsExt;

use crate::error::DiagError;
use crate::knockout::knockout_curves;
use crate::lens::lens_curves;
use crate::routing::routing_curves;
use crate::tail::tail_mass;

/// Mean of the finite values; NaN when there are none.
fn nan_mean(values: impl IntoIterator<Item = f32>) -> f32 {
    let finite: Array1<f64> = values
        .into_iter()
        .filter(|x| x.is_finite())
        .map(f64::from)
        .collect();
    finite.mean().map_or(f32::NAN, |m| m as f32)
}

/// Per-layer mean over (steps, heads) of one trace tensor, NaN-skipping.
fn layer_means(t: ArrayView2<f32>) -> f32 {
    nan_mean(t.iter().copied())
}

/// Means over prompts of a per-prompt per-layer statistic.
fn over_prompts(per_prompt: &[Vec<f32>], len: usize) -> Series {
    Series(
        (0..len)
            .map(|l| nan_mean(per_prompt.iter().map(|p| p[l])))
            .collect(),
    )
}

fn check_shapes(traces: &[PromptTrace]) -> Result<(usize, usize), DiagError> {
    let first = traces
        .first()
        .ok_or(DiagError::Empty("aggregating traces"))?;
    let (l, h) = (first.num_layers, first.num_heads);
    for t in traces {
        t.validate("aggregate")?;
        if (t.num_layers, t.num_heads) != (l, h) {
            return Err(DiagError::Mismatch {
                what: "trace shapes",
                detail: format!(
                    "prompt {:?} has {} layers × {} heads, prompt {:?} has {l} × {h}",
                    t.id, t.num_layers, t.num_heads, first.id
                ),
            });
        }
    }
    Ok((l, h))
}

fn mass_curve(traces: &[PromptTrace], l: usize, pick: fn(&PromptTrace) -> &Tensor3) -> Series {
    let per_prompt: Vec<Vec<f32>> = traces
        .iter()
        .map(|t| {
            let v = pick(t).view();
            (0..l)
                .map(|i| layer_means(v.index_axis(Axis(0), i)))
                .collect()
        })
        .collect();
    over_prompts(&per_prompt, l)
}

/// The sink's share per layer where every trace holds it (a model with
/// sinks), else empty.
fn sink_curve(traces: &[PromptTrace], l: usize) -> Series {
    let per_prompt: Option<Vec<Vec<f32>>> = traces
        .iter()
        .map(|t| {
            let v = t.sink.as_ref()?.view();
            Some(
                (0..l)
                    .map(|i| layer_means(v.index_axis(Axis(0), i)))
                    .collect(),
            )
        })
        .collect();
    match per_prompt {
        Some(p) if !p.is_empty() => over_prompts(&p, l),
        _ => Series::default(),
    }
}

fn weighted_entropy(traces: &[PromptTrace], l: usize) -> Series {
    let mut num = vec![0.0f64; l];
    let mut den = vec![0.0f64; l];
    for t in traces {
        let hn = t.entropy_normalised().mapv(f64::from);
        let m = t.prefill.view().mapv(f64::from);
        for i in 0..l {
            let mut h_i = hn.index_axis(Axis(0), i).to_owned();
            let mut w_i = m.index_axis(Axis(0), i).to_owned();
            Zip::from(&mut h_i).and(&mut w_i).for_each(|h, w| {
                if !h.is_finite() || !w.is_finite() {
                    *h = 0.0;
                    *w = 0.0;
                }
            });
            if let Ok(s) = h_i.weighted_sum(&w_i) {
                num[i] += s;
            }
            den[i] += w_i.sum();
        }
    }
    Series(
        num.iter()
            .zip(&den)
            .map(|(n, d)| if *d > 0.0 { (n / d) as f32 } else { f32::NAN })
            .collect(),
    )
}

fn by_head(traces: &[PromptTrace], l: usize, h: usize) -> Tensor2 {
    let mut out = Array2::from_elem((l, h), f32::NAN);
    for i in 0..l {
        for j in 0..h {
            out[[i, j]] = nan_mean(traces.iter().map(|t| {
                nan_mean(
                    t.prefill
                        .view()
                        .slice(ndarray::s![i, .., j])
                        .iter()
                        .copied(),
                )
            }));
        }
    }
    Tensor2::from_array(&out)
}

fn by_step(traces: &[PromptTrace], l: usize) -> Tensor2 {
    let steps = traces.iter().map(PromptTrace::num_steps).max().unwrap_or(0);
    let mut out = Array2::from_elem((l, steps), f32::NAN);
    for i in 0..l {
        for k in 0..steps {
            out[[i, k]] = nan_mean(traces.iter().filter(|t| k < t.num_steps()).map(|t| {
                nan_mean(
                    t.prefill
                        .view()
                        .slice(ndarray::s![i, k, ..])
                        .iter()
                        .copied(),
                )
            }));
        }
    }
    Tensor2::from_array(&out)
}

/// The layers whose masses some trace took from their state split (a
/// linear-attention layer: no attention rows), ascending.
fn state_split_layers(traces: &[PromptTrace]) -> Vec<usize> {
    let layers: std::collections::BTreeSet<usize> = traces
        .iter()
        .flat_map(|t| t.state_split_layers.iter().copied())
        .collect();
    layers.into_iter().collect()
}

/// Aggregates traces (all with the same layer and head counts) into per-layer curves.
pub fn aggregate(traces: &[PromptTrace]) -> Result<LayerCurves, DiagError> {
    let (l, h) = check_shapes(traces)?;
    let prefill = mass_curve(traces, l, |t| &t.prefill);
    let entropy_per_prompt: Vec<Vec<f32>> = traces
        .iter()
        .map(|t| {
            let hn = t.entropy_normalised();
            (0..l)
                .map(|i| layer_means(hn.index_axis(Axis(0), i)))
                .collect()
        })
        .collect();
    let curvature = |pick: fn(&PromptTrace) -> &Series| {
        let per_prompt: Vec<Vec<f32>> = traces.iter().map(|t| pick(t).0.clone()).collect();
        over_prompts(&per_prompt, l + 1)
    };
    let curvature_prompt = curvature(|t| &t.curvature_prompt);
    let curvature_generated = curvature(|t| &t.curvature_generated);
    let straighten = |c: &Series| Series(c.iter().map(|x| x - c[0]).collect());
    let [lens_prob, lens_top1, lens_formed, lens_kl, lens_log_rank] = lens_curves(traces, l);
    let [knockout_kl, knockout_top1] = knockout_curves(traces, l)?;
    Ok(LayerCurves {
        num_layers: l,
        num_heads: h,
        bos: mass_curve(traces, l, |t| &t.bos),
        anchor: mass_curve(traces, l, |t| &t.anchor),
        tail_mass: Series(tail_mass(&prefill)),
        prefill,
        decode: mass_curve(traces, l, |t| &t.decode),
        self_mass: mass_curve(traces, l, |t| &t.self_mass),
        sink: sink_curve(traces, l),
        entropy_head_mean: over_prompts(&entropy_per_prompt, l),
        entropy_weighted: weighted_entropy(traces, l),
        straightening_prompt: straighten(&curvature_prompt),
        straightening_generated: straighten(&curvature_generated),
        curvature_prompt,
        curvature_generated,
        lens_prob,
        lens_top1,
        lens_formed,
        lens_kl,
        lens_log_rank,
        knockout_kl,
        knockout_top1,
        prefill_by_head: by_head(traces, l, h),
        prefill_by_step: by_step(traces, l),
        routing: routing_curves(traces)?,
        state_split_layers: state_split_layers(traces),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::TraceHeader;

    /// L = 2, H = 1, prompt of 10 tokens (BoS + 8 prefill + 1 decode start).
    fn trace(
        index: usize,
        steps: usize,
        prefill: [f32; 2],
        entropy_norm: [f32; 2],
        curv: [f32; 3],
    ) -> PromptTrace {
        let header = TraceHeader {
            index,
            id: format!("p{index}"),
            prompt_tokens: vec![],
            prompt_len: 10,
            decode_start: 9,
            anchor_len: 1,
        };
        let mut t = PromptTrace::zeroed(header, 2, 1, steps, 4);
        let ln8 = 8f32.ln();
        for l in 0..2 {
            for k in 0..steps {
                t.prefill.view_mut()[[l, k, 0]] = prefill[l];
                t.bos.view_mut()[[l, k, 0]] = 1.0 - prefill[l];
                t.prefill_entropy.view_mut()[[l, k, 0]] = entropy_norm[l] * ln8;
            }
        }
        t.curvature_prompt = Series(curv.to_vec());
        t
    }

    #[test]
    fn prompts_count_equally_and_weighted_entropy_pools() {
        let a = trace(0, 1, [0.6, 0.2], [0.5, 1.0], [1.0, 0.8, 0.7]);
        let b = trace(
            1,
            3,
            [0.2, 0.0],
            [0.25, f32::NAN],
            [f32::NAN, f32::NAN, f32::NAN],
        );
        let c = aggregate(&[a, b]).unwrap();
        let close = |x: f32, y: f32| (x - y).abs() < 1e-6;
        // masses: mean of per-prompt means, not pooled over b's 3 steps
        assert!(
            close(c.prefill[0], 0.4) && close(c.prefill[1], 0.1),
            "{:?}",
            c.prefill
        );
        assert!(close(c.bos[0], 0.6));
        // head-mean entropy: b's NaN at layer 1 is skipped
        assert!(close(c.entropy_head_mean[0], 0.375));
        assert!(close(c.entropy_head_mean[1], 1.0));
        // weighted, pooled over steps: (0.6·0.5 + 3·0.2·0.25) / (0.6 + 3·0.2) = 0.375
        assert!(close(c.entropy_weighted[0], 0.375));
        // tail mass of [0.4, 0.1]
        assert!(close(c.tail_mass[1], 0.2) && c.tail_mass[2] == 0.0);
        // curvature skips b's NaN; straightening is relative to the embeddings
        assert!(close(c.curvature_prompt[2], 0.7));
        assert!(close(c.straightening_prompt[1], -0.2));
        assert!(c.curvature_generated[0].is_nan());
        // per-step heatmap: step 0 has both prompts, steps 1-2 only b
        assert_eq!(c.prefill_by_step.shape(), [2, 3]);
        assert!(close(c.prefill_by_step.view()[[0, 0]], 0.4));
        assert!(close(c.prefill_by_step.view()[[0, 2]], 0.2));
        assert!(close(c.prefill_by_head.view()[[1, 0]], 0.1));
    }

    #[test]
    fn weighting_differs_from_head_mean() {
        // Heavy reading at low entropy and light reading at high entropy: the
        // weighted mean sits near the heavy one.
        let a = trace(0, 1, [0.9, 0.0], [0.1, 0.0], [0.0; 3]);
        let b = trace(1, 1, [0.1, 0.0], [0.9, 0.0], [0.0; 3]);
        let c = aggregate(&[a, b]).unwrap();
        assert!((c.entropy_head_mean[0] - 0.5).abs() < 1e-6);
        assert!(
            (c.entropy_weighted[0] - 0.18).abs() < 1e-6,
            "{}",
            c.entropy_weighted[0]
        );
    }

    #[test]
    fn mismatched_or_missing_traces_are_errors() {
        assert!(matches!(aggregate(&[]), Err(DiagError::Empty(_))));
        let a = trace(0, 1, [0.5; 2], [0.5; 2], [0.0; 3]);
        let mut b = a.clone();
        b.num_heads = 2;
        assert!(aggregate(&[a, b]).is_err());
    }
}
