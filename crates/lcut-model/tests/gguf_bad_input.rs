//! Damaged GGUF files: each is refused with a named error that says what is
//! wrong and where, never a panic, and a length that claims more than the
//! file holds is refused before anything is allocated for it. The damage is
//! done to a real GGUF (the llama-gqa reference case as llama.cpp's
//! converter wrote it).

use std::path::{Path, PathBuf};

use lcut_model::gguf::GgufFile;
use lcut_model::{DType, Decoder, Device, ModelError, WeightMode};
use lcut_testkit::{assert_mentions, oracle_case};

fn good() -> Vec<u8> {
    std::fs::read(oracle_case("llama-gqa").join("model.f32.gguf")).expect("fixture GGUF")
}

fn write(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).expect("write");
    (dir, path)
}

fn load(bytes: &[u8]) -> (PathBuf, ModelError, tempfile::TempDir) {
    let (dir, path) = write(bytes);
    let err = Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)
        .expect_err("a damaged file must be refused");
    (path, err, dir)
}

/// Byte offset just after the length-prefixed string `s` in the header.
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .map(|at| at + needle.len())
        .unwrap_or_else(|| panic!("{s} not in the fixture"))
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

#[test]
fn the_fixture_itself_loads() {
    let file = GgufFile::open(&oracle_case("llama-gqa").join("model.f32.gguf")).expect("valid");
    assert_eq!(file.config().num_layers, 6);
}

#[test]
fn missing_file_is_named() {
    let path = std::env::temp_dir().join("lcut-no-such-model.gguf");
    let err = Decoder::load(&path, DType::F32, &Device::Cpu).expect_err("missing");
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&path)]);
}

#[test]
fn wrong_magic_is_not_gguf() {
    let mut b = good();
    b[..4].copy_from_slice(b"GGML");
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::NotGguf { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&path), "not a GGUF file"]);
}

#[test]
fn unsupported_versions_are_named() {
    for version in [1u32, 4, 0xFFFF_FFFF] {
        let mut b = good();
        put_u32(&mut b, 4, version);
        let (_, err, _d) = load(&b);
        assert!(matches!(err, ModelError::GgufVersion { .. }), "{err}");
        assert_mentions(&err.to_string(), &[&format!("version {version}")]);
    }
}

#[test]
fn truncated_header_is_named_at_every_cut() {
    let b = good();
    let header_len = lcut_model::gguf::GgufHeader::parse(&b, Path::new("x"))
        .expect("valid")
        .header_len;
    for cut in (0..header_len).step_by(97).chain([header_len - 1]) {
        let (path, err, _d) = load(&b[..cut]);
        assert!(
            matches!(
                err,
                ModelError::GgufTruncated { .. } | ModelError::GgufMalformed { .. }
            ),
            "cut at {cut}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&shown(&path)), "{msg}");
        assert!(
            msg.contains("truncated") || msg.contains("remain"),
            "cut at {cut}: {msg}"
        );
    }
}

#[test]
fn truncated_tensor_data_is_named() {
    let b = good();
    let (path, err, _d) = load(&b[..b.len() - 100]);
    assert!(matches!(err, ModelError::GgufTruncated { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&path), "truncated", "tensor"]);
}

#[test]
fn a_huge_string_length_is_refused_without_allocating_it() {
    let mut b = good();
    // the length of the first metadata key, right after the two counts
    put_u64(&mut b, 24, 1 << 40);
    let (_, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMalformed { .. }), "{err}");
    assert_mentions(&err.to_string(), &["1099511627776", "remain"]);
}

#[test]
fn a_huge_array_count_is_refused_without_allocating_it() {
    let mut b = good();
    // tokenizer.ggml.tokens: type (9 = array), element type, then the count
    let at = after_string(&b, "tokenizer.ggml.tokens") + 4 + 4;
    put_u64(&mut b, at, 1 << 50);
    let (_, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMalformed { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &["tokenizer.ggml.tokens", "1125899906842624"],
    );
}

#[test]
fn a_huge_tensor_count_is_refused() {
    let mut b = good();
    put_u64(&mut b, 8, u64::MAX);
    let (_, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMalformed { .. }), "{err}");
    assert_mentions(&err.to_string(), &["tensor count"]);
}

#[test]
fn unknown_architecture_is_named() {
    let mut b = good();
    let at = after_string(&b, "general.architecture") + 4 + 8;
    assert_eq!(&b[at..at + 5], b"llama");
    b[at..at + 5].copy_from_slice(b"gpt99");
    let (path, err, _d) = load(&b);
    assert!(
        matches!(err, ModelError::UnknownArchitecture { .. }),
        "{err}"
    );
    assert_mentions(&err.to_string(), &[&shown(&path), "gpt99", "qwen2"]);
}

/// The file with the length-prefixed string `old` of its header replaced
/// by `new` (the bytes after it shift; 64 zero bytes at the end keep every
/// tensor's data inside the file).
fn with_string(bytes: &[u8], old: &str, new: &str) -> Vec<u8> {
    let end = after_string(bytes, old);
    let start = end - old.len() - 8;
    let mut out = bytes[..start].to_vec();
    out.extend_from_slice(&(new.len() as u64).to_le_bytes());
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&bytes[end..]);
    out.extend_from_slice(&[0; 64]);
    out
}

/// A mixture-of-experts file (Qwen3-MoE, as llama.cpp's converter wrote
/// the `moe/qwen3moe-sparse` reference case).
fn moe_good() -> Vec<u8> {
    std::fs::read(oracle_case("moe/qwen3moe-sparse").join("model.f32.gguf")).expect("fixture")
}

/// A mixture-of-experts file whose expert counts, router or expert tensors
/// disagree, or whose routing lcut does not run, is refused by name before
/// any work.
#[test]
fn damaged_mixture_of_experts_files_are_named() {
    let used = "qwen3moe.expert_used_count";
    // one u32 (type tag, then the value) after the key
    for (top_k, expected) in [(9u32, "at most the expert count"), (0, "positive")] {
        let mut b = moe_good();
        let at = after_string(&b, used) + 4;
        put_u32(&mut b, at, top_k);
        let (path, err, _d) = load(&b);
        assert!(matches!(err, ModelError::GgufMetadata { .. }), "{err}");
        assert_mentions(&err.to_string(), &[&shown(&path), used, expected]);
    }
    // six experts declared, eight stored
    let mut b = moe_good();
    let at = after_string(&b, "qwen3moe.expert_count") + 4;
    put_u32(&mut b, at, 6);
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "blk.0.ffn_gate_inp.weight"],
    );
    // a router renamed away: named, not read as a dense layer
    let b = with_string(
        &moe_good(),
        "blk.3.ffn_gate_inp.weight",
        "blk.3.ffn_gate_xxx.weight",
    );
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "blk.3.ffn_gate_inp.weight", "router"],
    );
    // the down experts' tensor with 7 experts in place of 8 (outermost
    // dimension, stored last)
    let mut b = moe_good();
    let at = after_string(&b, "blk.2.ffn_down_exps.weight") + 4 + 2 * 8;
    put_u64(&mut b, at, 7);
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "blk.2.ffn_down_exps.weight", "[8, 64, 32]"],
    );
    // routing lcut does not run: shared experts, another gating function
    for (key, says) in [
        ("qwen3moe.expert_shared_count", "shared experts"),
        ("qwen3moe.expert_gating_func", "not softmax"),
    ] {
        let b = with_string(&moe_good(), "qwen3moe.context_length", key);
        let (path, err, _d) = load(&b);
        assert!(matches!(err, ModelError::GgufExperts { .. }), "{err}");
        assert_mentions(&err.to_string(), &[&shown(&path), key, says]);
    }
}

/// gpt-oss's own kind of file (MXFP4 experts, `moe/gptoss-gguf`).
fn gptoss_good() -> Vec<u8> {
    std::fs::read(oracle_case("moe/gptoss-gguf").join("model.mxfp4.gguf")).expect("fixture")
}

/// A gpt-oss file whose sinks, expert count or MXFP4 expert tensors
/// disagree with the model is refused by name, in both weight modes.
#[test]
fn damaged_gpt_oss_files_are_named() {
    let refused = |b: &[u8]| -> (PathBuf, Vec<ModelError>, tempfile::TempDir) {
        let (dir, path) = write(b);
        let errs = [WeightMode::Dense(DType::F32), WeightMode::Quantized]
            .into_iter()
            .map(|mode| {
                Decoder::load_as(&path, mode, &Device::Cpu).expect_err("a damaged file is refused")
            })
            .collect();
        (path, errs, dir)
    };
    // the file itself loads in both modes
    let (_d, path) = write(&gptoss_good());
    for mode in [WeightMode::Dense(DType::F32), WeightMode::Quantized] {
        Decoder::load_as(&path, mode, &Device::Cpu).expect("the fixture loads");
    }
    // three sink logits for four heads (the tensor's one dimension)
    let mut b = gptoss_good();
    let at = after_string(&b, "blk.1.attn_sinks.weight") + 4;
    put_u64(&mut b, at, 3);
    let (path, errs, _d) = refused(&b);
    for err in errs {
        assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
        assert_mentions(
            &err.to_string(),
            &[&shown(&path), "blk.1.attn_sinks.weight"],
        );
    }
    // three experts declared, four stored
    let mut b = gptoss_good();
    let at = after_string(&b, "gpt-oss.expert_count") + 4;
    put_u32(&mut b, at, 3);
    let (path, errs, _d) = refused(&b);
    for err in errs {
        assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
        // the router's bias [experts] is read first
        assert_mentions(&err.to_string(), &[&shown(&path), "blk.0.ffn_gate_inp"]);
    }
    // MXFP4 rows of 48 values: not whole blocks of 32
    let mut b = gptoss_good();
    let at = after_string(&b, "blk.0.ffn_gate_exps.weight") + 4;
    put_u64(&mut b, at, 48);
    let (path, errs, _d) = refused(&b);
    for err in errs {
        assert!(matches!(err, ModelError::GgufMalformed { .. }), "{err}");
        assert_mentions(
            &err.to_string(),
            &[&shown(&path), "blk.0.ffn_gate_exps.weight", "MXFP4"],
        );
    }
    // an MXFP4 tensor of 400 experts: more blocks than the file holds
    let mut b = gptoss_good();
    let at = after_string(&b, "blk.3.ffn_down_exps.weight") + 4 + 2 * 8;
    put_u64(&mut b, at, 400);
    let (path, errs, _d) = refused(&b);
    for err in errs {
        assert!(matches!(err, ModelError::GgufTruncated { .. }), "{err}");
        assert_mentions(
            &err.to_string(),
            &[&shown(&path), "blk.3.ffn_down_exps.weight"],
        );
    }
}

/// Qwen3.5 as llama.cpp's converter writes it (`qwen35`).
fn qwen35_good() -> Vec<u8> {
    std::fs::read(oracle_case(lcut_testkit::QWEN35_CASE).join("model.f32.gguf")).expect("fixture")
}

/// A Qwen3.5 file whose linear layers' sizes, layer flags or decay rates
/// cannot be a model is refused by name.
#[test]
fn damaged_qwen35_files_are_named() {
    Decoder::load_as(
        &oracle_case(lcut_testkit::QWEN35_CASE).join("model.f32.gguf"),
        WeightMode::Dense(DType::F32),
        &Device::Cpu,
    )
    .expect("the fixture loads");
    // one value after each key (a scalar's, or an array's element type:
    // uint8 is 0, one byte each as bool's)
    for (key, value, says) in [
        // an inner width of 30 over 4 value heads
        ("qwen35.ssm.inner_size", 30, "multiple"),
        // 3 value heads for 2 key heads: each key head serves whole value heads
        ("qwen35.ssm.time_step_rank", 3, "multiple"),
        // a convolution kernel of zero
        ("qwen35.ssm.conv_kernel", 0, "positive"),
        // layer flags stored as bytes, not booleans
        ("qwen35.attention.recurrent_layers", 0, "true or false"),
    ] {
        let mut b = qwen35_good();
        let at = after_string(&b, key) + 4;
        put_u32(&mut b, at, value);
        let (path, err, _d) = load(&b);
        assert!(
            matches!(err, ModelError::GgufMetadata { .. }),
            "{key}: {err}"
        );
        assert_mentions(&err.to_string(), &[&shown(&path), key, says]);
    }
    // a decay rate -exp(A_log) that is not negative has no A_log
    let mut b = qwen35_good();
    let file = GgufFile::open(&oracle_case(lcut_testkit::QWEN35_CASE).join("model.f32.gguf"))
        .expect("valid");
    let t = &file.header().tensors["blk.1.ssm_a"];
    b[t.start..t.start + 4].copy_from_slice(&0.5f32.to_le_bytes());
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMalformed { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "blk.1.ssm_a", "negative"],
    );
}

/// A Qwen3.5-MoE file (`qwen35moe`) whose shared expert or routing cannot
/// be the model is refused by name.
#[test]
fn damaged_qwen35_moe_files_are_named() {
    let path = oracle_case(lcut_testkit::QWEN35MOE_CASE).join("model.f32.gguf");
    let good = || std::fs::read(&path).expect("fixture");
    Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)
        .expect("the fixture loads");
    // the shared expert 25 wide: its tensors are 24
    let mut b = good();
    let at = after_string(&b, "qwen35moe.expert_shared_feed_forward_length") + 4;
    put_u32(&mut b, at, 25);
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&p), "blk.0.ffn_gate_shexp.weight", "25"],
    );
    // no width for the shared expert
    let mut b = good();
    let at = after_string(&b, "qwen35moe.expert_shared_feed_forward_length") - 6;
    b[at..at + 6].copy_from_slice(b"lengxh");
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMetadata { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&p), "qwen35moe.expert_shared_feed_forward_length"],
    );
    // the shared expert's gate missing
    let mut b = good();
    let at = after_string(&b, "blk.2.ffn_gate_inp_shexp.weight") - "shexp.weight".len();
    b[at..at + 5].copy_from_slice(b"shexq");
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&p), "blk.2.ffn_gate_inp_shexp.weight"],
    );
    // nine experts a token, of eight
    let mut b = good();
    let at = after_string(&b, "qwen35moe.expert_used_count") + 4;
    put_u32(&mut b, at, 9);
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMetadata { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&p), "qwen35moe.expert_used_count"],
    );
}

/// A Gemma 4 file with experts whose routers or counts cannot be the
/// model is refused by name.
#[test]
fn damaged_gemma4_moe_files_are_named() {
    let path = oracle_case(lcut_testkit::GEMMA4MOE_CASE).join("model.f32.gguf");
    let good = || std::fs::read(&path).expect("fixture");
    Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)
        .expect("the fixture loads");
    // five experts a token, of four
    let mut b = good();
    let at = after_string(&b, "gemma4.expert_used_count") + 4;
    put_u32(&mut b, at, 5);
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMetadata { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&p), "gemma4.expert_used_count"]);
    // a router missing on one layer: the block is on every layer or none
    let mut b = good();
    let at = after_string(&b, "blk.3.ffn_gate_inp.weight") - "inp.weight".len();
    b[at..at + 3].copy_from_slice(b"inq");
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&p),
            "blk.3.ffn_gate_inp.weight",
            "every layer or none",
        ],
    );
    // the fused experts of three experts' rows where the file counts four
    let mut b = good();
    let at = after_string(&b, "blk.1.ffn_gate_up_exps.weight") + 4 + 2 * 8;
    put_u64(&mut b, at, 3);
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&p), "blk.1.ffn_gate_up_exps.weight"],
    );
}

/// A Gemma 4 file whose per-layer MLP widths are not the shared layers'
/// twice the others' is refused by name (llama.cpp's `use_double_wide_mlp`
/// is the one profile lcut runs).
#[test]
fn gemma4_mlp_widths_other_than_double_wide_are_named() {
    let path = oracle_case(lcut_testkit::GEMMA4WIDE_CASE).join("model.f32.gguf");
    let file = GgufFile::open(&path).expect("the fixture loads");
    assert_eq!(
        (0..4)
            .map(|l| file.config().mlp_width(l))
            .collect::<Vec<_>>(),
        vec![96, 96, 192, 192]
    );
    // layer 3's width 191: neither the others' nor twice theirs
    let mut b = std::fs::read(&path).expect("fixture");
    let at = after_string(&b, "gemma4.feed_forward_length") + 4 + 4 + 8 + 3 * 4;
    put_u32(&mut b, at, 191);
    let (p, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMetadata { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&p), "gemma4.feed_forward_length", "twice"],
    );
}

/// Gemma 4 as llama.cpp's converter writes it (`gemma4`).
fn gemma4_good() -> Vec<u8> {
    std::fs::read(oracle_case(lcut_testkit::GEMMA4_CASE).join("model.f32.gguf")).expect("fixture")
}

/// A Gemma 4 file whose layer types, head widths, K/V sharing, per-layer
/// inputs or rotation cannot be the model llama.cpp runs is refused by
/// name, with the key or tensor that says so.
#[test]
fn damaged_gemma4_files_are_named() {
    let path = oracle_case(lcut_testkit::GEMMA4_CASE).join("model.f32.gguf");
    Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)
        .expect("the fixture loads");
    // a scalar key's value, 4 bytes after its type; an array's element
    // `index` (one byte each for bools, four for uint32) after its element
    // type and count
    let scalar = |key: &str| after_string(&gemma4_good(), key) + 4;
    let element = |key: &str, index: usize, width: usize| {
        after_string(&gemma4_good(), key) + 4 + 4 + 8 + index * width
    };
    for (key, at, value, says) in [
        // as many shared layers as layers: none left to hold K/V
        (
            "gemma4.attention.shared_kv_layers",
            scalar("gemma4.attention.shared_kv_layers"),
            6,
            "fewer than",
        ),
        // five shared layers: the full layer 2 has no full layer below to read
        (
            "gemma4.attention.shared_kv_layers",
            scalar("gemma4.attention.shared_kv_layers"),
            5,
            "full_attention",
        ),
        (
            "gemma4.attention.sliding_window",
            scalar("gemma4.attention.sliding_window"),
            0,
            "positive",
        ),
        // the last layer sliding: transformers' and llama.cpp's would differ
        (
            "gemma4.attention.sliding_window_pattern",
            element("gemma4.attention.sliding_window_pattern", 5, 1),
            1,
            "full last layer",
        ),
        // keys wider than values, and an odd count of rotated values
        (
            "gemma4.attention.key_length_swa",
            scalar("gemma4.attention.key_length_swa"),
            15,
            "as wide as its keys",
        ),
        (
            "gemma4.rope.dimension_count_swa",
            scalar("gemma4.rope.dimension_count_swa"),
            15,
            "even",
        ),
        (
            "gemma4.attention.value_length",
            scalar("gemma4.attention.value_length"),
            16,
            "as wide as its keys",
        ),
        (
            "gemma4.rope.dimension_count",
            scalar("gemma4.rope.dimension_count"),
            16,
            "whole head",
        ),
        // 3 K/V heads on layer 2 for 4 query heads
        (
            "gemma4.attention.head_count_kv",
            element("gemma4.attention.head_count_kv", 2, 4),
            3,
            "divisor",
        ),
    ] {
        let mut b = gemma4_good();
        if key.ends_with("sliding_window_pattern") {
            b[at] = value as u8;
        } else {
            put_u32(&mut b, at, value);
        }
        let (path, err, _d) = load(&b);
        assert!(
            matches!(err, ModelError::GgufMetadata { .. }),
            "{key} = {value}: {err}"
        );
        assert_mentions(&err.to_string(), &[&shown(&path), key, says]);
    }
    let file = GgufFile::open(&path).expect("valid");
    // a divisor for a rotated pair that differs from the others': not the
    // proportional rotation
    let t = &file.header().tensors["rope_freqs.weight"];
    let mut b = gemma4_good();
    b[t.start + 4..t.start + 8].copy_from_slice(&2.0f32.to_le_bytes());
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::GgufMalformed { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "rope_freqs.weight", "proportional"],
    );
    // no rope_freqs: which pairs the full layers rotate is unknown
    let mut b = gemma4_good();
    let at = after_string(&b, "rope_freqs.weight") - "freqs.weight".len();
    b[at..at + 5].copy_from_slice(b"frexx");
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&path), "rope_freqs.weight"]);
    // per-layer inputs 7 wide: the layers' gates are 8 wide
    let mut b = gemma4_good();
    put_u32(&mut b, scalar("gemma4.embedding_length_per_layer_input"), 7);
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "blk.0.inp_gate.weight", "[7, 64]"],
    );
}

#[test]
fn missing_tensor_is_named() {
    let mut b = good();
    let at = after_string(&b, "blk.0.attn_q.weight") - "attn_q.weight".len();
    b[at..at + 6].copy_from_slice(b"attn_x");
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&path), "blk.0.attn_q.weight"]);
}

#[test]
fn wrong_tensor_shape_is_named() {
    let mut b = good();
    // output_norm.weight: rank 1, dims [64] -> [32] (its data still fits)
    let at = after_string(&b, "output_norm.weight");
    put_u64(&mut b, at + 4, 32);
    let (path, err, _d) = load(&b);
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "output_norm.weight", "[32]", "[64]"],
    );
}

#[test]
fn unsupported_quantization_type_is_named() {
    let mut b = good();
    // blk.0.attn_v.weight: rank 2, two dims, then the type: IQ2_XXS (16)
    let at = after_string(&b, "blk.0.attn_v.weight") + 4 + 16;
    put_u32(&mut b, at, 16);
    let (path, err, _d) = load(&b);
    assert!(
        matches!(err, ModelError::UnsupportedQuantization { .. }),
        "{err}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "blk.0.attn_v.weight", "IQ2_XXS"],
    );
}

#[test]
fn a_file_that_is_not_a_model_is_named() {
    let (_d, path) = write(b"{}");
    let err = Decoder::load(
        path.parent().expect("dir").join("model.gguf").as_path(),
        DType::F32,
        &Device::Cpu,
    )
    .expect_err("not a GGUF");
    assert_mentions(&err.to_string(), &[&shown(&path)]);
    let txt = path.with_extension("txt");
    std::fs::write(&txt, b"hello").expect("write");
    let err = Decoder::load(&txt, DType::F32, &Device::Cpu).expect_err("not a model");
    assert_mentions(&err.to_string(), &[&shown(&txt), ".gguf"]);
}
