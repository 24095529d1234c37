//! A `tokenizers::Tokenizer` built from a GGUF file's `tokenizer.ggml.*`
//! metadata: byte-level BPE (`gpt2`) with the pre-tokenizer that
//! `tokenizer.ggml.pre` names, a SentencePiece-style vocabulary with
//! scores (`llama`), or Gemma 4's BPE over "▁"-spelled text (`gemma4`),
//! plus its special tokens and chat template.

use std::collections::HashMap;
use std::path::Path;

use lcut_model::gguf::{GgufHeader, MetaValue};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::Replace as ReplaceDecoder;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use crate::error::{EngineError, Result};

mod gemma;

/// GPT-2's split: contractions, letters, numbers, other symbols, spaces.
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's split (`llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split (`qwen35`): Qwen2's, with combining marks joined to
/// the letters they follow and kept out of symbol runs.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's o200k split (`gpt-4o`: gpt-oss) as llama.cpp runs it: words
/// with their case runs and a trailing contraction, numbers of up to three
/// digits, symbols (with a trailing slash or newline run), newline runs,
/// spaces. llama.cpp's form of the tokenizer.json pattern leaves out the
/// combining marks (`\p{M}`) the original puts in words, so a decomposed
/// accent is a symbol here as it is there.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split (`qwen2`): digits one by one.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The splits (applied in order) of each `tokenizer.ggml.pre` lcut knows,
/// as llama.cpp applies them.
fn pre_splits(pre: &str) -> Option<&'static [&'static str]> {
    Some(match pre {
        "default" | "gpt2" | "gpt-2" => &[GPT2_SPLIT],
        // SmolLM, StarCoder: every digit apart, then GPT-2's split
        "smollm" | "starcoder" | "refact" => &[r"\p{N}", GPT2_SPLIT],
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" => &[LLAMA3_SPLIT],
        "qwen2" | "deepseek-r1-qwen" => &[QWEN2_SPLIT],
        "gpt-4o" => &[GPT4O_SPLIT],
        "qwen35" => &[QWEN35_SPLIT],
        _ => return None,
    })
}

/// What the GGUF says about its tokenizer.
pub struct GgufTokenizer {
    /// The tokenizer (special tokens added; BoS added by `encode(.., true)`
    /// when the file asks for it).
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, if any.
    pub chat_template: Option<String>,
    /// Text of the BoS token, if the file names one.
    pub bos_token: Option<String>,
    /// Text of the EoS token, if the file names one.
    pub eos_token: Option<String>,
}

/// Reads tokenizer metadata, naming the file and key in errors.
struct Meta<'a> {
    header: &'a GgufHeader,
    path: &'a Path,
}

impl Meta<'_> {
    fn err(&self, key: &str, reason: String) -> EngineError {
        EngineError::Tokenizer {
            path: self.path.to_path_buf(),
            reason: format!("metadata `{key}`: {reason}"),
        }
    }

    fn get(&self, key: &str) -> Option<&MetaValue> {
        self.header.metadata.get(key)
    }

    fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a string, found {}", v.describe()))),
        }
    }

    fn id(&self, key: &str, vocab: usize) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (n as usize) < vocab => Ok(Some(n as u32)),
                _ => Err(self.err(
                    key,
                    format!("expected a token id below {vocab}, found {}", v.describe()),
                )),
            },
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let bad = || {
            self.err(
                key,
                format!("expected an array of strings, found {}", v.describe()),
            )
        };
        let xs = v.as_array().ok_or_else(bad)?;
        xs.iter()
            .map(|x| x.as_str().ok_or_else(bad))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn numbers(&self, key: &str, len: usize) -> Result<Option<Vec<f64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let bad = || {
            self.err(
                key,
                format!(
                    "expected an array of {len} numbers (one per token), found {}",
                    v.describe()
                ),
            )
        };
        let xs = v.as_array().filter(|xs| xs.len() == len).ok_or_else(bad)?;
        xs.iter()
            .map(|x| x.as_f64().ok_or_else(bad))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// Build the tokenizer a GGUF file describes.
pub fn tokenizer_from_gguf(header: &GgufHeader, path: &Path) -> Result<GgufTokenizer> {
    let m = Meta { header, path };
    let model = m.str("tokenizer.ggml.model")?.ok_or_else(|| {
        m.err(
            "tokenizer.ggml.model",
            "missing: the file has no tokenizer".into(),
        )
    })?;
    let tokens = m.strings("tokenizer.ggml.tokens")?.ok_or_else(|| {
        m.err(
            "tokenizer.ggml.tokens",
            "missing: the file has no vocabulary".into(),
        )
    })?;
    let n = tokens.len();
    let types: Vec<u64> = match m.numbers("tokenizer.ggml.token_type", n)? {
        Some(t) => t.iter().map(|&x| x as u64).collect(),
        None => vec![1; n],
    };
    let arch = m.str("general.architecture")?.unwrap_or_default();
    let (mut tokenizer, byte_level) = match model {
        "gpt2" => (byte_level_bpe(&m, &tokens)?, true),
        "llama" if gemma::is_gemma(arch) => {
            let spelled = gemma::spelled_tokens(&tokens);
            (gemma::gemma_bpe(&m, &spelled)?, false)
        }
        "llama" => (sentencepiece_bpe(&m, &tokens)?, false),
        "gemma4" => (gemma::gemma4_bpe(&m, &tokens)?, false),
        other => {
            return Err(m.err(
                "tokenizer.ggml.model",
                format!(
                    "{other:?} is not supported (lcut reads gpt2, llama and gemma4 vocabularies)"
                ),
            ));
        }
    };
    add_special_tokens(&m, &mut tokenizer, &tokens, &types, byte_level)?;
    let bos = m.id("tokenizer.ggml.bos_token_id", n)?;
    let eos = m.id("tokenizer.ggml.eos_token_id", n)?;
    let add_bos = match m.get("tokenizer.ggml.add_bos_token") {
        Some(v) => v.as_bool().ok_or_else(|| {
            m.err(
                "tokenizer.ggml.add_bos_token",
                format!("expected true or false, found {}", v.describe()),
            )
        })?,
        // llama.cpp adds BoS to a SentencePiece vocabulary that does not say otherwise
        None => model == "llama",
    };
    // and always to Gemma 4's, whatever the file says
    let add_bos = add_bos || model == "gemma4";
    if let (true, Some(id)) = (add_bos, bos) {
        let text = tokens[id as usize].to_string();
        let key = "tokenizer.ggml.bos_token_id";
        let mut builder = TemplateProcessing::builder();
        builder
            .try_single(format!("{text}:0 $A:0"))
            .map_err(|e| m.err(key, e))?;
        builder.special_tokens(vec![(text.clone(), id)]);
        let post = builder.build().map_err(|e| m.err(key, e.to_string()))?;
        tokenizer.with_post_processor(Some(post));
    }
    Ok(GgufTokenizer {
        tokenizer,
        chat_template: m.str("tokenizer.chat_template")?.map(str::to_string),
        bos_token: bos.map(|id| tokens[id as usize].to_string()),
        eos_token: eos.map(|id| tokens[id as usize].to_string()),
    })
}

fn tokenizer_error(m: &Meta<'_>, key: &str) -> impl Fn(tokenizers::Error) -> EngineError {
    move |e| EngineError::Tokenizer {
        path: m.path.to_path_buf(),
        reason: format!("building the tokenizer from `{key}`: {e}"),
    }
}

/// Byte-level BPE: the vocabulary spelled in GPT-2's byte alphabet, the
/// file's merges, the split `tokenizer.ggml.pre` names.
fn byte_level_bpe(m: &Meta<'_>, tokens: &[&str]) -> Result<Tokenizer> {
    let alphabet = byte_alphabet();
    let spelled: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = if t.chars().all(|c| alphabet.contains_key(&c)) {
                t.to_string()
            } else {
                t.bytes().map(byte_char).collect()
            };
            (t, i as u32)
        })
        .collect();
    let merges = m.strings("tokenizer.ggml.merges")?.ok_or_else(|| {
        m.err(
            "tokenizer.ggml.merges",
            "missing: a gpt2 vocabulary needs its merges".into(),
        )
    })?;
    let merges = merges
        .iter()
        .map(|line| {
            line.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    m.err(
                        "tokenizer.ggml.merges",
                        format!("{line:?} is not two tokens"),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(spelled, merges)
        .build()
        .map_err(tokenizer_error(m, "tokenizer.ggml.merges"))?;
    let pre = m.str("tokenizer.ggml.pre")?.unwrap_or("default");
    let splits = pre_splits(pre).ok_or_else(|| {
        m.err(
            "tokenizer.ggml.pre",
            format!("{pre:?} is not a pre-tokenizer lcut knows (default, smollm, llama-bpe, qwen2, starcoder)"),
        )
    })?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for split in splits {
        let s = Split::new(
            SplitPattern::Regex((*split).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tokenizer_error(m, "tokenizer.ggml.pre"))?;
        steps.push(s.into());
    }
    steps.push(ByteLevel::new(false, true, false).into());
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(PreSequence::new(steps)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}

/// SentencePiece-style BPE: merges recovered from the scores (every split of
/// a token into two vocabulary tokens, best-scored first), byte fallback,
/// "▁" for spaces with one prepended to the text.
fn sentencepiece_bpe(m: &Meta<'_>, tokens: &[&str]) -> Result<Tokenizer> {
    let scores = m
        .numbers("tokenizer.ggml.scores", tokens.len())?
        .ok_or_else(|| {
            m.err(
                "tokenizer.ggml.scores",
                "missing: a llama vocabulary needs its scores".into(),
            )
        })?;
    let index: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let merges = match m.strings("tokenizer.ggml.merges")? {
        Some(lines) => lines
            .iter()
            .filter_map(|l| l.split_once(' '))
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        None => merges_from_scores(tokens, &scores, &index),
    };
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(tokenizer_error(m, "tokenizer.ggml.tokens"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, false)));
    let decoders: Vec<DecoderWrapper> = vec![
        ReplaceDecoder::new("▁", " ")
            .map_err(tokenizer_error(m, "tokenizer.ggml.tokens"))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', 1, 0).into(),
    ];
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Merges implied by a scored vocabulary, as Hugging Face derives them:
/// each token's splits into two known tokens, ordered by the token's score
/// (highest first), then by the lengths of the two parts.
fn merges_from_scores(
    tokens: &[&str],
    scores: &[f64],
    index: &HashMap<&str, usize>,
) -> Vec<(String, String)> {
    // (left, right, score, left length, right length), lengths in characters
    let mut merges: Vec<(&str, &str, f64, usize, usize)> = Vec::new();
    for (token, &score) in tokens.iter().zip(scores) {
        let mut local = Vec::new();
        for (chars, (at, _)) in token.char_indices().enumerate().skip(1) {
            let (l, r) = token.split_at(at);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                local.push((l, r, score, li, ri, chars));
            }
        }
        local.sort_by_key(|&(_, _, _, li, ri, _)| (li, ri));
        let total = token.chars().count();
        merges.extend(
            local
                .into_iter()
                .map(|(l, r, s, _, _, chars)| (l, r, s, chars, total - chars)),
        );
    }
    // stable sort, descending by (score, left length, right length)
    merges.sort_by(|a, b| {
        (b.2, b.3, b.4)
            .partial_cmp(&(a.2, a.3, a.4))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    merges
        .into_iter()
        .map(|(l, r, ..)| (l.to_string(), r.to_string()))
        .collect()
}

/// Tokens the file marks CONTROL (3) become special tokens, USER_DEFINED (4)
/// plain added tokens, so that both stay whole in text. In a byte-level
/// vocabulary a control token spelled outside the byte alphabet is a
/// mislabel and is left out; a user-defined token is added only as the
/// vocabulary spells it (as transformers does: Gemma's runs of spaces,
/// spelled with "▁" in the vocabulary, are not added as raw spaces).
fn add_special_tokens(
    m: &Meta<'_>,
    tokenizer: &mut Tokenizer,
    tokens: &[&str],
    types: &[u64],
    byte_level: bool,
) -> Result<()> {
    let alphabet = byte_alphabet();
    let spelled = |t: &str| !byte_level || t.chars().all(|c| alphabet.contains_key(&c));
    let control: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(t, ty)| **ty == 3 && spelled(t))
        .map(|(t, _)| AddedToken::from(t.to_string(), true).normalized(false))
        .collect();
    tokenizer
        .add_special_tokens(control)
        .map_err(tokenizer_error(m, "tokenizer.ggml.token_type"))?;
    let user: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(t, ty)| **ty == 4 && tokenizer.token_to_id(t).is_some())
        .map(|(t, _)| AddedToken::from(t.to_string(), false).normalized(false))
        .collect();
    tokenizer
        .add_tokens(user)
        .map_err(tokenizer_error(m, "tokenizer.ggml.token_type"))?;
    Ok(())
}

/// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves,
/// the others for code points from 256 on.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

fn byte_alphabet() -> HashMap<char, u8> {
    (0..=255u8).map(|b| (byte_char(b), b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        assert_eq!(byte_char(b'A'), 'A');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_alphabet().len(), 256);
    }

    #[test]
    fn merges_from_scores_prefer_high_scores() {
        let tokens = ["a", "b", "c", "ab", "abc", "bc"];
        let scores = [0.0, 0.0, 0.0, -1.0, -3.0, -2.0];
        let index = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
        let merges = merges_from_scores(&tokens, &scores, &index);
        let pairs: Vec<(&str, &str)> = merges
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]
        );
    }
}
