//! One chunk through the layers: embeddings, each layer's projections,
//! cache update, attention and MLP, dropping the tokens that do not exist
//! at a layer (projecting the K/V of those the policy keeps projected into
//! the layers above), then the logits of the rows asked for.

use std::borrow::Cow;

use candle_core::{DType, Tensor};
use lcut_policy::window::first_readable;

use super::attention::LayerReads;
use super::chunk_attention::ChunkKernel;
use super::projected::{ChunkKv, Projected};
use super::{ChunkOutput, Decoder, Layer, LogitRows};
use crate::error::Result;
use crate::probe::{Probe, ResidualSite};
use crate::sequence::Sequence;

/// The residual stream after layer `layer`: `hidden` plus the attention
/// output `attn` (through the output projection), then plus the MLP's.
pub(super) fn layer_residuals(layer: &Layer, hidden: &Tensor, attn: &Tensor) -> Result<Tensor> {
    let mut attn_out = layer.attn.output(attn)?;
    if let Some(norm) = &layer.attn_out_norm {
        attn_out = norm.forward(&attn_out)?;
    }
    let hidden = (hidden + attn_out)?;
    let mut mlp_out = layer.mlp.forward(&layer.mlp_in_norm.forward(&hidden)?)?;
    if let Some(norm) = &layer.mlp_out_norm {
        mlp_out = norm.forward(&mlp_out)?;
    }
    Ok((hidden + mlp_out)?)
}

/// The last `w` query rows of `q` [heads, n, head_dim] on the host, oldest
/// first, each `heads * head_dim` values head-major.
fn last_query_rows(q: &Tensor, w: usize) -> Result<Vec<Vec<f32>>> {
    let (heads, n, hd) = q.dims3()?;
    let take = n.min(w);
    Ok(q.narrow(1, n - take, take)?
        .transpose(0, 1)?
        .to_dtype(DType::F32)?
        .reshape((take, heads * hd))?
        .to_vec2::<f32>()?)
}

impl Decoder {
    /// The (scaled) embeddings of a chunk starting at `start`, and its positions.
    pub(super) fn embed(
        &self,
        tokens: &[u32],
        start: usize,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<(Tensor, Vec<usize>)> {
        let ids = Tensor::new(tokens, &self.device)?;
        let mut hidden = self.embed.lookup(&ids)?;
        if let Some(scale) = self.cfg.embedding_scale {
            hidden = (hidden * scale)?;
        }
        let present: Vec<usize> = (start..start + tokens.len()).collect();
        if let Some(p) = probe.as_deref_mut()
            && p.wants_residual(ResidualSite::Embeddings)
        {
            p.on_residual(ResidualSite::Embeddings, &present, &hidden)?;
        }
        Ok((hidden, present))
    }

    /// Run hidden states at `present` through `layers`, dropping the tokens
    /// that do not exist at a layer; returns what is left after the last.
    /// A dropped token whose K/V the policy keeps projected from that layer
    /// on ([`lcut_policy::Visibility::kv_projected_at`]) gives each later
    /// layer of the range K/V from the hidden state it left with (a policy
    /// that projects prefills in one pass, so the range runs to the top).
    /// `step_from`: the first position of a step taken after the prefill's
    /// decisions (the policy is told after each layer, so that a policy that
    /// decides while it runs can move what later steps read); `None` during
    /// a staged prefill.
    pub(crate) fn run_layers(
        &self,
        seq: &mut Sequence,
        layers: std::ops::Range<usize>,
        mut hidden: Tensor,
        mut present: Vec<usize>,
        step_from: Option<usize>,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<(Tensor, Vec<usize>)> {
        let mut tables = self.rope_tables(&present)?;
        let mut reads = LayerReads::default();
        let mut projected: Option<Projected> = None;
        for l in layers {
            let layer = &self.layers[l];
            let keep: Vec<u32> = (0..present.len() as u32)
                .filter(|&i| seq.token_exists(l, present[i as usize]))
                .collect();
            if keep.len() != present.len() {
                self.project_leaving(seq, l, &hidden, &present, &mut projected)?;
                if keep.is_empty() {
                    present.clear();
                } else {
                    let idx = Tensor::new(keep.as_slice(), &self.device)?;
                    hidden = hidden.index_select(&idx, 0)?;
                    present = keep.iter().map(|&i| present[i as usize]).collect();
                    tables = self.rope_tables(&present)?;
                }
            }
            if present.is_empty() {
                match &projected {
                    Some(p) => {
                        let (k, v) = self.projected_kv(layer, p)?;
                        self.store_kv(&mut seq.caches[l], (&k, &v), &p.positions)?;
                        continue;
                    }
                    None => break,
                }
            }
            hidden = self.layer_forward(
                (l, layer),
                &hidden,
                (&present, &tables[layer.rope]),
                projected.as_ref(),
                seq,
                &mut reads,
                probe,
            )?;
            if let Some(p) = probe.as_deref_mut()
                && p.wants_residual(ResidualSite::Layer(l))
            {
                p.on_residual(ResidualSite::Layer(l), &present, &hidden)?;
            }
            if let Some(position) = step_from
                && let Some(d) = seq.rule.dynamic_mut()
            {
                d.after_decode_layer(l, position);
            }
        }
        Ok((hidden, present))
    }

    /// Logits of the requested rows of hidden states at `present`.
    pub(crate) fn logits(
        &self,
        hidden: &Tensor,
        present: &[usize],
        last: usize,
        rows: LogitRows,
    ) -> Result<ChunkOutput> {
        let (h, positions) = match rows {
            LogitRows::None => (None, vec![]),
            _ if present.is_empty() => (None, vec![]),
            LogitRows::Last if present.last() == Some(&last) => {
                (Some(hidden.narrow(0, present.len() - 1, 1)?), vec![last])
            }
            LogitRows::Last => (None, vec![]),
            LogitRows::All => (Some(hidden.clone()), present.to_vec()),
        };
        let logits = match h {
            None => None,
            Some(h) => Some(self.head_logits(&h)?),
        };
        Ok(ChunkOutput { logits, positions })
    }

    /// One decoder layer over a chunk: projections, the chunk's K/V (and
    /// the projected K/V of the chunk's tokens that left below, in position
    /// order) into the cache, attention over the rows each query reads, then
    /// the MLP. The cache takes every row the chunk has here; the rows the
    /// policy does not keep leave it once no later query reads them
    /// ([`Decoder::drop_unread`]).
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        (l, layer): (usize, &Layer),
        hidden: &Tensor,
        (present, (cos, sin)): (&[usize], &(Tensor, Tensor)),
        projected: Option<&Projected>,
        seq: &mut Sequence,
        reads: &mut LayerReads,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let x = layer.input_norm.forward(hidden)?;
        let qkv = match seq.rule.dynamic_mut() {
            Some(d) if d.wants_unrotated_queries(l) => {
                let (qkv, unrotated) = layer.attn.qkv_keeping_queries(&x, &self.rope, cos, sin)?;
                let (heads, n, hd) = unrotated.dims3()?;
                let rows = unrotated
                    .transpose(0, 1)?
                    .contiguous()?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                debug_assert_eq!(rows.len(), n * heads * hd);
                d.observe_unrotated_queries(l, heads, present, &rows);
                qkv
            }
            _ => layer.attn.qkv(&x, &self.rope, cos, sin)?,
        };
        if let Some(d) = seq.rule.dynamic_mut()
            && let Some(w) = d.query_window(l)
        {
            d.observe_queries(l, last_query_rows(&qkv.q, w)?);
        }
        let own = ChunkKv {
            k: qkv.k,
            v: qkv.v,
            positions: Cow::Borrowed(present),
        };
        let chunk = match projected {
            Some(p) => {
                let (k, v) = self.projected_kv(layer, p)?;
                own.merged(&k, &v, &p.positions)?
            }
            None => own,
        };
        if let Some(w) = layer.window
            && seq.is_decided()
        {
            // keys older than the window of the chunk's first query are read
            // by none of its queries nor any later one (a policy still to
            // decide from a layer's keys sees them all first)
            seq.caches[l].drop_below(first_readable(w, present[0]));
        }
        self.store_kv(&mut seq.caches[l], (&chunk.k, &chunk.v), &chunk.positions)?;
        let wants_rows = probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .is_some_and(|from| present.last().is_some_and(|&q| q >= from));
        if ChunkKernel::applies(&self.device, &qkv.q, wants_rows)
            && let Some(attn) = self.attend_chunk_cached(
                l,
                layer.window,
                &qkv.q,
                &seq.caches[l],
                present,
                seq,
                &mut reads.reads,
            )?
        {
            return layer_residuals(layer, hidden, &attn);
        }
        let cache = &seq.caches[l];
        let attn = self.attend_layer(l, layer.window, &qkv.q, cache, present, seq, reads, probe)?;
        layer_residuals(layer, hidden, &attn)
    }
}
