//! Rotary position embeddings at explicit (never renumbered) positions.

use candle_core::{DType, Device, Tensor};

use crate::config::{RopeConfig, RopeScaling};
use crate::error::Result;

/// Inverse frequencies of one model, ready to turn positions into cos/sin.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Tensor,
    /// The same frequencies on the host, for one position at a time.
    inv_host: Vec<f32>,
    rotary_dim: usize,
    /// The scale of cos and sin (YaRN's attention factor; 1 otherwise).
    magnitude: f32,
}

/// Inverse frequencies 1 / theta^(2i/d), with the config's scaling applied.
pub fn inverse_frequencies(cfg: &RopeConfig) -> Vec<f64> {
    let d = cfg.rotary_dim as f64;
    let base: Vec<f64> = (0..cfg.rotary_dim / 2)
        .map(|i| 1.0 / cfg.theta.powf(2.0 * i as f64 / d))
        .collect();
    match cfg.scaling {
        RopeScaling::None => base,
        RopeScaling::Proportional {
            factor,
            rotated_pairs,
        } => base
            .iter()
            .enumerate()
            .map(|(i, f)| if i < rotated_pairs { f / factor } else { 0.0 })
            .collect(),
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_ctx,
        } => {
            let low_wavelen = old_ctx / low_freq_factor;
            let high_wavelen = old_ctx / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_ctx / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: old_ctx,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            // the dimension whose frequency turns `rotations` times over the
            // original context, as transformers' `find_correction_dim`
            let dim_of = |rotations: f64| {
                d * (old_ctx / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * cfg.theta.ln())
            };
            let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, high) = (low.max(0.0), high.min(d - 1.0));
            let high = if low == high { high + 0.001 } else { high };
            base.iter()
                .enumerate()
                .map(|(i, &f)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolated = 1.0 - ramp;
                    f / factor * (1.0 - extrapolated) + f * extrapolated
                })
                .collect()
        }
    }
}

/// The scale of cos and sin under `cfg`'s scaling (YaRN's attention
/// factor; 1 for the others).
pub fn magnitude(cfg: &RopeConfig) -> f64 {
    match cfg.scaling {
        RopeScaling::Yarn {
            attention_factor, ..
        } => attention_factor,
        _ => 1.0,
    }
}

impl Rope {
    /// Prepare the frequencies of `cfg` on `device`.
    pub fn new(cfg: &RopeConfig, device: &Device) -> Result<Self> {
        Self::from_inverse(cfg, inverse_frequencies(cfg), device)
    }

    /// Prepare the frequencies of `cfg` each divided by its factor (llama.cpp's
    /// `rope_freqs`, one per rotated pair).
    pub fn with_factors(cfg: &RopeConfig, factors: &[f32], device: &Device) -> Result<Self> {
        let inv = inverse_frequencies(cfg)
            .iter()
            .zip(factors)
            .map(|(&f, &k)| f / f64::from(k))
            .collect();
        Self::from_inverse(cfg, inv, device)
    }

    fn from_inverse(cfg: &RopeConfig, inv: Vec<f64>, device: &Device) -> Result<Self> {
        let inv: Vec<f32> = inv.iter().map(|&f| f as f32).collect();
        let n = inv.len();
        Ok(Self {
            inv_freq: Tensor::from_vec(inv.clone(), (1, n), device)?,
            inv_host: inv,
            rotary_dim: cfg.rotary_dim,
            magnitude: magnitude(cfg) as f32,
        })
    }

    /// The inverse frequencies of the rotated pairs (rotary_dim / 2 of
    /// them), as every table is made from.
    pub fn host_frequencies(&self) -> &[f32] {
        &self.inv_host
    }

    /// cos and sin tables [n, rotary_dim / 2] for the given positions.
    pub fn tables(&self, positions: &[usize], dtype: DType) -> Result<(Tensor, Tensor)> {
        let pos: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let pos = Tensor::from_vec(pos, (positions.len(), 1), self.inv_freq.device())?;
        let freqs = pos.broadcast_mul(&self.inv_freq)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let (cos, sin) = match self.magnitude {
            1.0 => (cos, sin),
            m => ((cos * f64::from(m))?, (sin * f64::from(m))?),
        };
        Ok((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?))
    }

    /// cos and sin [rotary_dim / 2] of one position into caller buffers, as
    /// [`Rope::tables`] computes them (position times frequency in f32).
    pub fn tables_into(&self, position: usize, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        let (p, m) = (position as f32, self.magnitude);
        cos.clear();
        sin.clear();
        cos.extend(self.inv_host.iter().map(|&f| (p * f).cos() * m));
        sin.extend(self.inv_host.iter().map(|&f| (p * f).sin() * m));
    }

    /// Rotate `x` [heads, n, head_dim] (half-split layout) by the tables.
    /// When `x` carries gradients (a training pass) the rotation is one op
    /// with its own backward on the CPU in f32 (every value of a head
    /// rotated), and made of ops candle can differentiate elsewhere (its
    /// fused kernel has no backward).
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let head_dim = x.dim(2)?;
        if x.track_op() {
            if self.rotary_dim == head_dim
                && crate::grad_ops::takes(x)
                && crate::grad_ops::takes(cos)
            {
                return Ok(crate::grad_ops::rope(x, cos, sin)?);
            }
            return self.apply_differentiable(x, cos, sin, head_dim);
        }
        let x4 = x.unsqueeze(0)?;
        if self.rotary_dim == head_dim {
            let out = candle_nn::rotary_emb::rope(&x4.contiguous()?, cos, sin)?;
            return Ok(out.squeeze(0)?);
        }
        let rot = x4.narrow(3, 0, self.rotary_dim)?.contiguous()?;
        let pass = x4.narrow(3, self.rotary_dim, head_dim - self.rotary_dim)?;
        let rot = candle_nn::rotary_emb::rope(&rot, cos, sin)?;
        Ok(Tensor::cat(&[&rot, &pass], 3)?.squeeze(0)?)
    }

    /// [`Rope::apply`] from differentiable ops: the first `rotary_dim`
    /// values of each head rotated as two halves, the rest passed through.
    fn apply_differentiable(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        head_dim: usize,
    ) -> Result<Tensor> {
        let half = self.rotary_dim / 2;
        let (x1, x2) = (x.narrow(2, 0, half)?, x.narrow(2, half, half)?);
        let a = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
        let b = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
        let mut parts = vec![a, b];
        if self.rotary_dim < head_dim {
            parts.push(x.narrow(2, self.rotary_dim, head_dim - self.rotary_dim)?);
        }
        Ok(Tensor::cat(&parts, 2)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let cfg = RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
            rotary_dim: 128,
        };
        let plain = inverse_frequencies(&RopeConfig {
            scaling: RopeScaling::None,
            ..cfg
        });
        let scaled = inverse_frequencies(&cfg);
        assert_eq!(scaled[0], plain[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-15);
    }
}
