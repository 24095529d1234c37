//! AdamW whose moments can be saved and restored (so training resumes where
//! it stopped), global-norm gradient clipping, and a seeded SplitMix64.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::error::Result;

/// SplitMix64: a small seeded generator, the same on every machine.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A float in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// AdamW (decoupled weight decay) over a fixed list of variables.
pub struct AdamW {
    vars: Vec<Var>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Steps taken.
    pub t: usize,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

impl AdamW {
    /// Fresh moments for `vars`.
    pub fn new(vars: Vec<Var>, weight_decay: f64) -> Result<Self> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        let m = vars
            .iter()
            .map(zeros)
            .collect::<candle_core::Result<Vec<_>>>()?;
        let v = m.clone();
        Ok(Self {
            vars,
            m,
            v,
            t: 0,
            weight_decay,
        })
    }

    /// One update at learning rate `lr`, gradients clipped to global norm
    /// `clip` (no clipping when 0); returns the norm before clipping.
    pub fn step(&mut self, grads: &GradStore, lr: f64, clip: f64) -> Result<f64> {
        let gs: Vec<Option<Tensor>> = self
            .vars
            .iter()
            .map(|v| grads.get(v.as_tensor()).cloned())
            .collect();
        let mut sq = 0.0;
        for g in gs.iter().flatten() {
            sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
        let norm = sq.sqrt();
        let factor = if clip > 0.0 && norm > clip {
            clip / norm
        } else {
            1.0
        };
        self.t += 1;
        let (c1, c2) = (
            1.0 - BETA1.powi(self.t as i32),
            1.0 - BETA2.powi(self.t as i32),
        );
        for (i, g) in gs.into_iter().enumerate() {
            let Some(g) = g else { continue };
            let g = (g * factor)?;
            self.m[i] = ((&self.m[i] * BETA1)? + (&g * (1.0 - BETA1))?)?;
            self.v[i] = ((&self.v[i] * BETA2)? + (g.sqr()? * (1.0 - BETA2))?)?;
            let update = ((&self.m[i] / c1)? / ((&self.v[i] / c2)?.sqrt()? + EPS)?)?;
            let var = &self.vars[i];
            let next = ((var.as_tensor() * (1.0 - lr * self.weight_decay))? - (update * lr)?)?;
            var.set(&next)?;
        }
        Ok(norm)
    }

    /// The moments by name (`m.{i}`, `v.{i}`), to save.
    pub fn state(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        for (i, (m, v)) in self.m.iter().zip(&self.v).enumerate() {
            out.insert(format!("m.{i}"), m.clone());
            out.insert(format!("v.{i}"), v.clone());
        }
        out
    }

    /// Restore moments saved by [`AdamW::state`] after `t` steps; a state
    /// that does not fit leaves the moments fresh and returns false.
    pub fn restore(&mut self, state: &HashMap<String, Tensor>, t: usize) -> bool {
        let fits = (0..self.vars.len()).all(|i| {
            let dims = self.vars[i].as_tensor().dims();
            [format!("m.{i}"), format!("v.{i}")]
                .iter()
                .all(|k| state.get(k).is_some_and(|s| s.dims() == dims))
        });
        if fits {
            for i in 0..self.vars.len() {
                self.m[i] = state[&format!("m.{i}")].clone();
                self.v[i] = state[&format!("v.{i}")].clone();
            }
            self.t = t;
        }
        fits
    }
}
