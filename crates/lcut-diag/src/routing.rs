//! Routing statistics of a mixture-of-experts model's decode tokens: the
//! router's normalised entropy, the experts' load, and a policy's top-k
//! overlap with the full model on the same tokens. The engine records the
//! routing ([`lcut_trace::RoutingTrace`]); everything computed from it is
//! computed here, once, for `lcut diagnose`, `lcut sweep` and the viewer.

use lcut_trace::{PromptTrace, RoutingCurves, RoutingTrace, Series, Tensor2};

use crate::error::DiagError;

/// The entropy of a router's softmax over all its experts, `-Σ p ln p`,
/// divided by `ln E` (`E = probs.len()`): 0 when one expert takes all the
/// probability, 1 when every expert is equally likely. Zero probabilities
/// add nothing; the result is clamped to `[0, 1]` against rounding. NaN
/// for fewer than two experts (no choice to spread over) or a non-finite
/// probability.
pub fn routing_entropy(probs: &[f32]) -> f32 {
    if probs.len() < 2 || probs.iter().any(|p| !p.is_finite()) {
        return f32::NAN;
    }
    let h: f64 = probs
        .iter()
        .map(|&p| f64::from(p))
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum();
    (h / (probs.len() as f64).ln()).clamp(0.0, 1.0) as f32
}

/// The top-k overlap of two choices of experts: the share of `policy`'s
/// chosen experts the full model also chose, `|policy ∩ full| / k` with `k`
/// the longer choice's length (the experts of one choice are distinct).
/// NaN when both are empty.
pub fn topk_overlap(policy: &[u32], full: &[u32]) -> f32 {
    let k = policy.len().max(full.len());
    if k == 0 {
        return f32::NAN;
    }
    let shared = policy.iter().filter(|e| full.contains(e)).count();
    shared as f32 / k as f32
}

/// Per sparse layer and decode step, the top-k overlap of `policy`'s
/// routing with `full`'s, both recorded on the same tokens ([`topk_overlap`]):
/// a `[layers, steps]` tensor laid out as the traces' own. The two must
/// route the same layers over the same steps with the same `k`.
pub fn routing_overlap(policy: &RoutingTrace, full: &RoutingTrace) -> Result<Tensor2, DiagError> {
    let shape = |r: &RoutingTrace| (r.layers.clone(), r.num_steps(), r.top_k, r.num_experts);
    if shape(policy) != shape(full) {
        return Err(DiagError::mismatch(
            "routings compared",
            format!(
                "the policy's routes layers {:?} over {} steps choosing {} of {} experts, \
                 the full model's layers {:?} over {} steps choosing {} of {}",
                policy.layers,
                policy.num_steps(),
                policy.top_k,
                policy.num_experts,
                full.layers,
                full.num_steps(),
                full.top_k,
                full.num_experts
            ),
        ));
    }
    let (n, steps) = (policy.layers.len(), policy.num_steps());
    let data = (0..n)
        .flat_map(|row| (0..steps).map(move |step| (row, step)))
        .map(|(row, step)| topk_overlap(policy.chosen(row, step), full.chosen(row, step)))
        .collect();
    Ok(Tensor2::new([n, steps], data)?)
}

/// Running sums of top-k overlaps, pooled over layers, tokens and prompts
/// (the sweep's overlap at one cut).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OverlapTotals {
    /// Sum of the finite overlaps.
    pub sum: f64,
    /// How many were summed.
    pub count: usize,
}

impl OverlapTotals {
    /// Add every finite value of an overlap tensor ([`routing_overlap`]).
    pub fn add(&mut self, overlap: &Tensor2) {
        for &x in overlap.data().iter().filter(|x| x.is_finite()) {
            self.sum += f64::from(x);
            self.count += 1;
        }
    }

    /// The mean overlap, `None` when nothing was added.
    pub fn mean(&self) -> Option<f32> {
        (self.count > 0).then(|| (self.sum / self.count as f64) as f32)
    }
}

/// What every routed trace of a report must share.
fn routing_shape(r: &RoutingTrace) -> (usize, usize, &[usize], Option<&str>) {
    (
        r.num_experts,
        r.top_k,
        &r.layers,
        r.overlap.as_ref().map(|o| o.policy.as_str()),
    )
}

/// The routing of the traces aggregated per layer, every decode token of
/// every prompt counted once: mean normalised entropy, each expert's share
/// of the top-k slots (rows of the sparse layers sum to 1), and the mean
/// overlap of the compared policy with the full model. `None` when no trace
/// has routing (a dense model); an error when some traces have it and
/// others do not, or when they route differently shaped models or compare
/// different policies (shards of different runs).
pub fn routing_curves(traces: &[PromptTrace]) -> Result<Option<RoutingCurves>, DiagError> {
    let Some(first_routed) = traces.iter().find(|t| t.routing.is_some()) else {
        return Ok(None);
    };
    let first = first_routed.routing.as_ref().map(routing_shape);
    for t in traces {
        let shape = t.routing.as_ref().map(routing_shape);
        if shape != first {
            return Err(DiagError::mismatch(
                "trace routing",
                format!(
                    "prompt {:?} routes {:?}, prompt {:?} {:?} (experts, top-k, sparse layers, \
                     policy compared)",
                    first_routed.id, first, t.id, shape
                ),
            ));
        }
    }
    let num_layers = first_routed.num_layers;
    let r0 = first_routed
        .routing
        .as_ref()
        .ok_or(DiagError::Empty("routing"))?;
    let (e, k, layers) = (r0.num_experts, r0.top_k, r0.layers.clone());
    let policy = r0.overlap.as_ref().map(|o| o.policy.clone());
    let n = layers.len();
    let mut entropy = vec![(0.0f64, 0usize); n];
    let mut overlap = vec![(0.0f64, 0usize); n];
    let mut slots = vec![vec![0u64; e]; n];
    let mut tokens = 0;
    for r in traces.iter().filter_map(|t| t.routing.as_ref()) {
        let steps = r.num_steps();
        tokens += steps;
        for row in 0..n {
            for step in 0..steps {
                let h = r.entropy.view()[[row, step]];
                if h.is_finite() {
                    entropy[row].0 += f64::from(h);
                    entropy[row].1 += 1;
                }
                if let Some(o) = &r.overlap {
                    let x = o.overlap.view()[[row, step]];
                    if x.is_finite() {
                        overlap[row].0 += f64::from(x);
                        overlap[row].1 += 1;
                    }
                }
                for &x in r.chosen(row, step) {
                    if let Some(c) = slots[row].get_mut(x as usize) {
                        *c += 1;
                    }
                }
            }
        }
    }
    let mean = |(sum, count): (f64, usize)| match count {
        0 => f32::NAN,
        _ => (sum / count as f64) as f32,
    };
    let per_layer = |sums: &[(f64, usize)]| {
        let mut out = vec![f32::NAN; num_layers];
        for (row, &l) in layers.iter().enumerate() {
            out[l] = mean(sums[row]);
        }
        Series(out)
    };
    let mut load = vec![f32::NAN; num_layers * e];
    for (row, &l) in layers.iter().enumerate() {
        let total: u64 = slots[row].iter().sum();
        if total > 0 {
            for (x, &c) in slots[row].iter().enumerate() {
                load[l * e + x] = (c as f64 / total as f64) as f32;
            }
        }
    }
    Ok(Some(RoutingCurves {
        num_experts: e,
        top_k: k,
        sparse_layers: layers.clone(),
        tokens,
        entropy: per_layer(&entropy),
        load: Tensor2::new([num_layers, e], load)?,
        overlap: match policy {
            Some(_) => per_layer(&overlap),
            None => Series::default(),
        },
        policy,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{synthetic_moe_report, synthetic_routing};
    use lcut_trace::RoutingOverlap;

    #[test]
    fn entropy_is_zero_for_one_expert_and_one_for_all_alike() {
        assert_eq!(routing_entropy(&[1.0, 0.0, 0.0, 0.0]), 0.0);
        assert!((routing_entropy(&[0.25; 4]) - 1.0).abs() < 1e-6);
        let h = routing_entropy(&[0.5, 0.5, 0.0, 0.0]);
        assert!((h - 0.5).abs() < 1e-6, "two of four: ln 2 / ln 4 = {h}");
        assert!(routing_entropy(&[1.0]).is_nan());
        assert!(routing_entropy(&[0.5, f32::NAN]).is_nan());
    }

    #[test]
    fn overlap_counts_shared_experts_over_k() {
        assert_eq!(topk_overlap(&[3, 1], &[1, 3]), 1.0, "order does not matter");
        assert_eq!(topk_overlap(&[3, 1, 0], &[1, 2, 5]), 1.0 / 3.0);
        assert_eq!(topk_overlap(&[4, 5], &[1, 2]), 0.0);
        assert!(topk_overlap(&[], &[]).is_nan());
    }

    #[test]
    fn overlap_of_a_routing_with_itself_is_one_and_shapes_must_agree() {
        let a = synthetic_routing(0, 4, 5, (8, 2), None);
        let o = routing_overlap(&a, &a).unwrap();
        assert_eq!(o.shape(), [a.layers.len(), 5]);
        assert!(o.data().iter().all(|&x| x == 1.0));
        let b = synthetic_routing(1, 4, 5, (8, 2), None);
        let o = routing_overlap(&a, &b).unwrap();
        for (i, &x) in o.data().iter().enumerate() {
            let (row, step) = (i / 5, i % 5);
            assert_eq!(x, topk_overlap(a.chosen(row, step), b.chosen(row, step)));
        }
        let c = synthetic_routing(0, 4, 4, (8, 2), None);
        let err = routing_overlap(&a, &c).unwrap_err().to_string();
        assert!(err.contains("routings compared"), "{err}");
    }

    #[test]
    fn curves_pool_every_token_and_load_rows_sum_to_one() {
        let r = synthetic_moe_report(3, 5, 2, false).unwrap();
        let c = r.curves.routing.as_ref().unwrap();
        let tokens: usize = r.traces.iter().map(PromptTrace::num_steps).sum();
        assert_eq!(c.tokens, tokens);
        for l in 0..5 {
            let row: Vec<f32> = c.load.view().row(l).to_vec();
            if c.is_sparse(l) {
                let sum: f32 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "layer {l}: {sum}");
                assert!((0.0..=1.0).contains(&c.entropy[l]));
                assert!((0.0..=1.0).contains(&c.overlap[l]));
            } else {
                assert!(row.iter().all(|x| x.is_nan()) && c.entropy[l].is_nan());
            }
        }
        // the pooled entropy of a layer is the mean over every step of every prompt
        let l = c.sparse_layers[0];
        let all: Vec<f32> = r
            .traces
            .iter()
            .flat_map(|t| t.routing.as_ref().unwrap().entropy.view().row(0).to_vec())
            .collect();
        let want = all.iter().sum::<f32>() / all.len() as f32;
        assert!((c.entropy[l] - want).abs() < 1e-6);
    }

    #[test]
    fn dense_traces_have_no_routing_and_mixed_ones_are_refused() {
        let dense = crate::synthetic::synthetic_report(2, 4, 2, false).unwrap();
        assert!(routing_curves(&dense.traces).unwrap().is_none());
        assert!(dense.curves.routing.is_none());
        let mut mixed = synthetic_moe_report(2, 4, 2, false).unwrap().traces;
        mixed[1].routing = None;
        let err = routing_curves(&mixed).unwrap_err().to_string();
        assert!(err.contains("trace routing"), "{err}");
        let mut other = synthetic_moe_report(2, 4, 2, false).unwrap().traces;
        if let Some(r) = other[1].routing.as_mut() {
            r.overlap = Some(RoutingOverlap {
                policy: "speed:1".into(),
                overlap: Tensor2::filled(r.entropy.shape(), 1.0),
            });
        }
        let err = routing_curves(&other).unwrap_err().to_string();
        assert!(err.contains("speed:1"), "{err}");
    }

    #[test]
    fn shards_of_a_moe_run_merge_into_the_whole_run_s_routing() {
        let whole = synthetic_moe_report(5, 4, 2, false).unwrap();
        let shards: Vec<lcut_trace::Report> = (0..2)
            .map(|i| {
                let mut settings = whole.settings.clone();
                settings.shard = Some((i, 2));
                let mine = whole
                    .traces
                    .iter()
                    .filter(|t| t.index % 2 == i)
                    .cloned()
                    .collect();
                crate::build_report("synthetic", whole.model.clone(), settings, mine, None).unwrap()
            })
            .collect();
        assert_ne!(shards[0].curves.routing, whole.curves.routing);
        let merged = crate::merge(shards).unwrap();
        assert_eq!(merged.curves.routing, whole.curves.routing);
    }

    #[test]
    fn overlap_totals_pool_finite_values() {
        let mut t = OverlapTotals::default();
        assert_eq!(t.mean(), None);
        t.add(&Tensor2::new([1, 3], vec![1.0, 0.5, f32::NAN]).unwrap());
        t.add(&Tensor2::new([1, 1], vec![0.0]).unwrap());
        assert_eq!(t.count, 3);
        assert_eq!(t.mean(), Some(0.5));
    }

    #[test]
    fn a_report_written_without_routing_reads_as_a_dense_one() {
        let moe = synthetic_moe_report(2, 4, 2, true).unwrap();
        let mut json = serde_json::to_value(&moe).unwrap();
        // what a report of an older lcut holds: no routing anywhere
        json["curves"].as_object_mut().unwrap().remove("routing");
        for t in json["traces"].as_array_mut().unwrap() {
            t.as_object_mut().unwrap().remove("routing");
        }
        for p in json["sweep"]["points"].as_array_mut().unwrap() {
            p.as_object_mut().unwrap().remove("routing_overlap");
        }
        let old: lcut_trace::Report = serde_json::from_value(json).unwrap();
        old.validate("old report").unwrap();
        assert!(old.curves.routing.is_none());
        assert!(old.traces.iter().all(|t| t.routing.is_none()));
        let sweep = old.sweep.as_ref().unwrap();
        assert!(sweep.points.iter().all(|p| p.routing_overlap.is_none()));
        // and its curves are what the dense traces aggregate to
        let again = crate::aggregate(&old.traces).unwrap();
        assert_eq!(again, old.curves);
    }
}
