//! The decoder's side of the key planner ([`lcut_policy::keys`], the one
//! place that answers which keys a query reads): a layer's cache as the
//! planner reads its rows, the additive mask the tensor path builds from a
//! group's spans, and the batched trainer's masked probabilities
//! ([`BatchSoftmax`]).

use candle_core::Tensor;
use lcut_policy::keys::{GroupReads, HeldKeys, HeldRows};

use crate::cache::LayerCache;
use crate::error::Result;

/// The attention probabilities of a training batch, as its masks give them.
pub trait BatchSoftmax {
    /// Softmax of `scores` [b, kv_heads, group, t, t] at `layer` over the
    /// keys each query reads, 0 at the others.
    fn softmax(&self, layer: usize, scores: &Tensor) -> Result<Tensor>;

    /// Which keys each query reads at `layer`: the sequences' [t, t]
    /// matrices stacked [b, t, t], row-major (as
    /// [`lcut_policy::training_matrix`] gives each).
    fn visibility(&self, layer: usize) -> &[bool];
}

impl HeldKeys for LayerCache {
    fn is_split(&self) -> bool {
        LayerCache::is_split(self)
    }

    fn held(&self, group: usize) -> HeldRows<'_> {
        HeldRows {
            positions: self.group_positions(group),
            checked_below: self.checked_below(),
        }
    }
}

/// The part of a [queries x keys] additive mask that is not all zeros.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PartialMask {
    /// The first `visible_prefix` keys are visible to every query.
    pub(crate) visible_prefix: usize,
    /// The mask of the remaining keys, [queries x (keys - visible_prefix)],
    /// row-major, 0 or -inf.
    pub(crate) rest: Vec<f32>,
}

/// The additive mask [queries x keys] group `g`'s spans give over `keys`
/// key columns, or `None` when every query reads every key. Only the
/// columns from the first one some query skips are built, so a prefill
/// chunk deep into a long prompt moves [chunk x chunk], not
/// [chunk x context].
pub(crate) fn group_mask(g: &GroupReads, keys: usize) -> Option<PartialMask> {
    let spans = &g.spans;
    let n = spans.queries();
    let whole = |i: usize| matches!(spans.of(i), [r] if *r == (0..keys));
    if (0..n).all(whole) {
        return None;
    }
    // columns every query reads from the first on
    let visible_prefix = (0..n)
        .map(|i| match spans.of(i).first() {
            Some(r) if r.start == 0 => r.end,
            _ => 0,
        })
        .min()
        .unwrap_or(0);
    let width = keys - visible_prefix;
    let mut rest = vec![f32::NEG_INFINITY; n * width];
    for i in 0..n {
        let row = &mut rest[i * width..(i + 1) * width];
        for r in spans.of(i) {
            let (a, b) = (r.start.max(visible_prefix), r.end.max(visible_prefix));
            row[a - visible_prefix..b - visible_prefix].fill(0.0);
        }
    }
    Some(PartialMask {
        visible_prefix,
        rest,
    })
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::*;
    use candle_core::{Device, Tensor};
    use lcut_policy::keys::{KeyPlanner, KeyQuery};
    use lcut_policy::{Anchors, Policy, PolicyKind, TokenPhases, Visibility};

    fn cache_of(positions: &[usize]) -> LayerCache {
        let mut c = LayerCache::new();
        let n = positions.len();
        let x = Tensor::zeros((2, n, 2), candle_core::DType::F32, &Device::Cpu).expect("zeros");
        c.append(&x, &x, positions).expect("append");
        c
    }

    fn visible(m: &[f32]) -> Vec<u8> {
        m.iter().map(|&x| u8::from(x == 0.0)).collect()
    }

    /// The first group's spans for `queries` at `layer` (two K/V heads)
    /// over `cache` under `rule`, and the mask built from them.
    fn planned(
        rule: &dyn Visibility,
        cache: &LayerCache,
        (layer, window): (usize, Option<usize>),
        queries: &[usize],
    ) -> (Vec<Vec<Range<usize>>>, Option<PartialMask>) {
        let mut planner = KeyPlanner::default();
        let ask = KeyQuery {
            layer,
            window,
            queries,
            kv_heads: 2,
            own_rows: true,
        };
        let g = &planner.plan(rule, &ask, cache)[0];
        let spans = (0..queries.len()).map(|i| g.spans.of(i).to_vec()).collect();
        (spans, group_mask(g, cache.group_positions(g.rows).len()))
    }

    /// SPEED at 1 of 2 layers with BoS, prompt of 5 then the decode phase.
    fn speed_1_of_2() -> Box<dyn Visibility> {
        let phases = TokenPhases::new(8, 5, 1).expect("phases");
        Policy::new(PolicyKind::Speed, 1, 2, Anchors::Bos)
            .expect("policy")
            .visibility(phases)
    }

    #[test]
    fn a_window_masks_the_keys_before_it() {
        let rule = Policy::full(2).visibility(TokenPhases::all_decode());
        let cache = cache_of(&[0, 1, 2, 3, 4]);
        let (_, mask) = planned(rule.as_ref(), &cache, (0, Some(3)), &[2, 4]);
        let m = mask.expect("the window hides keys");
        assert_eq!(m.visible_prefix, 0);
        assert_eq!(visible(&m.rest), vec![1, 1, 1, 0, 0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn a_late_prefill_chunk_builds_only_its_own_columns() {
        let rule = Policy::full(1).visibility(TokenPhases::all_decode());
        let positions: Vec<usize> = (0..1000).collect();
        let cache = cache_of(&positions);
        let (_, mask) = planned(rule.as_ref(), &cache, (0, None), &[997, 998, 999]);
        let m = mask.expect("causal order hides keys");
        assert_eq!(m.visible_prefix, 998);
        assert_eq!(visible(&m.rest), vec![0, 0, 1, 0, 1, 1]);
    }

    #[test]
    fn a_decode_step_over_the_keys_it_reads_needs_no_mask() {
        let cache = cache_of(&[0, 5, 6, 7]);
        let (spans, mask) = planned(speed_1_of_2().as_ref(), &cache, (1, None), &[7]);
        assert_eq!(spans, vec![vec![0..4]]);
        assert!(mask.is_none());
    }

    #[test]
    fn a_checked_cache_is_read_whole_by_a_decode_query() {
        // the planner's answer over a real cache after its rows were
        // checked against a policy that keeps BoS and the decode phase
        let rule = speed_1_of_2();
        let mut cache = cache_of(&[0, 1, 2, 3, 4, 5, 6]);
        cache
            .retain_checked(2, false, |_, p| rule.retains_kv(1, p))
            .expect("check");
        assert_eq!(cache.positions(), &[0, 5, 6]);
        let x = Tensor::zeros((2, 1, 2), candle_core::DType::F32, &Device::Cpu).expect("zeros");
        cache.append(&x, &x, &[7]).expect("append");
        let (spans, _) = planned(rule.as_ref(), &cache, (1, None), &[7]);
        assert_eq!(spans, vec![vec![0..4]]);
    }
}
