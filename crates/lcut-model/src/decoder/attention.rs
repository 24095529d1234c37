//! One layer's attention: grouped-query attention in blocks of query rows,
//! the additive mask of causal order, the window and the policy, and the
//! probe's view of the probabilities (the tensor path; a chunk's attention
//! usually runs on lcut's kernel instead, see `chunk_attention`).

use candle_core::{DType, Tensor};

use super::Decoder;
use super::pass::ChunkKeys;
use crate::error::Result;
use crate::mask::{PartialMask, additive_mask, exact_additive_mask};
use crate::probe::{AttentionView, Probe};
use crate::sequence::Sequence;

/// The mask built for the previous layer of the same chunk, reused while
/// the next layer sees the same queries, keys, window and visibility rule.
#[derive(Default)]
pub(super) struct MaskMemo {
    key: Option<MaskKey>,
    mask: Option<Tensor>,
    /// The rows each query read on the chunk kernel's path.
    pub(super) spans: super::chunk_attention::ChunkSpans,
}

/// What a layer's mask depends on.
struct MaskKey {
    /// The visibility rule in force: [`lcut_policy::Visibility::rule_class`].
    rule: usize,
    window: Option<usize>,
    queries: Vec<usize>,
    keys: Vec<usize>,
}

impl Decoder {
    /// Layer `l`'s attention of the chunk's queries `q` over `keys`: keys
    /// outside a sliding window dropped, the policy's mask, and the probe
    /// told of the attention rows it asks for.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_layer(
        &self,
        l: usize,
        window: Option<usize>,
        q: &Tensor,
        keys: ChunkKeys<'_>,
        present: &[usize],
        seq: &Sequence,
        masks: &mut MaskMemo,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let probs_from = probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .map(|from| present.partition_point(|&q| q < from))
            .filter(|&first| first < present.len());
        // Keys older than the window of the chunk's first query are read by
        // none of its queries: a windowed layer reads `window` keys, not the
        // whole context (kept when a probe wants the attention rows whole).
        let skip = match (window, probs_from) {
            (Some(w), None) => keys.positions.partition_point(|&k| k + w <= present[0]),
            _ => 0,
        };
        let ChunkKeys {
            keys,
            values,
            positions: key_positions,
        } = if skip > 0 { keys.skip(skip)? } else { keys };
        let mask = self.layer_mask(l, window, seq, present, key_positions, masks)?;
        let (attn, probs) = self.attend(q, &keys, &values, mask.as_ref(), probs_from)?;
        if let (Some(p), Some(first), Some(probs)) = (probe.as_deref_mut(), probs_from, probs) {
            p.on_attention(AttentionView {
                layer: l,
                query_positions: &present[first..],
                key_positions,
                probs: &probs,
            })?;
        }
        Ok(attn)
    }

    /// The additive mask of layer `l` for these queries and keys, or `None`
    /// when every key is visible to every query. A decode step over a
    /// cache the policy hides nothing of costs O(1) here, whatever the
    /// context length; a prefill chunk's mask is built once and reused by
    /// the following layers that see the same keys under the same rule.
    fn layer_mask(
        &self,
        l: usize,
        window: Option<usize>,
        seq: &Sequence,
        queries: &[usize],
        keys: &[usize],
        memo: &mut MaskMemo,
    ) -> Result<Option<Tensor>> {
        // `Visibility::key_visible` depends on the layer only through its rule class.
        let rule = seq.rule.rule_class(l);
        if rule == 0 && window.is_none() && keys.last() <= queries.first() {
            return Ok(None);
        }
        if let Some(key) = &memo.key
            && key.rule == rule
            && key.window == window
            && key.queries == queries
            && key.keys == keys
        {
            return Ok(memo.mask.clone());
        }
        let visible = |q, k| seq.key_visible(l, q, k);
        let mask = match seq.rule.monotone_in_query() {
            true => additive_mask(queries, keys, window, visible),
            false => Some(exact_additive_mask(queries, keys, window, visible)),
        }
        .map(|m| self.mask_tensor(m, queries.len(), keys.len()))
        .transpose()?;
        memo.key = Some(MaskKey {
            rule,
            window,
            queries: queries.to_vec(),
            keys: keys.to_vec(),
        });
        memo.mask = mask.clone();
        Ok(mask)
    }

    /// The full [queries x keys] mask on the device: zeros for the visible
    /// prefix are made there, only the rest crosses from the host.
    fn mask_tensor(&self, mask: PartialMask, queries: usize, keys: usize) -> Result<Tensor> {
        let rest = Tensor::from_vec(
            mask.rest,
            (queries, keys - mask.visible_prefix),
            &self.device,
        )?;
        if mask.visible_prefix == 0 {
            return Ok(rest);
        }
        let prefix = Tensor::zeros((queries, mask.visible_prefix), DType::F32, &self.device)?;
        Ok(Tensor::cat(&[&prefix, &rest], 1)?)
    }

    /// Grouped-query attention without repeating K/V: the query heads that
    /// share a KV head are stacked into one matrix per KV head. Query rows
    /// are taken in blocks whose scores stay within the block bound.
    /// Returns the output [heads, n, head_dim] and, when `probs_from` is
    /// given, the probabilities of rows `probs_from..n` [heads, rows, keys] (f32).
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        probs_from: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (heads, n, _) = q.dims3()?;
        let keys = k.dim(1)?;
        let rows_per_block = (self.attention_block_elems / (heads * keys).max(1)).max(1);
        if rows_per_block >= n {
            let (out, probs) = self.attend_block(q, k, v, mask)?;
            let probs = probs_from
                .map(|first| probs.narrow(1, first, n - first))
                .transpose()?;
            return Ok((out, probs));
        }
        let (mut outs, mut kept) = (Vec::new(), Vec::new());
        for start in (0..n).step_by(rows_per_block) {
            let rows = rows_per_block.min(n - start);
            let q_block = q.narrow(1, start, rows)?.contiguous()?;
            let mask_block = mask.map(|m| m.narrow(0, start, rows)).transpose()?;
            let (out, probs) = self.attend_block(&q_block, k, v, mask_block.as_ref())?;
            outs.push(out);
            if let Some(first) = probs_from
                && start + rows > first
            {
                let skip = first.saturating_sub(start);
                kept.push(probs.narrow(1, skip, rows - skip)?);
            }
        }
        let probs = if kept.is_empty() {
            None
        } else {
            Some(Tensor::cat(&kept, 1)?)
        };
        Ok((Tensor::cat(&outs, 1)?, probs))
    }

    /// [`Self::attend`] for one block of query rows, all at once.
    fn attend_block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let (heads, n, head_dim) = q.dims3()?;
        let (kv_heads, keys, _) = k.dims3()?;
        let group = heads / kv_heads;
        let q = (q * self.cfg.attn_scale)?.reshape((kv_heads, group * n, head_dim))?;
        let mut scores = q.matmul(&k.t()?)?.to_dtype(DType::F32)?;
        if let Some(c) = self.cfg.attn_softcap {
            scores = ((scores / c)?.tanh()? * c)?;
        }
        if let Some(mask) = mask {
            scores = scores
                .reshape((kv_heads, group, n, keys))?
                .broadcast_add(mask)?
                .reshape((kv_heads, group * n, keys))?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.to_dtype(self.dtype)?.matmul(v)?;
        Ok((
            out.reshape((heads, n, head_dim))?,
            probs.reshape((heads, n, keys))?,
        ))
    }
}
