//! The state of one sequence: its policy's visibility (with whatever the
//! policy decides while it runs), the layer caches, and the prefill chunks
//! waiting for a stage cut.

use std::sync::Arc;

use lcut_policy::{KvAccounting, KvSharing, Policy, PressRun, SlimRun, TokenPhases, Visibility};

use crate::cache::LayerCache;
use crate::decoder::depth_mismatch;
use crate::error::{ModelError, Result};
use crate::linear_attention::RecurrentState;

/// The rows of one prefill chunk waiting for the next prefill stage.
pub(crate) type Pending = crate::decoder::ChunkRows;

/// The state of one sequence: its policy, visibility and layer caches.
/// Not `Clone`: [`Sequence::fork`] copies the caches so that the copies
/// never append into a shared buffer.
#[derive(Debug)]
pub struct Sequence {
    pub(crate) policy: Policy,
    /// Every visibility question about this sequence goes here.
    pub(crate) rule: Box<dyn Visibility>,
    pub(crate) caches: Vec<LayerCache>,
    pub(crate) next_pos: usize,
    /// Prefill chunks that have run up to the next stage cut (a policy with
    /// [`Visibility::stage_cuts`] only).
    pub(crate) pending: Vec<Pending>,
    /// The fused decode step's buffers, made at its first step and kept.
    pub(crate) step: Option<Box<crate::decoder::StepScratch>>,
    /// Each layer's K/V heads (a layer's cache may hold rows per head).
    pub(crate) kv_heads: Vec<usize>,
    /// Each layer's sliding window (a windowed layer holds at most its
    /// window of rows).
    pub(crate) windows: Vec<Option<usize>>,
    /// Which layer's cache each layer reads (Gemma 4's shared layers hold
    /// none of their own).
    pub(crate) sharing: KvSharing,
    /// Each linear-attention layer's state (Qwen3.5), beside the K/V
    /// caches: `None` at an attention layer, and at a linear layer no
    /// token has run yet.
    pub(crate) recurrent: Vec<Option<RecurrentState>>,
}

/// What a sequence's caches need to know of the model: each layer's K/V
/// heads, sliding window and K/V source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CacheShape {
    pub(crate) kv_heads: Vec<usize>,
    pub(crate) windows: Vec<Option<usize>>,
    pub(crate) sharing: KvSharing,
}

/// A visibility rule `(layer, query, key) -> visible` given by a caller
/// for a full-depth reference run: every token exists and keeps K/V at
/// every layer; a query reads itself and the keys the rule shows it.
#[derive(Clone)]
pub(crate) struct ReferenceMask {
    rule: Arc<dyn Fn(usize, usize, usize) -> bool + Send + Sync>,
    num_layers: usize,
    phases: TokenPhases,
}

impl ReferenceMask {
    pub(crate) fn new(
        rule: impl Fn(usize, usize, usize) -> bool + Send + Sync + 'static,
        num_layers: usize,
    ) -> Self {
        Self {
            rule: Arc::new(rule),
            num_layers,
            phases: TokenPhases::all_decode(),
        }
    }
}

impl std::fmt::Debug for ReferenceMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReferenceMask")
    }
}

impl Visibility for ReferenceMask {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, _layer: usize, _pos: usize) -> bool {
        true
    }

    fn retains_kv(&self, _layer: usize, _pos: usize) -> bool {
        true
    }

    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        k == q || (self.rule)(layer, q, k)
    }

    /// Every layer its own rule: nothing is assumed shared.
    fn rule_class(&self, layer: usize) -> usize {
        layer + 1
    }

    fn monotone_in_query(&self) -> bool {
        false
    }
}

impl KvAccounting for ReferenceMask {}

impl Sequence {
    /// A fresh sequence with `rule` over `num_layers` empty caches of a
    /// model of this shape.
    pub(crate) fn with_rule(policy: Policy, rule: Box<dyn Visibility>, shape: CacheShape) -> Self {
        Self {
            policy,
            caches: (0..rule.num_layers()).map(|_| LayerCache::new()).collect(),
            recurrent: vec![None; rule.num_layers()],
            rule,
            next_pos: 0,
            pending: Vec::new(),
            step: None,
            kv_heads: shape.kv_heads,
            windows: shape.windows,
            sharing: shape.sharing,
        }
    }

    /// Number of tokens processed so far (the next token's position).
    pub fn len(&self) -> usize {
        self.next_pos
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.next_pos == 0
    }

    /// The visibility policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The token phases.
    pub fn phases(&self) -> &TokenPhases {
        self.rule.phases()
    }

    /// What the policy decides for this sequence: what exists, is kept and
    /// is read at each layer, and what its decisions were.
    pub fn visibility(&self) -> &dyn Visibility {
        self.rule.as_ref()
    }

    /// The per-layer caches.
    pub fn caches(&self) -> &[LayerCache] {
        &self.caches
    }

    /// True once the policy has taken every decision its prefill takes
    /// (always for a static rule).
    pub fn is_decided(&self) -> bool {
        self.rule.dynamic().is_none_or(|d| d.is_decided())
    }

    /// Whether the prompt's chunks wait at stage cuts: a policy that
    /// decides there has not decided yet.
    pub(crate) fn prefills_in_stages(&self) -> bool {
        self.rule
            .dynamic()
            .is_some_and(|d| !d.is_decided() && !d.stage_cuts().is_empty())
    }

    /// Whether the policy decides from each layer's K/V once the prompt has
    /// run, and has not yet: until it has, every row stays.
    pub(crate) fn awaits_prompt_end(&self) -> bool {
        self.rule
            .dynamic()
            .is_some_and(|d| d.decides_at_prompt_end() && !d.is_decided())
    }

    /// SlimInfer's state (kept blocks, decisions, traffic), when the policy
    /// is SlimInfer: its own records, for reports and the viewer.
    pub fn slim(&self) -> Option<&SlimRun> {
        self.rule.dynamic()?.slim_run()
    }

    /// A press's state (what it observed of the prompt and kept), when the
    /// policy is a press.
    pub fn press(&self) -> Option<&PressRun> {
        self.rule.dynamic()?.press_run()
    }

    /// Whether the token at `pos` has a hidden state (and K/V) at `layer`.
    pub fn token_exists(&self, layer: usize, pos: usize) -> bool {
        self.rule.token_exists(layer, pos)
    }

    /// Whether the cache at `layer` keeps the K/V of the token at `pos`.
    pub fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        self.rule.retains_kv(layer, pos)
    }

    /// Whether a query at `q` reads the key at `k` (k <= q) at `layer`,
    /// before the model's own window.
    pub fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        self.rule.key_visible(layer, q, k)
    }

    /// Bytes of K/V held over all layers.
    pub fn kv_bytes_held(&self) -> u64 {
        self.caches.iter().map(|c| c.bytes_held() as u64).sum()
    }

    /// Bytes the linear-attention layers' states hold (Qwen3.5): a fixed
    /// size per layer that a token has run, whatever the sequence's length;
    /// not K/V, so not in [`Sequence::kv_bytes_held`].
    pub fn recurrent_bytes_held(&self) -> u64 {
        self.recurrent
            .iter()
            .flatten()
            .map(|s| s.bytes() as u64)
            .sum()
    }

    /// Whether this sequence's linear layers keep each state as the first
    /// token left it: a full-depth prefix (which a sweep may restrict to
    /// SPEED with BoS) or a knockout band, whose decode phase reads the
    /// anchors' state at the band's linear layers
    /// ([`RecurrentLayers::keeps_first_state`](lcut_policy::RecurrentLayers::keeps_first_state)).
    pub(crate) fn keeps_first_states(&self) -> bool {
        self.is_full_depth_prefix() || lcut_policy::RecurrentLayers::keeps_first_state(&self.policy)
    }

    /// Before the token at `pos` runs linear layer `layer`: where `pos` is
    /// the decode start and the decode phase there reads only the anchors'
    /// state although the prompt ran the layer (a knockout band's layer,
    /// [`RecurrentLayers::decode_reads_anchors`](lcut_policy::RecurrentLayers::decode_reads_anchors)),
    /// set the state back to the anchors': none, or BoS's, which the state
    /// keeps. Other anchors are refused ([`ModelError::NotRestrictable`]).
    pub(crate) fn enter_decode_phase(&mut self, layer: usize, pos: usize) -> Result<()> {
        if pos != self.rule.phases().decode_start() {
            return Ok(());
        }
        let Some(anchors) =
            lcut_policy::RecurrentLayers::decode_reads_anchors(self.rule.as_ref(), layer)
        else {
            return Ok(());
        };
        let Some(state) = &self.recurrent[layer] else {
            return Ok(());
        };
        if state.tokens() > anchors {
            self.recurrent[layer] =
                state
                    .prefix(anchors, false)
                    .map_err(|()| ModelError::NotRestrictable {
                        policy: self.policy.to_string(),
                    })?;
        }
        Ok(())
    }

    /// Layer `layer`'s linear-attention state, where it is a linear layer
    /// a token has run.
    pub fn recurrent_state(&self, layer: usize) -> Option<&RecurrentState> {
        self.recurrent.get(layer)?.as_ref()
    }

    /// Bytes of K/V buffers allocated over all layers.
    pub fn kv_bytes_allocated(&self) -> u64 {
        self.caches.iter().map(|c| c.bytes_allocated() as u64).sum()
    }

    /// The state this prompt prefix would have under another policy, without
    /// recomputing it: lower layers are shared, upper layers keep only the
    /// tokens the new policy keeps there.
    ///
    /// Valid while every processed token is before the decode start of
    /// `phases`, the sequence ran at full depth, and the new policy
    /// [reuses a full prefill](Policy::reuses_full_prefill): anchors are a
    /// prefix, so in both runs an anchor reads only anchors, and a layer's
    /// keys below the cutoff are the full model's. Used by sweeps over
    /// cutoffs to reuse one prefill. A linear-attention layer (Qwen3.5)
    /// keeps the full run's state where every token ran it (a knockout
    /// band's layer too, with BoS's state beside it: the decode phase reads
    /// that one at the decode start), and above the cut the
    /// state after the anchors: none, or BoS's (the state keeps it); other
    /// anchors there are refused ([`ModelError::NotRestrictable`]).
    pub fn restricted(&self, policy: Policy, phases: TokenPhases) -> Result<Sequence> {
        if !policy.reuses_full_prefill() {
            return Err(ModelError::NotRestrictable {
                policy: policy.to_string(),
            });
        }
        self.check_full_depth_prefix(&policy, &phases)?;
        let rule = policy.visibility(phases);
        // a policy whose meaning on a shared or linear layer is not defined
        // is refused as a new sequence of it would be
        self.sharing.check(&policy)?;
        if self.recurrent.iter().any(Option::is_some) {
            lcut_policy::RecurrentLayers::check_policy(&policy)?;
        }
        // a linear layer's state holds every token that ran it: under the
        // policy, the tokens that exist there (a prefix: every token below
        // the cut, the anchors above) must have run it first in the full
        // run, and the state after them be known (none, BoS alone, or all)
        let recurrent = self
            .recurrent
            .iter()
            .enumerate()
            .map(|(l, state)| {
                let Some(state) = state else {
                    return Ok(None);
                };
                let kept = (0..self.next_pos)
                    .take_while(|&p| rule.token_exists(l, p))
                    .count();
                let prefix = (kept..self.next_pos).all(|p| !rule.token_exists(l, p));
                let keeps_first = lcut_policy::RecurrentLayers::keeps_first_state(&policy);
                match prefix {
                    true => state.prefix(kept, keeps_first).ok(),
                    false => None,
                }
                .ok_or_else(|| ModelError::NotRestrictable {
                    policy: policy.to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // rows of tokens that exist at a layer stay while the prompt runs
        // (its later queries read them); those the policy does not keep go
        // once the decode phase starts
        let caches = self
            .caches
            .iter()
            .enumerate()
            .map(|(l, c)| {
                // a layer's cache serves every layer that reads it
                let share = &self.sharing;
                let per_head = share.heads_differ(rule.as_ref(), l);
                let heads = self.kv_heads.get(l).copied().unwrap_or(0);
                let mut c = c.branch_by_head(heads, per_head, |h, p| {
                    share.readers(l).any(|r| rule.token_exists(r, p))
                        || match per_head {
                            true => share.head_retains(rule.as_ref(), l, h, p),
                            false => share.retains(rule.as_ref(), l, p),
                        }
                })?;
                c.forget_checks();
                Ok(c)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.successor(policy, rule, caches, recurrent))
    }

    /// Whether this state is a full-depth run of a prompt's tokens: the
    /// full model's (or another static full-depth rule's), or a press's
    /// before any layer has decided (a press runs its prompt as the full
    /// model does).
    pub fn is_full_depth_prefix(&self) -> bool {
        (self.policy.is_full_depth() && self.policy.is_static())
            || self.press().is_some_and(PressRun::is_undecided)
    }

    /// Refuse to serve `policy` from this state unless it is a
    /// [full-depth prefix](Self::is_full_depth_prefix) of a prompt whose
    /// decode start `phases` puts at or after its tokens, at the policy's
    /// depth.
    pub(crate) fn check_full_depth_prefix(
        &self,
        policy: &Policy,
        phases: &TokenPhases,
    ) -> Result<()> {
        if !self.is_full_depth_prefix() {
            return Err(ModelError::NotFullDepthPrefix {
                policy: self.policy.to_string(),
            });
        }
        if self.next_pos > phases.decode_start() {
            return Err(ModelError::Phase(
                lcut_policy::PhaseError::DecodeStartOutsidePrompt {
                    decode_start: phases.decode_start(),
                    prompt_len: self.next_pos,
                },
            ));
        }
        if policy.num_layers() != self.caches.len() {
            return Err(depth_mismatch(policy, self.caches.len()));
        }
        Ok(())
    }

    /// This full-depth prefix's state under `policy` and its `rule` in its
    /// lower layers only: below layer `below`, the rows of the tokens that
    /// exist there under the rule (the full run's, where the policy runs the
    /// prompt as the full model does); from `below` up, nothing yet, for the
    /// caller to fill as the policy's own prefill would
    /// ([`Decoder::projected_from`](crate::Decoder::projected_from),
    /// [`Decoder::staged_from`](crate::Decoder::staged_from)).
    pub(crate) fn lower_layers_under(
        &self,
        policy: Policy,
        rule: Box<dyn Visibility>,
        below: usize,
    ) -> Result<Sequence> {
        let caches = self
            .caches
            .iter()
            .enumerate()
            .map(|(l, c)| {
                let mut c = c.branch(|p| l < below && rule.token_exists(l, p))?;
                c.forget_checks();
                Ok(c)
            })
            .collect::<Result<Vec<_>>>()?;
        // a linear layer below `below` keeps the full run's state (every
        // token ran it there); above, the caller's prefill runs it again
        let recurrent = (0..self.recurrent.len())
            .map(|l| match l < below {
                true => self.recurrent[l].clone(),
                false => None,
            })
            .collect();
        Ok(self.successor(policy, rule, caches, recurrent))
    }

    /// An independent copy of this state, to continue it in two ways: the
    /// copy reads the rows held from this state's buffers rather than
    /// copying them ([`LayerCache::fork`]), and neither ever changes a row
    /// the other reads.
    pub fn fork(&self) -> Result<Sequence> {
        self.copied_under(self.policy, self.rule.clone())
    }

    /// The state this prompt prefix has under another press, without
    /// recomputing it: a press's prompt runs every layer whole, as the full
    /// model's prefill, so its caches are every press's; only what the
    /// press observed of the prompt's queries differs, and a prefix begun
    /// by [`Decoder::new_press_prefix`](crate::Decoder::new_press_prefix)
    /// observed it for every press it was begun for. Valid before the
    /// prompt's end (no layer has decided).
    pub fn retargeted(&self, policy: Policy) -> Result<Sequence> {
        let not_shared = || ModelError::NotRestrictable {
            policy: policy.to_string(),
        };
        let run = self.press().ok_or_else(not_shared)?;
        let params = policy.press().ok_or_else(not_shared)?;
        if policy.num_layers() != self.caches.len() {
            return Err(depth_mismatch(&policy, self.caches.len()));
        }
        self.copied_under(policy, Box::new(run.retarget(*params)?))
    }

    /// An independent copy of this state under `policy` and its `rule`.
    fn copied_under(&self, policy: Policy, rule: Box<dyn Visibility>) -> Result<Sequence> {
        let caches = self
            .caches
            .iter()
            .map(LayerCache::fork)
            .collect::<Result<Vec<_>>>()?;
        let mut copy = self.successor(policy, rule, caches, self.recurrent.clone());
        copy.pending = self.pending.clone();
        Ok(copy)
    }

    /// A state of this prompt's tokens under `policy` and its `rule`, with
    /// `caches` and `recurrent` states of its own, the model's shape and
    /// this state's position, nothing pending and no step buffers.
    fn successor(
        &self,
        policy: Policy,
        rule: Box<dyn Visibility>,
        caches: Vec<LayerCache>,
        recurrent: Vec<Option<RecurrentState>>,
    ) -> Sequence {
        Sequence {
            policy,
            rule,
            caches,
            next_pos: self.next_pos,
            pending: Vec::new(),
            step: None,
            kv_heads: self.kv_heads.clone(),
            windows: self.windows.clone(),
            sharing: self.sharing.clone(),
            recurrent,
        }
    }

    /// Reserve cache room for `total_len` tokens in all, each layer only for
    /// the tokens the policy keeps there ([`Visibility::kv_rows`]: SlimInfer
    /// layers above the first cut reserve for the blocks the budgets
    /// predict, never for the whole prompt).
    pub fn reserve(&mut self, total_len: usize) {
        for (layer, cache) in self.caches.iter_mut().enumerate() {
            if !self.sharing.stores(layer) {
                continue;
            }
            let rows = self
                .rule
                .accounting()
                .kv_rows(layer, self.next_pos, total_len);
            // a windowed layer reuses the room of the rows its window left
            let window = self.windows.get(layer).copied().flatten();
            cache.reserve(crate::memory::window_cache_rows(window, rows));
        }
    }
}
