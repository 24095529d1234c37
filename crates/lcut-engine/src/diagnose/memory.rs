//! What a diagnostic run holds at its peak, by part, known before the model
//! is loaded: the weights, the K/V of the longest prompt with its generated
//! tokens, one prefill chunk's attention scores and activations (see
//! [`lcut_model::memory::estimate`]), and the records: the probe's buffers
//! for the longest prompt, every prompt's trace (all are kept until the
//! report is written) and the report's JSON text.
//!
//! With L layers, H heads, hidden width d, a prompt of P tokens, T decode
//! steps, B prompt bins and prefill chunks of C tokens:
//!
//! ```text
//! probe  <= 8·L·P + L·(T+1)·(320 + 24·H) + (L+1)·(16·(P+T) + 64·d + 1024·(P/C + T + 1)) + 32·C·d
//! lens   <= 16·min(max(2^20, V), (L+1)·V) + 12·V + 8·(L+1)·d + 96·(L+1)·(T+1)   (+ 8·(L+1)·V kept)
//! trace  <= 24·L·T·H + 4·L·B + 8·(B+1) + 8·(L+1) + 20·(L+1)·T + 12·T + 24·N + S + 1280
//! routing <= 2·R·(T+1)·(128 + 8·k)     (probe; R layers of experts, k per token)
//! entering <= 4·(L+1)·F·d               (F rows a teacher-forced pass feeds)
//! ```
//!
//! (probe: the per-layer attention sums over prompt positions, the
//! per-(layer, step) phase masses, the curvature accumulators of the
//! prompt and generated spans at every layer, a chunk's f64 states while
//! they are reduced; lens, for a vocabulary of V tokens: one block of lens
//! logits with its temporaries ([`lcut_model::lens::lens_buffer_bound`]),
//! a step's hidden states at every site and its per-step records, and with
//! `--save-lens-logits` the step's logits; trace:
//! [`lcut_trace::trace_memory_bound`], N strings of S bytes in all, and for
//! a mixture-of-experts model [`lcut_trace::routing_memory_bound`]; routing:
//! a routed row's entropy, experts and map entry, for the run and, when it
//! compares a policy, the full model beside it; entering: the full model's
//! teacher-forced pass's states entering each layer a sweep's or a
//! knockout's passes start from, F its decode-phase prompt tokens and
//! continuation.)
//! Nothing is L x H x P x T, nor L x V x T: attention rows are reduced to
//! per-head masses and per-position sums, lens logits to four numbers per
//! layer, as they are computed.

use candle_core::DType;
use lcut_model::ModelConfig;
use lcut_model::memory::{MemoryEstimate, estimate};
use lcut_trace::{
    bin_edges, routing_memory_bound, routing_size_bound, trace_memory_bound, trace_size_bound,
};

use super::DiagnoseOptions;

/// Bytes of token text assumed per token string, on average, in the
/// estimate of a trace before the prompt's tokens are decoded.
pub const TOKEN_TEXT_BYTES: usize = 16;

/// Upper bound on the diagnostic probe's buffers for one prompt of
/// `prompt_len` tokens and `steps` decode steps, prefilled in chunks of
/// `chunk` (the formula above).
pub fn probe_buffer_bound(cfg: &ModelConfig, prompt_len: usize, steps: usize, chunk: usize) -> u64 {
    let (l, h, d) = (cfg.num_layers, cfg.num_heads, cfg.hidden_size);
    let (p, t, c) = (prompt_len, steps, chunk.max(1));
    let prompt_sums = 8 * l * p;
    let masses = l * (t + 1) * (320 + 24 * h);
    let curvature = (l + 1) * (16 * (p + t) + 64 * d + 1024 * (p / c + t + 1));
    let chunk_states = 32 * c.min(p.max(1)) * d;
    (prompt_sums + masses + curvature + chunk_states) as u64
}

/// Upper bound on the logit lens's buffers (the formula above), 0 when
/// the run records no lens.
pub fn lens_bound(cfg: &ModelConfig, steps: usize, opts: &DiagnoseOptions) -> u64 {
    if !opts.lens {
        return 0;
    }
    let (sites, d) = (cfg.num_layers + 1, cfg.hidden_size);
    let keep = opts.lens_logits.is_some();
    lcut_model::lens::lens_buffer_bound(sites, cfg.vocab_size, keep)
        + (8 * sites * d + 96 * sites * (steps + 1)) as u64
}

/// Bytes assumed for the name of the policy a run compares routing under.
const POLICY_NAME_BYTES: usize = 256;

/// Layers of experts and experts per token of a mixture-of-experts model
/// (`None` for a dense one).
fn routed_shape(cfg: &ModelConfig) -> Option<(usize, usize)> {
    let e = cfg.experts?;
    Some((cfg.sparse_layers.iter().filter(|&&s| s).count(), e.top_k))
}

/// Upper bound on the routing probes' rows for `steps` decode steps (the
/// formula above), 0 for a dense model.
pub fn routing_probe_bound(cfg: &ModelConfig, steps: usize) -> u64 {
    routed_shape(cfg).map_or(0, |(r, k)| (2 * r * (steps + 1) * (128 + 8 * k)) as u64)
}

/// Upper bound on the states a full teacher-forced pass of `fed` rows
/// records entering the layers the sweep's and the knockouts' passes start
/// from (every layer and the logits' input at most, f32 or narrower).
pub fn entering_record_bound(cfg: &ModelConfig, fed: usize) -> u64 {
    (4 * (cfg.num_layers + 1) * fed * cfg.hidden_size) as u64
}

/// Upper bound on one prompt's trace in memory and on its JSON text.
fn trace_bounds(cfg: &ModelConfig, prompt_len: usize, opts: &DiagnoseOptions) -> (u64, u64) {
    let (l, h, t) = (cfg.num_layers, cfg.num_heads, opts.max_new_tokens);
    let bins = bin_edges(prompt_len, opts.max_prompt_bins)
        .len()
        .saturating_sub(1);
    let strings = prompt_len + t + 1;
    let text = strings * TOKEN_TEXT_BYTES;
    let (routing_held, routing_json) = routed_shape(cfg).map_or((0, 0), |(r, k)| {
        (
            routing_memory_bound(r, t, k, POLICY_NAME_BYTES),
            routing_size_bound(r, t, k, POLICY_NAME_BYTES),
        )
    });
    (
        (trace_memory_bound(l, h, t, bins, text, strings) + routing_held) as u64,
        (trace_size_bound(l, h, t, bins, text, strings) + routing_json) as u64,
    )
}

/// Peak memory of diagnosing prompts of `prompt_lens` tokens, of which at
/// most `decode_phase` are decode-phase tokens, on a model of `cfg` whose
/// weights take `weight_bytes` loaded, activations in `dtype`, prefill
/// chunks of `chunk` tokens and attention blocks of at most `block_elems`
/// scores.
pub fn diagnose_memory(
    cfg: &ModelConfig,
    (dtype, weight_bytes): (DType, u64),
    (prompt_lens, decode_phase): (&[usize], usize),
    opts: &DiagnoseOptions,
    (chunk, block_elems): (usize, usize),
) -> MemoryEstimate {
    let longest = prompt_lens.iter().copied().max().unwrap_or(1);
    let total = longest + opts.max_new_tokens;
    let kv_shape = cfg.kv_shape(dtype);
    let kv = (kv_shape.num_layers * kv_shape.bytes_per_token_layer() * total) as u64;
    let (traces, json) = prompt_lens
        .iter()
        .map(|&p| trace_bounds(cfg, p, opts))
        .fold((0, 0), |(m, j), (a, b)| (m + a, j + b));
    // the report holds the traces; writing it builds its JSON text in a
    // growing buffer (up to twice its length) and the aggregates take
    // about one more copy of the masses
    let records = probe_buffer_bound(cfg, longest, opts.max_new_tokens, chunk)
        + lens_bound(cfg, opts.max_new_tokens, opts)
        + routing_probe_bound(cfg, opts.max_new_tokens)
        + entering_record_bound(cfg, decode_phase + opts.max_new_tokens)
        + 2 * traces
        + 2 * json
        + (1 << 16);
    estimate(cfg, dtype, kv, total, chunk, block_elems)
        .with_weights(weight_bytes)
        .with_records(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A 32-layer, 32-head model (Llama-3.2-1B's widths, 32 layers deep).
    fn deep_1b() -> ModelConfig {
        let json = serde_json::json!({
            "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": true
        });
        ModelConfig::from_json_str(&json.to_string(), Path::new("config.json")).unwrap()
    }

    /// The estimate's parts: the weights as given, the K/V of the longest
    /// prompt and its generated tokens at full depth, and records that
    /// hold every prompt's trace and the probe of the longest.
    #[test]
    fn the_estimate_has_its_parts() {
        let cfg = deep_1b();
        let opts = DiagnoseOptions::default();
        let lens = [1000, 4000, 2000];
        let e = diagnose_memory(&cfg, (DType::F32, 123), (&lens, 8), &opts, (512, 1 << 28));
        assert_eq!(e.weights, 123);
        // 32 layers x (K and V) x 8 heads x 64 wide x 4 bytes, per token
        assert_eq!(e.kv, 32 * 2 * 8 * 64 * 4 * (4000 + 16));
        let one = |p| trace_bounds(&cfg, p, &opts);
        let traces: u64 = lens.iter().map(|&p| one(p).0).sum();
        let entering = entering_record_bound(&cfg, 8 + 16);
        assert!(e.records > probe_buffer_bound(&cfg, 4000, 16, 512) + entering + traces);
        assert_eq!(
            e.total(),
            e.weights + e.kv + e.attention + e.activations + e.records
        );
    }

    /// Records grow with the prompt by a few hundred bytes per token (the
    /// per-position attention sums, curvature terms and token strings),
    /// not by layers x heads x steps per token as full attention rows would.
    #[test]
    fn records_stay_linear_and_small_in_the_prompt_length() {
        let cfg = deep_1b();
        let opts = DiagnoseOptions {
            lens: true,
            ..DiagnoseOptions::default()
        };
        let at = |p: usize| {
            diagnose_memory(&cfg, (DType::F32, 0), (&[p], 1), &opts, (512, 1 << 28)).records
        };
        let per_token = (at(32_768) - at(16_384)) / 16_384;
        let full_rows = (cfg.num_layers * cfg.num_heads * opts.max_new_tokens * 4) as u64;
        assert!(per_token < 2048, "{per_token} bytes per prompt token");
        assert!(per_token * 20 < full_rows);
        // at 32K tokens: a few tens of MB beside 4 GiB of K/V, besides the
        // logit lens's block of logits (about 31 MB for a 128K vocabulary),
        // which does not grow with the prompt
        let lens = lens_bound(&cfg, opts.max_new_tokens, &opts);
        assert!(lens > 0 && lens < 40 << 20, "{lens}");
        assert!(at(32_768) - lens < 100 << 20, "{}", at(32_768));
        let without = DiagnoseOptions::default();
        let bare = diagnose_memory(
            &cfg,
            (DType::F32, 0),
            (&[32_768], 1),
            &without,
            (512, 1 << 28),
        );
        assert_eq!(at(32_768) - bare.records, lens);
    }
}
