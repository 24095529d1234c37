//! A pass that starts above the layers a policy runs as the full model
//! does: the tokens' residual stream entering layer `from`, recorded by the
//! full model's pass over the same tokens from the same prompt
//! ([`PromptRecord`]), runs the layers from `from` up only. Below `from`
//! the policy's run would compute exactly what the full run computed
//! ([`Policy::full_depth_below`](lcut_policy::Policy::full_depth_below)),
//! so the logits are the same bits as the policy's whole pass; the sweep's
//! teacher-forced runs of every cutoff share the full run's lower layers
//! this way instead of running them again per cutoff. On a model whose
//! upper layers read a lower layer's K/V (Gemma 4's shared layers), that
//! lower layer's K/V of the tokens are projected from the states the full
//! run recorded entering it, as its own pass stores them; a model that
//! gives each layer an input of its own per token (Gemma 4's per-layer
//! inputs) has those made from the tokens, as the whole pass makes them.

use candle_core::Tensor;

use super::pass::ChunkRows;
use super::projected::Projected;
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
    /// `entering` must hold the tokens' states entering every layer of
    /// [`Decoder::entering_layers_above`]`(from)`: `from` and each lower
    /// layer whose K/V a layer from `from` up reads.
    ///
    /// Refused (the caller runs the whole pass instead) where the layers
    /// below `from` are not the full model's under `seq`'s policy, for a
    /// policy that decides as it runs (SlimInfer, a press), for a single
    /// token (a pass of one token takes the decode step, not the chunk's
    /// path), and where `entering` lacks one of those states.
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
        let unrecorded = |layer: usize| {
            refuse(format!(
                "the full run did not record these tokens' states entering layer {layer}"
            ))
        };
        let state = |l: usize| entered(entering, l, &present).ok_or_else(|| unrecorded(l));
        let hidden = state(from)?;
        // the K/V the lower layers read from above store of these tokens in
        // the whole pass, before any layer from `from` up reads them
        for source in self.sources_below(from) {
            let projected = Projected::at(self, state(source)?, present.clone())?;
            let (k, v) = self.projected_kv(&self.layers[source], &projected)?;
            self.store_layer_kv(&mut seq, source, (&k, &v), (&present, start))?;
        }
        let layer_inputs = match self.has_layer_inputs() {
            true => self.embed_rows(tokens, start, &mut None)?.layer_inputs,
            false => None,
        };
        let chunk = ChunkRows {
            hidden,
            present,
            layer_inputs,
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
        Ok(())
    }

    /// The layers whose entering states a pass started at `from` reads
    /// ([`Decoder::forward_above`]): `from` first, then, ascending, each
    /// layer below it whose K/V a layer from `from` up reads.
    pub fn entering_layers_above(&self, from: usize) -> Vec<usize> {
        std::iter::once(from)
            .chain(self.sources_below(from))
            .collect()
    }

    /// The layers below `from`, ascending, whose K/V a layer from `from` up
    /// reads.
    fn sources_below(&self, from: usize) -> Vec<usize> {
        let mut sources: Vec<usize> = self
            .layers
            .iter()
            .skip(from)
            .filter_map(|l| l.kv_source.filter(|&s| s < from))
            .collect();
        sources.sort_unstable();
        sources.dedup();
        sources
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
