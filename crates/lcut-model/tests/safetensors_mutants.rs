//! Damaged safetensors weights by the thousand: deterministic mutants of a
//! reference model's `model.safetensors` (bytes damaged anywhere, its JSON
//! header damaged with the length prefix kept consistent, the file cut at
//! every boundary of its header and tensors) and of a sharded checkpoint's
//! `model.safetensors.index.json`, each loaded as a model folder. Each must
//! load or be refused with a named error, never panic; a load must have
//! every tensor in a float type and in the shape the config asks for; and no
//! single allocation may pass [`ALLOC_BOUND`], whatever a header claims.
//! `LCUT_MUTANTS=N` runs more.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use lcut_model::{DType, Decoder, Device, ModelError, Tensor};
use lcut_testkit::alloc::{LargestAlloc, largest_allocation};
use lcut_testkit::mutate::{safetensors_header_len, with_safetensors_header};
use lcut_testkit::{MutantRun, json_mutants, mutant_count, oracle_case, safetensors_mutants};
use safetensors::SafeTensors;
use serde_json::{Map, Value};

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// No loader may make a single allocation larger than this (the seed model
/// is 1.2 MB; a header may claim terabytes).
const ALLOC_BOUND: usize = 64 << 20;
const DEFAULT_MUTANTS: usize = 10_000;
const SEED: u64 = 20261123;
const WEIGHTS: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";
const CASE: &str = "llama-gqa";
/// No single mutant may take longer than this (a near hang).
const SLOWEST: Duration = Duration::from_secs(5);

fn seed_weights() -> Vec<u8> {
    std::fs::read(oracle_case(CASE).join(WEIGHTS)).expect("fixture")
}

/// A model folder with the seed's config and no weights yet.
fn folder() -> tempfile::TempDir {
    let dir = lcut_testkit::mutant_dir();
    std::fs::copy(
        oracle_case(CASE).join("config.json"),
        dir.path().join("config.json"),
    )
    .expect("copy config");
    dir
}

fn load(dir: &Path) -> lcut_model::Result<Decoder> {
    Decoder::load(dir, DType::F32, &Device::Cpu)
}

/// The seed's tensors: (dtype, shape) by name.
fn layout(bytes: &[u8]) -> Option<HashMap<String, (safetensors::Dtype, Vec<usize>)>> {
    let st = SafeTensors::deserialize(bytes).ok()?;
    Some(
        st.tensors()
            .into_iter()
            .map(|(name, view)| (name, (view.dtype(), view.shape().to_vec())))
            .collect(),
    )
}

/// An error that names what is wrong: the file, or the tensor and folder.
fn assert_named(err: &ModelError, dir: &Path) {
    let msg = err.to_string();
    assert!(
        !matches!(err, ModelError::Candle(_)),
        "a bare backend error, naming no file: {msg}"
    );
    assert!(
        msg.contains(&dir.display().to_string()),
        "the error does not name the folder or file: {msg}"
    );
}

#[test]
fn mutated_safetensors_never_panic() {
    let good = seed_weights();
    let seed_layout = layout(&good).expect("seed parses");
    let dir = folder();
    let count = mutant_count(DEFAULT_MUTANTS);
    // cuts at every boundary first, then byte damage and header damage in turn
    let stream = safetensors_mutants(&good, SEED).take(count);
    let mut run = MutantRun::new("model.safetensors", SEED);
    for (i, mutant) in stream.enumerate() {
        run.check(i, &mutant, |mutant| {
            std::fs::write(dir.path().join(WEIGHTS), mutant).expect("write mutant");
            let loaded = match load(dir.path()) {
                Ok(model) => {
                    // a loaded model has the seed's layout: every tensor it
                    // needs stored as floats, in the config's shape
                    let found = layout(mutant).expect("a loaded file parses");
                    for (name, (dtype, shape)) in &found {
                        if let Some((_, want)) = seed_layout.get(name) {
                            assert_eq!(shape, want, "`{name}` loaded in another shape");
                            assert!(
                                matches!(
                                    dtype,
                                    safetensors::Dtype::F32
                                        | safetensors::Dtype::F16
                                        | safetensors::Dtype::BF16
                                        | safetensors::Dtype::F64
                                ),
                                "`{name}` loaded from {dtype:?}"
                            );
                        }
                    }
                    model.teacher_forced_logits(&[1, 5, 9], None).is_ok()
                }
                Err(e) => {
                    assert_named(&e, dir.path());
                    false
                }
            };
            assert!(
                largest_allocation() <= ALLOC_BOUND,
                "an allocation of {} bytes",
                largest_allocation()
            );
            loaded
        });
    }
    assert_eq!(run.finish(SLOWEST), count);
}

/// A file of one tensor `t` whose header claims `dtype`, `shape` and
/// `offsets`, followed by `data_len` bytes.
fn claiming(dtype: &str, shape: &[u64], offsets: [u64; 2], data_len: usize) -> Vec<u8> {
    let header =
        serde_json::json!({"t": {"dtype": dtype, "shape": shape, "data_offsets": offsets}});
    let header = header.to_string().into_bytes();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.resize(out.len() + data_len, 0);
    out
}

#[test]
fn headers_that_claim_huge_sizes_are_refused_unallocated() {
    let dir = folder();
    let tera = 1u64 << 40;
    let mut huge_len = (1u64 << 60).to_le_bytes().to_vec();
    huge_len.extend_from_slice(b"{}");
    let mut almost_max = 99_999_999u64.to_le_bytes().to_vec();
    almost_max.extend_from_slice(b"{\"a\":");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("an 8-byte header length of 2^60", huge_len),
        ("a header length just under safetensors' limit", almost_max),
        (
            "a tensor of 2^40 elements in a small file",
            claiming("F32", &[tera], [0, 4 * tera], 64),
        ),
        (
            "a 2^20 x 2^20 tensor in a small file",
            claiming("F32", &[1 << 20, 1 << 20], [0, 4 * tera], 64),
        ),
        (
            "a shape whose element count overflows",
            claiming("F32", &[1 << 32, 1 << 32, 1 << 32], [0, 16], 16),
        ),
        (
            "data offsets past the end of the file",
            claiming("F32", &[4], [0, u64::MAX], 16),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(dir.path().join(WEIGHTS), &bytes).expect("write");
        let err = match load(dir.path()) {
            Ok(_) => panic!("{what}: loaded"),
            Err(e) => e,
        };
        assert!(
            matches!(err, ModelError::Safetensors { .. }),
            "{what}: {err}"
        );
        assert_named(&err, dir.path());
        assert!(
            largest_allocation() <= ALLOC_BOUND,
            "{what}: an allocation of {} bytes",
            largest_allocation()
        );
    }
}

#[test]
fn a_config_that_claims_huge_sizes_is_refused_unallocated() {
    let good = seed_weights();
    let config: Value = serde_json::from_slice(
        &std::fs::read(oracle_case(CASE).join("config.json")).expect("config"),
    )
    .expect("JSON");
    for (field, value) in [
        ("vocab_size", 1u64 << 40),
        ("hidden_size", 1 << 40),
        ("intermediate_size", u64::MAX),
        ("num_hidden_layers", 1 << 40),
        ("num_attention_heads", 1 << 32),
        ("head_dim", 1 << 62),
        ("vocab_size", 1 << 24),
    ] {
        let dir = folder();
        let mut c = config.clone();
        c[field] = Value::from(value);
        std::fs::write(dir.path().join("config.json"), c.to_string()).expect("config");
        std::fs::write(dir.path().join(WEIGHTS), &good).expect("weights");
        let err = match load(dir.path()) {
            Ok(_) => panic!("{field} = {value}: loaded"),
            Err(e) => e,
        };
        assert_named(&err, dir.path());
        assert!(
            largest_allocation() <= ALLOC_BOUND,
            "{field} = {value}: an allocation of {} bytes",
            largest_allocation()
        );
    }
}

#[test]
fn integer_weights_of_the_right_size_are_refused() {
    let good = seed_weights();
    let header_len = safetensors_header_len(&good);
    let header = String::from_utf8(good[8..header_len].to_vec()).expect("UTF-8");
    for stored in ["I32", "U32"] {
        let dir = folder();
        let bad = header.replacen("\"F32\"", &format!("\"{stored}\""), 1);
        std::fs::write(
            dir.path().join(WEIGHTS),
            with_safetensors_header(&good, bad.as_bytes()),
        )
        .expect("write");
        let err = match load(dir.path()) {
            Ok(_) => panic!("weights stored as {stored} loaded"),
            Err(e) => e,
        };
        assert!(err.to_string().contains(stored), "{err}");
        assert_named(&err, dir.path());
    }
}

// ---- sharded checkpoints ----------------------------------------------------

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// A folder holding the seed split in two shards and its index text.
fn sharded() -> (tempfile::TempDir, Vec<u8>) {
    let dir = folder();
    let path = oracle_case(CASE).join(WEIGHTS);
    let tensors = candle_core::safetensors::load(&path, &Device::Cpu).expect("seed tensors");
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
    let index = serde_json::json!({"metadata": {"total_size": 1205248}, "weight_map": weight_map});
    (dir, serde_json::to_vec_pretty(&index).expect("index"))
}

fn logits(model: &Decoder) -> Vec<f32> {
    model
        .teacher_forced_logits(&[1, 5, 9], None)
        .expect("forward")
        .flatten_all()
        .expect("flatten")
        .to_vec1()
        .expect("to vec")
}

#[test]
fn mutated_shard_indexes_never_panic() {
    let (dir, index) = sharded();
    std::fs::write(dir.path().join(INDEX), &index).expect("index");
    let want = logits(&load(dir.path()).expect("the sharded seed loads"));
    // a few files a damaged index might name instead of a shard
    std::fs::create_dir(dir.path().join("sub")).expect("sub folder");
    let count = mutant_count(DEFAULT_MUTANTS);
    let mut run = MutantRun::new(INDEX, SEED);
    for (i, mutant) in json_mutants(&index, SEED).take(count).enumerate() {
        run.check(i, &mutant, |mutant| {
            std::fs::write(dir.path().join(INDEX), mutant).expect("write mutant");
            let loaded = match load(dir.path()) {
                // the shards are intact: a load is the seed model exactly
                Ok(model) => {
                    assert_eq!(logits(&model), want, "a damaged index loaded other weights");
                    true
                }
                Err(e) => {
                    assert_named(&e, dir.path());
                    false
                }
            };
            assert!(largest_allocation() <= ALLOC_BOUND);
            loaded
        });
    }
    run.finish(SLOWEST);
}

#[test]
fn an_index_may_name_only_shards_in_the_folder() {
    let (dir, index) = sharded();
    let text = String::from_utf8(index).expect("UTF-8");
    for bad in [
        "../model-00001-of-00002.safetensors",
        "/dev/zero",
        "sub",
        ".",
    ] {
        let mutant = text.replacen(SHARDS[0], bad, 1);
        std::fs::write(dir.path().join(INDEX), mutant).expect("write");
        let err = match load(dir.path()) {
            Ok(_) => panic!("an index naming {bad:?} loaded"),
            Err(e) => e,
        };
        assert!(err.to_string().contains(bad), "{err}");
        assert_named(&err, dir.path());
    }
    // a tensor the index puts in the wrong shard
    let moved = text.replacen(SHARDS[1], SHARDS[0], 1);
    std::fs::write(dir.path().join(INDEX), moved).expect("write");
    let Err(err) = load(dir.path()) else {
        panic!("a wrong index entry is refused")
    };
    assert!(err.to_string().contains("weight_map."), "{err}");
}
