//! The staged prefill of a policy that decides at stage cuts (SlimInfer):
//! every prompt token passes the layer below a cut before any enters the
//! cut, and the policy takes the cut's decision in between from that
//! layer's keys.

use candle_core::{DType, Tensor};
use lcut_policy::{HostKeys, Policy, TokenPhases};

use super::{ChunkOutput, Decoder, LogitRows};
use crate::error::{ModelError, Result};
use crate::probe::Probe;
use crate::probes::PromptRecord;
use crate::sequence::{Pending, Sequence};

impl Decoder {
    /// A prompt chunk of a sequence whose policy has not decided yet. It
    /// runs the layers below the first stage cut and waits; the chunk that
    /// reaches the decode phase runs the stages: at each cut, the policy
    /// decides, then the surviving states of every waiting chunk go through
    /// the cut's layers, chunk by chunk.
    pub(super) fn staged_prefill(
        &self,
        seq: &mut Sequence,
        chunk: Pending,
        last: usize,
        rows: LogitRows,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<ChunkOutput> {
        let cuts = seq
            .rule
            .dynamic()
            .map_or(vec![], |d| d.stage_cuts().to_vec());
        let reaches_decode = last >= seq.phases().decode_start();
        let ran = self.run_layers(seq, 0..cuts[0], chunk, None, probe)?;
        seq.pending.push(ran);
        if !reaches_decode {
            return Ok(ChunkOutput {
                logits: None,
                positions: vec![],
            });
        }
        let num_layers = self.config().num_layers;
        for (i, &cut) in cuts.iter().enumerate() {
            self.decide_stage(seq, i, cut)?;
            let end = cuts.get(i + 1).copied().unwrap_or(num_layers);
            let waiting = std::mem::take(&mut seq.pending);
            let mut carried = Vec::with_capacity(waiting.len());
            for chunk in waiting {
                let ran = self.run_layers(seq, cut..end, chunk, None, probe)?;
                if !ran.present.is_empty() {
                    carried.push(ran);
                }
            }
            seq.pending = carried;
        }
        let mut done = std::mem::take(&mut seq.pending);
        // the chunk that reached the decode phase is the last one; its
        // decode-phase tokens exist at every layer
        match done.pop() {
            Some(chunk) if chunk.present.last() == Some(&last) => {
                self.logits(&chunk.hidden, &chunk.present, last, rows)
            }
            _ => Ok(ChunkOutput {
                logits: None,
                positions: vec![],
            }),
        }
    }

    /// Hand the policy the keys of the layer below stage cut `cut` (on the
    /// host) to take stage `i`'s decision.
    fn decide_stage(&self, seq: &mut Sequence, i: usize, cut: usize) -> Result<()> {
        // the layer below the cut, of its own K/V shape (Gemma 4's differ)
        let attn = &self.layers[cut - 1].attn;
        let cache = &seq.caches()[cut - 1];
        let (positions, data) = match cache.kv()? {
            Some((k, _)) => (
                cache.positions().to_vec(),
                k.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
            ),
            None => (vec![], vec![]),
        };
        let keys = HostKeys {
            kv_heads: attn.num_kv_heads(),
            head_dim: attn.head_dim(),
            positions: &positions,
            data: &data,
        };
        if let Some(d) = seq.rule.dynamic_mut() {
            d.decide_stage(i, &keys);
        }
        Ok(())
    }

    /// Whether a layer below `layer` attends through a sliding window.
    pub fn slides_below(&self, layer: usize) -> bool {
        self.layers[..layer.min(self.layers.len())]
            .iter()
            .any(|l| l.window.is_some())
    }

    /// The state a policy that prefills in stages (SlimInfer) has after
    /// `prefix`'s prompt tokens, without running its first stage again.
    /// Below its first cut every prompt token runs every layer as in the
    /// full model, so those layers' K/V are `prefix`'s (a
    /// [full-depth prefix](Sequence::is_full_depth_prefix)); the states
    /// waiting at the cut are those `record` holds entering it, chunk by
    /// chunk, and the queries the policy observes below the cut are the
    /// record's. The stages then run when the decode phase starts, as in
    /// the policy's own prefill. Refused for a policy without stages, or
    /// one whose first stage reads a layer that slides ([`Decoder::slides_below`]:
    /// the full run dropped keys there that the policy decides from), and
    /// where `record` lacks what the first stage needs.
    pub fn staged_from(
        &self,
        prefix: &Sequence,
        policy: Policy,
        phases: TokenPhases,
        record: &PromptRecord,
    ) -> Result<Sequence> {
        prefix.check_full_depth_prefix(&policy, &phases)?;
        self.check_no_layer_inputs(&policy)?;
        let refuse = || ModelError::NotRestrictable {
            policy: policy.to_string(),
        };
        let rule = policy.visibility(phases);
        let first = rule
            .dynamic()
            .and_then(|d| d.stage_cuts().first().copied())
            .filter(|&c| c > 0 && !self.slides_below(c))
            .ok_or_else(refuse)?;
        let held = prefix.next_pos;
        let missing = |layer: usize, reason: String| ModelError::UnrecordedPrompt {
            policy: policy.to_string(),
            layer,
            reason,
        };
        let chunks = record
            .chunks(first)
            .ok_or_else(|| missing(first, "the prompt run did not record them".into()))?;
        let mut pending = Vec::new();
        let mut recorded = Vec::new();
        for (hidden, positions) in chunks {
            let rows: Vec<u32> = (0..positions.len() as u32)
                .filter(|&i| positions[i as usize] < held)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let at: Vec<usize> = rows.iter().map(|&i| positions[i as usize]).collect();
            let hidden = match rows.len() == positions.len() {
                true => hidden.clone(),
                false => hidden.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?,
            };
            recorded.extend_from_slice(&at);
            pending.push(Pending {
                hidden,
                present: at,
                layer_inputs: None,
            });
        }
        if !recorded.iter().copied().eq(0..held) {
            return Err(missing(
                first,
                format!(
                    "the prompt run recorded {} of the {held} prompt tokens' states there",
                    recorded.len()
                ),
            ));
        }
        // below the first cut every prompt token exists: the full run's rows
        let mut seq = prefix.lower_layers_under(policy, rule, first)?;
        seq.pending = pending;
        // the latest queries the first stage reads, as the policy's own
        // prefill showed them chunk by chunk
        let below = first - 1;
        if let Some(d) = seq.rule.dynamic_mut()
            && let Some(w) = d.query_window(below).filter(|&w| w > 0)
        {
            let rows = record
                .queries(below)
                .filter(|(kept, _)| *kept >= w)
                .map(|(_, rows)| rows)
                .ok_or_else(|| {
                    missing(below, format!("its latest {w} queries were not recorded"))
                })?;
            for chunk in rows {
                d.observe_queries(below, chunk.clone());
            }
        }
        Ok(seq)
    }
}
