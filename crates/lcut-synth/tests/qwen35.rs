//! Qwen3.5's shapes (`qwen3.5-9b`, `qwen3.5-35b-a3b`, at test size) in
//! every format: the folder is the drawn model exactly; the GGUF file,
//! written as llama.cpp's converter writes Qwen3.5 (value heads tiled,
//! `1 + w` norms, `-exp(A_log)`, the convolution squeezed), reads back as
//! the same model, dense and kept quantized; its keys, tensor names, types
//! and ranks are those the converter gave the reference cases; the full
//! shapes count the parameters their names say, as lcut's memory line
//! counts them, and plan in every GGUF format; bad linear layers are
//! refused by field.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;

use candle_core::{DType, Device};
use lcut_model::{Arch, Decoder};
use lcut_synth::shapes::{self, ExpertsKind, ModelShape};
use lcut_synth::{Format, RandomModel, SynthError, WriteOptions, write_model};

mod common;
use common::{every_format_computes, matches_converter, write};

/// Qwen3.5-9B's layout at test size: 4 layers (three linear, one full),
/// width 256, two full-attention heads 128 wide (one K/V), linear layers
/// of 2 key heads and 4 value heads 64 wide (so the value heads are
/// tiled in the GGUF file), MLP 512.
fn tiny_qwen35() -> ModelShape {
    let mut s = shapes::qwen3_5_9b();
    s.name = "tiny-qwen35".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 512;
    s.sizes.num_layers = 4;
    s.sizes.num_heads = 2;
    s.sizes.num_kv_heads = 1;
    s.head_dim = Some(128);
    s.tokens.bos = 500;
    s.tokens.eos = 501;
    s.linear = s.linear.map(|mut la| {
        la.key_heads = 2;
        la.key_dim = 64;
        la.value_heads = 4;
        la.value_dim = 64;
        la
    });
    s
}

/// Qwen3.5-35B-A3B's layout at test size: the layers of [`tiny_qwen35`],
/// 8 experts of width 256, 3 run per token, and a shared expert of 256.
fn tiny_qwen35moe() -> ModelShape {
    let mut s = tiny_qwen35();
    s.name = "tiny-qwen35moe".into();
    s.sizes.intermediate_size = 256;
    s.experts = shapes::qwen3_5_35b_a3b().experts.map(|mut e| {
        e.num_experts = 8;
        e.top_k = 3;
        e.inner = 256;
        e.kind = ExpertsKind::Qwen35Moe { shared_inner: 256 };
        e
    });
    s
}

/// Every format loads as a decoder computing what the drawn model does:
/// the f32 folder exactly, bf16 and the GGUF files within their rounding,
/// dense and kept quantized. A value head read against the wrong key
/// head, a norm without its one or a decay rate not undone would each
/// move the logits by their whole size.
#[test]
fn every_format_is_the_drawn_model() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..14).map(|i| 3 + 37 * i % 490).collect();
    for shape in [tiny_qwen35(), tiny_qwen35moe()] {
        let drawn = RandomModel {
            shape: shape.clone(),
            seed: 6,
        }
        .build(DType::F32, &Device::Cpu)
        .unwrap();
        let cfg = drawn.config().clone();
        assert_eq!(cfg.arch, shape.arch());
        let la = cfg.linear_attention.clone().unwrap();
        assert_eq!(la.layers, vec![true, true, true, false]);
        assert_eq!(cfg.rope.rotary_dim, 32);
        let want = drawn.teacher_forced_logits(&tokens, None).unwrap();
        // Q8_0 holds the layout: with its value heads left in Hugging
        // Face's order the dense file is off by 1.4. The linear layers'
        // gated norms and the q/k norms scale the random model's small
        // outputs up to unit size, and 4-bit rounding with them: up to 0.9
        // on the dense shape
        let checks = |format: Format, _: &Path, _, model: &Decoder| {
            let read = model.config();
            assert_eq!(read.arch, cfg.arch, "{} as {format}", shape.name);
            assert_eq!(read.experts, cfg.experts, "{} as {format}", shape.name);
            let read_la = read.linear_attention.clone().unwrap();
            assert_eq!(
                (read_la.layers, read_la.value_heads, read_la.key_heads),
                (la.layers.clone(), la.value_heads, la.key_heads)
            );
            assert_eq!(read.rope.rotary_dim, cfg.rope.rotary_dim);
        };
        every_format_computes(&shape, 6, dir.path(), (&tokens, &want), 1.0, checks);
    }
}

/// The GGUF files have the keys, tensor names, types and ranks llama.cpp's
/// converter gave the reference cases in Q8_0 (`fixtures/oracle/layouts`):
/// every `{arch}.*` key it wrote (ours add only the vocabulary size), and
/// the same tensors in a linear layer, a full layer and at the top.
#[test]
fn gguf_files_match_llama_cpps_converter() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/layouts");
    for (shape, case) in [
        (tiny_qwen35(), "qwen35-hybrid"),
        (tiny_qwen35moe(), "qwen35moe-shared"),
    ] {
        // the reference cases tie their head to the embedding
        let mut shape = shape;
        shape.tie_word_embeddings = true;
        let out = dir.path().join(format!("{}.gguf", shape.name));
        write(&shape, Format::GgufQ8_0, &out, 1);
        // a linear layer (0), a full layer (3) and the top
        let reference = root.join(case).join("model.q8_0.gguf");
        matches_converter(&out, &reference, &["blk.0.", "blk.3."], &[]);
    }
}

/// The full shapes count the parameters their names say (the 9B's count
/// leaves out its vision tower), exactly as lcut's memory line counts a
/// model of their config, and plan in every GGUF format; a cut to 4
/// layers keeps three linear layers and a full one.
#[test]
fn the_full_shapes_count_their_parameters_and_plan_in_every_gguf_format() {
    for (shape, total, active) in [
        (shapes::qwen3_5_9b(), 8.95e9, 8.95e9),
        (shapes::qwen3_5_35b_a3b(), 34.66e9, 3.455e9),
    ] {
        let cfg = shape.config().unwrap();
        assert_eq!(
            shape.parameter_count(),
            lcut_model::memory::parameter_count(&cfg),
            "{}",
            shape.name
        );
        let near = |n: u64, want: f64| ((n as f64 - want) / want).abs() < 0.01;
        assert!(near(shape.parameter_count(), total), "{}", shape.name);
        assert!(
            near(shape.active_parameter_count(), active),
            "{}",
            shape.name
        );
        for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
            let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
            assert!(plan.data_bytes() > 0, "{} in {format}", shape.name);
        }
        let cut = shape.clone().with_layers(4).config().unwrap();
        let la = cut.linear_attention.unwrap();
        assert_eq!(la.layers, vec![true, true, true, false]);
        assert_eq!(cut.head_dim, 256);
        assert_eq!(cut.rope.rotary_dim, 64);
        assert!(cut.attn_output_gate);
        let moe = shape.experts.is_some();
        assert_eq!(cut.arch, if moe { Arch::Qwen35Moe } else { Arch::Qwen35 });
    }
}

/// Linear layers a model cannot have are refused by the field that is
/// wrong, before anything is written.
#[test]
fn bad_linear_layers_are_refused_by_field() {
    type Edit = fn(&mut ModelShape);
    let cases: [(&str, Edit); 6] = [
        ("linear.value_heads", |s| {
            s.linear.as_mut().unwrap().value_heads = 3
        }),
        ("linear.conv_kernel", |s| {
            s.linear.as_mut().unwrap().conv_kernel = 0
        }),
        ("linear.full_interval", |s| {
            s.linear.as_mut().unwrap().full_interval = 0
        }),
        ("linear.partial_rotary", |s| {
            s.linear.as_mut().unwrap().partial_rotary = 0.001
        }),
        ("head_dim", |s| s.head_dim = None),
        ("experts.kind", |s| {
            s.linear = None;
            s.experts = tiny_qwen35moe().experts;
        }),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (field, edit) in cases {
        let mut shape = tiny_qwen35();
        edit(&mut shape);
        match shape.config() {
            Err(SynthError::InvalidShape { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
        let out = dir.path().join(format!("bad-{field}.gguf"));
        let opts = WriteOptions::default();
        assert!(write_model(&shape, Format::GgufQ8_0, &out, &opts, &mut |_, _| {}).is_err());
        assert!(!out.exists(), "{field}: a refused shape left a file");
    }
}
