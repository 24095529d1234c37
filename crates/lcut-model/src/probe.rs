//! Probes: a caller's window onto attention and the residual stream.
//!
//! The decoder calls a probe only when one is attached, and hands it device
//! tensors: a probe that needs per-layer sums reduces them where they are and
//! copies out only the small result.

use candle_core::Tensor;

use crate::error::Result;

/// Where a residual-stream snapshot is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResidualSite {
    /// The (scaled) embeddings entering layer 0.
    Embeddings,
    /// The residual stream after decoder layer `l`.
    Layer(usize),
}

impl ResidualSite {
    /// The layer the residual stream at this site enters (0 for the
    /// embeddings, `l + 1` after layer `l`; the model's depth after the
    /// last layer).
    pub fn entered_layer(self) -> usize {
        match self {
            ResidualSite::Embeddings => 0,
            ResidualSite::Layer(l) => l + 1,
        }
    }

    /// The site whose residual stream enters layer `l` (the inverse of
    /// [`ResidualSite::entered_layer`]).
    pub fn entering(l: usize) -> Self {
        match l {
            0 => ResidualSite::Embeddings,
            l => ResidualSite::Layer(l - 1),
        }
    }
}

/// Post-softmax attention of some queries at one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionView<'a> {
    /// Layer index.
    pub layer: usize,
    /// Positions of the queries (rows), ascending.
    pub query_positions: &'a [usize],
    /// Positions of the keys (columns), ascending; under a layer-asymmetric
    /// policy these skip the tokens that do not exist at this layer.
    pub key_positions: &'a [usize],
    /// Probabilities [heads, queries, keys] on the model's device; masked keys are 0.
    pub probs: &'a Tensor,
}

/// The routing of some tokens at one layer of experts.
#[derive(Debug, Clone, Copy)]
pub struct RoutingView<'a> {
    /// Layer index.
    pub layer: usize,
    /// Positions of the routed tokens (rows of `routing`), ascending.
    pub positions: &'a [usize],
    /// The router's probabilities, the experts each token runs and their
    /// weights.
    pub routing: &'a crate::layers::Routing,
}

/// Receives what the decoder computes, layer by layer.
pub trait Probe {
    /// The smallest query position whose attention the probe wants at
    /// `layer`; `None` (the default) asks for none. Later queries of a chunk
    /// are always included, so asking from the decode start gets every
    /// decode-phase query.
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        None
    }

    /// Attention of the selected queries.
    fn on_attention(&mut self, _view: AttentionView<'_>) -> Result<()> {
        Ok(())
    }

    /// Whether the probe wants the routing of the tokens at `layer` (a
    /// layer of experts; asked of no other).
    fn wants_routing(&self, _layer: usize) -> bool {
        false
    }

    /// The routing of a chunk's tokens at a layer of experts.
    fn on_routing(&mut self, _view: RoutingView<'_>) -> Result<()> {
        Ok(())
    }

    /// How many of a chunk's latest queries (after RoPE) the probe wants at
    /// `layer`; `None` (the default) asks for none.
    fn query_window(&self, _layer: usize) -> Option<usize> {
        None
    }

    /// The latest queries of a chunk at `layer`, oldest first, each row its
    /// heads side by side ([heads * head_dim]).
    fn on_queries(&mut self, _layer: usize, _rows: Vec<Vec<f32>>) -> Result<()> {
        Ok(())
    }

    /// The position from which the probe wants a linear-attention layer's
    /// outputs (Qwen3.5) split into what the layer's state at that position
    /// contributes and what the tokens from it on do; `None` (the default)
    /// asks for none. The split starts at the first row it is asked for (a
    /// probe attached from the decode start splits the prompt's share from
    /// the decode phase's) and stops when a chunk runs without it.
    fn linear_split_from(&self, _layer: usize) -> Option<usize> {
        None
    }

    /// The split outputs of a chunk's rows at a linear-attention layer.
    fn on_linear_split(
        &mut self,
        _layer: usize,
        _split: &crate::linear_attention::LinearSplit,
    ) -> Result<()> {
        Ok(())
    }

    /// Whether the probe wants the residual stream at `site`.
    fn wants_residual(&self, _site: ResidualSite) -> bool {
        false
    }

    /// Residual stream [tokens, hidden] of the tokens at `positions`.
    fn on_residual(
        &mut self,
        _site: ResidualSite,
        _positions: &[usize],
        _hidden: &Tensor,
    ) -> Result<()> {
        Ok(())
    }
}
