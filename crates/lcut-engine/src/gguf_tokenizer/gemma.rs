//! Gemma's SentencePiece vocabulary (GGUF `llama` tokenizer of a Gemma
//! architecture), built as transformers builds it from a GGUF file: the
//! tokens of two or more spaces spelled with "▁" (the file stores them as
//! real spaces), merges recovered from the vocabulary in file order (Gemma's
//! scores do not follow its merge order), spaces turned into "▁" by a
//! normalizer with no space prepended, byte fallback. And Gemma 4's (GGUF
//! `gemma4`), as llama.cpp runs it: the same with the file's merges, the
//! text split into lines and runs of newlines first, a word that is a token
//! taken whole.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{DecoderWrapper, SplitDelimiterBehavior, Tokenizer};

use super::{Meta, merges_from_scores, tokenizer_error};
use crate::error::Result;

/// The architectures (`general.architecture`) whose `llama` vocabulary is
/// Gemma's.
pub(super) fn is_gemma(arch: &str) -> bool {
    matches!(arch, "gemma" | "gemma2" | "gemma3")
}

/// A token of spaces alone (other whitespace allowed beside them, as
/// Python's `str.strip` sees it) spelled as that many "▁".
fn respelled(token: &str) -> String {
    let python_space = |c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c);
    if token.contains(' ') && token.chars().all(python_space) {
        "▁".repeat(token.chars().count())
    } else {
        token.to_string()
    }
}

/// The vocabulary as the tokenizer spells it (see [`respelled`]).
pub(super) fn spelled_tokens(tokens: &[&str]) -> Vec<String> {
    tokens.iter().map(|t| respelled(t)).collect()
}

/// Gemma's tokenizer over the vocabulary `spelled` (from
/// [`spelled_tokens`]).
pub(super) fn gemma_bpe(m: &Meta<'_>, spelled: &[String]) -> Result<Tokenizer> {
    let n = spelled.len();
    let refs: Vec<&str> = spelled.iter().map(String::as_str).collect();
    let merges = match m.strings("tokenizer.ggml.merges")? {
        Some(lines) => split_merges(&lines),
        None => {
            let index: HashMap<&str, usize> =
                refs.iter().enumerate().map(|(i, t)| (*t, i)).collect();
            // earlier tokens merge first
            let order: Vec<f64> = (0..n).map(|i| -(i as f64)).collect();
            merges_from_scores(&refs, &order, &index)
        }
    };
    let key = "tokenizer.ggml.tokens";
    let split = Split::new(
        SplitPattern::String(" ".into()),
        SplitDelimiterBehavior::MergedWithPrevious,
        false,
    )
    .map_err(tokenizer_error(m, key))?;
    metaspace_bpe(m, spelled, merges, split, false)
}

/// Gemma 4's tokenizer (`tokenizer.ggml.model` `gemma4`) over the file's
/// tokens and merges, as llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GEMMA4` runs
/// it: spaces written as "▁", the text split into lines and runs of
/// newlines, each piece merged by rank (a piece that is itself a token
/// taken whole: llama.cpp does so for runs of newlines, whose merges Gemma
/// 4's vocabulary lacks; for a whole line it differs only where a line is
/// a token that no merge reaches), "<0xXX>" tokens for what is left.
pub(super) fn gemma4_bpe(m: &Meta<'_>, tokens: &[&str]) -> Result<Tokenizer> {
    let key = "tokenizer.ggml.merges";
    let lines = m
        .strings(key)?
        .ok_or_else(|| m.err(key, "missing: a gemma4 vocabulary needs its merges".into()))?;
    let spelled: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    let lines_and_newlines = Split::new(
        SplitPattern::Regex(r"\n+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tokenizer_error(m, key))?;
    metaspace_bpe(m, &spelled, split_merges(&lines), lines_and_newlines, true)
}

/// Merge lines ("a b") as pairs; a line without a space is skipped, as
/// llama.cpp skips it.
fn split_merges(lines: &[&str]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// A BPE over `spelled` with `merges` and byte fallback, spaces turned into
/// "▁" before `pre_tokenizer` splits the text (nothing prepended), decoded
/// back; `whole_words`: a piece that is a token is not merged.
fn metaspace_bpe(
    m: &Meta<'_>,
    spelled: &[String],
    merges: Vec<(String, String)>,
    pre_tokenizer: Split,
    whole_words: bool,
) -> Result<Tokenizer> {
    let n = spelled.len();
    let vocab: Vocab = spelled
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .ignore_merges(whole_words);
    if let Some(unk) = m.id("tokenizer.ggml.unknown_token_id", n)? {
        builder = builder.unk_token(spelled[unk as usize].clone());
    }
    let key = "tokenizer.ggml.tokens";
    let bpe = builder.build().map_err(tokenizer_error(m, key))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let spaces = Replace::new(" ", "▁").map_err(tokenizer_error(m, key))?;
    tokenizer
        .with_normalizer(Some(spaces))
        .map_err(tokenizer_error(m, key))?;
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    let decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ")
            .map_err(tokenizer_error(m, key))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_spaces_are_spelled_with_the_metaspace() {
        assert_eq!(respelled("   "), "▁▁▁");
        assert_eq!(respelled(" \n"), "▁▁");
        assert_eq!(respelled("\n\n"), "\n\n");
        assert_eq!(respelled(" a"), " a");
    }
}
