//! SPEED with head exceptions (`speed:C+bos+heads:FILE`): below the cut
//! every token; at and above it a decode-phase query reads the anchors and
//! the decode phase, except through the kept (layer, K/V head) pairs, which
//! read every earlier position, and, with `+window:W`, through every other
//! head, which also reads the last W prompt positions (DuoAttention's
//! streaming heads). The prompt runs every layer up to the highest layer
//! whose keys some head keeps, reading the whole prompt there, so a kept
//! head reads the full model's K/V; above that layer it is gone, as in
//! SPEED. Once the prompt has run, a layer keeps the prompt's K/V only for
//! the heads that read it.

use crate::heads::HeadSet;
use crate::phases::{Phase, TokenPhases};
use crate::visibility::{KvAccounting, Visibility};

/// SPEED at a cut with kept heads above it, for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadRule {
    l_cut: usize,
    num_layers: usize,
    phases: TokenPhases,
    heads: HeadSet,
    window: Option<usize>,
    /// The model's K/V heads, when known (a layer whose heads are all kept
    /// is then the full model's).
    kv_heads: Option<usize>,
}

impl HeadRule {
    /// The rule at `l_cut` of `num_layers` keeping `heads` (and the last
    /// `window` prompt positions for the others) over `phases`.
    pub fn new(
        l_cut: usize,
        num_layers: usize,
        phases: TokenPhases,
        heads: HeadSet,
        window: Option<usize>,
        kv_heads: Option<usize>,
    ) -> Self {
        Self {
            l_cut,
            num_layers,
            phases,
            heads,
            window,
            kv_heads,
        }
    }

    fn is_upper(&self, layer: usize) -> bool {
        layer >= self.l_cut
    }

    /// The highest layer where the prompt still runs (its keys kept by
    /// some head there), if any above the cut.
    fn prompt_top(&self) -> Option<usize> {
        match self.window {
            Some(_) if self.l_cut < self.num_layers => Some(self.num_layers - 1),
            _ => self.heads.top_layer(),
        }
    }

    /// Whether the prefill token at `pos` is among the last `window`
    /// prompt positions the heads not kept still read.
    fn in_window(&self, pos: usize) -> bool {
        self.window
            .is_some_and(|w| pos + w >= self.phases.decode_start())
    }

    /// Whether every K/V head of `layer` is kept.
    fn all_kept(&self, layer: usize) -> bool {
        self.kv_heads
            .is_some_and(|kv| self.heads.count_at(layer) >= kv)
    }

    /// Prefill tokens the heads not kept at a layer still hold.
    fn window_len(&self) -> usize {
        let p = self.phases.prefill_len();
        self.window.map_or(0, |w| w.min(p))
    }
}

impl Visibility for HeadRule {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, layer: usize, pos: usize) -> bool {
        !self.is_upper(layer)
            || self.phases.phase(pos) != Phase::Prefill
            || self.prompt_top().is_some_and(|top| layer <= top)
    }

    fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        !self.is_upper(layer)
            || self.phases.phase(pos) != Phase::Prefill
            || self.heads.count_at(layer) > 0
            || self.in_window(pos)
    }

    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        self.retains_kv(layer, k) || self.phases.phase(q) != Phase::Decode
    }

    fn rule_class(&self, layer: usize) -> usize {
        usize::from(self.is_upper(layer) && self.heads.count_at(layer) == 0)
    }

    fn heads_differ(&self, layer: usize) -> bool {
        self.is_upper(layer) && self.heads.count_at(layer) > 0 && !self.all_kept(layer)
    }

    fn head_retains_kv(&self, layer: usize, kv_head: usize, pos: usize) -> bool {
        !self.is_upper(layer)
            || self.phases.phase(pos) != Phase::Prefill
            || self.heads.contains(layer, kv_head)
            || self.in_window(pos)
    }

    fn head_key_visible(&self, layer: usize, kv_head: usize, q: usize, k: usize) -> bool {
        self.head_retains_kv(layer, kv_head, k) || self.phases.phase(q) != Phase::Decode
    }

    fn head_rule_class(&self, layer: usize, kv_head: usize) -> usize {
        usize::from(self.is_upper(layer) && !self.heads.contains(layer, kv_head))
    }
}

impl KvAccounting for HeadRule {
    fn held_token_layers(&self, decode: usize) -> usize {
        let (a, p) = (self.phases.anchor_len(), self.phases.prefill_len());
        (0..self.num_layers)
            .map(|l| match self.is_upper(l) {
                false => a + p + decode,
                true if self.heads.count_at(l) > 0 => a + p + decode,
                true => a + decode + self.window_len(),
            })
            .sum()
    }

    fn held_head_rows(&self, decode: usize, kv_heads: usize) -> usize {
        let (a, p) = (self.phases.anchor_len(), self.phases.prefill_len());
        (0..self.num_layers)
            .map(|l| match self.is_upper(l) {
                false => kv_heads * (a + p + decode),
                true => {
                    let kept = self.heads.count_at(l).min(kv_heads);
                    kv_heads * (a + decode) + kept * p + (kv_heads - kept) * self.window_len()
                }
            })
            .sum()
    }

    fn present_per_layer(&self, len: usize) -> Vec<usize> {
        let prefill = self
            .phases
            .prefill_len()
            .min(len.saturating_sub(self.phases.anchor_len()));
        let top = self.prompt_top();
        (0..self.num_layers)
            .map(|l| match !self.is_upper(l) || top.is_some_and(|t| l <= t) {
                true => len,
                false => len - prefill,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(heads: &[(usize, usize)], window: Option<usize>) -> HeadRule {
        let phases = TokenPhases::new(12, 9, 1).expect("phases");
        HeadRule::new(
            3,
            6,
            phases,
            HeadSet::of(heads.iter().copied()),
            window,
            Some(2),
        )
    }

    #[test]
    fn a_kept_head_reads_the_prompt_above_the_cut_and_the_others_do_not() {
        let r = rule(&[(4, 1)], None);
        // below the cut: everything
        assert!(r.head_key_visible(2, 0, 10, 5) && !r.heads_differ(2));
        // layer 4: head 1 kept, head 0 as SPEED
        assert!(r.heads_differ(4));
        assert!(r.head_key_visible(4, 1, 10, 5));
        assert!(!r.head_key_visible(4, 0, 10, 5));
        assert!(r.head_key_visible(4, 0, 10, 0) && r.head_key_visible(4, 0, 10, 9));
        // the prompt's own queries read the whole prompt up to the top kept layer
        assert!(r.head_key_visible(4, 0, 7, 5));
        assert!(r.token_exists(4, 5) && !r.token_exists(5, 5));
        // a layer with no kept head is SPEED's, for every head
        assert!(!r.heads_differ(3) && !r.retains_kv(3, 5) && r.rule_class(3) == 1);
        assert_eq!((r.head_rule_class(4, 1), r.head_rule_class(4, 0)), (0, 1));
    }

    #[test]
    fn counts_by_phase_equal_counts_by_position() {
        for (heads, window) in [
            (vec![], None),
            (vec![(4, 1)], None),
            (vec![(3, 0), (3, 1), (5, 0)], None),
            (vec![(5, 0)], Some(3)),
            (vec![], Some(20)),
        ] {
            let r = rule(&heads, window);
            for decode in [0, 4] {
                let len = 9 + decode;
                let rows: usize = (0..6)
                    .map(|l| {
                        (0..2)
                            .map(|h| (0..len).filter(|&p| r.head_retains_kv(l, h, p)).count())
                            .sum::<usize>()
                    })
                    .sum();
                assert_eq!(r.held_head_rows(decode, 2), rows, "{heads:?} {window:?}");
                let layers: usize = (0..6)
                    .map(|l| (0..len).filter(|&p| r.retains_kv(l, p)).count())
                    .sum();
                assert_eq!(r.held_token_layers(decode), layers, "{heads:?} {window:?}");
            }
            let present: Vec<usize> = (0..6)
                .map(|l| (0..12).filter(|&p| r.token_exists(l, p)).count())
                .collect();
            assert_eq!(r.present_per_layer(12), present, "{heads:?} {window:?}");
        }
    }

    #[test]
    fn the_window_keeps_the_last_prompt_positions_for_the_heads_not_kept() {
        let r = rule(&[], Some(3));
        // prefill is 1..9; the last three prompt positions are 6, 7, 8
        assert!(r.head_key_visible(5, 0, 10, 6) && !r.head_key_visible(5, 0, 10, 5));
        assert!(
            r.token_exists(5, 2),
            "the window's K/V needs the prompt at every layer"
        );
    }
}
