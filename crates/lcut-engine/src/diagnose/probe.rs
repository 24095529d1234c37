//! The diagnostic probe: phase masses and prefill entropy per decode step,
//! attention onto binned prompt positions, per-layer curvature of the
//! prompt and generated spans, on a mixture-of-experts model the routing of
//! every decode step and, when asked, the logit lens of every decode step,
//! all reduced as they are computed.

use candle_core::{DType, Tensor};
use lcut_model::probes::{PhaseMassProbe, QueryMasses};
use lcut_model::{
    AttentionView, LensProbe, LensRecord, ModelError, Probe, ResidualSite, RoutingView,
};
use lcut_policy::TokenPhases;

use super::curvature::DeviceCurvature;
use super::routing::RoutingProbe;

type ProbeResult<T> = std::result::Result<T, ModelError>;

/// Records what a diagnostic trace needs while a full-depth generation runs.
pub struct DiagnosticProbe<'m> {
    masses: PhaseMassProbe,
    lens: Option<LensProbe<'m>>,
    routing: Option<RoutingProbe>,
    first_step: usize,
    prompt_len: usize,
    anchor_len: usize,
    prompt_acc: Vec<Option<Tensor>>,
    /// `[layer + 1]` accumulators of the prompt span (index 0: embeddings).
    pub curvature_prompt: Vec<DeviceCurvature>,
    /// `[layer + 1]` accumulators of the generated span.
    pub curvature_generated: Vec<DeviceCurvature>,
}

impl<'m> DiagnosticProbe<'m> {
    /// A probe for a prompt of `prompt_len` tokens with these phases.
    pub fn new(phases: TokenPhases, prompt_len: usize, num_layers: usize) -> Self {
        let first_step = prompt_len - 1;
        Self {
            masses: PhaseMassProbe::new(phases).starting_at(first_step),
            lens: None,
            routing: None,
            first_step,
            prompt_len,
            anchor_len: phases.anchor_len(),
            prompt_acc: vec![None; num_layers],
            curvature_prompt: vec![DeviceCurvature::new(); num_layers + 1],
            curvature_generated: vec![DeviceCurvature::new(); num_layers + 1],
        }
    }

    /// Also record the logit lens of every decode step (from the last
    /// prompt token on) with `lens`.
    pub fn with_lens(mut self, lens: LensProbe<'m>) -> Self {
        self.lens = Some(lens);
        self
    }

    /// Also record each linear-attention layer's state split as its masses,
    /// in `heads` columns (a model with linear layers: Qwen3.5).
    pub fn with_state_split(mut self, heads: usize) -> Self {
        self.masses = self.masses.with_state_split(heads);
        self
    }

    /// Also record the routing of every decode step (from the last prompt
    /// token on) at each layer of experts.
    pub fn with_routing(mut self) -> Self {
        self.routing = Some(RoutingProbe::new(self.first_step));
        self
    }

    /// The routing recorded so far, when the probe records it.
    pub fn routing(&self) -> Option<&RoutingProbe> {
        self.routing.as_ref()
    }

    /// The logit lens recorded so far, one record per decode step (none
    /// without a lens).
    pub fn lens_records(&self) -> &[LensRecord] {
        self.lens.as_ref().map_or(&[], |l| &l.records)
    }

    /// The lens probe, to take its kept logits.
    pub fn lens_mut(&mut self) -> Option<&mut LensProbe<'m>> {
        self.lens.as_mut()
    }

    /// The per-(layer, query) masses recorded so far.
    pub fn records(&self) -> &[QueryMasses] {
        &self.masses.records
    }

    /// Position of the first decode step's query (the last prompt token).
    pub fn first_step(&self) -> usize {
        self.first_step
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

impl Probe for DiagnosticProbe<'_> {
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        Some(self.first_step)
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> ProbeResult<()> {
        self.masses.on_attention(view)?;
        self.accumulate_prompt_attention(&view)
    }

    fn linear_split_from(&self, layer: usize) -> Option<usize> {
        self.masses.linear_split_from(layer)
    }

    fn on_linear_split(
        &mut self,
        layer: usize,
        split: &lcut_model::LinearSplit,
    ) -> ProbeResult<()> {
        self.masses.on_linear_split(layer, split)
    }

    fn wants_routing(&self, _layer: usize) -> bool {
        self.routing.is_some()
    }

    fn on_routing(&mut self, view: RoutingView<'_>) -> ProbeResult<()> {
        match self.routing.as_mut() {
            Some(r) => r.on_routing(view),
            None => Ok(()),
        }
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
        if let Some(lens) = self.lens.as_mut() {
            lens.on_residual(site, positions, hidden)?;
        }
        let index = match site {
            ResidualSite::Embeddings => 0,
            ResidualSite::Layer(l) => l + 1,
        };
        // positions ascend: anchors, then the prompt span, then generated tokens
        let prompt_from = positions.partition_point(|&p| p < self.anchor_len);
        let generated_from = positions.partition_point(|&p| p < self.prompt_len);
        let spans = [
            (
                &mut self.curvature_prompt[index],
                prompt_from,
                generated_from,
            ),
            (
                &mut self.curvature_generated[index],
                generated_from,
                positions.len(),
            ),
        ];
        for (acc, from, to) in spans {
            if to > from {
                acc.push_rows(&hidden.narrow(0, from, to - from)?)?;
            }
        }
        Ok(())
    }
}
