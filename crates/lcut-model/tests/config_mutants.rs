//! Damaged `config.json` files by the thousand: JSON-aware mutants (wrong
//! types, huge, negative and non-finite numbers, duplicated, missing and
//! renamed keys, invalid UTF-8, deep nesting, truncation at every token) of
//! every reference config, each read from a model folder. Each must be
//! refused with an error naming config.json, or read into a configuration
//! that says what the file says and keeps lcut's invariants; every tenth
//! that reads is loaded with the reference weights and run. No single
//! allocation may pass [`ALLOC_BOUND`]. `LCUT_MUTANTS=N` runs more.

use std::time::Duration;

use lcut_model::config::{MAX_LAYERS, MAX_SIZE};
use lcut_model::{DType, Decoder, Device, ModelConfig};
use lcut_testkit::alloc::{LargestAlloc, largest_allocation};
use lcut_testkit::{
    LAYOUT_CASES, MOE_CASES, MutantRun, ORACLE_CASES, WRAPPED_CASES, json_mutants, mutant_count,
    oracle_case,
};
use serde_json::Value;

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// No single allocation may be larger (the reference weights are 1.2 MB).
const ALLOC_BOUND: usize = 64 << 20;
const DEFAULT_MUTANTS: usize = 10_000;
const SEED: u64 = 20261124;

/// The configuration keeps the invariants the decoder relies on, and its
/// sizes and token ids are the file's own (none wrapped or clamped).
fn assert_consistent(cfg: &ModelConfig, doc: Option<&Value>) {
    assert!(cfg.num_layers > 0 && cfg.num_layers <= MAX_LAYERS);
    for n in [
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads,
        cfg.head_dim,
    ] {
        assert!(n > 0 && n <= MAX_SIZE, "size {n}");
    }
    assert!(cfg.num_kv_heads > 0 && cfg.num_heads.is_multiple_of(cfg.num_kv_heads));
    assert_eq!(cfg.sliding_window.len(), cfg.num_layers);
    // each layer's attention shape and K/V source (Gemma 4's differ)
    assert_eq!(cfg.layer_attention.len(), cfg.num_layers);
    for (l, a) in cfg.layer_attention.iter().enumerate() {
        assert!(a.head_dim > 0 && a.head_dim <= MAX_SIZE, "layer {l}: {a:?}");
        // a linear-attention layer (Qwen3.5) holds no K/V
        let linear = cfg
            .linear_attention
            .as_ref()
            .is_some_and(|la| la.is_linear(l));
        assert!(
            (linear && a.kv_heads == 0)
                || (!linear && a.kv_heads > 0 && cfg.num_heads.is_multiple_of(a.kv_heads)),
            "layer {l}: {a:?}"
        );
        if let Some(s) = a.kv_source {
            let src = cfg.layer_attention[s];
            assert!(s < l && src.kv_source.is_none(), "layer {l} reads {s}");
            assert_eq!((src.kv_heads, src.head_dim), (a.kv_heads, a.head_dim));
            assert_eq!(
                cfg.sliding_window[s], cfg.sliding_window[l],
                "layer {l} reads {s}"
            );
        }
    }
    if let Some(la) = &cfg.linear_attention {
        assert_eq!(la.layers.len(), cfg.num_layers);
        for n in [
            la.key_heads,
            la.value_heads,
            la.key_head_dim,
            la.value_head_dim,
        ] {
            assert!(n > 0 && n <= MAX_SIZE, "{la:?}");
        }
        assert!(la.value_heads.is_multiple_of(la.key_heads), "{la:?}");
        assert!(
            la.conv_kernel > 0 && la.conv_channels() <= 3 * MAX_SIZE,
            "{la:?}"
        );
    }
    if let Some(p) = cfg.per_layer_input {
        assert!(p.width * cfg.num_layers <= MAX_SIZE && p.vocab >= cfg.vocab_size);
    }
    assert_eq!(cfg.rotates.len(), cfg.num_layers);
    assert_eq!(cfg.sparse_layers.len(), cfg.num_layers);
    if let Some(e) = cfg.experts {
        assert!(
            e.top_k >= 1 && e.top_k <= e.num_experts && e.inner > 0,
            "{e:?}"
        );
    }
    // each layer rotates within its own head (Gemma 4's full layers are
    // wider than its sliding ones)
    for l in 0..cfg.num_layers {
        let rope = match (cfg.sliding_window[l], &cfg.sliding_rope) {
            (Some(_), Some(sliding)) => sliding,
            _ => &cfg.rope,
        };
        let head_dim = cfg.layer_attention[l].head_dim;
        assert!(
            rope.rotary_dim > 0 && rope.rotary_dim <= head_dim && rope.rotary_dim.is_multiple_of(2),
            "layer {l}: {rope:?} on heads of {head_dim}"
        );
        assert!(rope.theta.is_finite() && rope.theta > 0.0);
    }
    assert!(cfg.rms_norm_eps.is_finite());
    assert!(cfg.attn_scale.is_finite() && cfg.attn_scale > 0.0);
    for cap in [cfg.attn_softcap, cfg.final_softcap].into_iter().flatten() {
        assert!(cap.is_finite() && cap > 0.0, "softcap {cap}");
    }
    let Some(wrapper) = doc else { return };
    // a multimodal wrapper's decoder is its text_config, and its BoS the
    // text config's, else the wrapper's
    let model_type = wrapper.get("model_type").and_then(Value::as_str);
    let multimodal = ["gemma3", "gemma4", "qwen3_5", "qwen3_5_moe"]
        .iter()
        .any(|t| model_type == Some(t));
    let doc = match multimodal {
        true => &wrapper["text_config"],
        false => wrapper,
    };
    // a Gemma 3 config leaves out what its class defaults
    let gemma3 = matches!(model_type, Some("gemma3" | "gemma3_text"));
    let class_default = |field: &str| {
        lcut_model::config::GEMMA3_TEXT_CLASS_DEFAULTS
            .iter()
            .find(|(f, _)| *f == field && gemma3)
            .map(|(_, v)| *v)
    };
    for (field, got) in [
        ("vocab_size", cfg.vocab_size),
        ("hidden_size", cfg.hidden_size),
        ("num_hidden_layers", cfg.num_layers),
        ("num_attention_heads", cfg.num_heads),
    ] {
        let said = match doc.get(field) {
            None => class_default(field),
            Some(v) => v.as_u64(),
        };
        assert_eq!(said, Some(got as u64), "`{field}`");
    }
    let named = |d: &'_ Value| d.get("bos_token_id").filter(|v| !v.is_null()).cloned();
    let bos = named(doc).or_else(|| named(wrapper).filter(|_| multimodal));
    if let Some(bos) = &bos {
        let first = bos.as_array().map_or(Some(bos), |a| a.first());
        assert_eq!(
            first.and_then(Value::as_u64),
            cfg.bos_token_id.map(u64::from),
            "bos_token_id"
        );
    }
}

#[test]
fn mutated_configs_never_panic() {
    let cases: Vec<&str> = ORACLE_CASES
        .into_iter()
        .chain(MOE_CASES)
        .chain(LAYOUT_CASES)
        .chain(WRAPPED_CASES)
        .collect();
    // every case's config (each architecture's fields) gets the full count;
    // the cases are shared among the cores, each case in its own folder
    let per_seed = mutant_count(DEFAULT_MUTANTS);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(cases.len());
    std::thread::scope(|scope| {
        for w in 0..workers {
            let cases = &cases;
            scope.spawn(move || {
                for (c, case) in cases.iter().enumerate().skip(w).step_by(workers) {
                    mutate_config(case, c * per_seed, per_seed);
                }
            });
        }
    });
}

/// `count` mutants of `case`'s config.json, numbered from `first`, each
/// read from a folder with the case's weights (see the module doc).
fn mutate_config(case: &str, first: usize, count: usize) {
    let seed = std::fs::read(oracle_case(case).join("config.json")).expect("fixture");
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("config.json");
    std::fs::copy(
        oracle_case(case).join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .expect("weights");
    let mut run = MutantRun::new(&format!("{case}'s config.json"), SEED);
    for (i, mutant) in (first..).zip(json_mutants(&seed, SEED).take(count)) {
        run.check(i, &mutant, |mutant| {
            std::fs::write(&path, mutant).expect("write mutant");
            let read = match ModelConfig::from_folder(dir.path()) {
                Ok(cfg) => {
                    let doc: Option<Value> = serde_json::from_slice(mutant).ok();
                    assert_consistent(&cfg, doc.as_ref());
                    if i % 10 == 0
                        && let Ok(model) = Decoder::load(dir.path(), DType::F32, &Device::Cpu)
                    {
                        let _ = model.teacher_forced_logits(&[1, 5, 9], None);
                    }
                    true
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains("config.json"), "{case}: {msg}");
                    false
                }
            };
            assert!(largest_allocation() <= ALLOC_BOUND);
            read
        });
    }
    run.finish(Duration::from_secs(5));
}

#[test]
fn token_ids_past_32_bits_are_refused_not_wrapped() {
    let text = std::fs::read_to_string(oracle_case("llama-gqa").join("config.json")).expect("x");
    let mut doc: Value = serde_json::from_str(&text).expect("JSON");
    for field in ["bos_token_id", "eos_token_id"] {
        let mut bad = doc.clone();
        bad[field] = Value::from((1u64 << 32) + 1);
        let err = ModelConfig::from_json_str(&bad.to_string(), "m/config.json".as_ref())
            .expect_err("a token id of 2^32 + 1 must not read as 1");
        assert!(err.to_string().contains(field), "{err}");
    }
    doc["eos_token_id"] = serde_json::json!([2, 1u64 << 33]);
    let err = ModelConfig::from_json_str(&doc.to_string(), "m/config.json".as_ref())
        .expect_err("a list with a token id of 2^33");
    assert!(err.to_string().contains("eos_token_id"), "{err}");
}

#[test]
fn zero_rope_factors_and_softcaps_are_refused() {
    let base = r#""vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2"#;
    for bad in [
        format!(
            r#"{{"model_type":"llama", {base}, "rope_scaling": {{"rope_type":"linear","factor":0}}}}"#
        ),
        format!(
            r#"{{"model_type":"llama", {base}, "rope_scaling": {{"rope_type":"llama3","factor":8,"low_freq_factor":-1,"high_freq_factor":4,"original_max_position_embeddings":64}}}}"#
        ),
        format!(r#"{{"model_type":"gemma2", {base}, "final_logit_softcapping": 0}}"#),
        format!(r#"{{"model_type":"gemma2", {base}, "attn_logit_softcapping": -50}}"#),
        format!(r#"{{"model_type":"llama", {base}, "num_hidden_layers": 1099511627776}}"#),
    ] {
        let err = ModelConfig::from_json_str(&bad, "m/config.json".as_ref()).expect_err("refused");
        assert!(err.to_string().contains("m/config.json"), "{err}");
    }
}
