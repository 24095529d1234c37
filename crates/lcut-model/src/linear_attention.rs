//! Qwen3.5's linear-attention layer (Gated DeltaNet), as transformers 5.24
//! computes it, and the fixed-size state a sequence keeps for each such
//! layer beside its K/V cache.
//!
//! For each row, in position order: the input's projection to queries,
//! keys and values passes a depthwise causal convolution (kernel `K`, over
//! this row and the `K - 1` rows before it, then SiLU); queries and keys
//! are L2-normalised per head and the queries scaled by `1/sqrt(d_k)`; each
//! value head `h` (reading key head `h / (H_v / H_k)`) keeps a state `S`
//! (`d_k x d_v`) that decays by `exp(g)`, `g = -exp(A_log) * softplus(a +
//! dt_bias)`, and learns the row's value by the delta rule with rate
//! `beta = sigmoid(b)`: `S <- e^g S; S <- S + k (beta (v - S^T k))^T`; the
//! row's output is `S^T q`, then an RMSNorm per head (a plain `w` weight)
//! times `silu(z)`. The recurrence runs token by token on the host in f32
//! (transformers' chunked form is the same sum in another order), so a
//! prompt in one chunk, in chunks, or one token at a time gives the same
//! state. Which tokens run a layer and which enter its state is the
//! policy's (`lcut_policy::RecurrentLayers`).

use candle_core::{DType, Tensor};

use crate::config::LinearAttentionConfig;
use crate::error::Result;
use crate::layers::Loader;
use crate::linear::Linear;

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
    /// The gated norm's weight [value_head_dim] (plain `w`).
    norm_weight: Tensor,
    /// The norm's epsilon.
    eps: f32,
    /// Heads, widths and kernel.
    shape: Shape,
}

/// The sizes a linear layer computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    key_heads: usize,
    value_heads: usize,
    dk: usize,
    dv: usize,
    kernel: usize,
}

impl Shape {
    fn of(c: &LinearAttentionConfig) -> Self {
        Self {
            key_heads: c.key_heads,
            value_heads: c.value_heads,
            dk: c.key_head_dim,
            dv: c.value_head_dim,
            kernel: c.conv_kernel,
        }
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
}

impl RecurrentState {
    /// The empty state (no token has run) of a layer of `shape`.
    fn new(shape: Shape) -> Self {
        Self {
            conv: vec![0.0; (shape.kernel - 1) * shape.channels()],
            matrix: vec![0.0; shape.value_heads * shape.dk * shape.dv],
            tokens: 0,
        }
    }

    /// Bytes the state holds (f32): the same whatever the number of tokens
    /// that entered it.
    pub fn bytes(&self) -> usize {
        4 * (self.conv.len() + self.matrix.len())
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

impl GatedDeltaNet {
    /// The linear-attention layer at `prefix` (`model.layers.N.linear_attn`).
    pub(crate) fn load(ld: &Loader<'_>, prefix: &str, c: &LinearAttentionConfig) -> Result<Self> {
        let shape = Shape::of(c);
        let d = ld.cfg.hidden_size;
        let host = |name: &str, dims: &[usize]| -> Result<Vec<f32>> {
            let t = ld.files.load(
                &format!("{prefix}.{name}"),
                dims,
                DType::F32,
                &candle_core::Device::Cpu,
            )?;
            Ok(t.flatten_all()?.to_vec1::<f32>()?)
        };
        let linear =
            |name: &str, rows: usize| ld.linear(&format!("{prefix}.{name}"), rows, d, false);
        Ok(Self {
            in_qkv: linear("in_proj_qkv", shape.channels())?,
            in_z: linear("in_proj_z", shape.value_width())?,
            in_b: linear("in_proj_b", shape.value_heads)?,
            in_a: linear("in_proj_a", shape.value_heads)?,
            conv: host("conv1d.weight", &[shape.channels(), 1, shape.kernel])?,
            a_log: host("A_log", &[shape.value_heads])?,
            dt_bias: host("dt_bias", &[shape.value_heads])?,
            // the gated norm's weight is plain `w`, unlike the model's other norms
            norm_weight: ld.tensor(&format!("{prefix}.norm.weight"), &[shape.dv])?,
            eps: ld.cfg.rms_norm_eps as f32,
            shape,
        })
    }

    /// The layer's matrices (its output projection is the layer's
    /// attention output, held by its `AttentionProj`).
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        vec![&self.in_qkv, &self.in_z, &self.in_b, &self.in_a]
    }

    /// The empty state of this layer.
    pub(crate) fn new_state(&self) -> RecurrentState {
        RecurrentState::new(self.shape)
    }

    /// Value heads and their width: the shape of the layer's output.
    pub(crate) fn output_heads(&self) -> (usize, usize) {
        (self.shape.value_heads, self.shape.dv)
    }

    /// The layer's output for rows `x` [n, hidden] (the normed residual
    /// stream of `n` tokens in position order, following those `state`
    /// has seen), as value heads first [value_heads, n, d_v], gated and
    /// normed, ready for the output projection. A row whose `enters[i]`
    /// holds moves `state` past it; one whose does not runs from the state
    /// as it stands and leaves it as it was (SelfOnly's decode-phase
    /// tokens above its cut).
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        enters: &[bool],
        state: &mut RecurrentState,
    ) -> Result<Tensor> {
        let n = x.dim(0)?;
        let host = |t: Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let mixed = host(self.in_qkv.forward(x)?)?;
        let a = host(self.in_a.forward(x)?)?;
        let b = host(self.in_b.forward(x)?)?;
        let (hv, dv) = (self.shape.value_heads, self.shape.dv);
        let mut out = vec![0.0f32; n * hv * dv];
        let c = self.shape.channels();
        let mut row = vec![0.0f32; c];
        let mut scratch = Vec::new();
        for t in 0..n {
            let i = t * hv;
            let o = &mut out[i * dv..(i + hv) * dv];
            let input = &mixed[t * c..(t + 1) * c];
            let heads = (&a[i..i + hv], &b[i..i + hv]);
            match enters.get(t).copied().unwrap_or(true) {
                true => self.step(input, heads, state, &mut row, o),
                false => {
                    scratch.clone_from(&state.matrix);
                    let mut alone = RecurrentState {
                        conv: state.conv.clone(),
                        matrix: std::mem::take(&mut scratch),
                        tokens: state.tokens,
                    };
                    self.step(input, heads, &mut alone, &mut row, o);
                    scratch = alone.matrix;
                }
            }
        }
        let out = Tensor::from_vec(out, (n, hv, dv), x.device())?.to_dtype(x.dtype())?;
        let z = self.in_z.forward(x)?.reshape((n, hv, dv))?;
        let normed = candle_nn::ops::rms_norm(&out, &self.norm_weight, self.eps)?;
        let gated = (normed * candle_nn::ops::silu(&z)?)?;
        Ok(gated.transpose(0, 1)?.contiguous()?)
    }

    /// One token through the convolution and the recurrence: its projected
    /// `input` [channels], its `a` and `b` [value_heads]; its output [value
    /// heads, d_v] into `out` (before the gated norm), `state` moved past
    /// it; `row` is scratch of `channels` values.
    fn step(
        &self,
        input: &[f32],
        (a, b): (&[f32], &[f32]),
        state: &mut RecurrentState,
        row: &mut [f32],
        out: &mut [f32],
    ) {
        let s = self.shape;
        let (c, k) = (s.channels(), s.kernel);
        // the convolution over the last kernel - 1 inputs and this one
        for (ch, r) in row.iter_mut().enumerate() {
            let w = &self.conv[ch * k..(ch + 1) * k];
            let past: f32 = (0..k - 1).map(|i| w[i] * state.conv[i * c + ch]).sum();
            *r = silu(past + w[k - 1] * input[ch]);
        }
        if k > 1 {
            state.conv.copy_within(c.., 0);
            state.conv[(k - 2) * c..].copy_from_slice(input);
        }
        let (q, rest) = row.split_at_mut(s.key_width());
        let (keys, v) = rest.split_at_mut(s.key_width());
        let q_scale = 1.0 / (s.dk as f32).sqrt();
        for h in 0..s.key_heads {
            l2_normalise(&mut q[h * s.dk..(h + 1) * s.dk], q_scale);
            l2_normalise(&mut keys[h * s.dk..(h + 1) * s.dk], 1.0);
        }
        let group = s.value_heads / s.key_heads;
        let mut delta = vec![0.0f32; s.dv];
        for h in 0..s.value_heads {
            let decay = (-self.a_log[h].exp() * softplus(a[h] + self.dt_bias[h])).exp();
            let beta = sigmoid(b[h]);
            let kh = h / group;
            let qh = &q[kh * s.dk..(kh + 1) * s.dk];
            let kk = &keys[kh * s.dk..(kh + 1) * s.dk];
            let vh = &v[h * s.dv..(h + 1) * s.dv];
            let m = &mut state.matrix[h * s.dk * s.dv..(h + 1) * s.dk * s.dv];
            m.iter_mut().for_each(|x| *x *= decay);
            // what the state recalls for this key, then the delta rule
            delta.iter_mut().for_each(|x| *x = 0.0);
            for (i, &ki) in kk.iter().enumerate() {
                for (d, &x) in delta.iter_mut().zip(&m[i * s.dv..(i + 1) * s.dv]) {
                    *d += x * ki;
                }
            }
            for (d, &vj) in delta.iter_mut().zip(vh) {
                *d = (vj - *d) * beta;
            }
            let o = &mut out[h * s.dv..(h + 1) * s.dv];
            o.iter_mut().for_each(|x| *x = 0.0);
            for (i, (&ki, &qi)) in kk.iter().zip(qh).enumerate() {
                let mrow = &mut m[i * s.dv..(i + 1) * s.dv];
                for ((x, &d), oj) in mrow.iter_mut().zip(&delta).zip(o.iter_mut()) {
                    *x += ki * d;
                    *oj += *x * qi;
                }
            }
        }
        state.tokens += 1;
    }
}
