//! How a random model's weights are drawn: norms are ones, every other
//! matrix has standard deviation 0.02 (uniform on the CPU, seeded; normal
//! on CUDA, seeded through the device); no biases.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use lcut_model::{Result, WeightSource};
use rand::{Rng, rngs::StdRng};

/// Standard deviation of every matrix entry.
const STD: f32 = 0.02;

/// `n` values drawn uniformly with standard deviation 0.02.
pub fn uniform(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let a = STD * 3f32.sqrt();
    (0..n).map(|_| rng.random_range(-a..a)).collect()
}

/// Whether the weight `name` is a norm (drawn as ones).
pub fn is_norm(name: &str) -> bool {
    name.ends_with("norm.weight")
}

/// Weights drawn on request, in the order the decoder asks for them.
pub struct RandomWeights {
    folder: PathBuf,
    rng: RefCell<StdRng>,
}

impl RandomWeights {
    /// A source drawing from `rng`; `folder` is the name errors give it.
    pub fn new(folder: PathBuf, rng: StdRng) -> Self {
        Self {
            folder,
            rng: RefCell::new(rng),
        }
    }
}

impl WeightSource for RandomWeights {
    fn folder(&self) -> &Path {
        &self.folder
    }

    fn contains(&self, name: &str) -> bool {
        name.ends_with(".weight")
    }

    fn load(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if is_norm(name) {
            return Ok(Tensor::ones(expected, dtype, device)?);
        }
        let t = if device.is_cuda() {
            Tensor::randn(0f32, STD, expected, device)?
        } else {
            let n: usize = expected.iter().product();
            let data = uniform(&mut self.rng.borrow_mut(), n);
            Tensor::from_vec(data, expected, device)?
        };
        Ok(t.to_dtype(dtype)?)
    }
}
