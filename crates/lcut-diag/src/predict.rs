//! What a policy should cost, predicted from one sequence's
//! [`Visibility`] alone: prefill FLOPs (the TTFT prediction), the bytes one
//! decode step reads (the TPOT prediction) and the K/V held. The measured
//! ratios of `lcut bench` and `lcut paper` are set beside these.
//!
//! - Prefill: layer `l` runs the prompt tokens that exist there (`W` FLOPs
//!   each, [`FlopShape::token_layer_flops`]) and their attention over the
//!   keys each reads (`2·2·H·h` per key); a token whose K/V a layer keeps
//!   without the token existing there (projected K/V, SwiftKV and POP)
//!   costs that layer its K and V projections, `2·2·d·(H_kv·h)`.
//! - Decode: one step reads every weight once and the K/V decode reads
//!   ([`lcut_policy::KvAccounting::resident_head_rows_windowed`]); small models on a CPU and
//!   every model at long context are bound by these bytes, so the step's
//!   time follows them. The mean over a run's steps is taken (resident
//!   K/V grows by one token per step).
//! - K/V held: [`lcut_policy::KvAccounting::held_head_rows_windowed`] after the
//!   run (per K/V head, so a policy whose heads keep different rows is counted
//!   exactly).
//!
//! A sliding-window layer ([`FlopShape::windows`]) holds and reads at most
//! its window's rows, and its prefill queries read at most its window of
//! keys: on a model whose layers mostly slide (Gemma 3: five in six), what a
//! cut saves is mostly its global layers' share.

use lcut_policy::Visibility;

use crate::flops::{FlopShape, policy_prefill_flops};

/// A policy's predicted costs for one run (prompt, then new tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictedCost {
    /// Prefill matmul FLOPs (the LM head of the last prompt token included).
    pub prefill_flops: f64,
    /// Mean bytes one decode step reads: weights and resident K/V.
    pub decode_step_bytes: f64,
    /// K/V bytes held at the end of the run.
    pub kv_held_bytes: f64,
}

/// Byte sizes the decode prediction needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ByteSizes {
    /// Bytes of every weight a decode step reads (the model as loaded).
    pub weights: f64,
    /// Bytes of one token's K and V at one layer.
    pub kv_per_token_layer: f64,
}

/// The predicted costs of a run of `vis`'s prompt (`prompt_len` tokens,
/// the decode phase from its decode start) followed by `new_tokens` new
/// tokens.
pub fn predict_cost(
    shape: &FlopShape,
    bytes: ByteSizes,
    vis: &dyn Visibility,
    prompt_len: usize,
    new_tokens: usize,
) -> PredictedCost {
    // decode-phase tokens in the caches: the prompt's, then one more per
    // step (the last new token is produced, never fed)
    let in_prompt = prompt_len - vis.phases().decode_start().min(prompt_len);
    let fed = |new: usize| in_prompt + new.saturating_sub(1);
    let counts = vis.accounting();
    let kv_heads = shape.num_kv_heads.max(1);
    let per_head_row = bytes.kv_per_token_layer / kv_heads as f64;
    let windows = &shape.windows;
    let resident =
        |d: usize| counts.resident_head_rows_windowed(d, kv_heads, windows) as f64 * per_head_row;
    // the steps after the first feed new tokens 1 .. new - 1
    let (first, last) = (fed(2), fed(new_tokens.max(2)));
    PredictedCost {
        prefill_flops: policy_prefill_flops(shape, vis, prompt_len),
        decode_step_bytes: bytes.weights + (resident(first) + resident(last)) / 2.0,
        kv_held_bytes: counts.held_head_rows_windowed(fed(new_tokens), kv_heads, windows) as f64
            * per_head_row,
    }
}

impl PredictedCost {
    /// Each cost over `full`'s: (TTFT, TPOT, K/V) predictions.
    pub fn ratios(&self, full: &PredictedCost) -> (f64, f64, f64) {
        let over = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        (
            over(self.prefill_flops, full.prefill_flops),
            over(self.decode_step_bytes, full.decode_step_bytes),
            over(self.kv_held_bytes, full.kv_held_bytes),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flops::{PromptSplit, prefill_flops};
    use lcut_policy::{Anchors, Policy, PolicyKind, TokenPhases};

    fn shape() -> FlopShape {
        crate::flops::tests::tiny()
    }

    fn vis(kind: PolicyKind, cut: usize, anchors: Anchors, len: usize) -> Box<dyn Visibility> {
        let policy = Policy::new(kind, cut, 4, anchors).unwrap();
        let a = usize::from(anchors == Anchors::Bos);
        policy.visibility(TokenPhases::new(len, len - 1, a).unwrap())
    }

    #[test]
    fn prefill_flops_equal_the_closed_form_for_full_and_speed() {
        let s = shape();
        for cut in 1..=4 {
            let v = vis(PolicyKind::Speed, cut, Anchors::Bos, 9);
            let closed = prefill_flops(&s, cut, PromptSplit::raw(9, 1));
            assert_eq!(policy_prefill_flops(&s, v.as_ref(), 9), closed, "cut {cut}");
        }
        let full = Policy::full(4).visibility(TokenPhases::raw_prompt(9, 0).unwrap());
        assert_eq!(
            policy_prefill_flops(&s, full.as_ref(), 9),
            prefill_flops(&s, 4, PromptSplit::raw(9, 0))
        );
    }

    #[test]
    fn speed_saves_decode_bytes_and_kv_in_proportion() {
        let s = shape();
        let bytes = ByteSizes {
            weights: 0.0,
            kv_per_token_layer: 16.0,
        };
        let full = Policy::full(4).visibility(TokenPhases::new(101, 100, 1).unwrap());
        let speed = vis(PolicyKind::Speed, 2, Anchors::Bos, 101);
        let (f, p) = (
            predict_cost(&s, bytes, full.as_ref(), 101, 3),
            predict_cost(&s, bytes, speed.as_ref(), 101, 3),
        );
        // held after 3 new tokens (2 fed): full 4·(101 + 2); SPEED at 2 keeps
        // BoS, the last prompt token and the 2 fed tokens at every layer and
        // the 99 prefill tokens below the cut: 2·99 + 4·(1 + 1 + 2)
        assert_eq!(f.kv_held_bytes, 16.0 * 4.0 * 103.0);
        assert_eq!(p.kv_held_bytes, 16.0 * (2.0 * 99.0 + 4.0 * 4.0));
        let (ttft, tpot, kv) = p.ratios(&f);
        assert!(ttft < 0.6 && tpot < 0.6 && kv < 0.6, "{ttft} {tpot} {kv}");
        // weights dominate: the decode prediction approaches 1
        let heavy = ByteSizes {
            weights: 1e9,
            ..bytes
        };
        let (_, tpot, _) = predict_cost(&s, heavy, speed.as_ref(), 101, 3).ratios(&predict_cost(
            &s,
            heavy,
            full.as_ref(),
            101,
            3,
        ));
        assert!(tpot > 0.999, "{tpot}");
    }

    #[test]
    fn on_a_windowed_model_speed_saves_the_global_layers_share() {
        // tiny's 4 layers, the lower three sliding over 8 keys; BoS, 99
        // prefill tokens and the last prompt token, then 3 new tokens (2 fed)
        let s = FlopShape {
            windows: vec![Some(8), Some(8), Some(8), None],
            layers: Vec::new(),
            ..shape()
        };
        let bytes = ByteSizes {
            weights: 0.0,
            kv_per_token_layer: 16.0,
        };
        let row = 16.0 / s.num_kv_heads as f64;
        let full = Policy::full(4).visibility(TokenPhases::new(101, 100, 1).unwrap());
        let speed = vis(PolicyKind::Speed, 2, Anchors::Bos, 101);
        let (f, p) = (
            predict_cost(&s, bytes, full.as_ref(), 101, 3),
            predict_cost(&s, bytes, speed.as_ref(), 101, 3),
        );
        // 103 positions: a sliding layer holds the last 7; the global one all
        assert_eq!(f.kv_held_bytes, row * (3.0 * 7.0 + 103.0));
        // SPEED at 2: two sliding layers below the cut (7 each), one above
        // holding the 3 decode-phase rows in its window (BoS has left it),
        // the global layer BoS and the 3 decode-phase rows
        assert_eq!(p.kv_held_bytes, row * (2.0 * 7.0 + 3.0 + 4.0));
        let (_, tpot, kv) = p.ratios(&f);
        let blind = |v: &dyn Visibility| {
            let s = FlopShape {
                windows: Vec::new(),
                layers: Vec::new(),
                ..shape()
            };
            predict_cost(&s, bytes, v, 101, 3)
        };
        let (_, blind_tpot, blind_kv) = blind(speed.as_ref()).ratios(&blind(full.as_ref()));
        // window-blind, SPEED at half the depth holds about half; on the
        // windowed model it drops the global layer's prompt, most of what
        // the full model holds
        assert!((blind_kv - 0.52).abs() < 0.01, "{blind_kv}");
        assert!((kv - 21.0 / 124.0).abs() < 1e-9, "{kv}");
        assert!(tpot < blind_tpot, "{tpot} {blind_tpot}");
    }

    #[test]
    fn selfonly_keeps_less_than_speed_above_the_cut() {
        // above the cut SelfOnly keeps the anchors' K/V alone, SPEED also
        // the decode phase's
        let s = shape();
        let bytes = ByteSizes {
            weights: 100.0,
            kv_per_token_layer: 8.0,
        };
        let speed = vis(PolicyKind::Speed, 3, Anchors::Bos, 40);
        let selfonly = vis(PolicyKind::SelfOnly, 3, Anchors::Bos, 40);
        let a = predict_cost(&s, bytes, speed.as_ref(), 40, 5);
        let b = predict_cost(&s, bytes, selfonly.as_ref(), 40, 5);
        // one upper layer, 1 prompt and 4 fed decode-phase tokens
        assert_eq!(a.kv_held_bytes - b.kv_held_bytes, 8.0 * 5.0);
        assert!(b.decode_step_bytes < a.decode_step_bytes);
    }
}
