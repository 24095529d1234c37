//! A pass that starts above the layers a policy runs as the full model
//! does: the tokens' residual stream entering layer `from`, recorded by the
//! full model's pass over the same tokens from the same prompt
//! ([`PromptRecord`]), runs the layers from `from` up only. Below `from`
//! the policy's run would compute exactly what the full run computed
//! ([`Policy::full_depth_below`](lcut_policy::Policy::full_depth_below)),
//! so the logits are the same bits as the policy's whole pass; the sweep's
//! teacher-forced runs of every cutoff share the full run's lower layers
//! this way instead of running them again per cutoff.

use candle_core::Tensor;

use super::pass::ChunkRows;
use super::{ChunkOutput, Decoder, LogitRows};
use crate::error::{ModelError, Result};
use crate::probe::Probe;
use crate::probes::PromptRecord;
use crate::sequence::Sequence;

impl Decoder {
    /// `tokens` fed to `seq` (the state of a policy branched from a full
    /// run of the prompt before them), run from layer `from` up from the
    /// states `entering` recorded entering `from` in the full model's pass
    /// over the same `tokens` from the same prompt state: `seq`'s logits of
    /// `rows`, as [`Decoder::forward`] gives them, with `probe` (when given)
    /// seeing the layers from `from` up as it would see them in the whole
    /// pass. The sequence is taken: its layers below `from` never see
    /// `tokens`, so it cannot go on.
    ///
    /// Refused (the caller runs the whole pass instead) where the layers
    /// below `from` are not the full model's under `seq`'s policy, where a
    /// layer from `from` up reads K/V a layer below writes or the model
    /// gives each layer its own per-token input (Gemma 4), for a policy that
    /// decides as it runs (SlimInfer, a press), for a single token (a pass
    /// of one token takes the decode step, not the chunk's path), and where
    /// `entering` lacks the tokens' states at `from`.
    pub fn forward_above(
        &self,
        mut seq: Sequence,
        tokens: &[u32],
        from: usize,
        entering: &PromptRecord,
        rows: LogitRows,
        mut probe: Option<&mut dyn Probe>,
    ) -> Result<ChunkOutput> {
        self.check_next(&seq, tokens)?;
        let policy = *seq.policy();
        let refuse = |reason: String| ModelError::NotAbove {
            policy: policy.to_string(),
            layer: from,
            reason,
        };
        if let Err(reason) = self.runs_above(from, tokens.len()) {
            return Err(refuse(reason));
        }
        if from > policy.full_depth_below() {
            return Err(refuse(format!(
                "it runs only its lowest {} layers as the full model does",
                policy.full_depth_below()
            )));
        }
        if seq.visibility().dynamic().is_some() {
            return Err(refuse("it decides as it runs".into()));
        }
        let start = seq.next_pos;
        let present: Vec<usize> = (start..start + tokens.len()).collect();
        let hidden = entered(entering, from, &present).ok_or_else(|| {
            refuse("the full run did not record these tokens' states there".into())
        })?;
        let chunk = ChunkRows {
            hidden,
            present,
            layer_inputs: None,
        };
        let out = self.run_layers(
            &mut seq,
            from..self.layers.len(),
            chunk,
            Some(start),
            &mut probe,
        )?;
        self.logits(&out.hidden, &out.present, start + tokens.len() - 1, rows)
    }

    /// Whether a pass of `tokens` tokens can start at layer `from` from a
    /// full run's states on this model ([`Decoder::forward_above`]), as
    /// far as the model and the pass decide (the policy aside); `Err` says
    /// why not.
    pub fn runs_above(&self, from: usize, tokens: usize) -> std::result::Result<(), String> {
        let layers = self.layers.len();
        if from > layers {
            return Err(format!("the model has {layers} layers"));
        }
        if tokens < 2 {
            return Err("one token takes the decode step".into());
        }
        if self.has_layer_inputs() {
            return Err("the model gives every layer its own input".into());
        }
        match (from..layers).find(|&l| self.layers[l].kv_source.is_some_and(|s| s < from)) {
            Some(l) => Err(format!("layer {l} reads a lower layer's K/V")),
            None => Ok(()),
        }
    }
}

/// The states `record` holds entering `layer` for exactly the tokens at
/// `present`, in one chunk (`None` where it holds other rows).
fn entered(record: &PromptRecord, layer: usize, present: &[usize]) -> Option<Tensor> {
    match record.chunks(layer)? {
        [(hidden, positions)] if positions == present => Some(hidden.clone()),
        _ => None,
    }
}
