//! SlimInfer's running state for one sequence, as a [`Visibility`]: the block
//! selection, the query windows of its decision layers, the scorer's block
//! summaries and what each decision did (for traces and reports). The
//! decoder hands it the latest queries of each decision layer, the keys
//! below each cut once the whole prompt has reached it, and a call after
//! each layer of a decode step; everything here is host arithmetic.

use crate::phases::TokenPhases;
use crate::query_window::QueryWindow;
use crate::record::{CutRecord, SlimTrace, StepRecord};
use crate::selection::SlimSelection;
use crate::slim::SlimParams;
use crate::slim_score::{BlockSummaries, top_blocks};
use crate::visibility::{DynamicRule, HostKeys, KvAccounting, Visibility};

/// SlimInfer's state of one sequence.
#[derive(Debug, Clone)]
pub struct SlimRun {
    selection: SlimSelection,
    windows: Vec<QueryWindow>,
    summaries: Vec<BlockSummaries>,
    /// Width of one head (from the keys of the first decision).
    head_dim: usize,
    cut_records: Vec<CutRecord>,
    steps: Vec<StepRecord>,
}

impl SlimRun {
    /// A fresh run: every block exists until the prefill decides.
    pub fn new(params: SlimParams, phases: TokenPhases, num_layers: usize) -> Self {
        let cuts = params.cuts().len();
        Self {
            selection: SlimSelection::new(params, phases, num_layers),
            windows: vec![QueryWindow::default(); cuts],
            summaries: vec![BlockSummaries::default(); cuts],
            head_dim: 0,
            cut_records: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// The block selection (kept and active sets).
    pub fn selection(&self) -> &SlimSelection {
        &self.selection
    }

    /// What the prefill decided at each cut (empty until it has).
    pub fn cut_records(&self) -> &[CutRecord] {
        &self.cut_records
    }

    /// What each decode step's decisions did.
    pub fn steps(&self) -> &[StepRecord] {
        &self.steps
    }

    /// True once the prefill has decided every cut.
    pub fn is_decided(&self) -> bool {
        self.selection.decided() == self.selection.params().cuts().len()
    }

    /// The cut whose decision is taken right after `layer` (c_i − 1).
    fn cut_decided_at(&self, layer: usize) -> Option<usize> {
        self.selection
            .params()
            .cuts()
            .iter()
            .position(|&c| c == layer + 1)
    }

    /// Query heads, from the window's row width.
    fn heads(&self, query: &[f32]) -> usize {
        query.len() / self.head_dim.max(1)
    }

    /// Score cut `i`'s candidate blocks on the keys of its decision layer
    /// and the window's mean query; keep the best (the prefill's decision).
    fn decide_cut(&mut self, i: usize, keys: &HostKeys<'_>) {
        self.head_dim = keys.head_dim;
        let params = *self.selection.params();
        let sel = &self.selection;
        let domain = sel.candidate_domain(i);
        let blocks: Vec<_> = domain
            .iter()
            .map(|&b| (b, sel.block_positions(b)))
            .collect();
        let o = params.options;
        let summaries = BlockSummaries::build(keys, &blocks, o.score, o.block, o.unit);
        let query = self.windows[i].mean();
        let scores = summaries.score(&query, self.heads(&query), &domain);
        let decode_start = sel.phases().decode_start();
        let kept = top_blocks(&scores, params.kept_blocks(i, decode_start));
        self.selection.decide(i, &kept);
        self.summaries[i] = summaries;
        self.cut_records.push(CutRecord {
            layer: params.cuts()[i],
            budget_tokens: params.budgets()[i].tokens(decode_start),
            scores,
            kept,
            kept_tokens: self.selection.kept_tokens(i),
        });
    }

    /// A decode step's decision at cut `i`: score the candidates among the
    /// blocks the token read below it and let the overlap rule move the
    /// active set. Records one step per token.
    fn decode_decision(&mut self, i: usize, position: usize) {
        let decode_start = self.selection.phases().decode_start();
        let decode_tokens = (position + 1).saturating_sub(decode_start);
        let sel = &self.selection;
        let domain = sel.candidate_domain(i);
        let query = self.windows[i].mean();
        let scores = self.summaries[i].score(&query, self.heads(&query), &domain);
        let k = sel.params().kept_blocks(i, decode_start);
        let traffic = self.selection.step(i, &top_blocks(&scores, k));
        if i == 0 {
            self.steps.push(StepRecord {
                position,
                cuts: Vec::new(),
                resident_token_layers: 0,
                held_token_layers: 0,
            });
        }
        let held = self.selection.held_token_layers(decode_tokens);
        let resident = self.selection.resident_token_layers(decode_tokens);
        if let Some(step) = self.steps.last_mut() {
            step.cuts.push(traffic);
            step.held_token_layers = held;
            step.resident_token_layers = resident;
        }
    }
}

impl Visibility for SlimRun {
    fn num_layers(&self) -> usize {
        self.selection.num_layers()
    }

    fn phases(&self) -> &TokenPhases {
        self.selection.phases()
    }

    fn token_exists(&self, layer: usize, pos: usize) -> bool {
        self.selection.exists(layer, pos)
    }

    fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        self.selection.exists(layer, pos)
    }

    /// Keys present at `layer` and in the cut's active blocks.
    fn key_visible(&self, layer: usize, _q: usize, k: usize) -> bool {
        self.selection.decode_reads(layer, k)
    }

    fn rule_class(&self, layer: usize) -> usize {
        self.selection.segment(layer)
    }

    fn dynamic(&self) -> Option<&dyn DynamicRule> {
        Some(self)
    }

    fn dynamic_mut(&mut self) -> Option<&mut dyn DynamicRule> {
        Some(self)
    }
}

impl KvAccounting for SlimRun {
    fn held_token_layers(&self, decode: usize) -> usize {
        self.selection.held_token_layers(decode)
    }

    fn resident_token_layers(&self, decode: usize) -> usize {
        self.selection.resident_token_layers(decode)
    }

    /// Decode reads a held row when its block is in the cut's active set.
    fn decode_reads_kv(&self, layer: usize, pos: usize) -> bool {
        self.selection.decode_reads(layer, pos)
    }

    fn equal_kv_cutoff(&self, _kv_heads: usize) -> f64 {
        self.selection.equal_kv_cutoff()
    }

    /// Above the first cut the layers hold the sink, the kept blocks (or,
    /// before the prefill decides, the blocks the budgets predict) and the
    /// decode phase, never room for the whole prompt.
    fn kv_rows(&self, layer: usize, from: usize, to: usize) -> usize {
        let params = self.selection.params();
        let phases = self.selection.phases();
        let seg = params.segment(layer);
        if seg == 0 || self.is_decided() || from >= phases.decode_start() {
            return (from..to).filter(|&p| self.retains_kv(layer, p)).count();
        }
        let s = phases.decode_start();
        let predicted = params.predicted_kept_tokens(phases.prefill_len(), s);
        let unprunable = (from..to).filter(|&p| self.selection.block_of(p).is_none());
        unprunable.count() + predicted[seg - 1]
    }
}

impl DynamicRule for SlimRun {
    fn slim_run(&self) -> Option<&SlimRun> {
        Some(self)
    }

    fn stage_cuts(&self) -> &[usize] {
        self.selection.params().cuts()
    }

    fn is_decided(&self) -> bool {
        SlimRun::is_decided(self)
    }

    fn query_window(&self, layer: usize) -> Option<usize> {
        self.cut_decided_at(layer)
            .map(|_| self.selection.params().options.window)
    }

    fn observe_queries(&mut self, layer: usize, rows: Vec<Vec<f32>>) {
        if let Some(i) = self.cut_decided_at(layer) {
            let w = self.selection.params().options.window;
            self.windows[i].push(rows, w);
        }
    }

    fn decide_stage(&mut self, stage: usize, keys: &HostKeys<'_>) {
        self.decide_cut(stage, keys);
    }

    fn after_decode_layer(&mut self, layer: usize, position: usize) {
        if let Some(i) = self.cut_decided_at(layer) {
            self.decode_decision(i, position);
        }
    }

    fn step_records(&self) -> &[StepRecord] {
        &self.steps
    }

    fn cut_records(&self) -> &[CutRecord] {
        &self.cut_records
    }

    fn decision_trace(&self, bytes_per_token_layer: u64) -> Option<SlimTrace> {
        let sel = &self.selection;
        Some(SlimTrace {
            bytes_per_token_layer,
            block: sel.params().options.block,
            sink_tokens: sel.phases().anchor_len(),
            prefill_tokens: sel.phases().prefill_len(),
            cuts: self.cut_records.clone(),
            steps: self.steps.clone(),
            equal_kv_cutoff: sel.equal_kv_cutoff(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicySpec;

    /// The rows decode reads, counted position by position under windows,
    /// are SlimInfer's active blocks: its own count when no window bites,
    /// and no more than what a windowed layer holds when one does.
    #[test]
    fn resident_rows_under_windows_leave_the_inactive_blocks_out() {
        let spec: PolicySpec = "slim:1@50%+block:4+unit:2+swap:0.9".parse().unwrap();
        let params = *spec.resolve(4).unwrap().slim().unwrap();
        let mut run = SlimRun::new(params, TokenPhases::new(41, 40, 4).unwrap(), 4);
        run.selection.decide(0, &[1, 2]);
        // block 2 leaves the active set: held, not read
        run.selection.step(0, &[1, 3]);
        let (decode, kv) = (1, 2);
        assert!(run.resident_head_rows(decode, kv) < run.held_head_rows(decode, kv));
        let wide = [Some(1000); 4];
        assert_eq!(
            run.resident_head_rows_windowed(decode, kv, &wide),
            run.resident_head_rows(decode, kv)
        );
        assert_eq!(
            run.held_head_rows_windowed(decode, kv, &wide),
            run.held_head_rows(decode, kv)
        );
        // a 12-key window over 41 positions: the three sliding layers hold at
        // most the last 11, and decode reads no more than they hold
        let narrow = [Some(12), Some(12), Some(12), None];
        let resident = run.resident_head_rows_windowed(decode, kv, &narrow);
        let held = run.held_head_rows_windowed(decode, kv, &narrow);
        assert!(resident <= held && held < run.held_head_rows(decode, kv));
    }
}
