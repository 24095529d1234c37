//! What a policy decides for one sequence, asked the same way by everything
//! that runs a policy (the decoder, the trainer's masks, the reference masks,
//! the cost model and the viewer). The questions come in three parts:
//!
//! - [`Visibility`], what every rule answers: does the token at `pos` exist
//!   at layer `l`, does layer `l` (or one of its K/V heads) keep its K/V once
//!   the prompt has run, may query `q` read key `k` there;
//! - [`KvAccounting`], the K/V a sequence holds and reads, counted from those
//!   answers (a rule may count faster than position by position);
//! - [`DynamicRule`], the hooks of a policy that decides while it runs
//!   (SlimInfer at its stage cuts, kvpress's presses at the prompt's end):
//!   the decoder hands it queries and keys at its decision layers. Static
//!   rules have none, and the generic paths never ask them.
//!
//! What every rule has by being a `Clone` [`KvAccounting`] (its counts and
//! an independent copy) comes from [`RuleCopy`], written once here.

use std::fmt;

use crate::error::PolicyError;
use crate::phases::{Phase, TokenPhases};
use crate::press::PressRun;
use crate::record::{CutRecord, SlimTrace, StepRecord};
use crate::slim_run::SlimRun;
use crate::window::{LayerWindows, held_positions, window_of};

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

/// What a policy that decides at the prompt's end reads of one layer once
/// every prompt token has run it: the layer's keys (after RoPE, as cached)
/// and values of every prompt position, and what it needs of the model's
/// attention.
#[derive(Debug, Clone)]
pub struct PromptKv<'a> {
    /// The keys, with the positions of the prompt's tokens.
    pub keys: HostKeys<'a>,
    /// The values, laid out as the keys.
    pub values: &'a [f32],
    /// Query heads (a multiple of the K/V heads).
    pub heads: usize,
    /// The RoPE inverse frequencies of the rotated pairs (half the rotated
    /// width; the model's scaling applied), in the rotate-half layout.
    pub rope_inv_freq: &'a [f32],
}

/// The visibility of one sequence under one policy: what every rule answers.
///
/// The answers for `key_visible` hold for keys `k <= q` before the model's
/// own sliding window is applied. A query reads itself whenever its token
/// exists (the decoder relies on rows never being empty).
///
/// K/V heads: a rule whose K/V heads differ at a layer
/// ([`Visibility::heads_differ`]) answers per head through the `head_`
/// questions; the head-free questions then answer for the union of the
/// heads (a key some head reads, a row some head keeps). A rule whose heads
/// never differ answers only the head-free ones.
///
/// Retention: [`Visibility::retains_kv`] says what a layer holds once the
/// prompt has run, i.e. what decode-phase queries may read. While the
/// prompt runs, a layer also holds the K/V of every token that exists there
/// for the prompt's own later queries; the decoder drops the rows no later
/// query reads once the decode phase starts.
pub trait Visibility: RuleCopy + fmt::Debug + Send + Sync {
    /// Depth of the model the policy was resolved for.
    fn num_layers(&self) -> usize;

    /// The token phases of the sequence (anchors, prefill, decode phase).
    fn phases(&self) -> &TokenPhases;

    /// Whether the token at `pos` has a hidden state at `layer`.
    fn token_exists(&self, layer: usize, pos: usize) -> bool;

    /// Whether the cache at `layer` keeps K/V of the token at `pos` once the
    /// prompt has run (its own, or projected where
    /// [`Visibility::kv_projected_at`] says so); for some head where heads
    /// differ.
    fn retains_kv(&self, layer: usize, pos: usize) -> bool;

    /// Whether a query at `q` reads the key at `k` (`k <= q`) at `layer` now
    /// (through some head where heads differ).
    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool;

    /// An id of the rule in force at `layer`: layers with the same id show
    /// the same keys to the same queries, so a mask built for one serves the
    /// others (0 where every earlier key is visible).
    fn rule_class(&self, layer: usize) -> usize;

    /// Whether every token before the decode start exists at `layer` and
    /// its query reads every earlier key there, as in the full model's
    /// prefill (a press's prompt, which runs whole before the press
    /// decides): cost counts take the closed form for those queries
    /// instead of asking about each key.
    fn prompt_runs_whole(&self, _layer: usize) -> bool {
        false
    }

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

    /// Whether the K/V heads of `layer` follow different rules (keep or read
    /// different keys). False by default: every head as the layer.
    fn heads_differ(&self, _layer: usize) -> bool {
        false
    }

    /// Whether K/V head `kv_head` of `layer` keeps the K/V of the token at
    /// `pos` once the prompt has run.
    fn head_retains_kv(&self, layer: usize, _kv_head: usize, pos: usize) -> bool {
        self.retains_kv(layer, pos)
    }

    /// Whether a query at `q` reads the key at `k` through K/V head
    /// `kv_head` (every query head of its group) at `layer`.
    fn head_key_visible(&self, layer: usize, _kv_head: usize, q: usize, k: usize) -> bool {
        self.key_visible(layer, q, k)
    }

    /// The rule class ([`Visibility::rule_class`]) of K/V head `kv_head` at
    /// `layer`: heads and layers with the same id show the same keys.
    fn head_rule_class(&self, layer: usize, _kv_head: usize) -> usize {
        self.rule_class(layer)
    }

    /// Whether a query at `q` reads at `layer` exactly the earlier keys the
    /// layer keeps: `key_visible(layer, q, k) == retains_kv(layer, k)` for
    /// every `k < q`, and per K/V head the same of `head_key_visible` and
    /// `head_retains_kv` where heads differ. A cache whose rows were all
    /// checked against what the layer keeps is then read whole, without
    /// asking about each key (a press's decode step over thousands of kept
    /// rows per head). False by default: the decoder asks key by key.
    fn reads_what_it_keeps(&self, _layer: usize, _q: usize) -> bool {
        false
    }

    /// The hooks of a policy that decides while it runs (`None` for a
    /// static rule).
    fn dynamic(&self) -> Option<&dyn DynamicRule> {
        None
    }

    /// The hooks of a policy that decides while it runs, to hand it what it
    /// decides from (`None` for a static rule).
    fn dynamic_mut(&mut self) -> Option<&mut dyn DynamicRule> {
        None
    }
}

/// What every rule has by being a `Clone` [`KvAccounting`]: its counts and
/// an independent copy, for every such type at once.
pub trait RuleCopy {
    /// The K/V this rule holds and reads, counted.
    fn accounting(&self) -> &dyn KvAccounting;

    /// An independent copy (to fork a sequence).
    fn box_clone(&self) -> Box<dyn Visibility>;
}

impl<T: KvAccounting + Clone + 'static> RuleCopy for T {
    fn accounting(&self) -> &dyn KvAccounting {
        self
    }

    fn box_clone(&self) -> Box<dyn Visibility> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn Visibility> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}

/// The K/V one sequence holds and reads under a rule, counted from its
/// [`Visibility`] answers. Every method has a definition by position; a
/// rule overrides one where it can count faster or where its counts are
/// not a function of its answers (SlimInfer's resident blocks).
pub trait KvAccounting: Visibility {
    /// Token-layers of K/V held once `decode` decode-phase tokens have run
    /// (anchors and prefill tokens of the prompt, summed over layers). Where
    /// K/V heads differ, a token-layer counts the share of the heads that
    /// hold it, rounded down: [`KvAccounting::held_head_rows`] is exact.
    fn held_token_layers(&self, decode: usize) -> usize {
        let len = self.phases().decode_start() + decode;
        (0..self.num_layers())
            .map(|l| (0..len).filter(|&p| self.retains_kv(l, p)).count())
            .sum()
    }

    /// Rows of one K/V head held once `decode` decode-phase tokens have run,
    /// summed over layers and the model's `kv_heads` heads: bytes held are
    /// this times the bytes of one head's K and V of one token.
    fn held_head_rows(&self, decode: usize, kv_heads: usize) -> usize {
        if !(0..self.num_layers()).any(|l| self.heads_differ(l)) {
            return kv_heads * self.held_token_layers(decode);
        }
        let len = self.phases().decode_start() + decode;
        (0..self.num_layers())
            .map(|l| match self.heads_differ(l) {
                false => kv_heads * (0..len).filter(|&p| self.retains_kv(l, p)).count(),
                true => (0..kv_heads)
                    .map(|h| (0..len).filter(|&p| self.head_retains_kv(l, h, p)).count())
                    .sum(),
            })
            .sum()
    }

    /// [`KvAccounting::held_head_rows`] on a model whose layer `l` attends
    /// only to the last `windows[l]` positions (its sliding window, if any):
    /// such a layer holds no row older than its window, whatever the policy
    /// keeps ([`crate::window::held_positions`]).
    fn held_head_rows_windowed(
        &self,
        decode: usize,
        kv_heads: usize,
        windows: &LayerWindows,
    ) -> usize {
        if windows.iter().all(Option::is_none) {
            return self.held_head_rows(decode, kv_heads);
        }
        let len = self.phases().decode_start() + decode;
        head_rows_in_windows(self, len, kv_heads, windows, |l, h, p| {
            self.head_retains_kv(l, h, p)
        })
    }

    /// [`KvAccounting::resident_head_rows`] on a model with sliding-window
    /// layers (see [`KvAccounting::held_head_rows_windowed`]): the rows one
    /// decode step reads, a windowed layer's at most its window.
    fn resident_head_rows_windowed(
        &self,
        decode: usize,
        kv_heads: usize,
        windows: &LayerWindows,
    ) -> usize {
        if windows.iter().all(Option::is_none) {
            return self.resident_head_rows(decode, kv_heads);
        }
        let len = self.phases().decode_start() + decode;
        head_rows_in_windows(self, len, kv_heads, windows, |l, h, p| {
            match self.heads_differ(l) {
                true => self.head_retains_kv(l, h, p),
                false => self.decode_reads_kv(l, p),
            }
        })
    }

    /// Whether a decode step reads the K/V `layer` holds of the token at
    /// `pos` (before the model's sliding window): what it retains, unless
    /// the policy sets held rows aside (SlimInfer's inactive blocks).
    fn decode_reads_kv(&self, layer: usize, pos: usize) -> bool {
        self.retains_kv(layer, pos)
    }

    /// Token-layers of K/V that decode reads now (less than held when a
    /// policy leaves held K/V aside, as SlimInfer's inactive blocks).
    fn resident_token_layers(&self, decode: usize) -> usize {
        self.held_token_layers(decode)
    }

    /// Rows of one K/V head that decode reads now, summed over layers and
    /// the model's `kv_heads` heads (see [`KvAccounting::held_head_rows`]).
    fn resident_head_rows(&self, decode: usize, kv_heads: usize) -> usize {
        match (0..self.num_layers()).any(|l| self.heads_differ(l)) {
            true => self.held_head_rows(decode, kv_heads),
            false => kv_heads * self.resident_token_layers(decode),
        }
    }

    /// The SPEED cutoff that would hold the same prompt K/V as this sequence
    /// of a model with `kv_heads` K/V heads (`L_eq`: prompt token-layers held
    /// beyond the anchors, over the prefill tokens, a head's rows counting
    /// its share; the depth when there are none).
    fn equal_kv_cutoff(&self, kv_heads: usize) -> f64 {
        let prefill = self.phases().prefill_len();
        if prefill == 0 {
            return self.num_layers() as f64;
        }
        let kv = kv_heads.max(1);
        let anchors = self.num_layers() * self.phases().anchor_len() * kv;
        let prompt = self.held_head_rows(0, kv).saturating_sub(anchors);
        prompt as f64 / (prefill * kv) as f64
    }

    /// The share of the prompt's K/V (every position before the decode
    /// start, at every layer and K/V head) a model with `kv_heads` K/V heads
    /// no longer holds once the prompt has run: the compression ratio
    /// kvpress means, as this rule achieves it (0 with no prompt).
    fn prompt_share_removed(&self, kv_heads: usize) -> f64 {
        let prompt = self.phases().decode_start();
        let kv = kv_heads.max(1);
        let full = self.num_layers() * prompt * kv;
        if full == 0 {
            return 0.0;
        }
        1.0 - self.held_head_rows(0, kv) as f64 / full as f64
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
    /// room before a run): the tokens that exist there while the prompt runs
    /// and those it keeps.
    fn kv_rows(&self, layer: usize, from: usize, to: usize) -> usize {
        (from..to)
            .filter(|&p| self.token_exists(layer, p) || self.retains_kv(layer, p))
            .count()
    }
}

/// The hooks of a policy that decides while it runs. A policy with stage
/// cuts (SlimInfer) is handed the latest queries of its decision layers,
/// the keys below each stage cut once the whole prompt has reached it, and
/// a call after each layer of a decode step. A policy that decides at the
/// prompt's end (kvpress's presses) sees the prompt's queries it asks for
/// while the prompt runs at full depth, then every layer's prompt K/V before
/// the first decode-phase token runs: until then the decoder keeps every
/// row, and afterwards drops, per K/V head, those the policy does not keep.
pub trait DynamicRule {
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

    /// The latest query rows of `layer` (at most [`DynamicRule::query_window`]
    /// of them, oldest first; each `heads * head_dim` values, head-major).
    fn observe_queries(&mut self, _layer: usize, _rows: Vec<Vec<f32>>) {}

    /// Take stage `stage`'s decision from the keys of the layer below its cut
    /// (every prompt token that exists there).
    fn decide_stage(&mut self, _stage: usize, _keys: &HostKeys<'_>) {}

    /// Whether the policy decides from each layer's K/V once the prompt
    /// has run ([`DynamicRule::decide_at_prompt_end`]); the prompt then runs
    /// every layer whole, and the decode phase after the decision.
    fn decides_at_prompt_end(&self) -> bool {
        false
    }

    /// Whether the policy wants the queries of `layer`'s prompt rows before
    /// RoPE ([`DynamicRule::observe_unrotated_queries`]).
    fn wants_unrotated_queries(&self, _layer: usize) -> bool {
        false
    }

    /// The queries of a prompt chunk's rows at `layer` before RoPE (after
    /// the q-norm where the model has one): `rows` holds one row of `heads *
    /// head_dim` values (head-major) per position of `positions`.
    fn observe_unrotated_queries(
        &mut self,
        _layer: usize,
        _heads: usize,
        _positions: &[usize],
        _rows: &[f32],
    ) {
    }

    /// Decide what `layer` keeps from its prompt K/V (called once per
    /// layer, after the whole prompt has run, before any decode-phase
    /// token); once every layer is decided, [`DynamicRule::is_decided`].
    fn decide_at_prompt_end(
        &mut self,
        _layer: usize,
        _kv: &PromptKv<'_>,
    ) -> Result<(), PolicyError> {
        Ok(())
    }

    /// Leave `layer` as the model holds it instead of deciding there (a
    /// sliding-window layer, which drops prompt rows older than its window
    /// before the prompt has run: kvpress's presses skip Gemma 3's), once,
    /// in place of [`DynamicRule::decide_at_prompt_end`].
    fn leave_layer_whole(&mut self, _layer: usize) {}

    /// After `layer` ran a decode step whose first token is at `position`.
    fn after_decode_layer(&mut self, _layer: usize, _position: usize) {}

    /// What each decode step's decisions changed.
    fn step_records(&self) -> &[StepRecord] {
        &[]
    }

    /// What the prefill decided at each stage cut.
    fn cut_records(&self) -> &[CutRecord] {
        &[]
    }

    /// The decisions as a trace for reports, with K/V counted in bytes of
    /// `bytes_per_token_layer` (`None` for a policy that decides nothing).
    fn decision_trace(&self, _bytes_per_token_layer: u64) -> Option<SlimTrace> {
        None
    }

    /// SlimInfer's own state (kept blocks, decisions, traffic), when this
    /// is SlimInfer.
    fn slim_run(&self) -> Option<&SlimRun> {
        None
    }

    /// A press's own state (what it observed and kept), when this is a
    /// press.
    fn press_run(&self) -> Option<&PressRun> {
        None
    }
}

/// Token-layers of K/V a rule that decides by phase keeps, from the number
/// of tokens of each phase: `keeps(layer, phase)` for each layer.
/// Rows of one K/V head among the first `len` positions that `keeps`
/// (layer, head, position) and each layer's window allow, summed over
/// layers and the `kv_heads` heads (one head counted for all where the
/// heads do not differ).
fn head_rows_in_windows<V: Visibility + ?Sized>(
    vis: &V,
    len: usize,
    kv_heads: usize,
    windows: &LayerWindows,
    keeps: impl Fn(usize, usize, usize) -> bool,
) -> usize {
    (0..vis.num_layers())
        .map(|l| {
            let differ = vis.heads_differ(l);
            let heads = if differ { kv_heads } else { 1 };
            let positions = held_positions(window_of(windows, l), len);
            let rows: usize = (0..heads)
                .map(|h| positions.clone().filter(|&p| keeps(l, h, p)).count())
                .sum();
            if differ { rows } else { rows * kv_heads }
        })
        .sum()
}

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
