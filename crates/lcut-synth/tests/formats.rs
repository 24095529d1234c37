//! The written formats read back as the model they were drawn as: the
//! safetensors folder holds exactly the weights `RandomModel::build` draws
//! (bf16 rounding aside), split into shards that load like one file; the
//! GGUF file holds them quantized, in llama.cpp's names, row order and
//! types, with a config equal to the shape's. Bad output paths, shapes a
//! format cannot hold and truncated files are refused by name, and a failed
//! write leaves nothing behind.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};
use lcut_model::gguf::{GgufFile, GgufWeights};
use lcut_model::{
    Arch, Decoder, Layout, ModelConfig, ModelError, ModelFiles, RopeScaling, WeightFiles,
    WeightMode, WeightSource,
};
use lcut_synth::draw::RandomWeights;
use lcut_synth::shapes::{self, ModelShape, TensorKind};
use lcut_synth::{Format, SynthError, WriteOptions, write_model};

mod common;
use common::{every_format_computes, max_diff};

/// Llama-3.2-1B's layout (tied head, Llama 3 RoPE scaling) at a size a
/// test writes in milliseconds; widths are whole Q4_K/Q6_K blocks.
fn tiny_llama() -> ModelShape {
    let mut s = shapes::llama_3_2_1b();
    s.name = "tiny-llama".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 512;
    s.sizes.num_layers = 2;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.tokens.bos = 500;
    s.tokens.eos = 501;
    s
}

/// Qwen2.5's layout (q/k/v biases, tied head) at test size.
fn tiny_qwen() -> ModelShape {
    let mut s = shapes::qwen2_5_1_5b();
    s.name = "tiny-qwen".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 512;
    s.sizes.num_layers = 2;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.tokens.bos = 510;
    s.tokens.eos = 510;
    s
}

/// The sizes every tiny shape below takes (4 layers: OLMo 3's three
/// sliding layers and a full one, SmolLM3's three rotated and a NoPE one;
/// 2 K/V heads so OLMo's k_norm is narrower than its q_norm).
fn shrink(mut s: ModelShape, name: &str) -> ModelShape {
    s.name = name.into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 512;
    s.sizes.num_layers = 4;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.tokens.bos = 500;
    s.tokens.eos = 501;
    s.tokens.pad = s.tokens.pad.map(|_| 511);
    s
}

/// SmolLM3-3B's layout (NoPE every 4th layer, tied head) at test size.
fn tiny_smollm3() -> ModelShape {
    shrink(shapes::smollm3_3b(), "tiny-smollm3")
}

/// OLMo-3-7B's layout (norms after the blocks, q/k norms, sliding layers,
/// YaRN on the full ones, untied head, a pad token) at test size.
fn tiny_olmo3() -> ModelShape {
    let mut s = shrink(shapes::olmo_3_7b(), "tiny-olmo3");
    s.tokens.eos = s.tokens.bos;
    s
}

/// OLMo 2's layout (no window, no RoPE scaling) at test size.
fn tiny_olmo2() -> ModelShape {
    let mut s = tiny_olmo3();
    s.name = "tiny-olmo2".into();
    s.sizes.layout = Layout::Olmo { window: None };
    s.rope_scaling = RopeScaling::None;
    s
}

fn write(shape: &ModelShape, format: Format, out: &Path, opts: &WriteOptions) {
    write_model(shape, format, out, opts, &mut |_, _| {}).unwrap();
}

fn opts(seed: u64) -> WriteOptions {
    WriteOptions {
        seed,
        ..WriteOptions::default()
    }
}

/// One tiny shape of each family and layout.
fn every_tiny_shape() -> [ModelShape; 5] {
    [
        tiny_llama(),
        tiny_qwen(),
        tiny_smollm3(),
        tiny_olmo3(),
        tiny_olmo2(),
    ]
}

/// The safetensors folder holds the weights `RandomModel::build` draws:
/// equal in f32, equal after bf16 rounding in bf16 (read back as bf16,
/// never widened). Its config is the shape's.
#[test]
fn safetensors_hold_the_drawn_weights() {
    let dir = tempfile::tempdir().unwrap();
    for shape in every_tiny_shape() {
        let drawn = RandomWeights::new("drawn".into(), 9);
        for (format, dtype) in [
            (Format::SafetensorsF32, DType::F32),
            (Format::SafetensorsBf16, DType::BF16),
        ] {
            let out = dir.path().join(format!("{}-{format}", shape.name));
            write(&shape, format, &out, &opts(9));
            let cfg = ModelConfig::from_folder(&out).unwrap();
            assert_eq!(cfg.vocab_size, shape.sizes.vocab_size);
            assert_eq!(cfg.tie_word_embeddings, shape.tie_word_embeddings);
            assert_eq!(cfg.qkv_bias, shape.qkv_bias);
            assert_eq!(cfg.arch, shape.arch());
            let files = WeightFiles::open(&out).unwrap();
            for t in shape.tensors() {
                let read = files.load(&t.name, &t.dims, dtype, &Device::Cpu).unwrap();
                assert_eq!(read.dtype(), dtype, "{}", t.name);
                let want = drawn.load(&t.name, &t.dims, dtype, &Device::Cpu).unwrap();
                let diff = max_diff(
                    &read.to_dtype(DType::F32).unwrap(),
                    &want.to_dtype(DType::F32).unwrap(),
                );
                assert_eq!(diff, 0.0, "{} in {format}", t.name);
            }
        }
    }
}

/// Above the shard size the weights are split into numbered shards with
/// an index, as Hugging Face writes them, and load as the single file does.
#[test]
fn sharded_safetensors_load_as_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let shape = tiny_llama();
    let whole = dir.path().join("whole");
    let sharded = dir.path().join("sharded");
    write(&shape, Format::SafetensorsBf16, &whole, &opts(3));
    let small = WriteOptions {
        seed: 3,
        max_shard_bytes: 400_000,
    };
    write(&shape, Format::SafetensorsBf16, &sharded, &small);
    assert!(!sharded.join("model.safetensors").exists());
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(sharded.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let names: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(names.len() >= 3, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(&format!("-of-{:05}.safetensors", names.len())))
    );
    assert_eq!(
        index["metadata"]["total_size"].as_u64(),
        Some(shape.parameter_count() * 2)
    );
    let (a, b) = (
        WeightFiles::open(&whole).unwrap(),
        WeightFiles::open(&sharded).unwrap(),
    );
    for t in shape.tensors() {
        let x = a.load(&t.name, &t.dims, DType::BF16, &Device::Cpu).unwrap();
        let y = b.load(&t.name, &t.dims, DType::BF16, &Device::Cpu).unwrap();
        let same = x
            .eq(&y)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .mean_all()
            .unwrap();
        assert_eq!(same.to_scalar::<f32>().unwrap(), 1.0, "{}", t.name);
    }
}

/// The GGUF file holds every weight quantized as candle quantizes the
/// drawn tensor (read back through lcut's loader, which undoes llama.cpp's
/// Q/K row order), norms and biases in f32, the output matrix in Q6_K
/// (Q8_0 in a Q8_0 file), and
/// a config equal to the shape's (Llama 3's RoPE as `rope_freqs`).
#[test]
fn gguf_holds_the_drawn_weights_quantized() {
    let dir = tempfile::tempdir().unwrap();
    for shape in every_tiny_shape() {
        let drawn = RandomWeights::new("drawn".into(), 4);
        for (format, ty) in [
            (Format::GgufQ4_0, GgmlDType::Q4_0),
            (Format::GgufQ4K, GgmlDType::Q4K),
            (Format::GgufQ4KM, GgmlDType::Q4K),
            (Format::GgufQ8_0, GgmlDType::Q8_0),
        ] {
            let out = dir.path().join(format!("{}-{format}.gguf", shape.name));
            write(&shape, format, &out, &opts(4));
            let file = GgufFile::open(&out).unwrap();
            let want_cfg = shape.config().unwrap();
            let cfg = file.config().clone();
            assert_eq!(
                (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.head_dim),
                (
                    want_cfg.arch,
                    want_cfg.num_layers,
                    want_cfg.hidden_size,
                    want_cfg.head_dim
                )
            );
            assert_eq!(cfg.tie_word_embeddings, shape.tie_word_embeddings);
            assert_eq!(cfg.qkv_bias, shape.qkv_bias);
            // GGUF stores the constants as f32
            let f32s = |c: &ModelConfig| (c.rms_norm_eps as f32, c.rope.theta as f32);
            assert_eq!(f32s(&cfg), f32s(&want_cfg));
            // the layout: windows, NoPE layers, norm placement, per-layer RoPE
            assert_eq!(cfg.sliding_window, want_cfg.sliding_window);
            assert_eq!(cfg.rotates, want_cfg.rotates);
            assert_eq!((cfg.norms, cfg.qk_norm), (want_cfg.norms, want_cfg.qk_norm));
            assert_eq!(cfg.sliding_rope, want_cfg.sliding_rope);
            if matches!(shape.rope_scaling, RopeScaling::Yarn { .. }) {
                assert_eq!(cfg.rope.scaling, want_cfg.rope.scaling);
            }
            assert_eq!(cfg.eos_token_ids, want_cfg.eos_token_ids);
            assert_eq!(cfg.bos_token_id, Some(shape.tokens.bos));
            let has_factors = file.header().tensors.contains_key("rope_freqs.weight");
            assert_eq!(
                has_factors,
                matches!(shape.rope_scaling, RopeScaling::Llama3 { .. })
            );
            let weights = GgufWeights::new(file);
            for t in shape.tensors() {
                let read = weights
                    .load(&t.name, &t.dims, DType::F32, &Device::Cpu)
                    .unwrap();
                let dense = drawn
                    .load(&t.name, &t.dims, DType::F32, &Device::Cpu)
                    .unwrap();
                let want = match t.kind {
                    TensorKind::Matrix => {
                        let output = t.name == "lm_head.weight"
                            || (shape.tie_word_embeddings && t.name.contains("embed_tokens"));
                        let more = format == Format::GgufQ4KM
                            && lcut_synth::write::gguf::more_bits(shape.sizes.num_layers, &t.name);
                        let q = if (output || more) && ty != GgmlDType::Q8_0 {
                            GgmlDType::Q6K
                        } else {
                            ty
                        };
                        QTensor::quantize(&dense, q)
                            .unwrap()
                            .dequantize(&Device::Cpu)
                            .unwrap()
                    }
                    _ => dense,
                };
                assert_eq!(max_diff(&read, &want), 0.0, "{} in {format}", t.name);
            }
        }
    }
}

/// SmolLM3's and OLMo 3's layouts, written at 4 layers in every format,
/// load as decoders (dense and, from GGUF, quantized) with their layout:
/// SmolLM3's 4th layer unrotated, OLMo 3's three sliding layers and a
/// full one with YaRN, norms after the blocks. The f32 folder computes
/// exactly what the drawn model does; the Q8_0 file close to it (its
/// dense and quantized decoders alike). The GGUF header names the
/// architecture, tokenizer and tensors as llama.cpp's converter does.
#[test]
fn smollm3_and_olmo3_load_as_decoders_with_their_layout() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..12).map(|i| 3 + 37 * i % 490).collect();
    for shape in [tiny_smollm3(), tiny_olmo3()] {
        let drawn = lcut_synth::RandomModel {
            shape: shape.clone(),
            seed: 5,
        }
        .build(DType::F32, &Device::Cpu)
        .unwrap();
        let want = drawn.teacher_forced_logits(&tokens, None).unwrap();
        let check = |cfg: &ModelConfig| match shape.sizes.layout {
            Layout::Smollm3 { .. } => {
                assert_eq!(cfg.arch, Arch::SmolLM3);
                assert_eq!(cfg.rotates, vec![true, true, true, false]);
                assert!(cfg.tie_word_embeddings);
                assert_eq!(cfg.norms, lcut_model::config::NormPlacement::Pre);
            }
            _ => {
                assert_eq!(cfg.arch, Arch::Olmo3);
                assert_eq!(
                    cfg.sliding_window,
                    vec![Some(4096), Some(4096), Some(4096), None]
                );
                assert!(
                    matches!(cfg.rope.scaling, RopeScaling::Yarn { factor, original_max_position_embeddings, .. }
                        if factor == 8.0 && original_max_position_embeddings == 8192.0),
                    "{:?}",
                    cfg.rope.scaling
                );
                let sliding = cfg.sliding_rope.unwrap();
                assert_eq!(sliding.scaling, RopeScaling::None);
                assert_eq!(sliding.theta, cfg.rope.theta);
                assert_eq!(cfg.norms, lcut_model::config::NormPlacement::Post);
                assert_eq!(cfg.qk_norm, lcut_model::config::QkNorm::Whole);
                assert!(!cfg.tie_word_embeddings);
            }
        };
        let gguf_header = |out: &Path| {
            let file = GgufFile::open(out).unwrap();
            let meta = &file.header().metadata;
            let text = |k: &str| meta[k].as_str().unwrap().to_string();
            let olmo = shape.arch() == Arch::Olmo3;
            let (arch, pre) = if olmo {
                ("olmo2", "dbrx")
            } else {
                ("smollm3", "llama-bpe")
            };
            assert_eq!(text("general.architecture"), arch);
            assert_eq!(text("tokenizer.ggml.pre"), pre);
            assert_eq!(meta["tokenizer.ggml.add_bos_token"].as_bool(), Some(false));
            let tensors = &file.header().tensors;
            assert_eq!(
                tensors.contains_key("blk.0.post_attention_norm.weight"),
                olmo
            );
            assert_eq!(tensors.contains_key("blk.0.post_ffw_norm.weight"), olmo);
            assert_eq!(tensors.contains_key("blk.0.attn_k_norm.weight"), olmo);
            assert_eq!(tensors.contains_key("blk.0.attn_norm.weight"), !olmo);
            assert_eq!(tensors.contains_key("blk.0.ffn_norm.weight"), !olmo);
            if olmo {
                assert_eq!(tensors["blk.0.attn_q_norm.weight"].shape, vec![256]);
                assert_eq!(tensors["blk.0.attn_k_norm.weight"].shape, vec![128]);
                assert_eq!(meta["olmo2.attention.sliding_window"].as_u64(), Some(4096));
                let pattern: Vec<Option<bool>> = meta["olmo2.attention.sliding_window_pattern"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_bool())
                    .collect();
                assert_eq!(
                    pattern,
                    vec![Some(true), Some(true), Some(true), Some(false)]
                );
                assert_eq!(text("olmo2.rope.scaling.type"), "yarn");
                assert_eq!(meta["olmo2.rope.scaling.factor"].as_f64(), Some(8.0));
                assert_eq!(
                    meta["olmo2.rope.scaling.original_context_length"].as_u64(),
                    Some(8192)
                );
                assert!(!meta.contains_key("olmo2.rope.scaling.yarn_attn_factor"));
                assert_eq!(meta["tokenizer.ggml.padding_token_id"].as_u64(), Some(511));
            }
        };
        every_format_computes(
            &shape,
            5,
            dir.path(),
            (&tokens, &want),
            0.5,
            |_, out, mode, model| {
                check(model.config());
                // once per GGUF file, with its last decoder (kept quantized)
                if mode == WeightMode::Quantized {
                    gguf_header(out);
                }
            },
        );
    }
}

/// `RandomModel::build` is the model its f32 folder holds, logit for
/// logit: the drawn source offers no tensor the files lack (an `o_proj`
/// bias, llama.cpp's RoPE factors), whatever the layout.
#[test]
fn the_built_model_is_the_written_one() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = [1u32, 7, 300, 42, 9, 9, 128];
    for shape in [tiny_llama(), tiny_qwen(), tiny_olmo2()] {
        let model = lcut_synth::RandomModel {
            shape: shape.clone(),
            seed: 8,
        };
        let built = model.build(DType::F32, &Device::Cpu).unwrap();
        let out = dir.path().join(&shape.name);
        write(&shape, Format::SafetensorsF32, &out, &opts(8));
        let loaded = Decoder::load(&out, DType::F32, &Device::Cpu).unwrap();
        let (a, b) = (
            built.teacher_forced_logits(&tokens, None).unwrap(),
            loaded.teacher_forced_logits(&tokens, None).unwrap(),
        );
        assert_eq!(max_diff(&a, &b), 0.0, "{}", shape.name);
    }
}

/// The full-size shapes fit every GGUF format's blocks (planned, not
/// written: a 7B file is no test's to write), and a 4-layer cut of each
/// keeps its layout.
#[test]
fn the_full_smollm3_and_olmo3_shapes_plan_in_every_gguf_format() {
    for shape in [shapes::smollm3_3b(), shapes::olmo_3_7b()] {
        for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
            let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
            assert!(plan.data_bytes() > 0, "{} in {format}", shape.name);
        }
        let cut = shape.clone().with_layers(4);
        assert_eq!(cut.sizes.layout, shape.sizes.layout);
        assert_eq!(cut.config().unwrap().num_layers, 4);
    }
}

/// llama.cpp's Q4_K_M rule: Q6_K for the V and down projections of the
/// first and last eighth of the layers and every third layer between.
#[test]
fn q4_k_m_gives_more_bits_to_llama_cpps_layers() {
    use lcut_synth::write::gguf::more_bits;
    // 16 layers (Llama-3.2-1B): 0, 1, 4, 7, 10, 13, 14, 15
    let picked: Vec<usize> = (0..16)
        .filter(|i| more_bits(16, &format!("model.layers.{i}.mlp.down_proj.weight")))
        .collect();
    assert_eq!(picked, vec![0, 1, 4, 7, 10, 13, 14, 15]);
    assert!(more_bits(16, "model.layers.0.self_attn.v_proj.weight"));
    assert!(!more_bits(16, "model.layers.0.self_attn.k_proj.weight"));
    assert!(!more_bits(16, "model.layers.2.mlp.down_proj.weight"));
    assert!(!more_bits(16, "model.embed_tokens.weight"));
}

/// Unknown names, a path in the way, a folder that is not there and a
/// shape the format cannot hold are each refused by name; nothing is left
/// behind, and what was in the way is untouched.
#[test]
fn bad_writer_options_are_named_errors() {
    assert!(matches!(
        shapes::named("gpt-5"),
        Err(SynthError::UnknownShape { .. })
    ));
    let err = "gguf-q3_k".parse::<Format>().unwrap_err();
    assert!(err.to_string().contains("gguf-q4_k"), "{err}");
    assert!(matches!(err, SynthError::UnknownFormat { .. }));

    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken.gguf");
    std::fs::write(&taken, b"keep me").unwrap();
    let err = write_model(
        &tiny_llama(),
        Format::GgufQ4_0,
        &taken,
        &opts(0),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SynthError::OutputExists { .. }), "{err}");
    assert_eq!(std::fs::read(&taken).unwrap(), b"keep me");

    let nowhere = dir.path().join("no-such-folder").join("m.gguf");
    let err = write_model(
        &tiny_llama(),
        Format::GgufQ4_0,
        &nowhere,
        &opts(0),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SynthError::Unwritable { .. }), "{err}");
    assert!(err.to_string().contains("no-such-folder"), "{err}");

    // rows of 80 values are not whole Q4_K blocks of 256, nor whole blocks
    // of 32 of Q5_0, which llama.cpp stores such rows in
    let mut narrow = tiny_llama();
    narrow.sizes.hidden_size = 80;
    narrow.sizes.intermediate_size = 128;
    let out = dir.path().join("narrow.gguf");
    let err = write_model(&narrow, Format::GgufQ4K, &out, &opts(0), &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(err, SynthError::BlockSize { cols: 80, .. }),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("taken.gguf")],
        "nothing else is left"
    );
}

/// A written file cut short reads back as a named truncation error, in
/// either format, never as a model with missing weights.
#[test]
fn a_truncated_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    write(&tiny_llama(), Format::GgufQ4_0, &gguf, &opts(0));
    let len = std::fs::metadata(&gguf).unwrap().len();
    truncate(&gguf, len - 1000);
    let err = ModelFiles::open(&gguf).err().unwrap();
    assert!(matches!(err, ModelError::GgufTruncated { .. }), "{err}");
    assert!(err.to_string().contains("m.gguf"), "{err}");

    let folder = dir.path().join("m");
    write(&tiny_llama(), Format::SafetensorsBf16, &folder, &opts(0));
    let st = folder.join("model.safetensors");
    let len = std::fs::metadata(&st).unwrap().len();
    truncate(&st, len / 2);
    let err = ModelFiles::open(&folder).err().unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("truncated") && msg.contains("model.safetensors"),
        "{msg}"
    );
}

fn truncate(path: &Path, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
}
