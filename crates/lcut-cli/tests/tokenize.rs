//! `lcut tokenize` reads only the tokenizer: it works on a model folder
//! whose weights are missing or garbage, gives the ids the loaded model's
//! session gives, and on the real model the ids transformers and llama.cpp
//! give (`fixtures/real/smollm2`).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Device};
use serde_json::Value;

/// `lcut tokenize ARGS... --model MODEL TEXT`: stdout, or the failure.
fn tokenize(model: &Path, args: &[&str], text: &str) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .arg("tokenize")
        .args(args)
        .arg("--model")
        .arg(model)
        .arg(text)
        .output()?;
    ensure!(
        out.status.success(),
        "lcut tokenize {args:?} on {}: {}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The ids on the last line of `lcut tokenize`'s output.
fn last_line_ids(out: &str) -> Result<Vec<u32>> {
    let line = out.lines().last().context("no output")?;
    if line.is_empty() {
        return Ok(vec![]);
    }
    Ok(line.split(',').map(str::parse).collect::<Result<_, _>>()?)
}

fn bundled() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/copy-full")
}

#[test]
fn tokenize_needs_no_weights_and_gives_the_sessions_ids() -> Result<()> {
    let model = bundled();
    let session = lcut_engine::Session::load(&model, DType::F32, &Device::Cpu)?;
    let tok = session.tokenizer.as_ref().context("bundled tokenizer")?;
    // the same folder without weights, and with garbage in their place
    let missing = tempfile::tempdir()?;
    let garbage = tempfile::tempdir()?;
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(model.join(name), missing.path().join(name))?;
        std::fs::copy(model.join(name), garbage.path().join(name))?;
    }
    std::fs::write(
        garbage.path().join("model.safetensors"),
        b"not a safetensors file",
    )?;
    for text in ["copy : a b c", "the quick brown fox", "<s> abc <|eot|>"] {
        let raw = tok.encode_with_special_tokens(text)?;
        let chat = session.prepare_text(text, None, true)?.ids;
        ensure!(chat != raw, "the chat form differs from the raw one");
        for dir in [model.as_path(), missing.path(), garbage.path()] {
            let out = tokenize(dir, &[], text)?;
            ensure!(last_line_ids(&out)? == raw, "{text:?} in {}", dir.display());
            let out = tokenize(dir, &["--chat"], text)?;
            ensure!(last_line_ids(&out)? == chat, "--chat {text:?}");
            let verbose = tokenize(dir, &["--verbose"], text)?;
            ensure!(verbose.lines().count() == raw.len() + 1, "{verbose}");
            let pieces = tok.token_pieces(&raw);
            let strings = tok.token_strings(&raw);
            for (line, i) in verbose.lines().zip(0..raw.len()) {
                ensure!(
                    line == format!("{}\t{:?}\t{:?}", raw[i], pieces[i], strings[i]),
                    "verbose line {i}: {line}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_folder_without_a_tokenizer_is_a_named_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::copy(
        bundled().join("config.json"),
        dir.path().join("config.json"),
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(["tokenize", "--model"])
        .arg(dir.path())
        .arg("abc")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "succeeded without a tokenizer");
    ensure!(
        err.contains("tokenizer.json") && err.contains(&dir.path().display().to_string()),
        "{err}"
    );
    ensure!(!err.contains("panicked"), "{err}");
    Ok(())
}

fn ids(v: &Value) -> Result<Vec<u32>> {
    v.as_array()
        .context("ids")?
        .iter()
        .map(|x| x.as_u64().map(|n| n as u32).context("id"))
        .collect()
}

/// On SmolLM2's GGUF: raw text gives llama.cpp's ids, `--chat` gives
/// transformers' ids of the rendered chat (system prompt of the template).
#[test]
fn tokenize_the_real_model_as_llama_cpp_and_transformers() -> Result<()> {
    let Some(model) = lcut_testkit::real_model() else {
        return Ok(());
    };
    let reference = lcut_testkit::real_reference();
    let corpus = std::fs::read_to_string(reference.join("tokenize.jsonl"))?;
    for line in corpus.lines().filter(|l| !l.trim().is_empty()).take(12) {
        let item: Value = serde_json::from_str(line)?;
        let text = item["text"].as_str().context("text")?;
        if text.is_empty() {
            continue;
        }
        let out = tokenize(&model, &[], text)?;
        ensure!(
            last_line_ids(&out)? == ids(&item["ids_llama_cpp"])?,
            "{text:?}"
        );
    }
    let chats = std::fs::read_to_string(reference.join("chat.jsonl"))?;
    let mut checked = 0;
    for line in chats.lines().filter(|l| !l.trim().is_empty()) {
        let item: Value = serde_json::from_str(line)?;
        let messages = item["messages"].as_array().context("messages")?;
        // one user message: what `--chat` renders
        let [m] = messages.as_slice() else { continue };
        if m["role"] != "user" {
            continue;
        }
        let user = m["content"].as_str().context("content")?;
        let out = tokenize(&model, &["--chat"], user)?;
        ensure!(
            last_line_ids(&out)? == ids(&item["ids"])?,
            "--chat {user:?}"
        );
        checked += 1;
    }
    ensure!(checked > 0, "no one-message chat in chat.jsonl");
    Ok(())
}
