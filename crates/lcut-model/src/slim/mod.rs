//! SlimInfer's running state: the block selection of one sequence, the
//! query windows of its decision layers, the hidden states waiting for the
//! next prefill stage, the scorer's block summaries and what each decision
//! did (for traces and reports).

pub mod score;
mod stages;

use std::collections::VecDeque;

use candle_core::{DType, Tensor};
pub use lcut_policy::{CutRecord, StepRecord};
use lcut_policy::{SlimParams, SlimSelection, TokenPhases};

use crate::error::Result;
use score::BlockSummaries;

/// The last `w` queries seen at one decision layer, `[heads * head_dim]` each.
#[derive(Debug, Clone, Default)]
struct QueryWindow {
    rows: VecDeque<Vec<f32>>,
}

impl QueryWindow {
    /// Keep the last `w` rows of `q` [heads, n, head_dim].
    fn push(&mut self, q: &Tensor, w: usize) -> Result<()> {
        let (heads, n, hd) = q.dims3()?;
        let take = n.min(w);
        let rows = q
            .narrow(1, n - take, take)?
            .transpose(0, 1)?
            .to_dtype(DType::F32)?
            .reshape((take, heads * hd))?
            .to_vec2::<f32>()?;
        for r in rows {
            if self.rows.len() == w {
                self.rows.pop_front();
            }
            self.rows.push_back(r);
        }
        Ok(())
    }

    /// The mean query of the window.
    fn mean(&self) -> Vec<f32> {
        let Some(first) = self.rows.front() else {
            return Vec::new();
        };
        let mut acc = vec![0f32; first.len()];
        for r in &self.rows {
            acc.iter_mut().zip(r).for_each(|(a, x)| *a += x);
        }
        let inv = 1.0 / self.rows.len() as f32;
        acc.iter_mut().for_each(|a| *a *= inv);
        acc
    }
}

/// Hidden states of one prefill chunk waiting for the next stage.
#[derive(Debug, Clone)]
struct Pending {
    hidden: Tensor,
    positions: Vec<usize>,
}

/// SlimInfer's state of one sequence.
#[derive(Debug, Clone)]
pub struct SlimRun {
    selection: SlimSelection,
    windows: Vec<QueryWindow>,
    summaries: Vec<BlockSummaries>,
    pending: Vec<Pending>,
    cut_records: Vec<CutRecord>,
    steps: Vec<StepRecord>,
}

impl SlimRun {
    /// A fresh run: every block exists until the prefill decides.
    pub(crate) fn new(params: SlimParams, phases: TokenPhases, num_layers: usize) -> Self {
        let cuts = params.cuts().len();
        Self {
            selection: SlimSelection::new(params, phases, num_layers),
            windows: vec![QueryWindow::default(); cuts],
            summaries: vec![BlockSummaries::default(); cuts],
            pending: Vec::new(),
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

    /// Note the queries of a chunk at `layer` when a cut is decided there.
    pub(crate) fn observe_queries(&mut self, layer: usize, q: &Tensor) -> Result<()> {
        if let Some(i) = self.cut_decided_at(layer) {
            let w = self.selection.params().options.window;
            self.windows[i].push(q, w)?;
        }
        Ok(())
    }
}
