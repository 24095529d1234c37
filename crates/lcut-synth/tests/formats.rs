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
use candle_core::{DType, Device, Tensor};
use lcut_model::gguf::{GgufFile, GgufWeights};
use lcut_model::{ModelConfig, ModelError, ModelFiles, WeightFiles, WeightSource};
use lcut_synth::draw::RandomWeights;
use lcut_synth::shapes::{self, ModelShape, TensorKind};
use lcut_synth::{Format, SynthError, WriteOptions, write_model};

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

fn write(shape: &ModelShape, format: Format, out: &Path, opts: &WriteOptions) {
    write_model(shape, format, out, opts, &mut |_, _| {}).unwrap();
}

fn opts(seed: u64) -> WriteOptions {
    WriteOptions {
        seed,
        ..WriteOptions::default()
    }
}

/// The safetensors folder holds the weights `RandomModel::build` draws:
/// equal in f32, equal after bf16 rounding in bf16 (read back as bf16,
/// never widened). Its config is the shape's.
#[test]
fn safetensors_hold_the_drawn_weights() {
    let dir = tempfile::tempdir().unwrap();
    for shape in [tiny_llama(), tiny_qwen()] {
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
            assert_eq!(cfg.qkv_bias, shape.family.qkv_bias());
            let files = WeightFiles::open(&out).unwrap();
            for t in shape.tensors() {
                let read = files.load(&t.name, &t.dims, dtype, &Device::Cpu).unwrap();
                assert_eq!(read.dtype(), dtype, "{}", t.name);
                let want = drawn.load(&t.name, &t.dims, dtype, &Device::Cpu).unwrap();
                let diff = (read.to_dtype(DType::F32).unwrap()
                    - want.to_dtype(DType::F32).unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
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
    for shape in [tiny_llama(), tiny_qwen()] {
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
            assert_eq!(cfg.qkv_bias, shape.family.qkv_bias());
            // GGUF stores the constants as f32
            let f32s = |c: &ModelConfig| (c.rms_norm_eps as f32, c.rope.theta as f32);
            assert_eq!(f32s(&cfg), f32s(&want_cfg));
            assert_eq!(cfg.bos_token_id, Some(shape.tokens.bos));
            let has_factors = file.header().tensors.contains_key("rope_freqs.weight");
            assert_eq!(has_factors, shape.family == shapes::Family::Llama);
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

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
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

    // rows of 64 values are not whole Q4_K blocks of 256
    let mut narrow = tiny_llama();
    narrow.sizes.hidden_size = 64;
    narrow.sizes.intermediate_size = 128;
    let out = dir.path().join("narrow.gguf");
    let err = write_model(&narrow, Format::GgufQ4K, &out, &opts(0), &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(err, SynthError::BlockSize { cols: 64, .. }),
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
