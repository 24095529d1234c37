//! The memory estimate against what a model of a shape holds: the
//! parameter count is the number of weights a random Llama writes, and an
//! 8B shape at 128k tokens needs what the formulas say.

use lcut_model::memory::{estimate, parameter_count};
use lcut_model::{DType, Device, LlamaShape, ModelConfig};
use lcut_synth::RandomLlama;

fn config_of(shape: &RandomLlama) -> anyhow::Result<ModelConfig> {
    Ok(shape.config()?)
}

#[test]
fn parameter_count_is_the_number_of_weights_written() -> anyhow::Result<()> {
    let shape = RandomLlama {
        shape: LlamaShape {
            vocab_size: 100,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 3,
            num_heads: 4,
            num_kv_heads: 2,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 64,
            layout: lcut_model::Layout::Llama,
        },
        seed: 0,
    };
    let dir = tempfile::tempdir().unwrap();
    shape.write(dir.path()).unwrap();
    let weights =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let written: usize = weights.values().map(|t| t.elem_count()).sum();
    assert_eq!(parameter_count(&config_of(&shape)?), written as u64);
    Ok(())
}

#[test]
fn an_8b_shape_at_128k_needs_what_the_formulas_say() -> anyhow::Result<()> {
    let shape = RandomLlama {
        shape: LlamaShape {
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 1 << 18,
            layout: lcut_model::Layout::Llama,
        },
        seed: 0,
    };
    let cfg = config_of(&shape)?;
    // Llama-3.1-8B's published parameter count
    let params = parameter_count(&cfg);
    assert_eq!(params, 8_030_261_248);
    let total = 131_072 + 128;
    let kv = (2 * 8 * 128 * 2 * 32 * total) as u64;
    let e = estimate(&cfg, DType::BF16, kv, total, 2048, 1 << 30);
    assert_eq!(e.weights, params * 2);
    // a block of 2^30 scores at 16 bytes each, plus a [2048 x total] f32 mask twice
    assert_eq!(e.attention, (1u64 << 30) * 16 + 2 * 2048 * total as u64 * 4);
    // fits an 80 GB or 141 GB GPU, not a 40 GB one
    let gib = e.total() as f64 / f64::from(1u32 << 30);
    assert!((45.0..60.0).contains(&gib), "{e}");
    assert!(e.to_string().starts_with(&format!("{gib:.1} GiB")));
    Ok(())
}

/// A run whose prefill chunks all take the blocked CPU kernel (the full
/// model or SPEED, f32 activations) holds no score matrix: at a 32K-token
/// prompt of a 32-layer, 32-head model its attention part is one decode
/// row's scores and the kernel's output, not the 2^28-score block (5 GiB)
/// the tensor path may hold; SelfOnly, bf16 or a GPU keep the block.
#[test]
fn a_blocked_prefill_counts_no_score_matrix() -> anyhow::Result<()> {
    use lcut_model::memory::prefill_is_blocked;
    use lcut_policy::PolicyKind;
    let shape = RandomLlama {
        shape: LlamaShape {
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            rope_theta: 500_000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 1 << 17,
            layout: lcut_model::Layout::Llama,
        },
        seed: 0,
    };
    let cfg = config_of(&shape)?;
    let total = 32_605 + 16;
    let kv = (2 * 8 * 64 * 2 * 32 * total) as u64;
    let chunked = estimate(&cfg, DType::F32, kv, total, 512, 1 << 28);
    assert_eq!(
        chunked.attention,
        (1u64 << 28) * 20 + 2 * 512 * total as u64 * 4
    );
    let blocked = chunked.with_blocked_prefill(&cfg, DType::F32, (total, 512));
    let scores = 32 * total as u64 * 20 + 8 * total as u64;
    assert_eq!(blocked.attention, scores + 2 * 512 * 32 * 64 * 4);
    assert_eq!(blocked.kv, chunked.kv);
    assert!(blocked.attention < 32 << 20, "{blocked}");

    let cpu = Device::Cpu;
    let full_and_speed = [PolicyKind::Full, PolicyKind::Speed];
    assert!(prefill_is_blocked(&cpu, DType::F32, &full_and_speed));
    assert!(!prefill_is_blocked(&cpu, DType::BF16, &full_and_speed));
    assert!(!prefill_is_blocked(
        &cpu,
        DType::F32,
        &[PolicyKind::Full, PolicyKind::SelfOnly]
    ));
    assert!(!prefill_is_blocked(&cpu, DType::F32, &[PolicyKind::Slim]));
    Ok(())
}

/// The number of values in a reference case's weights file.
fn values_written(dir: &std::path::Path) -> anyhow::Result<u64> {
    let bytes = std::fs::read(dir.join("model.safetensors"))?;
    let file = safetensors::SafeTensors::deserialize(&bytes)?;
    let written: usize = file
        .tensors()
        .iter()
        .map(|(_, t)| t.shape().iter().product::<usize>())
        .sum();
    Ok(written as u64)
}

/// Gemma 4's layers differ: the full layers' wider heads and keys that are
/// the values, the shared layers' missing K/V projections, the per-layer
/// inputs. The count is the number of values in the reference case's
/// weights, and the full model's K/V counts only the four layers that store
/// (the two shared ones hold none).
#[test]
fn gemma4_counts_its_own_weights_and_only_stored_kv() -> anyhow::Result<()> {
    let dir = lcut_testkit::oracle_case(lcut_testkit::GEMMA4_CASE);
    let cfg = ModelConfig::from_folder(&dir)?;
    assert_eq!(parameter_count(&cfg), values_written(&dir)?);
    // f32, 40 tokens: sliding layers 0, 1, 3 (2 heads of 16, window 12 ->
    // 24 rows) and full layer 2 (1 head of 32, 40 rows)
    let sliding = 3 * 24 * 2 * 2 * 16 * 4;
    let full = 40 * 2 * 32 * 4;
    let kv = lcut_model::memory::kv_cache_bytes(&cfg, lcut_model::DType::F32, 40);
    assert_eq!(kv, (sliding + full) as u64);
    Ok(())
}

/// Qwen3.5's linear layers have their own projections, convolution and
/// decay parameters and hold no K/V; its full layers' query projection
/// carries the output gate. The count is the number of values in the
/// reference case's weights; the full model's K/V counts the two full
/// layers only, and a sequence's linear states take the fixed size the
/// config gives, whatever the number of tokens (twice that in a full-depth
/// run, which keeps the first token's state too).
#[test]
fn qwen35_counts_its_linear_layers_and_keeps_states_apart_from_kv() -> anyhow::Result<()> {
    let dir = lcut_testkit::oracle_case(lcut_testkit::QWEN35_CASE);
    let cfg = ModelConfig::from_folder(&dir)?;
    assert_eq!(parameter_count(&cfg), values_written(&dir)?);
    // f32, 40 tokens: layers 3 and 7, 2 K/V heads of 16
    let kv = lcut_model::memory::kv_cache_bytes(&cfg, lcut_model::DType::F32, 40);
    assert_eq!(kv, 2 * 40 * 2 * 2 * 16 * 4);
    // six linear layers: 96 channels x 3 inputs and 4 matrices of 16 x 8
    let state = 6 * (96 * 3 + 4 * 16 * 8) * 4;
    assert_eq!(
        lcut_model::memory::recurrent_state_bytes(&cfg),
        state as u64
    );
    // the memory line counts them apart from K/V
    let line = estimate(&cfg, DType::F32, kv, 40, 40, 1 << 20);
    assert_eq!((line.kv, line.states), (kv, state as u64));
    assert!(
        line.to_string().contains("linear-attention states"),
        "{line}"
    );
    assert_eq!(
        line.total(),
        line.weights + kv + state as u64 + line.attention + line.activations
    );
    let model = lcut_model::Decoder::load(&dir, lcut_model::DType::F32, &lcut_model::Device::Cpu)?;
    let mut seq = model.new_full_sequence();
    let ids: Vec<u32> = (1..=30).collect();
    model.forward(&mut seq, &ids[..20], lcut_model::LogitRows::None, None)?;
    // a full-depth run also keeps each state as the first token left it (so
    // that it can be restricted to SPEED with BoS): twice the state
    assert_eq!(seq.recurrent_bytes_held(), 2 * state as u64);
    assert_eq!(seq.kv_bytes_held(), 2 * 20 * 2 * 2 * 16 * 4);
    model.forward(&mut seq, &ids[20..], lcut_model::LogitRows::None, None)?;
    assert_eq!(seq.recurrent_bytes_held(), 2 * state as u64);
    assert_eq!(seq.recurrent_state(0).map(|s| s.tokens()), Some(30));
    assert!(seq.recurrent_state(3).is_none());
    Ok(())
}

/// The two mixtures of experts of the newer layouts count every weight:
/// Qwen3.5-MoE's shared expert and its gate beside the routed experts,
/// Gemma 4's dense MLP, router scales and branch norms beside its experts.
#[test]
fn the_newer_mixtures_count_their_own_weights() -> anyhow::Result<()> {
    for case in [lcut_testkit::QWEN35MOE_CASE, lcut_testkit::GEMMA4MOE_CASE] {
        let dir = lcut_testkit::oracle_case(case);
        let cfg = ModelConfig::from_folder(&dir)?;
        assert_eq!(parameter_count(&cfg), values_written(&dir)?, "{case}");
    }
    Ok(())
}

/// The FLOP model's per-layer coefficients ([`lcut_model::memory::layer_flops`])
/// against the weights transformers wrote for every reference case: a
/// token's projection, MLP and expert FLOPs are twice the matrix entries
/// it multiplies at that layer (every 2-D matrix, and of the experts'
/// tensors the top-k's share; biases and norms left out, as the model
/// leaves them), plus a linear layer's recurrence; a query reads a key for
/// `2·2·H·h`, 0 on a layer without attention; a token's K/V projection is
/// twice the K and V matrices' entries, 0 on a layer that stores none.
#[test]
fn layer_flops_count_the_matrices_each_token_multiplies() -> anyhow::Result<()> {
    let cases = lcut_testkit::ORACLE_CASES
        .iter()
        .chain(&lcut_testkit::MOE_CASES)
        .chain(&lcut_testkit::LAYOUT_CASES);
    for &case in cases {
        let dir = lcut_testkit::oracle_case(case);
        let cfg = ModelConfig::from_folder(&dir)?;
        let bytes = std::fs::read(dir.join("model.safetensors"))?;
        let file = safetensors::SafeTensors::deserialize(&bytes)?;
        let flops = lcut_model::memory::layer_flops(&cfg);
        assert_eq!(flops.len(), cfg.num_layers, "{case}");
        let share = cfg
            .experts
            .map_or(1.0, |e| e.top_k as f64 / e.num_experts as f64);
        for (l, got) in flops.iter().enumerate() {
            let prefix = format!("layers.{l}.");
            let (mut token, mut kv, mut attends) = (0.0, 0.0, false);
            for (name, t) in file.tensors() {
                let Some(at) = name.find(&prefix) else {
                    continue;
                };
                let local = &name[at + prefix.len()..];
                let entries = t.shape().iter().product::<usize>() as f64;
                if t.shape().len() < 2 || local.ends_with("bias") {
                    continue;
                }
                let entries = if local.contains("experts.") {
                    entries * share
                } else {
                    entries
                };
                token += 2.0 * entries;
                if local.contains("self_attn.") {
                    attends = true;
                }
                if local.starts_with("self_attn.k_proj") || local.starts_with("self_attn.v_proj") {
                    kv += 2.0 * entries;
                }
                if local.contains("qkv_proj") {
                    // Phi-3's fused projection: its rows past the queries'
                    let q = (cfg.num_heads * cfg.head_dim) as f64;
                    kv += 2.0 * entries * (1.0 - q / t.shape()[0] as f64);
                }
            }
            let recurrence = match &cfg.linear_attention {
                Some(la) if la.is_linear(l) => {
                    (7 * la.key_head_dim * la.value_head_dim * la.value_heads) as f64
                }
                _ => 0.0,
            };
            assert_eq!(
                got.token as f64,
                token + recurrence,
                "{case} layer {l}: token"
            );
            assert_eq!(
                got.kv_projection as f64, kv,
                "{case} layer {l}: K/V projection"
            );
            let head_dim = cfg
                .layer_attention
                .get(l)
                .map_or(cfg.head_dim, |a| a.head_dim);
            let per_key = match attends {
                true => (4 * cfg.num_heads * head_dim) as f64,
                false => 0.0,
            };
            assert_eq!(got.per_key as f64, per_key, "{case} layer {l}: per key");
        }
    }
    Ok(())
}
