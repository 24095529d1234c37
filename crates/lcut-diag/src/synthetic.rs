//! Deterministic synthetic traces and reports, shaped like real ones: prefill
//! mass falling with depth, entropy rising, curvature settling. For tests, docs
//! and the viewer's demo mode; not measurements of any model.

use lcut_policy::Anchors;
use lcut_trace::{
    KnockoutTrace, LensTrace, ModelIdentity, PromptTrace, Report, RoutingOverlap, RoutingTrace,
    RunSettings, SweepPoint, Tensor2, Thresholds, TraceHeader, bin_sums, hash_bytes, speed_policy,
};

use crate::error::DiagError;
use crate::flops::{FlopShape, PromptSplit, prefill_flops};
use crate::knee::finish_sweep;
use crate::merge::build_report;

/// A small model identity with `num_layers` layers and `num_heads` heads.
pub fn synthetic_model(num_layers: usize, num_heads: usize) -> ModelIdentity {
    ModelIdentity {
        path: "synthetic".into(),
        config_hash: hash_bytes(format!("synthetic {num_layers} {num_heads}").as_bytes()),
        arch: "llama".into(),
        dtype: "f32".into(),
        num_layers,
        num_heads,
        num_kv_heads: num_heads.div_ceil(2),
        head_dim: 16,
        hidden_size: 16 * num_heads,
        intermediate_size: 48 * num_heads,
        vocab_size: 1000,
        sliding_window: Vec::new(),
        layer_flops: Vec::new(),
        adapter: None,
    }
}

/// Default-looking run settings (8 new tokens, 16 prompt bins, default thresholds).
pub fn synthetic_settings() -> RunSettings {
    RunSettings {
        max_new_tokens: 8,
        prompts_file: Some("prompts.jsonl".into()),
        shard: None,
        thresholds: Thresholds::default(),
        chat_template_used: true,
        max_prompt_bins: 16,
        policy: None,
        routing_policy: None,
    }
}

/// A valid trace for prompt `index` with the given sizes (`prompt_len >= 3`
/// is raised to 3). BoS is the only anchor; the last prompt token starts the
/// decode phase. Generated-span curvature is NaN below three steps, as a real
/// run's would be.
pub fn synthetic_trace(
    index: usize,
    num_layers: usize,
    num_heads: usize,
    num_steps: usize,
    prompt_len: usize,
) -> PromptTrace {
    let prompt_len = prompt_len.max(3);
    let s = prompt_len - 1;
    let header = TraceHeader {
        index,
        id: format!("prompt-{index}"),
        prompt_tokens: (0..prompt_len).map(|j| format!("t{j}")).collect(),
        prompt_len,
        decode_start: s,
        anchor_len: 1,
    };
    let mut tr = PromptTrace::zeroed(header, num_layers, num_heads, num_steps, 16);
    tr.generated = (0..num_steps).map(|k| format!("g{k}")).collect();
    tr.generated_ids = (0..num_steps as u32).collect();
    let n_prefill = tr.prefill_len();
    let depth = |l: usize| l as f32 / (num_layers.max(2) - 1) as f32;
    for l in 0..num_layers {
        let x = depth(l);
        for k in 0..num_steps {
            for h in 0..num_heads {
                let wiggle = ((index + 3 * k + 7 * h + l) as f32).sin();
                let p = (0.5 * (-4.0 * x).exp() * (1.0 + 0.2 * wiggle)).clamp(0.0, 0.9);
                let rest = 1.0 - p;
                let (bos, decode, own) = if k == 0 {
                    (0.85 * rest, 0.0, 0.15 * rest)
                } else {
                    (0.6 * rest, 0.25 * rest, 0.15 * rest)
                };
                let idx = [l, k, h];
                tr.prefill.view_mut()[idx] = p;
                tr.bos.view_mut()[idx] = bos;
                tr.decode.view_mut()[idx] = decode;
                tr.self_mass.view_mut()[idx] = own;
                let e = (0.3 + 0.6 * x + 0.05 * wiggle).clamp(0.0, 1.0);
                tr.prefill_entropy.view_mut()[idx] = e * (n_prefill as f32).ln();
            }
        }
        let mean = |t: &lcut_trace::Tensor3| {
            let v = t.view();
            let lane = v.index_axis(ndarray::Axis(0), l);
            if lane.is_empty() {
                0.0
            } else {
                lane.sum() / lane.len() as f32
            }
        };
        let mut per_pos = vec![0.0f32; prompt_len];
        per_pos[0] = mean(&tr.bos);
        per_pos[1..s].fill(mean(&tr.prefill) / n_prefill as f32);
        per_pos[s] = mean(&tr.decode) + mean(&tr.self_mass);
        let binned = bin_sums(&per_pos, &tr.bin_edges);
        tr.prompt_attention
            .view_mut()
            .row_mut(l)
            .assign(&ndarray::Array1::from(binned));
    }
    tr.lens = Some(synthetic_lens(index, num_layers, num_steps));
    tr.knockout = Some(synthetic_knockout(index, num_layers, num_steps));
    for i in 0..=num_layers {
        let y = 6.0 * i as f32 / num_layers.max(1) as f32;
        tr.curvature_prompt[i] = 1.6 - 0.5 * (1.0 - (-y).exp()) + 0.002 * (index as f32).sin();
        tr.curvature_generated[i] = if num_steps >= 3 {
            1.4 - 0.3 * (1.0 - (-y).exp())
        } else {
            f32::NAN
        };
    }
    tr
}

/// A knockout of one layer at a time whose KL peaks a little below the
/// middle of the model (where the prompt matters most), small elsewhere.
fn synthetic_knockout(index: usize, num_layers: usize, num_steps: usize) -> KnockoutTrace {
    let peak = (0.45 * num_layers as f32).floor();
    let kl_sum: Vec<f64> = (0..num_layers)
        .map(|a| {
            let d = a as f32 - peak;
            let kl = 0.02 + 0.6 * (-d * d).exp() + 0.001 * (index as f32).sin().abs();
            f64::from(kl) * num_steps as f64
        })
        .collect();
    let agree = kl_sum
        .iter()
        .map(|&k| {
            let per = k / num_steps.max(1) as f64;
            ((1.0 - per.min(1.0) * 0.5) * num_steps as f64).floor() as usize
        })
        .collect();
    KnockoutTrace {
        band: 1,
        tokens: num_steps,
        kl_sum,
        agree,
    }
}

/// A logit lens whose answers form about two thirds of the way up (step
/// k of prompt `index` at a site that wobbles with k): below it the token
/// ranks far down with a small probability, from it on it is first.
fn synthetic_lens(index: usize, num_layers: usize, num_steps: usize) -> LensTrace {
    let sites = num_layers + 1;
    let mut lens = LensTrace::empty(sites, num_steps);
    for k in 0..num_steps {
        let wobble = ((index + 2 * k) as f32).sin();
        let forms = ((0.65 + 0.15 * wobble) * num_layers as f32).round() as usize;
        for i in 0..sites {
            let x = i as f32 - forms as f32;
            let formed = i >= forms.min(num_layers);
            let p = if formed {
                0.4 + 0.5 * i as f32 / num_layers.max(1) as f32
            } else {
                0.3 / (1.0 + (-x).exp2())
            };
            lens.logprob.view_mut()[[i, k]] = p.ln();
            lens.rank.view_mut()[[i, k]] = if formed {
                1.0
            } else {
                (2.0 - x).exp2().round()
            };
            lens.top1.view_mut()[[i, k]] = f32::from(u8::from(formed));
            let kl = if i == num_layers {
                0.0
            } else {
                4.0 * (1.0 - i as f32 / num_layers as f32)
            };
            lens.kl.view_mut()[[i, k]] = kl;
            lens.top_ids[i * num_steps + k] = if formed { k as u32 } else { 900 + i as u32 };
        }
    }
    lens
}

/// The layers a synthetic mixture-of-experts model of `num_layers` layers
/// routes at: all but layer 1 when it has more than two (a dense layer
/// among sparse ones, as Qwen3-MoE's `mlp_only_layers` makes), else all.
pub fn synthetic_sparse_layers(num_layers: usize) -> Vec<usize> {
    (0..num_layers)
        .filter(|&l| num_layers <= 2 || l != 1)
        .collect()
}

/// A deterministic number in `0..n` from a few integers.
fn mix(parts: [usize; 4], n: usize) -> usize {
    let h = parts.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3).rotate_left(17)
    });
    (h % n.max(1) as u64) as usize
}

/// The routing of `num_steps` decode steps of prompt `index` at the sparse
/// layers of [`synthetic_sparse_layers`], `(experts, top_k)` of them: the
/// router's entropy falling with depth (early layers spread, late layers
/// pick), experts drawn deterministically, the low experts a little more
/// often; with `policy`, an overlap with the full model of 1 in the lower
/// half and lower above it.
pub fn synthetic_routing(
    index: usize,
    num_layers: usize,
    num_steps: usize,
    (experts, top_k): (usize, usize),
    policy: Option<&str>,
) -> RoutingTrace {
    let layers = synthetic_sparse_layers(num_layers);
    let n = layers.len();
    let depth = |l: usize| l as f32 / (num_layers.max(2) - 1) as f32;
    let mut entropy = Vec::with_capacity(n * num_steps);
    let mut chosen = Vec::with_capacity(n * num_steps * top_k);
    let mut overlap = Vec::with_capacity(n * num_steps);
    for &l in &layers {
        for k in 0..num_steps {
            let wiggle = ((index + 3 * k + l) as f32).sin();
            entropy.push((0.9 - 0.5 * depth(l) + 0.05 * wiggle).clamp(0.0, 1.0));
            let mut picked: Vec<u32> = Vec::with_capacity(top_k);
            let mut salt = 0;
            while picked.len() < top_k.min(experts) {
                // squaring a uniform draw favours the low experts
                let u = mix([index, l, k, salt], 1000) as f32 / 1000.0;
                let x = ((u * u) * experts as f32) as u32;
                if !picked.contains(&x) {
                    picked.push(x);
                }
                salt += 1;
            }
            chosen.extend_from_slice(&picked);
            let kept = if depth(l) < 0.5 {
                top_k
            } else {
                top_k - mix([index, l, k, 99], top_k)
            };
            overlap.push(kept as f32 / top_k.max(1) as f32);
        }
    }
    let shape = [n, num_steps];
    RoutingTrace {
        num_experts: experts,
        top_k,
        layers,
        entropy: Tensor2::new(shape, entropy).unwrap_or_else(|_| Tensor2::zeros(shape)),
        experts: chosen,
        overlap: policy.map(|p| RoutingOverlap {
            policy: p.to_string(),
            overlap: Tensor2::new(shape, overlap).unwrap_or_else(|_| Tensor2::zeros(shape)),
        }),
    }
}

/// A complete report over `num_prompts` synthetic prompts, with a synthetic
/// sweep over every cut (anchors `bos` and `none`) when `with_sweep`.
pub fn synthetic_report(
    num_prompts: usize,
    num_layers: usize,
    num_heads: usize,
    with_sweep: bool,
) -> Result<Report, DiagError> {
    report_of(num_prompts, num_layers, num_heads, with_sweep, false)
}

/// [`synthetic_report`] of a mixture-of-experts model with attention
/// sinks (gpt-oss): 8 experts, 2 per token, routing at the layers of
/// [`synthetic_sparse_layers`] ([`synthetic_routing`]), compared with
/// SPEED+BoS at half the depth, the sweep's points with a routing overlap,
/// and a sink that takes part of BoS's mass ([`with_sink`]).
pub fn synthetic_moe_report(
    num_prompts: usize,
    num_layers: usize,
    num_heads: usize,
    with_sweep: bool,
) -> Result<Report, DiagError> {
    report_of(num_prompts, num_layers, num_heads, with_sweep, true)
}

/// Give `tr` a learned sink's share: 0.4 of BoS's mass at every layer,
/// step and head goes to no key (masses still sum to one; the prompt map's
/// first bin loses the mean it moved).
pub fn with_sink(tr: &mut PromptTrace) {
    let mut sink = tr.bos.clone();
    for (s, b) in sink.view_mut().iter_mut().zip(tr.bos.view_mut().iter_mut()) {
        *s = 0.4 * *b;
        *b -= *s;
    }
    for l in 0..tr.num_layers {
        let lane = sink.view();
        let lane = lane.index_axis(ndarray::Axis(0), l);
        let moved = if lane.is_empty() {
            0.0
        } else {
            lane.sum() / lane.len() as f32
        };
        if tr.num_bins() > 0 {
            tr.prompt_attention.view_mut()[[l, 0]] -= moved;
        }
    }
    tr.sink = Some(sink);
}

/// The synthetic report, dense or routed (`moe`).
fn report_of(
    num_prompts: usize,
    num_layers: usize,
    num_heads: usize,
    with_sweep: bool,
    moe: bool,
) -> Result<Report, DiagError> {
    let mut model = synthetic_model(num_layers, num_heads);
    let compared = format!("speed:{}+bos", (num_layers / 2).max(1));
    if moe {
        model.arch = "gpt_oss".into();
    }
    let mut settings = synthetic_settings();
    if moe {
        settings.routing_policy = Some(compared.clone());
    }
    let traces = (0..num_prompts)
        .map(|i| {
            let steps = 1 + (i * 5) % 8;
            let mut t = synthetic_trace(i, num_layers, num_heads, steps, 12 + 9 * i);
            if moe {
                let routing = synthetic_routing(i, num_layers, steps, (8, 2), Some(&compared));
                t.routing = Some(routing);
                with_sink(&mut t);
            }
            t
        })
        .collect();
    let sweep = with_sweep.then(|| {
        let context_len = 4096;
        let shape = FlopShape::from(&model);
        let b = 2 * model.num_kv_heads * model.head_dim * 4;
        let full_flops = prefill_flops(&shape, num_layers, PromptSplit::raw(context_len, 1));
        let full_kv = (b * num_layers * context_len) as u64;
        let points = [Anchors::Bos, Anchors::None]
            .into_iter()
            .flat_map(|anchors| (1..=num_layers).map(move |c| (anchors, c)))
            .map(|(anchors, c)| {
                let a = usize::from(anchors == Anchors::Bos);
                let split = PromptSplit::raw(context_len, a);
                let x = c as f32 / num_layers as f32;
                let loss = if a == 1 { 0.6 } else { 0.8 };
                let kv = (b * (c * split.prefill + num_layers * (a + split.decode))) as u64;
                let flops = prefill_flops(&shape, c, split);
                SweepPoint {
                    policy: speed_policy(c, anchors),
                    top1_agreement: 1.0 - loss * (1.0 - x).powi(2),
                    mean_kl: 2.0 * (1.0 - x).powi(2),
                    nll: 1.5 + (1.0 - x),
                    kv_bytes: kv,
                    kv_ratio: kv as f32 / full_kv as f32,
                    prefill_flops: flops,
                    prefill_ratio: (flops / full_flops) as f32,
                    tokens: Some(16 * num_prompts),
                    routing_overlap: moe.then(|| 1.0 - 0.5 * (1.0 - x).powi(2)),
                }
            })
            .collect();
        finish_sweep(context_len, points, &settings.thresholds)
    });
    build_report("synthetic", model, settings, traces, sweep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_traces_are_valid_and_masses_sum_to_one() {
        for (l, h, t, p) in [(4, 2, 0, 3), (6, 3, 5, 40), (1, 1, 2, 100)] {
            let tr = synthetic_trace(2, l, h, t, p);
            tr.validate("synthetic").unwrap();
            assert!(tr.mass_totals().iter().all(|x| (x - 1.0).abs() < 1e-5));
            let lens = tr.lens.as_ref().unwrap();
            assert!((0..t).all(|k| lens.formation(k).is_some_and(|f| f <= l)));
        }
    }

    #[test]
    fn synthetic_moe_report_is_valid_and_routes_its_sparse_layers() {
        let r = synthetic_moe_report(4, 6, 2, true).unwrap();
        r.validate("synthetic").unwrap();
        let c = r.curves.routing.as_ref().unwrap();
        assert_eq!(c.sparse_layers, vec![0, 2, 3, 4, 5]);
        assert_eq!(c.policy.as_deref(), Some("speed:3+bos"));
        let sweep = r.sweep.as_ref().unwrap();
        assert!(sweep.points.iter().all(|p| p.routing_overlap.is_some()));
    }

    #[test]
    fn synthetic_report_is_valid() {
        let r = synthetic_report(5, 8, 4, true).unwrap();
        r.validate("synthetic").unwrap();
        assert_eq!(r.traces.len(), 5);
        let sweep = r.sweep.unwrap();
        assert_eq!(sweep.points.len(), 16);
        assert!(sweep.knee.is_some());
    }
}
