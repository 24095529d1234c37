//! Register-level helpers shared by the SIMD paths of several kernels:
//! one vector of f32 lanes per instruction set ([`Lanes`]: loading
//! f32/bf16/f16 values widened to f32, multiply-adds, horizontal sums, a
//! vectorized `exp`), so that a kernel whose AVX2 and AVX-512 forms differ
//! only in the width of a vector is written once, generic over [`Lanes`],
//! and entered through a thin `#[target_feature]` function per level.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod elementwise;

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

/// One vector of f32 lanes on one instruction set. Every method is
/// `#[inline(always)]` and `unsafe`: it may be called only from code that
/// runs with the level's features enabled (a kernel's `#[target_feature]`
/// entry point, into which the generic body and these methods inline).
#[cfg(target_arch = "x86_64")]
pub(crate) trait Lanes: Copy + Send + Sync + 'static {
    /// f32 values per vector.
    const WIDTH: usize;
    /// The register.
    type V: Copy;
    /// Every lane zero.
    ///
    /// # Safety
    /// The CPU runs this level's features.
    unsafe fn zero() -> Self::V;
    /// Every lane `x`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn splat(x: f32) -> Self::V;
    /// `x[at..at + WIDTH]` (bounds-checked).
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn load(x: &[f32], at: usize) -> Self::V;
    /// Store `v` at `x[at..at + WIDTH]` (bounds-checked).
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn store(x: &mut [f32], at: usize, v: Self::V);
    /// `a + b`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// The smaller of `a` and `b` in each lane (`b` where either is NaN).
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// The larger of `a` and `b` in each lane (`b` where either is NaN).
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, fused.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The sum of the lanes.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn sum(v: Self::V) -> f32;
    /// The sums of four vectors' lanes, as one 128-bit vector (a
    /// transposing reduction: fewer instructions than four sums).
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn sum4(v: [Self::V; 4]) -> std::arch::x86_64::__m128;
    /// e^x in each lane.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn exp(x: Self::V) -> Self::V;
}

/// A storage type loaded [`Lanes::WIDTH`] values at a time as f32 lanes.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Widen<L: Lanes>: Element {
    /// The first `L::WIDTH` values of `w` as f32 (bounds-checked).
    ///
    /// # Safety
    /// The CPU runs `L`'s features.
    unsafe fn widen(w: &[Self]) -> L::V;
}
