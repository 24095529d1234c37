//! What a generation needs in memory at its peak and what the device has, so
//! that a run that cannot fit is refused in a second with the figures,
//! instead of failing minutes later (or being killed) half way through a
//! long prefill.

use std::fmt;

use candle_core::{DType, Device};

use crate::config::ModelConfig;

/// Peak bytes of one generation, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Weights in the run's dtype.
    pub weights: u64,
    /// K/V buffers (the policy's cost for the whole sequence).
    pub kv: u64,
    /// One attention block's scores in their dtypes and the chunk's mask.
    pub attention: u64,
    /// A prefill chunk's other activations and the logits.
    pub activations: u64,
}

impl MemoryEstimate {
    /// All parts together.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.attention + self.activations
    }

    /// The same without the weights (for a model already loaded).
    pub fn without_weights(self) -> Self {
        Self { weights: 0, ..self }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

impl fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.1} GiB (weights {:.1}, K/V {:.1}, attention scores {:.1}, other activations {:.1})",
            gib(self.total()),
            gib(self.weights),
            gib(self.kv),
            gib(self.attention),
            gib(self.activations)
        )
    }
}

/// Number of parameters of a model of this config.
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    let (v, d, i) = (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size);
    let (h, kv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let norms = if cfg.sandwich_norms { 4 * d } else { 2 * d };
    let qk_norms = if cfg.qk_norm { 2 * hd } else { 0 };
    let bias = if cfg.qkv_bias { (h + 2 * kv) * hd } else { 0 };
    let layer = d * (h + 2 * kv) * hd + h * hd * d + 3 * d * i + norms + qk_norms + bias;
    let head = if cfg.tie_word_embeddings { 0 } else { v * d };
    (v * d + cfg.num_layers * layer + d + head) as u64
}

/// Peak memory of a generation of `total_len` tokens (prompt and new) of a
/// model of `cfg` in `dtype`, prefilled in chunks of `chunk`, whose caches
/// hold `kv_bytes` at the end, with attention blocks of at most
/// `block_elems` score elements (see `Decoder::set_attention_block_elems`).
pub fn estimate(
    cfg: &ModelConfig,
    dtype: DType,
    kv_bytes: u64,
    total_len: usize,
    chunk: usize,
    block_elems: usize,
) -> MemoryEstimate {
    let b = dtype.size_in_bytes() as u64;
    let n = chunk.clamp(1, total_len.max(1)) as u64;
    let keys = total_len as u64;
    let (h, d, i) = (
        cfg.num_heads as u64,
        cfg.hidden_size as u64,
        cfg.intermediate_size as u64,
    );
    let block = (h * n * keys).min(block_elems as u64);
    // scores in the dtype, in f32, masked, softmax (f32), probabilities in
    // the dtype; the chunk's mask in f32 (zeros for the visible prefix and
    // the rest, then joined)
    let attention = block * (b + 4 + 4 + 4 + b) + 2 * n * keys * 4;
    let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) as u64 * cfg.head_dim as u64;
    let activations = n * (4 * d + 3 * i + 2 * qkv) * b + 2 * cfg.vocab_size as u64 * 4;
    MemoryEstimate {
        weights: parameter_count(cfg) * b,
        kv: kv_bytes,
        attention,
        activations,
    }
}

/// Bytes free where `device` runs: the GPU's free memory, or on the CPU
/// the host's available memory (`MemAvailable` of /proc/meminfo); `None`
/// when it cannot be read.
pub fn available_bytes(device: &Device) -> Option<u64> {
    match device {
        Device::Cpu => {
            let info = std::fs::read_to_string("/proc/meminfo").ok()?;
            let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => dev
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _)| free as u64),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_reports_available_memory() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(available_bytes(&Device::Cpu).is_some_and(|b| b > 0));
        }
    }
}
