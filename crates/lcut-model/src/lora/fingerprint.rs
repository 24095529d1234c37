//! A short digest of a base model's norm weights, recorded by lcut in an
//! adapter (`lcut_base_fingerprint`) so that an adapter put on another base
//! of the same shape is refused. It is made of means, so it agrees across
//! f32, bf16 and GGUF loads of the same weights.

use candle_core::{DType, Tensor};

use super::adapter::LoraAdapter;
use super::config::config_path;
use super::error::LoraError;
use crate::decoder::Decoder;
use crate::error::Result;

/// Relative tolerance on each number of the digest.
const TOL: f64 = 1e-3;

impl Decoder {
    /// This model's digest: means of the final norm, of its square, and of
    /// the first and last layer's input norms.
    pub fn lora_fingerprint(&self) -> Result<String> {
        let norms = self.norm_weights();
        let mean = |t: &Tensor| -> Result<f64> {
            Ok(f64::from(
                t.to_dtype(DType::F32)?.mean_all()?.to_scalar::<f32>()?,
            ))
        };
        let first = norms.first().copied();
        let (last, layers) = (norms.last().copied(), &norms[1..]);
        let mut parts = Vec::new();
        if let Some(f) = first {
            parts.push(mean(f)?);
            parts.push(mean(&f.to_dtype(DType::F32)?.sqr()?)?);
        }
        if let (Some(a), Some(b)) = (layers.first(), last) {
            parts.push(mean(a)?);
            parts.push(mean(b)?);
        }
        Ok(parts
            .iter()
            .map(|p| format!("{p:.6e}"))
            .collect::<Vec<_>>()
            .join(","))
    }
}

/// Refuse `adapter` when its recorded digest is not this model's.
pub(crate) fn check(model: &Decoder, adapter: &LoraAdapter, expected: &str) -> Result<()> {
    let found = model.lora_fingerprint()?;
    let parse =
        |s: &str| -> Vec<f64> { s.split(',').filter_map(|p| p.trim().parse().ok()).collect() };
    let (e, f) = (parse(expected), parse(&found));
    let same = e.len() == f.len()
        && e.iter()
            .zip(&f)
            .all(|(a, b)| (a - b).abs() <= TOL * a.abs().max(b.abs()).max(1e-6));
    if same {
        return Ok(());
    }
    Err(LoraError::OtherBase {
        path: config_path(&adapter.folder),
        recorded: adapter
            .config
            .base_model
            .clone()
            .unwrap_or_else(|| "(unnamed)".into()),
        expected: expected.into(),
        found,
    }
    .into())
}
