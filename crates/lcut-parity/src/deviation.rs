//! How far one logits tensor is from another: the figures a parity check
//! reads (largest and mean absolute difference, the reference's scale,
//! top-1 agreement).

use candle_core::Tensor;
use serde::Serialize;

use lcut_model::{Result, argmax_rows};

/// How far one logits tensor is from another.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Deviation {
    /// Largest absolute difference.
    pub max_abs: f32,
    /// Mean absolute difference.
    pub mean_abs: f32,
    /// Largest absolute value of the reference (the scale `max_abs` is read against).
    pub scale: f32,
    /// Fraction of rows whose argmax agrees.
    pub top1_agreement: f32,
}

/// How far `ours` is from `reference`, both [rows, vocab] f32.
pub fn deviation(ours: &Tensor, reference: &Tensor) -> Result<Deviation> {
    if ours.dims() != reference.dims() {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: ours.shape().clone(),
            rhs: reference.shape().clone(),
            op: "deviation",
        }
        .into());
    }
    let diff = (ours - reference)?.abs()?.flatten_all()?;
    let max_abs = diff.max(0)?.to_scalar::<f32>()?;
    let mean_abs = diff.mean(0)?.to_scalar::<f32>()?;
    let scale = reference.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    let a = argmax_rows(ours)?;
    let b = argmax_rows(reference)?;
    let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    Ok(Deviation {
        max_abs,
        mean_abs,
        scale,
        top1_agreement: agree as f32 / a.len().max(1) as f32,
    })
}
