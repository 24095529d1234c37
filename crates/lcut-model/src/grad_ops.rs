//! RMSNorm and RoPE as single CPU ops with their own backward, for passes
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;
    use lcut_kernels::testdata::Rng;
    use lcut_testkit::grads::{max_abs_diff as max_diff, normal, probe_grads as grads};

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
            let (a, b) = (
                gf.get(v).expect("fused grad"),
                gs.get(v).expect("slow grad"),
            );
            assert!(max_diff(a, b) < 1e-4, "rms-norm grad {}", max_diff(a, b));
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
        let (a, b) = (
            gf.get(&x).expect("fused grad"),
            gs.get(&x).expect("slow grad"),
        );
        assert!(max_diff(a, b) < 1e-5);
        Ok(())
    }
}
