//! One sequence run for its logits and, when asked, every layer's residual
//! stream and attention: what `lcut forward` writes and what the Python
//! package's `Session.forward` returns, computed once here for both.
//!
//! The full model is teacher-forced in one chunk (logits for every
//! position); any other policy runs the real incremental path: the prompt
//! before the decode start as one chunk, then every decode-phase token one
//! by one, with logits for the decode-phase positions.

use candle_core::{Device, Tensor};
use lcut_model::probes::{RecordingProbe, RoutingRecord};
use lcut_model::{Decoder, Probe};
use lcut_policy::{PolicyKind, PolicySpec};

use crate::error::Result;
use crate::prompt::PreparedPrompt;

/// Longest sequence whose attention [H, T, T] callers record by default:
/// beyond it a layer's attention alone outgrows a few hundred megabytes.
pub const MAX_RECORDED_ATTENTION: usize = 2048;

/// What a forward run records besides the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForwardOptions {
    /// The embeddings and the residual stream after every layer.
    pub residuals: bool,
    /// Every layer's post-softmax attention [H, T, T] (memory grows with T²).
    pub attention: bool,
    /// The logit lens: `lens_logprob` [L + 1, T].
    pub lens: bool,
    /// Every token's routing at every sparse layer (a mixture-of-experts
    /// model; nothing for a dense one).
    pub routing: bool,
}

/// The result of [`forward`]; every tensor is f32 on the CPU.
#[derive(Debug, Clone)]
pub struct ForwardRecord {
    /// Logits [T - first_row, vocab] of positions `first_row..T`.
    pub logits: Tensor,
    /// First position with a logits row: 0 for the full model, the decode
    /// start for any other policy.
    pub first_row: usize,
    /// The decode start the policy ran with.
    pub decode_start: usize,
    /// Whether the full model was teacher-forced (every token at every layer).
    pub full_depth: bool,
    /// The embeddings entering layer 0 [T, hidden], when recorded.
    pub embeddings: Option<Tensor>,
    /// Per layer, the residual stream after it [T, hidden], when recorded;
    /// rows of tokens that do not exist at a layer under the policy are NaN.
    pub layer_out: Vec<Tensor>,
    /// Per layer, attention [H, T, T], when recorded; a query reads 0 from
    /// keys it does not see, and rows of queries absent at a layer are 0.
    pub attention: Vec<Tensor>,
    /// The logit lens [L + 1, T], when asked: at hidden state i (0 the
    /// embeddings, l + 1 the output of layer l) of position t, the
    /// log-probability under that state's lens (final norm, LM head) of the
    /// token the last layer ranks first at t. NaN where the policy keeps
    /// the position out of that layer (and everywhere for a position that
    /// does not reach the last layer).
    pub lens_logprob: Option<Tensor>,
    /// Every token's routing at every sparse layer, when asked and the
    /// model has experts; a token the policy keeps out of a layer has none
    /// there (NaN, -1).
    pub routing: Option<RoutingRecord>,
}

/// Run `prompt` under `spec` (resolved against the model's depth) and
/// return its logits and what `opts` asks to record. The logits never
/// depend on what is recorded: under a policy, asking for attention rows
/// can change how a sliding-window layer reads its keys (the whole rows
/// are kept), so they are recorded in a second run.
pub fn forward(
    model: &Decoder,
    prompt: &PreparedPrompt,
    spec: &PolicySpec,
    opts: ForwardOptions,
) -> Result<ForwardRecord> {
    let cfg = model.config();
    let policy = spec.resolve(cfg.num_layers)?;
    let ids = &prompt.ids;
    let t = ids.len();
    let recorder = |heads: usize| {
        let mut p = RecordingProbe::new(cfg.num_layers, heads, cfg.hidden_size, t);
        // tokens a policy keeps out of a layer never get a row there
        p.layer_out.iter_mut().for_each(|row| row.fill(f32::NAN));
        match opts.routing {
            true => p.with_routing(cfg),
            false => p,
        }
    };
    let full_depth = policy.is_full_depth() && spec.kind == PolicyKind::Full;
    let residuals = opts.residuals || opts.lens;
    let (logits, first_row, probe, attention_probe) = if full_depth {
        let heads = if opts.attention { cfg.num_heads } else { 0 };
        let mut probe = (residuals || opts.attention || opts.routing).then(|| recorder(heads));
        let p = probe.as_mut().map(|p| p as &mut dyn Probe);
        let logits = model.teacher_forced_logits(ids, p)?;
        (logits, 0, probe, None)
    } else {
        let mut probe = (residuals || opts.routing).then(|| recorder(0));
        let logits = incremental(model, prompt, policy, probe.as_mut())?;
        let mut attention = opts.attention.then(|| recorder(cfg.num_heads));
        if attention.is_some() {
            incremental(model, prompt, policy, attention.as_mut())?;
        }
        (logits, prompt.decode_start, probe, attention)
    };
    let cpu = Device::Cpu;
    let mut record = ForwardRecord {
        logits: logits.to_device(&cpu)?,
        first_row,
        decode_start: prompt.decode_start,
        full_depth,
        embeddings: None,
        layer_out: Vec::new(),
        attention: Vec::new(),
        lens_logprob: None,
        routing: None,
    };
    if let Some(mut probe) = probe {
        record.routing = probe.routing.take();
        if opts.lens {
            let sites: Vec<&[f32]> = std::iter::once(probe.embeddings.as_slice())
                .chain(probe.layer_out.iter().map(Vec::as_slice))
                .collect();
            record.lens_logprob = Some(lens_logprob(model, &sites, t)?);
        }
        if opts.residuals {
            let d = cfg.hidden_size;
            record.embeddings = Some(Tensor::from_vec(probe.embeddings, (t, d), &cpu)?);
            record.layer_out = probe
                .layer_out
                .into_iter()
                .map(|out| Tensor::from_vec(out, (t, d), &cpu))
                .collect::<candle_core::Result<_>>()?;
        }
        if full_depth && opts.attention {
            record.attention = attention_tensors(probe.attention, cfg.num_heads, t)?;
        }
    }
    if let Some(probe) = attention_probe {
        record.attention = attention_tensors(probe.attention, cfg.num_heads, t)?;
    }
    Ok(record)
}

/// The lens log-probabilities [sites, T] of recorded hidden states
/// (`sites[i]` holds [T, hidden] row-major, NaN rows where a position did
/// not exist at that site): each position that reaches the last site is
/// read at every site where it exists, against the token the last site
/// ranks first.
fn lens_logprob(model: &Decoder, sites: &[&[f32]], t: usize) -> Result<Tensor> {
    let d = model.config().hidden_size;
    let exists = |site: &[f32], p: usize| site[p * d..(p + 1) * d].iter().all(|x| x.is_finite());
    let top = sites.last().copied().unwrap_or_default();
    let positions: Vec<usize> = (0..t).filter(|&p| exists(top, p)).collect();
    let mut out = vec![f32::NAN; sites.len() * t];
    if positions.is_empty() {
        return Ok(Tensor::from_vec(out, (sites.len(), t), &Device::Cpu)?);
    }
    let rows = sites
        .iter()
        .map(|site| {
            let mut rows = Vec::with_capacity(positions.len() * d);
            for &p in &positions {
                match exists(site, p) {
                    true => rows.extend_from_slice(&site[p * d..(p + 1) * d]),
                    // a stand-in row whose value is not reported
                    false => rows.extend(std::iter::repeat_n(0.0, d)),
                }
            }
            Tensor::from_vec(rows, (positions.len(), d), model.device())?.to_dtype(model.dtype())
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    let records = model.lens_records(&rows, &positions, None, None)?;
    for rec in records {
        for (i, site) in sites.iter().enumerate() {
            if exists(site, rec.position) {
                out[i * t + rec.position] = rec.logprob[i];
            }
        }
    }
    Ok(Tensor::from_vec(out, (sites.len(), t), &Device::Cpu)?)
}

/// Per-layer attention buffers as [H, T, T] tensors on the CPU.
fn attention_tensors(layers: Vec<Vec<f32>>, heads: usize, t: usize) -> Result<Vec<Tensor>> {
    Ok(layers
        .into_iter()
        .map(|a| Tensor::from_vec(a, (heads, t, t), &Device::Cpu))
        .collect::<candle_core::Result<_>>()?)
}

/// The incremental path under `policy` ([`Decoder::incremental_logits`]):
/// the prompt before its decode start as one chunk, then each
/// decode-phase token alone; logits of the decode-phase positions.
fn incremental(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: lcut_policy::Policy,
    probe: Option<&mut RecordingProbe>,
) -> Result<Tensor> {
    let phases = prompt.phases(&policy)?;
    let s = phases.decode_start();
    let mut seq = model.new_sequence(policy, phases)?;
    let probe = probe.map(|p| p as &mut dyn Probe);
    Ok(model.incremental_logits(&mut seq, &prompt.ids, s, probe)?)
}
