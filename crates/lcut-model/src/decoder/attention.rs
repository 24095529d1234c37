//! One layer's attention on the tensor path: grouped-query attention in
//! blocks of query rows over the keys each query reads ([`KeyPlanner`]: one
//! additive mask per group of K/V heads that hold the same rows under the
//! same rule), and the probe's view of the probabilities. A chunk's
//! attention usually runs on lcut's kernel instead, see `chunk_attention`.

use candle_core::{DType, Tensor};

use super::Decoder;
use super::flash::{FusedInputs, attend_fused, fused_attention_runs};
use super::reads::BatchSoftmax;
use lcut_kernels::attention::tiled::encode_reads;
use lcut_policy::keys::{GroupReads, KeyPlanner, KeyQuery};

use super::reads::{PartialMask, group_mask};
use crate::cache::LayerCache;
use crate::error::{ModelError, Result};
use crate::probe::{AttentionView, Probe};
use crate::sequence::Sequence;

/// The reads of the previous layer of the same chunk and the mask tensors
/// built from them, kept while the next layer reads the same rows.
#[derive(Default)]
pub(super) struct LayerReads {
    pub(super) reads: KeyPlanner,
    /// Per group: the version of the reads a mask was built from, and the mask.
    masks: Vec<(u64, Option<Tensor>)>,
    /// Per group: the version of the reads the fused kernel's encoding of
    /// them was made from, and the encoding on the device.
    fused_reads: Vec<(u64, Option<Tensor>)>,
}

/// One group's output [its query heads, n, head_dim], and its attention
/// rows when asked, over its own keys.
struct GroupOut {
    out: Tensor,
    probs: Option<(Tensor, Vec<usize>)>,
}

impl Decoder {
    /// Layer `l`'s attention of the chunk's queries `q` [heads, n, head_dim]
    /// at `present` over the rows of `cache` each reads, and the probe told
    /// of the attention rows it asks for.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_layer(
        &self,
        l: usize,
        window: Option<usize>,
        q: &Tensor,
        cache: &LayerCache,
        present: &[usize],
        seq: &Sequence,
        memo: &mut LayerReads,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let probs_from = probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .map(|from| present.partition_point(|&q| q < from))
            .filter(|&first| first < present.len());
        let kv_heads = self.layers[l].attn.num_kv_heads();
        let ask = KeyQuery {
            layer: l,
            window,
            queries: present,
            kv_heads,
            own_rows: self.sharing.kept_by_own_rule(l),
        };
        let groups = memo.reads.plan(seq.rule.as_ref(), &ask, cache);
        memo.masks.resize(groups.len(), (0, None));
        memo.fused_reads.resize(groups.len(), (0, None));
        let fused = probs_from.is_none()
            && fused_attention_runs(&self.device, q.dtype(), q.dim(2)?)
            && groups.iter().all(|g| g.complete);
        let group_size = self.cfg.num_heads / kv_heads;
        let mut outs = Vec::with_capacity(groups.len());
        for ((g, kept), encoded) in groups
            .iter()
            .zip(memo.masks.iter_mut())
            .zip(memo.fused_reads.iter_mut())
        {
            let (k, v) = self.group_keys(cache, g, l)?;
            let (first_head, heads) = (g.heads.start * group_size, g.heads.len() * group_size);
            let q = match g.heads.len() == kv_heads {
                true => q.clone(),
                false => q.narrow(0, first_head, heads)?,
            };
            let sinks = self.layers[l]
                .attn
                .sinks()
                .map(|s| s.narrow(0, first_head, heads))
                .transpose()?;
            if fused {
                let reads = match encoded {
                    (version, Some(t)) if *version == g.version => t.clone(),
                    _ => {
                        let reads = encode_reads(&g.spans)?;
                        let len = reads.len();
                        let t = Tensor::from_vec(reads, len, &self.device)?;
                        *encoded = (g.version, Some(t.clone()));
                        t
                    }
                };
                let (out, _lse) = attend_fused(&FusedInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    reads: &reads,
                    sinks: sinks.as_ref(),
                    scale: self.cfg.attn_scale as f32,
                    softcap: self.cfg.attn_softcap.map(|c| c as f32),
                })?;
                outs.push(GroupOut { out, probs: None });
                continue;
            }
            let keys = cache.group_positions(g.rows);
            if kept.0 != g.version {
                let mask = group_mask(g, keys.len());
                *kept = (
                    g.version,
                    self.mask_tensor(mask, present.len(), keys.len())?,
                );
            }
            let (out, probs) =
                self.attend(&q, &k, &v, kept.1.as_ref(), sinks.as_ref(), probs_from)?;
            outs.push(GroupOut {
                out,
                probs: probs.map(|p| (p, keys.to_vec())),
            });
        }
        let attn = match outs.len() {
            1 => outs[0].out.clone(),
            _ => Tensor::cat(&outs.iter().map(|o| &o.out).collect::<Vec<_>>(), 0)?,
        };
        if let (Some(p), Some(first)) = (probe.as_deref_mut(), probs_from) {
            let (probs, key_positions) = merged_probs(outs)?;
            p.on_attention(AttentionView {
                layer: l,
                query_positions: &present[first..],
                key_positions: &key_positions,
                probs: &probs,
            })?;
        }
        Ok(attn)
    }

    /// The keys and values group `g` reads, [its K/V heads, keys, head_dim],
    /// in the activations' dtype (a cache stored narrower is read widened).
    fn group_keys(&self, cache: &LayerCache, g: &GroupReads, l: usize) -> Result<(Tensor, Tensor)> {
        let (k, v) = cache
            .group_kv(g.rows)?
            .ok_or(ModelError::EmptyCache { layer: l })?;
        let all_heads = self.layers[l].attn.num_kv_heads();
        let (k, v) = match cache.is_split() || g.heads.len() == all_heads {
            true => (k, v),
            false => (
                k.narrow(0, g.heads.start, g.heads.len())?,
                v.narrow(0, g.heads.start, g.heads.len())?,
            ),
        };
        Ok((k.to_dtype(self.dtype)?, v.to_dtype(self.dtype)?))
    }

    /// The full [queries x keys] mask on the device, or `None` when every
    /// query reads every key: zeros for the visible prefix are made there,
    /// only the rest crosses from the host.
    fn mask_tensor(
        &self,
        mask: Option<PartialMask>,
        queries: usize,
        keys: usize,
    ) -> Result<Option<Tensor>> {
        let Some(mask) = mask else {
            return Ok(None);
        };
        let rest = Tensor::from_vec(
            mask.rest,
            (queries, keys - mask.visible_prefix),
            &self.device,
        )?;
        if mask.visible_prefix == 0 {
            return Ok(Some(rest));
        }
        let prefix = Tensor::zeros((queries, mask.visible_prefix), DType::F32, &self.device)?;
        Ok(Some(Tensor::cat(&[&prefix, &rest], 1)?))
    }

    /// Grouped-query attention without repeating K/V: the query heads that
    /// share a KV head are stacked into one matrix per KV head. Query rows
    /// are taken in blocks whose scores stay within the block bound.
    /// `sinks` [heads] (f32) are the query heads' sink logits, where the
    /// model has them. Returns the output [heads, n, head_dim] and, when
    /// `probs_from` is given, the probabilities of rows `probs_from..n`
    /// [heads, rows, keys] (f32; with sinks a row sums to one less the
    /// sink's share).
    pub(super) fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        sinks: Option<&Tensor>,
        probs_from: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (heads, n, _) = q.dims3()?;
        let keys = k.dim(1)?;
        let rows_per_block = (self.attention_block_elems / (heads * keys).max(1)).max(1);
        if rows_per_block >= n {
            let (out, probs) = self.attend_block(q, k, v, mask, sinks)?;
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
            let (out, probs) = self.attend_block(&q_block, k, v, mask_block.as_ref(), sinks)?;
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

    /// [`Self::attend`] for one block of query rows, all at once. A sink is
    /// one more column of every head's scores, its logit; it takes its share
    /// of the softmax and is dropped (it has no value).
    fn attend_block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        sinks: Option<&Tensor>,
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
        if let Some(sinks) = sinks {
            let column = sinks
                .reshape((kv_heads, group, 1))?
                .broadcast_as((kv_heads, group, n))?
                .reshape((kv_heads, group * n, 1))?;
            scores = Tensor::cat(&[&scores, &column], 2)?;
        }
        // candle's fused softmax has no backward: a training pass (scores
        // carrying gradients) takes the one made of differentiable ops
        let mut probs = match scores.track_op() {
            true => candle_nn::ops::softmax(&scores, candle_core::D::Minus1)?,
            false => candle_nn::ops::softmax_last_dim(&scores)?,
        };
        if sinks.is_some() {
            // without the sink's column; contiguous, since a CUDA matmul
            // takes no strided operand (an f32 run's `to_dtype` below copies
            // nothing)
            probs = probs.narrow(2, 0, keys)?.contiguous()?;
        }
        let out = probs.to_dtype(self.dtype)?.matmul(v)?;
        Ok((
            out.reshape((heads, n, head_dim))?,
            probs.reshape((heads, n, keys))?,
        ))
    }

    /// Layer `l`'s attention of a training batch: `q` [heads, b * t,
    /// head_dim], `k` and `v` [kv_heads, b * t, head_dim], the rows of `b`
    /// sequences of `t` tokens one after another, each sequence's queries
    /// reading only its own keys, with the probabilities `softmax` gives.
    /// Returns the output [heads, b * t, head_dim].
    pub(super) fn attend_batch(
        &self,
        l: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        t: usize,
        softmax: &dyn BatchSoftmax,
    ) -> Result<Tensor> {
        if self.layers[l].attn.sinks().is_some() {
            return Err(ModelError::LayerProgram {
                what: "a training batch through attention with sink logits (not supported yet)",
            });
        }
        let (heads, n, head_dim) = q.dims3()?;
        let kv_heads = k.dim(0)?;
        let (b, group) = (n / t.max(1), heads / kv_heads);
        // [count, b * t, head_dim] as [b, count, t, head_dim]
        let per_sequence = |x: &Tensor, count: usize| -> Result<Tensor> {
            Ok(x.reshape((count, b, t, head_dim))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        // the query heads that share a K/V head are stacked: [b, kv, group * t, hd]
        let q = (per_sequence(q, heads)? * self.cfg.attn_scale)?.reshape((
            b,
            kv_heads,
            group * t,
            head_dim,
        ))?;
        let (k, v) = (per_sequence(k, kv_heads)?, per_sequence(v, kv_heads)?);
        let mut scores = q.matmul(&k.t()?)?;
        if let Some(c) = self.cfg.attn_softcap {
            scores = ((scores / c)?.tanh()? * c)?;
        }
        let probs = softmax
            .softmax(l, &scores.reshape((b, kv_heads, group, t, t))?)?
            .reshape((b, kv_heads, group * t, t))?;
        Ok(probs
            .matmul(&v)?
            .reshape((b, heads, t, head_dim))?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((heads, n, head_dim))?)
    }
}

/// The groups' attention rows as one view: over the same keys when every
/// group read the same rows, else over the union of their keys (each
/// group's probabilities 0 at the keys it does not hold).
fn merged_probs(outs: Vec<GroupOut>) -> Result<(Tensor, Vec<usize>)> {
    let parts: Vec<(Tensor, Vec<usize>)> = outs.into_iter().filter_map(|o| o.probs).collect();
    let same = parts.windows(2).all(|w| w[0].1 == w[1].1);
    if same {
        let keys = parts.first().map(|p| p.1.clone()).unwrap_or_default();
        let probs = match parts.len() {
            1 => parts[0].0.clone(),
            _ => Tensor::cat(&parts.iter().map(|p| &p.0).collect::<Vec<_>>(), 0)?,
        };
        return Ok((probs, keys));
    }
    union_probs(&parts)
}

/// Probabilities of groups over different keys, scattered onto the union of
/// their key positions.
pub(super) fn union_probs(parts: &[(Tensor, Vec<usize>)]) -> Result<(Tensor, Vec<usize>)> {
    let mut union: Vec<usize> = parts.iter().flat_map(|p| p.1.iter().copied()).collect();
    union.sort_unstable();
    union.dedup();
    let mut out = Vec::new();
    let (mut heads, mut rows) = (0, 0);
    for (probs, keys) in parts {
        let (h, r, n) = probs.dims3()?;
        rows = r;
        heads += h;
        let host = probs
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let cols: Vec<usize> = keys
            .iter()
            .map(|k| union.partition_point(|u| u < k))
            .collect();
        for row in host.chunks_exact(n.max(1)).take(h * r) {
            let mut wide = vec![0f32; union.len()];
            for (&c, &p) in cols.iter().zip(row) {
                wide[c] = p;
            }
            out.extend_from_slice(&wide);
        }
    }
    let device = parts
        .first()
        .map(|p| p.0.device().clone())
        .unwrap_or(candle_core::Device::Cpu);
    let probs = Tensor::from_vec(out, (heads, rows, union.len()), &device)?;
    Ok((probs, union))
}
