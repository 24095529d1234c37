//! One sequence run for its logits and, when asked, every layer's residual
//! stream and attention: what `lcut forward` writes and what the Python
//! package's `Session.forward` returns, computed once here for both.
//!
//! The full model is teacher-forced in one chunk (logits for every
//! position); any other policy runs the real incremental path: the prompt
//! before the decode start as one chunk, then every decode-phase token one
//! by one, with logits for the decode-phase positions.

use candle_core::{Device, Tensor};
use lcut_model::probes::RecordingProbe;
use lcut_model::{Decoder, LogitRows};
use lcut_policy::{PolicyKind, PolicySpec};

use crate::error::{EngineError, Result};
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
}

/// Run `prompt` under `spec` (resolved against the model's depth) and
/// return its logits and what `opts` asks to record.
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
    let recording = opts.residuals || opts.attention;
    let heads = if opts.attention { cfg.num_heads } else { 0 };
    let mut probe = recording.then(|| {
        let mut p = RecordingProbe::new(cfg.num_layers, heads, cfg.hidden_size, t);
        // tokens a policy keeps out of a layer never get a row there
        p.layer_out.iter_mut().for_each(|row| row.fill(f32::NAN));
        p
    });
    let full_depth = policy.is_full_depth() && spec.kind == PolicyKind::Full;
    let cpu = Device::Cpu;
    let (logits, first_row, decode_start) = if full_depth {
        let probe = probe.as_mut().map(|p| p as &mut dyn lcut_model::Probe);
        let logits = model.teacher_forced_logits(ids, probe)?;
        (logits, 0, prompt.decode_start)
    } else {
        let phases = prompt.phases(&policy)?;
        let s = phases.decode_start();
        let mut seq = model.new_sequence(policy, phases)?;
        let mut probe = probe.as_mut().map(|p| p as &mut dyn lcut_model::Probe);
        if s > 0 {
            model.forward(&mut seq, &ids[..s], LogitRows::None, probe.as_deref_mut())?;
        }
        let mut rows = Vec::with_capacity(t - s);
        for i in s..t {
            let out =
                model.forward(&mut seq, &ids[i..=i], LogitRows::Last, probe.as_deref_mut())?;
            rows.push(
                out.logits
                    .ok_or(EngineError::MissingLogits { position: i })?,
            );
        }
        (Tensor::cat(&rows, 0)?, s, s)
    };
    let mut record = ForwardRecord {
        logits: logits.to_device(&cpu)?,
        first_row,
        decode_start,
        full_depth,
        embeddings: None,
        layer_out: Vec::new(),
        attention: Vec::new(),
    };
    if let Some(probe) = probe {
        if opts.residuals {
            let d = cfg.hidden_size;
            record.embeddings = Some(Tensor::from_vec(probe.embeddings, (t, d), &cpu)?);
            record.layer_out = probe
                .layer_out
                .into_iter()
                .map(|out| Tensor::from_vec(out, (t, d), &cpu))
                .collect::<candle_core::Result<_>>()?;
        }
        if opts.attention {
            record.attention = probe
                .attention
                .into_iter()
                .map(|a| Tensor::from_vec(a, (cfg.num_heads, t, t), &cpu))
                .collect::<candle_core::Result<_>>()?;
        }
    }
    Ok(record)
}
