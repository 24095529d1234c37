//! Token phases of one sequence: anchors, prefill tokens and decode-phase tokens.

use serde::{Deserialize, Serialize};

/// The phase of one token, which decides in which layers it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// A prompt token kept at every layer (the BoS token, or a kept prefix).
    Anchor,
    /// A prompt token that exists only in the layers below the cutoff.
    Prefill,
    /// A token at or after the decode start: full depth, KV at every layer.
    Decode,
}

/// Errors in describing the phases of a sequence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhaseError {
    /// The decode start is not inside the prompt.
    #[error(
        "decode start {decode_start} is outside the prompt of {prompt_len} tokens (expected 0..{prompt_len})"
    )]
    DecodeStartOutsidePrompt {
        /// The requested decode start.
        decode_start: usize,
        /// Number of prompt tokens.
        prompt_len: usize,
    },
    /// The anchors reach past the decode start.
    #[error(
        "the {anchors} anchor token(s) reach past the decode start {decode_start}; anchors must be prompt tokens before it"
    )]
    AnchorPastDecodeStart {
        /// Number of anchor tokens (a prefix of the prompt).
        anchors: usize,
        /// The decode start.
        decode_start: usize,
    },
    /// The prompt is empty.
    #[error("the prompt is empty: at least one token is needed")]
    EmptyPrompt,
}

/// Phases of one sequence: anchors are the prefix `0..anchor_len`, decode-phase
/// tokens start at `decode_start`, everything in between is prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenPhases {
    anchor_len: usize,
    decode_start: usize,
}

impl TokenPhases {
    /// Phases for a prompt of `prompt_len` tokens whose decode phase starts at
    /// `decode_start` (the first token of the generation prompt, or the last
    /// prompt token for a raw prompt) with the first `anchor_len` tokens kept.
    pub fn new(
        prompt_len: usize,
        decode_start: usize,
        anchor_len: usize,
    ) -> Result<Self, PhaseError> {
        if prompt_len == 0 {
            return Err(PhaseError::EmptyPrompt);
        }
        if decode_start >= prompt_len {
            return Err(PhaseError::DecodeStartOutsidePrompt {
                decode_start,
                prompt_len,
            });
        }
        if anchor_len > decode_start {
            return Err(PhaseError::AnchorPastDecodeStart {
                anchors: anchor_len,
                decode_start,
            });
        }
        Ok(Self {
            anchor_len,
            decode_start,
        })
    }

    /// Phases of `anchors` anchor tokens followed by `prefill` prefill tokens,
    /// the decode phase starting after them (for cost models over
    /// hypothetical prompts, whose decode-phase tokens are counted apart).
    pub fn from_counts(anchors: usize, prefill: usize) -> Self {
        Self {
            anchor_len: anchors,
            decode_start: anchors + prefill,
        }
    }

    /// Phases of a raw prompt: the last prompt token starts the decode phase.
    pub fn raw_prompt(prompt_len: usize, anchor_len: usize) -> Result<Self, PhaseError> {
        Self::new(prompt_len, prompt_len.saturating_sub(1), anchor_len)
    }

    /// Phases where every token is decode-phase (the full model's view).
    pub fn all_decode() -> Self {
        Self {
            anchor_len: 0,
            decode_start: 0,
        }
    }

    /// Number of anchor tokens (they are the prefix `0..anchor_len`).
    pub fn anchor_len(&self) -> usize {
        self.anchor_len
    }

    /// Position of the first decode-phase token.
    pub fn decode_start(&self) -> usize {
        self.decode_start
    }

    /// Number of non-anchor prompt tokens before the decode start.
    pub fn prefill_len(&self) -> usize {
        self.decode_start - self.anchor_len
    }

    /// The phase of the token at `pos`.
    pub fn phase(&self, pos: usize) -> Phase {
        if pos < self.anchor_len {
            Phase::Anchor
        } else if pos < self.decode_start {
            Phase::Prefill
        } else {
            Phase::Decode
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_split_the_sequence() {
        let p = TokenPhases::new(10, 7, 1).unwrap();
        assert_eq!(p.phase(0), Phase::Anchor);
        assert_eq!(p.phase(1), Phase::Prefill);
        assert_eq!(p.phase(6), Phase::Prefill);
        assert_eq!(p.phase(7), Phase::Decode);
        assert_eq!(p.phase(100), Phase::Decode);
        assert_eq!(p.prefill_len(), 6);
    }

    #[test]
    fn bad_phases_are_named_errors() {
        assert_eq!(TokenPhases::new(0, 0, 0), Err(PhaseError::EmptyPrompt));
        assert!(matches!(
            TokenPhases::new(5, 5, 1),
            Err(PhaseError::DecodeStartOutsidePrompt { .. })
        ));
        assert!(matches!(
            TokenPhases::new(5, 2, 3),
            Err(PhaseError::AnchorPastDecodeStart { .. })
        ));
        let msg = TokenPhases::new(5, 9, 1).unwrap_err().to_string();
        assert!(msg.contains("decode start 9"), "{msg}");
    }

    #[test]
    fn raw_prompt_decodes_from_last_token() {
        let p = TokenPhases::raw_prompt(4, 1).unwrap();
        assert_eq!(p.decode_start(), 3);
    }
}
