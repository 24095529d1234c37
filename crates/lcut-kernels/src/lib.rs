//! CPU kernels for one decode step of a decoder-only language model, on
//! plain slices (no tensor library): quantized matrix-vector products that
//! read a GGUF's raw blocks ([`quant`]), dense products over f32, bf16 and
//! f16 weights ([`dense`]), attention of one query token over a layer's
//! K/V cache ([`attention`]), and the element-wise steps between them
//! ([`ops`]). Every kernel has a portable path and, on x86-64, AVX2 and
//! AVX-512 paths chosen at run time ([`isa`]); products split their output
//! rows across rayon's threads in one parallel region. [`bandwidth`]
//! measures the machine's memory read bandwidth, the bound a decode step
//! is compared with.

pub mod attention;
pub mod bandwidth;
pub mod dense;
pub mod error;
pub mod isa;
pub mod ops;
pub mod par;
pub mod product;
pub mod quant;
mod simd;
pub mod testdata;

pub use error::{KernelError, Result};
pub use isa::Isa;
pub use simd::Element;
