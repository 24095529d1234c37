//! The diagnostic probe: phase masses and prefill entropy per decode step,
//! attention onto binned prompt positions, and per-layer curvature of the
//! prompt and generated spans, all reduced as they are computed.

use candle_core::{DType, Tensor};
use lcut_diag::CurvatureAccumulator;
use lcut_model::probes::{PhaseMassProbe, QueryMasses};
use lcut_model::{AttentionView, ModelError, Probe, ResidualSite};
use lcut_policy::TokenPhases;
use ndarray::ArrayView1;

type ProbeResult<T> = std::result::Result<T, ModelError>;

/// Records what a diagnostic trace needs while a full-depth generation runs.
pub struct DiagnosticProbe {
    masses: PhaseMassProbe,
    first_step: usize,
    prompt_len: usize,
    anchor_len: usize,
    prompt_acc: Vec<Option<Tensor>>,
    /// `[layer + 1]` accumulators of the prompt span (index 0: embeddings).
    pub curvature_prompt: Vec<CurvatureAccumulator>,
    /// `[layer + 1]` accumulators of the generated span.
    pub curvature_generated: Vec<CurvatureAccumulator>,
    width_error: Option<String>,
}

impl DiagnosticProbe {
    /// A probe for a prompt of `prompt_len` tokens with these phases.
    pub fn new(phases: TokenPhases, prompt_len: usize, num_layers: usize) -> Self {
        let first_step = prompt_len - 1;
        Self {
            masses: PhaseMassProbe::new(phases).starting_at(first_step),
            first_step,
            prompt_len,
            anchor_len: phases.anchor_len(),
            prompt_acc: vec![None; num_layers],
            curvature_prompt: vec![CurvatureAccumulator::new(); num_layers + 1],
            curvature_generated: vec![CurvatureAccumulator::new(); num_layers + 1],
            width_error: None,
        }
    }

    /// The per-(layer, query) masses recorded so far.
    pub fn records(&self) -> &[QueryMasses] {
        &self.masses.records
    }

    /// Position of the first decode step's query (the last prompt token).
    pub fn first_step(&self) -> usize {
        self.first_step
    }

    /// An inconsistency met while recording, if any.
    pub fn error(&self) -> Option<&str> {
        self.width_error.as_deref()
    }

    /// Attention onto each prompt position, summed over heads and this
    /// chunk's queries, added to a per-layer accumulator that stays on the
    /// device: one [P] vector per layer, copied out once per prompt.
    fn accumulate_prompt_attention(&mut self, view: &AttentionView<'_>) -> ProbeResult<()> {
        // full depth: keys are 0..=q, so prompt positions are the first columns
        let prompt_cols = view.key_positions.partition_point(|&k| k < self.prompt_len);
        if prompt_cols != self.prompt_len {
            return Ok(());
        }
        let per_key = view
            .probs
            .to_dtype(DType::F32)?
            .narrow(2, 0, prompt_cols)?
            .sum(0)?
            .sum(0)?;
        let acc = &mut self.prompt_acc[view.layer];
        *acc = Some(match acc.take() {
            Some(a) => (a + per_key)?,
            None => per_key,
        });
        Ok(())
    }

    /// `[layer][bin]`: attention summed over heads, steps and the positions
    /// of each bin (divide by heads x steps for the mean).
    pub fn prompt_bin_sums(&self, edges: &[usize]) -> ProbeResult<Vec<Vec<f32>>> {
        self.prompt_acc
            .iter()
            .map(|acc| match acc {
                Some(a) => Ok(lcut_trace::bin_sums(&a.to_vec1::<f32>()?, edges)),
                None => Ok(vec![0.0; edges.len().saturating_sub(1)]),
            })
            .collect()
    }
}

impl Probe for DiagnosticProbe {
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        Some(self.first_step)
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> ProbeResult<()> {
        self.masses.on_attention(view)?;
        self.accumulate_prompt_attention(&view)
    }

    fn wants_residual(&self, _site: ResidualSite) -> bool {
        true
    }

    fn on_residual(
        &mut self,
        site: ResidualSite,
        positions: &[usize],
        hidden: &Tensor,
    ) -> ProbeResult<()> {
        let index = match site {
            ResidualSite::Embeddings => 0,
            ResidualSite::Layer(l) => l + 1,
        };
        let rows: Vec<Vec<f32>> = hidden.to_dtype(DType::F32)?.to_vec2()?;
        for (row, &pos) in rows.iter().zip(positions) {
            let acc = if pos < self.anchor_len {
                continue;
            } else if pos < self.prompt_len {
                &mut self.curvature_prompt[index]
            } else {
                &mut self.curvature_generated[index]
            };
            if let Err(e) = acc.push(ArrayView1::from(row.as_slice())) {
                self.width_error.get_or_insert(e.to_string());
            }
        }
        Ok(())
    }
}
