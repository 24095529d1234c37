//! The KV cost model: bytes of K/V a policy keeps for a sequence.

use serde::{Deserialize, Serialize};

use crate::phases::TokenPhases;
use crate::policy::Policy;
use crate::slim::SlimParams;
use crate::window::LayerWindows;

/// What one token's K/V costs at one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvShape {
    /// Depth of the model.
    pub num_layers: usize,
    /// Number of key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Bytes of one element of the cache dtype.
    pub dtype_bytes: usize,
}

impl KvShape {
    /// Bytes of one token's K and V at one layer: 2 * n_kv_heads * head_dim * bytes.
    pub fn bytes_per_token_layer(&self) -> usize {
        2 * self.num_kv_heads * self.head_dim * self.dtype_bytes
    }
}

/// Token counts of one sequence by phase, and what the policy keeps of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCost {
    /// Anchor tokens |A|.
    pub anchors: usize,
    /// Non-anchor prompt tokens before the decode start, P.
    pub prefill: usize,
    /// Decode-phase tokens held, D (generation prompt and generated tokens).
    pub decode: usize,
}

impl KvCost {
    /// Token-layer slots the policy keeps, summed over layers: what its
    /// [`crate::Visibility`] holds for a prompt of these phases on a model
    /// without sliding windows.
    ///
    /// For SPEED this is `L_cut * P + L * (|A| + D)`; for the full model
    /// `L * (|A| + P + D)`.
    pub fn token_layers(&self, policy: &Policy) -> usize {
        policy
            .visibility(self.phases())
            .accounting()
            .held_token_layers(self.decode)
    }

    /// Bytes of K/V the policy keeps for this sequence on a model whose
    /// layers slide as `windows` says (empty: none does): a windowed layer
    /// holds at most its window's rows ([`crate::window`]), so on such a
    /// model the full model's K/V, and what a cut saves of it, are mostly
    /// its global layers'.
    pub fn bytes(&self, policy: &Policy, shape: &KvShape, windows: &LayerWindows) -> u64 {
        let kv_heads = shape.num_kv_heads.max(1);
        let per_head_row = (shape.bytes_per_token_layer() / kv_heads) as u64;
        let rows = policy
            .visibility(self.phases())
            .accounting()
            .held_head_rows_windowed(self.decode, kv_heads, windows);
        rows as u64 * per_head_row
    }

    fn phases(&self) -> TokenPhases {
        TokenPhases::from_counts(self.anchors, self.prefill)
    }
}

impl KvCost {
    /// Token-layer slots SlimInfer holds when cut i keeps `kept[i]` prunable
    /// tokens (sink excluded): `c_1·P + Σ_i (c_{i+1} − c_i)·P_i + L·(A + D)`.
    pub fn slim_token_layers(
        &self,
        params: &SlimParams,
        num_layers: usize,
        kept: &[usize],
    ) -> usize {
        let cuts = params.cuts();
        let upper: usize = kept
            .iter()
            .enumerate()
            .take(cuts.len())
            .map(|(i, p_i)| (cuts.get(i + 1).copied().unwrap_or(num_layers) - cuts[i]) * p_i)
            .sum();
        cuts[0] * self.prefill + upper + num_layers * (self.anchors + self.decode)
    }

    /// SlimInfer's held K/V predicted with whole kept blocks
    /// ([`SlimParams::predicted_kept_tokens`]), in bytes.
    pub fn slim_predicted_bytes(&self, params: &SlimParams, shape: &KvShape) -> u64 {
        let kept = params.predicted_kept_tokens(self.prefill, self.anchors + self.prefill);
        self.slim_token_layers(params, shape.num_layers, &kept) as u64
            * shape.bytes_per_token_layer() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Anchors, PolicyKind};

    #[test]
    fn speed_cost_is_the_paper_formula() {
        let shape = KvShape {
            num_layers: 32,
            num_kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        };
        let b = shape.bytes_per_token_layer() as u64;
        for (p, a, d, cut) in [
            (1023, 1, 128, 24),
            (100, 0, 5, 1),
            (7, 3, 0, 31),
            (4096, 1, 1, 32),
        ] {
            let cost = KvCost {
                anchors: a,
                prefill: p,
                decode: d,
            };
            let speed = Policy::new(PolicyKind::Speed, cut, 32, Anchors::Bos).unwrap();
            let full = Policy::full(32);
            let formula = b * (cut as u64 * p as u64 + 32 * (a + d) as u64);
            assert_eq!(cost.bytes(&speed, &shape, &[]), formula);
            assert_eq!(cost.bytes(&full, &shape, &[]), b * 32 * (a + p + d) as u64);
        }
    }

    #[test]
    fn a_windowed_layer_holds_its_window_whatever_the_policy_keeps() {
        // five layers sliding over 8 positions, the sixth global; BoS, 100
        // prefill tokens, 3 decode-phase tokens: 104 positions, of which a
        // sliding layer holds the last 7 (97..104)
        let shape = KvShape {
            num_layers: 6,
            num_kv_heads: 2,
            head_dim: 4,
            dtype_bytes: 2,
        };
        let row = 2 * 4 * 2;
        let windows = [Some(8), Some(8), Some(8), Some(8), Some(8), None];
        let cost = KvCost {
            anchors: 1,
            prefill: 100,
            decode: 3,
        };
        let full = Policy::full(6);
        let speed = Policy::new(PolicyKind::Speed, 3, 6, Anchors::Bos).unwrap();
        // full: 5 x 7 window rows + 104 global rows, per K/V head
        assert_eq!(cost.bytes(&full, &shape, &windows), 2 * row * (5 * 7 + 104));
        // SPEED at 3: three lower layers hold their window (7 each); the two
        // sliding layers above hold the decode-phase rows in the window (3
        // each, BoS has left it); the global layer BoS and the 3 decode rows
        assert_eq!(
            cost.bytes(&speed, &shape, &windows),
            2 * row * (3 * 7 + 2 * 3 + 4)
        );
        // of the 108 rows per head saved, 100 are the global layer's prompt;
        // a window-blind count would have SPEED save 300 rows of 624
        assert_eq!(cost.bytes(&full, &shape, &[]), 2 * row * 6 * 104);
        assert_eq!(cost.bytes(&speed, &shape, &[]), 2 * row * (3 * 100 + 6 * 4));
    }

    #[test]
    fn paper_memory_example() {
        // 1,024-token prompt (BoS + 1,023) + 128 new tokens at 24/32, bf16: ~0.109 GiB
        let shape = KvShape {
            num_layers: 32,
            num_kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        };
        let cost = KvCost {
            anchors: 1,
            prefill: 1023,
            decode: 128,
        };
        let speed = Policy::new(PolicyKind::Speed, 24, 32, Anchors::Bos).unwrap();
        let gib = cost.bytes(&speed, &shape, &[]) as f64 / (1u64 << 30) as f64;
        assert!((gib - 0.109).abs() < 0.002, "{gib}");
    }

    #[test]
    fn slim_cost_model_reproduces_the_papers_table_2() {
        // LLaMA-3.1-8B in bf16 (b·L = 128 KiB), slim:paper = 10/20/30 keeping
        // 8K/4K/2K with a 64-token sink, no decode tokens
        let shape = KvShape {
            num_layers: 32,
            num_kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        };
        assert_eq!(shape.bytes_per_token_layer() * 32, 128 * 1024);
        let spec: crate::PolicySpec = "slim:paper".parse().unwrap();
        let policy = spec.resolve(32).unwrap();
        let params = policy.slim().unwrap();
        let full = Policy::full(32);
        for (k, expected) in [(8, 0.797), (16, 0.555), (24, 0.474), (32, 0.434)] {
            let cost = KvCost {
                anchors: 64,
                prefill: k * 1024 - 64,
                decode: 0,
            };
            let ratio = cost.slim_predicted_bytes(params, &shape) as f64
                / cost.bytes(&full, &shape, &[]) as f64;
            assert!((ratio - expected).abs() < 5e-4, "{k}K: {ratio}");
        }
    }

    #[test]
    fn slim_that_keeps_nothing_costs_what_speed_costs() {
        let shape = KvShape {
            num_layers: 12,
            num_kv_heads: 2,
            head_dim: 16,
            dtype_bytes: 4,
        };
        let spec: crate::PolicySpec = "slim:5@1+block:1+unit:1".parse().unwrap();
        let params = *spec.resolve(12).unwrap().slim().unwrap();
        let speed = Policy::new(PolicyKind::Speed, 5, 12, Anchors::Bos).unwrap();
        let cost = KvCost {
            anchors: 1,
            prefill: 300,
            decode: 9,
        };
        assert_eq!(
            cost.slim_predicted_bytes(&params, &shape),
            cost.bytes(&speed, &shape, &[])
        );
        assert_eq!(params.equal_kv_cutoff(12, 300, &[0]), 5.0);
        assert_eq!(params.equal_kv_cutoff(12, 300, &[300]), 12.0);
    }
}
