//! Prompt knockout: the prompt (its anchors kept) is invisible to
//! decode-phase queries at a band of layers `first..=last` only
//! (`knockout:l` is the band of one layer, `band:a..b` layers `a` to `b`).
//! Every token runs every layer, and the prompt's own queries read the whole
//! prompt at every layer, so below, inside and above the band the prompt's
//! hidden states are the full model's; inside the band the layers keep no
//! K/V of the prompt once it has run. This is activation patching of prompt
//! visibility: how much the answer moves when the prompt is taken from
//! those layers alone. A band that reaches the top layer keeps SPEED's K/V
//! but not its prefill saving (the prompt still runs the band's layers).

use crate::phases::{Phase, TokenPhases};
use crate::visibility::{KvAccounting, Visibility, token_layers_by_phase};

/// A band of layers without the prompt, for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandRule {
    first: usize,
    last: usize,
    num_layers: usize,
    phases: TokenPhases,
}

impl BandRule {
    /// The band `first..=last` (0-based layers, `first <= last <
    /// num_layers`) over `phases`.
    pub fn new(first: usize, last: usize, num_layers: usize, phases: TokenPhases) -> Self {
        Self {
            first,
            last,
            num_layers,
            phases,
        }
    }

    fn in_band(&self, layer: usize) -> bool {
        (self.first..=self.last).contains(&layer)
    }

    /// Whether `layer` keeps, once the prompt has run, the K/V of tokens of
    /// `phase`.
    fn keeps_phase(&self, layer: usize, phase: Phase) -> bool {
        !self.in_band(layer) || phase != Phase::Prefill
    }
}

impl Visibility for BandRule {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, _layer: usize, _pos: usize) -> bool {
        true
    }

    fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        self.keeps_phase(layer, self.phases.phase(pos))
    }

    /// In the band a decode-phase query reads the anchors and the decode
    /// phase; a prompt query reads every earlier key.
    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        !self.in_band(layer)
            || self.phases.phase(q) != Phase::Decode
            || self.phases.phase(k) != Phase::Prefill
    }

    fn rule_class(&self, layer: usize) -> usize {
        usize::from(self.in_band(layer))
    }
}

impl KvAccounting for BandRule {
    fn held_token_layers(&self, decode: usize) -> usize {
        let counts = [
            (Phase::Anchor, self.phases.anchor_len()),
            (Phase::Prefill, self.phases.prefill_len()),
            (Phase::Decode, decode),
        ];
        token_layers_by_phase(self.num_layers, counts, |l, ph| self.keeps_phase(l, ph))
    }

    fn present_per_layer(&self, len: usize) -> Vec<usize> {
        vec![len; self.num_layers]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band(first: usize, last: usize) -> BandRule {
        BandRule::new(first, last, 6, TokenPhases::new(10, 7, 1).expect("phases"))
    }

    #[test]
    fn the_band_hides_the_prompt_from_decode_queries_only() {
        let b = band(2, 3);
        // outside the band: every earlier key
        assert!(b.key_visible(1, 8, 3) && b.key_visible(4, 8, 3));
        // in the band: a decode query reads the anchor and the decode phase
        assert!(!b.key_visible(2, 8, 3) && !b.key_visible(3, 7, 6));
        assert!(b.key_visible(2, 8, 0) && b.key_visible(3, 8, 7));
        // the prompt's own queries read the whole prompt everywhere
        assert!(b.key_visible(2, 6, 3));
        // every token runs every layer; the band keeps no prompt K/V
        assert!((0..6).all(|l| b.token_exists(l, 3)));
        assert!(!b.retains_kv(2, 3) && b.retains_kv(2, 0) && b.retains_kv(5, 3));
    }

    #[test]
    fn counts_by_phase_equal_counts_by_position() {
        for (first, last) in [(0, 0), (2, 3), (5, 5), (0, 5)] {
            let b = band(first, last);
            let by_position: usize = (0..6)
                .map(|l| (0..12).filter(|&p| b.retains_kv(l, p)).count())
                .sum();
            assert_eq!(b.held_token_layers(5), by_position, "{first}..{last}");
            // the prompt's K/V leaves exactly the band's layers
            let full = 6 * 12;
            assert_eq!(by_position, full - (last - first + 1) * 6);
        }
    }
}
