//! Which keys a query reads: the one answer every attention path takes
//! (the fused decode step, the prefill chunks' kernel and the tensor path's
//! mask). For one layer and the queries of a chunk (or the one token of a
//! decode step) it gives, for each group of K/V heads that hold the same
//! rows under the same rule, the cache rows each query reads: keys at or
//! before the query, inside the layer's sliding window, and those the
//! policy shows that head. A layer whose rule shows every earlier key
//! (rule class 0) is answered without asking the policy key by key;
//! otherwise the answer is kept for the following layers that show the
//! same keys to the same queries.

use std::ops::Range;

use lcut_kernels::attention::QuerySpans;
use lcut_policy::Visibility;

use crate::cache::LayerCache;
use crate::mask::PartialMask;

/// The rows the queries of one group of K/V heads read.
#[derive(Debug, Default)]
pub(crate) struct GroupReads {
    /// The group's K/V heads (contiguous).
    pub(crate) heads: Range<usize>,
    /// Which of the cache's row groups the spans index (0 when the cache is
    /// shared, the head when it is split).
    pub(crate) rows: usize,
    /// The rows each query reads, ascending.
    pub(crate) spans: QuerySpans,
    /// Whether every query reads at least one row.
    pub(crate) complete: bool,
    /// Changes whenever the spans are made again (a mask built from them
    /// is kept while it stays the same).
    pub(crate) version: u64,
    /// What the spans were made from, to keep them for the next layer.
    memo: Option<Memo>,
}

/// What one group's spans depend on: the rule class, the window, the query
/// positions and the key positions.
#[derive(Debug, PartialEq)]
struct Memo {
    class: usize,
    window: Option<usize>,
    queries: Vec<usize>,
    keys: Vec<usize>,
}

/// The rows each query reads at one layer, per group of K/V heads, with
/// the answers of the previous layer kept.
#[derive(Debug, Default)]
pub(crate) struct KeyReads {
    groups: Vec<GroupReads>,
    /// Spans made so far (each gets its own version).
    made: u64,
}

/// What a layer's reads are asked about.
pub(crate) struct ReadQuery<'a> {
    /// The layer.
    pub(crate) layer: usize,
    /// Its sliding window, if any.
    pub(crate) window: Option<usize>,
    /// Positions of the queries, ascending.
    pub(crate) queries: &'a [usize],
    /// The model's K/V heads.
    pub(crate) kv_heads: usize,
}

impl KeyReads {
    /// The rows each query of `ask` reads in `cache` under `rule`, one
    /// group per set of K/V heads that hold the same rows under the same
    /// rule (one group for the whole layer unless its heads differ).
    pub(crate) fn plan(
        &mut self,
        rule: &dyn Visibility,
        ask: &ReadQuery<'_>,
        cache: &LayerCache,
    ) -> &[GroupReads] {
        let per_head = cache.is_split() || rule.heads_differ(ask.layer);
        let count = if per_head { ask.kv_heads } else { 1 };
        self.groups.resize_with(count, GroupReads::default);
        for (i, g) in self.groups.iter_mut().enumerate() {
            let (heads, head) = match per_head {
                true => (i..i + 1, Some(i)),
                false => (0..ask.kv_heads, None),
            };
            let rows = if cache.is_split() { i } else { 0 };
            g.heads = heads;
            g.rows = rows;
            let held = HeldRows {
                positions: cache.group_positions(rows),
                checked_below: cache.checked_below(),
            };
            if g.fill(rule, ask, head, &held) {
                self.made += 1;
                g.version = self.made;
            }
        }
        &self.groups
    }
}

/// The rows one group of K/V heads holds, as the planner sees them.
struct HeldRows<'a> {
    /// Their positions, ascending.
    positions: &'a [usize],
    /// Rows below this position were checked against what the policy keeps.
    checked_below: usize,
}

impl HeldRows<'_> {
    /// Whether the one query at `q` reads every held row before it: the
    /// rule shows a query there exactly what the layer keeps, and every
    /// held row before `q` was checked against that (the row at `q` is
    /// stored only where it is kept).
    fn read_whole(&self, rule: &dyn Visibility, layer: usize, queries: &[usize]) -> bool {
        matches!(queries, [q] if self.checked_below >= *q && rule.reads_what_it_keeps(layer, *q))
    }
}

impl GroupReads {
    /// Make this group's spans for K/V head `head` (`None`: the layer's
    /// rule, every head alike) over the rows `held`; false when the
    /// spans kept from the previous layer are still the answer. A decode
    /// step (one query) under a rule that shows every earlier key, or that
    /// shows what the layer keeps of a cache checked against it, is
    /// answered anew each time: two binary searches cost less than
    /// comparing the cache's positions, and far less than asking the rule
    /// about every row.
    fn fill(
        &mut self,
        rule: &dyn Visibility,
        ask: &ReadQuery<'_>,
        head: Option<usize>,
        held: &HeldRows<'_>,
    ) -> bool {
        let l = ask.layer;
        let keys = held.positions;
        let class = match head {
            _ if held.read_whole(rule, l, ask.queries) => 0,
            Some(h) => rule.head_rule_class(l, h),
            None => rule.rule_class(l),
        };
        let window = ask.window;
        let keep = class != 0 || ask.queries.len() > 1;
        if keep
            && let Some(m) = &self.memo
            && m.class == class
            && m.window == window
            && m.queries == ask.queries
            && m.keys == keys
        {
            return false;
        }
        self.spans.clear();
        let mut complete = true;
        let mut spans: Vec<Range<usize>> = Vec::new();
        for &q in ask.queries {
            // keys inside the window: k + w > q
            let first = window.map_or(0, |w| keys.partition_point(|&k| k + w <= q));
            let end = keys.partition_point(|&k| k <= q).max(first);
            spans.clear();
            if class == 0 {
                spans.push(first..end);
            } else {
                let visible = |k: usize| match head {
                    Some(h) => rule.head_key_visible(l, h, q, k),
                    None => rule.key_visible(l, q, k),
                };
                runs_of(keys, first..end, visible, &mut spans);
            }
            complete &= spans.iter().any(|r| !r.is_empty());
            self.spans.push_query(spans.iter().cloned());
        }
        self.complete = complete;
        self.memo = keep.then(|| Memo {
            class,
            window,
            queries: ask.queries.to_vec(),
            keys: keys.to_vec(),
        });
        true
    }

    /// The additive mask [queries x keys] these spans give over `keys` key
    /// columns, or `None` when every query reads every key.
    pub(crate) fn mask(&self, keys: usize) -> Option<PartialMask> {
        let n = self.spans.queries();
        let whole = |i: usize| matches!(self.spans.of(i), [r] if *r == (0..keys));
        if (0..n).all(whole) {
            return None;
        }
        // columns every query reads from the first on
        let visible_prefix = (0..n)
            .map(|i| match self.spans.of(i).first() {
                Some(r) if r.start == 0 => r.end,
                _ => 0,
            })
            .min()
            .unwrap_or(0);
        let width = keys - visible_prefix;
        let mut rest = vec![f32::NEG_INFINITY; n * width];
        for i in 0..n {
            let row = &mut rest[i * width..(i + 1) * width];
            for r in self.spans.of(i) {
                let (a, b) = (r.start.max(visible_prefix), r.end.max(visible_prefix));
                row[a - visible_prefix..b - visible_prefix].fill(0.0);
            }
        }
        Some(PartialMask {
            visible_prefix,
            rest,
        })
    }
}

/// The runs of `range` (indices into `keys`) whose keys `visible` shows,
/// into `out`.
fn runs_of(
    keys: &[usize],
    range: Range<usize>,
    visible: impl Fn(usize) -> bool,
    out: &mut Vec<Range<usize>>,
) {
    let mut open: Option<usize> = None;
    for i in range.clone() {
        match (visible(keys[i]), open) {
            (true, None) => open = Some(i),
            (false, Some(start)) => {
                out.push(start..i);
                open = None;
            }
            _ => {}
        }
    }
    if let Some(start) = open {
        out.push(start..range.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};
    use lcut_policy::{Anchors, KvAccounting, Policy, PolicyKind, TokenPhases};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn cache_of(positions: &[usize]) -> LayerCache {
        let mut c = LayerCache::new();
        let n = positions.len();
        let x = Tensor::zeros((2, n, 2), candle_core::DType::F32, &Device::Cpu).expect("zeros");
        c.append(&x, &x, positions).expect("append");
        c
    }

    #[test]
    fn a_full_layer_reads_every_earlier_key_inside_the_window() {
        let rule = Policy::full(2).visibility(TokenPhases::all_decode());
        let cache = cache_of(&[0, 1, 2, 3, 4]);
        let mut reads = KeyReads::default();
        let ask = ReadQuery {
            layer: 0,
            window: Some(3),
            queries: &[2, 4],
            kv_heads: 2,
        };
        let groups = reads.plan(rule.as_ref(), &ask, &cache);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].spans.of(0).to_vec(), vec![0..3]);
        assert_eq!(groups[0].spans.of(1).to_vec(), vec![2..5]);
        let m = groups[0].mask(5).expect("the window hides keys");
        assert_eq!(m.visible_prefix, 0);
        let visible: Vec<u8> = m.rest.iter().map(|&x| u8::from(x == 0.0)).collect();
        assert_eq!(visible, vec![1, 1, 1, 0, 0, 0, 0, 1, 1, 1]);
    }

    /// Keeps the even prompt positions and the decode phase (from 6), shows
    /// a decode-phase query what it keeps, and counts the keys it is asked
    /// about.
    #[derive(Debug)]
    struct KeepsEven {
        phases: TokenPhases,
        asked: AtomicUsize,
    }

    const DECODE_START: usize = 6;

    impl KeepsEven {
        fn new() -> Self {
            Self {
                phases: TokenPhases::new(9, DECODE_START, 0).expect("phases"),
                asked: AtomicUsize::new(0),
            }
        }
    }

    impl Visibility for KeepsEven {
        fn num_layers(&self) -> usize {
            1
        }
        fn phases(&self) -> &TokenPhases {
            &self.phases
        }
        fn token_exists(&self, _layer: usize, _pos: usize) -> bool {
            true
        }
        fn retains_kv(&self, _layer: usize, pos: usize) -> bool {
            pos >= DECODE_START || pos.is_multiple_of(2)
        }
        fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
            self.asked.fetch_add(1, Ordering::Relaxed);
            q < DECODE_START || self.retains_kv(layer, k)
        }
        fn rule_class(&self, _layer: usize) -> usize {
            1
        }
        fn reads_what_it_keeps(&self, _layer: usize, q: usize) -> bool {
            q >= DECODE_START
        }
        fn accounting(&self) -> &dyn KvAccounting {
            self
        }
        fn box_clone(&self) -> Box<dyn Visibility> {
            Box::new(Self::new())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    impl KvAccounting for KeepsEven {}

    /// The one decode-phase query at position 7 at `layer`, two K/V heads.
    fn decode_query(layer: usize) -> ReadQuery<'static> {
        ReadQuery {
            layer,
            window: None,
            queries: &[7],
            kv_heads: 2,
        }
    }

    fn decode_step(rule: &KeepsEven, cache: &LayerCache) -> (Vec<Range<usize>>, usize) {
        rule.asked.store(0, Ordering::Relaxed);
        let mut reads = KeyReads::default();
        let groups = reads.plan(rule, &decode_query(0), cache);
        let spans = groups[0].spans.of(0).to_vec();
        (spans, rule.asked.load(Ordering::Relaxed))
    }

    #[test]
    fn a_decode_step_over_a_checked_cache_reads_what_is_kept_without_asking_key_by_key() {
        let rule = KeepsEven::new();
        // the prompt ran whole: every prompt row is held until the check
        let mut cache = cache_of(&[0, 1, 2, 3, 4, 5, 6]);
        let (unchecked, asked) = decode_step(&rule, &cache);
        // rows 1, 3 and 5 are still held but not kept: asked about, not read
        assert_eq!(unchecked, vec![0..1, 2..3, 4..5, 6..7]);
        assert_eq!(asked, 7);
        cache
            .retain_checked(2, false, |_, p| rule.retains_kv(0, p))
            .expect("check");
        assert_eq!(cache.positions(), &[0, 2, 4, 6]);
        let x = Tensor::zeros((2, 1, 2), candle_core::DType::F32, &Device::Cpu).expect("zeros");
        cache.append(&x, &x, &[7]).expect("append");
        let (checked, asked) = decode_step(&rule, &cache);
        assert_eq!(
            checked,
            vec![0..5],
            "every held row, the query's own included"
        );
        assert_eq!(asked, 0, "no key asked about once the rows were checked");
    }

    #[test]
    fn speed_above_the_cut_reads_anchors_and_the_decode_phase() {
        let phases = TokenPhases::new(8, 5, 1).expect("phases");
        let rule = Policy::new(PolicyKind::Speed, 1, 2, Anchors::Bos)
            .expect("policy")
            .visibility(phases);
        let cache = cache_of(&[0, 5, 6, 7]);
        let mut reads = KeyReads::default();
        let groups = reads.plan(rule.as_ref(), &decode_query(1), &cache);
        assert_eq!(groups[0].spans.of(0).to_vec(), vec![0..4]);
        assert!(groups[0].mask(4).is_none());
    }
}
