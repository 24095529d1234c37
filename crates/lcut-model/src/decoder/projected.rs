//! Projected prompt K/V: a token that leaves the model at a layer while the
//! layers from there on keep K/V of it (SwiftKV, POP) carries the hidden
//! state it left with through the rest of the chunk's pass; each later layer
//! projects its K/V from that state with its own input norm and K/V
//! projections (LoRA included), and the cache takes them in position order
//! beside the chunk's own.

use std::borrow::Cow;

use candle_core::Tensor;

use super::{Decoder, Layer};
use crate::error::Result;
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
}
