//! The staged prefill of a policy that decides at stage cuts (SlimInfer):
//! every prompt token passes the layer below a cut before any enters the
//! cut, and the policy takes the cut's decision in between from that
//! layer's keys.

use candle_core::DType;
use lcut_policy::HostKeys;

use super::{ChunkOutput, Decoder, LogitRows};
use crate::error::Result;
use crate::probe::Probe;
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
}
