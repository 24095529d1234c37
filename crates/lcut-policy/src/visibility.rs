//! What a policy decides for one sequence, asked the same way by everything
//! that runs a policy (the decoder, the trainer's masks, the reference masks,
//! the cost model and the viewer): does the token at `pos` exist at layer
//! `l`, does layer `l` keep its K/V, may query `q` read key `k` there now,
//! and what does a step change. Static rules answer from the token phases;
//! a policy that decides while it runs (SlimInfer) also takes the queries
//! and keys the decoder hands it at its decision layers.

use std::any::Any;
use std::fmt;

use crate::phases::{Phase, TokenPhases};
use crate::record::{CutRecord, SlimTrace, StepRecord};

/// Keys of one layer on the host, `[kv_heads][tokens][head_dim]` flattened,
/// with the positions of the tokens.
#[derive(Debug, Clone)]
pub struct HostKeys<'a> {
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Positions of the tokens, ascending.
    pub positions: &'a [usize],
    /// The keys, `kv_heads * positions.len() * head_dim` values.
    pub data: &'a [f32],
}

/// The visibility of one sequence under one policy.
///
/// The answers for `key_visible` hold for keys `k <= q` before the model's
/// own sliding window is applied. A query reads itself whenever its token
/// exists (the decoder relies on rows never being empty).
pub trait Visibility: fmt::Debug + Send + Sync {
    /// Depth of the model the policy was resolved for.
    fn num_layers(&self) -> usize;

    /// The token phases of the sequence (anchors, prefill, decode phase).
    fn phases(&self) -> &TokenPhases;

    /// Whether the token at `pos` has a hidden state at `layer`.
    fn token_exists(&self, layer: usize, pos: usize) -> bool;

    /// Whether the cache at `layer` keeps K/V of the token at `pos` (its own,
    /// or projected where [`Visibility::kv_projected_at`] says so).
    fn retains_kv(&self, layer: usize, pos: usize) -> bool;

    /// Whether a query at `q` reads the key at `k` (`k <= q`) at `layer` now.
    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool;

    /// An id of the rule in force at `layer`: layers with the same id show
    /// the same keys to the same queries, so a mask built for one serves the
    /// others (0 where every earlier key is visible).
    fn rule_class(&self, layer: usize) -> usize;

    /// Whether a key visible to the first and the last of ascending queries
    /// is visible to every query between them (lets a mask skip the columns
    /// every query reads). True for every policy rule; false for an
    /// arbitrary reference mask.
    fn monotone_in_query(&self) -> bool {
        true
    }

    /// The layer `c` at whose input the token at `pos` leaves the model while
    /// the layers from `c` on still keep K/V of it, projected by each layer's
    /// own K/V projections from the hidden state that enters layer `c`
    /// (projected prompt K/V, as SwiftKV and POP do). `None` (the default): a
    /// token that stops existing keeps no K/V above.
    fn kv_projected_at(&self, _pos: usize) -> Option<usize> {
        None
    }

    /// Token-layers of K/V held once `decode` decode-phase tokens have run
    /// (anchors and prefill tokens of the prompt, summed over layers).
    fn held_token_layers(&self, decode: usize) -> usize {
        let len = self.phases().decode_start() + decode;
        (0..self.num_layers())
            .map(|l| (0..len).filter(|&p| self.retains_kv(l, p)).count())
            .sum()
    }

    /// Token-layers of K/V that decode reads now (less than held when a
    /// policy leaves held K/V aside, as SlimInfer's inactive blocks).
    fn resident_token_layers(&self, decode: usize) -> usize {
        self.held_token_layers(decode)
    }

    /// The SPEED cutoff that would hold the same prompt K/V as this sequence
    /// (`L_eq`: prompt token-layers held beyond the anchors, over the prefill
    /// tokens; the depth when there are none).
    fn equal_kv_cutoff(&self) -> f64 {
        let prefill = self.phases().prefill_len();
        if prefill == 0 {
            return self.num_layers() as f64;
        }
        let anchors = self.num_layers() * self.phases().anchor_len();
        self.held_token_layers(0).saturating_sub(anchors) as f64 / prefill as f64
    }

    /// How many of the first `len` tokens exist at each layer (the rows each
    /// layer runs in a prefill of `len` tokens).
    fn present_per_layer(&self, len: usize) -> Vec<usize> {
        (0..self.num_layers())
            .map(|l| (0..len).filter(|&p| self.token_exists(l, p)).count())
            .collect()
    }

    /// How many of the first `len` tokens have K/V at each layer that is
    /// projected rather than their own ([`Visibility::kv_projected_at`]): the
    /// K/V projections a prefill of `len` tokens runs beside its rows.
    fn projected_per_layer(&self, len: usize) -> Vec<usize> {
        (0..self.num_layers())
            .map(|l| {
                (0..len)
                    .filter(|&p| self.kv_projected_at(p).is_some_and(|c| c <= l))
                    .count()
            })
            .collect()
    }

    /// Cache rows `layer` will hold for the tokens at `from..to` (to reserve
    /// room before a run).
    fn kv_rows(&self, layer: usize, from: usize, to: usize) -> usize {
        (from..to).filter(|&p| self.retains_kv(layer, p)).count()
    }

    /// Layers at whose input the whole prompt must have arrived before any
    /// prompt token goes on (decisions are taken there); empty for a policy
    /// that prefills in one pass.
    fn stage_cuts(&self) -> &[usize] {
        &[]
    }

    /// True once the prefill has taken every decision the policy takes there.
    fn is_decided(&self) -> bool {
        true
    }

    /// How many of the latest query rows of `layer` the policy wants to see
    /// (`None`: none).
    fn query_window(&self, _layer: usize) -> Option<usize> {
        None
    }

    /// The latest query rows of `layer` (at most [`Visibility::query_window`]
    /// of them, oldest first; each `heads * head_dim` values, head-major).
    fn observe_queries(&mut self, _layer: usize, _rows: Vec<Vec<f32>>) {}

    /// Take stage `stage`'s decision from the keys of the layer below its cut
    /// (every prompt token that exists there).
    fn decide_stage(&mut self, _stage: usize, _keys: &HostKeys<'_>) {}

    /// After `layer` ran a decode step whose first token is at `position`.
    fn after_decode_layer(&mut self, _layer: usize, _position: usize) {}

    /// What each decode step's decisions changed (empty for static rules).
    fn step_records(&self) -> &[StepRecord] {
        &[]
    }

    /// What the prefill decided at each stage cut (empty for static rules).
    fn cut_records(&self) -> &[CutRecord] {
        &[]
    }

    /// The decisions as a trace for reports, with K/V counted in bytes of
    /// `bytes_per_token_layer` (`None` for a policy that decides nothing).
    fn decision_trace(&self, _bytes_per_token_layer: u64) -> Option<SlimTrace> {
        None
    }

    /// An independent copy (to fork a sequence).
    fn box_clone(&self) -> Box<dyn Visibility>;

    /// The concrete type, for inspecting one policy's own records.
    fn as_any(&self) -> &dyn Any;
}

impl Clone for Box<dyn Visibility> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}

/// Token-layers of K/V a rule that decides by phase keeps, from the number
/// of tokens of each phase: `keeps(layer, phase)` for each layer.
pub(crate) fn token_layers_by_phase(
    num_layers: usize,
    counts: [(Phase, usize); 3],
    keeps: impl Fn(usize, Phase) -> bool,
) -> usize {
    (0..num_layers)
        .map(|layer| {
            counts
                .iter()
                .filter(|(phase, _)| keeps(layer, *phase))
                .map(|(_, n)| n)
                .sum::<usize>()
        })
        .sum()
}
