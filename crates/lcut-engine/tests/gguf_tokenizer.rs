//! A SentencePiece-style GGUF vocabulary (`tokenizer.ggml.model = llama`:
//! pieces with scores, no merges, byte fallback), as llama.cpp's converter
//! writes it, tokenized as transformers' GGUF tokenizer does
//! (`fixtures/oracle/llama-gqa/tokenize.jsonl`, made by
//! `fixtures/oracle/hf_gguf_tokenize.py`). The byte-level BPE path is checked
//! on the real model (tests/real_model.rs).

use anyhow::{Context, Result, ensure};
use lcut_engine::TextTokenizer;
use lcut_model::gguf::{GgufFile, GgufHeader};
use lcut_testkit::oracle_case;
use serde_json::Value;

/// Every `{"text", "ids"}` line of `jsonl` tokenized by `tok` (special
/// tokens parsed) gives `reference`'s ids, on at least `min` strings.
fn tokenizes_as(
    tok: &TextTokenizer,
    jsonl: &std::path::Path,
    reference: &str,
    min: usize,
) -> Result<()> {
    let text = std::fs::read_to_string(jsonl)?;
    let mut wrong = Vec::new();
    let mut count = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let item: Value = serde_json::from_str(line)?;
        let s = item["text"].as_str().context("text")?;
        let expected: Vec<u32> = item["ids"]
            .as_array()
            .context("ids")?
            .iter()
            .filter_map(|x| x.as_u64().map(|n| n as u32))
            .collect();
        let ours = tok.encode_with_special_tokens(s)?;
        if ours != expected {
            wrong.push(format!("{s:?}: lcut {ours:?}, {reference} {expected:?}"));
        }
        count += 1;
    }
    ensure!(count >= min, "only {count} strings");
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

#[test]
fn sentencepiece_vocabulary_tokenizes_as_transformers() -> Result<()> {
    let dir = oracle_case("llama-gqa");
    let path = dir.join("model.f32.gguf");
    let file = GgufFile::open(&path)?;
    let tok = TextTokenizer::from_gguf(file.header(), &path)?;
    tokenizes_as(&tok, &dir.join("tokenize.jsonl"), "transformers", 30)?;
    ensure!(
        tok.bos_token.as_deref() == Some("<s>"),
        "BoS {:?}",
        tok.bos_token
    );
    Ok(())
}

#[test]
fn a_gguf_without_tokenizer_metadata_is_named() -> Result<()> {
    let mut bytes = std::fs::read(oracle_case("llama-gqa").join("model.f32.gguf"))?;
    // rename the vocabulary key so that the file has none
    let key = b"tokenizer.ggml.tokens";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .context("key in fixture")?;
    bytes[at + key.len() - 1] = b'z';
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, &bytes)?;
    let file = GgufFile::open(&path)?;
    let err = TextTokenizer::from_gguf(file.header(), &path)
        .err()
        .context("a GGUF without a vocabulary must be refused")?;
    let msg = err.to_string();
    ensure!(
        msg.contains("tokenizer.ggml.tokens") && msg.contains(&path.display().to_string()),
        "{msg}"
    );
    Ok(())
}

/// Damaged GGUF metadata never makes the tokenizer builder panic: every
/// mutant whose header parses is turned into a tokenizer or refused.
#[test]
fn mutated_tokenizer_metadata_never_panics() -> Result<()> {
    let path = oracle_case("llama-gqa").join("model.f32.gguf");
    let good = std::fs::read(&path)?;
    let header_len = GgufHeader::parse(&good, &path)?.header_len;
    let (mut built, mut tried) = (0, 0);
    for (i, bytes) in lcut_testkit::mutants(&good, header_len, 7)
        .take(3000)
        .enumerate()
    {
        let Ok(header) = GgufHeader::parse(&bytes, &path) else {
            continue;
        };
        tried += 1;
        let result = std::panic::catch_unwind(|| {
            TextTokenizer::from_gguf(&header, &path).map(|t| t.encode("hello world 42").is_ok())
        });
        match result {
            Ok(Ok(true)) => built += 1,
            Ok(_) => {}
            Err(_) => anyhow::bail!("mutant {i} made the tokenizer builder panic"),
        }
    }
    eprintln!("{tried} parsed mutants: {built} built a working tokenizer, the rest were refused");
    ensure!(tried > 100);
    Ok(())
}

/// Gemma 4's vocabulary (`tokenizer.ggml.model = gemma4`: BPE over
/// "▁"-spelled text with merges, newline runs apart, byte tokens) tokenized
/// as llama.cpp's own `llama-tokenize` does
/// (`fixtures/oracle/gemma4-vocab/tokenize.jsonl`, made by
/// `fixtures/oracle/gemma4_tokenize.py`), BoS added as llama.cpp always
/// adds it to this vocabulary.
#[test]
fn gemma4_vocabulary_tokenizes_as_llama_cpp() -> Result<()> {
    let dir = oracle_case("gemma4-vocab");
    let path = dir.join("vocab.gguf");
    let bytes = std::fs::read(&path)?;
    let header = GgufHeader::parse(&bytes, &path)?;
    let tok = TextTokenizer::from_gguf(&header, &path)?;
    tokenizes_as(&tok, &dir.join("tokenize.jsonl"), "llama.cpp", 40)
}

/// A byte-level BPE vocabulary under the splits llama.cpp's converter
/// writes for the newer families, tokenized as llama.cpp's own
/// `llama-tokenize` does (`fixtures/oracle/{gpt4o,qwen35}-vocab/tokenize.jsonl`,
/// made by `fixtures/oracle/bpe_split_tokenize.py`): `gpt-4o` (gpt-oss:
/// case runs, contractions, numbers in threes, symbols with trailing
/// slashes and newlines) and `qwen35` (Qwen3.5: Qwen2's split with
/// combining marks joined to their letters; a merge across a letter and its
/// mark is taken, where Qwen2's split would not).
#[test]
fn newer_bpe_splits_tokenize_as_llama_cpp() -> Result<()> {
    for case in ["gpt4o-vocab", "qwen35-vocab"] {
        let dir = oracle_case(case);
        let path = dir.join("vocab.gguf");
        let bytes = std::fs::read(&path)?;
        let header = GgufHeader::parse(&bytes, &path)?;
        let tok = TextTokenizer::from_gguf(&header, &path)?;
        tokenizes_as(&tok, &dir.join("tokenize.jsonl"), "llama.cpp", 49)
            .with_context(|| case.to_string())?;
    }
    Ok(())
}
