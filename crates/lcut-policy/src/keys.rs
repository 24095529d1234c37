//! Which keys a query reads: the one place that answers it. A query at
//! position `q` reads, at one layer (through one K/V head, or every head
//! alike), the held keys at or before `q`, inside the layer's sliding
//! window ([`crate::window::in_window`]), that the policy's
//! [`Visibility`] shows it.
//!
//! Everyone who needs the answer asks here:
//! - inference: the fused decode step, the prefill chunks' kernel and the
//!   tensor path's mask take a [`KeyPlanner`]'s [`QuerySpans`], one set per
//!   group of K/V heads that hold the same rows under the same rule;
//! - training: the task models' batch masks and the LoRA trainer's rows
//!   take [`training_matrix`];
//! - counting: the FLOP model takes [`LayerKeys::count`].
//!
//! A layer whose rule shows every earlier key (rule class 0) is answered
//! without asking the policy key by key; otherwise the answer is kept for
//! the following layers that show the same keys to the same queries.

use std::ops::Range;

use crate::Visibility;
use crate::window::readable_keys;

/// The rows each query of a chunk reads: ascending, non-overlapping ranges
/// of row indices per query. Buffers are kept between calls.
#[derive(Debug, Clone, Default)]
pub struct QuerySpans {
    offsets: Vec<usize>,
    spans: Vec<Range<usize>>,
}

impl QuerySpans {
    /// No queries.
    pub fn new() -> Self {
        Self {
            offsets: vec![0],
            spans: Vec::new(),
        }
    }

    /// Forget every query (keeping the buffers).
    pub fn clear(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.spans.clear();
    }

    /// Add the next query, reading the rows `spans` (empty ranges dropped).
    pub fn push_query(&mut self, spans: impl IntoIterator<Item = Range<usize>>) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.spans
            .extend(spans.into_iter().filter(|r| !r.is_empty()));
        self.offsets.push(self.spans.len());
    }

    /// Queries held.
    pub fn queries(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The rows query `i` reads.
    pub fn of(&self, i: usize) -> &[Range<usize>] {
        &self.spans[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// The rule one layer applies to its queries, through one K/V head or
/// every head alike: what [`LayerKeys::spans`] answers from.
#[derive(Clone, Copy)]
pub struct LayerKeys<'a> {
    rule: &'a dyn Visibility,
    layer: usize,
    head: Option<usize>,
    window: Option<usize>,
    class: usize,
}

impl<'a> LayerKeys<'a> {
    /// The rule of `layer` under `rule`, every K/V head alike (where heads
    /// differ, the union of theirs), with the layer's sliding `window`.
    pub fn layer(rule: &'a dyn Visibility, layer: usize, window: Option<usize>) -> Self {
        Self::head(rule, layer, None, window)
    }

    /// The rule of K/V head `head` (`None`: every head alike) at `layer`.
    pub fn head(
        rule: &'a dyn Visibility,
        layer: usize,
        head: Option<usize>,
        window: Option<usize>,
    ) -> Self {
        let class = match head {
            Some(h) => rule.head_rule_class(layer, h),
            None => rule.rule_class(layer),
        };
        Self {
            rule,
            layer,
            head,
            window,
            class,
        }
    }

    /// The same layer read as one that shows every earlier key (a cache
    /// checked against what the rule keeps, read by a query that reads
    /// what the layer keeps).
    fn reading_every_held_row(self) -> Self {
        Self { class: 0, ..self }
    }

    /// The rule class these answers come from (0: every earlier key).
    pub fn class(&self) -> usize {
        self.class
    }

    /// Whether the rule shows the query at `q` the key at `k` (`k <= q`),
    /// the window aside.
    fn shows(&self, q: usize, k: usize) -> bool {
        match self.head {
            Some(h) => self.rule.head_key_visible(self.layer, h, q, k),
            None => self.rule.key_visible(self.layer, q, k),
        }
    }

    /// The indices into `keys` (held positions, ascending) at or before `q`
    /// and inside the window: the keys the rule is asked about.
    fn candidates(&self, q: usize, keys: &[usize]) -> Range<usize> {
        let readable = readable_keys(self.window, q);
        let first = keys.partition_point(|&k| k < readable.start);
        first..keys.partition_point(|&k| k < readable.end).max(first)
    }

    /// The indices into `keys` (held positions, ascending) that the query
    /// at `q` reads, as ascending runs, into `out` (cleared first).
    pub fn spans(&self, q: usize, keys: &[usize], out: &mut Vec<Range<usize>>) {
        out.clear();
        let Range { start: first, end } = self.candidates(q, keys);
        if self.class == 0 {
            out.push(first..end);
            return;
        }
        let mut open: Option<usize> = None;
        for (i, &k) in keys.iter().enumerate().take(end).skip(first) {
            match (self.shows(q, k), open) {
                (true, None) => open = Some(i),
                (false, Some(start)) => {
                    out.push(start..i);
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(start) = open {
            out.push(start..end);
        }
    }

    /// How many of `keys` (held positions, ascending) the query at `q`
    /// reads.
    pub fn count(&self, q: usize, keys: &[usize]) -> usize {
        let candidates = self.candidates(q, keys);
        match self.class {
            0 => candidates.len(),
            _ => keys[candidates]
                .iter()
                .filter(|&&k| self.shows(q, k))
                .count(),
        }
    }

    /// Whether each query of `queries` reads each key of `keys` (both
    /// ascending positions), [queries x keys] row-major.
    pub fn matrix(&self, queries: &[usize], keys: &[usize]) -> Vec<bool> {
        let mut m = vec![false; queries.len() * keys.len()];
        let mut runs = Vec::new();
        for (row, &q) in m.chunks_mut(keys.len().max(1)).zip(queries) {
            self.spans(q, keys, &mut runs);
            for r in &runs {
                row[r.clone()].fill(true);
            }
        }
        m
    }
}

/// Which rows of a teacher-forced sequence at `positions` (ascending) each
/// reads at `layer` under `rule`, [n x n] row-major, for the trainers'
/// masks: the keys [`LayerKeys`] gives each query (`window`: the layer's
/// sliding window, `None` where the trainer applies it itself), except that
/// a query whose token does not exist at `layer` (a prefill token above a
/// cut, still a row of the batch) reads only itself, so its row stays
/// finite and feeds nothing.
pub fn training_matrix(
    rule: &dyn Visibility,
    layer: usize,
    window: Option<usize>,
    positions: &[usize],
) -> Vec<bool> {
    let keys = LayerKeys::layer(rule, layer, window);
    let mut m = keys.matrix(positions, positions);
    let n = positions.len();
    for (i, &q) in positions.iter().enumerate() {
        if !rule.token_exists(layer, q) {
            let row = &mut m[i * n..(i + 1) * n];
            row.fill(false);
            row[i] = true;
        }
    }
    m
}

/// Which rows of sequences of `t` rows, given their visibility matrices
/// stacked [b, t, t] (row-major, each as [`training_matrix`] gives it), a
/// later row of the same sequence reads: the rows that enter a recurrent
/// layer's state, since a state holds exactly what the later tokens read
/// (every existing row under the full model and SPEED, only the anchors
/// above SelfOnly's cut; [`crate::RecurrentLayers::enters_state`] asks the
/// same of the rule). A sequence's last row is read by none.
pub fn rows_read_later(visible: &[bool], t: usize) -> Vec<bool> {
    visible
        .chunks(t * t)
        .flat_map(|m| (0..t).map(move |k| (k + 1..t).any(|q| m[q * t + k])))
        .collect()
}

/// The rows one group of K/V heads holds, as the planner sees them.
#[derive(Debug, Clone, Copy)]
pub struct HeldRows<'a> {
    /// Their positions, in the order they are held (ascending for every
    /// policy rule).
    pub positions: &'a [usize],
    /// Rows below this position were checked against what the policy
    /// keeps once the prompt ran (0 before that).
    pub checked_below: usize,
}

impl HeldRows<'_> {
    /// Whether the one query at `q` reads every held row before it: the
    /// rows were kept by this layer's rule alone (not a cache shared with
    /// other layers, kept for their rules too: [`crate::KvSharing`]), the
    /// rule shows a query there exactly what the layer keeps, and every
    /// held row before `q` was checked against that (the row at `q` is
    /// stored only where it is kept).
    fn read_whole(&self, rule: &dyn Visibility, ask: &KeyQuery<'_>) -> bool {
        matches!(ask.queries, [q] if ask.own_rows
            && self.checked_below >= *q
            && rule.reads_what_it_keeps(ask.layer, *q))
    }
}

/// The K/V rows a layer holds, as the planner reads them: one row group
/// shared by every K/V head, or one per head (a split cache).
pub trait HeldKeys {
    /// Whether each K/V head holds rows of its own.
    fn is_split(&self) -> bool;
    /// The rows of row group `group` (0 when shared, the head when split).
    fn held(&self, group: usize) -> HeldRows<'_>;
}

/// What a layer's reads are asked about.
#[derive(Debug, Clone, Copy)]
pub struct KeyQuery<'a> {
    /// The layer.
    pub layer: usize,
    /// Its sliding window, if any.
    pub window: Option<usize>,
    /// Positions of the queries, ascending.
    pub queries: &'a [usize],
    /// The model's K/V heads.
    pub kv_heads: usize,
    /// Whether the rows read are the layer's own cache, kept by its rule
    /// alone ([`crate::KvSharing::kept_by_own_rule`]); otherwise (another
    /// layer's K/V it reads, or its own shared with later layers) the rows
    /// are filtered by `layer`'s rule row by row.
    pub own_rows: bool,
}

/// The rows the queries of one group of K/V heads read.
#[derive(Debug, Default)]
pub struct GroupReads {
    /// The group's K/V heads (contiguous).
    pub heads: Range<usize>,
    /// Which of the held row groups the spans index (0 when the rows are
    /// shared, the head when each head holds its own).
    pub rows: usize,
    /// The rows each query reads, ascending.
    pub spans: QuerySpans,
    /// Whether every query reads at least one row.
    pub complete: bool,
    /// Changes whenever the spans are made again (a mask built from them
    /// may be kept while it stays the same).
    pub version: u64,
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
/// the answers of the previous layer kept: the planner every attention
/// path of inference asks.
#[derive(Debug, Default)]
pub struct KeyPlanner {
    groups: Vec<GroupReads>,
    /// Spans made so far (each gets its own version).
    made: u64,
}

impl KeyPlanner {
    /// The rows each query of `ask` reads of `held` under `rule`, one
    /// group per set of K/V heads that hold the same rows under the same
    /// rule (one group for the whole layer unless its heads differ).
    pub fn plan(
        &mut self,
        rule: &dyn Visibility,
        ask: &KeyQuery<'_>,
        held: &dyn HeldKeys,
    ) -> &[GroupReads] {
        let split = held.is_split();
        let per_head = split || rule.heads_differ(ask.layer);
        let count = if per_head { ask.kv_heads } else { 1 };
        self.groups.resize_with(count, GroupReads::default);
        for (i, g) in self.groups.iter_mut().enumerate() {
            let (heads, head) = match per_head {
                true => (i..i + 1, Some(i)),
                false => (0..ask.kv_heads, None),
            };
            g.heads = heads;
            g.rows = if split { i } else { 0 };
            if g.fill(rule, ask, head, &held.held(g.rows)) {
                self.made += 1;
                g.version = self.made;
            }
        }
        &self.groups
    }
}

impl GroupReads {
    /// Make this group's spans for K/V head `head` (`None`: the layer's
    /// rule, every head alike) over the rows `held`; false when the spans
    /// kept from the previous layer are still the answer. A decode step
    /// (one query) under a rule that shows every earlier key, or that shows
    /// what the layer keeps of a cache checked against it, is answered anew
    /// each time: two binary searches cost less than comparing the held
    /// positions, and far less than asking the rule about every row.
    fn fill(
        &mut self,
        rule: &dyn Visibility,
        ask: &KeyQuery<'_>,
        head: Option<usize>,
        held: &HeldRows<'_>,
    ) -> bool {
        let mut layer = LayerKeys::head(rule, ask.layer, head, ask.window);
        if held.read_whole(rule, ask) {
            layer = layer.reading_every_held_row();
        }
        let keys = held.positions;
        let keep = layer.class() != 0 || ask.queries.len() > 1;
        if keep
            && let Some(m) = &self.memo
            && m.class == layer.class()
            && m.window == ask.window
            && m.queries == ask.queries
            && m.keys == keys
        {
            return false;
        }
        self.spans.clear();
        let mut complete = true;
        let mut runs: Vec<Range<usize>> = Vec::new();
        for &q in ask.queries {
            layer.spans(q, keys, &mut runs);
            complete &= runs.iter().any(|r| !r.is_empty());
            self.spans.push_query(runs.iter().cloned());
        }
        self.complete = complete;
        self.memo = keep.then(|| Memo {
            class: layer.class(),
            window: ask.window,
            queries: ask.queries.to_vec(),
            keys: keys.to_vec(),
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::in_window;
    use crate::{Anchors, KvAccounting, Policy, PolicyKind, TokenPhases};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Rows held as one shared group, checked below `checked_below`.
    struct Rows {
        positions: Vec<usize>,
        checked_below: usize,
    }

    impl Rows {
        fn of(positions: &[usize]) -> Self {
            Self {
                positions: positions.to_vec(),
                checked_below: 0,
            }
        }
    }

    impl HeldKeys for Rows {
        fn is_split(&self) -> bool {
            false
        }
        fn held(&self, _group: usize) -> HeldRows<'_> {
            HeldRows {
                positions: &self.positions,
                checked_below: self.checked_below,
            }
        }
    }

    #[test]
    fn a_full_layer_reads_every_earlier_key_inside_the_window() {
        let rule = Policy::full(2).visibility(TokenPhases::all_decode());
        let rows = Rows::of(&[0, 1, 2, 3, 4]);
        let mut planner = KeyPlanner::default();
        let ask = KeyQuery {
            layer: 0,
            window: Some(3),
            queries: &[2, 4],
            kv_heads: 2,
            own_rows: true,
        };
        let groups = planner.plan(rule.as_ref(), &ask, &rows);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].spans.of(0).to_vec(), vec![0..3]);
        assert_eq!(groups[0].spans.of(1).to_vec(), vec![2..5]);
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
    }

    impl Clone for KeepsEven {
        /// A fresh count of keys asked about.
        fn clone(&self) -> Self {
            Self::new()
        }
    }

    impl KvAccounting for KeepsEven {}

    /// The one decode-phase query at position 7 at `layer`, two K/V heads.
    fn decode_query(layer: usize) -> KeyQuery<'static> {
        KeyQuery {
            layer,
            window: None,
            queries: &[7],
            kv_heads: 2,
            own_rows: true,
        }
    }

    fn decode_step(rule: &KeepsEven, rows: &Rows) -> (Vec<Range<usize>>, usize) {
        rule.asked.store(0, Ordering::Relaxed);
        let mut planner = KeyPlanner::default();
        let groups = planner.plan(rule, &decode_query(0), rows);
        let spans = groups[0].spans.of(0).to_vec();
        (spans, rule.asked.load(Ordering::Relaxed))
    }

    #[test]
    fn a_decode_step_over_checked_rows_reads_what_is_kept_without_asking_key_by_key() {
        let rule = KeepsEven::new();
        // the prompt ran whole: every prompt row is held until the check
        let unchecked = Rows::of(&[0, 1, 2, 3, 4, 5, 6]);
        let (spans, asked) = decode_step(&rule, &unchecked);
        // rows 1, 3 and 5 are still held but not kept: asked about, not read
        assert_eq!(spans, vec![0..1, 2..3, 4..5, 6..7]);
        assert_eq!(asked, 7);
        // after the check: the kept rows and the query's own
        let checked = Rows {
            positions: vec![0, 2, 4, 6, 7],
            checked_below: 7,
        };
        let (spans, asked) = decode_step(&rule, &checked);
        assert_eq!(
            spans,
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
        let rows = Rows::of(&[0, 5, 6, 7]);
        let mut planner = KeyPlanner::default();
        let groups = planner.plan(rule.as_ref(), &decode_query(1), &rows);
        assert_eq!(groups[0].spans.of(0).to_vec(), vec![0..4]);
        // the prompt's own rows at the upper layer, before the check: the
        // prefill tokens 1..5 do not exist there and are not read
        let all = [0, 1, 2, 3, 4, 5, 6, 7];
        let keys = LayerKeys::layer(rule.as_ref(), 1, None);
        let mut runs = Vec::new();
        keys.spans(7, &all, &mut runs);
        assert_eq!(runs, vec![0..1, 5..8]);
    }

    /// Every answer, against the rule asked key by key: `k <= q`, inside
    /// the window, and shown by the policy.
    #[test]
    fn spans_are_the_keys_the_rule_shows_inside_the_window() {
        let phases = TokenPhases::new(12, 7, 1).expect("phases");
        let policies = [
            Policy::full(3),
            Policy::new(PolicyKind::Speed, 1, 3, Anchors::Bos).expect("speed"),
            Policy::new(PolicyKind::Speed, 2, 3, Anchors::None).expect("speed"),
            Policy::new(PolicyKind::SelfOnly, 1, 3, Anchors::Bos).expect("self-only"),
        ];
        let keys: Vec<usize> = vec![0, 1, 2, 4, 5, 7, 8, 9, 11];
        for policy in policies {
            let rule = policy.visibility(phases);
            for layer in 0..3 {
                for window in [None, Some(1), Some(3), Some(6)] {
                    let lk = LayerKeys::layer(rule.as_ref(), layer, window);
                    for q in 0..12 {
                        let expected: Vec<bool> = keys
                            .iter()
                            .map(|&k| {
                                k <= q && in_window(window, q, k) && rule.key_visible(layer, q, k)
                            })
                            .collect();
                        let row = lk.matrix(&[q], &keys);
                        assert_eq!(row, expected, "{policy} layer {layer} {window:?} q {q}");
                        let count = expected.iter().filter(|&&v| v).count();
                        assert_eq!(lk.count(q, &keys), count);
                    }
                }
            }
        }
    }

    #[test]
    fn a_training_row_whose_token_is_absent_reads_only_itself() {
        // SPEED at 1 of 2 without anchors: prefill tokens 0..4 are absent above
        let phases = TokenPhases::new(6, 4, 0).expect("phases");
        let rule = Policy::new(PolicyKind::Speed, 1, 2, Anchors::None)
            .expect("policy")
            .visibility(phases);
        let positions: Vec<usize> = (0..6).collect();
        let below = training_matrix(rule.as_ref(), 0, None, &positions);
        let causal: Vec<bool> = (0..36).map(|i| i % 6 <= i / 6).collect();
        assert_eq!(below, causal);
        let above = training_matrix(rule.as_ref(), 1, None, &positions);
        let row = |q: usize| above[q * 6..(q + 1) * 6].to_vec();
        assert_eq!(row(2), vec![false, false, true, false, false, false]);
        assert_eq!(row(5), vec![false, false, false, false, true, true]);
    }
}
