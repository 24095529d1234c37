//! `lcut forward` end to end: the user's "run with cache" to safetensors
//! gives the reference tensors of Hugging Face transformers.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use candle_core::{DType, Device, Tensor};

use lcut_testkit::oracle_case as case;

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn run_forward(model: &Path, ids: &[u32], extra: &[&str], out: &Path) {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let status = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .arg("forward")
        .arg("--model")
        .arg(model)
        .arg("--ids")
        .arg(ids.join(","))
        .args(extra)
        .arg("--out")
        .arg(out)
        .output()
        .expect("lcut runs");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// The reference tensors of a case and its token ids.
fn reference(dir: &Path) -> (HashMap<String, Tensor>, Vec<u32>) {
    let reference =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap();
    let ids = reference["input_ids"]
        .to_dtype(DType::U32)
        .unwrap()
        .to_vec1()
        .unwrap();
    (reference, ids)
}

#[test]
fn forward_writes_the_reference_layout() {
    let dir = case("qwen3-qknorm");
    let (reference, ids) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("full.safetensors");
    run_forward(&dir, &ids, &[], &out);
    let ours = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    assert!(max_diff(&ours["logits"], &reference["logits"]) <= 1e-4);
    for l in 0..6 {
        for key in [format!("layer_out.{l}"), format!("attn.{l}")] {
            assert!(max_diff(&ours[&key], &reference[&key]) <= 1e-4, "{key}");
        }
    }
    assert!(
        !tmp.path().join("full.partial").exists(),
        "temporary file left behind"
    );
}

#[test]
fn forward_under_a_policy_gives_the_policy_logits() {
    let dir = case("llama-gqa");
    let (reference, ids) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("speed.safetensors");
    run_forward(
        &dir,
        &ids,
        &["--policy", "speed:2+bos", "--decode-start", "28"],
        &out,
    );
    let ours = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    assert!(max_diff(&ours["logits"], &reference["logits.speed.l2.bos"]) <= 1e-4);
}

#[test]
fn forward_under_slim_policies_that_reduce_to_speed_gives_speeds_reference_logits() {
    // one kept block of one token is SPEED+BoS; transformers' SPEED rows are the reference
    let dir = case("llama-gqa");
    let (reference, ids) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    for (cut, key) in [(2, "logits.speed.l2.bos"), (4, "logits.speed.l4.bos")] {
        let out = tmp.path().join(format!("slim{cut}.safetensors"));
        let policy = format!("slim:{cut}@1+block:1");
        run_forward(
            &dir,
            &ids,
            &["--policy", &policy, "--decode-start", "28"],
            &out,
        );
        let ours = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
        assert!(
            max_diff(&ours["logits"], &reference[key]) <= 1e-4,
            "{policy}"
        );
    }
}

#[test]
fn bad_requests_fail_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.safetensors");
    for (args, expected) in [
        (vec!["--policy", "speed:9+bos"], "out of range"),
        (vec!["--policy", "fast:2"], "malformed policy"),
        (vec!["--policy", "slim:2@50%+unit:3"], "unit 3 must divide"),
        (
            vec!["--policy", "slim:6@50%"],
            "SlimInfer cut layer 6 is out of range",
        ),
        (
            vec!["--policy", "speed:2+bos", "--decode-start", "50"],
            "decode start 50",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_lcut"))
            .args(["forward", "--model"])
            .arg(case("llama-gqa"))
            .args(["--ids", "1,5,9,11"])
            .args(&args)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!out.exists());
}

/// `lcut CMD --help`, as a user reads it.
fn help(cmd: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args([cmd, "--help"])
        .output()
        .expect("lcut runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_help_says_how_each_command_splits_the_ids_at_the_decode_start() {
    let forward = help("forward");
    for says in [
        "query window ends at S",
        "continuation step",
        "rows S..T-1 only (T-S rows",
        "`decode_start` = S",
        "`lcut generate --ids` reads S",
    ] {
        assert!(
            forward.contains(says),
            "forward --help lacks {says:?}:\n{forward}"
        );
    }
    let generate = help("generate");
    for says in [
        "generation continues after the last id",
        "query window ends at the last id",
        "not at S",
        "`lcut forward --decode-start S`",
        "agree only when S is the last id",
    ] {
        assert!(
            generate.contains(says),
            "generate --help lacks {says:?}:\n{generate}"
        );
    }
}

/// What `lcut forward --help` promises for SlimInfer: the rows from S on,
/// the window ending at S, so that row 0 is the first-token logits of a
/// generation whose prompt ends at S (how `lcut generate --ids` reads a
/// decode start at its last id), and the later rows continue from there.
#[test]
fn forward_under_slim_writes_the_rows_from_the_decode_start_on() {
    use lcut_engine::{Generation, GenerationConfig, PreparedPrompt};
    let dir = case("llama-gqa");
    let (_, ids) = reference(&dir);
    let s = 28;
    let policy = "slim:2@50%,4@25%+block:4";
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("slim.safetensors");
    run_forward(
        &dir,
        &ids,
        &["--policy", policy, "--decode-start", "28"],
        &out,
    );
    let ours = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    let logits = &ours["logits"];
    assert_eq!(logits.dims()[0], ids.len() - s, "rows S..T-1");
    let start: Vec<i64> = ours["decode_start"].to_vec1().unwrap();
    assert_eq!(start, [s as i64]);

    let session = lcut_engine::Session::load(&dir, DType::F32, &Device::Cpu).unwrap();
    let resolved = policy
        .parse::<lcut_policy::PolicySpec>()
        .unwrap()
        .resolve(session.model.config().num_layers)
        .unwrap();
    let first_token_logits = |prompt: &[u32]| {
        let prompt = PreparedPrompt::from_ids(prompt.to_vec(), None).unwrap();
        let config = GenerationConfig {
            max_new_tokens: 1,
            ..GenerationConfig::default()
        };
        let mut g = Generation::new(&session.model, prompt, resolved, config).unwrap();
        g.step(None).unwrap().unwrap().logits
    };
    let row = |k: usize| logits.get(k).unwrap();
    let at_s = first_token_logits(&ids[..=s]);
    assert!(max_diff(&row(0), &at_s) <= 1e-5, "row 0 is position S");
    // a prompt that ends later puts the window elsewhere: the rows after S
    // are a continuation, not a longer prompt's first token
    let last = ids.len() - 1;
    let whole = first_token_logits(&ids);
    let continued = max_diff(&row(last - s), &whole);
    assert!(
        continued > 1e-2,
        "forward's last row equals a prompt ending there (max diff {continued:.3e})"
    );
}

/// `--lens` adds `lens_logprob` [layers + 1, T]: transformers' logit lens
/// (`fixtures/oracle/lens_reference.py`) of the token the last layer ranks
/// first, at every hidden state and position.
#[test]
fn forward_lens_writes_transformers_lens() {
    let dir = case("gemma2-softcap");
    let (_, ids) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.safetensors");
    run_forward(&dir, &ids, &["--lens", "--no-attention"], &out);
    let ours = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    let theirs =
        candle_core::safetensors::load(dir.join("lens.safetensors"), &Device::Cpu).unwrap();
    let diff = max_diff(&ours["lens_logprob"], &theirs["logprob"]);
    assert!(
        diff <= 1e-4,
        "lens_logprob differs from transformers by {diff}"
    );
}

/// A bare decoder (no final norm, no LM head in its files) has no lens: the
/// refusal names the missing tensor and says why.
#[test]
fn a_lens_of_a_bare_decoder_is_refused() {
    let tmp = lcut_testkit::model_copy("llama-gqa").unwrap();
    let weights = tmp.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
    assert!(tensors.remove("model.norm.weight").is_some());
    assert!(tensors.remove("lm_head.weight").is_some());
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(["forward", "--lens", "--ids", "1,5,9", "--model"])
        .arg(tmp.path())
        .arg("--out")
        .arg(tmp.path().join("out.safetensors"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    lcut_testkit::assert_mentions(
        &msg,
        &[
            "`model.norm.weight`",
            "final norm",
            "logit lens",
            "bare decoder",
        ],
    );
    assert!(!tmp.path().join("out.safetensors").exists());
}
