//! SlimInfer in the decoder: the staged prefill (every prompt token passes
//! a cut's decision layer before any enters the cut) and the decode-time
//! decisions that move each cut's active blocks.

use candle_core::{DType, Tensor};

use super::score::{BlockSummaries, HostKeys, top_blocks};
use super::{CutRecord, Pending, StepRecord};
use crate::decoder::{ChunkOutput, Decoder, LogitRows, Sequence};
use crate::error::Result;
use crate::probe::Probe;

impl Decoder {
    /// A prompt chunk of a SlimInfer sequence whose cuts are not decided
    /// yet. It runs the layers below the first cut and waits; the chunk
    /// that reaches the decode phase runs the stages: at each cut, score
    /// the blocks, keep the best, and carry the surviving states of every
    /// waiting chunk through the cut's layers, chunk by chunk.
    pub(crate) fn slim_prefill(
        &self,
        seq: &mut Sequence,
        hidden: Tensor,
        present: Vec<usize>,
        last: usize,
        rows: LogitRows,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<ChunkOutput> {
        let cuts = seq
            .policy()
            .slim()
            .map(|p| p.cuts().to_vec())
            .unwrap_or_default();
        let reaches_decode = last >= seq.phases().decode_start();
        let (hidden, positions) =
            self.run_layers(seq, 0..cuts[0], hidden, present, false, probe)?;
        let run = seq.slim.as_mut().expect("a SlimInfer sequence");
        run.pending.push(Pending { hidden, positions });
        if !reaches_decode {
            return Ok(ChunkOutput {
                logits: None,
                positions: vec![],
            });
        }
        let num_layers = self.config().num_layers;
        for (i, &cut) in cuts.iter().enumerate() {
            self.decide_cut(seq, i)?;
            let end = cuts.get(i + 1).copied().unwrap_or(num_layers);
            let waiting = std::mem::take(&mut seq.slim.as_mut().expect("slim").pending);
            let mut carried = Vec::with_capacity(waiting.len());
            for chunk in waiting {
                let (hidden, positions) =
                    self.run_layers(seq, cut..end, chunk.hidden, chunk.positions, false, probe)?;
                if !positions.is_empty() {
                    carried.push(Pending { hidden, positions });
                }
            }
            seq.slim.as_mut().expect("slim").pending = carried;
        }
        let mut done = std::mem::take(&mut seq.slim.as_mut().expect("slim").pending);
        // the chunk that reached the decode phase is the last one; its
        // decode-phase tokens exist at every layer
        match done.pop() {
            Some(chunk) if chunk.positions.last() == Some(&last) => {
                self.logits(&chunk.hidden, &chunk.positions, last, rows)
            }
            _ => Ok(ChunkOutput {
                logits: None,
                positions: vec![],
            }),
        }
    }

    /// The keys of layer `layer` on the host, [kv_heads][tokens][head_dim].
    fn host_keys(seq: &Sequence, layer: usize) -> Result<(Vec<usize>, Vec<f32>)> {
        let cache = &seq.caches()[layer];
        match cache.kv()? {
            Some((k, _)) => Ok((
                cache.positions().to_vec(),
                k.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
            )),
            None => Ok((vec![], vec![])),
        }
    }

    /// Score cut `i`'s candidate blocks on the keys of its decision layer
    /// and the window's mean query; keep the best (the prefill's decision).
    fn decide_cut(&self, seq: &mut Sequence, i: usize) -> Result<()> {
        let cfg = self.config();
        let run = seq.slim.as_ref().expect("slim");
        let params = *run.selection().params();
        let cut = params.cuts()[i];
        let (positions, data) = Self::host_keys(seq, cut - 1)?;
        let keys = HostKeys {
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            positions: &positions,
            data: &data,
        };
        let sel = run.selection();
        let domain = sel.candidate_domain(i);
        let blocks: Vec<_> = domain
            .iter()
            .map(|&b| (b, sel.block_positions(b)))
            .collect();
        let o = params.options;
        let summaries = BlockSummaries::build(&keys, &blocks, o.score, o.block, o.unit);
        let query = run.windows[i].mean();
        let scores = summaries.score(&query, cfg.num_heads, &domain);
        let decode_start = seq.phases().decode_start();
        let kept = top_blocks(&scores, params.kept_blocks(i, decode_start));
        let run = seq.slim.as_mut().expect("slim");
        run.selection.decide(i, &kept);
        run.summaries[i] = summaries;
        run.cut_records.push(CutRecord {
            layer: cut,
            budget_tokens: params.budgets()[i].tokens(decode_start),
            scores,
            kept,
            kept_tokens: run.selection.kept_tokens(i),
        });
        Ok(())
    }

    /// After decision layer `layer` of a decode step: score the cut's
    /// candidates among the blocks the token read below it and let the
    /// overlap rule move the active set. Records one step per token.
    pub(crate) fn slim_decode_decision(&self, seq: &mut Sequence, layer: usize) -> Result<()> {
        let heads = self.config().num_heads;
        let position = seq.len();
        let decode_start = seq.phases().decode_start();
        let decode_tokens = (position + 1).saturating_sub(decode_start);
        let Some(run) = seq.slim.as_mut() else {
            return Ok(());
        };
        let Some(i) = run.cut_decided_at(layer) else {
            return Ok(());
        };
        let sel = &run.selection;
        let domain = sel.candidate_domain(i);
        let scores = run.summaries[i].score(&run.windows[i].mean(), heads, &domain);
        let k = sel.params().kept_blocks(i, decode_start);
        let traffic = run.selection.step(i, &top_blocks(&scores, k));
        if i == 0 {
            run.steps.push(StepRecord {
                position,
                cuts: Vec::new(),
                resident_token_layers: 0,
                held_token_layers: 0,
            });
        }
        let held = run.selection.held_token_layers(decode_tokens);
        let resident = run.selection.resident_token_layers(decode_tokens);
        if let Some(step) = run.steps.last_mut() {
            step.cuts.push(traffic);
            step.held_token_layers = held;
            step.resident_token_layers = resident;
        }
        Ok(())
    }
}
