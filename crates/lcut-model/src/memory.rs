//! What a generation needs in memory at its peak and what the device has, so
//! that a run that cannot fit is refused in a second with the figures,
//! instead of failing minutes later (or being killed) half way through a
//! long prefill.

use std::fmt;

use candle_core::{DType, Device};
use lcut_kernels::quant::QuantFormat;

use crate::config::{LayerAttention, ModelConfig, NormPlacement, QkNorm};
use crate::decoder::WeightMode;
use crate::files::ModelFiles;

/// Peak bytes of one generation, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Weights in the run's dtype.
    pub weights: u64,
    /// K/V buffers (the policy's cost for the whole sequence).
    pub kv: u64,
    /// The linear-attention layers' states (Qwen3.5; 0 for other
    /// models): a fixed size per layer, whatever the sequence's length
    /// ([`recurrent_state_bytes`]).
    pub states: u64,
    /// One attention block's scores in their dtypes and the chunk's mask.
    pub attention: u64,
    /// A prefill chunk's other activations and the logits.
    pub activations: u64,
    /// What a run records beside the model: traces, probe buffers, the
    /// report's text (0 for a plain generation).
    pub records: u64,
    /// What the process holds before the weights load (its runtime, the
    /// tokenizer, allocator slack), measured when the run is sized; 0
    /// where it is not measured.
    pub process: u64,
}

impl MemoryEstimate {
    /// All parts together.
    pub fn total(&self) -> u64 {
        self.weights
            + self.kv
            + self.states
            + self.attention
            + self.activations
            + self.records
            + self.process
    }

    /// The same without the weights (for a model already loaded).
    pub fn without_weights(self) -> Self {
        Self { weights: 0, ..self }
    }

    /// The same with the weights taking `bytes` (a GGUF kept quantized
    /// takes its tensors' bytes, not parameters times a dtype).
    pub fn with_weights(self, bytes: u64) -> Self {
        Self {
            weights: bytes,
            ..self
        }
    }

    /// The same with the process's own `bytes` before loading (its
    /// resident memory when the run is sized).
    pub fn with_process(self, bytes: u64) -> Self {
        Self {
            process: bytes,
            ..self
        }
    }

    /// The same with the K/V cache taking `bytes` (a cache stored in
    /// another dtype than the activations, see [`kv_cache_bytes`]).
    pub fn with_kv(self, bytes: u64) -> Self {
        Self { kv: bytes, ..self }
    }

    /// The same for a run on `device` under policies of `kinds`: where its
    /// prefill chunks all run the blocked CPU kernel
    /// ([`prefill_is_blocked`]) or every layer's attention runs on the
    /// fused CUDA kernel ([`crate::fused_attention_runs`]), neither holding
    /// a score matrix, with the attention figure of
    /// [`MemoryEstimate::with_blocked_prefill`]; otherwise unchanged.
    pub fn for_prefill_path(
        self,
        (device, kinds): (&Device, &[lcut_policy::PolicyKind]),
        cfg: &ModelConfig,
        dtype: DType,
        (total_len, chunk): (usize, usize),
    ) -> Self {
        if prefill_is_blocked(device, dtype, kinds) {
            self.with_blocked_prefill(cfg, dtype, (total_len, chunk))
        } else {
            self.for_fused_attention(device, cfg, dtype, (total_len, chunk))
        }
    }

    /// The same for a run on `device` whatever its policies: where every
    /// layer's attention runs on the fused CUDA kernel
    /// ([`attention_is_fused`]), with the attention figure of
    /// [`MemoryEstimate::with_blocked_prefill`]; otherwise unchanged.
    pub fn for_fused_attention(
        self,
        device: &Device,
        cfg: &ModelConfig,
        dtype: DType,
        lens: (usize, usize),
    ) -> Self {
        match attention_is_fused(device, dtype, cfg) {
            true => self.with_blocked_prefill(cfg, dtype, lens),
            false => self,
        }
    }

    /// The same with the attention of a run whose prefill chunks run the
    /// blocked CPU kernel ([`prefill_is_blocked`]), which holds no score
    /// matrix: what stays is one query row's scores over every key (the
    /// tensor path a probed decode step takes, in the five buffers the
    /// chunk figure counts) and the kernel's output for a chunk of `chunk`
    /// queries of `cfg`, activations of `dtype`, `total_len` keys.
    pub fn with_blocked_prefill(
        self,
        cfg: &ModelConfig,
        dtype: DType,
        (total_len, chunk): (usize, usize),
    ) -> Self {
        let b = dtype.size_in_bytes() as u64;
        let keys = total_len as u64;
        let h = cfg.num_heads as u64;
        let outputs = 2 * chunk.clamp(1, total_len.max(1)) as u64 * h * cfg.head_dim as u64 * 4;
        Self {
            attention: h * keys * (2 * b + 12) + 8 * keys + outputs,
            ..self
        }
    }

    /// The same with `bytes` of records (traces, probe buffers).
    pub fn with_records(self, bytes: u64) -> Self {
        Self {
            records: bytes,
            ..self
        }
    }
}

/// The unit a figure of `bytes` reads best in: GiB from 1 GiB up, MiB
/// below (a small model's needs would all read 0.0 GiB), as its size and name.
fn unit(bytes: u64) -> (f64, &'static str) {
    if bytes >= 1 << 30 {
        (f64::from(1u32 << 30), "GiB")
    } else {
        (f64::from(1u32 << 20), "MiB")
    }
}

/// `bytes` as `1.5 GiB`, or `200.0 MiB` below a GiB.
pub fn format_bytes(bytes: u64) -> String {
    let (size, name) = unit(bytes);
    format!("{:.1} {name}", bytes as f64 / size)
}

impl fmt::Display for MemoryEstimate {
    /// The total and its parts, all in the total's unit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (size, name) = unit(self.total());
        let x = |b: u64| b as f64 / size;
        write!(
            f,
            "{:.1} {name} (weights {:.1}, K/V {:.1}, attention scores {:.1}, other activations {:.1}",
            x(self.total()),
            x(self.weights),
            x(self.kv),
            x(self.attention),
            x(self.activations)
        )?;
        if self.states > 0 {
            write!(f, ", linear-attention states {:.2}", x(self.states))?;
        }
        if self.records > 0 {
            write!(f, ", traces and probes {:.2}", x(self.records))?;
        }
        if self.process > 0 {
            write!(f, ", the process before loading {:.2}", x(self.process))?;
        }
        f.write_str(")")
    }
}

/// Number of parameters of a model of this config.
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    let (v, d) = (cfg.vocab_size, cfg.hidden_size);
    let h = cfg.num_heads;
    let norms = match cfg.norms {
        NormPlacement::Sandwich => 4 * d,
        NormPlacement::Pre | NormPlacement::Post => 2 * d,
    };
    // each layer's attention of its own shape; a layer that reads another
    // layer's K/V has no K/V projections, one whose values are its keys no
    // V projection
    let attention = |a: &LayerAttention| {
        let (kv, hd) = (a.kv_heads, a.head_dim);
        let kv_rows = a.projected_kv_heads();
        let shared = a.kv_source.is_some();
        let qk_norms = match cfg.qk_norm {
            QkNorm::None => 0,
            QkNorm::PerHead if shared => hd,
            QkNorm::PerHead => 2 * hd,
            QkNorm::Whole => (h + kv) * hd,
        };
        let bias = if cfg.qkv_bias { (h + kv_rows) * hd } else { 0 };
        // gpt-oss's output bias and sink logits (one a head)
        let out_bias = if cfg.arch == crate::config::Arch::GptOss {
            d
        } else {
            0
        };
        let sinks = usize::from(cfg.attention_sinks) * h;
        // the query projection's gate rows (Qwen3.5's full layers)
        let gate = if cfg.attn_output_gate { d * h * hd } else { 0 };
        d * (h + kv_rows) * hd + h * hd * d + norms + qk_norms + bias + out_bias + sinks + gate
    };
    // a linear-attention layer (Qwen3.5): its input projections (queries,
    // keys and values; the gate z; b and a per value head), the
    // convolution, the decay's A_log and dt_bias, the gated norm and the
    // output projection
    let linear = |la: &crate::config::LinearAttentionConfig| {
        let (vh, values) = (la.value_heads, la.value_heads * la.value_head_dim);
        let channels = la.conv_channels();
        d * (channels + values + 2 * vh)
            + channels * la.conv_kernel
            + 2 * vh
            + la.value_head_dim
            + values * d
            + norms
    };
    // a sparse layer: the router and every expert's gated MLP, a shared
    // expert and its one-row gate (Qwen3.5-MoE); experts beside the dense
    // MLP (Gemma 4) add to it the router's scale, the per-expert scales and
    // the branch's three norms
    let mlp = |l: usize, sparse: bool| match (sparse, cfg.experts) {
        (true, Some(e)) => {
            // gpt-oss's router bias and each expert's gate, up and down biases
            let biases = match e.bias {
                true => e.num_experts * (1 + 2 * e.inner + d),
                false => 0,
            };
            let routed = e.num_experts * d + e.num_experts * 3 * d * e.inner + biases;
            let shared = e.shared_inner.map_or(0, |s| 3 * d * s + d);
            let beside = match e.beside_mlp {
                true => 3 * d * cfg.mlp_width(l) + d + e.num_experts + 3 * d,
                false => 0,
            };
            routed + shared + beside
        }
        _ => 3 * d * cfg.mlp_width(l),
    };
    // Gemma 4's per-layer inputs: each layer's gate, projection and norm,
    // the table and the embedding's projection into every layer's input
    // (and its learned scalar, one value a layer)
    let scalar = usize::from(cfg.layer_scalars);
    let (per_layer, per_model) = match cfg.per_layer_input {
        Some(p) => (
            2 * d * p.width + d + scalar,
            p.vocab * cfg.num_layers * p.width + d * cfg.num_layers * p.width + p.width,
        ),
        None => (scalar, 0),
    };
    let layers: usize = (0..cfg.num_layers)
        .map(|l| {
            let sparse = cfg.sparse_layers.get(l).copied().unwrap_or(false);
            let mixer = match &cfg.linear_attention {
                Some(la) if la.is_linear(l) => linear(la),
                _ => cfg.layer_attention.get(l).map_or(0, attention),
            };
            mixer + mlp(l, sparse) + per_layer
        })
        .sum();
    let head = if cfg.tie_word_embeddings { 0 } else { v * d };
    (v * d + layers + d + head + per_model) as u64
}

/// Each layer's coefficients in the prefill FLOP model (one multiply-add is
/// 2 FLOPs), from the same per-layer shapes as [`parameter_count`] but
/// counting what one token runs: with width `d`, `H` query heads, a
/// layer's K/V heads `H_kv` and head width `h`,
///
/// - an attention layer: `2·d·H·h` (queries; twice that with Qwen3.5's
///   output gate) + `2·d·r·h` (the `r` K/V rows it projects: 2·H_kv, H_kv
///   where values are keys, 0 where it reads another layer's) + `2·H·h·d`
///   (output); a query reads a key for `2·2·H·h`;
/// - a linear-attention layer (Qwen3.5): its input and output projections,
///   the convolution (`2·channels·kernel`) and the recurrence, `7·d_k·d_v`
///   per value head (decay, the state read at the key, its update and its
///   read at the query); it reads no key;
/// - the MLP: `6·d·I` for a gated MLP of width `I` (the layer's own); a
///   sparse layer's router `2·d·E`, its `k` chosen experts `k·6·d·I_e`, a
///   shared expert and its gate, and the dense MLP beside (Gemma 4);
/// - Gemma 4's per-layer input: its gate and projection, `4·d·p`.
///
/// Norms, RoPE, biases and softmax are left out, as in the uniform model;
/// for a model whose layers are all one Llama-style shape every layer's
/// coefficients are the uniform model's.
pub fn layer_flops(cfg: &ModelConfig) -> Vec<lcut_trace::LayerFlops> {
    let d = cfg.hidden_size as u64;
    (0..cfg.num_layers)
        .map(|l| {
            let mixer = match &cfg.linear_attention {
                Some(la) if la.is_linear(l) => {
                    let values = (la.value_heads * la.value_head_dim) as u64;
                    let channels = la.conv_channels() as u64;
                    let inputs = channels + values + 2 * la.value_heads as u64;
                    let state = (la.key_head_dim * la.value_head_dim) as u64;
                    lcut_trace::LayerFlops {
                        token: 2 * d * inputs
                            + 2 * channels * la.conv_kernel as u64
                            + 7 * state * la.value_heads as u64
                            + 2 * values * d,
                        per_key: 0,
                        kv_projection: 0,
                    }
                }
                _ => {
                    let a = cfg.layer_attention.get(l);
                    let hd = a.map_or(cfg.head_dim, |a| a.head_dim);
                    let q = (cfg.num_heads * hd) as u64;
                    let kv_rows =
                        a.map_or(2 * cfg.num_kv_heads, LayerAttention::projected_kv_heads);
                    let kv = (kv_rows * hd) as u64;
                    let gate = if cfg.attn_output_gate { 2 * d * q } else { 0 };
                    lcut_trace::LayerFlops {
                        token: 2 * d * q + 2 * d * kv + 2 * q * d + gate,
                        per_key: 4 * q,
                        kv_projection: 2 * d * kv,
                    }
                }
            };
            let sparse = cfg.sparse_layers.get(l).copied().unwrap_or(false);
            let mlp = match (sparse, cfg.experts) {
                (true, Some(e)) => {
                    let routed =
                        2 * d * e.num_experts as u64 + e.top_k as u64 * 6 * d * e.inner as u64;
                    let shared = e.shared_inner.map_or(0, |s| 6 * d * s as u64 + 2 * d);
                    let beside = match e.beside_mlp {
                        true => 6 * d * cfg.mlp_width(l) as u64,
                        false => 0,
                    };
                    routed + shared + beside
                }
                _ => 6 * d * cfg.mlp_width(l) as u64,
            };
            let per_layer = cfg.per_layer_input.map_or(0, |p| 4 * d * p.width as u64);
            lcut_trace::LayerFlops {
                token: mixer.token + mlp + per_layer,
                ..mixer
            }
        })
        .collect()
}

/// Bytes of the full model's K/V cache for `tokens` tokens stored in
/// `kv_dtype`: 2 · K/V heads · head width · bytes per row of each layer
/// that stores K/V (a layer that reads another layer's holds none, Gemma
/// 4's shared layers; a linear-attention layer none either, Qwen3.5's:
/// [`recurrent_state_bytes`] counts its state), `tokens` rows at a layer
/// that reads every earlier key and [`window_cache_rows`] at a
/// sliding-window layer (Gemma 3: five layers in six).
pub fn kv_cache_bytes(cfg: &ModelConfig, kv_dtype: DType, tokens: usize) -> u64 {
    let bytes = kv_dtype.size_in_bytes() as u64;
    (0..cfg.num_layers)
        .filter_map(|l| cfg.layer_attention.get(l).map(|a| (l, a)))
        .filter(|(_, a)| a.kv_source.is_none())
        .map(|(l, a)| {
            let row = 2 * (a.kv_heads * a.head_dim) as u64 * bytes;
            let window = cfg.sliding_window.get(l).copied().flatten();
            window_cache_rows(window, tokens) as u64 * row
        })
        .sum()
}

/// Bytes the linear-attention layers' states take once a token has run
/// them (Qwen3.5; 0 for other models): per linear layer, the convolution's
/// last `kernel - 1` inputs and a key x value matrix per value head, in
/// f32, whatever the number of tokens (the same under every policy that
/// runs a token there).
pub fn recurrent_state_bytes(cfg: &ModelConfig) -> u64 {
    cfg.linear_attention.as_ref().map_or(0, |la| {
        let layers = la.layers.iter().filter(|&&l| l).count();
        (layers * la.state_values() * 4) as u64
    })
}

/// The rows a layer's cache makes room for when it is to take `rows` rows:
/// all of them, or under a sliding window of `w` at most `2w`. Such a layer
/// keeps only the last `w - 1` rows between chunks and reuses the room of
/// those its window left, so a prefill chunk of up to `w + 1` tokens fits.
pub fn window_cache_rows(window: Option<usize>, rows: usize) -> usize {
    window.map_or(rows, |w| rows.min(2 * w))
}

/// Rows a layer's cache allocates itself in a branch that reads the
/// `prompt_rows` it keeps of the prompt from the run it branched from
/// ([`crate::LayerCache::fork`]) and holds `rows` in all at the end: room
/// for the rows still to come ([`crate::Sequence::reserve`]), which on a
/// sliding layer is at most twice its window ([`window_cache_rows`]).
pub fn branch_cache_rows(window: Option<usize>, prompt_rows: usize, rows: usize) -> usize {
    window_cache_rows(window, rows.saturating_sub(prompt_rows))
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
        // the widest MLP (Gemma 4's shared layers' may be twice as wide)
        (0..cfg.num_layers)
            .map(|l| cfg.mlp_width(l))
            .max()
            .unwrap_or(cfg.intermediate_size) as u64,
    );
    let block = (h * n * keys).min(block_elems as u64);
    // scores in the dtype, in f32, masked, softmax (f32), probabilities in
    // the dtype; the chunk's mask in f32 (zeros for the visible prefix and
    // the rest, then joined)
    let attention = block * (b + 4 + 4 + 4 + b) + 2 * n * keys * 4;
    // the widest layer's queries, keys and values (Gemma 4's full layers)
    let qkv = cfg
        .layer_attention
        .iter()
        .map(|a| (cfg.num_heads + 2 * a.kv_heads) as u64 * a.head_dim as u64)
        .max()
        .unwrap_or(0);
    let activations = n * (4 * d + 3 * i + 2 * qkv) * b + 2 * cfg.vocab_size as u64 * 4;
    MemoryEstimate {
        weights: parameter_count(cfg) * b,
        kv: kv_bytes,
        states: recurrent_state_bytes(cfg),
        attention,
        activations,
        records: 0,
        process: 0,
    }
}

/// Whether every layer of `cfg` attends on the fused CUDA kernel with
/// activations of `dtype` on `device` ([`crate::fused_attention_runs`]):
/// no score matrix is held (a probed decode row still is, one per head).
pub fn attention_is_fused(device: &Device, dtype: DType, cfg: &ModelConfig) -> bool {
    !cfg.layer_attention.is_empty()
        && cfg
            .layer_attention
            .iter()
            .all(|a| crate::fused_attention_runs(device, dtype, a.head_dim))
}

/// Whether every prefill chunk of a run on `device` with activations of
/// `dtype` under policies of `kinds` attends by the blocked CPU kernel
/// (no score matrix): the CPU, f32 activations (also `--dtype q`'s), and
/// the full model or SPEED, whose chunks keep every row they write in the
/// layer's cache (a SelfOnly chunk does not, and takes the tensor path).
/// A run that records prefill attention rows (`lcut forward`) is not one.
pub fn prefill_is_blocked(
    device: &Device,
    dtype: DType,
    kinds: &[lcut_policy::PolicyKind],
) -> bool {
    use lcut_policy::PolicyKind;
    device.is_cpu()
        && dtype == DType::F32
        && kinds
            .iter()
            .all(|k| matches!(k, PolicyKind::Full | PolicyKind::Speed))
}

/// Bytes a model's weights take once loaded from `files` in `mode`: a
/// GGUF file's tensors as stored when its matrices stay quantized, the
/// matrices packed at load at their interleaved size
/// ([`lcut_kernels::quant::packed::packed_len`]: the file's bytes but Q4_K's and
/// Q5_K's, 32 more per eight blocks for their unpacked sub-block scales,
/// and rows filled to a multiple of eight); parameters times the dtype's
/// size otherwise; for a GGUF file also its header (metadata and tensor
/// directory), whose mapped pages stay resident once parsed (Gemma 3's
/// 262,144-token vocabulary makes it 6 MiB). Experts (3-D tensors) are
/// counted as stored: they are packed as tokens choose them.
pub fn loaded_weight_bytes(files: &ModelFiles, mode: WeightMode) -> u64 {
    let header = match files {
        ModelFiles::Gguf(file) => file.header().header_len as u64,
        ModelFiles::Folder(_) => 0,
    };
    header
        + match (files, mode) {
            (ModelFiles::Gguf(file), WeightMode::Quantized) => {
                let packs = crate::mapped::packs_at_load();
                let tensors = &file.header().tensors;
                // an untied embedding table is only looked up, never packed
                let untied = tensors.contains_key("output.weight");
                tensors
                    .iter()
                    .map(|(name, t)| {
                        let packed = packs && !(untied && name == "token_embd.weight");
                        let packed_len =
                            match (QuantFormat::from_ggml_type(t.type_id), &t.shape[..]) {
                                (Some(format), &[rows, cols]) if packed => {
                                    lcut_kernels::quant::packed::packed_len(format, rows, cols).ok()
                                }
                                _ => None,
                            };
                        packed_len.unwrap_or(t.len) as u64
                    })
                    .sum()
            }
            _ => parameter_count(files.config()) * mode.activation_dtype().size_in_bytes() as u64,
        }
}

/// Bytes free where `device` runs: the GPU's free memory, or on the CPU
/// the host's available memory (`MemAvailable` of /proc/meminfo), or less
/// when the process's cgroup caps it (a container's `memory.max` minus
/// `memory.current`); `None` when it cannot be read.
pub fn available_bytes(device: &Device) -> Option<u64> {
    match device {
        Device::Cpu => {
            let host = meminfo_available(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
            let read = |name: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok();
            let cgroup = match (read("memory.max"), read("memory.current")) {
                (Some(max), Some(current)) => cgroup_free(&max, &current),
                _ => None,
            };
            Some(cgroup.map_or(host, |c| c.min(host)))
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

/// `MemAvailable` of a /proc/meminfo text, bytes.
pub fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What a cgroup (v2) leaves: `memory.max` (a byte count, or `max` for no
/// limit) minus `memory.current`; `None` without a limit.
pub fn cgroup_free(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// This process's resident memory now and at its peak (`VmRSS`, `VmHWM`
/// of /proc/self/status), bytes; `None` where that is not readable.
pub fn resident_bytes() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_reports_available_memory() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(available_bytes(&Device::Cpu).is_some_and(|b| b > 0));
            let (now, peak) = resident_bytes().expect("a Linux process has a status");
            assert!(now > 0 && peak >= now);
        }
    }

    /// A branch allocates room for the rows it does not read from the run it
    /// branched from: every decode-phase row on a full layer, at most twice
    /// the window on a sliding one.
    #[test]
    fn a_branch_makes_room_for_the_rows_it_does_not_share() {
        // a 4,000-token prompt, 128 new tokens
        assert_eq!(branch_cache_rows(None, 4000, 4128), 128);
        // SPEED above the cut: BoS shared, the new tokens its own
        assert_eq!(branch_cache_rows(None, 1, 129), 128);
        assert_eq!(branch_cache_rows(Some(512), 4000, 4128), 128);
        // a long generation under a short window: room for two windows
        assert_eq!(branch_cache_rows(Some(64), 100, 1100), 128);
        // nothing shared: the room of a cache of its own
        assert_eq!(
            branch_cache_rows(Some(512), 0, 4128),
            window_cache_rows(Some(512), 4128)
        );
    }

    /// The memory line counts a sliding layer at the room its cache keeps,
    /// not at the prompt (Gemma 3 270M: 15 layers sliding over 512 keys).
    #[test]
    fn a_sliding_layer_needs_room_for_its_window_not_the_prompt() {
        let layer_types: Vec<&str> = (0..18)
            .map(|l| match l % 6 {
                5 => "\"full_attention\"",
                _ => "\"sliding_attention\"",
            })
            .collect();
        let json = format!(
            r#"{{"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
            "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
            "layer_types": [{}]}}"#,
            layer_types.join(",")
        );
        let cfg = ModelConfig::from_json_str(&json, std::path::Path::new("m/config.json")).unwrap();
        // one row: K and V of one 256-wide head in f16
        let row = 2 * 256 * 2;
        let bytes = |tokens: u64| kv_cache_bytes(&cfg, DType::F16, tokens as usize);
        assert_eq!(bytes(300), 18 * 300 * row);
        assert_eq!(bytes(4096), (15 * 1024 + 3 * 4096) * row);
        assert_eq!(window_cache_rows(None, 4096), 4096);
        assert_eq!(window_cache_rows(Some(512), 700), 700);
    }

    /// A container's limit caps the host's figure; no limit leaves it.
    #[test]
    fn meminfo_and_cgroup_figures_parse() {
        let info = "MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\n";
        assert_eq!(meminfo_available(info), Some(2_000_000 * 1024));
        assert_eq!(meminfo_available("MemTotal: 1 kB\n"), None);
        assert_eq!(cgroup_free("1000000\n", "400000\n"), Some(600_000));
        assert_eq!(cgroup_free("max\n", "400000\n"), None);
        assert_eq!(cgroup_free("100\n", "400\n"), Some(0));
    }

    /// The display names every part, traces and probes only when a run
    /// records them.
    #[test]
    fn the_estimate_names_its_parts() {
        let gib = 1u64 << 30;
        let e = MemoryEstimate {
            weights: 2 * gib,
            kv: gib,
            states: 0,
            attention: 0,
            activations: 0,
            records: 0,
            process: 0,
        };
        assert_eq!(
            e.to_string(),
            "3.0 GiB (weights 2.0, K/V 1.0, attention scores 0.0, other activations 0.0)"
        );
        let r = e.with_records(gib / 2).with_weights(gib);
        assert_eq!(r.total(), gib * 5 / 2);
        assert!(r.to_string().ends_with("traces and probes 0.50)"), "{r}");
        // the process's own memory counts toward the total and is named
        let p = e.with_process(gib / 4);
        assert_eq!(p.total(), 3 * gib + gib / 4);
        assert!(
            p.to_string().contains("the process before loading 0.25"),
            "{p}"
        );
        // below a GiB, in MiB
        let small = MemoryEstimate {
            weights: 3 << 20,
            kv: 1 << 19,
            ..e.without_weights().with_records(0)
        };
        assert!(
            small
                .to_string()
                .starts_with("3.5 MiB (weights 3.0, K/V 0.5,"),
            "{small}"
        );
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(5 << 20), "5.0 MiB");
    }
}
