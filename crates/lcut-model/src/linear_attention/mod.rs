//! Qwen3.5's linear-attention layer (Gated DeltaNet), as transformers 5.24
//! computes it, and the fixed-size state a sequence keeps for each such
//! layer beside its K/V cache.
//!
//! For each row, in position order: the input's projection to queries,
//! keys and values passes a depthwise causal convolution (kernel `K`, over
//! this row and the `K - 1` rows before it, then SiLU); queries and keys
//! are L2-normalised per head and the queries scaled by `1/sqrt(d_k)`; each
//! value head `h` (reading key head `h / (H_v / H_k)`, or `h % H_k` in a
//! GGUF file's tiled order) keeps a state `S`
//! (`d_k x d_v`) that decays by `exp(g)`, `g = -exp(A_log) * softplus(a +
//! dt_bias)`, and learns the row's value by the delta rule with rate
//! `beta = sigmoid(b)`: `S <- e^g S; S <- S + k (beta (v - S^T k))^T`; the
//! row's output is `S^T q`, then an RMSNorm per head (a plain `w` weight)
//! times `silu(z)`. On the CPU the recurrence runs token by token on the
//! host in f32, so a prompt in one chunk, in chunks, or one token at a time
//! gives the same state. On other devices a prompt's rows take
//! transformers' chunked form ([`chunked`]: the same sum in another order,
//! as tensor ops), a row at a time where the row-by-row form is needed
//! (a split, rows that do not enter, the first row of a state that keeps
//! it). Which tokens run a layer and which enter its state is the policy's
//! (`lcut_policy::RecurrentLayers`).

use candle_core::{DType, Tensor};

use crate::config::LinearAttentionConfig;
use crate::error::Result;
use std::sync::Arc;

use crate::grad_ops;
use crate::layers::{Loader, RmsNorm};
use crate::linear::Linear;

mod chunked;

/// One linear-attention layer's weights.
#[derive(Debug, Clone)]
pub(crate) struct GatedDeltaNet {
    /// Input into queries, keys and values side by side (`in_proj_qkv`).
    in_qkv: Linear,
    /// Input into the output gate (`in_proj_z`).
    in_z: Linear,
    /// Input into each value head's learning rate, before its sigmoid
    /// (`in_proj_b`).
    in_b: Linear,
    /// Input into each value head's decay step (`in_proj_a`).
    in_a: Linear,
    /// The depthwise convolution's weights, `[channels, kernel]` row-major.
    conv: Vec<f32>,
    /// Each value head's log decay rate.
    a_log: Vec<f32>,
    /// Each value head's decay-step bias.
    dt_bias: Vec<f32>,
    /// The convolution's weights, log decay rates and decay-step biases as
    /// the weights gave them (tensors: what the training passes read, so
    /// that gradients reach them). The host copies above are taken when the
    /// layer loads, for the row-by-row inference path.
    rates: Rates,
    /// The gated norm (plain `w` weight [value_head_dim]).
    norm: RmsNorm,
    /// The norm's epsilon.
    eps: f32,
    /// Heads, widths and kernel.
    shape: Shape,
    /// Rows in a chunk of the chunked form, or `None` for the row-by-row
    /// form on the host (the CPU's; see [`GatedDeltaNet::set_chunk`]).
    chunk: Option<usize>,
}

/// A linear layer's weights that are not matrices, as tensors.
#[derive(Debug, Clone)]
struct Rates {
    /// `[channels, 1, kernel]`.
    conv: Tensor,
    /// `[value_heads]`.
    a_log: Tensor,
    /// `[value_heads]`.
    dt_bias: Tensor,
}

/// The sizes a linear layer computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    key_heads: usize,
    value_heads: usize,
    dk: usize,
    dv: usize,
    kernel: usize,
    /// The value heads in llama.cpp's tiled order
    /// ([`LinearAttentionConfig::value_heads_tiled`]).
    tiled: bool,
}

impl Shape {
    fn of(c: &LinearAttentionConfig) -> Self {
        Self {
            key_heads: c.key_heads,
            value_heads: c.value_heads,
            dk: c.key_head_dim,
            dv: c.value_head_dim,
            kernel: c.conv_kernel,
            tiled: c.value_heads_tiled,
        }
    }

    /// The key head value head `h` reads, in the order the weights hold
    /// the value heads.
    fn key_head_of(&self, h: usize) -> usize {
        match self.tiled {
            true => h % self.key_heads,
            false => h / (self.value_heads / self.key_heads),
        }
    }

    /// One row's values per value head [value_heads, d_v] in Hugging
    /// Face's grouped order of the value heads.
    fn grouped(&self, row: &[f32]) -> Vec<f32> {
        if !self.tiled {
            return row.to_vec();
        }
        let (k, group, dv) = (self.key_heads, self.value_heads / self.key_heads, self.dv);
        let mut out = vec![0.0; row.len()];
        for (t, head) in row.chunks(dv).enumerate() {
            let g = (t % k) * group + t / k;
            out[g * dv..(g + 1) * dv].copy_from_slice(head);
        }
        out
    }

    fn key_width(&self) -> usize {
        self.key_heads * self.dk
    }

    fn value_width(&self) -> usize {
        self.value_heads * self.dv
    }

    fn channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }
}

/// What a sequence keeps of one linear layer between chunks: the last
/// `kernel - 1` convolution inputs and each value head's state matrix, in
/// f32, and how many tokens have entered it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentState {
    /// The convolution's last inputs, oldest first, `[kernel - 1,
    /// channels]` (zeros before the first token).
    conv: Vec<f32>,
    /// Each value head's `d_k x d_v` state, `[value_heads, d_k, d_v]`.
    matrix: Vec<f32>,
    /// Tokens that have run through the layer.
    tokens: usize,
    /// The state as the first token left it (its convolution inputs and
    /// matrices), kept by a full-depth run's state: what a run whose only
    /// token before the decode phase at this layer is that one (SPEED with
    /// BoS kept, above the cut) starts from, so that a full run's state can
    /// be restricted to it.
    first: Option<Box<(Vec<f32>, Vec<f32>)>>,
    /// Whether the state keeps `first`.
    keeps_first: bool,
    /// While a probe asks for the split of the decode phase's outputs: the
    /// state's part that the state at the split's start left (moved by
    /// each later token's transition alone), and the part the tokens since
    /// wrote (from zero); they sum to `matrix`.
    parts: Option<Box<(Vec<f32>, Vec<f32>)>>,
}

/// A linear layer's outputs split by where they come from: the rows at or
/// after a position `s` (the decode start) that entered the state. The
/// recurrence is linear in its state, `S_t = M_t S_(t-1) + beta_t k_t v_t^T`,
/// so the state is the state at `s` moved by the later tokens' transitions
/// `M_t` alone (what the prompt contributes) plus a state run from zero
/// over the tokens from `s` on (what the decode phase contributes), and
/// each row's output `S_t^T q_t` splits the same way. The convolution,
/// whose window at the first decode-phase tokens still holds the last
/// prompt tokens' inputs, is part of the tokens' queries, keys and values,
/// not of the state. Outputs are before the gated norm.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinearSplit {
    /// Value heads.
    pub value_heads: usize,
    /// Width of a value head.
    pub head_dim: usize,
    /// The rows' positions, ascending.
    pub positions: Vec<usize>,
    /// What the state at the split's start contributes [rows, heads, d_v]
    /// (value heads in Hugging Face's grouped order, whatever order the
    /// weights hold them in).
    pub prompt: Vec<f32>,
    /// What the rows from the split's start contribute [rows, heads, d_v].
    pub decode: Vec<f32>,
    /// The rows' outputs [rows, heads, d_v]: the two parts' sum.
    pub output: Vec<f32>,
}

impl LinearSplit {
    /// Per row and value head, the prompt's share of the output: `|p| /
    /// (|p| + |d|)` of the two parts' L2 norms (0 where both are 0).
    pub fn prompt_shares(&self) -> Vec<f32> {
        let norm = |x: &[f32]| x.iter().map(|v| v * v).sum::<f32>().sqrt();
        self.prompt
            .chunks(self.head_dim.max(1))
            .zip(self.decode.chunks(self.head_dim.max(1)))
            .map(|(p, d)| {
                let (p, d) = (norm(p), norm(d));
                if p + d > 0.0 { p / (p + d) } else { 0.0 }
            })
            .collect()
    }
}

impl RecurrentState {
    /// Forget the split's parts.
    fn stop_split(&mut self) {
        self.parts = None;
    }

    /// The empty state (no token has run) of a layer of `shape`, keeping
    /// the first token's state where `keeps_first`.
    fn new(shape: Shape, keeps_first: bool) -> Self {
        Self {
            conv: vec![0.0; (shape.kernel - 1) * shape.channels()],
            matrix: vec![0.0; shape.value_heads * shape.dk * shape.dv],
            tokens: 0,
            first: None,
            keeps_first,
            parts: None,
        }
    }

    /// The state after the first `tokens` tokens of this one, where it
    /// knows it: none (`Ok(None)`: no token), the first alone, or all of
    /// them (keeping the first token's copy where `keeps_first`: a
    /// full-depth run's); `Err(())` otherwise.
    pub(crate) fn prefix(
        &self,
        tokens: usize,
        keeps_first: bool,
    ) -> std::result::Result<Option<Self>, ()> {
        match tokens {
            0 => Ok(None),
            t if t == self.tokens => Ok(Some(Self {
                first: self.first.clone().filter(|_| keeps_first),
                keeps_first: keeps_first && self.keeps_first,
                ..self.clone()
            })),
            1 => {
                let (conv, matrix) = self.first.as_deref().ok_or(())?.clone();
                Ok(Some(Self {
                    conv,
                    matrix,
                    tokens: 1,
                    first: None,
                    keeps_first: false,
                    parts: None,
                }))
            }
            _ => Err(()),
        }
    }

    /// Bytes the state holds (f32): the same whatever the number of tokens
    /// that entered it, and twice that in a full-depth run's state once a
    /// token has run (the first token's state, kept so that the run can be
    /// restricted to SPEED with BoS).
    pub fn bytes(&self) -> usize {
        let first = self.first.as_ref().map_or(0, |f| f.0.len() + f.1.len());
        4 * (self.conv.len() + self.matrix.len() + first)
    }

    /// Tokens that have run through the layer.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

fn softplus(x: f32) -> f32 {
    // torch's softplus: linear past its threshold of 20
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `x` scaled to unit L2 norm (transformers' `l2norm`, eps 1e-6 inside
/// the root), then by `scale`.
fn l2_normalise(x: &mut [f32], scale: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let inv = scale / (sum + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// One row a linear layer runs: its projected queries, keys and values
/// [channels] before the convolution, its decay steps `a` and learning
/// rates `b` before their activations [value_heads], its position, and
/// whether it enters the state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinearRow<'a> {
    pub(crate) input: &'a [f32],
    pub(crate) gates: (&'a [f32], &'a [f32]),
    pub(crate) position: usize,
    pub(crate) enters: bool,
}

impl GatedDeltaNet {
    /// The linear-attention layer at `prefix` (`model.layers.N.linear_attn`).
    pub(crate) fn load(ld: &Loader<'_>, prefix: &str, c: &LinearAttentionConfig) -> Result<Self> {
        let shape = Shape::of(c);
        let d = ld.cfg.hidden_size;
        let tensor = |name: &str, dims: &[usize]| ld.tensor(&format!("{prefix}.{name}"), dims);
        let host = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let linear =
            |name: &str, rows: usize| ld.linear(&format!("{prefix}.{name}"), rows, d, false);
        let rates = Rates {
            conv: tensor("conv1d.weight", &[shape.channels(), 1, shape.kernel])?,
            a_log: tensor("A_log", &[shape.value_heads])?,
            dt_bias: tensor("dt_bias", &[shape.value_heads])?,
        };
        Ok(Self {
            in_qkv: linear("in_proj_qkv", shape.channels())?,
            in_z: linear("in_proj_z", shape.value_width())?,
            in_b: linear("in_proj_b", shape.value_heads)?,
            in_a: linear("in_proj_a", shape.value_heads)?,
            conv: host(&rates.conv)?,
            a_log: host(&rates.a_log)?,
            dt_bias: host(&rates.dt_bias)?,
            rates,
            // the gated norm's weight is plain `w`, unlike the model's other norms
            norm: ld.plain_norm(&format!("{prefix}.norm"), shape.dv)?,
            eps: ld.cfg.rms_norm_eps as f32,
            shape,
            chunk: chunked::chunk_for(ld.device),
        })
    }

    /// Run a prompt's rows in the chunked form with chunks of `chunk` rows
    /// (a power of two), or row by row on the host (`None`). The default is
    /// the row-by-row form on the CPU, where it costs a few percent of a
    /// prefill, and chunks of [`chunked::CHUNK`] elsewhere, where the
    /// row-by-row form would take every row to the host; `LCUT_LINEAR_CHUNK`
    /// sets it as the model loads ([`chunked::chunk_for`]).
    pub(crate) fn set_chunk(&mut self, chunk: Option<usize>) {
        self.chunk = chunk.filter(|c| c.is_power_of_two());
    }

    /// The layer's matrices (its output projection is the layer's
    /// attention output, held by its `AttentionProj`).
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        vec![&self.in_qkv, &self.in_z, &self.in_b, &self.in_a]
    }

    /// The empty state of this layer, keeping the first token's state
    /// where `keeps_first` (a full-depth run, which may be restricted).
    pub(crate) fn new_state(&self, keeps_first: bool) -> RecurrentState {
        RecurrentState::new(self.shape, keeps_first)
    }

    /// Value heads and their width: the shape of the layer's output.
    pub(crate) fn output_heads(&self) -> (usize, usize) {
        (self.shape.value_heads, self.shape.dv)
    }

    /// The layer's output for rows `x` [n, hidden] at `positions` (the
    /// normed residual stream of `n` tokens in position order, following
    /// those `state` has seen), as value heads first [value_heads, n, d_v],
    /// gated and normed, ready for the output projection. A row whose
    /// `enters[i]` holds moves `state` past it; one whose does not runs from
    /// the state as it stands and leaves it as it was (SelfOnly's
    /// decode-phase tokens above its cut). With `split_from`, the rows at or
    /// after that position that enter the state also get their output split
    /// into what the state at that position contributes and what the rows
    /// from it on do ([`LinearSplit`]).
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        (positions, enters): (&[usize], &[bool]),
        split_from: Option<usize>,
        state: &mut RecurrentState,
    ) -> Result<(Tensor, Option<LinearSplit>)> {
        let n = x.dim(0)?;
        // the rows the host runs one by one: all of them, or, in the
        // chunked form, the first row of a state that keeps it (and a lone
        // row after it: a decode step)
        let by_row = match self.chunk {
            Some(_) if split_from.is_none() && enters.iter().all(|&e| e) => {
                let first = usize::from(state.tokens == 0 && state.keeps_first);
                if n - first.min(n) >= 2 { first } else { n }
            }
            _ => n,
        };
        let mixed = self.in_qkv.forward(x)?.to_dtype(DType::F32)?;
        let a = self.in_a.forward(x)?.to_dtype(DType::F32)?;
        let b = self.in_b.forward(x)?.to_dtype(DType::F32)?;
        let mut split = split_from.map(|_| self.empty_split());
        let mut outs = Vec::with_capacity(2);
        if by_row > 0 {
            let host = |t: &Tensor| -> Result<Vec<f32>> {
                Ok(t.narrow(0, 0, by_row)?.flatten_all()?.to_vec1::<f32>()?)
            };
            let (mixed, a, b) = (host(&mixed)?, host(&a)?, host(&b)?);
            let (hv, dv) = (self.shape.value_heads, self.shape.dv);
            let mut out = vec![0.0f32; by_row * hv * dv];
            let c = self.shape.channels();
            for t in 0..by_row {
                let i = t * hv;
                let row = LinearRow {
                    input: &mixed[t * c..(t + 1) * c],
                    gates: (&a[i..i + hv], &b[i..i + hv]),
                    position: positions.get(t).copied().unwrap_or(usize::MAX),
                    enters: enters.get(t).copied().unwrap_or(true),
                };
                self.step_row(
                    row,
                    split_from,
                    state,
                    &mut out[i * dv..(i + hv) * dv],
                    split.as_mut(),
                );
            }
            outs.push(Tensor::from_vec(out, (by_row, hv, dv), x.device())?);
        }
        if let (Some(chunk), true) = (self.chunk, by_row < n) {
            // a run shorter than a chunk takes the smallest chunk that holds it
            let chunk = chunk.min((n - by_row).next_power_of_two());
            let rest = |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(0, by_row, n - by_row)?) };
            outs.push(self.rows_in_chunks(
                (&rest(&mixed)?, &rest(&a)?, &rest(&b)?),
                state,
                chunk,
            )?);
        }
        let out = Tensor::cat(&outs, 0)?.to_dtype(x.dtype())?;
        Ok((self.gated_heads(&out, x)?, split))
    }

    /// The delta rule's inputs of `n` rows from their convolved projections
    /// `convolved` [n, channels] and their decay steps `a` and rates `b`
    /// before their activations [n, value_heads]: queries and keys
    /// [n, value_heads, d_k] (each value head's key head's, L2-normed as
    /// `l2_normalise` rounds it, the queries scaled by 1/sqrt(d_k)), values
    /// [n, value_heads, d_v], log decays `-exp(A_log) softplus(a +
    /// dt_bias)` and rates `sigmoid(b)` [n, value_heads]; in tensor ops that
    /// gradients pass through.
    fn delta_inputs(&self, convolved: &Tensor, a: &Tensor, b: &Tensor) -> Result<[Tensor; 5]> {
        let s = self.shape;
        let (n, dev) = (convolved.dim(0)?, convolved.device());
        let reads: Vec<u32> = (0..s.value_heads)
            .map(|v| s.key_head_of(v) as u32)
            .collect();
        let reads = Tensor::new(reads, dev)?;
        let heads_of = |from: usize, scale: f64| -> Result<Tensor> {
            let h = convolved
                .narrow(1, from, s.key_width())?
                .reshape((n, s.key_heads, s.dk))?;
            // scale / sqrt(sum of squares + 1e-6), then the product, as the
            // row-by-row path rounds it
            let root = (h.sqr()?.sum_keepdim(2)? + 1e-6)?.sqrt()?;
            let h = h.broadcast_mul(&(root.ones_like()? * scale)?.div(&root)?)?;
            Ok(h.index_select(&reads, 1)?)
        };
        let v = convolved
            .narrow(1, 2 * s.key_width(), s.value_width())?
            .reshape((n, s.value_heads, s.dv))?;
        let rate = |t: &Tensor| t.to_dtype(a.dtype());
        let step = a.broadcast_add(&rate(&self.rates.dt_bias)?)?;
        let softplus = (step.relu()? + (step.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
        let log_decay = softplus
            .broadcast_mul(&rate(&self.rates.a_log)?.exp()?)?
            .neg()?;
        let beta = (b.neg()?.exp()? + 1.0)?.recip()?;
        Ok([
            heads_of(0, 1.0 / (s.dk as f64).sqrt())?,
            heads_of(s.key_width(), 1.0)?,
            v,
            log_decay,
            beta,
        ])
    }

    /// Rows that all enter `state`, given by their projections (`mixed`
    /// [m, channels], `a` and `b` [m, value_heads], f32), through the
    /// convolution and the delta rule in chunks of `chunk` rows: their
    /// outputs [m, value_heads, d_v] before the gated norm, on the rows'
    /// device, and `state` moved past them.
    fn rows_in_chunks(
        &self,
        (mixed, a, b): (&Tensor, &Tensor, &Tensor),
        state: &mut RecurrentState,
        chunk: usize,
    ) -> Result<Tensor> {
        // no split runs here (as a row without one forgets it)
        state.stop_split();
        let s = self.shape;
        let (m, dev) = (mixed.dim(0)?, mixed.device());
        let (c, k) = (s.channels(), s.kernel);
        let (hv, dk, dv) = (s.value_heads, s.dk, s.dv);
        // the convolution over the state's last inputs, then these rows
        let past = Tensor::from_slice(&state.conv, (k - 1, c), dev)?;
        let inputs = Tensor::cat(&[&past, mixed], 0)?;
        let weights = self.rates.conv.to_dtype(DType::F32)?.reshape((c, k))?;
        let mut convolved = inputs
            .narrow(0, 0, m)?
            .broadcast_mul(&weights.narrow(1, 0, 1)?.t()?)?;
        for j in 1..k {
            let tap = weights.narrow(1, j, 1)?.t()?;
            convolved = (convolved + inputs.narrow(0, j, m)?.broadcast_mul(&tap)?)?;
        }
        let convolved = convolved.silu()?;
        let kept = inputs.narrow(0, m, k - 1)?;
        state.conv = kept.flatten_all()?.to_vec1::<f32>()?;
        // everything value heads first
        let [q, k, v, g, beta] = self.delta_inputs(&convolved, a, b)?;
        let heads_first = |x: Tensor| -> Result<Tensor> { Ok(x.transpose(0, 1)?.contiguous()?) };
        let rows = chunked::DeltaRows {
            q: heads_first(q)?,
            k: heads_first(k)?,
            v: heads_first(v)?,
            g: heads_first(g)?,
            beta: heads_first(beta)?,
        };
        let start = Tensor::from_slice(&state.matrix, (hv, dk, dv), dev)?;
        let (out, end) = chunked::delta_rule_in_chunks(&rows, &start, chunk)?;
        state.matrix = end.flatten_all()?.to_vec1::<f32>()?;
        state.tokens += m;
        Ok(out.transpose(0, 1)?.contiguous()?)
    }

    /// The outputs `out` [n, value_heads, d_v] of rows `x` [n, hidden]
    /// through the gated norm (each head RMS-normed, times `silu(z)` of the
    /// row's gate), value heads first [value_heads, n, d_v].
    fn gated_heads(&self, out: &Tensor, x: &Tensor) -> Result<Tensor> {
        let (n, hv, dv) = out.dims3()?;
        let z = self.in_z.forward(x)?.reshape((n, hv, dv))?;
        let gated = (self.norm.forward(out)? * candle_nn::ops::silu(&z)?)?;
        Ok(gated.transpose(0, 1)?.contiguous()?)
    }

    /// The layer's output for `t` rows of each of several sequences, `x`
    /// [b * t, hidden] (row `i * t + p` is sequence i's row p), in tensor
    /// ops that gradients pass through (the training passes): each sequence
    /// from an empty state, its row p entering the state where `enters[i *
    /// t + p]` holds and otherwise running from the state as it stands (as
    /// [`GatedDeltaNet::forward`] does), the convolution reading the last
    /// `kernel - 1` rows that entered before it. Value heads first
    /// [value_heads, b * t, d_v], as `forward` gives it, within rounding of
    /// it (the sums run in another order).
    pub(crate) fn forward_rows(&self, x: &Tensor, t: usize, enters: &[bool]) -> Result<Tensor> {
        let s = self.shape;
        let (n, (c, k)) = (x.dim(0)?, (s.channels(), s.kernel));
        let (hv, dk, dv) = (s.value_heads, s.dk, s.dv);
        if t == 0 || n % t != 0 || enters.len() != n {
            return Err(crate::error::ModelError::TrainInput {
                detail: format!(
                    "{n} rows in sequences of {t} with {} entry flags for a linear layer",
                    enters.len()
                ),
            });
        }
        let (b, dev) = (n / t, x.device());
        // each row's convolution window, oldest first: the rows that
        // entered before it (a zero row, index n, before its sequence's
        // first), then the row itself
        let mut window = Vec::with_capacity(n * k);
        for seq in enters.chunks(t).enumerate() {
            let mut entered: Vec<u32> = Vec::new();
            for (p, &enters) in seq.1.iter().enumerate() {
                let row = (seq.0 * t + p) as u32;
                for back in (1..k).rev() {
                    let past = entered.len().checked_sub(back);
                    window.push(past.map_or(n as u32, |i| entered[i]));
                }
                window.push(row);
                if enters {
                    entered.push(row);
                }
            }
        }
        let mixed = self.in_qkv.forward(x)?;
        let padded = Tensor::cat(&[&mixed, &mixed.zeros_like()?.narrow(0, 0, 1)?], 0)?;
        let windows = padded
            .index_select(&Tensor::new(window, dev)?, 0)?
            .reshape((n, k, c))?;
        let weights = self.rates.conv.reshape((c, k))?.t()?.unsqueeze(0)?;
        let convolved = windows.broadcast_mul(&weights)?.sum(1)?.silu()?;
        let (a, rates) = (self.in_a.forward(x)?, self.in_b.forward(x)?);
        let [q, keys, v, log_decay, beta] = self.delta_inputs(&convolved, &a, &rates)?;
        let q = q.reshape((b, t, hv, dk))?;
        let keys = keys.reshape((b, t, hv, dk))?;
        let v = v.reshape((b, t, hv, dv))?;
        let decay = log_decay.exp()?.reshape((b, t, hv, 1, 1))?;
        let beta = beta.reshape((b, t, hv, 1))?;
        // a sequence's last row reads the state it would leave, whether it
        // enters or not, and no row reads that state after it
        let all_enter = enters.chunks(t).all(|seq| seq[..t - 1].iter().all(|&e| e));
        if let (Some(chunk), true) = (self.chunk, all_enter) {
            // each sequence's rows in chunks, the sequences and value heads
            // as one batch, from empty states
            let heads_first = |x: &Tensor, width: usize| -> Result<Tensor> {
                Ok(x.reshape((b, t, hv, width))?
                    .transpose(1, 2)?
                    .reshape((b * hv, t, width))?
                    .to_dtype(DType::F32)?
                    .contiguous()?)
            };
            let rows = chunked::DeltaRows {
                q: heads_first(&q, dk)?,
                k: heads_first(&keys, dk)?,
                v: heads_first(&v, dv)?,
                g: heads_first(&log_decay, 1)?.squeeze(2)?,
                beta: heads_first(&beta, 1)?.squeeze(2)?,
            };
            let start = Tensor::zeros((b * hv, dk, dv), DType::F32, dev)?;
            let chunk = chunk.min(t.next_power_of_two());
            let (out, _) = chunked::delta_rule_in_chunks(&rows, &start, chunk)?;
            let out = out.reshape((b, hv, t, dv))?.transpose(1, 2)?;
            return self.gated_heads(&out.reshape((n, hv, dv))?.to_dtype(x.dtype())?, x);
        }
        let rule = DeltaRule {
            q: &q,
            keys: &keys,
            v: &v,
            decay: &decay,
            beta: &beta,
            enters,
        };
        let out = match [x, &self.rates.conv].iter().all(|w| grad_ops::takes(w)) {
            true => {
                let qkv = Tensor::cat(&[&q, &keys, &v], 3)?;
                let gates = Tensor::cat(&[&decay.reshape((b, t, hv, 1))?, &beta], 3)?;
                grad_ops::delta_rule(&qkv, &gates, dk, Arc::new(enters.to_vec()))?
            }
            false => rule.composed()?,
        };
        self.gated_heads(&out.reshape((n, hv, dv))?, x)
    }

    /// A split with no rows yet, of this layer's value heads.
    pub(crate) fn empty_split(&self) -> LinearSplit {
        LinearSplit {
            value_heads: self.shape.value_heads,
            head_dim: self.shape.dv,
            ..LinearSplit::default()
        }
    }

    /// One row through the convolution and the recurrence, its output
    /// [value_heads, d_v] (before the gated norm) into `out`: a row that
    /// enters moves `state` past it, one that does not runs from the state
    /// as it stands and leaves it as it was. With `split_from` at or before
    /// the row, a row that enters also adds its split to `split`; without
    /// it, the state forgets a split that ran (a split runs only while it is
    /// asked for, from its first row).
    pub(crate) fn step_row(
        &self,
        row: LinearRow<'_>,
        split_from: Option<usize>,
        state: &mut RecurrentState,
        out: &mut [f32],
        split: Option<&mut LinearSplit>,
    ) {
        let (hv, dv) = (self.shape.value_heads, self.shape.dv);
        if split_from.is_none() {
            state.stop_split();
        }
        if !row.enters {
            // from the state as it stands, which it leaves as it was
            let qkv = self.convolve(row.input, &mut state.conv.clone());
            self.recur(&qkv, row.gates, &mut state.matrix.clone(), true, out);
            return;
        }
        let qkv = self.convolve(row.input, &mut state.conv);
        match (split_from, split) {
            (Some(from), Some(rows)) if row.position >= from => {
                // the state's two parts: what it held when the split began,
                // moved by each token's transition alone, and what the
                // tokens from then on wrote, from zero
                let matrix = &state.matrix;
                let parts = state
                    .parts
                    .get_or_insert_with(|| Box::new((matrix.clone(), vec![0.0; matrix.len()])));
                let mut prompt = vec![0.0; hv * dv];
                let mut decode = vec![0.0; hv * dv];
                self.recur(&qkv, row.gates, &mut parts.0, false, &mut prompt);
                self.recur(&qkv, row.gates, &mut parts.1, true, &mut decode);
                rows.positions.push(row.position);
                rows.prompt.extend(self.shape.grouped(&prompt));
                rows.decode.extend(self.shape.grouped(&decode));
                self.recur(&qkv, row.gates, &mut state.matrix, true, out);
                rows.output.extend(self.shape.grouped(out));
            }
            _ => self.recur(&qkv, row.gates, &mut state.matrix, true, out),
        }
        state.tokens += 1;
        if state.tokens == 1 && state.keeps_first {
            state.first = Some(Box::new((state.conv.clone(), state.matrix.clone())));
        }
    }

    /// One row's output [value_heads, d_v] through the gated norm in place:
    /// each head RMS-normed by the norm's weight, times `silu(z)` of the
    /// row's gate `z` [value_heads * d_v] (the host form of what
    /// [`GatedDeltaNet::forward`] does with tensors).
    pub(crate) fn gate_row(&self, out: &mut [f32], z: &[f32], weight: &[f32]) {
        for (head, zh) in out
            .chunks_exact_mut(self.shape.dv)
            .zip(z.chunks_exact(self.shape.dv))
        {
            let mean = head.iter().map(|x| x * x).sum::<f32>() / head.len() as f32;
            let inv = 1.0 / (mean + self.eps).sqrt();
            for ((x, &w), &g) in head.iter_mut().zip(weight).zip(zh) {
                *x = *x * inv * w * silu(g);
            }
        }
    }

    /// The gated norm's weight [d_v] on the host.
    pub(crate) fn norm_weight(&self) -> Result<Vec<f32>> {
        Ok(self.norm.weight().to_dtype(DType::F32)?.to_vec1::<f32>()?)
    }

    /// Channels of the projected input (queries, keys and values) and the
    /// value heads' width in all: the widths of the rows the input
    /// projections give ([`GatedDeltaNet::linears`]: channels, value width,
    /// value heads, value heads).
    pub(crate) fn input_widths(&self) -> [usize; 4] {
        let s = self.shape;
        [s.channels(), s.value_width(), s.value_heads, s.value_heads]
    }

    /// One token's queries, keys and values [channels] after the
    /// convolution over the last kernel - 1 inputs held in `conv` and its
    /// projected `input` (queries and keys L2-normed per head, queries
    /// scaled by `1/sqrt(d_k)`); `conv` moves past it.
    fn convolve(&self, input: &[f32], conv: &mut [f32]) -> Vec<f32> {
        let s = self.shape;
        let (c, k) = (s.channels(), s.kernel);
        let mut row: Vec<f32> = (0..c)
            .map(|ch| {
                let w = &self.conv[ch * k..(ch + 1) * k];
                let past: f32 = (0..k - 1).map(|i| w[i] * conv[i * c + ch]).sum();
                silu(past + w[k - 1] * input[ch])
            })
            .collect();
        if k > 1 {
            conv.copy_within(c.., 0);
            conv[(k - 2) * c..].copy_from_slice(input);
        }
        let (q, rest) = row.split_at_mut(s.key_width());
        let keys = &mut rest[..s.key_width()];
        let q_scale = 1.0 / (s.dk as f32).sqrt();
        for h in 0..s.key_heads {
            l2_normalise(&mut q[h * s.dk..(h + 1) * s.dk], q_scale);
            l2_normalise(&mut keys[h * s.dk..(h + 1) * s.dk], 1.0);
        }
        row
    }

    /// One token's convolved `row` [channels] through the recurrence of
    /// every value head's `matrix` [value_heads, d_k, d_v] ([`recur_heads`]),
    /// its heads on rayon's threads when the state is large enough to pay
    /// for it (a real model's 32 heads of 128 x 128).
    fn recur(
        &self,
        row: &[f32],
        gates: (&[f32], &[f32]),
        matrix: &mut [f32],
        values: bool,
        out: &mut [f32],
    ) {
        /// States smaller than this (values) run on the calling thread.
        const PARALLEL_STATE: usize = 1 << 16;
        let parallel = matrix.len() >= PARALLEL_STATE;
        let rates = (&self.a_log[..], &self.dt_bias[..]);
        recur_heads(
            self.shape,
            rates,
            row,
            gates,
            matrix,
            (values, parallel),
            out,
        );
    }
}

/// The gated delta rule's inputs for `b` sequences of `t` rows
/// ([`GatedDeltaNet::forward_rows`]): queries and keys [b, t, value_heads,
/// d_k] per value head (normed, the queries scaled), values [b, t,
/// value_heads, d_v], decays [b, t, value_heads, 1, 1], rates [b, t,
/// value_heads, 1], and whether each row enters its sequence's state.
struct DeltaRule<'a> {
    q: &'a Tensor,
    keys: &'a Tensor,
    v: &'a Tensor,
    decay: &'a Tensor,
    beta: &'a Tensor,
    enters: &'a [bool],
}

impl DeltaRule<'_> {
    /// The outputs [b, t, value_heads, d_v] in candle's basic ops, row by
    /// row: where the fused op ([`grad_ops::delta_rule`]) cannot run (off
    /// the CPU, not f32), and its reference in the tests.
    fn composed(&self) -> Result<Tensor> {
        let (b, t, hv, dk) = self.q.dims4()?;
        let dv = self.v.dim(3)?;
        let dev = self.q.device();
        let flags = Tensor::from_iter(self.enters.iter().map(|&e| f32::from(u8::from(e))), dev)?
            .to_dtype(self.q.dtype())?
            .reshape((b, t, 1, 1, 1))?;
        let mut state = Tensor::zeros((b, hv, dk, dv), self.q.dtype(), dev)?;
        let mut outs = Vec::with_capacity(t);
        for p in 0..t {
            let at = |x: &Tensor| -> Result<Tensor> { Ok(x.narrow(1, p, 1)?.squeeze(1)?) };
            let (kp, qp) = (at(self.keys)?.unsqueeze(3)?, at(self.q)?.unsqueeze(3)?);
            let decayed = state.broadcast_mul(&at(self.decay)?)?;
            let recalled = decayed.broadcast_mul(&kp)?.sum(2)?;
            let delta = (at(self.v)? - recalled)?.broadcast_mul(&at(self.beta)?)?;
            let moved = (decayed + kp.broadcast_mul(&delta.unsqueeze(2)?)?)?;
            outs.push(moved.broadcast_mul(&qp)?.sum(2)?);
            let entering: Vec<bool> = (0..b).map(|i| self.enters[i * t + p]).collect();
            state = match (entering.iter().all(|&e| e), entering.iter().any(|&e| e)) {
                (true, _) => moved,
                (false, false) => state,
                (false, true) => {
                    let e = at(&flags)?;
                    (moved.broadcast_mul(&e)? + state.broadcast_mul(&e.affine(-1.0, 1.0)?)?)?
                }
            };
        }
        Ok(Tensor::stack(&outs, 1)?)
    }
}

/// One token's convolved `row` [channels] through the recurrence of every
/// value head's `matrix` [value_heads, d_k, d_v] of a layer of `shape` with
/// decay rates `(a_log, dt_bias)` [value_heads], with its `a` and `b`
/// [value_heads]; its output [value_heads, d_v] into `out`. `values`:
/// false reads the values as zero (the transition alone). The heads are
/// independent: with `parallel` they run on rayon's threads, each head's
/// arithmetic the same whichever thread runs it.
fn recur_heads(
    s: Shape,
    (a_log, dt_bias): (&[f32], &[f32]),
    row: &[f32],
    (a, b): (&[f32], &[f32]),
    matrix: &mut [f32],
    (values, parallel): (bool, bool),
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let (q, rest) = row.split_at(s.key_width());
    let (keys, v) = rest.split_at(s.key_width());
    let head = |h: usize, m: &mut [f32], o: &mut [f32]| {
        let decay = (-a_log[h].exp() * softplus(a[h] + dt_bias[h])).exp();
        let beta = sigmoid(b[h]);
        let kh = s.key_head_of(h);
        let (qh, kk) = (
            &q[kh * s.dk..(kh + 1) * s.dk],
            &keys[kh * s.dk..(kh + 1) * s.dk],
        );
        // the state decays, and what it recalls for this key is read in the
        // same pass; then the delta rule
        let mut delta = vec![0.0f32; s.dv];
        for (i, &ki) in kk.iter().enumerate() {
            for (d, x) in delta.iter_mut().zip(&mut m[i * s.dv..(i + 1) * s.dv]) {
                *x *= decay;
                *d += *x * ki;
            }
        }
        let vh = &v[h * s.dv..(h + 1) * s.dv];
        for (d, &vj) in delta.iter_mut().zip(vh) {
            let vj = if values { vj } else { 0.0 };
            *d = (vj - *d) * beta;
        }
        o.iter_mut().for_each(|x| *x = 0.0);
        for (i, (&ki, &qi)) in kk.iter().zip(qh).enumerate() {
            let mrow = &mut m[i * s.dv..(i + 1) * s.dv];
            for ((x, &d), oj) in mrow.iter_mut().zip(&delta).zip(o.iter_mut()) {
                *x += ki * d;
                *oj += *x * qi;
            }
        }
    };
    let per_head = s.dk * s.dv;
    if parallel {
        matrix
            .par_chunks_exact_mut(per_head)
            .zip(out.par_chunks_exact_mut(s.dv))
            .enumerate()
            .for_each(|(h, (m, o))| head(h, m, o));
    } else {
        matrix
            .chunks_exact_mut(per_head)
            .zip(out.chunks_exact_mut(s.dv))
            .enumerate()
            .for_each(|(h, (m, o))| head(h, m, o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;
    use lcut_kernels::testdata::Rng;
    use lcut_testkit::grads::{grad_diff, max_abs_diff, normal, probe_grads};

    /// Fixed draws of `shape` L2-normed over its last dimension (queries
    /// and keys as the layer normalises them).
    fn unit_rows(rng: &mut Rng, shape: &[usize]) -> Result<Tensor> {
        let x = normal(rng, 0.0, 1.0, shape)?;
        let norm = (x.sqr()?.sum_keepdim(shape.len() - 1)? + 1e-6)?.sqrt()?;
        Ok(x.broadcast_div(&norm)?)
    }

    /// The chunked form gives the composed ops' outputs and gradients
    /// (queries, keys, values, log decays, rates) when every row enters: 11
    /// rows in chunks of 4 (three chunks, the last padded) and in one chunk
    /// of 16.
    #[test]
    fn the_chunked_delta_rule_matches_the_composed_ops_and_their_gradients() -> Result<()> {
        let mut rng = Rng::new(0xc4a2);
        let (t, hv, dk, dv) = (11, 3, 4, 5);
        let q = Var::from_tensor(&unit_rows(&mut rng, &[1, t, hv, dk])?)?;
        let keys = Var::from_tensor(&unit_rows(&mut rng, &[1, t, hv, dk])?)?;
        let v = Var::from_tensor(&normal(&mut rng, 0.0, 1.0, &[1, t, hv, dv])?)?;
        let g = Var::from_tensor(&(normal(&mut rng, 0.0, 1.0, &[1, t, hv])?.abs()? * -0.5)?)?;
        let beta = Var::from_tensor(&candle_nn::ops::sigmoid(&normal(
            &mut rng,
            0.0,
            1.0,
            &[1, t, hv],
        )?)?)?;
        let enters = vec![true; t];
        let decay = g.exp()?.reshape((1, t, hv, 1, 1))?;
        let rates = beta.reshape((1, t, hv, 1))?;
        let rule = DeltaRule {
            q: &q,
            keys: &keys,
            v: &v,
            decay: &decay,
            beta: &rates,
            enters: &enters,
        };
        let composed = rule.composed()?;
        let heads_first = |x: &Tensor| -> Result<Tensor> {
            let x = x.squeeze(0)?.transpose(0, 1)?;
            Ok(x.contiguous()?)
        };
        let rows = chunked::DeltaRows {
            q: heads_first(&q)?,
            k: heads_first(&keys)?,
            v: heads_first(&v)?,
            g: heads_first(&g)?,
            beta: heads_first(&beta)?,
        };
        let start = Tensor::zeros((hv, dk, dv), DType::F32, &candle_core::Device::Cpu)?;
        let probe = normal(&mut rng, 0.0, 1.0, &[1, t, hv, dv])?;
        let grads_of_composed = probe_grads(&composed, &probe)?;
        for chunk in [4, 16] {
            let (out, _) = chunked::delta_rule_in_chunks(&rows, &start, chunk)?;
            let out = out.transpose(0, 1)?.unsqueeze(0)?;
            let diff = max_abs_diff(&out, &composed);
            assert!(diff < 1e-5, "chunks of {chunk}: outputs differ by {diff}");
            let grads = probe_grads(&out, &probe)?;
            for (name, var) in [
                ("q", &q),
                ("k", &keys),
                ("v", &v),
                ("g", &g),
                ("beta", &beta),
            ] {
                let diff = grad_diff(&grads, &grads_of_composed, var);
                assert!(
                    diff < 1e-4,
                    "chunks of {chunk}: d/d{name} differs by {diff}"
                );
            }
        }
        Ok(())
    }

    /// The fused delta rule gives the composed ops' outputs and gradients
    /// (queries, keys, values, decays, rates), two sequences whose rows
    /// enter the state or not as SPEED's rows above a cut do.
    #[test]
    fn the_fused_delta_rule_matches_the_composed_ops_and_their_gradients() -> Result<()> {
        let mut rng = Rng::new(0xde17a);
        let (b, t, hv, dk, dv) = (2, 7, 3, 4, 5);
        let q = Var::from_tensor(&unit_rows(&mut rng, &[b, t, hv, dk])?)?;
        let keys = Var::from_tensor(&unit_rows(&mut rng, &[b, t, hv, dk])?)?;
        let v = Var::from_tensor(&normal(&mut rng, 0.0, 1.0, &[b, t, hv, dv])?)?;
        let decay = Var::from_tensor(
            &(normal(&mut rng, 0.0, 1.0, &[b, t, hv, 1, 1])?.abs()? * -0.5)?.exp()?,
        )?;
        let beta = Var::from_tensor(&candle_nn::ops::sigmoid(&normal(
            &mut rng,
            0.0,
            1.0,
            &[b, t, hv, 1],
        )?)?)?;
        // sequence 0 runs every row; sequence 1 keeps BoS and its last three rows only
        let enters: Vec<bool> = (0..b * t).map(|r| r <= t || r >= 2 * t - 3).collect();
        let rule = DeltaRule {
            q: &q,
            keys: &keys,
            v: &v,
            decay: &decay,
            beta: &beta,
            enters: &enters,
        };
        let slow = rule.composed()?;
        let qkv = Tensor::cat(&[q.as_tensor(), keys.as_tensor(), v.as_tensor()], 3)?;
        let gates = Tensor::cat(&[&decay.reshape((b, t, hv, 1))?, beta.as_tensor()], 3)?;
        let fused = grad_ops::delta_rule(&qkv, &gates, dk, Arc::new(enters.clone()))?;
        let diff = max_abs_diff(&fused, &slow);
        assert!(diff < 1e-5, "outputs differ by {diff}");
        let probe = normal(&mut rng, 0.0, 1.0, &[b, t, hv, dv])?;
        let (gf, gs) = (probe_grads(&fused, &probe)?, probe_grads(&slow, &probe)?);
        for (name, var) in [
            ("q", &q),
            ("k", &keys),
            ("v", &v),
            ("decay", &decay),
            ("beta", &beta),
        ] {
            let diff = grad_diff(&gf, &gs, var);
            assert!(diff < 1e-4, "{name}: gradients differ by {diff}");
            let a = gf.get(var).expect("fused grad");
            assert!(
                max_abs_diff(a, &a.zeros_like()?) > 0.0,
                "{name}: no gradient"
            );
        }
        Ok(())
    }

    /// The heads run on rayon's threads give the bits they give on one
    /// thread: a real model's layer (16 key heads, 32 value heads of 128,
    /// grouped and tiled), five tokens, state and outputs.
    #[test]
    fn parallel_heads_equal_one_thread_bit_for_bit() {
        let mut seed = 7u64;
        let mut draw = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
                })
                .collect()
        };
        for tiled in [false, true] {
            let s = Shape {
                key_heads: 16,
                value_heads: 32,
                dk: 128,
                dv: 128,
                kernel: 4,
                tiled,
            };
            let (a_log, dt_bias) = (draw(32, 2.0), draw(32, 1.0));
            let mut states = [vec![0.0f32; 32 * 128 * 128], vec![0.0f32; 32 * 128 * 128]];
            for _ in 0..5 {
                let (row, a, b) = (draw(s.channels(), 1.0), draw(32, 2.0), draw(32, 2.0));
                let mut outs = [vec![0.0f32; 32 * 128], vec![0.0f32; 32 * 128]];
                for (parallel, (m, o)) in [false, true]
                    .into_iter()
                    .zip(states.iter_mut().zip(&mut outs))
                {
                    recur_heads(
                        s,
                        (&a_log, &dt_bias),
                        &row,
                        (&a, &b),
                        m,
                        (true, parallel),
                        o,
                    );
                }
                assert!(outs[0].iter().any(|x| *x != 0.0));
                assert!(
                    outs[0]
                        .iter()
                        .zip(&outs[1])
                        .all(|(x, y)| x.to_bits() == y.to_bits())
                );
                assert!(
                    states[0]
                        .iter()
                        .zip(&states[1])
                        .all(|(x, y)| x.to_bits() == y.to_bits())
                );
            }
        }
    }
}
