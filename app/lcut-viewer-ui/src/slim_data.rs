//! A SlimInfer run as the viewer shows it: the engine's [`SlimTrace`] plus
//! what the drawings need besides it (depth, prompt length, γ, the prompt's
//! tokens), and what follows from it: which positions exist at each layer,
//! the budget line of each cut's scores, the active sets over decode steps.
//!
//! Positions: the sink is `[0, sink_tokens)`, the prunable Prefill phase
//! `[sink_tokens, decode_start)` in blocks of `B` aligned to position 0, the
//! decode phase from `decode_start` on. Layer `l` is in segment `i` = the
//! number of cuts `<= l`; in segment `i > 0` a prunable position exists iff
//! its block is in cut `i - 1`'s kept blocks.

use lcut_policy::{SlimTrace, StepRecord};

/// What a prompt position is at one layer of a SlimInfer run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PositionState {
    /// A sink (anchor) token: present at every layer.
    Sink,
    /// A prunable token below the first cut: every token is present.
    BelowFirstCut,
    /// A prunable token in a block the latest cut kept.
    Kept,
    /// A prunable token in a block a cut pruned: no hidden state, no K/V.
    Pruned,
    /// A decode-phase prompt token (generation prompt): never pruned.
    DecodePhase,
}

impl PositionState {
    /// In words, for hover text and legends.
    pub fn label(self) -> &'static str {
        match self {
            PositionState::Sink => "sink (kept at every layer)",
            PositionState::BelowFirstCut => "present (below the first cut)",
            PositionState::Kept => "kept block",
            PositionState::Pruned => "pruned: no hidden state, no K/V",
            PositionState::DecodePhase => "decode phase (never pruned)",
        }
    }
}

/// Blocks `[first, end)` that are pruned from `layer` up (adjacent blocks
/// pruned at the same cut, merged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrunedRun {
    /// First block.
    pub first: usize,
    /// One past the last block.
    pub end: usize,
    /// The cut layer from which they are gone.
    pub layer: usize,
}

/// A SlimInfer run of the live view.
#[derive(Debug, Clone, PartialEq)]
pub struct SlimRunView {
    /// The policy, written out (resolved).
    pub policy: String,
    /// Layers of the model.
    pub num_layers: usize,
    /// Prompt tokens (the decode phase's prompt tokens included).
    pub prompt_len: usize,
    /// The swap threshold γ.
    pub gamma: f64,
    /// The prompt's tokens as text (empty without a tokenizer).
    pub prompt_tokens: Vec<String>,
    /// What the run decided.
    pub trace: SlimTrace,
}

impl SlimRunView {
    /// Where the decode phase starts: after the sink and the Prefill phase.
    pub fn decode_start(&self) -> usize {
        self.trace.sink_tokens + self.trace.prefill_tokens
    }

    /// Blocks of the prompt before the decode start (sink blocks included).
    pub fn num_blocks(&self) -> usize {
        self.decode_start().div_ceil(self.trace.block.max(1))
    }

    /// Blocks the sink covers.
    pub fn sink_blocks(&self) -> usize {
        self.trace.sink_tokens.div_ceil(self.trace.block.max(1))
    }

    /// The cut layers c_1 < c_2 < ...
    pub fn cut_layers(&self) -> Vec<usize> {
        self.trace.cuts.iter().map(|c| c.layer).collect()
    }

    /// The segment of `layer`: the number of cuts at or below it.
    pub fn segment(&self, layer: usize) -> usize {
        self.trace.cuts.partition_point(|c| c.layer <= layer)
    }

    /// Positions of block `b` (clipped to the Prefill phase's end).
    pub fn block_positions(&self, b: usize) -> std::ops::Range<usize> {
        let bs = self.trace.block;
        (b * bs).min(self.decode_start())..((b + 1) * bs).min(self.decode_start())
    }

    /// What position `pos` is at `layer`.
    pub fn state(&self, layer: usize, pos: usize) -> PositionState {
        if pos < self.trace.sink_tokens {
            return PositionState::Sink;
        }
        if pos >= self.decode_start() {
            return PositionState::DecodePhase;
        }
        match self.segment(layer) {
            0 => PositionState::BelowFirstCut,
            s => {
                let block = pos / self.trace.block.max(1);
                if self.trace.cuts[s - 1].kept.binary_search(&block).is_ok() {
                    PositionState::Kept
                } else {
                    PositionState::Pruned
                }
            }
        }
    }

    /// Whether position `pos` has a hidden state and K/V at `layer`.
    pub fn exists(&self, layer: usize, pos: usize) -> bool {
        self.state(layer, pos) != PositionState::Pruned
    }

    /// The first cut layer at which prunable block `b` is gone, if any.
    pub fn pruned_from(&self, b: usize) -> Option<usize> {
        self.trace
            .cuts
            .iter()
            .find(|c| c.kept.binary_search(&b).is_err())
            .map(|c| c.layer)
    }

    /// The pruned blocks as runs of adjacent blocks pruned at the same cut,
    /// in block order: each is absent from its layer to the top.
    pub fn pruned_runs(&self) -> Vec<PrunedRun> {
        let mut runs: Vec<PrunedRun> = Vec::new();
        for b in self.sink_blocks()..self.num_blocks() {
            let Some(layer) = self.pruned_from(b) else {
                continue;
            };
            match runs.last_mut() {
                Some(r) if r.end == b && r.layer == layer => r.end = b + 1,
                _ => runs.push(PrunedRun {
                    first: b,
                    end: b + 1,
                    layer,
                }),
            }
        }
        runs
    }

    /// Cut `i`'s budget in prunable blocks: `max(sink, ⌈K_i/B⌉)` less the
    /// sink blocks.
    pub fn budget_blocks(&self, i: usize) -> usize {
        let k = self.trace.cuts[i].budget_tokens;
        let sink = self.sink_blocks();
        k.div_ceil(self.trace.block.max(1)).max(sink) - sink
    }

    /// The score of the budget's last block at cut `i` (the k-th best
    /// candidate score, k the budget in blocks); `None` when the budget is
    /// zero or covers every candidate.
    pub fn budget_score(&self, i: usize) -> Option<f32> {
        let k = self.budget_blocks(i);
        let mut scores: Vec<f32> = self.trace.cuts[i].scores.iter().map(|s| s.1).collect();
        if k == 0 || k >= scores.len() {
            return None;
        }
        scores.sort_by(|a, b| b.total_cmp(a));
        Some(scores[k - 1])
    }

    /// Per decode step, cut `i`'s overlap ratio: `[step, overlap]`.
    pub fn overlap_series(&self, i: usize) -> Vec<[f64; 2]> {
        self.cut_steps(i)
            .enumerate()
            .map(|(k, t)| [k as f64, t.overlap])
            .collect()
    }

    /// The decode steps at which cut `i` swapped its active set.
    pub fn swap_steps(&self, i: usize) -> Vec<usize> {
        self.cut_steps(i)
            .enumerate()
            .filter(|(_, t)| t.swapped)
            .map(|(k, _)| k)
            .collect()
    }

    fn cut_steps(&self, i: usize) -> impl Iterator<Item = &lcut_policy::StepTraffic> {
        self.trace.steps.iter().filter_map(move |s| s.cuts.get(i))
    }

    /// Appends decode-step records as they stream in.
    pub fn extend_steps(&mut self, steps: impl IntoIterator<Item = StepRecord>) {
        self.trace.steps.extend(steps);
    }

    /// The prompt token at `pos` as text, when known.
    pub fn token(&self, pos: usize) -> Option<&str> {
        self.prompt_tokens.get(pos).map(String::as_str)
    }
}

/// What a block is at one decode step of one cut, for the raster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockActivity {
    /// Not a prunable block (sink) or not kept by the prefill at this cut.
    Absent,
    /// Kept at this cut but not read by decode now (could sit offloaded).
    Inactive,
    /// Read by decode (in A_t ∩ S_i).
    Active,
    /// Became active at this step (fetched back).
    Entering,
}

impl BlockActivity {
    /// In words, for hover text and legends.
    pub fn label(self) -> &'static str {
        match self {
            BlockActivity::Absent => "not kept here",
            BlockActivity::Inactive => "kept, inactive (offloadable)",
            BlockActivity::Active => "active",
            BlockActivity::Entering => "entered at this step",
        }
    }
}

impl SlimRunView {
    /// What block `b` is at decode step `k` of cut `i`.
    pub fn activity(&self, i: usize, k: usize, b: usize) -> BlockActivity {
        let Some(t) = self.trace.steps.get(k).and_then(|s| s.cuts.get(i)) else {
            return BlockActivity::Absent;
        };
        if t.active.binary_search(&b).is_ok() {
            if t.entering.binary_search(&b).is_ok() {
                BlockActivity::Entering
            } else {
                BlockActivity::Active
            }
        } else if self.trace.cuts[i].kept.binary_search(&b).is_ok() {
            BlockActivity::Inactive
        } else {
            BlockActivity::Absent
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::synthetic_slim;

    #[test]
    fn existence_follows_the_cuts() {
        // 16 layers, 100 prompt tokens, decode phase from 96: 6 blocks of 16.
        let v = synthetic_slim(16, 100, 96, 4).unwrap();
        assert_eq!(v.num_blocks(), 6);
        assert_eq!(v.trace.sink_tokens, 16);
        let c1 = v.trace.cuts[0].layer;
        for pos in 0..100 {
            assert!(v.exists(c1 - 1, pos), "everything below the first cut");
            assert!(v.exists(15, pos) || (16..96).contains(&pos));
        }
        assert_eq!(v.state(15, 0), PositionState::Sink);
        assert_eq!(v.state(15, 97), PositionState::DecodePhase);
        for run in v.pruned_runs() {
            for b in run.first..run.end {
                for pos in v.block_positions(b) {
                    assert!(v.exists(run.layer - 1, pos));
                    assert!(!v.exists(run.layer, pos));
                    assert!(!v.exists(15, pos));
                }
            }
        }
        // the last cut keeps its budget in blocks
        let last = v.trace.cuts.len() - 1;
        assert_eq!(v.trace.cuts[last].kept.len(), v.budget_blocks(last));
    }

    #[test]
    fn budget_line_is_the_kth_best_score() {
        let v = synthetic_slim(16, 100, 96, 4).unwrap();
        let line = v.budget_score(0).unwrap();
        let cut = &v.trace.cuts[0];
        let above = cut.scores.iter().filter(|s| s.1 >= line).count();
        assert_eq!(above, v.budget_blocks(0));
        for b in &cut.kept {
            let s = cut.scores.iter().find(|s| s.0 == *b).unwrap().1;
            assert!(s >= line);
        }
        assert_eq!(v.overlap_series(0).len(), 4);
    }
}
