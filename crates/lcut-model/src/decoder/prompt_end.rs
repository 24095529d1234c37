//! The decision of a policy that decides at the prompt's end (kvpress's
//! presses): the prompt runs every layer whole, as the full model's
//! prefill; before the first decode-phase token runs, every layer hands the
//! policy its prompt K/V, and the rows the policy does not keep leave each
//! K/V head's cache. A chunk that crosses the decode start runs as its
//! prompt part, the decision, then its decode-phase part (kvpress's
//! pipeline: the question after the compressed context). A sliding-window
//! layer is left as the model holds it (kvpress's rule for Gemma 3).

use candle_core::{DType, Tensor};
use lcut_policy::{HostKeys, PolicyError, PromptKv};

use super::{ChunkOutput, Decoder, LogitRows};
use crate::error::{ModelError, Result};
use crate::probe::Probe;
use crate::sequence::Sequence;

impl Decoder {
    /// Refuse a policy that decides at the prompt's end on a model whose
    /// every layer slides: a sliding-window layer drops prompt rows older
    /// than its window before the prompt has run, so the policy leaves it
    /// as the model holds it (kvpress's rule for Gemma 3, whose presses
    /// compress only the layers that read every earlier key), and with no
    /// other layer it would compress nothing.
    pub(super) fn check_prompt_end(&self, seq: &Sequence) -> Result<()> {
        if !seq.awaits_prompt_end() || self.layers.iter().any(|l| l.window.is_none()) {
            return Ok(());
        }
        let w = self.layers.first().and_then(|l| l.window).unwrap_or(0);
        Err(ModelError::Policy(PolicyError::PromptLayer {
            policy: seq.policy().to_string(),
            layer: 0,
            reason: format!(
                "the policy decides from every prompt position once the prompt has run, but \
                 every layer of this model attends only to its last {w} positions (a sliding \
                 window) and drops the others; it leaves such layers as they are, so it would \
                 compress nothing"
            ),
        }))
    }

    /// The layers a policy that decides at the prompt's end leaves as the
    /// model holds them: the sliding-window ones (empty on a model without).
    pub fn layers_left_whole_at_prompt_end(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.layers[l].window.is_some())
            .collect()
    }

    /// Run `tokens`, which reach the decode start of a sequence whose policy
    /// decides at the prompt's end: the prompt's tokens, the decision, then
    /// the decode-phase tokens; the outputs joined as one chunk's.
    pub(super) fn forward_across_prompt_end(
        &self,
        seq: &mut Sequence,
        tokens: &[u32],
        rows: LogitRows,
        mut probe: Option<&mut (dyn Probe + '_)>,
    ) -> Result<ChunkOutput> {
        let prompt = seq.phases().decode_start().saturating_sub(seq.next_pos);
        let mut head = None;
        if prompt > 0 {
            let head_rows = match rows {
                LogitRows::All => LogitRows::All,
                _ => LogitRows::None,
            };
            head = Some(self.forward(seq, &tokens[..prompt], head_rows, probe.as_deref_mut())?);
        }
        self.decide_at_prompt_end(seq)?;
        self.drop_unread(seq)?;
        let tail = self.forward(seq, &tokens[prompt..], rows, probe)?;
        Ok(match head {
            Some(head) => join(head, tail)?,
            None => tail,
        })
    }

    /// Hand the policy each layer's prompt K/V (every prompt row, on the
    /// host in f32) to decide what it keeps; a sliding-window layer, which
    /// holds only its window's rows, is left whole.
    fn decide_at_prompt_end(&self, seq: &mut Sequence) -> Result<()> {
        let cfg = self.config();
        for l in 0..self.layers.len() {
            if self.layers[l].window.is_some() {
                if let Some(d) = seq.rule.dynamic_mut() {
                    d.leave_layer_whole(l);
                }
                continue;
            }
            let cache = &seq.caches[l];
            let positions = cache.positions().to_vec();
            let host = |t: &Tensor| -> Result<Vec<f32>> {
                Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
            };
            let (keys, values) = match cache.kv()? {
                Some((k, v)) => (host(&k)?, host(&v)?),
                None => (vec![], vec![]),
            };
            let kv = PromptKv {
                keys: HostKeys {
                    kv_heads: self.layers[l].attn.num_kv_heads(),
                    head_dim: self.layers[l].attn.head_dim(),
                    positions: &positions,
                    data: &keys,
                },
                values: &values,
                heads: cfg.num_heads,
                // a layer without rotation: its keys are where they are
                rope_inv_freq: match self.layers[l].rope {
                    Some(r) => self.rope_at(r).host_frequencies(),
                    None => &[],
                },
            };
            if let Some(d) = seq.rule.dynamic_mut() {
                d.decide_at_prompt_end(l, &kv)?;
            }
        }
        Ok(())
    }
}

/// One chunk's output from its two parts' (the first part's rows first).
fn join(head: ChunkOutput, tail: ChunkOutput) -> Result<ChunkOutput> {
    let logits = match (head.logits, tail.logits) {
        (Some(a), Some(b)) => Some(Tensor::cat(&[&a, &b], 0)?),
        (a, b) => b.or(a),
    };
    let mut positions = head.positions;
    positions.extend(tail.positions);
    Ok(ChunkOutput { logits, positions })
}
