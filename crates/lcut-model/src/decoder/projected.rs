//! Projected prompt K/V: a token that leaves the model at a layer while the
//! layers from there on keep K/V of it (SwiftKV, POP) carries the hidden
//! state it left with through the rest of the chunk's pass; each later layer
//! projects its K/V from that state with its own input norm and K/V
//! projections (LoRA included), and the cache takes them in position order
//! beside the chunk's own.

use std::borrow::Cow;

use candle_core::Tensor;
use lcut_policy::{Policy, TokenPhases, Visibility};

use super::{ChunkRows, Decoder, Layer};
use crate::error::{ModelError, Result};
use crate::probes::PromptRecord;
use crate::sequence::Sequence;

/// The chunk's tokens that have left at some layer of this pass and keep
/// projected K/V above it: the hidden states they left with, their
/// positions (ascending) and the RoPE tables of those positions (one pair
/// per RoPE of the model).
pub(super) struct Projected {
    hidden: Tensor,
    pub(super) positions: Vec<usize>,
    tables: Vec<(Tensor, Tensor)>,
}

/// Keys and values [kv_heads, n, head_dim] of a chunk at one layer, with
/// their positions (ascending).
pub(super) struct ChunkKv<'a> {
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    pub(super) positions: Cow<'a, [usize]>,
}

impl Projected {
    /// The tokens at `positions` (ascending) leaving with `hidden`.
    pub(super) fn at(dec: &Decoder, hidden: Tensor, positions: Vec<usize>) -> Result<Self> {
        Ok(Self {
            hidden,
            tables: dec.rope_tables(&positions)?,
            positions,
        })
    }
}

impl ChunkKv<'_> {
    /// These keys and values together with `k`, `v` at `positions`, in
    /// position order (the cache appends in ascending order: a chunk's
    /// anchors come before its projected prompt tokens, its decode-phase
    /// tokens after them).
    pub(super) fn merged(
        self,
        k: &Tensor,
        v: &Tensor,
        positions: &[usize],
    ) -> Result<ChunkKv<'static>> {
        let (order, positions) = position_order(&self.positions, positions);
        Ok(ChunkKv {
            k: cat_in_order(&self.k, k, order.as_ref(), 1)?,
            v: cat_in_order(&self.v, v, order.as_ref(), 1)?,
            positions: Cow::Owned(positions),
        })
    }
}

/// The order that sorts `a` followed by `b` by position (`None` when it is
/// already sorted), and the sorted positions.
fn position_order(a: &[usize], b: &[usize]) -> (Option<Vec<u32>>, Vec<usize>) {
    let all: Vec<usize> = a.iter().chain(b).copied().collect();
    if all.is_sorted() {
        return (None, all);
    }
    let mut order: Vec<u32> = (0..all.len() as u32).collect();
    order.sort_by_key(|&i| all[i as usize]);
    let sorted = order.iter().map(|&i| all[i as usize]).collect();
    (Some(order), sorted)
}

/// `a` and `b` concatenated along `dim`, reordered by `order` when given.
fn cat_in_order(a: &Tensor, b: &Tensor, order: Option<&Vec<u32>>, dim: usize) -> Result<Tensor> {
    let both = Tensor::cat(&[a, b], dim)?;
    Ok(match order {
        Some(order) => {
            let idx = Tensor::new(order.as_slice(), both.device())?;
            both.index_select(&idx, dim)?
        }
        None => both,
    })
}

impl Decoder {
    /// Before layer `l` drops the tokens of `present` that do not exist
    /// there, keep the hidden states of those whose K/V the policy projects
    /// from layer `l` on.
    pub(super) fn project_leaving(
        &self,
        seq: &Sequence,
        l: usize,
        hidden: &Tensor,
        present: &[usize],
        projected: &mut Option<Projected>,
    ) -> Result<()> {
        let leaving: Vec<u32> = (0..present.len() as u32)
            .filter(|&i| {
                let pos = present[i as usize];
                !seq.token_exists(l, pos) && seq.rule.kv_projected_at(pos) == Some(l)
            })
            .collect();
        if leaving.is_empty() {
            return Ok(());
        }
        let idx = Tensor::new(leaving.as_slice(), &self.device)?;
        let rows = hidden.index_select(&idx, 0)?;
        let positions: Vec<usize> = leaving.iter().map(|&i| present[i as usize]).collect();
        let (hidden, positions) = match projected.take() {
            None => (rows, positions),
            Some(p) => {
                // with the tokens that left lower down: one set, in position order
                let (order, sorted) = position_order(&p.positions, &positions);
                (cat_in_order(&p.hidden, &rows, order.as_ref(), 0)?, sorted)
            }
        };
        let tables = self.rope_tables(&positions)?;
        *projected = Some(Projected {
            hidden,
            positions,
            tables,
        });
        Ok(())
    }

    /// `layer`'s K/V of the projected tokens: its input norm (where it has
    /// one), then its own K/V projections with the k-norm and, where the
    /// layer rotates, RoPE at their positions.
    pub(super) fn projected_kv(&self, layer: &Layer, p: &Projected) -> Result<(Tensor, Tensor)> {
        let x = match &layer.input_norm {
            Some(norm) => norm.forward(&p.hidden)?,
            None => p.hidden.clone(),
        };
        let rotation = layer.rope.map(|r| {
            let (cos, sin) = &p.tables[r];
            (self.rope_at(r), cos, sin)
        });
        layer.attn.kv(&x, rotation)
    }

    /// The state `policy` has after `prefix`'s prompt tokens when its
    /// tokens leave the model at a layer and keep K/V projected from there
    /// on (SwiftKV, POP), without running the prompt's lower layers again.
    /// Below the layer where tokens leave, the policy runs the prompt as
    /// the full model does, so its K/V there are `prefix`'s (a
    /// [full-depth prefix](Sequence::is_full_depth_prefix)). From that
    /// layer on, chunk by chunk as `entering` recorded the full run's states
    /// entering it, the tokens that stay (the anchors) run the upper layers
    /// and the tokens that leave store K/V projected from the state they
    /// leave with: the operations of the policy's own prefill, on the same
    /// rows. Refused for a policy whose tokens never leave (restrict the
    /// prefix instead) or leave at several layers, and where `entering`
    /// lacks a state a token needs.
    pub fn projected_from(
        &self,
        prefix: &Sequence,
        policy: Policy,
        phases: TokenPhases,
        entering: &PromptRecord,
    ) -> Result<Sequence> {
        prefix.check_full_depth_prefix(&policy, &phases)?;
        self.check_no_layer_inputs(&policy)?;
        let rule = policy.visibility(phases);
        let held = prefix.next_pos;
        let exit_of: Vec<Option<usize>> = (0..held).map(|p| rule.kv_projected_at(p)).collect();
        let leaves_at = |p: usize| exit_of.get(p).copied().flatten();
        let exits = self.projected_exits(rule.as_ref(), held);
        let [exit] = exits[..] else {
            return Err(ModelError::NotRestrictable {
                policy: policy.to_string(),
            });
        };
        let missing = |reason: String| ModelError::UnrecordedPrompt {
            policy: policy.to_string(),
            layer: exit,
            reason,
        };
        let chunks = entering
            .chunks(exit)
            .ok_or_else(|| missing("the prompt run did not record them".into()))?;
        // below the exit every prompt token exists: the full run's rows
        let mut seq = prefix.lower_layers_under(policy, rule, exit)?;
        let mut recorded = Vec::new();
        for (hidden, positions) in chunks {
            let rows_where = |keep: &dyn Fn(usize) -> bool| -> Result<(Tensor, Vec<usize>)> {
                let rows: Vec<u32> = (0..positions.len() as u32)
                    .filter(|&i| positions[i as usize] < held && keep(positions[i as usize]))
                    .collect();
                let idx = Tensor::new(rows.as_slice(), &self.device)?;
                let at = rows.iter().map(|&i| positions[i as usize]).collect();
                Ok((hidden.index_select(&idx, 0)?, at))
            };
            // the chunk's tokens that stay run the upper layers first: they
            // precede the leaving ones and read none of them
            let (staying, at) = rows_where(&|p| seq.rule.token_exists(exit, p))?;
            if !at.is_empty() {
                let rows = ChunkRows {
                    hidden: staying,
                    present: at,
                    layer_inputs: None,
                };
                self.run_layers(&mut seq, exit..self.layers.len(), rows, None, &mut None)?;
            }
            let (leaving, at) = rows_where(&|p| leaves_at(p) == Some(exit))?;
            if at.is_empty() {
                continue;
            }
            let leaving = Projected::at(self, leaving, at)?;
            for (l, layer) in self.layers.iter().enumerate().skip(exit) {
                let (k, v) = self.projected_kv(layer, &leaving)?;
                self.store_kv(&mut seq.caches[l], (&k, &v), &leaving.positions)?;
            }
            recorded.extend(leaving.positions);
        }
        if !recorded
            .iter()
            .copied()
            .eq((0..held).filter(|&p| leaves_at(p) == Some(exit)))
        {
            return Err(missing(format!(
                "the prompt run recorded {} of the {held} prompt tokens' states there, not every token that leaves",
                recorded.len()
            )));
        }
        Ok(seq)
    }

    /// Whether the model gives each layer an input of its own per token
    /// (Gemma 4's per-layer inputs), which a [`PromptRecord`] does not
    /// hold: a projected or staged policy cannot branch from a full run of
    /// such a model.
    pub fn has_layer_inputs(&self) -> bool {
        self.layer_inputs.is_some()
    }

    /// The layers, ascending, where `rule`'s first `prompt_len` tokens leave
    /// the model with projected K/V (SwiftKV, POP) and a full run of the
    /// prompt can serve them ([`Decoder::projected_from`]); none for a rule
    /// without projected tokens or on a model with per-layer inputs.
    pub fn projected_exits(&self, rule: &dyn Visibility, prompt_len: usize) -> Vec<usize> {
        if self.has_layer_inputs() {
            return Vec::new();
        }
        let mut exits: Vec<usize> = (0..prompt_len)
            .filter_map(|p| rule.kv_projected_at(p))
            .collect();
        exits.sort_unstable();
        exits.dedup();
        exits
    }

    /// Refuse to branch `policy` from a full run on a model with per-layer
    /// inputs ([`Decoder::has_layer_inputs`]).
    pub(super) fn check_no_layer_inputs(&self, policy: &Policy) -> Result<()> {
        match self.has_layer_inputs() {
            true => Err(ModelError::NotRestrictable {
                policy: policy.to_string(),
            }),
            false => Ok(()),
        }
    }
}
