//! Projected prompt K/V: SwiftKV's SingleInputKV (arXiv 2410.03960) and
//! Prefill-Only Pruning (POP, arXiv 2602.03295) as inference rules.
//!
//! A prompt token before the decode start (not an anchor) runs the layers
//! below the cut `C` and leaves the model at layer `C`'s input; every layer
//! from `C` on still keeps its K/V, projected by that layer's own input norm
//! and K/V projections (biases, k-norm, RoPE at the token's own position)
//! from the hidden state that enters layer `C`. Anchors and decode-phase
//! tokens run every layer and read every earlier key. Every layer keeps
//! every token's K/V, so the cache is the full model's in size; what the
//! policy saves is the prompt's upper-layer queries, attention and MLPs.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::phases::{Phase, TokenPhases};
use crate::visibility::{KvAccounting, Visibility};

/// The name a projected-K/V policy is written with; both name the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProjectedName {
    /// `swiftkv:C`: SwiftKV's SingleInputKV.
    SwiftKv,
    /// `pop:C`: Prefill-Only Pruning.
    Pop,
}

impl ProjectedName {
    /// Every name, as written before `:`.
    pub const ALL: [ProjectedName; 2] = [ProjectedName::SwiftKv, ProjectedName::Pop];

    /// The name as written before `:`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProjectedName::SwiftKv => "swiftkv",
            ProjectedName::Pop => "pop",
        }
    }

    /// The name written `text` (lower case), if it is one.
    pub fn from_name(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.as_str() == text)
    }
}

impl fmt::Display for ProjectedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Projected prompt K/V at cut `C` for one sequence (`C == L` is the full
/// model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectedKv {
    cut: usize,
    num_layers: usize,
    phases: TokenPhases,
}

impl ProjectedKv {
    /// The rule with prompt tokens leaving at layer `cut` of `num_layers`.
    pub fn new(cut: usize, num_layers: usize, phases: TokenPhases) -> Self {
        Self {
            cut,
            num_layers,
            phases,
        }
    }

    /// Whether the token at `pos` leaves at the cut (a prefill token, when
    /// the cut is below the depth).
    fn leaves(&self, pos: usize) -> bool {
        self.cut < self.num_layers && self.phases.phase(pos) == Phase::Prefill
    }
}

impl Visibility for ProjectedKv {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, layer: usize, pos: usize) -> bool {
        layer < self.cut || !self.leaves(pos)
    }

    /// Every layer keeps every token's K/V (its own, or projected).
    fn retains_kv(&self, _layer: usize, _pos: usize) -> bool {
        true
    }

    /// Every earlier key, at every layer.
    fn key_visible(&self, _layer: usize, _q: usize, _k: usize) -> bool {
        true
    }

    fn rule_class(&self, _layer: usize) -> usize {
        0
    }

    fn kv_projected_at(&self, pos: usize) -> Option<usize> {
        self.leaves(pos).then_some(self.cut)
    }
}

impl KvAccounting for ProjectedKv {
    fn held_token_layers(&self, decode: usize) -> usize {
        self.num_layers * (self.phases.decode_start() + decode)
    }

    fn present_per_layer(&self, len: usize) -> Vec<usize> {
        let projected = self.projected_per_layer(len);
        projected.iter().map(|p| len - p).collect()
    }

    fn projected_per_layer(&self, len: usize) -> Vec<usize> {
        let leaving = match self.cut < self.num_layers {
            true => {
                let a = self.phases.anchor_len();
                self.phases.decode_start().min(len).saturating_sub(a)
            }
            false => 0,
        };
        (0..self.num_layers)
            .map(|l| if l < self.cut { 0 } else { leaving })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(cut: usize, anchors: usize) -> ProjectedKv {
        ProjectedKv::new(cut, 4, TokenPhases::new(10, 7, anchors).unwrap())
    }

    #[test]
    fn prompt_tokens_leave_at_the_cut_and_keep_projected_kv() {
        let p = rule(2, 1);
        assert!(p.token_exists(1, 3) && !p.token_exists(2, 3) && !p.token_exists(3, 6));
        // the anchor and the decode phase run every layer
        assert!(p.token_exists(3, 0) && p.token_exists(3, 7) && p.token_exists(3, 9));
        assert_eq!(p.kv_projected_at(3), Some(2));
        assert_eq!(p.kv_projected_at(0), None);
        assert_eq!(p.kv_projected_at(7), None);
        assert!((0..4).all(|l| (0..12).all(|pos| p.retains_kv(l, pos))));
        assert!(p.key_visible(3, 8, 3) && p.key_visible(2, 8, 0));
        assert_eq!((p.rule_class(0), p.rule_class(3)), (0, 0));
    }

    #[test]
    fn anchor_free_projects_the_first_token_too() {
        let p = rule(2, 0);
        assert_eq!(p.kv_projected_at(0), Some(2));
        assert!(!p.token_exists(2, 0));
    }

    #[test]
    fn a_cut_at_depth_projects_nothing() {
        let p = rule(4, 1);
        assert!((0..4).all(|l| (0..12).all(|pos| p.token_exists(l, pos))));
        assert!((0..12).all(|pos| p.kv_projected_at(pos).is_none()));
        assert_eq!(p.projected_per_layer(10), vec![0; 4]);
    }

    #[test]
    fn counts_equal_the_interface_definitions() {
        for cut in 1..=4 {
            for anchors in [0, 1] {
                let p = rule(cut, anchors);
                let by_position: usize = (0..4)
                    .map(|l| (0..12).filter(|&pos| p.retains_kv(l, pos)).count())
                    .sum();
                assert_eq!(p.held_token_layers(5), by_position);
                for len in [3, 7, 10] {
                    let present: Vec<usize> = (0..4)
                        .map(|l| (0..len).filter(|&pos| p.token_exists(l, pos)).count())
                        .collect();
                    assert_eq!(p.present_per_layer(len), present, "{cut} {anchors} {len}");
                    let projected: Vec<usize> = (0..4)
                        .map(|l| {
                            (0..len)
                                .filter(|&pos| p.kv_projected_at(pos).is_some_and(|c| c <= l))
                                .count()
                        })
                        .collect();
                    assert_eq!(
                        p.projected_per_layer(len),
                        projected,
                        "{cut} {anchors} {len}"
                    );
                }
                // K/V held is the full model's: the equal-K/V cutoff is the depth
                assert_eq!(p.equal_kv_cutoff(2), 4.0);
            }
        }
    }
}
