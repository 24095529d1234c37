//! How a mixture-of-experts model routes its decode tokens, as a trace
//! records it per prompt ([`RoutingTrace`]) and a report aggregates it per
//! layer ([`RoutingCurves`]).
//!
//! Only the sparse layers (those whose MLP is a mixture of experts) route;
//! only decode steps are recorded (the rows of the trace's
//! `query_positions`: the tokens whose outputs are the generated tokens).
//! A dense model's traces and curves have no routing, and a report written
//! before routing was recorded reads as one without it.
//!
//! - **Entropy**: the router's softmax over all `E` experts, `H = -Σ p ln p`,
//!   divided by `ln E`: 0 when one expert takes everything, 1 when every
//!   expert is equally likely.
//! - **Load**: per layer, the share of the decode tokens' top-k slots each
//!   expert takes (a row sums to 1 over the experts).
//! - **Overlap**: under a policy, teacher-forced on the same tokens as the
//!   full model, `|chosen_policy ∩ chosen_full| / k` per token and layer
//!   (1: the policy runs the same experts).

use serde::{Deserialize, Serialize};

use crate::floats::Series;
use crate::tensor::Tensor2;

/// The routing of one prompt's decode steps at every sparse layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingTrace {
    /// Experts in each sparse layer (`E`).
    pub num_experts: usize,
    /// Experts each token runs (`k`).
    pub top_k: usize,
    /// The sparse layers, ascending: row `i` of the tensors is layer `layers[i]`.
    pub layers: Vec<usize>,
    /// `[layers, steps]`: the router's entropy normalised by `ln E`, in `[0, 1]`.
    pub entropy: Tensor2,
    /// `[layers, steps, k]` row-major: the experts each step runs, most
    /// probable first.
    pub experts: Vec<u32>,
    /// How far a policy's routing of the same tokens departs from the full
    /// model's, when the run compared one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<RoutingOverlap>,
}

/// A policy's top-k overlap with the full model on one prompt's decode steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingOverlap {
    /// The policy compared with the full model, as written.
    pub policy: String,
    /// `[layers, steps]`: `|chosen_policy ∩ chosen_full| / k`, teacher-forced
    /// on the same tokens (rows as [`RoutingTrace::layers`]).
    pub overlap: Tensor2,
}

impl RoutingTrace {
    /// Decode steps recorded.
    pub fn num_steps(&self) -> usize {
        self.entropy.shape()[1]
    }

    /// The experts step `step` runs at the sparse layer of row `row`.
    pub fn chosen(&self, row: usize, step: usize) -> &[u32] {
        let k = self.top_k;
        let at = (row * self.num_steps() + step) * k;
        self.experts.get(at..at + k).unwrap_or(&[])
    }

    /// Checks the shapes and values against a model of `num_layers` layers
    /// and a trace of `steps` decode steps: layers ascending and inside the
    /// model, `1 <= k <= E`, one entropy and `k` distinct experts below `E`
    /// per layer and step, entropies in `[0, 1]` (or NaN), overlaps in
    /// `[0, 1]`.
    pub fn check(&self, num_layers: usize, steps: usize) -> Result<(), String> {
        let (e, k, n) = (self.num_experts, self.top_k, self.layers.len());
        if k == 0 || k > e {
            return Err(format!(
                "routing chooses `top_k` {k} of `num_experts` {e}, expected 1..={e}"
            ));
        }
        if self.layers.windows(2).any(|w| w[0] >= w[1])
            || self.layers.last().is_some_and(|&l| l >= num_layers)
        {
            return Err(format!(
                "routing `layers` {:?} must rise strictly inside the model's {num_layers} layers",
                self.layers
            ));
        }
        if self.entropy.shape() != [n, steps] {
            return Err(format!(
                "routing `entropy` has shape {:?}, expected [sparse layers, steps] = {:?}",
                self.entropy.shape(),
                [n, steps]
            ));
        }
        let want = n.checked_mul(steps).and_then(|x| x.checked_mul(k));
        if want != Some(self.experts.len()) {
            return Err(format!(
                "routing `experts` has {} entries, expected sparse layers × steps × top_k = {n} × {steps} × {k}",
                self.experts.len()
            ));
        }
        if let Some(&bad) = self.experts.iter().find(|&&x| x as usize >= e) {
            return Err(format!(
                "routing `experts` holds expert {bad}, the layers have {e}"
            ));
        }
        for row in 0..n {
            for step in 0..steps {
                let c = self.chosen(row, step);
                if (1..c.len()).any(|i| c[..i].contains(&c[i])) {
                    return Err(format!(
                        "routing `experts` chooses an expert twice at layer {}, step {step}: {c:?}",
                        self.layers[row]
                    ));
                }
            }
        }
        if !unit_or_nan(self.entropy.data()) {
            return Err("routing `entropy` must lie in [0, 1] (normalised by ln E)".into());
        }
        if let Some(o) = &self.overlap {
            if o.overlap.shape() != [n, steps] {
                return Err(format!(
                    "routing `overlap` has shape {:?}, expected [sparse layers, steps] = {:?}",
                    o.overlap.shape(),
                    [n, steps]
                ));
            }
            if !unit_or_nan(o.overlap.data()) {
                return Err("routing `overlap` must lie in [0, 1]".into());
            }
        }
        Ok(())
    }

    /// Bytes its vectors hold on the heap.
    pub fn heap_bytes(&self) -> usize {
        8 * self.layers.capacity()
            + 4 * self.entropy.data().len()
            + 4 * self.experts.capacity()
            + self
                .overlap
                .as_ref()
                .map_or(0, |o| o.policy.capacity() + 4 * o.overlap.data().len())
    }
}

/// Whether every value is in `[0, 1]` or NaN (allowing rounding of 1e-5).
fn unit_or_nan(values: &[f32]) -> bool {
    values
        .iter()
        .all(|&x| x.is_nan() || (-1e-5..=1.0 + 1e-5).contains(&x))
}

/// Routing of a run's decode tokens aggregated per layer, pooled over every
/// decode token of every prompt (each token counts once).
///
/// Per-layer series have `num_layers` entries, NaN at the dense layers
/// (which route nothing); `load` has one row per layer, NaN at the dense
/// ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingCurves {
    /// Experts in each sparse layer (`E`).
    pub num_experts: usize,
    /// Experts each token runs (`k`).
    pub top_k: usize,
    /// The sparse layers, ascending.
    pub sparse_layers: Vec<usize>,
    /// Decode tokens routed at each sparse layer, over all prompts.
    pub tokens: usize,
    /// Mean normalised router entropy per layer, in `[0, 1]`.
    pub entropy: Series,
    /// `[num_layers, E]`: the share of the decode tokens' top-k slots each
    /// expert takes at each layer (rows of sparse layers sum to 1).
    pub load: Tensor2,
    /// Mean top-k overlap per layer of [`RoutingCurves::policy`]'s routing
    /// with the full model's; empty when the run compared none.
    #[serde(default)]
    pub overlap: Series,
    /// The policy the overlap compares with the full model, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

impl RoutingCurves {
    /// Checks the shapes against a model of `num_layers` layers: `1 <= k <= E`,
    /// sparse layers inside the model, `entropy` `L` long, `load` `[L, E]`,
    /// `overlap` `L` long with a policy named, or empty without one.
    pub fn check(&self, num_layers: usize) -> Result<(), String> {
        let (e, k) = (self.num_experts, self.top_k);
        if k == 0 || k > e {
            return Err(format!(
                "`curves.routing` chooses `top_k` {k} of `num_experts` {e}, expected 1..={e}"
            ));
        }
        if self.sparse_layers.windows(2).any(|w| w[0] >= w[1])
            || self.sparse_layers.last().is_some_and(|&l| l >= num_layers)
        {
            return Err(format!(
                "`curves.routing.sparse_layers` {:?} must rise strictly inside the model's {num_layers} layers",
                self.sparse_layers
            ));
        }
        if self.entropy.len() != num_layers {
            return Err(format!(
                "`curves.routing.entropy` has {} entries, expected {num_layers}",
                self.entropy.len()
            ));
        }
        if self.load.shape() != [num_layers, e] {
            return Err(format!(
                "`curves.routing.load` has shape {:?}, expected [num_layers, num_experts] = {:?}",
                self.load.shape(),
                [num_layers, e]
            ));
        }
        match (self.overlap.len(), &self.policy) {
            (0, None) => Ok(()),
            (n, Some(_)) if n == num_layers => Ok(()),
            (n, p) => Err(format!(
                "`curves.routing.overlap` has {n} entries and policy {p:?}: expected {num_layers} \
                 entries with a policy, or none without one"
            )),
        }
    }

    /// Whether layer `layer` routes (its MLP is a mixture of experts).
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.binary_search(&layer).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> RoutingTrace {
        RoutingTrace {
            num_experts: 4,
            top_k: 2,
            layers: vec![0, 2],
            entropy: Tensor2::new([2, 3], vec![0.5, 0.2, 0.9, 0.1, 0.0, 1.0]).unwrap(),
            experts: vec![0, 1, 2, 3, 1, 0, 3, 2, 0, 2, 1, 3],
            overlap: Some(RoutingOverlap {
                policy: "speed:1+bos".into(),
                overlap: Tensor2::filled([2, 3], 0.5),
            }),
        }
    }

    #[test]
    fn a_valid_trace_checks_and_names_what_is_wrong() {
        let t = trace();
        t.check(3, 3).unwrap();
        assert_eq!(t.chosen(1, 2), &[1, 3]);
        // a way to break the trace, and what the message must name
        type Breaker = fn(&mut RoutingTrace);
        let cases: [(Breaker, &str); 6] = [
            (|t| t.top_k = 5, "top_k"),
            (|t| t.layers = vec![2, 0], "layers"),
            (|t| t.experts[3] = 4, "expert 4"),
            (|t| t.experts[1] = 0, "twice"),
            (|t| t.entropy = Tensor2::filled([2, 3], 1.5), "entropy"),
            (|t| t.experts.pop().map_or((), |_| ()), "experts"),
        ];
        for (break_it, named) in cases {
            let mut t = trace();
            break_it(&mut t);
            let msg = t.check(3, 3).unwrap_err();
            assert!(msg.contains(named), "{named}: {msg}");
        }
        assert!(trace().check(2, 3).unwrap_err().contains("layers"));
        assert!(trace().check(3, 4).unwrap_err().contains("entropy"));
    }

    #[test]
    fn a_trace_without_overlap_reads_from_json_without_the_field() {
        let mut t = trace();
        t.overlap = None;
        let json = serde_json::to_value(&t).unwrap();
        assert!(json.get("overlap").is_none());
        let back: RoutingTrace = serde_json::from_value(json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn curves_check_their_shapes() {
        let c = RoutingCurves {
            num_experts: 4,
            top_k: 2,
            sparse_layers: vec![0, 2],
            tokens: 3,
            entropy: Series(vec![0.5, f32::NAN, 0.4]),
            load: Tensor2::filled([3, 4], 0.25),
            overlap: Series(vec![1.0, f32::NAN, 0.5]),
            policy: Some("speed:1+bos".into()),
        };
        c.check(3).unwrap();
        assert!(c.is_sparse(2) && !c.is_sparse(1));
        let mut bad = c.clone();
        bad.policy = None;
        assert!(bad.check(3).unwrap_err().contains("overlap"));
        let mut bad = c.clone();
        bad.load = Tensor2::filled([3, 3], 0.25);
        assert!(bad.check(3).unwrap_err().contains("load"));
        assert!(c.check(2).is_err());
    }
}
