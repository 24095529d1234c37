//! Register-level helpers shared by the SIMD paths of several kernels:
//! loading f32/bf16/f16 values widened to f32 lanes, horizontal sums, and
//! a vectorized `exp`.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use half::{bf16, f16};

/// A storage type of weights or cached keys/values, widened to f32.
pub trait Element: Copy + Send + Sync + 'static {
    /// The value as f32.
    fn to_f32(self) -> f32;
    /// The f32 rounded to this type (round to nearest even).
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Element for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
