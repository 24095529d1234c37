//! The static one-cut rules: the full model, SPEED and the SelfOnly ablation.
//! Below the cutoff every token exists and every earlier key is read; above
//! it prefill tokens are gone, and a decode-phase query reads the anchors and
//! decode-phase tokens (SPEED) or only itself and the anchors (SelfOnly).

use crate::phases::{Phase, TokenPhases};
use crate::visibility::{KvAccounting, Visibility, token_layers_by_phase};

/// What a decode-phase query reads above the cutoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpperReads {
    /// Anchors and decode-phase tokens (SPEED).
    AnchorsAndDecode,
    /// Itself and the anchors (SelfOnly).
    SelfAndAnchors,
}

/// SPEED, SelfOnly or the full model for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRule {
    l_cut: usize,
    num_layers: usize,
    upper: UpperReads,
    phases: TokenPhases,
}

impl LayerRule {
    /// The rule with a cutoff at `l_cut` of `num_layers` (`l_cut ==
    /// num_layers` is the full model) over `phases`.
    pub fn new(l_cut: usize, num_layers: usize, upper: UpperReads, phases: TokenPhases) -> Self {
        Self {
            l_cut,
            num_layers,
            upper,
            phases,
        }
    }

    /// True at and above the cutoff.
    fn is_upper(&self, layer: usize) -> bool {
        layer >= self.l_cut
    }

    /// Whether `layer` keeps the K/V of tokens of `phase`.
    fn keeps_phase(&self, layer: usize, phase: Phase) -> bool {
        if !self.is_upper(layer) {
            return true;
        }
        match self.upper {
            UpperReads::SelfAndAnchors => phase == Phase::Anchor,
            UpperReads::AnchorsAndDecode => phase != Phase::Prefill,
        }
    }
}

impl Visibility for LayerRule {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, layer: usize, pos: usize) -> bool {
        !self.is_upper(layer) || self.phases.phase(pos) != Phase::Prefill
    }

    fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        self.keeps_phase(layer, self.phases.phase(pos))
    }

    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        if !self.is_upper(layer) {
            return true;
        }
        match self.upper {
            UpperReads::SelfAndAnchors => k == q || self.phases.phase(k) == Phase::Anchor,
            UpperReads::AnchorsAndDecode => self.phases.phase(k) != Phase::Prefill,
        }
    }

    fn rule_class(&self, layer: usize) -> usize {
        usize::from(self.is_upper(layer))
    }
}

impl KvAccounting for LayerRule {
    fn held_token_layers(&self, decode: usize) -> usize {
        let counts = [
            (Phase::Anchor, self.phases.anchor_len()),
            (Phase::Prefill, self.phases.prefill_len()),
            (Phase::Decode, decode),
        ];
        token_layers_by_phase(self.num_layers(), counts, |l, ph| self.keeps_phase(l, ph))
    }

    fn present_per_layer(&self, len: usize) -> Vec<usize> {
        let prefill = self
            .phases
            .prefill_len()
            .min(len.saturating_sub(self.phases.anchor_len()));
        (0..self.num_layers())
            .map(|l| match self.is_upper(l) {
                true => len - prefill,
                false => len,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Anchors, Policy, PolicyKind};

    fn rule(kind: PolicyKind, l_cut: usize, layers: usize) -> Box<dyn Visibility> {
        let ph = TokenPhases::new(10, 7, 1).unwrap();
        Policy::new(kind, l_cut, layers, Anchors::Bos)
            .unwrap()
            .visibility(ph)
    }

    #[test]
    fn speed_rule_matches_the_design() {
        let p = rule(PolicyKind::Speed, 2, 4);
        // lower layers: everything
        assert!(p.key_visible(1, 8, 3));
        assert!(p.token_exists(1, 3));
        // upper layers: anchors and decode-phase tokens only
        assert!(!p.token_exists(2, 3));
        assert!(p.token_exists(2, 0));
        assert!(p.token_exists(3, 7));
        assert!(!p.key_visible(2, 8, 3));
        assert!(p.key_visible(2, 8, 0));
        assert!(p.key_visible(2, 8, 7));
        assert!(!p.retains_kv(3, 5));
        assert!(p.retains_kv(3, 9));
        assert_eq!((p.rule_class(1), p.rule_class(2)), (0, 1));
    }

    #[test]
    fn selfonly_reads_itself_and_anchor() {
        let p = rule(PolicyKind::SelfOnly, 2, 4);
        assert!(p.key_visible(2, 8, 8));
        assert!(p.key_visible(2, 8, 0));
        assert!(!p.key_visible(2, 8, 7));
        assert!(!p.retains_kv(2, 8));
        assert!(p.retains_kv(2, 0));
    }

    #[test]
    fn counts_by_phase_equal_counts_by_position() {
        // the overrides must agree with the interface's own definitions
        for kind in [PolicyKind::Speed, PolicyKind::SelfOnly, PolicyKind::Full] {
            for cut in 1..=4 {
                let p = rule(kind, cut, 4);
                let by_position = (0..4)
                    .map(|l| (0..12).filter(|&pos| p.retains_kv(l, pos)).count())
                    .sum::<usize>();
                assert_eq!(
                    p.accounting().held_token_layers(5),
                    by_position,
                    "{kind:?} {cut}"
                );
                let present: Vec<usize> = (0..4)
                    .map(|l| (0..10).filter(|&pos| p.token_exists(l, pos)).count())
                    .collect();
                assert_eq!(
                    p.accounting().present_per_layer(10),
                    present,
                    "{kind:?} {cut}"
                );
            }
        }
    }
}
