//! The trace of one prompt under a full-depth greedy run.

use ndarray::{Array3, Zip};
use serde::{Deserialize, Serialize};

use crate::bins::bin_edges;
use crate::error::TraceError;
use crate::floats::Series;
use crate::knockout::KnockoutTrace;
use crate::lens::LensTrace;
use crate::routing::RoutingTrace;
use crate::tensor::{Tensor2, Tensor3};

/// Where a prompt's phases begin, given when a trace is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader {
    /// Position of the prompt in the prompts file (0-based); orders merged shards.
    pub index: usize,
    /// The prompt's id.
    pub id: String,
    /// Token strings of the prompt (for hover text); may be empty.
    pub prompt_tokens: Vec<String>,
    /// Number of prompt tokens P.
    pub prompt_len: usize,
    /// The decode start s.
    pub decode_start: usize,
    /// Number of anchor tokens |A| (the prefix `0..anchor_len`).
    pub anchor_len: usize,
}

/// Everything recorded for one prompt of a full-depth greedy run.
///
/// Per-(layer, step, head) tensors have shape `[num_layers, num_steps, num_heads]`.
/// Decode step `k` is the query at `query_positions[k]`, the token whose
/// output is `generated[k]`. Its post-softmax attention row `a` (keys
/// `0..=t`) splits into:
/// `bos = a[0]`, `anchor = Σ a[1..anchor_len]` (0 for the BoS-only anchor),
/// `prefill = Σ a[max(anchor_len, 1)..s]`, `decode = Σ a[s..t]`,
/// `self_mass = a[t]`; the five sum to 1.
///
/// `prefill_entropy` is stored RAW, in nats, of `p_j = a[j] / prefill` over the
/// prefill positions, and is NaN where the prefill mass is 0.
/// [`PromptTrace::entropy_normalised`] divides by `ln(n_prefill)`.
///
/// Curvatures have `num_layers + 1` entries: index 0 is the embeddings, index
/// `l + 1` the output of layer `l`; radians (mean turning angle), NaN where the
/// span has fewer than three usable tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptTrace {
    /// Position of the prompt in the prompts file (0-based); orders merged shards.
    pub index: usize,
    /// The prompt's id.
    pub id: String,
    /// Token strings of the prompt (for hover text); empty, or `prompt_len` long.
    pub prompt_tokens: Vec<String>,
    /// Number of prompt tokens P.
    pub prompt_len: usize,
    /// The decode start s: first decode-phase token (first token of the chat
    /// template's generation prompt, or the last prompt token for a raw prompt).
    pub decode_start: usize,
    /// Number of anchor tokens |A| (the prefix `0..anchor_len`).
    pub anchor_len: usize,
    /// The generated token strings, one per decode step.
    pub generated: Vec<String>,
    /// The generated token ids, one per decode step.
    pub generated_ids: Vec<u32>,
    /// The query position of each decode step (strictly increasing, `>= decode_start`).
    pub query_positions: Vec<usize>,
    /// Number of layers L.
    pub num_layers: usize,
    /// Number of query heads H.
    pub num_heads: usize,
    /// Attention on position 0 (BoS).
    pub bos: Tensor3,
    /// Attention on anchors other than position 0.
    pub anchor: Tensor3,
    /// Attention on non-anchor prompt tokens before the decode start.
    pub prefill: Tensor3,
    /// Attention on decode-phase tokens before the query.
    pub decode: Tensor3,
    /// Attention of the query on itself.
    pub self_mass: Tensor3,
    /// Raw conditional prefill entropy in nats (NaN where the prefill mass is 0).
    pub prefill_entropy: Tensor3,
    /// Attention on no key: the learned sink's share of each head's softmax
    /// (gpt-oss), beside BoS's and the prompt's; absent for a model without
    /// sinks (and in reports written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<Tensor3>,
    /// Layers without attention rows (Qwen3.5's linear-attention layers),
    /// ascending, whose masses are the layer's state split: `prefill` holds
    /// the share of the query's output that the prompt's state gives (BoS
    /// and anchors included), `decode` the share the decode-phase tokens
    /// give (the query's own included); `bos`, `anchor` and `self_mass` are
    /// 0, the entropy NaN, the prompt attention map 0. Empty where every
    /// layer attends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_split_layers: Vec<usize>,
    /// `[num_layers, num_bins]`: attention mass that decode queries pay to each
    /// prompt bin (summed over the bin's positions), averaged over heads and steps.
    pub prompt_attention: Tensor2,
    /// Edges of the prompt bins, from [`crate::bin_edges`].
    pub bin_edges: Vec<usize>,
    /// Curvature of the prompt span per layer (`num_layers + 1` entries).
    pub curvature_prompt: Series,
    /// Curvature of the generated span per layer (`num_layers + 1` entries).
    pub curvature_generated: Series,
    /// The logit lens of each decode step (`[num_layers + 1, steps]`), when
    /// the run recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lens: Option<LensTrace>,
    /// Causal prompt knockout per band of layers, teacher-forced on the
    /// full model's continuation, when the run measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knockout: Option<KnockoutTrace>,
    /// How a mixture-of-experts model routed each decode step at its sparse
    /// layers; absent for a dense model (and in reports written before
    /// routing was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingTrace>,
}

/// `raw / ln(n_prefill)`: entropy normalised to `[0, 1]`; NaN when fewer than two
/// prefill tokens (no choice to be selective about) or when `raw` is NaN.
pub fn normalised_entropy(raw: f32, n_prefill: usize) -> f32 {
    if n_prefill < 2 {
        f32::NAN
    } else {
        (f64::from(raw) / (n_prefill as f64).ln()) as f32
    }
}

/// `state_split_layers` (of a trace or of curves) must rise strictly and
/// name layers of a model of `num_layers`.
pub(crate) fn check_state_split_layers(layers: &[usize], num_layers: usize) -> Result<(), String> {
    if layers.iter().any(|&s| s >= num_layers) || layers.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "`state_split_layers` must rise strictly and name layers below `num_layers` {num_layers}"
        ));
    }
    Ok(())
}

impl PromptTrace {
    /// A trace with every array allocated: masses and attention 0, entropies and
    /// curvatures NaN, `num_steps` empty generated strings, ids 0 and query
    /// positions `decode_start..`. The recorder overwrites them.
    pub fn zeroed(
        header: TraceHeader,
        num_layers: usize,
        num_heads: usize,
        num_steps: usize,
        max_bins: usize,
    ) -> Self {
        let shape = [num_layers, num_steps, num_heads];
        let edges = bin_edges(header.prompt_len, max_bins);
        let n_bins = edges.len().saturating_sub(1);
        Self {
            index: header.index,
            id: header.id,
            prompt_tokens: header.prompt_tokens,
            prompt_len: header.prompt_len,
            decode_start: header.decode_start,
            anchor_len: header.anchor_len,
            generated: vec![String::new(); num_steps],
            generated_ids: vec![0; num_steps],
            query_positions: (header.decode_start..header.decode_start + num_steps).collect(),
            num_layers,
            num_heads,
            bos: Tensor3::zeros(shape),
            anchor: Tensor3::zeros(shape),
            prefill: Tensor3::zeros(shape),
            decode: Tensor3::zeros(shape),
            self_mass: Tensor3::zeros(shape),
            prefill_entropy: Tensor3::filled(shape, f32::NAN),
            sink: None,
            state_split_layers: Vec::new(),
            prompt_attention: Tensor2::zeros([num_layers, n_bins]),
            bin_edges: edges,
            curvature_prompt: Series::nan(num_layers + 1),
            curvature_generated: Series::nan(num_layers + 1),
            lens: None,
            knockout: None,
            routing: None,
        }
    }

    /// Number of decode steps recorded.
    pub fn num_steps(&self) -> usize {
        self.query_positions.len()
    }

    /// Number of prompt-position bins.
    pub fn num_bins(&self) -> usize {
        self.bin_edges.len().saturating_sub(1)
    }

    /// First prefill position: `max(anchor_len, 1)` (position 0 is always BoS).
    pub fn prefill_start(&self) -> usize {
        self.anchor_len.max(1)
    }

    /// Number of prefill tokens `decode_start - max(anchor_len, 1)` (0 if negative).
    pub fn prefill_len(&self) -> usize {
        self.decode_start.saturating_sub(self.prefill_start())
    }

    /// The conditional prefill entropy normalised by `ln(prefill_len)`, in `[0, 1]`
    /// (NaN where the raw value is NaN or there are fewer than two prefill tokens).
    pub fn entropy_normalised(&self) -> Array3<f32> {
        let n = self.prefill_len();
        self.prefill_entropy
            .view()
            .mapv(|h| normalised_entropy(h, n))
    }

    /// The five phase tensors in order bos, anchor, prefill, decode, self.
    pub fn phase_tensors(&self) -> [&Tensor3; 5] {
        [
            &self.bos,
            &self.anchor,
            &self.prefill,
            &self.decode,
            &self.self_mass,
        ]
    }

    /// Checks that every length and shape agrees with the header fields.
    /// `context` names the file or run, for the message.
    pub fn validate(&self, context: &str) -> Result<(), TraceError> {
        self.check_positions()
            .and_then(|()| self.check_shapes())
            .map_err(|msg| {
                let ctx = format!("{context}: prompt {:?} (index {})", self.id, self.index);
                TraceError::invalid(ctx, msg)
            })
    }

    /// The sizes and positions of the header: at least one layer and head,
    /// the decode start inside the prompt and after the anchors, one token
    /// string per prompt token (or none), one generated token and one
    /// strictly increasing query position per step.
    fn check_positions(&self) -> Result<(), String> {
        let (l, h, t) = (self.num_layers, self.num_heads, self.num_steps());
        if l == 0 || h == 0 {
            return Err(format!(
                "`num_layers` {l} and `num_heads` {h} must be at least 1"
            ));
        }
        if self.prompt_len == 0 || self.decode_start >= self.prompt_len {
            return Err(format!(
                "`decode_start` {} must be inside the prompt of `prompt_len` {} tokens",
                self.decode_start, self.prompt_len
            ));
        }
        if self.anchor_len > self.decode_start {
            return Err(format!(
                "`anchor_len` {} reaches past `decode_start` {}",
                self.anchor_len, self.decode_start
            ));
        }
        if !self.prompt_tokens.is_empty() && self.prompt_tokens.len() != self.prompt_len {
            return Err(format!(
                "`prompt_tokens` has {} entries, expected 0 or `prompt_len` {}",
                self.prompt_tokens.len(),
                self.prompt_len
            ));
        }
        if self.generated.len() != t || self.generated_ids.len() != t {
            return Err(format!(
                "`generated` ({}) and `generated_ids` ({}) must have one entry per step ({t} `query_positions`)",
                self.generated.len(),
                self.generated_ids.len()
            ));
        }
        let first_ok = self
            .query_positions
            .first()
            .is_none_or(|&q| q >= self.decode_start);
        if !first_ok || self.query_positions.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "`query_positions` must be strictly increasing and start at or after `decode_start` {}",
                self.decode_start
            ));
        }
        Ok(())
    }

    /// The shapes of the tensors and series against the header: the phase
    /// masses (the sink's too) [L, steps, H], bin edges from 0 to the prompt length, the
    /// prompt attention map [L, bins], the curvature series L + 1 long.
    fn check_shapes(&self) -> Result<(), String> {
        let (l, h, t) = (self.num_layers, self.num_heads, self.num_steps());
        let names = [
            "bos",
            "anchor",
            "prefill",
            "decode",
            "self_mass",
            "prefill_entropy",
        ];
        let tensors = self
            .phase_tensors()
            .into_iter()
            .chain([&self.prefill_entropy]);
        let sink = self.sink.iter().map(|s| ("sink", s));
        for (name, tensor) in names.into_iter().zip(tensors).chain(sink) {
            if tensor.shape() != [l, t, h] {
                return Err(format!(
                    "`{name}` has shape {:?}, expected [num_layers, steps, num_heads] = {:?}",
                    tensor.shape(),
                    [l, t, h]
                ));
            }
        }
        check_state_split_layers(&self.state_split_layers, l)?;
        let e = &self.bin_edges;
        if e.first() != Some(&0)
            || e.last() != Some(&self.prompt_len)
            || e.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(format!(
                "`bin_edges` must rise strictly from 0 to `prompt_len` {}",
                self.prompt_len
            ));
        }
        if self.prompt_attention.shape() != [l, self.num_bins()] {
            return Err(format!(
                "`prompt_attention` has shape {:?}, expected [num_layers, bins] = {:?}",
                self.prompt_attention.shape(),
                [l, self.num_bins()]
            ));
        }
        for (name, c) in [
            ("curvature_prompt", &self.curvature_prompt),
            ("curvature_generated", &self.curvature_generated),
        ] {
            // checked: `num_layers` is read from the file and may be huge
            if l.checked_add(1) != Some(c.len()) {
                return Err(format!(
                    "`{name}` has {} entries, expected num_layers + 1 = {}",
                    c.len(),
                    l as u128 + 1
                ));
            }
        }
        if let Some(lens) = &self.lens {
            lens.check(l.saturating_add(1), t)?;
        }
        if let Some(knockout) = &self.knockout {
            knockout.check(l)?;
        }
        if let Some(routing) = &self.routing {
            routing.check(l, t)?;
        }
        Ok(())
    }

    /// Sum of the five phase masses and the sink's share (where the trace
    /// holds it) at every (layer, step, head); 1 for a complete attention
    /// row.
    pub fn mass_totals(&self) -> Array3<f32> {
        let mut total = self.bos.to_array();
        for t in self.phase_tensors()[1..].iter().copied().chain(&self.sink) {
            Zip::from(&mut total)
                .and(&t.view())
                .for_each(|a, &b| *a += b);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(prompt_len: usize) -> TraceHeader {
        TraceHeader {
            index: 3,
            id: "p3".into(),
            prompt_tokens: vec![],
            prompt_len,
            decode_start: prompt_len - 1,
            anchor_len: 1,
        }
    }

    #[test]
    fn zeroed_trace_is_valid() {
        let t = PromptTrace::zeroed(header(50), 4, 2, 5, 8);
        t.validate("test").unwrap();
        assert_eq!(t.num_steps(), 5);
        assert_eq!(t.num_bins(), 8);
        assert_eq!(t.prefill_len(), 48);
        assert_eq!(t.mass_totals().shape(), &[4, 5, 2]);
    }

    #[test]
    fn validation_names_the_field() {
        let mut t = PromptTrace::zeroed(header(10), 2, 2, 3, 4);
        t.prefill = Tensor3::zeros([2, 3, 3]);
        let msg = t.validate("run.json").unwrap_err().to_string();
        assert!(
            msg.contains("`prefill`") && msg.contains("run.json"),
            "{msg}"
        );

        let mut t = PromptTrace::zeroed(header(10), 2, 2, 3, 4);
        t.query_positions = vec![9, 9, 10];
        let msg = t.validate("x").unwrap_err().to_string();
        assert!(msg.contains("query_positions"), "{msg}");

        let mut t = PromptTrace::zeroed(header(10), 2, 2, 3, 4);
        t.curvature_generated = Series::nan(2);
        assert!(t.validate("x").is_err());
    }

    #[test]
    fn normalised_entropy_bounds() {
        let n = 8usize;
        assert!((normalised_entropy((n as f32).ln(), n) - 1.0).abs() < 1e-6);
        assert_eq!(normalised_entropy(0.0, n), 0.0);
        assert!(normalised_entropy(0.0, 1).is_nan());
        let mut t = PromptTrace::zeroed(header(10), 1, 1, 1, 4);
        t.prefill_entropy.view_mut()[[0, 0, 0]] = (8f32).ln();
        assert!((t.entropy_normalised()[[0, 0, 0]] - 1.0).abs() < 1e-6);
    }
}
