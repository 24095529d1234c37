//! The prompt blocks one SlimInfer run keeps: S_i per cut (fixed by the
//! prefill), the active set A_t per cut (moved by decode steps), and what
//! the KV manager holds, keeps resident and moves.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::phases::{Phase, TokenPhases};
use crate::slim::SlimParams;

/// The blocks of one sequence's prompt that exist at each cut, and the
/// blocks decode queries read there now.
///
/// Blocks are `B` positions aligned to position 0; block `b` covers
/// `[bB, min((b+1)B, s))` of the Prefill phase (`s` the decode start). The
/// first `sink` blocks are anchors, so prunable blocks start at `sink`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlimSelection {
    params: SlimParams,
    phases: TokenPhases,
    num_layers: usize,
    /// S_i per cut, over all blocks (`true` = kept); before the prefill
    /// decides, every block.
    kept: Vec<Vec<bool>>,
    /// A_t per cut: the blocks decode queries read (intersected with S_i).
    active: Vec<Vec<bool>>,
    /// Blocks whose K/V have been copied to the offload pool once per cut.
    offloaded: Vec<Vec<bool>>,
    /// Cuts decided so far (prefill decides them in order).
    decided: usize,
}

/// What one decode step's decision at one cut did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTraffic {
    /// Cut index (0-based).
    pub cut: usize,
    /// |C_t ∩ A_{t-1}| / |C_t| (1 when C_t is empty).
    pub overlap: f64,
    /// Whether the candidates replaced the active set.
    pub swapped: bool,
    /// Blocks that became active (sorted).
    pub entering: Vec<usize>,
    /// Blocks that stopped being active (sorted).
    pub leaving: Vec<usize>,
    /// Token-layers fetched back (entering blocks that hold K/V at this cut).
    pub fetched_token_layers: usize,
    /// Token-layers copied to the pool (blocks leaving for the first time).
    pub offloaded_token_layers: usize,
    /// The candidates C_t (ascending).
    pub candidates: Vec<usize>,
    /// A_t ∩ S_i after the step: the prunable blocks decode reads (ascending).
    pub active: Vec<usize>,
}

impl SlimSelection {
    /// Every block kept at every cut (what exists before the prefill
    /// decides), for a model of `num_layers` layers.
    pub fn new(params: SlimParams, phases: TokenPhases, num_layers: usize) -> Self {
        let blocks = phases.decode_start().div_ceil(params.options.block);
        let all = vec![true; blocks];
        let cuts = params.cuts().len();
        Self {
            params,
            phases,
            num_layers,
            kept: vec![all.clone(); cuts],
            active: vec![all; cuts],
            offloaded: vec![vec![false; blocks]; cuts],
            decided: 0,
        }
    }

    /// The policy's cuts, budgets and options.
    pub fn params(&self) -> &SlimParams {
        &self.params
    }

    /// The token phases of the sequence.
    pub fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    /// Depth of the model.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Number of cuts decided by the prefill so far.
    pub fn decided(&self) -> usize {
        self.decided
    }

    /// All blocks of the prompt before the decode start (sink included).
    pub fn num_blocks(&self) -> usize {
        self.kept.first().map_or(0, Vec::len)
    }

    /// The blocks a cut may prune: after the sink, before the decode start.
    pub fn prunable_blocks(&self) -> Range<usize> {
        let first = self.params.options.sink.min(self.num_blocks());
        first..self.num_blocks()
    }

    /// Positions of block `b`.
    pub fn block_positions(&self, b: usize) -> Range<usize> {
        let bs = self.params.options.block;
        let start = (b * bs).max(self.phases.anchor_len());
        start..((b + 1) * bs).min(self.phases.decode_start())
    }

    /// The block of a Prefill-phase position (`None` for anchors and the
    /// decode phase, which are never pruned).
    pub fn block_of(&self, pos: usize) -> Option<usize> {
        (self.phases.phase(pos) == Phase::Prefill).then(|| pos / self.params.options.block)
    }

    /// Record cut `i`'s kept blocks S_i (a subset of S_{i-1}); the active
    /// set starts as S_i. Cuts are decided in order.
    pub fn decide(&mut self, i: usize, blocks: &[usize]) {
        debug_assert_eq!(i, self.decided);
        let mut kept = vec![false; self.num_blocks()];
        for &b in blocks {
            kept[b] = true;
        }
        for b in 0..self.params.options.sink.min(kept.len()) {
            kept[b] = true;
        }
        if i > 0 {
            for (k, prev) in kept.iter_mut().zip(&self.kept[i - 1]) {
                *k &= *prev;
            }
        }
        // later cuts keep at most what this one keeps until they decide
        for later in &mut self.kept[i..] {
            later.clone_from(&kept);
        }
        self.active[i].clone_from(&kept);
        self.decided = i + 1;
    }

    /// S_i as sorted block indices, sink included.
    pub fn kept_blocks(&self, i: usize) -> Vec<usize> {
        indices(&self.kept[i])
    }

    /// A_t ∩ S_i as sorted block indices.
    pub fn active_blocks(&self, i: usize) -> Vec<usize> {
        indices(&and(&self.active[i], &self.kept[i]))
    }

    /// The blocks a decode query has read just below cut `i`: every block
    /// below the first cut, A_t^{(i-1)} ∩ S_{i-1} below the others (A9).
    pub fn candidate_domain(&self, i: usize) -> Vec<usize> {
        let mut blocks = match i {
            0 => (0..self.num_blocks()).collect(),
            _ => self.active_blocks(i - 1),
        };
        blocks.retain(|b| self.prunable_blocks().contains(b));
        blocks
    }

    /// Whether the token at `pos` has a hidden state and K/V at `layer`.
    pub fn exists(&self, layer: usize, pos: usize) -> bool {
        let seg = self.params.segment(layer);
        match (seg, self.block_of(pos)) {
            (0, _) | (_, None) => true,
            (s, Some(b)) => self.kept[s - 1][b],
        }
    }

    /// Whether a decode query reads the key at `pos` at `layer` now
    /// (present there and in the active set).
    pub fn decode_reads(&self, layer: usize, pos: usize) -> bool {
        let seg = self.params.segment(layer);
        match (seg, self.block_of(pos)) {
            (0, _) | (_, None) => true,
            (s, Some(b)) => self.kept[s - 1][b] && self.active[s - 1][b],
        }
    }

    /// The segment of `layer` (0 below the first cut).
    pub fn segment(&self, layer: usize) -> usize {
        self.params.segment(layer)
    }

    fn block_tokens(&self, set: &[bool]) -> usize {
        indices(set)
            .into_iter()
            .filter(|b| self.prunable_blocks().contains(b))
            .map(|b| self.block_positions(b).len())
            .sum()
    }

    /// P_i: Prefill-phase tokens kept at cut `i` (sink excluded).
    pub fn kept_tokens(&self, i: usize) -> usize {
        self.block_tokens(&self.kept[i])
    }

    /// P_i for every cut, in cut order.
    pub fn kept_tokens_per_cut(&self) -> Vec<usize> {
        (0..self.kept.len()).map(|i| self.kept_tokens(i)).collect()
    }

    /// The SPEED cutoff holding the same prompt K/V as this selection (§4.7's
    /// `L_eq`; the depth when there is no prunable prompt).
    pub fn equal_kv_cutoff(&self) -> f64 {
        self.params.equal_kv_cutoff(
            self.num_layers,
            self.phases.prefill_len(),
            &self.kept_tokens_per_cut(),
        )
    }

    /// R_i: Prefill-phase tokens of A_t ∩ S_i (what decode reads at cut `i`).
    pub fn resident_tokens(&self, i: usize) -> usize {
        self.block_tokens(&and(&self.active[i], &self.kept[i]))
    }

    /// Layers of segment `i + 1` (from cut `i` to the next cut or the top).
    pub fn segment_layers(&self, i: usize) -> usize {
        let cuts = self.params.cuts();
        cuts.get(i + 1).copied().unwrap_or(self.num_layers) - cuts[i]
    }

    /// Token-layers of K/V held: `c_1·P + Σ_i (c_{i+1} − c_i)·P_i + L·(A + D)`
    /// with `decode` decode-phase tokens D.
    pub fn held_token_layers(&self, decode: usize) -> usize {
        self.token_layers(decode, |i| self.kept_tokens(i))
    }

    /// Token-layers of K/V resident: as held with P_i replaced by R_i.
    pub fn resident_token_layers(&self, decode: usize) -> usize {
        self.token_layers(decode, |i| self.resident_tokens(i))
    }

    fn token_layers(&self, decode: usize, tokens_at: impl Fn(usize) -> usize) -> usize {
        let p = self.phases.prefill_len();
        let a = self.phases.anchor_len();
        let c1 = self.params.cuts()[0];
        let kept: usize = (0..self.params.cuts().len())
            .map(|i| self.segment_layers(i) * tokens_at(i))
            .sum();
        c1 * p + kept + self.num_layers * (a + decode)
    }

    /// A decode step's decision at cut `i` (Alg. 1): when the candidates'
    /// overlap with the active set is below γ they become the active set,
    /// entering blocks are fetched and blocks leaving for the first time are
    /// copied out; otherwise nothing moves.
    pub fn step(&mut self, i: usize, candidates: &[usize]) -> StepTraffic {
        let gamma = self.params.options.gamma();
        let prunable = self.prunable_blocks();
        let mut cand = vec![false; self.num_blocks()];
        for &b in candidates.iter().filter(|b| prunable.contains(b)) {
            cand[b] = true;
        }
        let chosen = indices(&cand);
        let common = chosen.iter().filter(|&&b| self.active[i][b]).count();
        let overlap = if chosen.is_empty() {
            1.0
        } else {
            common as f64 / chosen.len() as f64
        };
        let mut traffic = StepTraffic {
            cut: i,
            overlap,
            swapped: false,
            entering: vec![],
            leaving: vec![],
            fetched_token_layers: 0,
            offloaded_token_layers: 0,
            candidates: chosen,
            active: vec![],
        };
        if overlap >= gamma {
            traffic.active = self.active_prunable(i);
            return traffic;
        }
        let layers = self.segment_layers(i);
        for b in prunable {
            let (was, now) = (self.active[i][b], cand[b]);
            let held = self.kept[i][b];
            let tokens = self.block_positions(b).len();
            if now && !was {
                traffic.entering.push(b);
                if held {
                    traffic.fetched_token_layers += layers * tokens;
                }
            } else if was && !now {
                traffic.leaving.push(b);
                if held && !self.offloaded[i][b] {
                    self.offloaded[i][b] = true;
                    traffic.offloaded_token_layers += layers * tokens;
                }
            }
            self.active[i][b] = now;
        }
        traffic.swapped = true;
        traffic.active = self.active_prunable(i);
        traffic
    }

    fn active_prunable(&self, i: usize) -> Vec<usize> {
        let prunable = self.prunable_blocks();
        let mut blocks = self.active_blocks(i);
        blocks.retain(|b| prunable.contains(b));
        blocks
    }
}

fn indices(set: &[bool]) -> Vec<usize> {
    set.iter()
        .enumerate()
        .filter(|(_, k)| **k)
        .map(|(b, _)| b)
        .collect()
}

fn and(a: &[bool], b: &[bool]) -> Vec<bool> {
    a.iter().zip(b).map(|(x, y)| *x && *y).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KvCost, PolicySpec};

    fn selection(policy: &str, layers: usize, prompt: usize, decode_start: usize) -> SlimSelection {
        let spec: PolicySpec = policy.parse().unwrap();
        let policy = spec.resolve(layers).unwrap();
        let params = *policy.slim().unwrap();
        let anchors = policy.anchor_len(None, decode_start).unwrap();
        let phases = TokenPhases::new(prompt, decode_start, anchors).unwrap();
        SlimSelection::new(params, phases, layers)
    }

    #[test]
    fn blocks_cover_the_prefill_phase_after_the_sink() {
        // 8-token blocks, decode start 30: blocks 0..4, the last partial
        let s = selection("slim:1@50%+block:8+unit:2", 4, 33, 30);
        assert_eq!(s.num_blocks(), 4);
        assert_eq!(s.prunable_blocks(), 1..4);
        assert_eq!(s.block_positions(3), 24..30);
        assert_eq!(s.block_of(7), None);
        assert_eq!(s.block_of(8), Some(1));
        assert_eq!(s.block_of(30), None);
        // a prompt shorter than the sink: nothing to prune
        let s = selection("slim:1@50%", 4, 10, 9);
        assert_eq!(s.prunable_blocks().len(), 0);
        assert_eq!(s.held_token_layers(1), 4 * 10);
    }

    #[test]
    fn decided_sets_are_nested_and_existence_follows_them() {
        let mut s = selection("slim:1@50%,3@25%+block:4+unit:2", 4, 41, 40);
        s.decide(0, &[2, 3, 7]);
        s.decide(1, &[3, 5]);
        assert_eq!(s.kept_blocks(0), vec![0, 2, 3, 7]);
        assert_eq!(s.kept_blocks(1), vec![0, 3]);
        assert!(s.exists(0, 5));
        assert!(!s.exists(1, 5));
        assert!(s.exists(1, 8) && s.exists(2, 9) && !s.exists(3, 9));
        assert!(s.exists(3, 12) && s.exists(3, 0) && s.exists(3, 40));
        assert_eq!(s.kept_tokens(0), 12);
        assert_eq!(s.kept_tokens(1), 4);
    }

    #[test]
    fn held_token_layers_follow_the_formula() {
        let mut s = selection("slim:2@50%,5@20%+block:4+unit:2", 8, 60, 57);
        s.decide(0, &[1, 4, 5, 9, 14]);
        s.decide(1, &[5, 14]);
        let cost = KvCost {
            anchors: 4,
            prefill: 53,
            decode: 7,
        };
        let kept = [s.kept_tokens(0), s.kept_tokens(1)];
        assert_eq!(kept, [17, 5]); // block 14 is the partial block 56..57
        assert_eq!(
            s.held_token_layers(7),
            cost.slim_token_layers(s.params(), 8, &kept)
        );
        assert_eq!(s.held_token_layers(7), 2 * 53 + 3 * 17 + 3 * 5 + 8 * 11);
        assert!(s.resident_token_layers(7) <= s.held_token_layers(7));
    }

    #[test]
    fn swap_threshold_zero_never_moves_and_one_moves_on_any_change() {
        let mut s = selection("slim:1@50%+block:4+unit:2+swap:0", 4, 41, 40);
        s.decide(0, &[1, 2, 3, 4]);
        let t = s.step(0, &[6, 7, 8, 9]);
        assert_eq!((t.overlap, t.swapped), (0.0, false));
        assert_eq!(s.active_blocks(0), vec![0, 1, 2, 3, 4]);
        let mut s = selection("slim:1@50%+block:4+unit:2+swap:1", 4, 41, 40);
        s.decide(0, &[1, 2, 3, 4]);
        assert!(!s.step(0, &[1, 2, 3, 4]).swapped);
        let t = s.step(0, &[1, 2, 3, 5]);
        assert_eq!((t.overlap, t.swapped), (0.75, true));
        assert_eq!((t.entering, t.leaving), (vec![5], vec![4]));
    }

    #[test]
    fn traffic_follows_algorithm_1() {
        // cut at layer 1 of 4: three layers hold each kept block
        let mut s = selection("slim:1@50%+block:4+unit:2+swap:0.9", 4, 41, 40);
        s.decide(0, &[1, 2]);
        // block 3 is not held at the cut: choosing it fetches nothing
        let t = s.step(0, &[1, 3]);
        assert!(t.swapped);
        assert_eq!(t.fetched_token_layers, 0);
        assert_eq!(t.offloaded_token_layers, 3 * 4); // block 2 leaves first time
        assert_eq!(s.active_blocks(0), vec![0, 1]); // 3 is chosen but absent
        assert!(s.resident_token_layers(1) < s.held_token_layers(1));
        let t = s.step(0, &[1, 2]);
        assert_eq!(t.fetched_token_layers, 3 * 4); // block 2 comes back
        assert_eq!(t.offloaded_token_layers, 0); // block 3 holds nothing
        let t = s.step(0, &[1, 3]);
        assert_eq!(t.offloaded_token_layers, 0); // block 2 leaves again: free
        // overlap at exactly γ keeps the active set
        let mut s = selection("slim:1@50%+block:4+unit:2+swap:0.5", 4, 41, 40);
        s.decide(0, &[1, 2]);
        assert!(!s.step(0, &[1, 5]).swapped);
        assert!(s.step(0, &[5, 6]).swapped);
    }

    #[test]
    fn later_cuts_score_among_what_the_previous_cut_reads() {
        let mut s = selection("slim:1@50%,2@25%+block:4+unit:2+swap:1", 4, 41, 40);
        s.decide(0, &[1, 2, 3, 4]);
        s.decide(1, &[1, 2]);
        assert_eq!(s.candidate_domain(0), (1..10).collect::<Vec<_>>());
        assert_eq!(s.candidate_domain(1), vec![1, 2, 3, 4]);
        s.step(0, &[1, 2, 5, 6]);
        assert_eq!(s.candidate_domain(1), vec![1, 2]);
    }
}
