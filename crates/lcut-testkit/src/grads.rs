//! Holding an op with its own backward to the same function composed of
//! candle's ops: fixed draws of roughly normal values, the largest
//! difference between two tensors, the gradients of a fixed probe, and
//! how far two sets of gradients lie apart at one variable.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use lcut_kernels::testdata::Rng;

/// The largest absolute difference between `a` and `b` (infinite where
/// they cannot be compared).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .unwrap_or(f32::INFINITY)
}

/// Roughly normal values `mean + std * N(0, 1)` of `shape` on the CPU,
/// fixed draws from `rng` (candle's `Tensor::randn` on the CPU is seeded
/// from the clock).
pub fn normal(rng: &mut Rng, mean: f32, std: f32, shape: &[usize]) -> candle_core::Result<Tensor> {
    let n = shape.iter().product();
    let values = rng.normals(n, std).into_iter().map(|v| v + mean).collect();
    Tensor::from_vec(values, shape, &Device::Cpu)
}

/// The gradients of `sum(out * probe)`: what reaches each variable of `out`
/// when the loss weighs its values by `probe`.
pub fn probe_grads(out: &Tensor, probe: &Tensor) -> candle_core::Result<GradStore> {
    (out * probe)?.sum_all()?.backward()
}

/// The largest difference between the gradients `ours` and `reference`
/// hold for `var` (panics where either holds none: a gradient that does
/// not reach the variable fails the test).
pub fn grad_diff(ours: &GradStore, reference: &GradStore, var: &Tensor) -> f32 {
    let ours = ours.get(var).expect("a gradient in ours");
    let reference = reference.get(var).expect("a gradient in the reference");
    max_abs_diff(ours, reference)
}
