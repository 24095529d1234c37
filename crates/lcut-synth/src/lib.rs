//! Random-weight models of a given shape, for benchmarks (`lcut bench`) and
//! tests that need a model of some size rather than a trained one.
//!
//! - [`model`]: [`RandomLlama`], a shape and the seed of its weights; built
//!   straight onto a device or written to a folder.
//! - [`shapes`]: named shapes.
//! - [`draw`]: how the weights are drawn.
//! - [`write`]: the files a random model is written as, one module per format.

pub mod draw;
pub mod model;
pub mod shapes;
pub mod write;

pub use model::RandomLlama;
