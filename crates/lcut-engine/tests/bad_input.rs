//! Bad input to the engine: broken model folders, broken tokenizer files,
//! prompts that do not fit, policies that do not fit the model. Each gives a
//! named `EngineError` whose message says what is wrong and where; none
//! panics.
//!
//! The model is the reference folder `fixtures/oracle/llama-gqa` (6 layers,
//! vocab 320, 256 positions, no tokenizer), copied into a temporary
//! directory when a test breaks it.

use std::path::{Path, PathBuf};

use lcut_engine::{EngineError, Generation, GenerationConfig, PreparedPrompt, Session};
use lcut_model::{DType, Device, ModelError, Tensor};
use lcut_policy::{PhaseError, Policy, PolicyError, PolicySpec};
use lcut_testkit::{assert_mentions, shown};
use tempfile::TempDir;

const CONFIG: &str = "config.json";
const WEIGHTS: &str = "model.safetensors";
const TOKENIZER: &str = "tokenizer.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

/// A word-level tokenizer over a few words of the model's vocabulary.
const TINY_TOKENIZER: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "WhitespaceSplit"},
  "post_processor": null,
  "decoder": null,
  "model": {
    "type": "WordLevel",
    "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4},
    "unk_token": "<unk>"
  }
}"#;

fn good_dir() -> PathBuf {
    lcut_testkit::oracle_case("llama-gqa")
}

/// A temporary copy of the good model folder (config and weights only).
fn good_copy() -> TempDir {
    lcut_testkit::model_copy("llama-gqa").expect("copy fixture")
}

fn write(dir: &TempDir, name: &str, text: &str) {
    std::fs::write(dir.path().join(name), text).expect("write file");
}

fn load(dir: &Path) -> lcut_engine::Result<Session> {
    Session::load(dir, DType::F32, &Device::Cpu)
}

fn good_session() -> Session {
    load(&good_dir()).expect("the reference folder loads")
}

/// The error of a result that must fail.
fn err_of<T>(result: lcut_engine::Result<T>) -> EngineError {
    match result {
        Ok(_) => panic!("succeeded on bad input"),
        Err(e) => e,
    }
}

fn policy(text: &str, num_layers: usize) -> Policy {
    text.parse::<PolicySpec>()
        .and_then(|s| s.resolve(num_layers))
        .expect("a valid policy")
}

fn budget(max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        ..GenerationConfig::default()
    }
}

// ---- the model folder ----------------------------------------------------

#[test]
fn missing_config_json() {
    let dir = good_copy();
    std::fs::remove_file(dir.path().join(CONFIG)).expect("remove");
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Model(ModelError::MissingFile { path, .. }) if path.ends_with(CONFIG)),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, CONFIG), "missing"]);
}

#[test]
fn malformed_config_json() {
    let dir = good_copy();
    write(&dir, CONFIG, "{\"model_type\": llama}");
    let err = err_of(load(dir.path()));
    assert!(
        matches!(err, EngineError::Model(ModelError::Json { .. })),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, CONFIG), "not valid JSON"]);
}

#[test]
fn unknown_architecture() {
    let dir = good_copy();
    let text = std::fs::read_to_string(dir.path().join(CONFIG)).expect("read config");
    let text = text.replace("\"model_type\": \"llama\"", "\"model_type\": \"falcon\"");
    assert!(
        text.contains("falcon"),
        "the fixture's model_type line changed"
    );
    write(&dir, CONFIG, &text);
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Model(ModelError::UnknownArchitecture { model_type, .. }) if model_type == "falcon"),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, CONFIG), "\"falcon\"", "supported: llama"],
    );
}

#[test]
fn wrong_tensor_shape() {
    let dir = good_copy();
    let name = "model.embed_tokens.weight";
    let mut tensors =
        candle_core::safetensors::load(dir.path().join(WEIGHTS), &Device::Cpu).expect("weights");
    let wrong = Tensor::zeros((300, 64), DType::F32, &Device::Cpu).expect("zeros");
    tensors.insert(name.to_string(), wrong);
    candle_core::safetensors::save(&tensors, dir.path().join(WEIGHTS)).expect("write weights");
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Model(ModelError::TensorShape { name: n, .. }) if n == name),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&format!("`{name}`"), "[300, 64]", "expected [320, 64]"],
    );
}

#[test]
fn truncated_safetensors() {
    let dir = good_copy();
    let path = dir.path().join(WEIGHTS);
    let bytes = std::fs::read(&path).expect("read weights");
    std::fs::write(&path, &bytes[..bytes.len() / 3]).expect("write weights");
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Model(ModelError::Safetensors { path, .. }) if path.ends_with(WEIGHTS)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, WEIGHTS), "not a readable safetensors file"],
    );
}

// ---- tokenizer files ------------------------------------------------------

#[test]
fn malformed_tokenizer_json() {
    let dir = good_copy();
    write(&dir, TOKENIZER, "{\"model\": {\"type\": \"BPE\"");
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Tokenizer { path, .. } if path.ends_with(TOKENIZER)),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &[&shown(&dir, TOKENIZER)]);
}

#[test]
fn malformed_tokenizer_config_json() {
    let dir = good_copy();
    write(&dir, TOKENIZER, TINY_TOKENIZER);
    write(&dir, TOKENIZER_CONFIG, "{\"bos_token\": ");
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Tokenizer { path, .. } if path.ends_with(TOKENIZER_CONFIG)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[&shown(&dir, TOKENIZER_CONFIG), "not valid JSON"],
    );
}

#[test]
fn chat_template_that_does_not_compile() {
    let dir = good_copy();
    write(&dir, TOKENIZER, TINY_TOKENIZER);
    write(
        &dir,
        TOKENIZER_CONFIG,
        r#"{"chat_template": "{% for m in messages %}{{ m.content }}"}"#,
    );
    let err = err_of(load(dir.path()));
    assert!(
        matches!(&err, EngineError::Template { path, .. } if path.ends_with(TOKENIZER_CONFIG)),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &["chat template", &shown(&dir, TOKENIZER_CONFIG)],
    );
}

#[test]
fn text_prompt_without_tokenizer() {
    let session = good_session();
    let err = err_of(session.prepare_text("hello world", None, true));
    assert!(
        matches!(&err, EngineError::NoTokenizer { folder } if folder == &good_dir()),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &good_dir().display().to_string(),
            "no tokenizer.json",
            "token ids",
        ],
    );
}

// ---- prompts ---------------------------------------------------------------

#[test]
fn empty_prompt_ids() {
    let err = err_of(PreparedPrompt::from_ids(vec![], None));
    assert!(matches!(err, EngineError::EmptyPrompt), "{err:?}");
    assert_mentions(&err.to_string(), &["prompt is empty"]);
}

#[test]
fn blank_prompt_text() {
    let dir = good_copy();
    write(&dir, TOKENIZER, TINY_TOKENIZER);
    let session = load(dir.path()).expect("folder with a tokenizer loads");
    let err = err_of(session.prepare_text(" \n\t", None, false));
    assert!(matches!(err, EngineError::EmptyPrompt), "{err:?}");
    assert_mentions(&err.to_string(), &["prompt is empty"]);
}

#[test]
fn decode_start_outside_the_prompt() {
    let err = err_of(PreparedPrompt::from_ids(vec![1, 3, 4], Some(3)));
    assert!(
        matches!(
            err,
            EngineError::Phase(PhaseError::DecodeStartOutsidePrompt {
                decode_start: 3,
                prompt_len: 3
            })
        ),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &["decode start 3", "prompt of 3 tokens", "expected 0..3"],
    );
}

#[test]
fn prompt_plus_budget_longer_than_the_model_allows() {
    let session = good_session();
    let prompt = PreparedPrompt::from_ids(vec![1; 200], None).expect("prompt");
    let err = err_of(Generation::new(
        &session.model,
        prompt,
        Policy::full(6),
        budget(100),
    ));
    assert!(
        matches!(
            err,
            EngineError::PromptTooLong {
                prompt_len: 200,
                max_new_tokens: 100,
                max_positions: 256
            }
        ),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &["200 tokens", "100 new tokens", "256 positions"],
    );
}

#[test]
fn prompt_token_outside_the_vocabulary() {
    let session = good_session();
    let prompt = PreparedPrompt::from_ids(vec![1, 4, 999, 3], None).expect("prompt");
    let mut generation = match Generation::new(&session.model, prompt, Policy::full(6), budget(4)) {
        Ok(g) => g,
        Err(e) => panic!("the generation is set up: {e}"),
    };
    let err = err_of(generation.step(None));
    assert!(
        matches!(
            err,
            EngineError::Model(ModelError::TokenOutOfVocab {
                id: 999,
                position: 2,
                ..
            })
        ),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &["token id 999", "position 2", "vocabulary of 320"],
    );
}

// ---- policies --------------------------------------------------------------

/// Resolve `text` against the model's depth, as the CLI does.
fn resolve_err(session: &Session, text: &str) -> EngineError {
    let layers = session.model.config().num_layers;
    match text.parse::<PolicySpec>().and_then(|s| s.resolve(layers)) {
        Ok(p) => panic!("{text} resolved to {p}"),
        Err(e) => EngineError::from(e),
    }
}

#[test]
fn cut_zero_is_out_of_range() {
    let err = resolve_err(&good_session(), "speed:0+bos");
    assert!(
        matches!(
            err,
            EngineError::Policy(PolicyError::CutOutOfRange {
                l_cut: 0,
                num_layers: 6
            })
        ),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &["L_cut 0", "6 layers", "1..=6"]);
}

#[test]
fn cut_past_the_depth_is_out_of_range() {
    let err = resolve_err(&good_session(), "speed:99+bos");
    assert!(
        matches!(
            err,
            EngineError::Policy(PolicyError::CutOutOfRange {
                l_cut: 99,
                num_layers: 6
            })
        ),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &["L_cut 99", "6 layers", "1..=6"]);
}

#[test]
fn malformed_policy_strings() {
    let session = good_session();
    for (text, reason) in [
        ("speed", "no `:`"),
        ("fast:3", "unknown policy \"fast\""),
        ("speed:+bos", "cutoff is missing"),
        ("speed:x+bos", "neither a layer count nor a fraction"),
        ("speed:3/2", "not in (0, 1]"),
        ("speed:3+eos", "unknown anchor \"eos\""),
        ("selfonly:3+system", "selfonly keeps"),
    ] {
        let err = resolve_err(&session, text);
        assert!(
            matches!(&err, EngineError::Policy(PolicyError::Malformed { text: t, .. }) if t == text),
            "{text}: {err:?}"
        );
        assert_mentions(
            &err.to_string(),
            &[&format!("{text:?}"), reason, "speed:C+bos"],
        );
    }
}

#[test]
fn system_anchors_on_a_prompt_without_system_part() {
    let session = good_session();
    let prompt = PreparedPrompt::from_ids(vec![1, 3, 4, 3, 4], None).expect("prompt");
    let err = err_of(Generation::new(
        &session.model,
        prompt,
        policy("speed:3+system", 6),
        budget(4),
    ));
    assert!(
        matches!(err, EngineError::Policy(PolicyError::SystemAnchorUnknown)),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &["system prompt", "no system message"]);
}

#[test]
fn system_anchors_on_a_raw_text_prompt() {
    let dir = good_copy();
    write(&dir, TOKENIZER, TINY_TOKENIZER);
    let session = load(dir.path()).expect("folder with a tokenizer loads");
    let prompt = session
        .prepare_text("hello world hello", Some("be brief"), true)
        .expect("raw prompt (no chat template)");
    assert_eq!(prompt.system_len, None);
    let err = err_of(Generation::new(
        &session.model,
        prompt,
        policy("speed:3+system", 6),
        budget(4),
    ));
    assert!(
        matches!(err, EngineError::Policy(PolicyError::SystemAnchorUnknown)),
        "{err:?}"
    );
}

#[test]
fn anchors_past_the_decode_start() {
    let session = good_session();
    let prompt = PreparedPrompt::from_ids(vec![1, 3, 4], None).expect("prompt");
    let err = err_of(Generation::new(
        &session.model,
        prompt,
        policy("speed:3+prefix:5", 6),
        budget(4),
    ));
    assert!(
        matches!(
            err,
            EngineError::Phase(PhaseError::AnchorPastDecodeStart {
                anchors: 5,
                decode_start: 2
            })
        ),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &["5 anchor token(s)", "decode start 2"]);
}
