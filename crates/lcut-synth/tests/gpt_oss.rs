//! gpt-oss's shape (`gpt-oss-20b`, at test size) in every format: the
//! folder is the drawn model exactly (its experts fused as transformers
//! stores them); the GGUF files, written as llama.cpp's converter writes
//! gpt-oss (experts split into gate, up and down and turned, sinks,
//! biases, the norm before the experts as `post_attention_norm`) and in
//! `gguf-mxfp4` with the experts in MXFP4, read back as the same model,
//! dense and kept quantized; their keys, tensor names, types and ranks are
//! those the converter gave the reference case; the full shape counts the
//! parameters its name says and plans where its 2880-wide rows fit.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device};
use lcut_model::Arch;
use lcut_model::gguf::GgufFile;
use lcut_synth::shapes::{self, ModelShape};
use lcut_synth::{Format, RandomModel};

mod common;
use common::{every_format_computes, write};

/// gpt-oss-20b's layout at test size: 4 layers (sliding, full, sliding,
/// full) with a window of 8, width 256, 4 heads 64 wide (2 K/V), 4
/// experts of width 256, 2 run per token.
fn tiny_gpt_oss() -> ModelShape {
    let mut s = shapes::gpt_oss_20b();
    s.name = "tiny-gpt-oss".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 256;
    s.sizes.num_layers = 4;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.tokens.bos = 500;
    s.tokens.eos = 501;
    s.tokens.pad = Some(502);
    s.experts = s.experts.map(|mut e| {
        e.num_experts = 4;
        e.top_k = 2;
        e.inner = 256;
        e.kind = shapes::ExpertsKind::GptOss { sliding_window: 8 };
        e
    });
    s
}

/// Every format loads as a decoder computing what the drawn model does
/// over 20 tokens (past the window of 8): the f32 folder exactly, bf16
/// and the GGUF files within their rounding, dense and kept quantized. An
/// expert's gate read as its up projection, or a projection not turned,
/// moves the logits by their whole size.
#[test]
fn every_format_is_the_drawn_model() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..20).map(|i| 3 + 37 * i % 490).collect();
    let shape = tiny_gpt_oss();
    let drawn = RandomModel {
        shape: shape.clone(),
        seed: 9,
    }
    .build(DType::F32, &Device::Cpu)
    .unwrap();
    let cfg = drawn.config().clone();
    assert_eq!(cfg.arch, Arch::GptOss);
    assert!(cfg.attention_sinks && cfg.qkv_bias);
    assert_eq!(cfg.sliding_window, vec![Some(8), None, Some(8), None]);
    let want = drawn.teacher_forced_logits(&tokens, None).unwrap();
    let dir = dir.path();
    every_format_computes(
        &shape,
        9,
        dir,
        (&tokens, &want),
        0.5,
        |format, _, _, model| {
            let read = model.config();
            assert_eq!(
                (read.arch, read.experts, read.sliding_window.clone()),
                (cfg.arch, cfg.experts, cfg.sliding_window.clone()),
                "{format}"
            );
        },
    );
}

/// The `gguf-mxfp4` file has the keys, tensor names, types and ranks
/// llama.cpp's converter gave the reference case's MXFP4 file
/// (`fixtures/oracle/moe/gptoss-gguf`): every `gpt-oss.*` key it wrote but
/// YaRN's betas at their defaults (which the shape's config does not name
/// either; ours add only the vocabulary size and the rotated width), and
/// the same tensors in a layer and at the top: experts in MXFP4, the other
/// matrices in Q8_0, norms, biases, sinks and the router in f32.
#[test]
fn the_mxfp4_file_matches_llama_cpps_converter() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/moe/gptoss-gguf");
    let out = dir.path().join("tiny-gpt-oss.gguf");
    write(&tiny_gpt_oss(), Format::GgufMxfp4, &out, 1);
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(&root.join("model.mxfp4.gguf")).unwrap();
    let (ours, theirs) = (ours.header(), theirs.header());
    assert_eq!(
        ours.metadata["general.architecture"].as_str(),
        Some("gpt-oss")
    );
    let keys = |h: &lcut_model::gguf::GgufHeader| -> Vec<String> {
        h.metadata
            .keys()
            .filter(|k| k.starts_with("gpt-oss."))
            .cloned()
            .collect()
    };
    let (our_keys, their_keys) = (keys(ours), keys(theirs));
    for k in their_keys.iter().filter(|k| !k.contains(".yarn_beta_")) {
        assert!(our_keys.contains(k), "no {k}");
    }
    for k in our_keys.iter().filter(|k| !their_keys.contains(k)) {
        assert!(
            k.ends_with(".vocab_size") || k.ends_with(".rope.dimension_count"),
            "{k} is not the converter's"
        );
    }
    let layer0 = |h: &lcut_model::gguf::GgufHeader| -> BTreeMap<String, (u32, usize)> {
        h.tensors
            .iter()
            .filter(|(n, _)| !n.starts_with("blk.") || n.starts_with("blk.0."))
            .map(|(n, t)| (n.clone(), (t.type_id, t.shape.len())))
            .collect()
    };
    assert_eq!(layer0(ours), layer0(theirs));
    assert_eq!(ours.metadata["general.file_type"].as_u64(), Some(38));
}

/// The full shape counts the parameters its name says (20.9e9; a token
/// runs 4.2e9, 3.6e9 without the embedding), exactly as lcut's memory line
/// counts a model of its config; it plans in every GGUF format, its
/// 2880-wide rows in types of 32-value blocks where a format's 256-value
/// blocks do not fit them, as llama.cpp's quantizer stores them (Q4_K as
/// Q5_0, the Q6_K head as Q8_0).
#[test]
fn the_full_shape_counts_its_parameters_and_plans_in_every_format() {
    let shape = shapes::gpt_oss_20b();
    let cfg = shape.config().unwrap();
    assert_eq!(
        shape.parameter_count(),
        lcut_model::memory::parameter_count(&cfg)
    );
    let near = |n: u64, want: f64| ((n as f64 - want) / want).abs() < 0.01;
    assert!(
        near(shape.parameter_count(), 20.91e9),
        "{}",
        shape.parameter_count()
    );
    assert!(
        near(shape.active_parameter_count(), 4.19e9),
        "{}",
        shape.active_parameter_count()
    );
    for format in [Format::GgufQ8_0, Format::GgufMxfp4] {
        let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
        assert!(plan.data_bytes() > 0, "{format}");
    }
    let mxfp4 = lcut_synth::write::gguf::plan(&shape, Format::GgufMxfp4)
        .unwrap()
        .data_bytes() as f64;
    // the experts at 17 bytes per 32 values, the rest at Q8_0's 34
    assert!((11.5e9..13.5e9).contains(&mxfp4), "{mxfp4}");
    let q4k = lcut_synth::write::gguf::plan(&shape, Format::GgufQ4K)
        .unwrap()
        .data_bytes() as f64;
    // the matrices at Q5_0's 22 bytes per 32 values, the head at Q8_0's
    // 34 (the others are small and f32)
    assert!((14.0e9..15.5e9).contains(&q4k), "{q4k}");
    for format in [Format::GgufQ4_0, Format::GgufQ4KM] {
        let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
        assert!(plan.data_bytes() > 0, "{format}");
    }
    let head = shape
        .tensors()
        .into_iter()
        .find(|t| t.name == "lm_head.weight")
        .unwrap();
    let head_type = lcut_synth::write::gguf::ggml_type(&shape, Format::GgufQ4_0, &head);
    assert_eq!(head_type, candle_core::quantized::GgmlDType::Q8_0);
}
