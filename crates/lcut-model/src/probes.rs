//! Ready-made probes: a full recorder for small reference runs and a
//! phase-mass probe that reduces attention on the device.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use lcut_policy::TokenPhases;

use crate::error::Result;
use crate::linear_attention::LinearSplit;
use crate::probe::{AttentionView, Probe, ResidualSite, RoutingView};

/// Records every layer's full attention [heads, T, T] and residual stream
/// [T, hidden] on the host. Meant for short sequences (parity checks,
/// `lcut forward`): its memory grows with T^2. With `num_heads == 0` it
/// records residuals only.
#[derive(Debug, Clone)]
pub struct RecordingProbe {
    total_len: usize,
    num_heads: usize,
    hidden_size: usize,
    /// Per layer, attention [heads, T, T] row-major; rows of queries never seen stay 0.
    pub attention: Vec<Vec<f32>>,
    /// The embeddings entering layer 0 [T, hidden].
    pub embeddings: Vec<f32>,
    /// Per layer, the residual stream after it [T, hidden].
    pub layer_out: Vec<Vec<f32>>,
    /// Every token's routing at every sparse layer, when asked
    /// ([`RecordingProbe::with_routing`]).
    pub routing: Option<RoutingRecord>,
}

/// The router's choice for every token of a sequence at every sparse layer
/// of a mixture-of-experts model, as a recording run saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingRecord {
    /// The sparse layers, ascending: the arrays' first axis.
    pub layers: Vec<usize>,
    /// Experts in each sparse layer (`E`).
    pub num_experts: usize,
    /// Experts each token runs (`k`).
    pub top_k: usize,
    /// Tokens of the sequence (`T`).
    pub tokens: usize,
    /// [layers, T, E]: the router's probability of each expert (its
    /// softmax); NaN for a token that did not reach the layer.
    pub probs: Vec<f32>,
    /// [layers, T, k]: the experts each token runs, most probable first;
    /// -1 for a token that did not reach the layer.
    pub experts: Vec<i64>,
    /// [layers, T, k]: their weights in the layer's output (renormalised
    /// where the model does); NaN for a token that did not reach the layer.
    pub weights: Vec<f32>,
}

impl RoutingRecord {
    /// An empty record of `tokens` tokens for the sparse layers of `cfg`
    /// (`None` for a dense model).
    pub fn for_model(cfg: &crate::ModelConfig, tokens: usize) -> Option<Self> {
        let e = cfg.experts.as_ref()?;
        let layers: Vec<usize> = (0..cfg.num_layers)
            .filter(|&l| cfg.sparse_layers.get(l).copied().unwrap_or(false))
            .collect();
        let n = layers.len() * tokens;
        Some(Self {
            num_experts: e.num_experts,
            top_k: e.top_k,
            tokens,
            probs: vec![f32::NAN; n * e.num_experts],
            experts: vec![-1; n * e.top_k],
            weights: vec![f32::NAN; n * e.top_k],
            layers,
        })
    }

    /// Sparse layer `layers[i]`'s rows of the tokens at `positions` (`i`
    /// below `layers.len()`, `positions` within `0..tokens`): the
    /// probabilities [n, E], the experts [n, k] and their weights [n, k].
    pub fn layer_rows(
        &self,
        i: usize,
        positions: std::ops::Range<usize>,
    ) -> (Vec<f32>, Vec<i64>, Vec<f32>) {
        let (t, e, k) = (self.tokens, self.num_experts, self.top_k);
        let (lo, hi) = (i * t + positions.start, i * t + positions.end);
        (
            self.probs[lo * e..hi * e].to_vec(),
            self.experts[lo * k..hi * k].to_vec(),
            self.weights[lo * k..hi * k].to_vec(),
        )
    }

    /// Record one chunk's routing at one layer (positions past `tokens`,
    /// and layers that are not sparse, are left out).
    fn record(&mut self, view: &RoutingView<'_>) {
        let Some(row) = self.layers.iter().position(|&l| l == view.layer) else {
            return;
        };
        let (t, e, k) = (self.tokens, self.num_experts, self.top_k);
        let r = view.routing;
        for (i, &p) in view.positions.iter().enumerate().filter(|&(_, &p)| p < t) {
            let at = row * t + p;
            let probs = &r.probs[i];
            self.probs[at * e..at * e + probs.len().min(e)]
                .copy_from_slice(&probs[..probs.len().min(e)]);
            for (j, (&x, &w)) in r.experts[i].iter().zip(&r.weights[i]).take(k).enumerate() {
                self.experts[at * k + j] = x as i64;
                self.weights[at * k + j] = w;
            }
        }
    }
}

impl RecordingProbe {
    /// A recorder for a sequence of `total_len` tokens.
    pub fn new(num_layers: usize, num_heads: usize, hidden_size: usize, total_len: usize) -> Self {
        Self {
            total_len,
            num_heads,
            hidden_size,
            attention: vec![vec![0.0; num_heads * total_len * total_len]; num_layers],
            embeddings: vec![0.0; total_len * hidden_size],
            layer_out: vec![vec![0.0; total_len * hidden_size]; num_layers],
            routing: None,
        }
    }

    /// This recorder keeping every token's routing too (a mixture-of-experts
    /// model's; nothing for a dense `cfg`).
    pub fn with_routing(mut self, cfg: &crate::ModelConfig) -> Self {
        self.routing = RoutingRecord::for_model(cfg, self.total_len);
        self
    }
}

impl Probe for RecordingProbe {
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        (self.num_heads > 0).then_some(0)
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> Result<()> {
        let probs: Vec<Vec<Vec<f32>>> = view.probs.to_dtype(DType::F32)?.to_vec3()?;
        let t = self.total_len;
        let buf = &mut self.attention[view.layer];
        for (h, rows) in probs.iter().enumerate().take(self.num_heads) {
            for (row, &q) in rows.iter().zip(view.query_positions) {
                for (&p, &k) in row.iter().zip(view.key_positions) {
                    if q < t && k < t {
                        buf[h * t * t + q * t + k] = p;
                    }
                }
            }
        }
        Ok(())
    }

    fn wants_residual(&self, _site: ResidualSite) -> bool {
        true
    }

    fn wants_routing(&self, layer: usize) -> bool {
        self.routing
            .as_ref()
            .is_some_and(|r| r.layers.contains(&layer))
    }

    fn on_routing(&mut self, view: RoutingView<'_>) -> Result<()> {
        if let Some(r) = self.routing.as_mut() {
            r.record(&view);
        }
        Ok(())
    }

    fn on_residual(
        &mut self,
        site: ResidualSite,
        positions: &[usize],
        hidden: &Tensor,
    ) -> Result<()> {
        let rows: Vec<Vec<f32>> = hidden.to_dtype(DType::F32)?.to_vec2()?;
        let d = self.hidden_size;
        let buf = match site {
            ResidualSite::Embeddings => &mut self.embeddings,
            ResidualSite::Layer(l) => &mut self.layer_out[l],
        };
        for (row, &p) in rows.iter().zip(positions) {
            if p < self.total_len {
                buf[p * d..(p + 1) * d].copy_from_slice(row);
            }
        }
        Ok(())
    }
}

/// Attention of one decode-phase query at one layer, split by the phase of
/// the keys, one value per head.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryMasses {
    /// Layer index.
    pub layer: usize,
    /// Position of the query.
    pub position: usize,
    /// Mass on the BoS token (position 0).
    pub bos: Vec<f32>,
    /// Mass on anchors other than BoS.
    pub anchor: Vec<f32>,
    /// Mass on non-anchor prompt tokens.
    pub prefill: Vec<f32>,
    /// Mass on decode-phase tokens before the query.
    pub decode: Vec<f32>,
    /// Mass on the query itself.
    pub self_mass: Vec<f32>,
    /// Mass on no key: the learned sink's share of the softmax (gpt-oss),
    /// one less the other masses (rounding, below 1e-6, in a model without
    /// sinks).
    pub sink: Vec<f32>,
    /// Entropy of the attention over prefill tokens, conditional on reading
    /// them (nats, not normalised); NaN where the prefill mass is 0.
    pub prefill_entropy: Vec<f32>,
    /// Whether the layer has no attention rows (a linear-attention layer)
    /// and these are its state split ([`LinearSplit::prompt_shares`]):
    /// `prefill` holds the share of the query's output that the prompt's
    /// state gives (BoS and anchors included), `decode` the share the
    /// decode-phase tokens give (the query's own included); `bos`, `anchor`,
    /// `self_mass` and `sink` are 0 and the entropy NaN.
    pub state_split: bool,
}

/// Per-head values of a layer whose heads number `values.len()` as `heads`
/// columns: with more value heads than columns, column `c` is the mean of
/// the value heads `v` with `v * heads / values.len() == c` (a contiguous
/// group, of equal size when one count divides the other); with fewer, it
/// repeats value head `c * values.len() / heads`. A linear-attention layer's
/// value heads (Qwen3.5) shown beside the attention layers' query heads.
pub fn pool_heads(values: &[f32], heads: usize) -> Vec<f32> {
    let n = values.len();
    if n == 0 {
        return vec![f32::NAN; heads];
    }
    (0..heads)
        .map(|c| {
            if n <= heads {
                return values[c * n / heads];
            }
            let group: Vec<f32> = (0..n)
                .filter(|&v| v * heads / n == c)
                .map(|v| values[v])
                .collect();
            group.iter().sum::<f32>() / group.len().max(1) as f32
        })
        .collect()
}

/// Reduces each decode-phase query's attention to phase masses and the
/// conditional prompt entropy on the device; only [6, heads, queries]
/// numbers per layer and chunk reach the host.
#[derive(Debug, Clone)]
pub struct PhaseMassProbe {
    phases: TokenPhases,
    from: usize,
    /// Query heads a linear layer's state split is recorded in, when asked.
    split_heads: Option<usize>,
    /// One record per (layer, decode-phase query), in the order computed.
    pub records: Vec<QueryMasses>,
}

impl PhaseMassProbe {
    /// A probe for a sequence with these phases, recording every
    /// decode-phase query.
    pub fn new(phases: TokenPhases) -> Self {
        Self {
            phases,
            from: phases.decode_start(),
            split_heads: None,
            records: Vec::new(),
        }
    }

    /// Also record each linear-attention layer's state split (from the
    /// decode start: the prompt's state against the decode-phase tokens') as
    /// that layer's masses, its value heads pooled into `heads` columns
    /// ([`pool_heads`]); see [`QueryMasses::state_split`].
    pub fn with_state_split(mut self, heads: usize) -> Self {
        self.split_heads = Some(heads);
        self
    }

    /// Record only queries at `position` and later (e.g. the last prompt
    /// token, whose output is the first generated token).
    pub fn starting_at(mut self, position: usize) -> Self {
        self.from = position.max(self.phases.decode_start());
        self
    }
}

fn column_sum(probs: &Tensor, from: usize, to: usize) -> Result<Tensor> {
    let (h, q, _) = probs.dims3()?;
    if to <= from {
        return Ok(Tensor::zeros((h, q), DType::F32, probs.device())?);
    }
    Ok(probs.narrow(2, from, to - from)?.sum(2)?)
}

impl Probe for PhaseMassProbe {
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        Some(self.from)
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> Result<()> {
        // gather needs a contiguous source; decode steps already are
        let probs = view.probs.to_dtype(DType::F32)?.contiguous()?;
        let (heads, nq, _) = probs.dims3()?;
        let keys = view.key_positions;
        let col = |pos: usize| keys.partition_point(|&k| k < pos);
        let (a_end, s) = (self.phases.anchor_len().max(1), self.phases.decode_start());
        let bos = column_sum(&probs, col(0), col(1))?;
        let anchor = column_sum(&probs, col(1), col(a_end))?;
        let (p0, p1) = (col(a_end), col(s));
        let prefill = column_sum(&probs, p0, p1)?;
        let decode_incl_self = column_sum(&probs, p1, keys.len())?;
        let self_idx: Vec<u32> = view
            .query_positions
            .iter()
            .map(|&q| col(q) as u32)
            .collect();
        let self_idx = Tensor::new(self_idx.as_slice(), probs.device())?
            .reshape((1, nq, 1))?
            .broadcast_as((heads, nq, 1))?
            .contiguous()?;
        let self_mass = probs.gather(&self_idx, 2)?.squeeze(2)?;
        let decode = (decode_incl_self - &self_mass)?;
        let x_ln_x = if p1 > p0 {
            let x = probs.narrow(2, p0, p1 - p0)?;
            (&x * (&x + 1e-30)?.log()?)?.sum(2)?
        } else {
            Tensor::zeros((heads, nq), DType::F32, probs.device())?
        };
        // H(p) with p = x / m: ln m - sum(x ln x) / m
        let entropy = (prefill.log()? - x_ln_x.div(&prefill)?)?;
        let all: Vec<Vec<Vec<f32>>> =
            Tensor::stack(&[&bos, &anchor, &prefill, &decode, &self_mass, &entropy], 0)?
                .to_vec3()?;
        for (qi, &position) in view.query_positions.iter().enumerate() {
            let pick = |k: usize| -> Vec<f32> { (0..heads).map(|h| all[k][h][qi]).collect() };
            let prefill_mass = pick(2);
            let entropy = pick(5)
                .into_iter()
                .zip(&prefill_mass)
                .map(|(e, &m)| if m > 0.0 { e.max(0.0) } else { f32::NAN })
                .collect();
            let (bos, anchor, decode, self_mass) = (pick(0), pick(1), pick(3), pick(4));
            let sink = (0..heads)
                .map(|h| {
                    let keys = bos[h] + anchor[h] + prefill_mass[h] + decode[h] + self_mass[h];
                    (1.0 - keys).max(0.0)
                })
                .collect();
            self.records.push(QueryMasses {
                layer: view.layer,
                position,
                bos,
                anchor,
                prefill: prefill_mass,
                decode,
                self_mass,
                sink,
                prefill_entropy: entropy,
                state_split: false,
            });
        }
        Ok(())
    }

    fn linear_split_from(&self, _layer: usize) -> Option<usize> {
        self.split_heads.map(|_| self.phases.decode_start())
    }

    fn on_linear_split(&mut self, layer: usize, split: &LinearSplit) -> Result<()> {
        let Some(heads) = self.split_heads else {
            return Ok(());
        };
        let shares = split.prompt_shares();
        let zeros = vec![0.0; heads];
        for (row, &position) in split.positions.iter().enumerate() {
            if position < self.from {
                continue;
            }
            let v = split.value_heads;
            let prompt = pool_heads(&shares[row * v..(row + 1) * v], heads);
            let decode = prompt.iter().map(|p| 1.0 - p).collect();
            self.records.push(QueryMasses {
                layer,
                position,
                bos: zeros.clone(),
                anchor: zeros.clone(),
                prefill: prompt,
                decode,
                self_mass: zeros.clone(),
                sink: zeros.clone(),
                prefill_entropy: vec![f32::NAN; heads],
                state_split: true,
            });
        }
        Ok(())
    }
}

/// Records, per layer, the positions that had a hidden state there: which
/// tokens a policy let exist at each depth.
#[derive(Debug, Clone, Default)]
pub struct StatePositionsProbe {
    /// Per layer, the positions computed, in the order they were.
    pub positions: Vec<Vec<usize>>,
}

impl StatePositionsProbe {
    /// An empty record for a model of `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            positions: vec![Vec::new(); num_layers],
        }
    }

    /// The positions computed at `layer`, ascending.
    pub fn sorted(&self, layer: usize) -> Vec<usize> {
        let mut p = self.positions[layer].clone();
        p.sort_unstable();
        p
    }
}

impl Probe for StatePositionsProbe {
    fn wants_residual(&self, site: ResidualSite) -> bool {
        matches!(site, ResidualSite::Layer(_))
    }

    fn on_residual(&mut self, site: ResidualSite, positions: &[usize], _: &Tensor) -> Result<()> {
        if let ResidualSite::Layer(l) = site
            && let Some(row) = self.positions.get_mut(l)
        {
            row.extend_from_slice(positions);
        }
        Ok(())
    }
}

/// Attention mass that decode-phase queries put on each prompt position
/// before the decode start, summed over heads and queries, per layer: what
/// SlimInfer's attention recall and scorer precision are read from. Holds
/// `layers × decode_start` numbers, never a P × P array.
#[derive(Debug, Clone)]
pub struct PromptMassProbe {
    decode_start: usize,
    /// Per layer, the mass on each position `0..decode_start`.
    pub mass: Vec<Vec<f64>>,
}

impl PromptMassProbe {
    /// A probe for queries from `decode_start` on.
    pub fn new(num_layers: usize, decode_start: usize) -> Self {
        Self {
            decode_start,
            mass: vec![vec![0.0; decode_start]; num_layers],
        }
    }

    /// Per layer, the share of the mass on the positions `in_scope` that
    /// lands on the positions `kept(layer, pos)`: 1 where nothing is cut.
    pub fn recall(
        &self,
        in_scope: impl Fn(usize) -> bool,
        kept: impl Fn(usize, usize) -> bool,
    ) -> Vec<f32> {
        self.mass
            .iter()
            .enumerate()
            .map(|(l, row)| {
                let (mut all, mut hit) = (0.0, 0.0);
                for (pos, &m) in row.iter().enumerate().filter(|(p, _)| in_scope(*p)) {
                    all += m;
                    if kept(l, pos) {
                        hit += m;
                    }
                }
                if all > 0.0 { (hit / all) as f32 } else { 1.0 }
            })
            .collect()
    }
}

impl Probe for PromptMassProbe {
    fn attention_from(&self, _layer: usize) -> Option<usize> {
        Some(self.decode_start)
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> Result<()> {
        let cut = view
            .key_positions
            .partition_point(|&k| k < self.decode_start);
        if cut == 0 {
            return Ok(());
        }
        // sum over heads and queries on the device; only [keys] leaves it
        let sums: Vec<f32> = view
            .probs
            .narrow(2, 0, cut)?
            .to_dtype(DType::F32)?
            .sum(0)?
            .sum(0)?
            .to_vec1()?;
        let row = &mut self.mass[view.layer];
        for (&k, m) in view.key_positions[..cut].iter().zip(sums) {
            row[k] += f64::from(m);
        }
        Ok(())
    }
}

/// What one full-depth prompt run records for the policies that branch
/// from it, chunk by chunk as it computed them: the residual stream
/// entering chosen layers (what a token that leaves the model there
/// carries on: SwiftKV's and POP's projected K/V, SlimInfer's later stages)
/// and the latest queries at others (what SlimInfer's first stage reads).
/// See [`Decoder::projected_from`](crate::Decoder::projected_from) and
/// [`Decoder::staged_from`](crate::Decoder::staged_from).
#[derive(Debug, Clone, Default)]
pub struct PromptRecord {
    /// Per layer asked for, the chunks' hidden states [rows, hidden] and
    /// their positions, in the order they ran.
    entering: BTreeMap<usize, Vec<(Tensor, Vec<usize>)>>,
    /// Per layer asked for, how many latest queries, and the chunks' latest
    /// queries.
    queries: BTreeMap<usize, (usize, Vec<QueryRows>)>,
}

/// A chunk's latest queries at a layer (after RoPE, [heads * head_dim]
/// each, oldest first).
pub type QueryRows = Vec<Vec<f32>>;

impl PromptRecord {
    /// A record of the states entering each of `layers` (layer 0 takes the
    /// embeddings).
    pub fn entering(layers: impl IntoIterator<Item = usize>) -> Self {
        Self::default().and_entering(layers)
    }

    /// This record, also of the states entering each of `layers`.
    pub fn and_entering(mut self, layers: impl IntoIterator<Item = usize>) -> Self {
        for l in layers {
            self.entering.entry(l).or_default();
        }
        self
    }

    /// This record, also of each chunk's latest `window` queries at each
    /// `(layer, window)` of `windows` (the widest where a layer is named
    /// twice).
    pub fn and_queries(mut self, windows: impl IntoIterator<Item = (usize, usize)>) -> Self {
        for (l, w) in windows {
            let held = &mut self.queries.entry(l).or_default().0;
            *held = (*held).max(w);
        }
        self
    }

    /// Whether the record asks for nothing (no layer's states, no queries).
    pub fn is_empty(&self) -> bool {
        self.entering.is_empty() && self.queries.is_empty()
    }

    /// The chunks recorded entering `layer` (`None` for a layer not asked
    /// for).
    pub fn chunks(&self, layer: usize) -> Option<&[(Tensor, Vec<usize>)]> {
        self.entering.get(&layer).map(Vec::as_slice)
    }

    /// Bytes this record will hold once a prompt of `tokens` tokens has run
    /// in `chunks` chunks through a model of `hidden` wide residual stream
    /// and `query_width` wide queries (all heads), in f32: a state per
    /// token per layer asked for, and each chunk's latest queries.
    pub fn bytes_for(
        &self,
        tokens: usize,
        chunks: usize,
        (hidden, query_width): (usize, usize),
    ) -> u64 {
        let states = self.entering.len() * tokens * hidden;
        let queries: usize = self
            .queries
            .values()
            .map(|(window, _)| chunks * window.min(&tokens) * query_width)
            .sum();
        (4 * (states + queries)) as u64
    }

    /// The chunks' latest queries recorded at `layer` and how many each
    /// chunk kept at most (`None` for a layer not asked for).
    pub fn queries(&self, layer: usize) -> Option<(usize, &[QueryRows])> {
        self.queries.get(&layer).map(|(w, q)| (*w, q.as_slice()))
    }
}

impl Probe for PromptRecord {
    fn wants_residual(&self, site: ResidualSite) -> bool {
        self.entering.contains_key(&site.entered_layer())
    }

    fn on_residual(
        &mut self,
        site: ResidualSite,
        positions: &[usize],
        hidden: &Tensor,
    ) -> Result<()> {
        if let Some(chunks) = self.entering.get_mut(&site.entered_layer()) {
            chunks.push((hidden.clone(), positions.to_vec()));
        }
        Ok(())
    }

    fn query_window(&self, layer: usize) -> Option<usize> {
        self.queries.get(&layer).map(|(w, _)| *w)
    }

    fn on_queries(&mut self, layer: usize, rows: Vec<Vec<f32>>) -> Result<()> {
        if let Some((_, chunks)) = self.queries.get_mut(&layer) {
            chunks.push(rows);
        }
        Ok(())
    }
}

/// A pass's own probe (if any) with a recorder beside it (a
/// [`PromptRecord`], a routing recorder): the recorder takes the routing
/// and the residual states it asks for, and nothing else (ask it for no
/// attention, queries or linear splits); the probe everything it asks
/// for, as if alone.
pub struct Beside<'a, 'p> {
    /// The pass's own probe.
    pub probe: Option<&'p mut (dyn Probe + 'p)>,
    /// The recorder.
    pub recorder: &'a mut dyn Probe,
}

impl Probe for Beside<'_, '_> {
    fn attention_from(&self, layer: usize) -> Option<usize> {
        self.probe.as_ref().and_then(|p| p.attention_from(layer))
    }

    fn on_attention(&mut self, view: AttentionView<'_>) -> Result<()> {
        self.probe.as_mut().map_or(Ok(()), |p| p.on_attention(view))
    }

    fn wants_routing(&self, layer: usize) -> bool {
        self.recorder.wants_routing(layer)
            || self.probe.as_ref().is_some_and(|p| p.wants_routing(layer))
    }

    fn on_routing(&mut self, view: RoutingView<'_>) -> Result<()> {
        if let Some(p) = self.probe.as_mut()
            && p.wants_routing(view.layer)
        {
            p.on_routing(view)?;
        }
        match self.recorder.wants_routing(view.layer) {
            true => self.recorder.on_routing(view),
            false => Ok(()),
        }
    }

    fn query_window(&self, layer: usize) -> Option<usize> {
        self.probe.as_ref().and_then(|p| p.query_window(layer))
    }

    fn on_queries(&mut self, layer: usize, rows: Vec<Vec<f32>>) -> Result<()> {
        self.probe
            .as_mut()
            .map_or(Ok(()), |p| p.on_queries(layer, rows))
    }

    fn linear_split_from(&self, layer: usize) -> Option<usize> {
        self.probe.as_ref().and_then(|p| p.linear_split_from(layer))
    }

    fn on_linear_split(&mut self, layer: usize, split: &LinearSplit) -> Result<()> {
        self.probe
            .as_mut()
            .map_or(Ok(()), |p| p.on_linear_split(layer, split))
    }

    fn wants_residual(&self, site: ResidualSite) -> bool {
        self.recorder.wants_residual(site)
            || self.probe.as_ref().is_some_and(|p| p.wants_residual(site))
    }

    fn on_residual(
        &mut self,
        site: ResidualSite,
        positions: &[usize],
        hidden: &Tensor,
    ) -> Result<()> {
        if self.recorder.wants_residual(site) {
            self.recorder.on_residual(site, positions, hidden)?;
        }
        match self.probe.as_mut() {
            Some(p) if p.wants_residual(site) => p.on_residual(site, positions, hidden),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::pool_heads;

    #[test]
    fn value_heads_pool_into_query_head_columns() {
        // as many: unchanged; twice as many: pairs' means; fewer: repeated
        assert_eq!(pool_heads(&[0.1, 0.2], 2), [0.1, 0.2]);
        assert_eq!(pool_heads(&[0.0, 1.0, 0.5, 0.25], 2), [0.5, 0.375]);
        assert_eq!(pool_heads(&[0.1, 0.2], 4), [0.1, 0.1, 0.2, 0.2]);
        // three into two: the first two, then the last (every head counted once)
        assert_eq!(pool_heads(&[1.0, 0.0, 0.5], 2), [0.5, 0.5]);
        assert!(pool_heads(&[], 2).iter().all(|x| x.is_nan()));
    }
}
