//! Bad model folders and bad inputs: each way a folder can be wrong gives a
//! named `ModelError` whose message says which file, field or tensor is at
//! fault and what was expected; none panics.
//!
//! Every test copies the good reference folder `fixtures/oracle/llama-gqa`
//! (6 layers, 4 heads, 2 KV heads, hidden 64, head_dim 16, vocab 320, 256
//! positions) into a temporary directory and breaks it one way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lcut_model::{DType, Decoder, Device, ModelError, Tensor};
use lcut_testkit::{assert_mentions, shown};
use serde_json::{Map, Value};
use tempfile::TempDir;

const CONFIG: &str = "config.json";
const WEIGHTS: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

fn good_dir() -> PathBuf {
    lcut_testkit::oracle_case("llama-gqa")
}

/// A temporary copy of the good model folder (config and weights only).
fn good_copy() -> TempDir {
    lcut_testkit::model_copy("llama-gqa").expect("copy fixture")
}

fn load(dir: &Path) -> lcut_model::Result<Decoder> {
    Decoder::load(dir, DType::F32, &Device::Cpu)
}

/// The error of loading `dir`; fails the test when it loads.
fn load_err(dir: &TempDir) -> ModelError {
    match load(dir.path()) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.path().display()),
        Err(e) => e,
    }
}

/// Change the copied config.json as a JSON object.
fn edit_config(dir: &TempDir, edit: impl FnOnce(&mut Map<String, Value>)) {
    let path = dir.path().join(CONFIG);
    let text = std::fs::read_to_string(&path).expect("read config");
    let mut value: Value = serde_json::from_str(&text).expect("good config is JSON");
    edit(value.as_object_mut().expect("good config is an object"));
    std::fs::write(&path, value.to_string()).expect("write config");
}

fn good_tensors() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(good_dir().join(WEIGHTS), &Device::Cpu).expect("good weights")
}

/// Rewrite the copied model.safetensors after changing its tensors.
fn edit_weights(dir: &TempDir, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let mut tensors = good_tensors();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, dir.path().join(WEIGHTS)).expect("write weights");
}

// ---- the folder ----------------------------------------------------------

#[test]
fn good_folder_loads() {
    let dir = good_copy();
    let model = load(dir.path()).expect("the reference folder loads");
    assert_eq!(model.config().num_layers, 6);
}

#[test]
fn missing_config_json() {
    let dir = good_copy();
    std::fs::remove_file(dir.path().join(CONFIG)).expect("remove");
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with(CONFIG)),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, CONFIG), "missing"]);
}

#[test]
fn config_json_is_not_json() {
    let dir = good_copy();
    std::fs::write(dir.path().join(CONFIG), "{\"model_type\": \"llama\",").expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, ModelError::Json { .. }), "{err:?}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, CONFIG), "not valid JSON", "line 1"],
    );
}

#[test]
fn config_json_is_an_array() {
    let dir = good_copy();
    std::fs::write(dir.path().join(CONFIG), "[1, 2, 3]").expect("write");
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "(top level)"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, CONFIG), "a JSON object", "[1,2,3]"],
    );
}

#[test]
fn config_without_model_type() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.remove("model_type");
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "model_type"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, CONFIG), "`model_type`", "field missing"],
    );
}

#[test]
fn config_without_hidden_size() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.remove("hidden_size");
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "hidden_size"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, CONFIG),
            "`hidden_size`",
            "a positive integer",
            "field missing",
        ],
    );
}

#[test]
fn num_attention_heads_is_a_string() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.insert("num_attention_heads".into(), Value::from("four"));
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "num_attention_heads"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, CONFIG),
            "`num_attention_heads`",
            "expected a positive integer",
            "\"four\"",
        ],
    );
}

#[test]
fn num_key_value_heads_does_not_divide_heads() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.insert("num_key_value_heads".into(), Value::from(3));
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "num_key_value_heads"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, CONFIG),
            "`num_key_value_heads`",
            "divisor of num_attention_heads (4)",
            "found 3",
        ],
    );
}

#[test]
fn unknown_model_type_lists_supported_ones() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.insert("model_type".into(), Value::from("gpt2"));
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::UnknownArchitecture { model_type, .. } if model_type == "gpt2"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, CONFIG),
            "\"gpt2\"",
            "llama, mistral, qwen2, qwen3, gemma2, phi3",
        ],
    );
}

#[test]
fn unsupported_rope_type() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "longrope", "factor": 4.0}),
        );
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "rope_scaling.rope_type"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, CONFIG),
            "\"longrope\"",
            "default, linear, llama3, yarn",
        ],
    );
}

#[test]
fn no_weights_and_no_index() {
    let dir = good_copy();
    std::fs::remove_file(dir.path().join(WEIGHTS)).expect("remove");
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, WEIGHTS), WEIGHTS, INDEX]);
}

// ---- sharded weights -------------------------------------------------------

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// Replace the single weights file by two shards and an index naming them.
fn shard(dir: &TempDir) {
    let tensors = good_tensors();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let half = names.len() / 2;
    let mut weight_map = Map::new();
    for (i, part) in [&names[..half], &names[half..]].into_iter().enumerate() {
        let shard: HashMap<String, Tensor> = part
            .iter()
            .map(|&n| (n.clone(), tensors[n].clone()))
            .collect();
        candle_core::safetensors::save(&shard, dir.path().join(SHARDS[i])).expect("write shard");
        for &n in part {
            weight_map.insert(n.clone(), Value::from(SHARDS[i]));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.path().join(INDEX), index.to_string()).expect("write index");
    std::fs::remove_file(dir.path().join(WEIGHTS)).expect("remove single file");
}

#[test]
fn sharded_weights_load_and_match_the_single_file() {
    let single = load(&good_dir()).expect("good folder");
    let dir = good_copy();
    shard(&dir);
    let sharded = load(dir.path()).expect("the sharded folder loads");
    let ids = [1u32, 17, 42, 5, 319, 0, 88];
    let a = single.teacher_forced_logits(&ids, None).expect("logits");
    let b = sharded.teacher_forced_logits(&ids, None).expect("logits");
    assert_eq!(a.dims(), &[ids.len(), 320]);
    let diff = (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("difference");
    assert_eq!(diff, 0.0, "sharded and single-file logits differ");
}

#[test]
fn sharded_index_names_a_missing_shard() {
    let dir = good_copy();
    shard(&dir);
    std::fs::remove_file(dir.path().join(SHARDS[1])).expect("remove shard");
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with(SHARDS[1])),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, SHARDS[1]), INDEX]);
}

#[test]
fn sharded_index_is_not_json() {
    let dir = good_copy();
    shard(&dir);
    std::fs::write(dir.path().join(INDEX), "{\"weight_map\": ").expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, ModelError::Json { .. }), "{err:?}");
    assert_mentions(&err.to_string(), &[&shown(&dir, INDEX), "not valid JSON"]);
}

#[test]
fn sharded_index_without_weight_map() {
    let dir = good_copy();
    shard(&dir);
    std::fs::write(dir.path().join(INDEX), "{\"metadata\": {}}").expect("write");
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::ConfigField { field, .. } if field == "weight_map"),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, INDEX), "`weight_map`"]);
}

// ---- tensors -------------------------------------------------------------

#[test]
fn tensor_missing() {
    let dir = good_copy();
    let name = "model.layers.3.mlp.up_proj.weight";
    edit_weights(&dir, |t| {
        t.remove(name).expect("the good file has it");
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::MissingTensor { name: n, .. } if n == name),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &format!("`{name}`"),
            "missing",
            &dir.path().display().to_string(),
        ],
    );
}

#[test]
fn tensor_of_the_wrong_shape() {
    let dir = good_copy();
    let name = "model.layers.2.self_attn.k_proj.weight";
    edit_weights(&dir, |t| {
        // 4 heads instead of the 2 KV heads config.json asks for
        let wrong = Tensor::zeros((64, 64), DType::F32, &Device::Cpu).expect("zeros");
        t.insert(name.to_string(), wrong);
    });
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::TensorShape { name: n, expected, found, .. }
            if n == name && expected == &[32, 64] && found == &[64, 64]),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &format!("`{name}`"),
            "[64, 64]",
            "expected [32, 64]",
            CONFIG,
        ],
    );
}

#[test]
fn untied_embeddings_without_lm_head() {
    let dir = good_copy();
    edit_config(&dir, |c| {
        c.insert("tie_word_embeddings".into(), Value::from(false));
    });
    edit_weights(&dir, |t| {
        t.remove("lm_head.weight").expect("the good file has it");
    });
    let err = load_err(&dir);
    assert!(matches!(&err, ModelError::MissingLmHead { .. }), "{err:?}");
    assert_mentions(
        &err.to_string(),
        &["`lm_head.weight`", "missing", "tie_word_embeddings = false"],
    );
}

/// Cut the copied weights file to `len` bytes and return the load error.
fn truncated(len: impl FnOnce(usize) -> usize) -> (TempDir, ModelError) {
    let dir = good_copy();
    let path = dir.path().join(WEIGHTS);
    let bytes = std::fs::read(&path).expect("read weights");
    std::fs::write(&path, &bytes[..len(bytes.len())]).expect("write weights");
    let err = load_err(&dir);
    (dir, err)
}

#[test]
fn safetensors_cut_in_half() {
    let (dir, err) = truncated(|n| n / 2);
    assert!(
        matches!(&err, ModelError::Safetensors { path, .. } if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, WEIGHTS),
            "not a readable safetensors file",
            "truncated",
        ],
    );
}

#[test]
fn safetensors_cut_inside_the_header() {
    let (dir, err) = truncated(|_| 100);
    assert!(
        matches!(&err, ModelError::Safetensors { path, .. } if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, WEIGHTS), "100 bytes", "header", "truncated"],
    );
}

#[test]
fn safetensors_cut_to_five_bytes() {
    let (dir, err) = truncated(|_| 5);
    assert!(
        matches!(&err, ModelError::Safetensors { path, .. } if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, WEIGHTS),
            "not a readable safetensors file",
            "5 bytes",
        ],
    );
}

#[test]
fn safetensors_empty_file() {
    let (dir, err) = truncated(|_| 0);
    assert!(
        matches!(&err, ModelError::Safetensors { path, .. } if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, WEIGHTS),
            "not a readable safetensors file",
            "empty",
        ],
    );
}

#[test]
fn safetensors_header_is_garbage() {
    let dir = good_copy();
    let mut bytes = 64u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[b'x'; 64]);
    std::fs::write(dir.path().join(WEIGHTS), bytes).expect("write weights");
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::Safetensors { path, .. } if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&dir, WEIGHTS),
            "not a readable safetensors file",
            "JSON in header",
        ],
    );
}

// ---- running the model ---------------------------------------------------

fn good_model() -> Decoder {
    load(&good_dir()).expect("good folder")
}

#[test]
fn token_id_outside_the_vocabulary() {
    let err = good_model()
        .teacher_forced_logits(&[1, 5, 320], None)
        .expect_err("id 320 is outside a vocabulary of 320");
    assert!(
        matches!(
            err,
            ModelError::TokenOutOfVocab {
                id: 320,
                position: 2,
                vocab_size: 320
            }
        ),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &["token id 320", "position 2", "vocabulary of 320"],
    );
}

#[test]
fn empty_token_list() {
    let err = good_model()
        .teacher_forced_logits(&[], None)
        .expect_err("no tokens");
    assert!(matches!(err, ModelError::EmptyInput), "{err:?}");
    assert_mentions(&err.to_string(), &["no tokens", "at least one"]);
}

#[test]
fn sequence_longer_than_max_position_embeddings() {
    let ids = vec![1u32; 257];
    let err = good_model()
        .teacher_forced_logits(&ids, None)
        .expect_err("257 tokens for 256 positions");
    assert!(
        matches!(err, ModelError::SequenceTooLong { len: 257, max: 256 }),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &["257 tokens", "max_position_embeddings = 256"],
    );
}

#[test]
fn decoding_past_max_position_embeddings() {
    let model = good_model();
    let mut seq = model.new_full_sequence();
    model
        .forward(&mut seq, &[1u32; 250], lcut_model::LogitRows::None, None)
        .expect("250 tokens fit");
    let err = model
        .forward(&mut seq, &[1u32; 7], lcut_model::LogitRows::Last, None)
        .expect_err("257 positions in all");
    assert!(
        matches!(err, ModelError::SequenceTooLong { len: 257, max: 256 }),
        "{err:?}"
    );
    assert_eq!(
        seq.len(),
        250,
        "a refused chunk leaves the sequence as it was"
    );
}

#[test]
fn policy_for_another_depth() {
    let dir = good_copy();
    let model = Decoder::load(dir.path(), DType::F32, &Device::Cpu).expect("good model");
    let policy = lcut_policy::Policy::new(
        lcut_policy::PolicyKind::Speed,
        3,
        12,
        lcut_policy::Anchors::Bos,
    )
    .expect("valid for 12 layers");
    let phases = lcut_policy::TokenPhases::new(10, 9, 1).expect("phases");
    let err = model
        .new_sequence(policy, phases)
        .expect_err("depth differs");
    assert!(
        matches!(
            err,
            ModelError::PolicyDepth {
                policy_layers: 12,
                model_layers: 6,
                ..
            }
        ),
        "{err}"
    );
    assert_mentions(&err.to_string(), &["12 layers", "model has 6"]);
}

/// A mixture-of-experts folder whose router, sink or expert tensor is
/// missing or of the wrong shape is refused naming that tensor (and, for a
/// shape, what the config asks for), before any token runs.
#[test]
fn damaged_router_sink_and_expert_tensors_are_named() {
    let cases: [(&str, &str, Option<&[usize]>); 7] = [
        ("moe/gptoss-sinks", "model.layers.1.self_attn.sinks", None),
        (
            "moe/gptoss-sinks",
            "model.layers.1.self_attn.sinks",
            Some(&[3]),
        ),
        (
            "moe/gptoss-sinks",
            "model.layers.0.mlp.router.weight",
            Some(&[4, 63]),
        ),
        (
            "moe/gptoss-sinks",
            "model.layers.2.mlp.experts.gate_up_proj",
            Some(&[3, 64, 64]),
        ),
        (
            "moe/mixtral-top2",
            "model.layers.1.block_sparse_moe.gate.weight",
            None,
        ),
        (
            "moe/mixtral-top2",
            "model.layers.1.block_sparse_moe.experts.3.w2.weight",
            Some(&[64, 63]),
        ),
        (
            "moe/qwen3moe-experts",
            "model.layers.0.mlp.experts.1.up_proj.weight",
            None,
        ),
    ];
    for (case, name, wrong) in cases {
        let dir = lcut_testkit::model_copy(case).expect("copy fixture");
        let path = dir.path().join(WEIGHTS);
        let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).expect("weights");
        let good_shape = tensors[name].dims().to_vec();
        match wrong {
            None => {
                tensors.remove(name);
            }
            Some(shape) => {
                let t = Tensor::zeros(shape, DType::F32, &Device::Cpu).expect("zeros");
                tensors.insert(name.to_string(), t);
            }
        }
        candle_core::safetensors::save(&tensors, &path).expect("write weights");
        let err = load_err(&dir);
        match wrong {
            None => assert!(
                matches!(&err, ModelError::MissingTensor { name: n, .. } if n == name),
                "{case}: {err:?}"
            ),
            Some(shape) => assert!(
                matches!(&err, ModelError::TensorShape { name: n, expected, found, .. }
                    if n == name && expected == &good_shape && found == shape),
                "{case}: {err:?}"
            ),
        }
        assert_mentions(&err.to_string(), &[name, &dir.path().display().to_string()]);
    }
}
