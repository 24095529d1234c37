//! The tensor executor of the layer program: the rows of a chunk as candle
//! tensors through each layer (`layer.rs` is the program), for inference
//! (the sequence's cache under its policy; the tokens that do not exist at a
//! layer dropped before it, the K/V of those the policy keeps projected
//! computed from the hidden state they left with) and for training (every
//! row of a sequence at once, under a mask; see `train.rs`), then the logits
//! of the rows asked for.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use candle_core::{DType, Tensor};
use lcut_policy::RecurrentLayers;
use lcut_policy::window::{first_readable, in_window};

use super::attention::LayerReads;
use super::chunk_attention::ChunkKernel;
use super::layer::{LayerAt, LayerExecutor, Norm, Product, Rotation, run_layer, unwritten};
use super::projected::{ChunkKv, Projected};
use super::reads::BatchSoftmax;
use super::train::TrainKv;
use super::{ChunkOutput, Decoder, LogitRows};
use crate::error::Result;
use crate::layers::{Experts, FeedForward, Qkv, Routing, swap_rows_heads};
use crate::probe::{Probe, ResidualSite, RoutingView};
use crate::sequence::Sequence;

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

/// The tensor executor: the residual stream of a chunk's rows and what the
/// layer's steps leave for the next, as tensors on the decoder's device.
pub(super) struct TensorRows<'a, 'p, 'q> {
    dec: &'a Decoder,
    /// The residual stream [n, hidden] of the rows at `present`.
    hidden: Tensor,
    /// The rows' positions (increasing, or each batched sequence's in turn).
    present: Vec<usize>,
    /// The rows' RoPE tables (one cos/sin pair per RoPE of the model).
    tables: Vec<(Tensor, Tensor)>,
    /// A norm's output or the gated activation: the next product's input.
    input: Option<Tensor>,
    /// Queries, keys and values [heads, n, head_dim].
    qkv: Option<Qkv>,
    /// The attention's output [heads, n, head_dim].
    attn: Option<Tensor>,
    /// The output gate the queries came with, until the attention's output
    /// takes it (Qwen3.5's full layers).
    attn_gate: Option<Tensor>,
    /// The MLP's gate and up halves.
    gate_up: Option<(Tensor, Tensor)>,
    /// A half's output before it joins the residual stream.
    branch: Option<Tensor>,
    /// What the queries read.
    keys: Keys<'a, 'p, 'q>,
    /// Each row's per-layer inputs [n, layers * width] (Gemma 4).
    layer_inputs: Option<Tensor>,
    /// Training: each layer's keys and values [kv_heads, n, head_dim] so
    /// far (and those given for layers below the range), for the layers
    /// that read another layer's (Gemma 4's shared layers; the tensors the
    /// autograd graph holds anyway).
    trained_kv: TrainKv,
}

/// A chunk's rows as they enter or leave a range of layers: the residual
/// stream [n, hidden], the rows' positions, and their per-layer inputs [n,
/// layers * width] where the model has them (Gemma 4).
#[derive(Debug, Clone)]
pub(crate) struct ChunkRows {
    /// The residual stream.
    pub(crate) hidden: Tensor,
    /// The rows' positions.
    pub(crate) present: Vec<usize>,
    /// The rows' per-layer inputs.
    pub(crate) layer_inputs: Option<Tensor>,
}

/// What the tensor executor's queries read.
pub(super) enum Keys<'a, 'p, 'q> {
    /// Inference: the sequence's cache under its policy.
    Cache(CacheRun<'a, 'p, 'q>),
    /// Training: every row at once, row q reading row k where `visible[q *
    /// n + k]` and k lies within the layer's window of q; one additive mask
    /// per window, made at its first layer.
    Mask {
        visible: &'a [bool],
        masks: BTreeMap<Option<usize>, Tensor>,
    },
    /// Training a batch: sequences of `t` rows one after another, each
    /// query reading its own sequence's keys with the probabilities
    /// `softmax` gives.
    Batch {
        t: usize,
        softmax: &'a dyn BatchSoftmax,
    },
}

impl<'a> Keys<'a, '_, '_> {
    /// Training every row of a sequence at once under `visible` ([`Keys::Mask`]).
    pub(super) fn mask(visible: &'a [bool]) -> Self {
        Self::Mask {
            visible,
            masks: BTreeMap::new(),
        }
    }
}

/// An inference pass's sequence, its probe and what the pass keeps between
/// layers.
pub(super) struct CacheRun<'a, 'p, 'q> {
    seq: &'a mut Sequence,
    probe: &'a mut Option<&'p mut (dyn Probe + 'q)>,
    /// The key planner's reads and masks, kept while layers read the same rows.
    reads: LayerReads,
    /// The tokens that left below and keep projected K/V.
    projected: Option<Projected>,
    /// The first position of a step taken after the prefill's decisions
    /// (the policy is told after each layer); `None` during a staged prefill.
    step_from: Option<usize>,
}

impl<'a, 'p, 'q> TensorRows<'a, 'p, 'q> {
    /// The rows of `rows` (positions increasing), reading `keys`.
    fn new(dec: &'a Decoder, rows: ChunkRows, keys: Keys<'a, 'p, 'q>) -> Result<Self> {
        let ChunkRows {
            hidden,
            present,
            layer_inputs,
        } = rows;
        Ok(Self {
            tables: dec.rope_tables(&present)?,
            dec,
            hidden,
            present,
            layer_inputs,
            input: None,
            qkv: None,
            attn: None,
            attn_gate: None,
            gate_up: None,
            branch: None,
            keys,
            trained_kv: BTreeMap::new(),
        })
    }

    /// Keep only the rows whose tokens exist at layer `l` of `run`'s
    /// sequence, first keeping the hidden states of those that leave with
    /// projected K/V.
    fn keep_existing(&mut self, l: usize) -> Result<()> {
        let Keys::Cache(run) = &mut self.keys else {
            return Ok(());
        };
        let present = &self.present;
        let keep: Vec<u32> = (0..present.len() as u32)
            .filter(|&i| run.seq.token_exists(l, present[i as usize]))
            .collect();
        if keep.len() == present.len() {
            return Ok(());
        }
        let dec = self.dec;
        dec.project_leaving(run.seq, l, &self.hidden, present, &mut run.projected)?;
        if keep.is_empty() {
            self.present.clear();
        } else {
            let idx = Tensor::new(keep.as_slice(), &dec.device)?;
            self.hidden = self.hidden.index_select(&idx, 0)?;
            if let Some(inputs) = &self.layer_inputs {
                self.layer_inputs = Some(inputs.index_select(&idx, 0)?);
            }
            self.present = keep.iter().map(|&i| present[i as usize]).collect();
            self.tables = dec.rope_tables(&self.present)?;
        }
        Ok(())
    }

    /// Layer `l` where no row of the chunk exists: the projected tokens'
    /// K/V into its cache, or `false` when there are none (no later layer
    /// has anything to do).
    fn store_projected_only(&mut self, l: usize) -> Result<bool> {
        let Keys::Cache(run) = &mut self.keys else {
            return Ok(false);
        };
        let Some(p) = &run.projected else {
            return Ok(false);
        };
        if self.dec.layers[l].kv_source.is_some() {
            return Err(unwritten("projected K/V into a layer that reads another's"));
        }
        let (k, v) = self.dec.projected_kv(&self.dec.layers[l], p)?;
        self.dec
            .store_kv(&mut run.seq.caches[l], (&k, &v), &p.positions)?;
        Ok(true)
    }
}

impl CacheRun<'_, '_, '_> {
    /// The attention of the rotated queries of the rows at `present` over
    /// the cache, the chunk's K/V (and the projected K/V) stored first.
    fn attend(
        &mut self,
        dec: &Decoder,
        at: LayerAt<'_>,
        present: &[usize],
        qkv: Qkv,
    ) -> Result<Tensor> {
        let (l, layer) = (at.index, at.layer);
        let seq = &mut *self.seq;
        // a layer that reads another layer's K/V stores none: it reads that
        // layer's cache under its own rule (the key planner asks the rule at
        // `l`)
        let held = match (qkv.kv, layer.kv_source) {
            (Some((k, v)), None) => {
                let own = ChunkKv {
                    k,
                    v,
                    positions: Cow::Borrowed(present),
                };
                let chunk = match &self.projected {
                    Some(p) => {
                        let (k, v) = dec.projected_kv(layer, p)?;
                        own.merged(&k, &v, &p.positions)?
                    }
                    None => own,
                };
                let at = (chunk.positions.as_ref(), present[0]);
                dec.store_layer_kv(seq, l, (&chunk.k, &chunk.v), at)?;
                l
            }
            (None, Some(source)) if self.projected.is_none() => source,
            _ => return Err(unwritten("the K/V of a layer that reads another's")),
        };
        let wants_rows = self
            .probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .is_some_and(|from| present.last().is_some_and(|&q| q >= from));
        if ChunkKernel::applies(&dec.device, &qkv.q, wants_rows)
            && let Some(attn) = dec.attend_chunk_cached(
                l,
                layer.window,
                &qkv.q,
                &seq.caches[held],
                present,
                seq,
                &mut self.reads.reads,
            )?
        {
            return Ok(attn);
        }
        let cache = &seq.caches[held];
        dec.attend_layer(
            l,
            layer.window,
            &qkv.q,
            cache,
            present,
            seq,
            &mut self.reads,
            self.probe,
        )
    }
}

impl Decoder {
    /// A chunk's keys and values at `positions` (ascending) into layer
    /// `l`'s cache of `seq`, the chunk's first query at `first_query`. On a
    /// sliding layer of a policy that has decided, keys older than that
    /// query's window are dropped first: none of the chunk's queries nor
    /// any later one reads them (a policy still to decide from a layer's
    /// keys sees them all first).
    pub(super) fn store_layer_kv(
        &self,
        seq: &mut Sequence,
        l: usize,
        (k, v): (&Tensor, &Tensor),
        (positions, first_query): (&[usize], usize),
    ) -> Result<()> {
        if let Some(w) = self.layers[l].window
            && seq.is_decided()
        {
            seq.caches[l].drop_below(first_readable(w, first_query));
        }
        self.store_kv(&mut seq.caches[l], (k, v), positions)
    }
}

impl TensorRows<'_, '_, '_> {
    /// Training: the keys and values layer `at` reads, its own `kv` (kept
    /// for the layers that read it) or those its source layer computed from
    /// the same rows, refused by name where that layer did not run here.
    fn trained_kv(
        &mut self,
        at: LayerAt<'_>,
        kv: Option<(Tensor, Tensor)>,
    ) -> Result<(Tensor, Tensor)> {
        match (kv, at.layer.kv_source) {
            (Some(kv), _) => {
                self.trained_kv.insert(at.index, kv.clone());
                Ok(kv)
            }
            (None, Some(source)) => self.trained_kv.get(&source).cloned().ok_or_else(|| {
                crate::error::ModelError::TrainInput {
                    detail: format!(
                        "layer {} reads layer {source}'s K/V, which this range of layers did not run \
                         and which was not given",
                        at.index
                    ),
                }
            }),
            (None, None) => Err(unwritten("the keys")),
        }
    }

    /// A probe that asks is shown the rows' routing at layer `at`.
    fn show_routing(&mut self, at: LayerAt<'_>, routing: &Routing) -> Result<()> {
        if let Keys::Cache(run) = &mut self.keys
            && let Some(p) = run.probe.as_deref_mut()
            && p.wants_routing(at.index)
        {
            p.on_routing(RoutingView {
                layer: at.index,
                positions: &self.present,
                routing,
            })?;
        }
        Ok(())
    }
}

/// The experts' weighted output for rows `x` routed by `routing` (the
/// router having read `router_input`): in training the router learns
/// through the weights (tensor ops); otherwise the rows grouped by expert
/// where they can be.
fn routed(
    experts: &Experts,
    router_input: &Tensor,
    x: &Tensor,
    routing: &Routing,
) -> Result<Tensor> {
    match x.track_op() {
        true => {
            let trainable = experts.trainable_weights(router_input, routing)?;
            experts.forward_routed(x, routing, Some(&trainable))
        }
        false => super::grouped::experts_forward(experts, x, routing),
    }
}

impl LayerExecutor for TensorRows<'_, '_, '_> {
    fn norm(&mut self, at: LayerAt<'_>, site: Norm) -> Result<()> {
        let norm = at.layer.norm(site).ok_or(unwritten("the norm"))?;
        match site {
            Norm::Attention | Norm::Mlp => self.input = Some(norm.forward(&self.hidden)?),
            Norm::AttentionOut | Norm::MlpOut | Norm::DenseOut => {
                let branch = self.branch.take().ok_or(unwritten("the branch"))?;
                self.branch = Some(norm.forward(&branch)?);
            }
        }
        Ok(())
    }

    fn take_residual(&mut self) -> Result<()> {
        self.input = Some(self.hidden.clone());
        Ok(())
    }

    fn product(&mut self, at: LayerAt<'_>, product: Product) -> Result<()> {
        let layer = at.layer;
        match product {
            Product::Qkv => {
                let x = self
                    .input
                    .take()
                    .ok_or(unwritten("the attention's input"))?;
                self.qkv = Some(layer.attn.project(&x)?);
            }
            Product::AttentionOut => {
                let attn = self
                    .attn
                    .take()
                    .ok_or(unwritten("the attention's output"))?;
                self.branch = Some(layer.attn.output(&attn)?);
            }
            Product::GateUp => {
                let x = self.input.take().ok_or(unwritten("the MLP's input"))?;
                self.gate_up = Some(layer.dense_mlp()?.gate_up_of(&x)?);
            }
            Product::Down => {
                let x = self.input.take().ok_or(unwritten("the gated activation"))?;
                self.branch = Some(layer.dense_mlp()?.down().forward(&x)?);
            }
        }
        Ok(())
    }

    fn norm_heads(&mut self, at: LayerAt<'_>) -> Result<()> {
        let qkv = self.qkv.as_mut().ok_or(unwritten("the queries"))?;
        let k = qkv.kv.as_ref().map(|(k, _)| k);
        let (q, k) = at.layer.attn.norm_heads(&qkv.q, k)?;
        qkv.q = q;
        if let (Some((kk, _)), Some(k)) = (qkv.kv.as_mut(), k) {
            *kk = k;
        }
        Ok(())
    }

    fn rotate(&mut self, at: LayerAt<'_>) -> Result<()> {
        let qkv = self.qkv.as_mut().ok_or(unwritten("the queries"))?;
        let rope_index = at.layer.rope.ok_or(unwritten("the layer's RoPE"))?;
        let (cos, sin) = &self.tables[rope_index];
        let rope = self.dec.rope_at(rope_index);
        qkv.q = rope.apply(&qkv.q, cos, sin)?;
        if let Some((k, _)) = qkv.kv.as_mut() {
            *k = rope.apply(k, cos, sin)?;
        }
        Ok(())
    }

    fn show_queries(&mut self, at: LayerAt<'_>, when: Rotation) -> Result<()> {
        let Keys::Cache(run) = &mut self.keys else {
            return Ok(());
        };
        let q = &self.qkv.as_ref().ok_or(unwritten("the queries"))?.q;
        let l = at.index;
        if when == Rotation::After
            && let Some(p) = run.probe.as_deref_mut()
            && let Some(w) = p.query_window(l)
            && w > 0
        {
            p.on_queries(l, last_query_rows(q, w)?)?;
        }
        let Some(d) = run.seq.rule.dynamic_mut() else {
            return Ok(());
        };
        match when {
            Rotation::Before if d.wants_unrotated_queries(l) => {
                // rows first [n, heads, head_dim]: each row's heads side by side
                let heads = q.dim(0)?;
                let rows = swap_rows_heads(q)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                d.observe_unrotated_queries(l, heads, &self.present, &rows);
            }
            Rotation::After => {
                if let Some(w) = d.query_window(l)
                    && w > 0
                {
                    d.observe_queries(l, last_query_rows(q, w)?);
                }
            }
            Rotation::Before => {}
        }
        Ok(())
    }

    fn attend(&mut self, at: LayerAt<'_>) -> Result<()> {
        let mut qkv = self.qkv.take().ok_or(unwritten("the queries"))?;
        self.attn_gate = qkv.gate.take();
        if !matches!(self.keys, Keys::Cache(_)) {
            // training: a layer that reads another's K/V reads what that
            // layer computed from these rows
            qkv.kv = Some(self.trained_kv(at, qkv.kv.take())?);
        }
        let attn = match &mut self.keys {
            Keys::Cache(run) => run.attend(self.dec, at, &self.present, qkv)?,
            Keys::Mask { visible, masks } => {
                let mask = match masks.entry(at.layer.window) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => e.insert(self.dec.train_mask(
                        &self.present,
                        visible,
                        at.layer.window,
                    )?),
                };
                let sinks = at.layer.attn.sinks();
                let (k, v) = qkv.kv.as_ref().ok_or(unwritten("the keys"))?;
                self.dec.attend(&qkv.q, k, v, Some(mask), sinks, None)?.0
            }
            Keys::Batch { t, softmax } => {
                let (k, v) = qkv.kv.as_ref().ok_or(unwritten("the keys"))?;
                self.dec
                    .attend_batch(at.index, (&qkv.q, k, v), *t, *softmax)?
            }
        };
        self.attn = Some(attn);
        Ok(())
    }

    fn gate_output(&mut self, at: LayerAt<'_>) -> Result<()> {
        let attn = self
            .attn
            .take()
            .ok_or(unwritten("the attention's output"))?;
        let gate = self.attn_gate.take().ok_or(unwritten("the output gate"))?;
        self.attn = Some(at.layer.attn.gated_output(&attn, &gate)?);
        Ok(())
    }

    fn linear_attention(&mut self, at: LayerAt<'_>) -> Result<()> {
        let net = at
            .layer
            .linear
            .as_ref()
            .ok_or(unwritten("the layer's linear attention"))?;
        let x = self
            .input
            .take()
            .ok_or(unwritten("the attention's input"))?;
        let l = at.index;
        let run = match &mut self.keys {
            Keys::Cache(run) => run,
            // training: every row at once, a row entering the state where
            // a later row of its sequence reads it
            Keys::Mask { visible, .. } => {
                let enters = lcut_policy::rows_read_later(visible, self.present.len());
                self.attn = Some(net.forward_rows(&x, self.present.len(), &enters)?);
                return Ok(());
            }
            Keys::Batch { t, softmax } => {
                let enters = lcut_policy::rows_read_later(softmax.visibility(l), *t);
                self.attn = Some(net.forward_rows(&x, *t, &enters)?);
                return Ok(());
            }
        };
        let rule = run.seq.rule.as_ref();
        let enters: Vec<bool> = (self.present.iter())
            .map(|&p| RecurrentLayers::enters_state(rule, l, p))
            .collect();
        let split_from = run.probe.as_deref().and_then(|p| p.linear_split_from(l));
        // a full-depth run keeps the first token's state, so that it can be
        // restricted to a policy whose anchors are BoS; a band's, so that its
        // decode phase can start from it
        let keeps_first = run.seq.keeps_first_states();
        // where the decode phase reads the anchors' state alone (a knockout
        // band's layer), the rows before the decode start, then those from it
        // on; otherwise all in one run, whose products are those of one call
        let start = rule.phases().decode_start();
        let at = match RecurrentLayers::decode_reads_anchors(rule, l) {
            Some(_) => self.present.partition_point(|&p| p < start),
            None => 0,
        };
        let mut outs = Vec::with_capacity(2);
        for rows in [0..at, at..self.present.len()] {
            if rows.is_empty() {
                continue;
            }
            run.seq.enter_decode_phase(l, self.present[rows.start])?;
            let state = run.seq.recurrent[l].get_or_insert_with(|| net.new_state(keeps_first));
            let x = x.narrow(0, rows.start, rows.len())?;
            let (out, split) = net.forward(
                &x,
                (&self.present[rows.clone()], &enters[rows]),
                split_from,
                state,
            )?;
            if let (Some(split), Some(p)) = (split, run.probe.as_deref_mut())
                && !split.positions.is_empty()
            {
                p.on_linear_split(l, &split)?;
            }
            outs.push(out);
        }
        // value heads first: the rows are the second dimension
        self.attn = Some(Tensor::cat(&outs, 1)?);
        Ok(())
    }

    fn gate(&mut self, at: LayerAt<'_>) -> Result<()> {
        let (gate, up) = self.gate_up.take().ok_or(unwritten("the gate"))?;
        self.input = Some(at.layer.dense_mlp()?.gated(&gate, &up)?);
        Ok(())
    }

    fn experts(&mut self, at: LayerAt<'_>) -> Result<()> {
        let FeedForward::Experts(experts) = &at.layer.mlp else {
            return Err(unwritten("the experts of a dense layer"));
        };
        let x = self.input.take().ok_or(unwritten("the MLP's input"))?;
        let routing = experts.route(&x)?;
        self.show_routing(at, &routing)?;
        self.branch = Some(routed(experts, &x, &x, &routing)?);
        Ok(())
    }

    fn experts_beside(&mut self, at: LayerAt<'_>) -> Result<()> {
        let FeedForward::DenseAndExperts(_, experts) = &at.layer.mlp else {
            return Err(unwritten("the experts beside a dense MLP"));
        };
        let norms = experts
            .beside()
            .ok_or(unwritten("the norms of experts beside a dense MLP"))?;
        let routing = experts.route(&self.hidden)?;
        self.show_routing(at, &routing)?;
        let x = norms.input.forward(&self.hidden)?;
        let out = norms
            .output
            .forward(&routed(experts, &self.hidden, &x, &routing)?)?;
        let dense = self
            .branch
            .take()
            .ok_or(unwritten("the dense MLP's branch"))?;
        self.branch = Some((dense + out)?);
        Ok(())
    }

    fn join_branch(&mut self) -> Result<()> {
        let branch = self.branch.take().ok_or(unwritten("the branch"))?;
        self.hidden = (&self.hidden + branch)?;
        Ok(())
    }

    fn layer_input(&mut self, at: LayerAt<'_>) -> Result<()> {
        let branch = at
            .layer
            .layer_input
            .as_ref()
            .ok_or(unwritten("the layer's input branch"))?;
        let inputs = self
            .layer_inputs
            .as_ref()
            .ok_or(unwritten("the rows' per-layer inputs"))?;
        let width = self
            .dec
            .layer_inputs
            .as_ref()
            .ok_or(unwritten("the model's per-layer inputs"))?
            .width();
        let input = inputs.narrow(1, at.index * width, width)?;
        let gate = branch.gate.forward(&self.hidden)?;
        let gated = crate::layers::gated(branch.activation, &gate, &input)?;
        let out = branch.projection.forward(&gated)?;
        self.branch = Some(branch.norm.forward(&out)?);
        Ok(())
    }

    fn scale(&mut self, at: LayerAt<'_>) -> Result<()> {
        let s = at
            .layer
            .scalar
            .as_ref()
            .ok_or(unwritten("the layer's scalar"))?;
        self.hidden = match self.hidden.track_op() || s.weight.track_op() {
            true => self.hidden.broadcast_mul(&s.weight)?,
            false => (&self.hidden * s.value)?,
        };
        Ok(())
    }

    fn finish_layer(&mut self, at: LayerAt<'_>) -> Result<()> {
        let Keys::Cache(run) = &mut self.keys else {
            return Ok(());
        };
        let l = at.index;
        if let Some(p) = run.probe.as_deref_mut()
            && p.wants_residual(ResidualSite::Layer(l))
        {
            p.on_residual(ResidualSite::Layer(l), &self.present, &self.hidden)?;
        }
        if let Some(position) = run.step_from
            && let Some(d) = run.seq.rule.dynamic_mut()
        {
            d.after_decode_layer(l, position);
        }
        Ok(())
    }
}

impl Decoder {
    /// The (scaled) embeddings of a chunk starting at `start`, its
    /// positions and its per-layer inputs (Gemma 4).
    pub(super) fn embed_rows(
        &self,
        tokens: &[u32],
        start: usize,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<ChunkRows> {
        let (hidden, present) = self.embed(tokens, start, probe)?;
        Ok(ChunkRows {
            layer_inputs: self.layer_inputs(tokens, &hidden)?,
            hidden,
            present,
        })
    }

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
        rows: ChunkRows,
        step_from: Option<usize>,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<ChunkRows> {
        let run = CacheRun {
            seq,
            probe,
            reads: LayerReads::default(),
            projected: None,
            step_from,
        };
        let mut rows = TensorRows::new(self, rows, Keys::Cache(run))?;
        for l in layers {
            rows.keep_existing(l)?;
            if rows.present.is_empty() {
                match rows.store_projected_only(l)? {
                    true => continue,
                    false => break,
                }
            }
            run_layer(l, &self.layers[l], &mut rows)?;
        }
        Ok(ChunkRows {
            hidden: rows.hidden,
            present: rows.present,
            layer_inputs: rows.layer_inputs,
        })
    }

    /// The residual stream of `rows` (with their positions and per-layer
    /// inputs) through `layers` with no cache, each query reading what
    /// `keys` (a training mask or batch) shows it: the training passes,
    /// their input checked by [`Decoder::train_rows`] and
    /// [`Decoder::train_batch`].
    pub(super) fn run_layers_uncached(
        &self,
        layers: std::ops::Range<usize>,
        rows: ChunkRows,
        keys: Keys<'_, '_, '_>,
        kv: &mut TrainKv,
    ) -> Result<Tensor> {
        let mut rows = TensorRows::new(self, rows, keys)?;
        rows.trained_kv = std::mem::take(kv);
        for l in layers {
            run_layer(l, &self.layers[l], &mut rows)?;
        }
        *kv = rows.trained_kv;
        Ok(rows.hidden)
    }

    /// The additive mask [n, n] of the training pass at a layer with
    /// `window` (0 where q reads k, -inf elsewhere).
    fn train_mask(
        &self,
        positions: &[usize],
        visible: &[bool],
        window: Option<usize>,
    ) -> Result<Tensor> {
        let n = positions.len();
        let values: Vec<f32> = (0..n * n)
            .map(|i| {
                let (q, k) = (i / n, i % n);
                // `visible` holds only keys at or before their query
                match visible[i] && in_window(window, positions[q], positions[k]) {
                    true => 0.0,
                    false => f32::NEG_INFINITY,
                }
            })
            .collect();
        Ok(Tensor::from_vec(values, (n, n), &self.device)?)
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
}
