//! A matmul FLOP model of prefill, full depth against SPEED.
//!
//! One multiply-add is 2 FLOPs. With width `d`, `H` query heads, `H_kv` KV
//! heads, head width `h`, MLP width `I`:
//!
//! - projections per token per layer:
//!   `W = 2·d·(H·h) [q] + 2·2·d·(H_kv·h) [k, v] + 2·(H·h)·d [o] + 3·2·d·I [gated MLP]`;
//! - attention per query per layer that sees `n` keys: `2·2·H·h·n` (scores and
//!   the weighted sum of values); a causal query at position `i` sees `i + 1`;
//! - the LM head once, for the last prompt token: `2·d·V`.
//!
//! The prompt splits into `A` anchors, `P` prefill tokens and `D` decode-phase
//! prompt tokens (`D >= 1`: the last prompt token starts the decode phase for a
//! raw prompt). With `N = A + P + D`:
//!
//! - full: `L · (N·W + 2·H·h·N·(N + 1)) + 2·d·V`;
//! - SPEED at `L_cut`: the lower `L_cut` layers as full; each upper layer runs
//!   only the `A + D` anchor and decode-phase tokens, `(A + D)·W` plus attention
//!   `2·2·H·h·(A(A + 1)/2 + D·A + D(D + 1)/2)` (anchors see earlier anchors,
//!   decode-phase tokens see the anchors and earlier decode-phase tokens).
//! - projected prompt K/V (SwiftKV, POP) at `C`: the lower `C` layers as
//!   full; each upper layer runs the `A + D` anchor and decode-phase tokens,
//!   `(A + D)·W`, projects the K/V of the `P` prompt tokens, `2·2·d·(H_kv·h)·P`,
//!   and attends `2·2·H·h·(A(A + 1)/2 + D·(A + P) + D(D + 1)/2)` (the
//!   decode-phase tokens read the projected keys too).
//!
//! Norms, RoPE, softmax and embeddings are left out (linear in `N`, small).
//!
//! Models whose layers differ (Gemma 4's sliding and full layers of other
//! head widths and shared K/V, Qwen3.5's linear-attention layers, experts
//! of which a token runs its top k) give each layer its own `W`, per-key
//! attention cost and K/V projection ([`FlopShape::layers`], made by
//! `lcut_model::memory::layer_flops`); the sums above then run layer by
//! layer, and a layer that reads no key (a linear-attention layer) adds
//! no attention term.
//!
//! A sliding-window layer (window `w`, [`FlopShape::windows`]) lets a query
//! read only its last `w` keys: [`policy_prefill_flops`] counts its key
//! visits within the window (`Σ_q min(q + 1, w)` for a layer every token
//! runs), which is what a windowed model's prefill really computes; the
//! closed forms above ([`prefill_flops`], [`layered_prefill_flops`]) are the
//! window-free model's.

use lcut_policy::Visibility;
use lcut_policy::keys::LayerKeys;
use lcut_policy::window::{causal_pairs, window_of};
use lcut_trace::{LayerFlops, ModelIdentity};

/// The model dimensions the FLOP model needs.
#[derive(Debug, Clone, PartialEq)]
pub struct FlopShape {
    /// Number of layers L.
    pub num_layers: usize,
    /// Residual width d.
    pub hidden_size: usize,
    /// Query heads H.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// MLP width I (gated MLP: three d × I matrices).
    pub intermediate_size: usize,
    /// Vocabulary size V.
    pub vocab_size: usize,
    /// Each layer's sliding window (empty: no layer slides).
    pub windows: Vec<Option<usize>>,
    /// Each layer's own coefficients, where the layers differ (empty: every
    /// layer is the uniform shape above; see [`FlopShape::layer`]).
    pub layers: Vec<LayerFlops>,
}

impl From<&ModelIdentity> for FlopShape {
    fn from(m: &ModelIdentity) -> Self {
        Self {
            num_layers: m.num_layers,
            hidden_size: m.hidden_size,
            num_heads: m.num_heads,
            num_kv_heads: m.num_kv_heads,
            head_dim: m.head_dim,
            intermediate_size: m.intermediate_size,
            vocab_size: m.vocab_size,
            windows: m.sliding_window.clone(),
            layers: m.layer_flops.clone(),
        }
    }
}

/// The prompt's tokens by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptSplit {
    /// Anchor tokens A (kept at every layer).
    pub anchors: usize,
    /// Prefill tokens P (only the lower `L_cut` layers under SPEED).
    pub prefill: usize,
    /// Decode-phase prompt tokens D (every layer).
    pub decode: usize,
}

impl PromptSplit {
    /// A raw prompt of `prompt_len` tokens: `anchors` anchors, the last token
    /// decode-phase, the rest prefill.
    pub fn raw(prompt_len: usize, anchors: usize) -> Self {
        let decode = usize::from(prompt_len > anchors);
        Self {
            anchors: anchors.min(prompt_len),
            prefill: prompt_len.saturating_sub(anchors + decode),
            decode,
        }
    }
}

impl FlopShape {
    /// Projection and MLP FLOPs of one token through one layer (`W` above).
    pub fn token_layer_flops(&self) -> f64 {
        let (d, q, kv, i) = (
            self.hidden_size as f64,
            (self.num_heads * self.head_dim) as f64,
            (self.num_kv_heads * self.head_dim) as f64,
            self.intermediate_size as f64,
        );
        2.0 * d * q + 4.0 * d * kv + 2.0 * q * d + 6.0 * d * i
    }

    /// K and V projection FLOPs of one token at one layer, `2·2·d·(H_kv·h)`:
    /// what a layer spends on a token whose K/V it keeps projected.
    pub fn kv_projection_flops(&self) -> f64 {
        4.0 * self.hidden_size as f64 * (self.num_kv_heads * self.head_dim) as f64
    }

    /// One query reading one key, `2·2·H·h`.
    fn per_key_flops(&self) -> f64 {
        4.0 * (self.num_heads * self.head_dim) as f64
    }

    fn attention(&self, key_visits: f64) -> f64 {
        self.per_key_flops() * key_visits
    }

    /// Layer `l`'s coefficients (token, per key, K/V projection): its own
    /// where [`FlopShape::layers`] gives them, else the uniform shape's.
    pub fn layer(&self, l: usize) -> (f64, f64, f64) {
        match self.layers.get(l) {
            Some(c) => (c.token as f64, c.per_key as f64, c.kv_projection as f64),
            None => (
                self.token_layer_flops(),
                self.per_key_flops(),
                self.kv_projection_flops(),
            ),
        }
    }

    /// This shape with `layers` as its layers' own coefficients where any
    /// of them differs from the uniform shape's, else with none (so that a
    /// model of uniform layers keeps the closed forms and its records).
    pub fn with_layers(self, layers: Vec<LayerFlops>) -> Self {
        let differs = layers.len() != self.num_layers
            || layers.iter().enumerate().any(|(l, c)| {
                (c.token as f64, c.per_key as f64, c.kv_projection as f64) != self.layer(l)
            });
        match differs {
            true => Self { layers, ..self },
            false => Self {
                layers: Vec::new(),
                ..self
            },
        }
    }

    /// The FLOPs of layer `l` for `tokens` tokens present that read
    /// `key_visits` keys in all.
    fn layer_flops(&self, l: usize, tokens: f64, key_visits: f64) -> f64 {
        let (token, per_key, _) = self.layer(l);
        tokens * token + per_key * key_visits
    }

    /// The LM head's FLOPs for the last prompt token, `2·d·V`.
    fn lm_head(&self) -> f64 {
        2.0 * self.hidden_size as f64 * self.vocab_size as f64
    }
}

/// Prefill FLOPs of a prompt under SPEED at `l_cut` (`l_cut >= L` is the full
/// model); see the module doc for the formula.
pub fn prefill_flops(shape: &FlopShape, l_cut: usize, split: PromptSplit) -> f64 {
    let l = shape.num_layers;
    let cut = l_cut.min(l) as f64;
    let upper = (l - l_cut.min(l)) as f64;
    let (a, p, d) = (
        split.anchors as f64,
        split.prefill as f64,
        split.decode as f64,
    );
    let n = a + p + d;
    let full_visits = n * (n + 1.0) / 2.0;
    let upper_visits = a * (a + 1.0) / 2.0 + d * a + d * (d + 1.0) / 2.0;
    if !shape.layers.is_empty() {
        // layers of their own shapes: each counted alone
        let layers: f64 = (0..l)
            .map(|k| match k < l_cut {
                true => shape.layer_flops(k, n, full_visits),
                false => shape.layer_flops(k, a + d, upper_visits),
            })
            .sum();
        return layers + shape.lm_head();
    }
    let w = shape.token_layer_flops();
    let full_layer = n * w + shape.attention(full_visits);
    let upper_layer = (a + d) * w + shape.attention(upper_visits);
    cut * full_layer + upper * upper_layer + shape.lm_head()
}

/// Prefill FLOPs when layer `l` runs `tokens_per_layer[l]` tokens, each
/// reading every earlier token present there (SlimInfer's §4.5:
/// `Σ_l [n_l·W + 2·H·h·n_l·(n_l + 1)] + 2·d·V`).
pub fn layered_prefill_flops(shape: &FlopShape, tokens_per_layer: &[usize]) -> f64 {
    let layers: f64 = tokens_per_layer
        .iter()
        .enumerate()
        .map(|(l, &n)| {
            let n = n as f64;
            shape.layer_flops(l, n, n * (n + 1.0) / 2.0)
        })
        .sum();
    layers + shape.lm_head()
}

/// Prefill FLOPs of the first `len` tokens of `vis`'s sequence under its
/// policy, the LM head of the last one included: at each layer, `W` per
/// token that exists there, the attention of each such token over the
/// keys it reads there (within the layer's sliding window, if any), and
/// the K/V projections of each token whose K/V
/// the layer keeps without the token existing there (projected K/V,
/// SwiftKV and POP). Equal to [`layered_prefill_flops`] for a policy
/// whose present tokens read every earlier present key.
pub fn policy_prefill_flops(shape: &FlopShape, vis: &dyn Visibility, len: usize) -> f64 {
    let present = vis.accounting().present_per_layer(len);
    let layers: f64 = (0..vis.num_layers())
        .map(|l| {
            let (token, per_key, kv_projection) = shape.layer(l);
            // a layer that reads no key (a linear-attention layer) needs no count
            let visits = if per_key > 0.0 {
                key_visits(vis, window_of(&shape.windows, l), (l, present[l]), len)
            } else {
                0.0
            };
            present[l] as f64 * token + per_key * visits + kv_projection * projected_at(vis, l, len)
        })
        .sum();
    layers + shape.lm_head()
}

/// Key visits of the prompt's queries at `layer`: for every token of the
/// first `len` that exists there, the earlier keys it reads (of the tokens
/// the layer holds while the prompt runs: those that exist there and those
/// whose K/V it keeps), within the layer's sliding window if it has one.
fn key_visits(
    vis: &dyn Visibility,
    window: Option<usize>,
    (layer, present): (usize, usize),
    len: usize,
) -> f64 {
    if present == len && vis.rule_class(layer) == 0 {
        // every token reads every earlier one it may
        return causal_pairs(window, len);
    }
    // a prompt that runs whole reads as the full model's (a press's, whose
    // decision shows only in what the decode-phase queries read)
    let whole = match vis.prompt_runs_whole(layer) {
        true => vis.phases().decode_start().min(len),
        false => 0,
    };
    let held: Vec<usize> = (0..len)
        .filter(|&k| vis.token_exists(layer, k) || vis.retains_kv(layer, k))
        .collect();
    let reads = LayerKeys::layer(vis, layer, window);
    causal_pairs(window, whole)
        + (whole..len)
            .filter(|&q| vis.token_exists(layer, q))
            .map(|q| reads.count(q, &held) as f64)
            .sum::<f64>()
}

/// Tokens of the first `len` whose K/V `layer` keeps without the token
/// existing there (projected from a lower layer's hidden state).
fn projected_at(vis: &dyn Visibility, layer: usize, len: usize) -> f64 {
    (0..len)
        .filter(|&p| {
            !vis.token_exists(layer, p)
                && vis.retains_kv(layer, p)
                && vis.kv_projected_at(p).is_some_and(|c| c <= layer)
        })
        .count() as f64
}

/// Tokens at each layer of a SlimInfer prefill: all `n` below the first
/// cut, then `n - P + P_i` in cut i's segment (`kept[i]` = P_i).
pub fn slim_tokens_per_layer(
    num_layers: usize,
    cuts: &[usize],
    n: usize,
    prefill: usize,
    kept: &[usize],
) -> Vec<usize> {
    (0..num_layers)
        .map(|l| match cuts.iter().rposition(|&c| c <= l) {
            None => n,
            Some(i) => n - prefill + kept[i].min(prefill),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Llama-3.1-8B's shape.
    const LLAMA_31_8B: FlopShape = FlopShape {
        num_layers: 32,
        hidden_size: 4096,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        intermediate_size: 14336,
        vocab_size: 128_256,
        windows: Vec::new(),
        layers: Vec::new(),
    };

    /// A 4-layer shape small enough to count FLOPs by hand.
    pub(crate) fn tiny() -> FlopShape {
        FlopShape {
            num_layers: 4,
            hidden_size: 8,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            intermediate_size: 16,
            vocab_size: 10,
            windows: Vec::new(),
            layers: Vec::new(),
        }
    }

    #[test]
    fn hand_counted_full_prefill() {
        let s = tiny();
        // W = 2·8·8 + 4·8·4 + 2·8·8 + 6·8·16 = 128 + 128 + 128 + 768 = 1152
        assert_eq!(s.token_layer_flops(), 1152.0);
        // 3 tokens: 3·W + 4·8·(1+2+3) = 3456 + 192 per layer; 4 layers; head 160
        let split = PromptSplit {
            anchors: 1,
            prefill: 1,
            decode: 1,
        };
        assert_eq!(prefill_flops(&s, 4, split), 4.0 * (3456.0 + 192.0) + 160.0);
    }

    #[test]
    fn speed_upper_layers_skip_prefill_tokens() {
        let s = tiny();
        let split = PromptSplit {
            anchors: 1,
            prefill: 1,
            decode: 1,
        };
        // Upper layer: tokens A + D = 2 → 2·W; keys: anchor sees 1, decode token sees 1 + 1.
        let upper = 2.0 * 1152.0 + 4.0 * 8.0 * 3.0;
        let lower = 3456.0 + 192.0;
        assert_eq!(prefill_flops(&s, 1, split), lower + 3.0 * upper + 160.0);
    }

    #[test]
    fn ratio_falls_with_the_cut_and_approaches_cut_over_depth() {
        let s = LLAMA_31_8B;
        let split = PromptSplit::raw(131_072, 1);
        let full = prefill_flops(&s, 32, split);
        let mut last = full;
        for cut in (1..32).rev() {
            let f = prefill_flops(&s, cut, split);
            assert!(f < last, "cut {cut}");
            last = f;
        }
        let ratio = prefill_flops(&s, 24, split) / full;
        assert!((ratio - 0.75).abs() < 0.01, "{ratio}");
        assert_eq!(prefill_flops(&s, 40, split), full);
    }

    #[test]
    fn raw_split_counts_every_token_once() {
        let p = PromptSplit::raw(10, 1);
        assert_eq!((p.anchors, p.prefill, p.decode), (1, 8, 1));
        let p = PromptSplit::raw(1, 1);
        assert_eq!((p.anchors, p.prefill, p.decode), (1, 0, 0));
    }

    #[test]
    fn slim_prefill_flops_reproduce_the_predicted_speedups() {
        // LLaMA-3.1-8B, slim:paper (10/20/30 keeping 8K/4K/2K with a 64-token
        // sink): §4.5 predicts 1.27x at 8K and 2.52x at 32K (paper: 2.53x TTFT)
        let s = LLAMA_31_8B;
        for (k, expected) in [(8, 1.27), (16, 1.92), (24, 2.29), (32, 2.52), (128, 3.10)] {
            let n = k * 1024;
            let (sink, decode) = (64, 1);
            let p = n - sink - decode;
            let kept: Vec<usize> = [8192, 4096, 2048]
                .iter()
                .map(|&b: &usize| (b - sink).min(p))
                .collect();
            let slim = slim_tokens_per_layer(32, &[10, 20, 30], n, p, &kept);
            let speedup =
                layered_prefill_flops(&s, &vec![n; 32]) / layered_prefill_flops(&s, &slim);
            assert!((speedup - expected).abs() < 0.01, "{k}K: {speedup}");
        }
    }

    #[test]
    fn projected_kv_flops_follow_the_formula() {
        use lcut_policy::{Anchors, Policy, PolicyKind, ProjectedName, TokenPhases};
        let s = tiny();
        let (a, p, d) = (1.0, 5.0, 2.0);
        let phases = TokenPhases::from_counts(1, 5);
        let kind = PolicyKind::Projected(ProjectedName::SwiftKv);
        let vis = Policy::new(kind, 3, 4, Anchors::Bos)
            .unwrap()
            .visibility(phases);
        let w = s.token_layer_flops();
        let n = a + p + d;
        let full_layer = n * w + s.attention(n * (n + 1.0) / 2.0);
        let upper = (a + d) * w
            + p * s.kv_projection_flops()
            + s.attention(a * (a + 1.0) / 2.0 + d * (a + p) + d * (d + 1.0) / 2.0);
        let lm_head = 2.0 * s.hidden_size as f64 * s.vocab_size as f64;
        let got = policy_prefill_flops(&s, vis.as_ref(), 8);
        assert!(
            (got - (3.0 * full_layer + upper + lm_head)).abs() < 1e-6,
            "{got}"
        );
        // more than SPEED at the same cut, less than the full model
        let speed = Policy::new(PolicyKind::Speed, 3, 4, Anchors::Bos).unwrap();
        let speed = policy_prefill_flops(&s, speed.visibility(phases).as_ref(), 8);
        let full = policy_prefill_flops(&s, Policy::full(4).visibility(phases).as_ref(), 8);
        assert!(speed < got && got < full, "{speed} {got} {full}");
        assert_eq!(full, layered_prefill_flops(&s, &[8; 4]));
    }

    #[test]
    fn a_press_prompt_runs_whole_and_its_question_reads_what_was_kept() {
        use lcut_policy::{
            DynamicRule, HostKeys, Policy, PressName, PressParams, PressRun, PromptKv, TokenPhases,
        };
        let s = tiny();
        // 8 context tokens, then 3 decode-phase tokens (the question)
        let phases = TokenPhases::new(11, 8, 0).unwrap();
        let mut press = PressRun::new(PressParams::new(PressName::Knorm, 0.5), phases, 4);
        let (w, lm_head) = (s.token_layer_flops(), 2.0 * 8.0 * 10.0);
        // undecided, the press's prefill is the full model's
        let full = Policy::full(4).visibility(phases);
        assert_eq!(
            policy_prefill_flops(&s, &press, 11),
            policy_prefill_flops(&s, full.as_ref(), 11)
        );
        let positions: Vec<usize> = (0..8).collect();
        let keys: Vec<f32> = (0..8).flat_map(|p| [p as f32, 1.0, 0.0, 0.5]).collect();
        let kv = PromptKv {
            keys: HostKeys {
                kv_heads: 1,
                head_dim: 4,
                positions: &positions,
                data: &keys,
            },
            values: &keys,
            heads: 2,
            rope_inv_freq: &[1.0, 0.5],
        };
        for l in 0..4 {
            press.decide_at_prompt_end(l, &kv).unwrap();
        }
        assert!(press.is_decided());
        // per layer: the context reads as the full model's (36 visits), each
        // question token the 4 kept context keys and the question so far
        let visits = 36.0 + (5.0 + 6.0 + 7.0);
        let expected = 4.0 * 11.0 * w + s.attention(4.0 * visits) + lm_head;
        assert_eq!(policy_prefill_flops(&s, &press, 11), expected);
    }

    #[test]
    fn a_sliding_layer_reads_only_its_window_in_prefill() {
        use lcut_policy::{Anchors, Policy, PolicyKind, TokenPhases};
        // three layers sliding over 3 keys, the fourth global; BoS, 7
        // prefill tokens and the last token (9 in all)
        let s = FlopShape {
            windows: vec![Some(3), Some(3), Some(3), None],
            layers: Vec::new(),
            ..tiny()
        };
        let (w, lm_head) = (s.token_layer_flops(), 2.0 * 8.0 * 10.0);
        let phases = TokenPhases::raw_prompt(9, 1).unwrap();
        let full = Policy::full(4).visibility(phases);
        // a sliding layer: 1 + 2 + 3 x 7 = 24 key visits; the global one 45
        let expected = 4.0 * 9.0 * w + s.attention(3.0 * 24.0 + 45.0) + lm_head;
        assert_eq!(policy_prefill_flops(&s, full.as_ref(), 9), expected);
        // SPEED at 2: above the cut BoS and the last token run; at the
        // sliding layer the last token no longer sees BoS (2 visits), at the
        // global one it does (3)
        let speed = Policy::new(PolicyKind::Speed, 2, 4, Anchors::Bos)
            .unwrap()
            .visibility(phases);
        let expected =
            2.0 * 9.0 * w + 2.0 * 2.0 * w + s.attention(2.0 * 24.0 + 2.0 + 3.0) + lm_head;
        assert_eq!(policy_prefill_flops(&s, speed.as_ref(), 9), expected);
        // without the windows every layer reads every earlier key
        let blind = FlopShape {
            windows: Vec::new(),
            layers: Vec::new(),
            ..tiny()
        };
        assert_eq!(
            policy_prefill_flops(&blind, full.as_ref(), 9),
            prefill_flops(&blind, 4, PromptSplit::raw(9, 1))
        );
    }

    #[test]
    fn layered_flops_at_full_depth_equal_the_full_model() {
        let s = tiny();
        let split = PromptSplit {
            anchors: 1,
            prefill: 5,
            decode: 1,
        };
        let full = prefill_flops(&s, 4, split);
        assert_eq!(layered_prefill_flops(&s, &[7; 4]), full);
        assert_eq!(
            slim_tokens_per_layer(4, &[1, 3], 7, 5, &[2, 1]),
            vec![7, 4, 4, 3]
        );
    }

    /// Layers of their own shapes (a linear-attention layer that reads no
    /// key, a wider layer) are each counted with their own coefficients:
    /// per-layer coefficients equal to the uniform ones give the uniform
    /// model, and changing one layer moves the count by that layer alone,
    /// in the closed form, the layered form and the policy count.
    #[test]
    fn layers_of_their_own_shapes_are_counted_alone() {
        use lcut_policy::{Anchors, Policy, PolicyKind, TokenPhases};
        let mut s = tiny();
        let split = PromptSplit {
            anchors: 1,
            prefill: 5,
            decode: 2,
        };
        let uniform = prefill_flops(&s, 2, split);
        let same: Vec<LayerFlops> = (0..4)
            .map(|_| LayerFlops {
                token: 1152,
                per_key: 32,
                kv_projection: 128,
            })
            .collect();
        // the uniform coefficients are no layers of their own
        assert!(s.clone().with_layers(same.clone()).layers.is_empty());
        s.layers = same.clone();
        assert_eq!(prefill_flops(&s, 2, split), uniform);
        // layer 1 a linear-attention layer: 500 a token, no key read; layer
        // 3 twice as wide in its attention
        let mut layers = same;
        layers[1] = LayerFlops {
            token: 500,
            per_key: 0,
            kv_projection: 0,
        };
        layers[3].per_key *= 2;
        s = s.with_layers(layers);
        assert_eq!(s.layers.len(), 4);
        // n = 8 below the cut (36 key visits), A + D = 3 above it (1 + 2 +
        // 3 = 6 visits: the anchor reads itself, each decode token the
        // anchor, the earlier ones and itself)
        let moved = -(8.0 * 1152.0 + 32.0 * 36.0) + 8.0 * 500.0 + 32.0 * 6.0;
        assert_eq!(prefill_flops(&s, 2, split), uniform + moved);
        let full = layered_prefill_flops(&s, &[8; 4]);
        let phases = TokenPhases::from_counts(1, 5);
        let full_policy = Policy::full(4).visibility(phases);
        assert_eq!(policy_prefill_flops(&s, full_policy.as_ref(), 8), full);
        let speed = Policy::new(PolicyKind::Speed, 2, 4, Anchors::Bos)
            .unwrap()
            .visibility(phases);
        assert_eq!(
            policy_prefill_flops(&s, speed.as_ref(), 8),
            prefill_flops(&s, 2, split)
        );
    }
}
