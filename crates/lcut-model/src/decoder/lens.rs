//! The logit lens on the decoder: any hidden state through the model's own
//! final norm, LM head and final softcap, and the per-site statistics of
//! [`crate::lens`], block by block.

use candle_core::{DType, Device, Tensor};
use lcut_kernels::product::{Activations, matvec_concat};
use lcut_kernels::quant::MAX_BATCH;
use lcut_kernels::{Isa, ops};
use rayon::prelude::*;

use super::Decoder;
use crate::error::{ModelError, Result};
use crate::lens::{LENS_BLOCK_ELEMS, LensRecord, LogitSink};
use crate::lens_stats::{FinalRow, RowStats};

impl Decoder {
    /// Logits [rows, vocab] in f32 of hidden states [rows, hidden]: the
    /// final norm, the LM head and the final logit softcap (Gemma-2), as
    /// the model makes its own logits from its last layer's output. Of the
    /// last layer's output they are the model's logits; of any other
    /// hidden state, that state's logit lens.
    pub fn head_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let z = self
            .lm_head
            .forward(&self.final_norm.forward(hidden)?)?
            .to_dtype(DType::F32)?;
        Ok(match self.cfg.final_softcap {
            Some(c) => ((z / c)?.tanh()? * c)?,
            None => z,
        })
    }

    /// The lens of `positions` at every site: `sites[i]` holds the hidden
    /// states [n, hidden] of the n positions at site i (the embeddings,
    /// then each layer's output; the last site the last layer's). Each
    /// position's target is `targets[k]`, or, when `targets` is `None`, the
    /// token the last site ranks first. The logits are made in blocks of
    /// positions and of sites so that no block holds more than
    /// [`LENS_BLOCK_ELEMS`] of them (at least one site of one position) and
    /// reduced on the host, row by row in parallel ([`FinalRow`]);
    /// `on_logits`, when given, receives each position's lens logits
    /// [sites, vocab] (f32) in order.
    pub fn lens_records(
        &self,
        sites: &[Tensor],
        positions: &[usize],
        targets: Option<&[u32]>,
        mut on_logits: Option<LogitSink<'_>>,
    ) -> Result<Vec<LensRecord>> {
        let (n, s, v) = (positions.len(), sites.len(), self.cfg.vocab_size);
        if s == 0 || n == 0 {
            return Ok(Vec::new());
        }
        self.check_lens_input(sites, n, targets)?;
        let pos_block = (LENS_BLOCK_ELEMS / (s * v).max(1)).max(1);
        let mut out = Vec::with_capacity(n);
        let mut from = 0;
        while from < n {
            let len = pos_block.min(n - from);
            let rows = |h: &Tensor| h.narrow(0, from, len);
            let final_z = self.lens_head(&rows(&sites[s - 1])?)?;
            let finals: Vec<FinalRow> = final_z
                .par_chunks(v)
                .enumerate()
                .map(|(k, z)| FinalRow::new(z, targets.map(|t| t[from + k])))
                .collect();
            let site_block = (LENS_BLOCK_ELEMS / (len * v).max(1)).clamp(1, s);
            // stats[i][k]: site i, position from + k
            let mut stats: Vec<Vec<RowStats>> = Vec::with_capacity(s);
            let mut kept: Vec<Tensor> = Vec::new();
            let mut i = 0;
            while i < s {
                let k = site_block.min(s - i);
                let hidden = Tensor::cat(
                    &sites[i..i + k]
                        .iter()
                        .map(rows)
                        .collect::<candle_core::Result<Vec<_>>>()?,
                    0,
                )?;
                let host = self.lens_head(&hidden)?;
                // row r of the block is site i + r / len, position r % len
                let block: Vec<RowStats> = host
                    .par_chunks(v)
                    .enumerate()
                    .map(|(r, row)| finals[r % len].stats(row))
                    .collect();
                stats.extend(block.chunks(len).map(<[RowStats]>::to_vec));
                if on_logits.is_some() {
                    kept.push(Tensor::from_slice(&host, (k, len, v), &Device::Cpu)?);
                }
                i += k;
            }
            if let Some(f) = on_logits.as_deref_mut() {
                let z = Tensor::cat(&kept, 0)?;
                for k in 0..len {
                    f(positions[from + k], &z.narrow(1, k, 1)?.squeeze(1)?)?;
                }
            }
            out.extend(finals.iter().enumerate().map(|(k, f)| {
                LensRecord {
                    position: positions[from + k],
                    target: f.target,
                    logprob: stats.iter().map(|st| st[k].logprob).collect(),
                    rank: stats.iter().map(|st| st[k].above + 1).collect(),
                    top: stats.iter().map(|st| st[k].top).collect(),
                    // the last site is the final distribution itself
                    kl: (0..s)
                        .map(|i| if i + 1 == s { 0.0 } else { stats[i][k].kl })
                        .collect(),
                }
            }));
            from += len;
        }
        Ok(out)
    }

    /// Refuse sites that are not [n, hidden] or targets not one per position.
    fn check_lens_input(&self, sites: &[Tensor], n: usize, targets: Option<&[u32]>) -> Result<()> {
        for (i, h) in sites.iter().enumerate() {
            let (rows, width) = h.dims2()?;
            if rows != n || width != self.cfg.hidden_size {
                return Err(ModelError::LensInput {
                    detail: format!(
                        "site {i} holds [{rows}, {width}] hidden states, expected [{n}, {}]",
                        self.cfg.hidden_size
                    ),
                });
            }
        }
        match targets {
            Some(t) if t.len() != n => Err(ModelError::LensInput {
                detail: format!("{} targets for {n} positions", t.len()),
            }),
            _ => Ok(()),
        }
    }
}

impl Decoder {
    /// [`Decoder::head_logits`] of hidden states [rows, hidden] as one host
    /// vector, row-major: through the fused step's own final norm and LM
    /// head product (lcut's kernels, [`MAX_BATCH`] rows per pass over the
    /// head, as decode makes its logits) where the model has a step model
    /// and the rows are on the CPU, through the tensor path otherwise.
    fn lens_head(&self, hidden: &Tensor) -> Result<Vec<f32>> {
        let model = match self.step_model()? {
            Ok(m) if hidden.device().is_cpu() => m,
            _ => return Ok(self.head_logits(hidden)?.flatten_all()?.to_vec1()?),
        };
        let (n, d) = hidden.dims2()?;
        let x = hidden
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let v = model.lm_head.rows;
        let eps = self.cfg.rms_norm_eps as f32;
        let held = model.hold();
        let head = [model.lm_head.view(&held)];
        let (mut acts, mut scratch, mut tmp) = (Activations::new(), Vec::new(), Vec::new());
        let mut z = vec![0f32; n * v];
        for (rows, out) in x.chunks(MAX_BATCH * d).zip(z.chunks_mut(MAX_BATCH * v)) {
            let k = rows.len() / d;
            ops::rms_norm(rows, &model.final_norm, eps, acts.fill(k, d))?;
            matvec_concat(Isa::detect(), &head, &mut acts, out, &mut scratch)?;
            for row in out.chunks_exact_mut(v) {
                model.lm_head.unpermute(row, &mut tmp);
                model.lm_head.add_bias(row);
            }
        }
        if let Some(c) = self.cfg.final_softcap {
            ops::softcap_in_place(&mut z, c as f32);
        }
        Ok(z)
    }
}
