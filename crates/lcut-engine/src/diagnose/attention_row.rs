//! One decode step's attention row at one layer, on demand: a trace keeps
//! only reduced masses (never P x steps rows for every layer), so the row
//! a head x position heatmap needs is recorded by running the traced
//! generation again up to that step with a probe that copies out just it.

use candle_core::DType;
use lcut_model::{AttentionView, Decoder, ModelError, Probe};
use lcut_policy::Policy;

use super::trace_run::traced_generation;
use super::{DiagnoseOptions, PromptProgress};
use crate::error::{EngineError, Result};
use crate::prompt::PreparedPrompt;

/// Post-softmax attention of one decode step's query at one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionRow {
    /// The layer.
    pub layer: usize,
    /// The decode step (0 = the query of the last prompt token).
    pub step: usize,
    /// Position of the query.
    pub position: usize,
    /// Query heads.
    pub heads: usize,
    /// `[heads, position + 1]` row-major: the weight of each head on every
    /// key `0..=position`; 0 on keys the policy hides or drops there.
    pub probs: Vec<f32>,
}

/// Copies out the attention of one query at one layer. It asks for the
/// attention rows from the first decode step at every layer, as the
/// diagnostic probe does, so the decoder takes the same path and the
/// replayed generation is the traced one.
struct RowProbe {
    first_step: usize,
    layer: usize,
    position: usize,
    heads: usize,
    probs: Option<Vec<f32>>,
}

impl Probe for RowProbe {
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        Some(self.first_step)
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> std::result::Result<(), ModelError> {
        if view.layer != self.layer {
            return Ok(());
        }
        let Some(qi) = view
            .query_positions
            .iter()
            .position(|&q| q == self.position)
        else {
            return Ok(());
        };
        // only this query's [heads, keys] leaves the device
        let rows: Vec<Vec<f32>> = view
            .probs
            .narrow(1, qi, 1)?
            .squeeze(1)?
            .to_dtype(DType::F32)?
            .to_vec2()?;
        let width = self.position + 1;
        let mut dense = vec![0.0; self.heads * width];
        for (h, row) in rows.iter().enumerate().take(self.heads) {
            for (&k, &p) in view.key_positions.iter().zip(row) {
                if k < width {
                    dense[h * width + k] = p;
                }
            }
        }
        self.probs = Some(dense);
        Ok(())
    }
}

/// The attention row of decode step `step` at `layer` in the greedy run
/// that a trace of `prompt` under `policy` with `opts` records: that run is
/// repeated up to the step. `expected` is the trace's generated ids; a
/// replay that produces other tokens is an error rather than a row of
/// another run. `on_progress` hears of the replay and returns false to
/// cancel.
#[allow(clippy::too_many_arguments)]
pub fn attention_row(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: Policy,
    opts: &DiagnoseOptions,
    stop_tokens: &[u32],
    expected: &[u32],
    (layer, step): (usize, usize),
    on_progress: &mut dyn FnMut(PromptProgress) -> bool,
) -> Result<AttentionRow> {
    let cfg = model.config();
    let first_step = prompt.len() - 1;
    let position = first_step + step;
    if layer >= cfg.num_layers {
        return Err(EngineError::OutOfRange {
            what: format!("layer {layer}"),
            limit: format!("the model has {} layers", cfg.num_layers),
        });
    }
    if step >= expected.len() {
        return Err(EngineError::OutOfRange {
            what: format!("decode step {step}"),
            limit: format!("the trace has {} decode steps", expected.len()),
        });
    }
    let mut generation = traced_generation(model, prompt, policy, opts, stop_tokens)?;
    let mut probe = RowProbe {
        first_step,
        layer,
        position,
        heads: cfg.num_heads,
        probs: None,
    };
    if !generation.prefill_with(Some(&mut probe), |p| {
        on_progress(PromptProgress::Prefill(p))
    })? {
        return Err(EngineError::Cancelled);
    }
    for (k, &traced) in expected.iter().enumerate().take(step + 1) {
        let Some(produced) = generation.step(Some(&mut probe))? else {
            break;
        };
        if produced.token != traced {
            return Err(EngineError::ReplayDiverged {
                step: k,
                replayed: produced.token,
                traced,
            });
        }
        if !on_progress(PromptProgress::Step(k + 1)) {
            return Err(EngineError::Cancelled);
        }
    }
    // a decode-phase query exists at every layer, so the probe saw it
    let probs = probe.probs.ok_or(EngineError::OutOfRange {
        what: format!("decode step {step}"),
        limit: "the run ended before it".into(),
    })?;
    Ok(AttentionRow {
        layer,
        step,
        position,
        heads: cfg.num_heads,
        probs,
    })
}
