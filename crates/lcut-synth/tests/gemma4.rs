//! Gemma 4's shape (`gemma-4-e2b`, at test size) in every format: the
//! folder is the drawn model exactly; the GGUF file, written as llama.cpp's
//! converter writes Gemma 4 (per-layer MLP widths, both head widths, which
//! layers slide, the shared layers, the full layers' proportional rotation
//! as `rope_freqs`), reads back as the same model, dense and kept
//! quantized; its keys, tensor names and ranks are those the converter gave
//! the reference case; the full shape counts the parameters the model card
//! gives, as lcut's memory line counts them, plans in every GGUF format,
//! and keeps its shared layers' share when cut; bad layers are refused by
//! field.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;

use candle_core::{DType, Device};
use lcut_model::Arch;
use lcut_synth::shapes::{self, ModelShape};
use lcut_synth::{Format, RandomModel, SynthError, WriteOptions, write_model};

mod common;
use common::{every_format_computes, matches_converter, write};

/// Gemma 4 E2B's layout at test size, laid out as the reference case
/// `layouts/gemma4-wide`: 4 layers, the second and the last full (heads
/// 256 wide against the sliding layers' 128), the last two reading layers
/// 0 and 1's K/V with MLPs twice the others' 256; width 256, two heads and
/// one K/V head, per-layer inputs 256 wide, a window of 8 (the test's 14
/// tokens slide past it).
fn tiny_gemma4() -> ModelShape {
    let mut s = shapes::gemma_4_e2b();
    s.name = "tiny-gemma4".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 256;
    s.sizes.num_layers = 4;
    s.sizes.num_heads = 2;
    s.sizes.num_kv_heads = 1;
    s.head_dim = Some(128);
    s.gemma4 = s.gemma4.map(|mut g| {
        g.full_interval = 2;
        g.window = 8;
        g.full_head_dim = 256;
        g.shared = 2;
        g
    });
    s
}

/// Every format loads as a decoder computing what the drawn model does:
/// the f32 folder exactly, bf16 and the GGUF files within their rounding,
/// dense and kept quantized, each reading the layers as drawn (which slide,
/// their head widths, which read another's K/V, the MLP widths). A full
/// layer rotating its whole head, a shared layer reading its own zeroed K/V
/// or a sliding layer seeing every token would each move the logits by
/// their whole size.
#[test]
fn every_format_is_the_drawn_model() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..14).map(|i| 3 + 37 * i % 490).collect();
    let shape = tiny_gemma4();
    let drawn = RandomModel {
        shape: shape.clone(),
        seed: 6,
    }
    .build(DType::F32, &Device::Cpu)
    .unwrap();
    let cfg = drawn.config().clone();
    assert_eq!(cfg.arch, Arch::Gemma4);
    assert_eq!(cfg.sliding_window, vec![Some(8), None, Some(8), None]);
    let widths: Vec<usize> = cfg.layer_attention.iter().map(|a| a.head_dim).collect();
    assert_eq!(widths, vec![128, 256, 128, 256]);
    let sources: Vec<Option<usize>> = cfg.layer_attention.iter().map(|a| a.kv_source).collect();
    assert_eq!(sources, vec![None, None, Some(0), Some(1)]);
    assert_eq!(cfg.double_wide_mlp, vec![false, false, true, true]);
    assert_eq!(cfg.per_layer_input.as_ref().map(|p| p.width), Some(256));
    let want = drawn.teacher_forced_logits(&tokens, None).unwrap();
    let checks = |format: Format, _: &Path, _, model: &lcut_model::Decoder| {
        let read = model.config();
        assert_eq!(read.arch, cfg.arch, "{format}");
        assert_eq!(read.sliding_window, cfg.sliding_window, "{format}");
        assert_eq!(read.layer_attention, cfg.layer_attention, "{format}");
        assert_eq!(read.double_wide_mlp, cfg.double_wide_mlp, "{format}");
        assert_eq!(read.per_layer_input, cfg.per_layer_input, "{format}");
        assert_eq!(read.rope, cfg.rope, "{format}");
        assert_eq!(read.sliding_rope, cfg.sliding_rope, "{format}");
        assert_eq!(read.final_softcap, Some(30.0), "{format}");
    };
    every_format_computes(&shape, 6, dir.path(), (&tokens, &want), 0.4, checks);
}

/// The GGUF file has the keys, tensor names and ranks llama.cpp's converter
/// gave the reference case in Q8_0 (`fixtures/oracle/layouts/gemma4-wide`,
/// [`common::matches_converter`]) in a sliding layer that holds K/V, a
/// shared full layer and at the top, where the case's full layers have
/// their own values (its keys are its values; E2B's are not). Types match
/// where the case's rows fit Q8_0's blocks (its 8-wide per-layer projection
/// is F16).
#[test]
fn gguf_files_match_llama_cpps_converter() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/layouts");
    let shape = tiny_gemma4();
    let out = dir.path().join("tiny-gemma4.gguf");
    write(&shape, Format::GgufQ8_0, &out, 1);
    let theirs = root.join("gemma4-wide/model.q8_0.gguf");
    matches_converter(&out, &theirs, &["blk.0.", "blk.3."], &[]);
}

/// The full shape counts the parameters of E2B's language model (4.63e9,
/// 2.28e9 without the per-layer table: the model card's "2.3B effective"),
/// exactly as lcut's memory line counts a model of its config, and plans
/// in every GGUF format; cut to 10 layers it keeps two full layers (and a
/// full last one), five of them shared, reading layers 3 and 4.
#[test]
fn the_full_shape_counts_its_parameters_and_keeps_its_layout_when_cut() {
    let shape = shapes::gemma_4_e2b();
    let cfg = shape.config().unwrap();
    assert_eq!(
        shape.parameter_count(),
        lcut_model::memory::parameter_count(&cfg)
    );
    let near = |n: u64, want: f64| ((n as f64 - want) / want).abs() < 0.01;
    assert!(near(shape.parameter_count(), 4.63e9));
    let table = shape
        .tensors()
        .iter()
        .find(|t| t.name == "model.embed_tokens_per_layer.weight")
        .map(|t| t.len() as u64)
        .unwrap();
    assert!(near(shape.parameter_count() - table, 2.28e9));
    for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
        let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
        assert!(plan.data_bytes() > 0, "{format}");
    }
    // Q4_K_M's extra bits go by a V projection's place among the 15 the
    // file holds (the shared layers have none), as llama.cpp counts them:
    // the first, the last two and every third between
    let tensors = shape.tensors();
    let v_type = |l: usize| {
        let name = format!("model.layers.{l}.self_attn.v_proj.weight");
        let t = tensors.iter().find(|t| t.name == name).unwrap();
        lcut_synth::write::gguf::ggml_type(&shape, Format::GgufQ4KM, t)
    };
    let more: Vec<usize> = (0..15)
        .filter(|&l| v_type(l) == candle_core::quantized::GgmlDType::Q6K)
        .collect();
    assert_eq!(more, vec![0, 3, 6, 9, 12, 13, 14]);
    let sources: Vec<Option<usize>> = cfg.layer_attention.iter().map(|a| a.kv_source).collect();
    assert_eq!(sources[14], None);
    assert_eq!(sources[15], Some(13));
    assert_eq!(sources[34], Some(14));
    let cut = shape.clone().with_layers(10).config().unwrap();
    let full: Vec<usize> = (0..10)
        .filter(|&l| cut.sliding_window[l].is_none())
        .collect();
    assert_eq!(full, vec![4, 9]);
    let sources: Vec<Option<usize>> = cut.layer_attention.iter().map(|a| a.kv_source).collect();
    assert_eq!(
        sources,
        [vec![None; 5], vec![Some(3); 4], vec![Some(4)]].concat()
    );
    assert_eq!(cut.layer_attention[9].head_dim, 512);
    assert_eq!(cut.layer_attention[8].head_dim, 256);
}

/// E4B's shape: its 42 layers keep K/V in the lower 24, the shared 18
/// reading layer 22 (sliding) or 23 (full); full layers at 5, 11, ..., 41
/// with heads 512 wide and two K/V heads like the sliding ones; every MLP
/// 10240 wide; 7.46e9 weights (counted by hand from the published
/// figures, and as lcut's memory line counts a model of its config), planned
/// in every GGUF format. Cut to 18 layers it keeps one full
/// layer in six and about the shared layers' share (the top 6 reading
/// layers 10 and 11).
#[test]
fn e4b_keeps_its_layout_counts_its_parameters_and_cuts() {
    let shape = shapes::named("gemma-4-e4b").unwrap();
    let cfg = shape.config().unwrap();
    assert_eq!(
        shape.parameter_count(),
        lcut_model::memory::parameter_count(&cfg)
    );
    // 7.46e9 weights, 4.64e9 without the per-layer inputs' table
    let table = 262_144 * 42 * 256;
    assert_eq!(shape.parameter_count(), 7_463_013_418);
    assert_eq!(shape.parameter_count() - table, 4_644_441_130);
    let full: Vec<usize> = (0..42)
        .filter(|&l| cfg.sliding_window[l].is_none())
        .collect();
    assert_eq!(full, vec![5, 11, 17, 23, 29, 35, 41]);
    assert!(cfg.sliding_window.iter().flatten().all(|&w| w == 512));
    let sources: Vec<Option<usize>> = cfg.layer_attention.iter().map(|a| a.kv_source).collect();
    assert!(sources[..24].iter().all(Option::is_none));
    assert_eq!(sources[24], Some(22));
    assert_eq!(sources[29], Some(23));
    assert_eq!(sources[41], Some(23));
    assert!(
        cfg.layer_attention.iter().enumerate().all(
            |(l, a)| a.kv_heads == 2 && a.head_dim == if full.contains(&l) { 512 } else { 256 }
        )
    );
    assert!((0..42).all(|l| cfg.mlp_width(l) == 10_240));
    assert_eq!(cfg.per_layer_input.map(|p| p.width), Some(256));
    for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
        let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
        assert!(plan.data_bytes() > 0, "{format}");
    }
    let cut = shape.with_layers(18).config().unwrap();
    let full: Vec<usize> = (0..18)
        .filter(|&l| cut.sliding_window[l].is_none())
        .collect();
    assert_eq!(full, vec![5, 11, 17]);
    let sources: Vec<Option<usize>> = cut.layer_attention.iter().map(|a| a.kv_source).collect();
    assert_eq!(
        sources,
        [vec![None; 12], vec![Some(10); 5], vec![Some(11)]].concat()
    );
}

/// 26B-A4B's shape: 30 layers, full ones at 5, 11, ..., 29 with two K/V
/// heads 512 wide whose keys are their values (no value projection), the
/// sliding ones with eight 256 wide over 1024 tokens; a dense MLP 2112
/// wide beside 128 experts of width 704, 8 run per token; 25.2e9 weights
/// and 3.8e9 run per token (counted by hand from the published figures,
/// and as lcut's memory line counts a model of its config). Every GGUF
/// format plans, the rows that are not whole K-quant blocks (2112, 704)
/// in llama.cpp's types of 32-value blocks. Cut to 12 layers it keeps the
/// full layers 5 and 11.
#[test]
fn the_26b_a4b_keeps_its_experts_and_full_layers_counts_its_parameters_and_cuts() {
    let shape = shapes::named("gemma-4-26b-a4b").unwrap();
    let cfg = shape.config().unwrap();
    assert_eq!(
        shape.parameter_count(),
        lcut_model::memory::parameter_count(&cfg)
    );
    assert_eq!(shape.parameter_count(), 25_233_141_790);
    assert_eq!(shape.active_parameter_count(), 3_822_530_590);
    let full: Vec<usize> = (0..30)
        .filter(|&l| cfg.sliding_window[l].is_none())
        .collect();
    assert_eq!(full, vec![5, 11, 17, 23, 29]);
    assert!(cfg.sliding_window.iter().flatten().all(|&w| w == 1024));
    for (l, a) in cfg.layer_attention.iter().enumerate() {
        let want = match full.contains(&l) {
            true => (2, 512, true),
            false => (8, 256, false),
        };
        assert_eq!((a.kv_heads, a.head_dim, a.values_from_keys), want, "{l}");
        assert_eq!(a.kv_source, None);
    }
    assert!(cfg.per_layer_input.is_none());
    let e = cfg.experts.unwrap();
    assert_eq!((e.num_experts, e.top_k, e.inner), (128, 8, 704));
    assert!(e.beside_mlp);
    assert!((0..30).all(|l| cfg.mlp_width(l) == 2112));
    let tensors = shape.tensors();
    assert!(
        !tensors
            .iter()
            .any(|t| t.name == "model.layers.5.self_attn.v_proj.weight")
    );
    for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
        let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
        assert!(plan.data_bytes() > 0, "{format}");
    }
    let type_of = |name: &str, format| {
        let t = tensors.iter().find(|t| t.name == name).unwrap();
        lcut_synth::write::gguf::ggml_type(&shape, format, t)
    };
    use candle_core::quantized::GgmlDType;
    for (name, q4k, q4km) in [
        // layer 0 is among llama.cpp's "more bits" layers: Q6_K, then Q8_0
        (
            "model.layers.0.mlp.down_proj.weight",
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
        ),
        (
            "model.layers.0.experts.down_proj",
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
        ),
        (
            "model.layers.4.experts.down_proj",
            GgmlDType::Q5_0,
            GgmlDType::Q5_0,
        ),
        (
            "model.layers.4.experts.gate_up_proj",
            GgmlDType::Q4K,
            GgmlDType::Q4K,
        ),
        (
            "model.layers.4.router.proj.weight",
            GgmlDType::F32,
            GgmlDType::F32,
        ),
    ] {
        assert_eq!(type_of(name, Format::GgufQ4K), q4k, "{name}");
        assert_eq!(type_of(name, Format::GgufQ4KM), q4km, "{name}");
    }
    let cut = shape.with_layers(12).config().unwrap();
    let full: Vec<usize> = (0..12)
        .filter(|&l| cut.sliding_window[l].is_none())
        .collect();
    assert_eq!(full, vec![5, 11]);
    assert_eq!(cut.experts, cfg.experts);
}

/// Layers a Gemma 4 model cannot have are refused by the field that is
/// wrong, before anything is written.
#[test]
fn bad_gemma4_layers_are_refused_by_field() {
    type Edit = fn(&mut ModelShape);
    let cases: [(&str, Edit); 8] = [
        ("gemma4.full_interval", |s| {
            s.gemma4.as_mut().unwrap().full_interval = 0
        }),
        ("gemma4.full_head_dim", |s| {
            s.gemma4.as_mut().unwrap().full_head_dim = 255
        }),
        ("gemma4.shared", |s| s.gemma4.as_mut().unwrap().shared = 4),
        // the shared layers' full one would have no full layer below it
        ("gemma4.shared", |s| s.gemma4.as_mut().unwrap().shared = 3),
        ("gemma4", |s| s.head_dim = None),
        // the config names the full layers' own count only with K = V
        ("gemma4.full_kv_heads", |s| {
            s.gemma4.as_mut().unwrap().full_kv_heads = 2
        }),
        ("gemma4.full_kv_heads", |s| {
            let g = s.gemma4.as_mut().unwrap();
            g.keys_are_values = true;
            g.full_kv_heads = 3;
        }),
        ("experts.kind", |s| {
            s.experts = shapes::qwen3_30b_a3b().experts
        }),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (field, edit)) in cases.into_iter().enumerate() {
        let mut shape = tiny_gemma4();
        edit(&mut shape);
        match shape.config() {
            Err(SynthError::InvalidShape { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
        let out = dir.path().join(format!("bad-{i}.gguf"));
        let opts = WriteOptions::default();
        assert!(write_model(&shape, Format::GgufQ8_0, &out, &opts, &mut |_, _| {}).is_err());
        assert!(!out.exists(), "{field}: a refused shape left a file");
    }
}
