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
    AttentionScratch, AttentionSpec, CurrentKv, KvCache, KvData, KvLayout, attend,
};
use lcut_kernels::ops;
use lcut_kernels::product::{Activations, matvec_concat};

use super::step_model::{Held, StepLayer, StepLinear, StepModel};
use super::{ChunkOutput, Decoder, LogitRows};
use crate::cache::LayerCache;
use crate::error::{ModelError, Result};
use crate::probe::{AttentionView, Probe, ResidualSite};
use crate::sequence::Sequence;

pub use super::step_model::Unfused;

/// The fused step's buffers for one sequence, made at its first step and
/// reused by every later one.
#[derive(Debug, Default)]
pub struct StepScratch {
    hidden: Vec<f32>,
    acts: Activations,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    out: Vec<f32>,
    gate_up: Vec<f32>,
    tmp: Vec<f32>,
    product: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    probs: Vec<f32>,
    attention: AttentionScratch,
    spans: SpanMemo,
    key_positions: Vec<usize>,
}

/// The cache rows a query reads, kept for the next layer with the same
/// visibility rule over the same cache rows.
#[derive(Debug, Default)]
struct SpanMemo {
    rule_class: Option<usize>,
    window: Option<usize>,
    positions: Vec<usize>,
    spans: Vec<Range<usize>>,
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
    fn step_model(&self) -> Result<std::result::Result<&StepModel, Unfused>> {
        if let Some(m) = self.step.get() {
            return Ok(m.as_ref().map_err(|u| *u));
        }
        let built = StepModel::build(self)?;
        let m = self.step.get_or_init(|| built);
        Ok(m.as_ref().map_err(|u| *u))
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
        if self.fused_off || !seq.rule.is_decided() || !seq.pending.is_empty() {
            return Ok(None);
        }
        let Ok(model) = self.step_model()? else {
            return Ok(None);
        };
        let pos = seq.next_pos;
        if !(0..self.layers.len()).all(|l| seq.token_exists(l, pos)) {
            return Ok(None);
        }
        let mut scratch = seq.step.take().unwrap_or_default();
        let out = if probe.is_none() {
            // the whole step on one of rayon's threads, so that each product's
            // parallel region splits work between running threads rather than
            // waking this one after every region (a probe stays on the caller's
            // thread: it need not be Send)
            rayon::scope(|_| self.run_step(model, seq, token, rows, &mut None, &mut scratch))
        } else {
            self.run_step(model, seq, token, rows, probe, &mut scratch)
        };
        seq.step = Some(scratch);
        out.map(Some)
    }

    fn run_step(
        &self,
        model: &StepModel,
        seq: &mut Sequence,
        token: u32,
        rows: LogitRows,
        probe: &mut Option<&mut (dyn Probe + '_)>,
        s: &mut StepScratch,
    ) -> Result<ChunkOutput> {
        let pos = seq.next_pos;
        let (hidden, _) = self.embed(&[token], pos, probe)?;
        s.hidden.clear();
        s.hidden.extend(
            hidden
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
        self.rope.tables_into(pos, &mut s.cos, &mut s.sin);
        let held = model.hold();
        for (l, layer) in model.layers.iter().enumerate() {
            self.attention_half(l, layer, &held, seq, pos, probe, s)?;
            self.mlp_half(layer, &held, s)?;
            if let Some(p) = probe.as_deref_mut()
                && p.wants_residual(ResidualSite::Layer(l))
            {
                let h = Tensor::from_slice(&s.hidden, (1, s.hidden.len()), &Device::Cpu)?;
                p.on_residual(ResidualSite::Layer(l), &[pos], &h.to_dtype(self.dtype)?)?;
            }
            seq.rule.after_decode_layer(l, pos);
        }
        seq.next_pos = pos + 1;
        let logits = match rows {
            LogitRows::None => None,
            LogitRows::Last | LogitRows::All => Some(self.step_logits(model, &held, s)?),
        };
        let positions = if logits.is_some() { vec![pos] } else { vec![] };
        Ok(ChunkOutput { logits, positions })
    }

    /// `products` of the activations in `s.acts` into `out` (outputs side by
    /// side), each one's rows put in Hugging Face order and its bias added.
    fn products(
        &self,
        products: &[&StepLinear],
        held: &Held<'_>,
        acts: &mut Activations,
        out: &mut Vec<f32>,
        tmp: &mut Vec<f32>,
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        let total: usize = products.iter().map(|p| p.rows).sum();
        out.resize(total, 0.0);
        let mats: Vec<_> = products.iter().map(|p| p.view(held)).collect();
        matvec_concat(Isa::detect(), &mats, acts, out, scratch)?;
        let mut at = 0;
        for p in products {
            let seg = &mut out[at..at + p.rows];
            p.unpermute(seg, tmp);
            p.add_bias(seg);
            at += p.rows;
        }
        Ok(())
    }

    /// RMSNorm, Q/K/V, RoPE, the cache, attention and the output product
    /// added to the residual stream.
    #[allow(clippy::too_many_arguments)]
    fn attention_half(
        &self,
        l: usize,
        layer: &StepLayer,
        held: &Held<'_>,
        seq: &mut Sequence,
        pos: usize,
        probe: &mut Option<&mut (dyn Probe + '_)>,
        s: &mut StepScratch,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, kv, hd, d) = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let eps = cfg.rms_norm_eps as f32;
        ops::rms_norm(&s.hidden, &layer.input_norm, eps, s.acts.fill(1, d))?;
        let qkv: Vec<&StepLinear> = layer.qkv.iter().collect();
        self.products(
            &qkv,
            held,
            &mut s.acts,
            &mut s.qkv,
            &mut s.tmp,
            &mut s.product,
        )?;
        let (q, rest) = s.qkv.split_at_mut(h * hd);
        let (k, v) = rest.split_at_mut(kv * hd);
        if let Some(w) = &layer.q_norm {
            ops::rms_norm_in_place(q, w, eps)?;
        }
        if let Some(w) = &layer.k_norm {
            ops::rms_norm_in_place(k, w, eps)?;
        }
        ops::rope_in_place(q, hd, &s.cos, &s.sin)?;
        ops::rope_in_place(k, hd, &s.cos, &s.sin)?;
        if let Some(w) = seq.rule.query_window(l)
            && w > 0
        {
            seq.rule.observe_queries(l, vec![q.to_vec()]);
        }
        let retained = seq.retains_kv(l, pos);
        if retained {
            let kt = Tensor::from_slice(k, (kv, 1, hd), &Device::Cpu)?;
            let vt = Tensor::from_slice(v, (kv, 1, hd), &Device::Cpu)?;
            self.store_kv(&mut seq.caches[l], (&kt, &vt), &[pos])?;
        }
        let current = (!retained).then_some(CurrentKv { k, v });
        visible_rows(seq, l, pos, layer.window, &mut s.spans);
        let wants = probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .is_some_and(|from| from <= pos);
        let keys = s.spans.spans.iter().map(|r| r.len()).sum::<usize>() + usize::from(!retained);
        if wants {
            s.probs.resize(h * keys, 0.0);
        }
        let spec = AttentionSpec {
            heads: h,
            scale: cfg.attn_scale as f32,
            softcap: cfg.attn_softcap.map(|c| c as f32),
        };
        s.attn.resize(h * hd, 0.0);
        let probs = wants.then_some(&mut s.probs[..]);
        attend_cache(
            &seq.caches[l],
            kv,
            &spec,
            q,
            &s.spans.spans,
            current,
            &mut s.attn,
            probs,
            &mut s.attention,
        )?;
        if wants && let Some(p) = probe.as_deref_mut() {
            s.key_positions.clear();
            let cached = seq.caches[l].positions();
            for r in &s.spans.spans {
                s.key_positions.extend_from_slice(&cached[r.clone()]);
            }
            if !retained {
                s.key_positions.push(pos);
            }
            let probs = Tensor::from_slice(&s.probs, (h, 1, keys), &Device::Cpu)?;
            p.on_attention(AttentionView {
                layer: l,
                query_positions: &[pos],
                key_positions: &s.key_positions,
                probs: &probs,
            })?;
        }
        s.acts.fill(1, h * hd).copy_from_slice(&s.attn);
        self.products(
            &[&layer.o],
            held,
            &mut s.acts,
            &mut s.out,
            &mut s.tmp,
            &mut s.product,
        )?;
        if let Some(w) = &layer.attn_out_norm {
            ops::rms_norm_in_place(&mut s.out, w, eps)?;
        }
        ops::add_in_place(&mut s.hidden, &s.out)?;
        Ok(())
    }

    /// RMSNorm, gate and up, the gated activation, down, added to the
    /// residual stream.
    fn mlp_half(&self, layer: &StepLayer, held: &Held<'_>, s: &mut StepScratch) -> Result<()> {
        let (d, inner) = (self.cfg.hidden_size, self.cfg.intermediate_size);
        let eps = self.cfg.rms_norm_eps as f32;
        ops::rms_norm(&s.hidden, &layer.mlp_in_norm, eps, s.acts.fill(1, d))?;
        let gu: Vec<&StepLinear> = layer.gate_up.iter().collect();
        self.products(
            &gu,
            held,
            &mut s.acts,
            &mut s.gate_up,
            &mut s.tmp,
            &mut s.product,
        )?;
        let (gate, up) = s.gate_up.split_at_mut(inner);
        ops::gate_in_place(gate, up, layer.activation)?;
        s.acts.fill(1, inner).copy_from_slice(gate);
        self.products(
            &[&layer.down],
            held,
            &mut s.acts,
            &mut s.out,
            &mut s.tmp,
            &mut s.product,
        )?;
        if let Some(w) = &layer.mlp_out_norm {
            ops::rms_norm_in_place(&mut s.out, w, eps)?;
        }
        ops::add_in_place(&mut s.hidden, &s.out)?;
        Ok(())
    }

    /// Logits [1, vocab] in f32 of the final hidden state.
    fn step_logits(
        &self,
        model: &StepModel,
        held: &Held<'_>,
        s: &mut StepScratch,
    ) -> Result<Tensor> {
        let d = self.cfg.hidden_size;
        let eps = self.cfg.rms_norm_eps as f32;
        ops::rms_norm(&s.hidden, &model.final_norm, eps, s.acts.fill(1, d))?;
        let mut z = Vec::new();
        self.products(
            &[&model.lm_head],
            held,
            &mut s.acts,
            &mut z,
            &mut s.tmp,
            &mut s.product,
        )?;
        if let Some(c) = self.cfg.final_softcap {
            ops::softcap_in_place(&mut z, c as f32);
        }
        let n = z.len();
        Ok(Tensor::from_vec(z, (1, n), &Device::Cpu)?)
    }
}

/// The cache rows the query at `pos` reads at layer `l`, into `memo`: the
/// rows the policy shows it, inside the layer's window. A layer whose rule
/// shows every earlier key ([`lcut_policy::Visibility::rule_class`] 0)
/// reads every row without asking; otherwise the policy is asked once per
/// row and the answer kept for the following layers of the same rule over
/// the same rows.
fn visible_rows(seq: &Sequence, l: usize, pos: usize, window: Option<usize>, memo: &mut SpanMemo) {
    let cached = seq.caches[l].positions();
    let class = seq.rule.rule_class(l);
    if memo.rule_class == Some(class) && memo.window == window && memo.positions == cached {
        return;
    }
    memo.rule_class = Some(class);
    memo.window = window;
    memo.positions.clear();
    memo.positions.extend_from_slice(cached);
    memo.spans.clear();
    // keys inside the window: k + w > pos
    let first = window.map_or(0, |w| cached.partition_point(|&k| k + w <= pos));
    if class == 0 {
        if first < cached.len() {
            memo.spans.push(first..cached.len());
        }
        return;
    }
    let mut open: Option<usize> = None;
    for (i, &k) in cached.iter().enumerate().skip(first) {
        match (seq.rule.key_visible(l, pos, k), open) {
            (true, None) => open = Some(i),
            (false, Some(start)) => {
                memo.spans.push(start..i);
                open = None;
            }
            _ => {}
        }
    }
    if let Some(start) = open {
        memo.spans.push(start..cached.len());
    }
}

/// Attention of `q` over the rows `spans` of `cache` (and `current`),
/// reading the cache's buffers in place.
#[allow(clippy::too_many_arguments)]
fn attend_cache(
    cache: &LayerCache,
    kv_heads: usize,
    spec: &AttentionSpec,
    q: &[f32],
    spans: &[Range<usize>],
    current: Option<CurrentKv<'_>>,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
    scratch: &mut AttentionScratch,
) -> Result<()> {
    let isa = Isa::detect();
    with_cache_view(cache, kv_heads, |view| {
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

/// `f` over the cache's buffers as the kernels read them, in place, or
/// over `None` when it holds nothing.
pub(super) fn with_cache_view<R>(
    cache: &LayerCache,
    kv_heads: usize,
    f: impl FnOnce(Option<&KvCache<'_>>) -> Result<R>,
) -> Result<R> {
    let Some((k, v)) = cache.buffers() else {
        return f(None);
    };
    let (heads, capacity, hd) = k.dims3()?;
    if heads != kv_heads {
        return Err(ModelError::Kernel(lcut_kernels::KernelError::Heads(
            format!("a cache of {heads} K/V heads for a model of {kv_heads}"),
        )));
    }
    let layout = KvLayout::head_major(heads, hd, capacity, cache.len());
    let (kg, kl) = k.storage_and_layout();
    let (vg, vl) = v.storage_and_layout();
    let (ko, vo) = (kl.start_offset(), vl.start_offset());
    let view = match (&*kg, &*vg) {
        (Storage::Cpu(CpuStorage::F32(a)), Storage::Cpu(CpuStorage::F32(b))) => {
            KvCache::new(KvData::F32(&a[ko..]), KvData::F32(&b[vo..]), layout)?
        }
        (Storage::Cpu(CpuStorage::F16(a)), Storage::Cpu(CpuStorage::F16(b))) => {
            KvCache::new(KvData::F16(&a[ko..]), KvData::F16(&b[vo..]), layout)?
        }
        (Storage::Cpu(CpuStorage::BF16(a)), Storage::Cpu(CpuStorage::BF16(b))) => {
            KvCache::new(KvData::Bf16(&a[ko..]), KvData::Bf16(&b[vo..]), layout)?
        }
        _ => {
            return Err(ModelError::Kernel(lcut_kernels::KernelError::Heads(
                "the K/V cache is not an f32, f16 or bf16 CPU buffer".into(),
            )));
        }
    };
    f(Some(&view))
}
