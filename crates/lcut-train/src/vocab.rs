//! The word-level vocabulary of the synthetic tasks, the `tokenizer.json`
//! that encodes it and the `tokenizer_config.json` whose chat template
//! renders exactly the training format.

use serde_json::{Value, json};

/// Padding (never attended to in a loss row; only fills batches).
pub const PAD: &str = "<pad>";
/// Unknown word.
pub const UNK: &str = "<unk>";
/// Beginning of sequence: the first token of every prompt.
pub const BOS: &str = "<s>";
/// End of turn: closes every message, and ends every answer (the EoS token).
pub const EOT: &str = "<|eot|>";
/// Opens a user turn.
pub const USER: &str = "<|user|>";
/// Opens an assistant turn; the generation prompt, so the decode start.
pub const ASSISTANT: &str = "<|assistant|>";
/// Opens a system turn (rendered by the template; never used in training).
pub const SYSTEM: &str = "<|system|>";

/// Special tokens in id order: ids 0..7.
pub const SPECIALS: [&str; 7] = [PAD, UNK, BOS, EOT, USER, ASSISTANT, SYSTEM];

/// Task names, punctuation and the separators of the prompt, after the specials.
pub const MARKERS: [&str; 5] = ["copy", "reverse", ":", "[", "]"];

/// The 64 content words a span is drawn from.
pub const CONTENT: [&str; 64] = [
    "apple", "bear", "cake", "door", "eagle", "fox", "grape", "horse", "iron", "jelly", "king",
    "lemon", "mouse", "night", "ocean", "piano", "queen", "robot", "snake", "tiger", "umbrella",
    "violin", "whale", "yacht", "zebra", "anchor", "bread", "candle", "dragon", "engine", "forest",
    "garden", "hammer", "island", "jacket", "kettle", "ladder", "mirror", "needle", "orange",
    "pencil", "rabbit", "saddle", "table", "tunnel", "valley", "window", "yellow", "basket",
    "castle", "dolphin", "feather", "guitar", "helmet", "insect", "jungle", "lantern", "marble",
    "noodle", "oyster", "parrot", "rocket", "silver", "tomato",
];

/// The 16 filler words that surround a span (never part of an answer).
pub const FILLER: [&str; 16] = [
    "the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "as", "with",
    "at", "by",
];

/// Token ids of the vocabulary, by role.
pub mod id {
    use super::CONTENT;

    /// `<pad>`.
    pub const PAD: u32 = 0;
    /// `<unk>`.
    pub const UNK: u32 = 1;
    /// `<s>`.
    pub const BOS: u32 = 2;
    /// `<|eot|>`.
    pub const EOT: u32 = 3;
    /// `<|user|>`.
    pub const USER: u32 = 4;
    /// `<|assistant|>`.
    pub const ASSISTANT: u32 = 5;
    /// `<|system|>`.
    pub const SYSTEM: u32 = 6;
    /// `copy`.
    pub const COPY: u32 = 7;
    /// `reverse`.
    pub const REVERSE: u32 = 8;
    /// `:`.
    pub const COLON: u32 = 9;
    /// `[`.
    pub const OPEN: u32 = 10;
    /// `]`.
    pub const CLOSE: u32 = 11;
    /// First content word; content word `i` is `CONTENT0 + i`.
    pub const CONTENT0: u32 = 12;
    /// First filler word; filler word `i` is `FILLER0 + i`.
    pub const FILLER0: u32 = CONTENT0 + CONTENT.len() as u32;
}

/// Number of tokens in the vocabulary (the model's `vocab_size`).
pub const VOCAB_SIZE: usize = SPECIALS.len() + MARKERS.len() + CONTENT.len() + FILLER.len();

/// Every token string in id order.
pub fn tokens() -> Vec<&'static str> {
    SPECIALS
        .iter()
        .chain(MARKERS.iter())
        .chain(CONTENT.iter())
        .chain(FILLER.iter())
        .copied()
        .collect()
}

/// The string of token `id` (`<unk>` when out of range).
pub fn token_str(id: u32) -> &'static str {
    tokens().get(id as usize).copied().unwrap_or(UNK)
}

/// Join the strings of `ids` with single spaces.
pub fn detokenize(ids: &[u32]) -> String {
    ids.iter()
        .map(|&id| token_str(id))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The Jinja chat template (Hugging Face style: `messages`,
/// `add_generation_prompt` and `bos_token` in the context). A conversation
/// renders as `<s><|user|> {content} <|eot|>` per turn, and the generation
/// prompt is the single token `<|assistant|>`.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|eot|>' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";

/// The text the chat template renders for one user message with the
/// generation prompt (the Rust mirror of [`CHAT_TEMPLATE`]).
pub fn render_prompt(user_content: &str) -> String {
    format!("{BOS}{USER} {user_content} {EOT}{ASSISTANT}")
}

/// `tokenizer.json` for the `tokenizers` crate: a WordLevel model over
/// whitespace-split words, the specials as added tokens.
pub fn tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> = tokens()
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), json!(i)))
        .collect();
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({
                "id": i,
                "content": t,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": true
            })
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": { "type": "WhitespaceSplit" },
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "WordLevel",
            "vocab": vocab,
            "unk_token": UNK
        }
    })
}

/// `tokenizer_config.json`: BoS/EoS/pad/unk tokens and the chat template.
pub fn tokenizer_config_json() -> Value {
    let decoder: serde_json::Map<String, Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                i.to_string(),
                json!({
                    "content": t,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": true
                }),
            )
        })
        .collect();
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 512,
        "added_tokens_decoder": decoder,
        "chat_template": CHAT_TEMPLATE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_token_list() {
        let t = tokens();
        assert_eq!(t.len(), VOCAB_SIZE);
        let mut sorted = t.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), VOCAB_SIZE, "token strings are distinct");
        assert_eq!(t[id::BOS as usize], BOS);
        assert_eq!(t[id::EOT as usize], EOT);
        assert_eq!(t[id::ASSISTANT as usize], ASSISTANT);
        assert_eq!(t[id::COPY as usize], "copy");
        assert_eq!(t[id::CLOSE as usize], "]");
        assert_eq!(t[id::CONTENT0 as usize], CONTENT[0]);
        assert_eq!(t[id::FILLER0 as usize], FILLER[0]);
        assert_eq!(token_str(VOCAB_SIZE as u32), UNK);
    }
}
