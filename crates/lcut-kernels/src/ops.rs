//! The small element-wise steps of a decoder layer, in place or into
//! caller-owned buffers: RMSNorm, RoPE, gated activations, residual adds,
//! soft-caps. Each works on rows of a few hundred to a few thousand values,
//! which the compiler vectorizes well enough; they cost little beside the
//! products, except where libm runs once per value: the gated activations
//! and the soft cap take the vectorized `exp` on AVX2 and AVX-512
//! (`simd::elementwise`).

use crate::error::{KernelError, Result, check_len};

/// `out = x / sqrt(mean(x^2) + eps) * weight` for each row of `x` (rows of
/// `weight.len()` values); `out` may not alias `x` (see [`rms_norm_in_place`]).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    check_len("rms_norm output", x.len(), out.len())?;
    let width = weight.len();
    if width == 0 || !x.len().is_multiple_of(width) {
        return Err(KernelError::Length {
            what: "rms_norm input (a whole number of rows)",
            expected: x.len().div_ceil(width.max(1)) * width,
            got: x.len(),
        });
    }
    for (xr, or) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let inv = inverse_rms(xr, eps);
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
    Ok(())
}

/// [`rms_norm`] overwriting `x`.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) -> Result<()> {
    let width = weight.len();
    if width == 0 || !x.len().is_multiple_of(width) {
        return Err(KernelError::Length {
            what: "rms_norm input (a whole number of rows)",
            expected: x.len().div_ceil(width.max(1)) * width,
            got: x.len(),
        });
    }
    for xr in x.chunks_exact_mut(width) {
        let inv = inverse_rms(xr, eps);
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = *v * inv * w;
        }
    }
    Ok(())
}

/// 1 / sqrt(mean(x^2) + eps), the mean summed in f32 over eight lanes.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    let sum = lanes.iter().sum::<f32>() + tail;
    1.0 / (sum / x.len() as f32 + eps).sqrt()
}

/// Rotate each head of `x` (`heads` rows of `head_dim` values) in place by
/// RoPE in the half-split (NeoX) layout: for i < rotary/2, the pair
/// (x[i], x[i + rotary/2]) turns by the angle whose cosine and sine are
/// `cos[i]`, `sin[i]`; values past `rotary = 2 cos.len()` pass through.
/// The tables come from the caller (scaled frequencies included).
pub fn rope_in_place(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) -> Result<()> {
    check_len("rope sin table", cos.len(), sin.len())?;
    let half = cos.len();
    if 2 * half > head_dim || head_dim == 0 || !x.len().is_multiple_of(head_dim) {
        return Err(KernelError::Heads(format!(
            "rotary width {} in heads of {head_dim} over {} values",
            2 * half,
            x.len()
        )));
    }
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, hi) = head[..2 * half].split_at_mut(half);
        for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
            let (x0, x1) = (*a, *b);
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
    }
    Ok(())
}

/// The gate's activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GateActivation {
    /// x sigmoid(x).
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// gpt-oss's SwiGLU: `g = min(gate, limit)`, `u = clamp(up, -limit,
    /// limit)`, then `(u + 1) g sigmoid(alpha g)`.
    ClampedSwiGlu {
        /// The clamp.
        limit: f32,
        /// The sigmoid's slope.
        alpha: f32,
    },
}

/// `gate[i] = act(gate[i]) * up[i]`, in place: on AVX2 and AVX-512 through
/// the vectorized `exp` (the same bits on both, whatever the slice's
/// length), else the portable form.
pub fn gate_in_place(gate: &mut [f32], up: &[f32], act: GateActivation) -> Result<()> {
    check_len("gated MLP up", gate.len(), up.len())?;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::elementwise::gate_in_place(gate, up, act) {
        return Ok(());
    }
    portable_gate_in_place(gate, up, act);
    Ok(())
}

/// [`gate_in_place`]'s portable form (libm's `exp` and `tanh`), on slices
/// of the same length.
pub(crate) fn portable_gate_in_place(gate: &mut [f32], up: &[f32], act: GateActivation) {
    match act {
        GateActivation::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        GateActivation::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = *g;
                let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                *g = 0.5 * x * (1.0 + inner.tanh()) * u;
            }
        }
        GateActivation::ClampedSwiGlu { limit, alpha } => {
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = g.min(limit);
                let u = u.clamp(-limit, limit);
                *g = (u + 1.0) * (x / (1.0 + (-alpha * x).exp()));
            }
        }
    }
}

/// `acc[i] += x[i]`.
pub fn add_in_place(acc: &mut [f32], x: &[f32]) -> Result<()> {
    check_len("residual add", acc.len(), x.len())?;
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v;
    }
    Ok(())
}

/// `x[i] = cap tanh(x[i] / cap)` (Gemma-2's logit soft-cap): on AVX2 and
/// AVX-512 through the vectorized `exp`, within a few ulps of the cap of
/// the portable `tanh`, the same bits on both levels wherever a value sits.
pub fn softcap_in_place(x: &mut [f32], cap: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::elementwise::softcap_in_place(x, cap) {
        return;
    }
    portable_softcap_in_place(x, cap);
}

/// [`softcap_in_place`]'s portable form (libm's `tanh`): the attention
/// kernels cap their scores with it on every level, as they cap the
/// current token's score, so that a key's score is the same whether it
/// comes from the cache or is the token's own.
pub(crate) fn portable_softcap_in_place(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// `x[i] += b[i % b.len()]` (a bias over rows of `b.len()` values).
pub fn add_bias_in_place(x: &mut [f32], b: &[f32]) -> Result<()> {
    if b.is_empty() || !x.len().is_multiple_of(b.len()) {
        return Err(KernelError::Length {
            what: "bias (rows of the output width)",
            expected: b.len(),
            got: x.len(),
        });
    }
    for row in x.chunks_exact_mut(b.len()) {
        add_in_place(row, b)?;
    }
    Ok(())
}

/// `out` [cols, rows] = `x` [rows, cols] transposed.
pub fn transpose(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    for (r, row) in x.chunks_exact(cols).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_makes_unit_rms_times_weight() {
        let x = [1.0f32, -2.0, 3.0, -4.0, 0.5, 0.5, 0.5, 0.5];
        let w = [1.0f32, 2.0, 1.0, 1.0];
        let mut out = [0f32; 8];
        rms_norm(&x, &w, 0.0, &mut out).expect("two rows");
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f32).sqrt();
        assert!((out[1] - (-2.0 / rms * 2.0)).abs() < 1e-6);
        assert!((out[4] - 1.0).abs() < 1e-6);
        let mut y = x;
        rms_norm_in_place(&mut y, &w, 0.0).expect("two rows");
        assert_eq!(y, out);
        assert!(rms_norm(&x[..7], &w, 0.0, &mut out[..7]).is_err());
    }

    #[test]
    fn rope_turns_pairs_half_a_head_apart_and_passes_the_rest() {
        // head of 6, rotary 4: pairs (0, 2) and (1, 3); 4 and 5 pass
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let (c, s) = (0.6f32, 0.8f32);
        rope_in_place(&mut x, 6, &[c, 1.0], &[s, 0.0]).expect("fits");
        assert!((x[0] - (1.0 * c - 3.0 * s)).abs() < 1e-6);
        assert!((x[2] - (1.0 * s + 3.0 * c)).abs() < 1e-6);
        assert_eq!((x[1], x[3], x[4], x[5]), (2.0, 4.0, 5.0, 6.0));
        assert!(rope_in_place(&mut x, 6, &[1.0; 4], &[0.0; 4]).is_err());
    }

    #[test]
    fn gates_match_their_formulas() {
        let mut g = [-1.0f32, 0.0, 2.0];
        gate_in_place(&mut g, &[2.0, 3.0, 0.5], GateActivation::Silu).expect("same length");
        assert!((g[0] - (-1.0 / (1.0 + 1f32.exp()) * 2.0)).abs() < 1e-6);
        assert_eq!(g[1], 0.0);
        let mut h = [1.0f32];
        gate_in_place(&mut h, &[1.0], GateActivation::GeluTanh).expect("same length");
        // gpt-oss's: gate clamped above at 1, up to +-1, (u + 1) g sigmoid(1.702 g)
        let act = GateActivation::ClampedSwiGlu {
            limit: 1.0,
            alpha: 1.702,
        };
        let mut c = [3.0f32, -2.0, 0.5];
        gate_in_place(&mut c, &[5.0, -0.5, -3.0], act).expect("same length");
        let want = |g: f32, u: f32| (u + 1.0) * g / (1.0 + (-1.702 * g).exp());
        let expected = [want(1.0, 1.0), want(-2.0, -0.5), want(0.5, -1.0)];
        for (got, w) in c.iter().zip(expected) {
            assert!((got - w).abs() < 1e-6, "{got} vs {w}");
        }
        assert!((h[0] - 0.841_192).abs() < 1e-5);
    }

    #[test]
    fn transpose_swaps_rows_and_columns() {
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut t = [0f32; 6];
        transpose(&x, 2, 3, &mut t);
        assert_eq!(t, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
