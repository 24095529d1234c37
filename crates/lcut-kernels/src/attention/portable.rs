//! The attention's block steps in plain Rust: the reference of the SIMD
//! paths.

use super::{BlockOps, Rows};
use crate::simd::Element;

/// Plain-Rust block steps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ops;

impl<T: Element> BlockOps<T> for Ops {
    fn scores(&self, q: &[f32], groups: usize, keys: Rows<'_, T>, scale: f32, out: &mut [f32]) {
        let w = keys.width;
        for j in 0..keys.count {
            let key = keys.row(j);
            for g in 0..groups {
                let qg = &q[g * w..(g + 1) * w];
                let dot: f32 = qg.iter().zip(key).map(|(a, b)| a * b.to_f32()).sum();
                out[g * keys.count + j] = scale * dot;
            }
        }
    }

    fn accumulate(&self, p: &[f32], groups: usize, values: Rows<'_, T>, acc: &mut [f32]) {
        let w = values.width;
        for j in 0..values.count {
            let value = values.row(j);
            for g in 0..groups {
                let pj = p[g * values.count + j];
                let ag = &mut acc[g * w..(g + 1) * w];
                ag.iter_mut()
                    .zip(value)
                    .for_each(|(a, v)| *a += pj * v.to_f32());
            }
        }
    }

    fn exp_sum(&self, x: &mut [f32], m: f32) -> f32 {
        let mut sum = 0f32;
        for v in x.iter_mut() {
            *v = (*v - m).exp();
            sum += *v;
        }
        sum
    }
}
