//! RMSNorm, RoPE and the gated delta rule (Qwen3.5's linear layers) as
//! single CPU ops with their own backward, for passes
//! that carry gradients (the trainers): candle's fused kernels have no
//! backward, and the same functions composed of basic ops allocate several
//! tensors of the activations' size per call, which dominated a training
//! step. Each is held to the composed ops, values and gradients, by the
//! tests below.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

/// Flat f32 data of a CPU tensor given as storage and layout.
fn f32_slice<'a>(
    name: &str,
    storage: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{name}: expected f32 data");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{name}: expected contiguous data");
    };
    Ok(&data[start..end])
}

/// Whether the fused ops can take `t`: an f32 tensor on the CPU.
pub(crate) fn takes(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == candle_core::DType::F32
}

/// RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) * w`, as one
/// op with its backward (`x` and `w` f32 on the CPU).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNormOp { eps })
}

#[derive(Debug, Clone, Copy)]
struct RmsNormOp {
    eps: f32,
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "lcut-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_slice(self.name(), s1, l1)?;
        let w = f32_slice(self.name(), s2, l2)?;
        let d = w.len();
        if d == 0 || !x.len().is_multiple_of(d) {
            candle_core::bail!("{}: width {d} does not divide {}", self.name(), x.len());
        }
        let mut out = vec![0f32; x.len()];
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
                *o = xv * inv * wv;
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let ws = w.flatten_all()?.to_vec1::<f32>()?;
        let gs = grad.flatten_all()?.to_vec1::<f32>()?;
        let d = ws.len();
        let mut dx = vec![0f32; xs.len()];
        let mut dw = vec![0f32; d];
        for ((xr, gr), dxr) in xs
            .chunks_exact(d)
            .zip(gs.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
        {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            // y = xhat * w with xhat = x * inv; dxhat = g * w;
            // dx = inv * (dxhat - xhat * mean(dxhat * xhat)).
            let mut dot = 0f32;
            for i in 0..d {
                let xhat = xr[i] * inv;
                dw[i] += gr[i] * xhat;
                dot += gr[i] * ws[i] * xhat;
            }
            let mean = dot / d as f32;
            for i in 0..d {
                let xhat = xr[i] * inv;
                dxr[i] = inv * (gr[i] * ws[i] - xhat * mean);
            }
        }
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ))
    }
}

/// Half-split (NeoX) rotary embedding of every head of `x` [..., n,
/// head_dim] at the rows of `cos` / `sin` [n, head_dim / 2], as one op with
/// its backward (f32 on the CPU).
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let op = RopeOp {
        cos: Arc::new(cos.flatten_all()?.to_vec1::<f32>()?),
        sin: Arc::new(sin.flatten_all()?.to_vec1::<f32>()?),
        rows: cos.dim(0)?,
    };
    x.contiguous()?.apply_op1(op)
}

#[derive(Debug, Clone)]
struct RopeOp {
    cos: Arc<Vec<f32>>,
    sin: Arc<Vec<f32>>,
    /// The rows of the tables (positions); a head's rows repeat them.
    rows: usize,
}

impl RopeOp {
    /// Rotate every head_dim-row of `x` (rows ordered ..., position); with
    /// `inverse` the rotation runs backwards (the backward pass).
    fn rotate(&self, x: &[f32], inverse: bool) -> candle_core::Result<Vec<f32>> {
        let half = self.cos.len() / self.rows.max(1);
        let hd = 2 * half;
        if hd == 0 || !x.len().is_multiple_of(hd * self.rows) {
            candle_core::bail!(
                "lcut-rope: {} values do not fit {} rows x {hd}",
                x.len(),
                self.rows
            );
        }
        let sign = if inverse { -1.0 } else { 1.0 };
        let mut out = vec![0f32; x.len()];
        for (r, (xr, or)) in x.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
            let p = r % self.rows;
            let (c, s) = (
                &self.cos[p * half..(p + 1) * half],
                &self.sin[p * half..(p + 1) * half],
            );
            for i in 0..half {
                let (x1, x2) = (xr[i], xr[i + half]);
                let si = sign * s[i];
                or[i] = x1 * c[i] - x2 * si;
                or[i + half] = x2 * c[i] + x1 * si;
            }
        }
        Ok(out)
    }
}

impl CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "lcut-rope"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_slice(self.name(), storage, layout)?;
        let out = self.rotate(x, false)?;
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let g = grad.flatten_all()?.to_vec1::<f32>()?;
        let d = self.rotate(&g, true)?;
        Ok(Some(Tensor::from_vec(d, res.shape(), res.device())?))
    }
}

/// The gated delta rule of a linear layer over `b` sequences of `t` rows,
/// as one op with its backward (f32 on the CPU): `qkv` [b, t, heads, 2 d_k +
/// d_v] holds each value head's query (normed and scaled), key (normed) and
/// value side by side, `gates` [b, t, heads, 2] its decay `exp(g)` and rate
/// `beta`. Per sequence and head, from a zero state `S` [d_k, d_v]: `S' =
/// decay S`, `S_new = S' + k (beta (v - S'^T k))^T`, output `S_new^T q`
/// [b, t, heads, d_v]; the state moves to `S_new` where `enters[i * t + p]`
/// holds and stays `S` otherwise.
pub(crate) fn delta_rule(
    qkv: &Tensor,
    gates: &Tensor,
    dk: usize,
    enters: Arc<Vec<bool>>,
) -> candle_core::Result<Tensor> {
    let (b, t, heads, width) = qkv.dims4()?;
    if width <= 2 * dk || gates.dims4()? != (b, t, heads, 2) || enters.len() != b * t {
        candle_core::bail!(
            "lcut-delta-rule: qkv {:?}, gates {:?}, {} entry flags, d_k {dk}",
            qkv.dims(),
            gates.dims(),
            enters.len()
        );
    }
    let op = DeltaRuleOp {
        dims: DeltaDims {
            t,
            heads,
            dk,
            dv: width - 2 * dk,
        },
        enters,
    };
    qkv.contiguous()?.apply_op2(&gates.contiguous()?, op)
}

/// The sizes of a [`delta_rule`] call.
#[derive(Debug, Clone, Copy)]
struct DeltaDims {
    t: usize,
    heads: usize,
    dk: usize,
    dv: usize,
}

#[derive(Debug, Clone)]
struct DeltaRuleOp {
    dims: DeltaDims,
    /// [b * t]: whether each row moves its sequence's state.
    enters: Arc<Vec<bool>>,
}

/// One row of one head of a [`delta_rule`] call: its query, key, value,
/// decay and rate.
struct DeltaRow<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    decay: f32,
    beta: f32,
}

impl DeltaRuleOp {
    /// Sequence `seq`'s head `h` at row `p`.
    fn row<'a>(
        &self,
        qkv: &'a [f32],
        gates: &'a [f32],
        seq: usize,
        p: usize,
        h: usize,
    ) -> DeltaRow<'a> {
        let d = self.dims;
        let unit = (seq * d.t + p) * d.heads + h;
        let w = 2 * d.dk + d.dv;
        let x = &qkv[unit * w..(unit + 1) * w];
        DeltaRow {
            q: &x[..d.dk],
            k: &x[d.dk..2 * d.dk],
            v: &x[2 * d.dk..],
            decay: gates[2 * unit],
            beta: gates[2 * unit + 1],
        }
    }

    /// One step from `state` [d_k, d_v]: the decayed state `S'` into
    /// `decayed`, the moved state `S_new` into `moved`, and `beta (v -
    /// S'^T k)` returned with `S'^T k`.
    fn step(
        &self,
        row: &DeltaRow<'_>,
        state: &[f32],
        decayed: &mut [f32],
        moved: &mut [f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let dv = self.dims.dv;
        let mut recalled = vec![0f32; dv];
        for (i, &ki) in row.k.iter().enumerate() {
            for j in 0..dv {
                let x = row.decay * state[i * dv + j];
                decayed[i * dv + j] = x;
                recalled[j] += x * ki;
            }
        }
        let delta: Vec<f32> = (0..dv)
            .map(|j| row.beta * (row.v[j] - recalled[j]))
            .collect();
        for (i, &ki) in row.k.iter().enumerate() {
            for j in 0..dv {
                moved[i * dv + j] = decayed[i * dv + j] + ki * delta[j];
            }
        }
        (delta, recalled)
    }

    /// Every head of every sequence, `each(seq, h)` on rayon's threads,
    /// the units' results in order.
    fn units<R: Send>(&self, b: usize, each: impl Fn(usize, usize) -> R + Sync) -> Vec<R> {
        use rayon::prelude::*;
        let heads = self.dims.heads;
        (0..b * heads)
            .into_par_iter()
            .map(|u| each(u / heads, u % heads))
            .collect()
    }
}

impl CustomOp2 for DeltaRuleOp {
    fn name(&self) -> &'static str {
        "lcut-delta-rule"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = f32_slice(self.name(), s1, l1)?;
        let gates = f32_slice(self.name(), s2, l2)?;
        let DeltaDims { t, heads, dk, dv } = self.dims;
        let b = self.enters.len() / t;
        let per_unit = self.units(b, |seq, h| {
            let mut state = vec![0f32; dk * dv];
            let (mut decayed, mut moved) = (vec![0f32; dk * dv], vec![0f32; dk * dv]);
            let mut out = vec![0f32; t * dv];
            for p in 0..t {
                let row = self.row(qkv, gates, seq, p, h);
                self.step(&row, &state, &mut decayed, &mut moved);
                for (i, &qi) in row.q.iter().enumerate() {
                    for j in 0..dv {
                        out[p * dv + j] += moved[i * dv + j] * qi;
                    }
                }
                if self.enters[seq * t + p] {
                    std::mem::swap(&mut state, &mut moved);
                }
            }
            out
        });
        let mut out = vec![0f32; b * t * heads * dv];
        for (u, unit) in per_unit.iter().enumerate() {
            let (seq, h) = (u / heads, u % heads);
            for p in 0..t {
                let at = ((seq * t + p) * heads + h) * dv;
                out[at..at + dv].copy_from_slice(&unit[p * dv..(p + 1) * dv]);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((b, t, heads, dv))))
    }

    fn bwd(
        &self,
        qkv: &Tensor,
        gates: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (qs, gs) = (
            qkv.flatten_all()?.to_vec1::<f32>()?,
            gates.flatten_all()?.to_vec1::<f32>()?,
        );
        let dout = grad.flatten_all()?.to_vec1::<f32>()?;
        let DeltaDims { t, heads, dk, dv } = self.dims;
        let (b, w) = (self.enters.len() / t, 2 * dk + dv);
        // per unit: d(qkv) [t, w] and d(gates) [t, 2]
        let per_unit = self.units(b, |seq, h| {
            // the state before each row, forward
            let mut before = vec![0f32; (t + 1) * dk * dv];
            let (mut decayed, mut moved) = (vec![0f32; dk * dv], vec![0f32; dk * dv]);
            for p in 0..t {
                let row = self.row(&qs, &gs, seq, p, h);
                let (cur, next) = before.split_at_mut((p + 1) * dk * dv);
                let state = &cur[p * dk * dv..];
                self.step(&row, state, &mut decayed, &mut moved);
                let kept = if self.enters[seq * t + p] {
                    &moved[..]
                } else {
                    state
                };
                next[..dk * dv].copy_from_slice(kept);
            }
            // then backward, carrying the gradient of the state each row leaves
            let (mut dx, mut dg) = (vec![0f32; t * w], vec![0f32; t * 2]);
            let mut carried = vec![0f32; dk * dv];
            let mut d_moved = vec![0f32; dk * dv];
            for p in (0..t).rev() {
                let row = self.row(&qs, &gs, seq, p, h);
                let state = &before[p * dk * dv..(p + 1) * dk * dv];
                let (delta, recalled) = self.step(&row, state, &mut decayed, &mut moved);
                let at = ((seq * t + p) * heads + h) * dv;
                let d_out = &dout[at..at + dv];
                let enters = self.enters[seq * t + p];
                let (dq, rest) = dx[p * w..(p + 1) * w].split_at_mut(dk);
                let (dkey, dval) = rest.split_at_mut(dk);
                // out = S_new^T q
                for i in 0..dk {
                    let mut dqi = 0f32;
                    for j in 0..dv {
                        dqi += moved[i * dv + j] * d_out[j];
                        let from_state = if enters { carried[i * dv + j] } else { 0.0 };
                        d_moved[i * dv + j] = row.q[i] * d_out[j] + from_state;
                    }
                    dq[i] = dqi;
                }
                // S_new = S' + k delta^T; delta = beta (v - S'^T k)
                let mut d_delta = vec![0f32; dv];
                for i in 0..dk {
                    let mut dki = 0f32;
                    for j in 0..dv {
                        dki += d_moved[i * dv + j] * delta[j];
                        d_delta[j] += d_moved[i * dv + j] * row.k[i];
                    }
                    dkey[i] = dki;
                }
                let mut d_beta = 0f32;
                let mut d_recalled = vec![0f32; dv];
                for j in 0..dv {
                    dval[j] = row.beta * d_delta[j];
                    d_beta += d_delta[j] * (row.v[j] - recalled[j]);
                    d_recalled[j] = -row.beta * d_delta[j];
                }
                // recalled = S'^T k; S' = decay S
                let mut d_decay = 0f32;
                for i in 0..dk {
                    let mut dki = 0f32;
                    for j in 0..dv {
                        let d_decayed = d_moved[i * dv + j] + row.k[i] * d_recalled[j];
                        dki += decayed[i * dv + j] * d_recalled[j];
                        d_decay += d_decayed * state[i * dv + j];
                        let kept = if enters { 0.0 } else { carried[i * dv + j] };
                        carried[i * dv + j] = row.decay * d_decayed + kept;
                    }
                    dkey[i] += dki;
                }
                dg[2 * p] = d_decay;
                dg[2 * p + 1] = d_beta;
            }
            (dx, dg)
        });
        let mut d_qkv = vec![0f32; qs.len()];
        let mut d_gates = vec![0f32; gs.len()];
        for (u, (dx, dg)) in per_unit.iter().enumerate() {
            let (seq, h) = (u / heads, u % heads);
            for p in 0..t {
                let unit = (seq * t + p) * heads + h;
                d_qkv[unit * w..(unit + 1) * w].copy_from_slice(&dx[p * w..(p + 1) * w]);
                d_gates[2 * unit..2 * unit + 2].copy_from_slice(&dg[2 * p..2 * p + 2]);
            }
        }
        Ok((
            Some(Tensor::from_vec(d_qkv, qkv.shape(), qkv.device())?),
            Some(Tensor::from_vec(d_gates, gates.shape(), gates.device())?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;
    use lcut_kernels::testdata::Rng;
    use lcut_testkit::grads::{grad_diff, max_abs_diff as max_diff, normal, probe_grads as grads};

    #[test]
    fn fused_ops_match_composed_ops_and_their_gradients() -> candle_core::Result<()> {
        let mut rng = Rng::new(0x5eed);
        // RMSNorm
        let x = Var::from_tensor(&normal(&mut rng, 0.0, 2.0, &[6, 16])?)?;
        let w = Var::from_tensor(&normal(&mut rng, 1.0, 0.3, &[16])?)?;
        let probe = normal(&mut rng, 0.0, 1.0, &[6, 16])?;
        let fused = rms_norm(&x, &w, 1e-5)?;
        let slow = candle_nn::ops::rms_norm_slow(&x, &w, 1e-5)?;
        assert!(max_diff(&fused, &slow) < 1e-5);
        let (gf, gs) = (grads(&fused, &probe)?, grads(&slow, &probe)?);
        for v in [&x, &w] {
            let diff = grad_diff(&gf, &gs, v);
            assert!(diff < 1e-4, "rms-norm grad {diff}");
        }
        // RoPE over [heads, n, head_dim] with tables [n, head_dim / 2]
        let x = Var::from_tensor(&normal(&mut rng, 0.0, 1.0, &[3, 5, 8])?)?;
        let freqs = normal(&mut rng, 0.0, 1.0, &[5, 4])?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let probe = normal(&mut rng, 0.0, 1.0, &[3, 5, 8])?;
        let fused = rope(&x, &cos, &sin)?;
        let slow = candle_nn::rotary_emb::rope_slow(&x.unsqueeze(0)?, &cos, &sin)?.squeeze(0)?;
        assert!(max_diff(&fused, &slow) < 1e-5);
        let (gf, gs) = (grads(&fused, &probe)?, grads(&slow, &probe)?);
        assert!(grad_diff(&gf, &gs, &x) < 1e-5);
        Ok(())
    }
}
