//! The synthetic tokenizer every written model carries: byte-level BPE
//! (GPT-2's byte alphabet, so any text tokenizes), merges that make tokens
//! of common English words, the shape's special tokens at their ids, and
//! filler tokens up to the vocabulary size. Written as a Hugging Face
//! `tokenizer.json` and as GGUF `tokenizer.ggml.*` metadata (`gpt2`), which
//! both lcut and llama.cpp load.

use serde_json::{Map, Value, json};

use crate::error::{Result, SynthError};
use crate::shapes::{Family, ModelShape};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary token.
    Normal = 1,
    /// A control token (BoS, EoS).
    Control = 3,
    /// A token no text produces (the fillers).
    Unused = 5,
}

/// Words whose tokens the merges build, with and without a leading space.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be",
    "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which",
    "one", "you", "were", "all", "there", "would", "their", "we", "been", "has", "when", "who",
    "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than",
    "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then",
    "do", "first", "any", "my", "now", "such", "like", "our", "over", "model", "layer", "token",
    "prompt", "answer", "question", "number", "code", "text", "word", "list", "name", "value",
    "key", "line", "after", "before", "where",
];

/// The vocabulary: token strings by id, their types, and the merges.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocabulary {
    /// Token strings, by id (byte-level encoded, as GPT-2 stores them).
    pub tokens: Vec<String>,
    /// Token types, by id.
    pub types: Vec<TokenType>,
    /// BPE merges in rank order, `"left right"`.
    pub merges: Vec<String>,
    /// The special tokens: id and text.
    pub specials: Vec<(u32, String)>,
}

/// GPT-2's map from bytes to printable characters.
pub fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    // the others take 256, 257, ... in byte order
    let rank = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// The byte-level form of a text.
fn byte_level(text: &str) -> String {
    text.bytes().map(byte_char).collect()
}

/// The special tokens of a shape (BoS, EoS and pad, each once), named as
/// its checkpoint names them.
fn special_texts(shape: &ModelShape) -> Vec<(u32, String)> {
    let t = shape.tokens;
    let (bos, eos) = match (shape.family(), t.bos) {
        (Family::Qwen2 | Family::Qwen3Moe | Family::Qwen35 | Family::Qwen35Moe, _) => {
            ("<|endoftext|>", "<|im_end|>")
        }
        (Family::Smollm3, _) => ("<|begin_of_text|>", "<|im_end|>"),
        (Family::GptOss, _) => ("<|startoftext|>", "<|return|>"),
        (Family::Olmo, _) => ("<|endoftext|>", "<|endoftext|>"),
        (Family::Llama, 128_000) => ("<|begin_of_text|>", "<|end_of_text|>"),
        (Family::Gemma4, _) => ("<bos>", "<eos>"),
        (Family::Llama | Family::Mixtral, _) => ("<s>", "</s>"),
    };
    let mut out: Vec<(u32, String)> = vec![];
    let pad = match shape.family() {
        Family::Gemma4 => "<pad>",
        _ => "<|pad|>",
    };
    for (id, text) in [(Some(t.bos), bos), (Some(t.eos), eos), (t.pad, pad)] {
        if let Some(id) = id
            && !out.iter().any(|(i, _)| *i == id)
        {
            out.push((id, text.to_string()));
        }
    }
    out
}

impl Vocabulary {
    /// The vocabulary of `shape`: specials at their ids, the 256 byte
    /// tokens at the first free ids, then as many word tokens as fit, then
    /// fillers. Refused when the vocabulary cannot hold the bytes.
    pub fn for_shape(shape: &ModelShape) -> Result<Self> {
        let size = shape.sizes.vocab_size;
        let specials = special_texts(shape);
        let needed = 256 + specials.len();
        if size < needed || specials.iter().any(|(id, _)| *id as usize >= size) {
            return Err(SynthError::VocabTooSmall {
                vocab: size,
                needed: needed.max(
                    specials
                        .iter()
                        .map(|(id, _)| *id as usize + 1)
                        .max()
                        .unwrap_or(0),
                ),
            });
        }
        let mut slots: Vec<Option<(String, TokenType)>> = vec![None; size];
        for (id, text) in &specials {
            slots[*id as usize] = Some((text.clone(), TokenType::Control));
        }
        let mut free = (0..size)
            .filter(|&i| slots[i].is_none())
            .collect::<Vec<_>>()
            .into_iter();
        let mut known = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let s = byte_char(b).to_string();
            known.insert(s.clone());
            if let Some(i) = free.next() {
                slots[i] = Some((s, TokenType::Normal));
            }
        }
        let mut merges = Vec::new();
        'words: for word in WORDS {
            for form in [byte_level(word), byte_level(&format!(" {word}"))] {
                let chars: Vec<char> = form.chars().collect();
                for k in 1..chars.len() {
                    let left: String = chars[..k].iter().collect();
                    let joined: String = chars[..=k].iter().collect();
                    if known.contains(&joined) {
                        continue;
                    }
                    let Some(i) = free.next() else { break 'words };
                    merges.push(format!("{left} {}", chars[k]));
                    known.insert(joined.clone());
                    slots[i] = Some((joined, TokenType::Normal));
                }
            }
        }
        for i in free {
            slots[i] = Some((format!("<|filler_{i}|>"), TokenType::Unused));
        }
        let (tokens, types) = slots.into_iter().flatten().unzip();
        Ok(Self {
            tokens,
            types,
            merges,
            specials,
        })
    }

    /// A Hugging Face `tokenizer.json`: byte-level BPE with the merges,
    /// the specials as added tokens, the fillers in the vocabulary.
    pub fn tokenizer_json(&self) -> Value {
        let special_ids: Vec<u32> = self.specials.iter().map(|(id, _)| *id).collect();
        let vocab: Map<String, Value> = self
            .tokens
            .iter()
            .enumerate()
            .filter(|(id, _)| !special_ids.contains(&(*id as u32)))
            .map(|(id, t)| (t.clone(), json!(id)))
            .collect();
        let added: Vec<Value> = self
            .specials
            .iter()
            .map(|(id, text)| {
                json!({"id": id, "content": text, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                                "trim_offsets": true, "use_regex": true});
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": byte_level,
            "post_processor": null,
            "decoder": byte_level,
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": false,
                "vocab": vocab,
                "merges": self.merges,
            }
        })
    }

    /// The `tokenizer_config.json` naming the special tokens, and whether
    /// BoS is put before a text as the checkpoint's tokenizer does
    /// ([`ModelShape::adds_bos`]).
    pub fn tokenizer_config_json(&self, shape: &ModelShape) -> Value {
        let text = |id: u32| {
            self.specials
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, t)| t.clone())
        };
        let mut config = json!({
            "bos_token": text(shape.tokens.bos),
            "eos_token": text(shape.tokens.eos),
            "add_bos_token": shape.adds_bos(),
            "model_max_length": shape.sizes.max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
        });
        if let (Some(pad), Value::Object(map)) = (shape.tokens.pad, &mut config) {
            map.insert("pad_token".into(), json!(text(pad)));
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes;

    #[test]
    fn bytes_map_to_gpt2_characters() {
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), '\u{120}'); // Ġ
        assert_eq!(byte_char(b'\n'), '\u{10A}'); // Ċ
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
    }

    /// Specials sit at the shape's ids, every id has one token, and every
    /// merge joins two tokens into a third, all in the vocabulary.
    #[test]
    fn the_vocabulary_fills_the_shape() {
        for shape in [
            shapes::llama_3_2_1b(),
            shapes::qwen2_5_1_5b(),
            shapes::smollm3_3b(),
            shapes::olmo_3_7b(),
            shapes::qwen3_30b_a3b(),
            shapes::mixtral_8x7b(),
        ] {
            let v = Vocabulary::for_shape(&shape).unwrap();
            assert_eq!(v.tokens.len(), shape.sizes.vocab_size);
            let ids: std::collections::HashMap<&str, usize> = v
                .tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.as_str(), i))
                .collect();
            assert_eq!(ids.len(), v.tokens.len(), "token strings are unique");
            for (id, _) in &v.specials {
                assert_eq!(v.types[*id as usize], TokenType::Control);
            }
            for m in &v.merges {
                let (l, r) = m.split_once(' ').unwrap();
                assert!(
                    ids.contains_key(l)
                        && ids.contains_key(r)
                        && ids.contains_key(format!("{l}{r}").as_str()),
                    "{m}"
                );
            }
            assert!(ids.contains_key("\u{120}the"));
        }
        let mut tiny = shapes::ModelShape::llama("tiny", shapes::small());
        tiny.sizes.vocab_size = 200;
        assert!(matches!(
            Vocabulary::for_shape(&tiny),
            Err(SynthError::VocabTooSmall { .. })
        ));
    }
}
