//! How a random model's weights are drawn: norms are ones, every matrix and
//! bias is uniform with standard deviation 0.02 (Hugging Face's
//! `initializer_range`, which keeps the residual stream finite through 32
//! layers and more since every layer reads it through an RMSNorm).
//!
//! A mixture of experts' shape draws two weights otherwise, so that its
//! routing is not degenerate. At 0.02 the embedding is small beside what
//! each layer of random attention adds to the residual stream: an average
//! of the earlier tokens' values, of RMS about 1, nearly the same from one
//! position to the next. The routers then see almost the same input for
//! every token: on 128 random tokens through 4 layers of Qwen3-30B-A3B's
//! shape, one expert of 128 was chosen by 98% of the tokens from the
//! second layer on. Its embedding ([`TensorKind::RoutedEmbedding`]) is
//! drawn at standard deviation [`ROUTED_EMBEDDING_STD`] (16), so that each
//! token's own direction leads the residual stream at every depth and
//! each layer's router sends the tokens to experts by their identity, as a
//! hash would (trained routers, too, route largely by token). At 1 the
//! routing still collapsed past a few layers, and at 8 it held over both
//! full depths (measured on the shapes with narrower experts, 64 and 256
//! wide, and a vocabulary of 4096, built in memory: at 1, one expert for
//! 76% of the tokens from layer 4 of 24 of Qwen3-30B-A3B's shape and for
//! 99% from layer 6 of Mixtral-8x7B's 32; at 8, at no layer of the 48 and
//! the 32 did an expert take more than 20% of the tokens where 6% is even
//! for Qwen3's 8 of 128, nor more than 46% where 25% is even for
//! Mixtral's 2 of 8); 16 leaves a factor of two. Its routers ([`TensorKind::Router`])
//! are drawn at 1/sqrt(hidden), so that their logits over the experts
//! have about unit spread at any width (which experts a token takes does
//! not depend on that scale, only how evenly it weighs them).
//!
//! Each row has its own generator, seeded by the model's seed, the
//! tensor's name and the row's index: a tensor is the same whether it is
//! drawn whole, in chunks of rows (the writers stream an 8B model that
//! way) or on several threads, and the same in every format.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use lcut_model::{Result, WeightSource};
use rand::{Rng, SeedableRng, rngs::StdRng};
use rayon::prelude::*;

use crate::shapes::{ModelShape, TensorKind};

/// Standard deviation of every matrix and bias entry.
pub const STD: f32 = 0.02;

/// Standard deviation of the token embedding of a shape with experts
/// ([`TensorKind::RoutedEmbedding`]; see the module's notes).
pub const ROUTED_EMBEDDING_STD: f32 = 16.0;

/// Standard deviation of a [`TensorKind::ScaledRouter`]'s entries (Gemma
/// 4's router; see its notes).
pub const SCALED_ROUTER_STD: f32 = 16.0;

/// Standard deviation of the entries of a weight of `kind` with rows of
/// `cols` values: [`STD`], but [`ROUTED_EMBEDDING_STD`] for a
/// [`TensorKind::RoutedEmbedding`] (over sqrt(`cols`) for a
/// [`TensorKind::ScaledRoutedEmbedding`]),
/// 1/sqrt(`cols`) for a [`TensorKind::Router`] and a
/// [`TensorKind::Convolution`], [`SCALED_ROUTER_STD`] for a
/// [`TensorKind::ScaledRouter`] (0
/// for the kinds drawn as constants or from their own law: norms, decay
/// rates).
pub fn std_of(kind: TensorKind, cols: usize) -> f32 {
    match kind {
        TensorKind::Matrix | TensorKind::Bias => STD,
        TensorKind::RoutedEmbedding => ROUTED_EMBEDDING_STD,
        TensorKind::ScaledRoutedEmbedding => ROUTED_EMBEDDING_STD / (cols.max(1) as f32).sqrt(),
        TensorKind::Router | TensorKind::Convolution => 1.0 / (cols.max(1) as f32).sqrt(),
        TensorKind::ScaledRouter => SCALED_ROUTER_STD,
        TensorKind::Norm
        | TensorKind::OffsetNorm
        | TensorKind::QkScaleNorm
        | TensorKind::DecayLog => 0.0,
    }
}

/// The value every entry of a weight of `kind` (`len` entries) takes, for
/// the kinds drawn as constants: ones for a norm, zeros for a (1 + w) norm,
/// `len`^(-1/4) for a q/k norm that carries the attention's scale.
fn constant_of(kind: TensorKind, len: usize) -> Option<f32> {
    match kind {
        TensorKind::Norm => Some(1.0),
        TensorKind::QkScaleNorm => Some((len.max(1) as f32).powf(-0.25)),
        TensorKind::OffsetNorm => Some(0.0),
        _ => None,
    }
}

/// Whether the weight `name` is a norm (drawn as ones).
pub fn is_norm(name: &str) -> bool {
    name.ends_with("norm.weight")
}

/// Whether the weight `name` is a mixture of experts' router (Qwen3-MoE's
/// `mlp.gate`, Mixtral's `block_sparse_moe.gate`).
pub fn is_router(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight") || name.ends_with(".block_sparse_moe.gate.weight")
}

/// The kind of a weight known only by its Hugging Face name (an
/// embedding is a [`TensorKind::Matrix`] here: only its shape knows
/// whether it is a [`TensorKind::RoutedEmbedding`]).
pub fn kind_of(name: &str) -> TensorKind {
    if is_norm(name) {
        TensorKind::Norm
    } else if is_router(name) {
        TensorKind::Router
    } else if name.ends_with(".bias") {
        TensorKind::Bias
    } else {
        TensorKind::Matrix
    }
}

/// FNV-1a of the name, mixed with the model's seed: one stream per tensor.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Rows `rows` of weight `name` (`kind`, rows of `cols` values) of the
/// model drawn from `seed`, row-major; drawn on all threads.
pub fn rows(seed: u64, name: &str, kind: TensorKind, cols: usize, rows: Range<usize>) -> Vec<f32> {
    let picked: Vec<usize> = rows.collect();
    rows_at(seed, name, kind, cols, &picked)
}

/// The rows of weight `name` at indices `picked`, in that order (a GGUF
/// writer draws llama.cpp's permuted Q/K rows this way).
pub fn rows_at(seed: u64, name: &str, kind: TensorKind, cols: usize, picked: &[usize]) -> Vec<f32> {
    let n = picked.len() * cols;
    if let Some(value) = constant_of(kind, cols) {
        return vec![value; n];
    }
    let base = tensor_seed(seed, name);
    let mut out = vec![0f32; n];
    let a = std_of(kind, cols) * 3f32.sqrt();
    out.par_chunks_mut(cols.max(1))
        .zip(picked.par_iter())
        .for_each(|(row, &r)| {
            let mut rng =
                StdRng::seed_from_u64(base ^ (r as u64).wrapping_mul(0xd6e8_feb8_6659_fd93));
            for x in row {
                *x = match kind {
                    // transformers' A_log: ln of a uniform draw in [1, 16)
                    TensorKind::DecayLog => rng.random_range(1f32..16.0).ln(),
                    _ => rng.random_range(-a..a),
                };
            }
        });
    out
}

/// Weights drawn on request, the same values the writers store.
pub struct RandomWeights {
    folder: PathBuf,
    seed: u64,
    /// The weights it holds and their kinds; `None`: every `.weight` and
    /// `.bias` name, of the kind [`kind_of`] its name says.
    names: Option<HashMap<String, TensorKind>>,
}

impl RandomWeights {
    /// A source drawing any weight by name of the model of `seed` (on the
    /// CPU; CUDA draws are seeded through the device); `folder` is the name
    /// errors give it. It claims every `.weight` and `.bias` name, the
    /// optional ones a decoder probes for too: build decoders from
    /// [`RandomWeights::of_shape`].
    pub fn new(folder: PathBuf, seed: u64) -> Self {
        Self {
            folder,
            seed,
            names: None,
        }
    }

    /// A source holding exactly the weights of `shape` (as the writers
    /// store them), so that a decoder built from it finds no optional
    /// tensor the files lack (an `o_proj` bias, llama.cpp's RoPE factors).
    pub fn of_shape(folder: PathBuf, shape: &ModelShape, seed: u64) -> Self {
        Self {
            names: Some(
                shape
                    .tensors()
                    .into_iter()
                    .map(|t| (t.name, t.kind))
                    .collect(),
            ),
            ..Self::new(folder, seed)
        }
    }

    /// The kind weight `name` is drawn as: its shape's, else the name's.
    fn kind(&self, name: &str) -> TensorKind {
        self.names
            .as_ref()
            .and_then(|names| names.get(name).copied())
            .unwrap_or_else(|| kind_of(name))
    }
}

impl WeightSource for RandomWeights {
    fn folder(&self) -> &Path {
        &self.folder
    }

    fn contains(&self, name: &str) -> bool {
        match &self.names {
            Some(names) => names.contains_key(name),
            None => name.ends_with(".weight") || name.ends_with(".bias"),
        }
    }

    fn load(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let kind = self.kind(name);
        if let Some(value) = constant_of(kind, expected.last().copied().unwrap_or(1)) {
            return Ok((Tensor::ones(expected, dtype, device)? * f64::from(value))?);
        }
        let cols = expected.last().copied().unwrap_or(1);
        let t = if device.is_cuda() && kind != TensorKind::DecayLog {
            Tensor::randn(0f32, std_of(kind, cols), expected, device)?
        } else {
            let n_rows = expected.iter().product::<usize>() / cols.max(1);
            let data = rows(self.seed, name, kind, cols, 0..n_rows);
            Tensor::from_vec(data, expected, device)?
        };
        Ok(t.to_dtype(dtype)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor drawn in pieces is the tensor drawn whole: what lets the
    /// writers stream it.
    #[test]
    fn rows_drawn_in_pieces_are_the_rows_drawn_whole() {
        let whole = rows(7, "w", TensorKind::Matrix, 5, 0..9);
        let mut pieces = rows(7, "w", TensorKind::Matrix, 5, 0..4);
        pieces.extend(rows(7, "w", TensorKind::Matrix, 5, 4..9));
        assert_eq!(whole, pieces);
        assert_ne!(whole, rows(8, "w", TensorKind::Matrix, 5, 0..9));
        assert_ne!(whole, rows(7, "v", TensorKind::Matrix, 5, 0..9));
        let std = (whole.iter().map(|x| x * x).sum::<f32>() / whole.len() as f32).sqrt();
        assert!((0.01..0.03).contains(&std), "{std}");
        assert_eq!(rows(7, "n", TensorKind::Norm, 3, 0..2), vec![1.0; 6]);
    }

    /// A shape's source holds its weights and nothing a decoder probes for
    /// beyond them.
    #[test]
    fn a_shapes_source_holds_only_its_weights() {
        let shape = crate::shapes::llama_3_2_1b().with_layers(1);
        let source = RandomWeights::of_shape("s".into(), &shape, 0);
        for t in shape.tensors() {
            assert!(source.contains(&t.name), "{}", t.name);
        }
        for absent in [
            "rope_freqs.weight",
            "model.layers.0.self_attn.o_proj.bias",
            "model.layers.0.self_attn.q_proj.bias",
            "lm_head.weight",
        ] {
            assert!(!source.contains(absent), "{absent}");
        }
        assert!(RandomWeights::new("any".into(), 0).contains("rope_freqs.weight"));
    }
}
