//! The fused decode step: one new token through every layer with lcut's
//! kernels, on host buffers kept by the sequence: RMSNorm, the Q/K/V
//! products in one parallel region, q/k norms and RoPE, the token's K/V into
//! the cache (where the policy keeps it), attention over only the cache rows
//! the policy shows this token at that layer, the output product, and the
//! MLP (gate and up in one region). Probes see what they see on the tensor
//! path: the exact attention row of every head over the keys read, and the
//! residual stream.
//!
//! [`Decoder::forward`] takes this step for a single token on a decoder
//! with a step model (see [`Unfused`] for when there is none), once the
//! policy has taken its prefill decisions and when the token exists at
//! every layer; everything else runs the tensor path.

use std::ops::Range;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::attention::{
    AttentionScratch, AttentionSpec, CurrentKv, KvCache, KvData, KvLayout, SharedKv, attend,
};
use lcut_kernels::ops;
use lcut_kernels::ops::GateActivation;
use lcut_kernels::product::{Activations, matvec_concat};
use lcut_policy::RecurrentLayers;
use lcut_policy::keys::{KeyPlanner, KeyQuery};
use lcut_policy::window::first_readable;

use super::attention::union_probs;
use super::layer::{LayerAt, LayerExecutor, Norm, Product, Rotation, run_layer, unwritten};
use super::step_model::{Held, StepLinear, StepModel};
use super::{ChunkOutput, Decoder, LogitRows};
use crate::cache::LayerCache;
use crate::error::{ModelError, Result};
use crate::layers::Routing;
use crate::linear_attention::LinearRow;
use crate::probe::{AttentionView, Probe, ResidualSite, RoutingView};
use crate::sequence::Sequence;

pub use super::step_model::Unfused;

/// The fused step's buffers for one sequence, made at its first step and
/// reused by every later one: the rows of a pass (this sequence's alone,
/// or, when it leads a batch, every sequence's) and its own.
#[derive(Debug, Default)]
pub struct StepScratch {
    rows: RowBuffers,
    lane: LaneScratch,
}

/// The activations of a pass, one row per sequence in it.
#[derive(Debug, Default)]
struct RowBuffers {
    hidden: Vec<f32>,
    acts: Activations,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    out: Vec<f32>,
    gate_up: Vec<f32>,
    /// Each row's output gate [heads * head_dim] (Qwen3.5's full layers).
    gate: Vec<f32>,
    /// Each row's input to every layer [layers * width] (Gemma 4's
    /// per-layer inputs), made once per pass.
    layer_inputs: Vec<f32>,
    /// The dense MLP's branch while experts run beside it (Gemma 4).
    dense_out: Vec<f32>,
    tmp: Vec<f32>,
    product: Vec<f32>,
    /// The experts' buffers: router logits, one expert's input rows, its
    /// gate and up halves, its output rows.
    router: Vec<f32>,
    expert_acts: Activations,
    expert_gate_up: Vec<f32>,
    expert_out: Vec<f32>,
}

/// What one sequence of a pass needs of its own: its position's RoPE
/// tables (cos and sin of each RoPE of the model), its attention's scratch
/// and probabilities, the cache rows it reads.
#[derive(Debug, Default)]
struct LaneScratch {
    rope: Vec<(Vec<f32>, Vec<f32>)>,
    probs: Vec<f32>,
    attention: AttentionScratch,
    reads: KeyPlanner,
    key_positions: Vec<usize>,
}

/// One sequence of a pass: its state, its new token's position and its
/// own scratch.
struct Lane<'s> {
    seq: &'s mut Sequence,
    pos: usize,
    scratch: &'s mut LaneScratch,
}

impl Decoder {
    /// Whether decode steps take the fused path (`true` by default where
    /// the decoder has a step model); `false` keeps every step on the
    /// tensor path (for comparisons).
    pub fn set_fused_decode(&mut self, on: bool) {
        self.fused_off = !on;
    }

    /// Why decode steps take the tensor path, or `None` when single-token
    /// steps are fused.
    pub fn unfused_reason(&self) -> Result<Option<Unfused>> {
        if self.fused_off {
            return Ok(Some(Unfused::TurnedOff));
        }
        Ok(self.step_model()?.err())
    }

    /// The step model, built at the first call.
    pub(super) fn step_model(&self) -> Result<std::result::Result<&StepModel, Unfused>> {
        if let Some(m) = self.step.get() {
            return Ok(m.as_ref().map_err(|u| *u));
        }
        let built = StepModel::build(self)?;
        let m = self.step.get_or_init(|| built);
        Ok(m.as_ref().map_err(|u| *u))
    }

    /// Whether `seq`'s next token can take the fused step: a step model,
    /// the policy's prefill decisions taken, and the token present at
    /// every layer.
    pub(super) fn takes_fused_step(&self, seq: &Sequence) -> Result<bool> {
        if self.fused_off || !seq.is_decided() || !seq.pending.is_empty() {
            return Ok(false);
        }
        if self.step_model()?.is_err() {
            return Ok(false);
        }
        let pos = seq.next_pos;
        Ok((0..self.layers.len()).all(|l| seq.token_exists(l, pos)))
    }

    /// Decode `token` at the sequence's next position through the fused
    /// step, or `None` (nothing done) where the tensor path must run it.
    pub(crate) fn fused_step(
        &self,
        seq: &mut Sequence,
        token: u32,
        rows: LogitRows,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Option<ChunkOutput>> {
        if !self.takes_fused_step(seq)? {
            return Ok(None);
        }
        let Ok(model) = self.step_model()? else {
            return Ok(None);
        };
        let pos = seq.next_pos;
        let mut scratch = seq.step.take().unwrap_or_default();
        let StepScratch {
            rows: buffers,
            lane,
        } = &mut *scratch;
        let mut lanes = [Lane {
            seq,
            pos,
            scratch: lane,
        }];
        let logits = if probe.is_none() {
            // the whole step on one of rayon's threads, so that each product's
            // parallel region splits work between running threads rather than
            // waking this one after every region (a probe stays on the caller's
            // thread: it need not be Send)
            rayon::scope(|_| self.run_pass(model, &mut lanes, &[token], rows, &mut None, buffers))
        } else {
            self.run_pass(model, &mut lanes, &[token], rows, probe, buffers)
        };
        seq.step = Some(scratch);
        let logits = logits?;
        let positions = if logits.is_some() { vec![pos] } else { vec![] };
        Ok(Some(ChunkOutput { logits, positions }))
    }

    /// One new token for each sequence of `seqs` (each able to take the
    /// fused step, no probe) in one pass over the weights: logits [n,
    /// vocab], row i for sequence i. The first sequence's scratch holds the
    /// pass's rows.
    pub(super) fn fused_batch(
        &self,
        model: &StepModel,
        seqs: &mut [&mut Sequence],
        tokens: &[u32],
    ) -> Result<Tensor> {
        let mut scratches: Vec<Box<StepScratch>> = seqs
            .iter_mut()
            .map(|s| s.step.take().unwrap_or_default())
            .collect();
        let (lead, rest) = scratches.split_at_mut(1);
        let buffers = &mut lead[0].rows;
        let mut lanes: Vec<Lane<'_>> = seqs
            .iter_mut()
            .zip(std::iter::once(&mut lead[0].lane).chain(rest.iter_mut().map(|s| &mut s.lane)))
            .map(|(seq, scratch)| Lane {
                pos: seq.next_pos,
                seq,
                scratch,
            })
            .collect();
        let out = rayon::scope(|_| {
            self.run_pass(
                model,
                &mut lanes,
                tokens,
                LogitRows::Last,
                &mut None,
                buffers,
            )
        });
        drop(lanes);
        for (seq, scratch) in seqs.iter_mut().zip(scratches) {
            seq.step = Some(scratch);
        }
        out?.ok_or(ModelError::MissingLogits)
    }

    /// Every layer for one new token per lane (`tokens[i]` for lane i):
    /// the lanes' rows share each product, each lane reads its own cache.
    /// Logits [lanes, vocab] unless `rows` asks for none.
    fn run_pass(
        &self,
        model: &StepModel,
        lanes: &mut [Lane<'_>],
        tokens: &[u32],
        rows: LogitRows,
        probe: &mut Option<&mut (dyn Probe + '_)>,
        b: &mut RowBuffers,
    ) -> Result<Option<Tensor>> {
        let first = lanes.first().map_or(0, |l| l.pos);
        let (hidden, _) = self.embed(tokens, first, probe)?;
        b.hidden.clear();
        b.hidden.extend(
            hidden
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
        for lane in lanes.iter_mut() {
            let s = &mut *lane.scratch;
            self.rope_tables_into(lane.pos, &mut s.rope);
        }
        let held = model.hold();
        self.step_layer_inputs(model, &held, tokens, b)?;
        let mut host = HostRows {
            dec: self,
            model,
            held: &held,
            lanes,
            probe,
            b,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            run_layer(l, layer, &mut host)?;
        }
        let HostRows { lanes, b, .. } = host;
        for lane in lanes.iter_mut() {
            lane.seq.next_pos = lane.pos + 1;
            // the rows stored for the layers whose cache another layer
            // reads and kept by none of its readers (no work on a model
            // whose layers share nothing)
            if !self.sharing.any() {
                continue;
            }
            let seq = &mut *lane.seq;
            for l in (0..self.layers.len()).filter(|&l| !self.sharing.kept_by_own_rule(l)) {
                if self.sharing.stores(l) {
                    self.retain_kept(seq.rule.as_ref(), l, &mut seq.caches[l])?;
                }
            }
        }
        match rows {
            LogitRows::None => Ok(None),
            LogitRows::Last | LogitRows::All => {
                Ok(Some(self.step_logits(model, &held, lanes.len(), b)?))
            }
        }
    }

    /// One lane's attention at layer `l` from its rotated Q/K/V row `qkv`
    /// (of `kv` K/V heads of `hd` values): its K/V into its cache where the
    /// policy keeps them (for every layer that reads that cache), attention
    /// over the rows its policy shows it into `attn` (one call per group of
    /// K/V heads that hold the same rows under the same rule), and the
    /// probe's view of it. A layer that reads another's K/V (`source`:
    /// `qkv` holds its queries only) stores none and reads that layer's
    /// cache under its own rule, as the tensor path does. `sinks` are the
    /// layer's sink logits, one per query head.
    #[allow(clippy::too_many_arguments)]
    fn attend_lane(
        &self,
        (l, window, source): (usize, Option<usize>, Option<usize>),
        (kv, hd): (usize, usize),
        sinks: Option<&[f32]>,
        lane: &mut Lane<'_>,
        qkv: &mut [f32],
        attn: &mut [f32],
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let h = cfg.num_heads;
        let group_size = h / kv;
        let (seq, pos, s) = (&mut *lane.seq, lane.pos, &mut *lane.scratch);
        let (q, rest) = qkv.split_at(h * hd);
        // whether this layer alone reads its cache (no other layer shares it)
        let own_rule = self.sharing.kept_by_own_rule(l);
        let own = match source {
            Some(_) => None,
            None => Some(rest.split_at(kv * hd)),
        };
        if let Some((k, v)) = own {
            if let Some(w) = window {
                // keys older than this token's window are read by no later query
                seq.caches[l].drop_below(first_readable(w, pos));
            }
            let (rule, share) = (seq.rule.as_ref(), &self.sharing);
            let keeps = |head: usize| share.head_retains(rule, l, head, pos);
            let stored: Vec<bool> = match (own_rule, share.heads_differ(rule, l)) {
                // a later layer of this pass reads the token here: stored,
                // and dropped after the pass where no reader keeps it
                (false, _) => vec![true; kv],
                (true, false) => vec![share.retains(rule, l, pos); kv],
                (true, true) => (0..kv).map(keeps).collect(),
            };
            if stored.iter().any(|&x| x) {
                let kt = Tensor::from_slice(k, (kv, 1, hd), &Device::Cpu)?;
                let vt = Tensor::from_slice(v, (kv, 1, hd), &Device::Cpu)?;
                let cache = &mut seq.caches[l];
                self.store_kv_by_head(cache, (&kt, &vt), &[pos], |head, _| stored[head])?;
            }
        }
        let ask = KeyQuery {
            layer: l,
            window,
            queries: &[pos],
            kv_heads: kv,
            own_rows: own_rule,
        };
        let cache = &seq.caches[source.unwrap_or(l)];
        let groups = s.reads.plan(seq.rule.as_ref(), &ask, cache);
        let wants = probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .is_some_and(|from| from <= pos);
        let mut seen: Vec<(Tensor, Vec<usize>)> = Vec::new();
        for g in groups {
            // a shared layer reads only what its source's cache holds
            let in_cache = cache.group_positions(g.rows).last() == Some(&pos) || own.is_none();
            let spans = g.spans.of(0);
            let keys = spans.iter().map(|r| r.len()).sum::<usize>() + usize::from(!in_cache);
            let qh = g.heads.start * group_size * hd..g.heads.end * group_size * hd;
            let kvh = g.heads.start * hd..g.heads.end * hd;
            let current = match (in_cache, own) {
                (false, Some((k, v))) => Some(CurrentKv {
                    k: &k[kvh.clone()],
                    v: &v[kvh],
                }),
                _ => None,
            };
            let reads_current = current.is_some();
            let heads = g.heads.len() * group_size;
            if wants {
                s.probs.resize(heads * keys, 0.0);
            }
            let spec = AttentionSpec {
                heads,
                scale: cfg.attn_scale as f32,
                softcap: cfg.attn_softcap.map(|c| c as f32),
                sinks: sinks.map(|s| &s[g.heads.start * group_size..g.heads.end * group_size]),
            };
            let probs = wants.then_some(&mut s.probs[..]);
            attend_cache(
                cache,
                g.heads.clone(),
                &spec,
                &q[qh.clone()],
                spans,
                current,
                &mut attn[qh],
                probs,
                &mut s.attention,
            )?;
            if wants {
                s.key_positions.clear();
                let cached = cache.group_positions(g.rows);
                for r in spans {
                    s.key_positions.extend_from_slice(&cached[r.clone()]);
                }
                if reads_current {
                    s.key_positions.push(pos);
                }
                let probs = Tensor::from_slice(&s.probs, (heads, 1, keys), &Device::Cpu)?;
                seen.push((probs, s.key_positions.clone()));
            }
        }
        if let Some(p) = probe.as_deref_mut()
            && !seen.is_empty()
        {
            let (probs, key_positions) = match seen.len() {
                1 => seen.swap_remove(0),
                _ => union_probs(&seen)?,
            };
            p.on_attention(AttentionView {
                layer: l,
                query_positions: &[pos],
                key_positions: &key_positions,
                probs: &probs,
            })?;
        }
        Ok(())
    }

    /// Every row's input to every layer (Gemma 4) into `b.layer_inputs`,
    /// from its scaled embedding in `b.hidden`, as [`Decoder::layer_inputs`]
    /// makes them: (RMSNorm of the projected embedding / sqrt(hidden), per
    /// layer, + the token's table row * sqrt(width)) / sqrt(2); the
    /// projection on lcut's kernels, so that a row's inputs do not depend
    /// on the rows beside it.
    fn step_layer_inputs(
        &self,
        model: &StepModel,
        held: &Held<'_>,
        tokens: &[u32],
        b: &mut RowBuffers,
    ) -> Result<()> {
        b.layer_inputs.clear();
        let (Some(li), Some(host)) = (&self.layer_inputs, &model.layer_inputs) else {
            return Ok(());
        };
        let (n, d) = (tokens.len(), self.cfg.hidden_size);
        b.acts.fill(n, d).copy_from_slice(&b.hidden);
        products(
            std::slice::from_ref(&host.projection),
            held,
            n,
            (&mut b.acts, &mut b.layer_inputs),
            (&mut b.tmp, &mut b.product),
        )?;
        let scale = (d as f32).powf(-0.5);
        b.layer_inputs.iter_mut().for_each(|x| *x *= scale);
        ops::rms_norm_in_place(
            &mut b.layer_inputs,
            &host.norm,
            self.cfg.rms_norm_eps as f32,
        )?;
        li.host_table_rows(tokens, &mut b.tmp)?;
        if b.tmp.len() != b.layer_inputs.len() || host.width == 0 {
            return Err(unwritten("the per-layer inputs' table rows"));
        }
        for (x, t) in b.layer_inputs.iter_mut().zip(&b.tmp) {
            *x = (*x + t) * std::f32::consts::FRAC_1_SQRT_2;
        }
        Ok(())
    }

    /// Logits [n, vocab] in f32 of the final hidden states.
    fn step_logits(
        &self,
        model: &StepModel,
        held: &Held<'_>,
        n: usize,
        b: &mut RowBuffers,
    ) -> Result<Tensor> {
        let d = self.cfg.hidden_size;
        let eps = self.cfg.rms_norm_eps as f32;
        ops::rms_norm(&b.hidden, &model.final_norm, eps, b.acts.fill(n, d))?;
        let mut z = Vec::new();
        products(
            std::slice::from_ref(&model.lm_head),
            held,
            n,
            (&mut b.acts, &mut z),
            (&mut b.tmp, &mut b.product),
        )?;
        if let Some(c) = self.cfg.final_softcap {
            ops::softcap_in_place(&mut z, c as f32);
        }
        let vocab = z.len() / n;
        Ok(Tensor::from_vec(z, (n, vocab), &Device::Cpu)?)
    }
}

/// `products` of the `n` activation rows in `acts` into `out` ([n,
/// outputs side by side]), each one's rows put in Hugging Face order and
/// its bias added; `tmp` and `scratch` are the kernels' scratch.
fn products(
    products: &[StepLinear],
    held: &Held<'_>,
    n: usize,
    (acts, out): (&mut Activations, &mut Vec<f32>),
    (tmp, scratch): (&mut Vec<f32>, &mut Vec<f32>),
) -> Result<()> {
    let total: usize = products.iter().map(|p| p.rows).sum();
    out.resize(n * total, 0.0);
    let mats: Vec<_> = products.iter().map(|p| p.view(held)).collect();
    matvec_concat(Isa::detect(), &mats, acts, out, scratch)?;
    for row in out.chunks_exact_mut(total) {
        let mut at = 0;
        for p in products {
            let seg = &mut row[at..at + p.rows];
            p.unpermute(seg, tmp);
            p.add_bias(seg);
            at += p.rows;
        }
    }
    Ok(())
}

/// The gated activation of rows of gate and up halves side by side
/// (`gate_up`, 2 x `inner` per row) into `acts`, the next product's input.
fn gated_rows(
    gate_up: &mut [f32],
    inner: usize,
    activation: GateActivation,
    acts: &mut Activations,
) -> Result<()> {
    let rows = gate_up.len() / (2 * inner).max(1);
    let out = acts.fill(rows, inner);
    for (row, a) in gate_up
        .chunks_exact_mut(2 * inner)
        .zip(out.chunks_exact_mut(inner))
    {
        let (gate, up) = row.split_at_mut(inner);
        ops::gate_in_place(gate, up, activation)?;
        a.copy_from_slice(gate);
    }
    Ok(())
}

/// Each of the `n` Q/K/V rows in `qkv` whose query part holds, per head,
/// `head_dim` queries then `head_dim` gate values (Qwen3.5's full layers)
/// made a plain Q/K/V row in place, its gates [heads * head_dim] into
/// `gates` (both buffers kept for the next step).
fn split_gates(qkv: &mut Vec<f32>, gates: &mut Vec<f32>, n: usize, (h, hd): (usize, usize)) {
    let width = qkv.len() / n.max(1);
    let plain = width - h * hd;
    gates.clear();
    // rows only shrink, so each value moves to a place already read
    let mut to = 0;
    for row in 0..n {
        let from = row * width;
        for head in 0..h {
            let q = from + 2 * head * hd;
            gates.extend_from_slice(&qkv[q + hd..q + 2 * hd]);
            qkv.copy_within(q..q + hd, to);
            to += hd;
        }
        let kv = from + 2 * h * hd;
        qkv.copy_within(kv..from + width, to);
        to += width - 2 * h * hd;
    }
    debug_assert_eq!(to, n * plain);
    qkv.truncate(to);
}

/// Each of the `n` rows of queries then keys in `qkv` (`q_width` and
/// `k_width` values) widened in place to queries, keys, and the keys again
/// as values (Gemma 4's full layers with `attention_k_eq_v`: the values
/// are the keys' projection before the key norm).
fn keys_as_values(qkv: &mut Vec<f32>, n: usize, q_width: usize, k_width: usize) {
    let (from, to) = (q_width + k_width, q_width + 2 * k_width);
    qkv.resize(n * to, 0.0);
    // rows only grow, so the last row moves first into room not yet read
    for row in (0..n).rev() {
        qkv.copy_within(row * from..(row + 1) * from, row * to);
        let k = row * to + q_width;
        qkv.copy_within(k..k + k_width, k + k_width);
    }
}

/// The host executor of the layer program: one row per lane on host
/// buffers, each product one call to lcut's kernels over every lane's row,
/// each lane's attention over its own cache.
struct HostRows<'a, 'h, 'l, 'p, 'q> {
    dec: &'a Decoder,
    model: &'a StepModel,
    held: &'a Held<'h>,
    lanes: &'a mut [Lane<'l>],
    probe: &'a mut Option<&'p mut (dyn Probe + 'q)>,
    b: &'a mut RowBuffers,
}

impl<'l> HostRows<'_, '_, 'l, '_, '_> {
    /// Every lane's routing at layer `at` from the router's logits of the
    /// rows in `b.acts` (a probe that asks is shown it).
    fn route_rows(&mut self, at: LayerAt<'_>) -> Result<Routing> {
        let ex = self.model.layers[at.index]
            .experts
            .as_ref()
            .ok_or(unwritten("the experts (a dense layer)"))?;
        let n = self.lanes.len();
        let held = self.held;
        let b = &mut *self.b;
        products(
            std::slice::from_ref(&ex.router),
            held,
            n,
            (&mut b.acts, &mut b.router),
            (&mut b.tmp, &mut b.product),
        )?;
        let count = ex.router.rows;
        let mut routing = Routing {
            probs: Vec::with_capacity(n),
            experts: Vec::with_capacity(n),
            weights: Vec::with_capacity(n),
        };
        for row in b.router.chunks_exact(count) {
            let (probs, experts, weights) = ex.rule.choose(row);
            routing.probs.push(probs);
            routing.experts.push(experts);
            routing.weights.push(weights);
        }
        if let Some(p) = self.probe.as_deref_mut()
            && p.wants_routing(at.index)
        {
            let positions: Vec<usize> = self.lanes.iter().map(|l| l.pos).collect();
            p.on_routing(RoutingView {
                layer: at.index,
                positions: &positions,
                routing: &routing,
            })?;
        }
        Ok(routing)
    }

    /// The routed experts (and a shared expert) of layer `at` on the rows
    /// in `b.acts` into `b.out`, each expert run once on the rows that chose
    /// it.
    fn run_routed(&mut self, at: LayerAt<'_>, routing: &Routing) -> Result<()> {
        let ex = self.model.layers[at.index]
            .experts
            .as_ref()
            .ok_or(unwritten("the experts (a dense layer)"))?;
        let activation = self.model.layers[at.index].activation;
        let (n, d) = (self.lanes.len(), self.dec.cfg.hidden_size);
        let held = self.held;
        let b = &mut *self.b;
        b.out.clear();
        b.out.resize(n * d, 0.0);
        for (e, expert) in ex.experts.iter().enumerate() {
            // the rows that chose expert e, and their weights
            let chosen: Vec<(usize, f32)> = routing
                .experts
                .iter()
                .zip(&routing.weights)
                .enumerate()
                .filter_map(|(r, (xs, ws))| xs.iter().position(|&x| x == e).map(|k| (r, ws[k])))
                .collect();
            if chosen.is_empty() {
                continue;
            }
            let rows = chosen.len();
            let input = b.expert_acts.fill(rows, d);
            for (dst, &(r, _)) in input.chunks_exact_mut(d).zip(&chosen) {
                dst.copy_from_slice(&b.acts.values()[r * d..(r + 1) * d]);
            }
            products(
                &expert.gate_up,
                held,
                rows,
                (&mut b.expert_acts, &mut b.expert_gate_up),
                (&mut b.tmp, &mut b.product),
            )?;
            let inner = b.expert_gate_up.len() / (2 * rows);
            gated_rows(&mut b.expert_gate_up, inner, activation, &mut b.expert_acts)?;
            products(
                std::slice::from_ref(&expert.down),
                held,
                rows,
                (&mut b.expert_acts, &mut b.expert_out),
                (&mut b.tmp, &mut b.product),
            )?;
            for (y, &(r, w)) in b.expert_out.chunks_exact(d).zip(&chosen) {
                b.out[r * d..(r + 1) * d]
                    .iter_mut()
                    .zip(y)
                    .for_each(|(o, v)| *o += w * v);
            }
        }
        // the shared expert on every row, scaled by the sigmoid of its gate
        if let Some((expert, gate)) = &ex.shared {
            products(
                std::slice::from_ref(gate),
                held,
                n,
                (&mut b.acts, &mut b.router),
                (&mut b.tmp, &mut b.product),
            )?;
            products(
                &expert.gate_up,
                held,
                n,
                (&mut b.acts, &mut b.expert_gate_up),
                (&mut b.tmp, &mut b.product),
            )?;
            let inner = b.expert_gate_up.len() / (2 * n).max(1);
            gated_rows(&mut b.expert_gate_up, inner, activation, &mut b.expert_acts)?;
            products(
                std::slice::from_ref(&expert.down),
                held,
                n,
                (&mut b.expert_acts, &mut b.expert_out),
                (&mut b.tmp, &mut b.product),
            )?;
            for ((o, y), &g) in b
                .out
                .chunks_exact_mut(d)
                .zip(b.expert_out.chunks_exact(d))
                .zip(&b.router)
            {
                let scale = 1.0 / (1.0 + (-g).exp());
                o.iter_mut().zip(y).for_each(|(o, v)| *o += scale * v);
            }
        }
        Ok(())
    }

    /// The query and key parts of each lane's Q/K/V row at layer `l`, and
    /// its lane (no keys on a layer that reads another's K/V).
    fn query_key_rows<'s>(
        &'s mut self,
        l: usize,
    ) -> impl Iterator<Item = (&'s mut Lane<'l>, &'s mut [f32], &'s mut [f32])> + 's {
        let layer = &self.model.layers[l];
        let h = self.dec.cfg.num_heads;
        let hd = layer.head_dim;
        let kv = match layer.kv_source {
            Some(_) => 0,
            None => layer.kv_heads,
        };
        let width = self.b.qkv.len() / self.lanes.len().max(1);
        self.lanes
            .iter_mut()
            .zip(self.b.qkv.chunks_exact_mut(width.max(1)))
            .map(move |(lane, row)| {
                let (q, rest) = row.split_at_mut(h * hd);
                (lane, q, &mut rest[..kv * hd])
            })
    }
}

impl LayerExecutor for HostRows<'_, '_, '_, '_, '_> {
    fn norm(&mut self, at: LayerAt<'_>, site: Norm) -> Result<()> {
        let w = self.model.layers[at.index]
            .norm(site)
            .ok_or(unwritten("the norm"))?;
        let eps = self.dec.cfg.rms_norm_eps as f32;
        let (n, d) = (self.lanes.len(), self.dec.cfg.hidden_size);
        let b = &mut *self.b;
        match site {
            Norm::Attention | Norm::Mlp => ops::rms_norm(&b.hidden, w, eps, b.acts.fill(n, d))?,
            Norm::AttentionOut | Norm::MlpOut | Norm::DenseOut => {
                ops::rms_norm_in_place(&mut b.out, w, eps)?
            }
        }
        Ok(())
    }

    /// The router's logits for every lane's row (the MLP's input), each
    /// row's experts chosen by the model's rule, then each expert run once
    /// on the rows that chose it (its matrices read once for all of them,
    /// the other experts' not at all), its output weighed into theirs.
    fn experts(&mut self, at: LayerAt<'_>) -> Result<()> {
        let routing = self.route_rows(at)?;
        self.run_routed(at, &routing)
    }

    /// The router reads each row's residual through its unweighted norm,
    /// the experts read it through their input norm; their sum, normed by
    /// their output norm, is added to the dense MLP's branch.
    fn experts_beside(&mut self, at: LayerAt<'_>) -> Result<()> {
        let model = self.model;
        let beside = model.layers[at.index]
            .experts
            .as_ref()
            .and_then(|ex| ex.beside.as_ref())
            .ok_or(unwritten("the norms of experts beside a dense MLP"))?;
        let (n, d) = (self.lanes.len(), self.dec.cfg.hidden_size);
        let eps = self.dec.cfg.rms_norm_eps as f32;
        let b = &mut *self.b;
        // the dense MLP's branch waits in `dense_out`
        std::mem::swap(&mut b.out, &mut b.dense_out);
        ops::rms_norm(&b.hidden, &beside.router, eps, b.acts.fill(n, d))?;
        let routing = self.route_rows(at)?;
        let b = &mut *self.b;
        ops::rms_norm(&b.hidden, &beside.input, eps, b.acts.fill(n, d))?;
        self.run_routed(at, &routing)?;
        let b = &mut *self.b;
        ops::rms_norm_in_place(&mut b.out, &beside.output, eps)?;
        ops::add_in_place(&mut b.out, &b.dense_out)?;
        Ok(())
    }

    fn take_residual(&mut self) -> Result<()> {
        let (n, d) = (self.lanes.len(), self.dec.cfg.hidden_size);
        let b = &mut *self.b;
        b.acts.fill(n, d).copy_from_slice(&b.hidden);
        Ok(())
    }

    fn product(&mut self, at: LayerAt<'_>, product: Product) -> Result<()> {
        let layer = &self.model.layers[at.index];
        let n = self.lanes.len();
        let b = &mut *self.b;
        let out = match product {
            Product::Qkv => &mut b.qkv,
            Product::AttentionOut => {
                let width = b.attn.len() / n.max(1);
                b.acts.fill(n, width).copy_from_slice(&b.attn);
                &mut b.out
            }
            Product::GateUp => &mut b.gate_up,
            Product::Down => &mut b.out,
        };
        let held = self.held;
        products(
            layer.product(product),
            held,
            n,
            (&mut b.acts, out),
            (&mut b.tmp, &mut b.product),
        )?;
        if product == Product::Qkv {
            let (h, hd) = (self.dec.cfg.num_heads, layer.head_dim);
            if layer.output_gate {
                split_gates(&mut b.qkv, &mut b.gate, n, (h, hd));
            }
            let k_width = layer.kv_heads * hd;
            if layer.values_from_keys {
                keys_as_values(&mut b.qkv, n, h * hd, k_width);
            }
            if let (Some(ones), None) = (&layer.value_norm, layer.kv_source) {
                let eps = self.dec.cfg.rms_norm_eps as f32;
                let width = b.qkv.len() / n.max(1);
                for row in b.qkv.chunks_exact_mut(width.max(1)) {
                    ops::rms_norm_in_place(&mut row[h * hd + k_width..], ones, eps)?;
                }
            }
        }
        Ok(())
    }

    fn norm_heads(&mut self, at: LayerAt<'_>) -> Result<()> {
        let layer = &self.model.layers[at.index];
        let eps = self.dec.cfg.rms_norm_eps as f32;
        let (q_norm, k_norm) = (layer.q_norm.as_deref(), layer.k_norm.as_deref());
        for (_, q, k) in self.query_key_rows(at.index) {
            if let Some(w) = q_norm {
                ops::rms_norm_in_place(q, w, eps)?;
            }
            if let Some(w) = k_norm {
                ops::rms_norm_in_place(k, w, eps)?;
            }
        }
        Ok(())
    }

    fn rotate(&mut self, at: LayerAt<'_>) -> Result<()> {
        let hd = self.model.layers[at.index].head_dim;
        let rope = at.layer.rope.ok_or(unwritten("the layer's RoPE"))?;
        for (lane, q, k) in self.query_key_rows(at.index) {
            let (cos, sin) = &lane.scratch.rope[rope];
            ops::rope_in_place(q, hd, cos, sin)?;
            if !k.is_empty() {
                ops::rope_in_place(k, hd, cos, sin)?;
            }
        }
        Ok(())
    }

    fn show_queries(&mut self, at: LayerAt<'_>, when: Rotation) -> Result<()> {
        let (l, heads) = (at.index, self.dec.cfg.num_heads);
        for (lane, q, _) in self.query_key_rows(l) {
            let pos = lane.pos;
            let Some(d) = lane.seq.rule.dynamic_mut() else {
                continue;
            };
            match when {
                Rotation::Before if d.wants_unrotated_queries(l) => {
                    d.observe_unrotated_queries(l, heads, &[pos], q);
                }
                Rotation::After => {
                    if let Some(w) = d.query_window(l)
                        && w > 0
                    {
                        d.observe_queries(l, vec![q.to_vec()]);
                    }
                }
                Rotation::Before => {}
            }
        }
        Ok(())
    }

    fn attend(&mut self, at: LayerAt<'_>) -> Result<()> {
        let layer = &self.model.layers[at.index];
        let sinks = layer.sinks.as_deref();
        let (kv, hd, source) = (layer.kv_heads, layer.head_dim, layer.kv_source);
        let (h, n) = (self.dec.cfg.num_heads, self.lanes.len());
        let b = &mut *self.b;
        let width = b.qkv.len() / n.max(1);
        b.attn.resize(n * h * hd, 0.0);
        for ((lane, row), attn) in self
            .lanes
            .iter_mut()
            .zip(b.qkv.chunks_exact_mut(width.max(1)))
            .zip(b.attn.chunks_exact_mut(h * hd))
        {
            self.dec.attend_lane(
                (at.index, at.layer.window, source),
                (kv, hd),
                sinks,
                lane,
                row,
                attn,
                self.probe,
            )?;
        }
        Ok(())
    }

    fn gate(&mut self, at: LayerAt<'_>) -> Result<()> {
        let layer = &self.model.layers[at.index];
        let inner = self.dec.cfg.mlp_width(at.index);
        let b = &mut *self.b;
        gated_rows(&mut b.gate_up, inner, layer.activation, &mut b.acts)
    }

    fn join_branch(&mut self) -> Result<()> {
        ops::add_in_place(&mut self.b.hidden, &self.b.out)?;
        Ok(())
    }

    fn gate_output(&mut self, _at: LayerAt<'_>) -> Result<()> {
        let b = &mut *self.b;
        if b.gate.len() != b.attn.len() {
            return Err(unwritten("the output gate"));
        }
        for (x, &g) in b.attn.iter_mut().zip(&b.gate) {
            *x *= 1.0 / (1.0 + (-g).exp());
        }
        Ok(())
    }

    /// Every lane's row through the input projections at once, then each
    /// lane's row through the convolution and the recurrence of its own
    /// state (a probe that asks gets the row's split), gated and normed
    /// into the attention's output.
    fn linear_attention(&mut self, at: LayerAt<'_>) -> Result<()> {
        let l = at.index;
        let net = at
            .layer
            .linear
            .as_ref()
            .ok_or(unwritten("the layer's linear attention"))?;
        let (inputs, norm) = self.model.layers[l]
            .linear
            .as_ref()
            .ok_or(unwritten("the step's linear attention"))?;
        let n = self.lanes.len();
        let b = &mut *self.b;
        products(
            inputs,
            self.held,
            n,
            (&mut b.acts, &mut b.qkv),
            (&mut b.tmp, &mut b.product),
        )?;
        let [c, zw, hv, _] = net.input_widths();
        let width = c + zw + 2 * hv;
        b.attn.clear();
        b.attn.resize(n * zw, 0.0);
        let split_from = self.probe.as_deref().and_then(|p| p.linear_split_from(l));
        for ((lane, row), out) in self
            .lanes
            .iter_mut()
            .zip(b.qkv.chunks_exact(width))
            .zip(b.attn.chunks_exact_mut(zw))
        {
            let (input, rest) = row.split_at(c);
            let (z, rest) = rest.split_at(zw);
            let (beta, decay) = rest.split_at(hv);
            let seq = &mut *lane.seq;
            seq.enter_decode_phase(l, lane.pos)?;
            let enters = RecurrentLayers::enters_state(seq.rule.as_ref(), l, lane.pos);
            let keeps_first = seq.keeps_first_states();
            let state = seq.recurrent[l].get_or_insert_with(|| net.new_state(keeps_first));
            let mut split = split_from.map(|_| net.empty_split());
            let row = LinearRow {
                input,
                gates: (decay, beta),
                position: lane.pos,
                enters,
            };
            net.step_row(row, split_from, state, out, split.as_mut());
            net.gate_row(out, z, norm);
            if let (Some(split), Some(p)) = (split, self.probe.as_deref_mut())
                && !split.positions.is_empty()
            {
                p.on_linear_split(l, &split)?;
            }
        }
        Ok(())
    }

    /// Every lane's residual row through the branch's gate, its
    /// activation times the row's input for this layer, through the
    /// projection and the norm into the branch.
    fn layer_input(&mut self, at: LayerAt<'_>) -> Result<()> {
        let branch = self.model.layers[at.index]
            .layer_input
            .as_ref()
            .ok_or(unwritten("the layer's input branch"))?;
        let (n, d) = (self.lanes.len(), self.dec.cfg.hidden_size);
        let eps = self.dec.cfg.rms_norm_eps as f32;
        let held = self.held;
        let b = &mut *self.b;
        let all = b.layer_inputs.len() / n.max(1);
        let width = branch.gate.rows;
        if all < (at.index + 1) * width {
            return Err(unwritten("the rows' per-layer inputs"));
        }
        b.acts.fill(n, d).copy_from_slice(&b.hidden);
        products(
            std::slice::from_ref(&branch.gate),
            held,
            n,
            (&mut b.acts, &mut b.gate_up),
            (&mut b.tmp, &mut b.product),
        )?;
        let gated = b.acts.fill(n, width);
        for ((gate, inputs), out) in b
            .gate_up
            .chunks_exact_mut(width)
            .zip(b.layer_inputs.chunks_exact(all))
            .zip(gated.chunks_exact_mut(width))
        {
            ops::gate_in_place(
                gate,
                &inputs[at.index * width..(at.index + 1) * width],
                branch.activation,
            )?;
            out.copy_from_slice(gate);
        }
        products(
            std::slice::from_ref(&branch.projection),
            held,
            n,
            (&mut b.acts, &mut b.out),
            (&mut b.tmp, &mut b.product),
        )?;
        ops::rms_norm_in_place(&mut b.out, &branch.norm, eps)?;
        Ok(())
    }

    fn scale(&mut self, at: LayerAt<'_>) -> Result<()> {
        let s = at
            .layer
            .scalar
            .as_ref()
            .ok_or(unwritten("the layer's scalar"))?
            .value as f32;
        self.b.hidden.iter_mut().for_each(|x| *x *= s);
        Ok(())
    }

    fn finish_layer(&mut self, at: LayerAt<'_>) -> Result<()> {
        let l = at.index;
        if let Some(p) = self.probe.as_deref_mut()
            && p.wants_residual(ResidualSite::Layer(l))
        {
            let positions: Vec<usize> = self.lanes.iter().map(|l| l.pos).collect();
            let d = self.dec.cfg.hidden_size;
            let h = Tensor::from_slice(&self.b.hidden, (self.lanes.len(), d), &Device::Cpu)?;
            p.on_residual(
                ResidualSite::Layer(l),
                &positions,
                &h.to_dtype(self.dec.dtype)?,
            )?;
        }
        for lane in self.lanes.iter_mut() {
            if let Some(d) = lane.seq.rule.dynamic_mut() {
                d.after_decode_layer(l, lane.pos);
            }
        }
        Ok(())
    }
}

/// Attention of `q` (the query heads of K/V heads `heads`) over the rows
/// `spans` of those heads in `cache` (and `current`), reading the cache's
/// buffers in place.
#[allow(clippy::too_many_arguments)]
fn attend_cache(
    cache: &LayerCache,
    heads: Range<usize>,
    spec: &AttentionSpec,
    q: &[f32],
    spans: &[Range<usize>],
    current: Option<CurrentKv<'_>>,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
    scratch: &mut AttentionScratch,
) -> Result<()> {
    let isa = Isa::detect();
    let kv_heads = heads.len();
    with_group_view(cache, heads, |view| {
        match view {
            Some(view) => attend(isa, spec, q, view, spans, current, out, probs, scratch)?,
            None => {
                // nothing cached: the current token alone
                let empty = KvLayout::head_major(kv_heads, out.len() / spec.heads, 0, 0);
                let none: &[f32] = &[];
                let c = KvCache::new(KvData::F32(none), KvData::F32(none), empty)?;
                attend(isa, spec, q, &c, &[], current, out, probs, scratch)?;
            }
        }
        Ok(())
    })
}

/// `f` over the rows K/V heads `heads` hold in `cache`, as the kernels read
/// them, in place (rows the cache reads from a shared buffer included), or
/// over `None` when they hold nothing.
pub(super) fn with_group_view<R>(
    cache: &LayerCache,
    heads: Range<usize>,
    f: impl FnOnce(Option<&KvCache<'_>>) -> Result<R>,
) -> Result<R> {
    let Some(b) = cache.buffers(heads) else {
        return f(None);
    };
    let own_guards = b
        .own
        .map(|o| (o.k.storage_and_layout(), o.v.storage_and_layout()));
    let shared_guards = b
        .shared
        .map(|s| (s.k.storage_and_layout(), s.v.storage_and_layout()));
    let own = match (&b.own, &own_guards) {
        (Some(o), Some(((kg, kl), (vg, vl)))) => {
            let (buffer_heads, capacity, hd) = o.k.dims3()?;
            let (first, end) = heads_of(o.heads, buffer_heads)?;
            // the group's first head, from its first live row
            let offset = first * capacity * hd + o.start * hd;
            Some((
                cpu_rows(kg, kl.start_offset() + offset)?,
                cpu_rows(vg, vl.start_offset() + offset)?,
                KvLayout::head_major(end - first, hd, capacity, o.len),
            ))
        }
        _ => None,
    };
    let shared = match (&b.shared, &shared_guards) {
        (Some(s), Some(((kg, kl), (vg, vl)))) => {
            let (buffer_heads, capacity, hd) = s.k.dims3()?;
            let (first, end) = heads_of(s.heads, buffer_heads)?;
            let offset = first * capacity * hd;
            Some(SharedKv {
                k: cpu_rows(kg, kl.start_offset() + offset)?,
                v: cpu_rows(vg, vl.start_offset() + offset)?,
                layout: KvLayout::head_major(end - first, hd, capacity, capacity),
                rows: s.rows,
            })
        }
        _ => None,
    };
    let view = match (own, shared) {
        (Some((k, v, layout)), None) => KvCache::new(k, v, layout)?,
        (own, Some(shared)) => {
            let (k, v, layout) = own.unwrap_or_else(|| {
                let lay = shared.layout;
                let none = KvLayout::head_major(lay.kv_heads, lay.head_dim, 0, 0);
                (shared.k.empty(), shared.v.empty(), none)
            });
            KvCache::new(k, v, layout)?.with_shared(shared)?
        }
        (None, None) => return f(None),
    };
    f(Some(&view))
}

/// Heads `first..end` of a buffer of `buffer_heads`, checked.
fn heads_of((first, end): (usize, usize), buffer_heads: usize) -> Result<(usize, usize)> {
    if end > buffer_heads || first >= end {
        return Err(ModelError::Kernel(lcut_kernels::KernelError::Heads(
            format!("K/V heads {first}..{end} of a cache of {buffer_heads}"),
        )));
    }
    Ok((first, end))
}

/// A K/V buffer's values from element `offset`, as the kernels read them.
fn cpu_rows(storage: &Storage, offset: usize) -> Result<KvData<'_>> {
    Ok(match storage {
        Storage::Cpu(CpuStorage::F32(a)) => KvData::F32(&a[offset..]),
        Storage::Cpu(CpuStorage::F16(a)) => KvData::F16(&a[offset..]),
        Storage::Cpu(CpuStorage::BF16(a)) => KvData::Bf16(&a[offset..]),
        _ => {
            return Err(ModelError::Kernel(lcut_kernels::KernelError::Heads(
                "the K/V cache is not an f32, f16 or bf16 CPU buffer".into(),
            )));
        }
    })
}

/// The rows K/V heads `heads` of `cache` hold, as the kernels read them:
/// for each head, each row's keys (tests of the cache's buffers).
#[cfg(test)]
pub(crate) fn read_group_rows(cache: &LayerCache, heads: Range<usize>) -> anyhow::Result<Vec<f32>> {
    use lcut_kernels::attention::QuerySpans;
    let Ok(n) = with_group_view(cache, heads.clone(), |v| Ok(v.map_or(0, |v| v.len()))) else {
        anyhow::bail!("no view");
    };
    let (kv, hd) = (heads.len(), 2);
    let mut out = Vec::new();
    // one query per row whose scores pick that row alone: an output equal to
    // the row's value (keys equal values in these tests)
    for r in 0..n {
        let mut spans = QuerySpans::new();
        spans.push_query(std::iter::once(r..r + 1));
        let q = vec![0f32; kv * hd];
        let mut o = vec![0f32; kv * hd];
        let spec = AttentionSpec {
            heads: kv,
            scale: 1.0,
            softcap: None,
            sinks: None,
        };
        with_group_view(cache, heads.clone(), |v| {
            let v = v.ok_or(ModelError::MissingLogits)?;
            lcut_kernels::attention::attend_chunk(Isa::Portable, &spec, &q, v, &spans, &mut o)?;
            Ok(())
        })?;
        out.push(o);
    }
    // [row][head][dim] -> [head][row][dim]
    Ok((0..kv)
        .flat_map(|h| {
            out.iter()
                .flat_map(move |o| o[h * hd..(h + 1) * hd].to_vec())
        })
        .collect())
}
