//! The synthetic task family: a span of distinct content words, bracketed
//! and hidden among filler words, must be copied or reversed. The answer can
//! only come from reading the prompt.
//!
//! A prompt is `<s> <|user|> TASK : filler* [ w1 .. wn ] filler* <|eot|>
//! <|assistant|>`; the answer is the span (reversed for `reverse`) followed by
//! `<|eot|>`. The decode start is the position of `<|assistant|>`, the last
//! prompt token. Every instance is a pure function of (seed, stream, index).

use std::fmt;

use rand::seq::index::sample;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::vocab::{self, CONTENT, FILLER, id};

/// One task of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// Repeat the bracketed span.
    Copy,
    /// Repeat the bracketed span backwards.
    Reverse,
}

impl TaskKind {
    /// Every task.
    pub const ALL: [TaskKind; 2] = [TaskKind::Copy, TaskKind::Reverse];

    /// The task word that opens the user message.
    pub fn word_id(&self) -> u32 {
        match self {
            TaskKind::Copy => id::COPY,
            TaskKind::Reverse => id::REVERSE,
        }
    }

    /// What the task asks, in a few words.
    pub fn description(&self) -> &'static str {
        match self {
            TaskKind::Copy => "Repeat the bracketed span",
            TaskKind::Reverse => "Repeat the bracketed span backwards",
        }
    }

    /// The task's name as written in the prompt.
    pub fn name(&self) -> &'static str {
        match self {
            TaskKind::Copy => "copy",
            TaskKind::Reverse => "reverse",
        }
    }
}

impl std::str::FromStr for TaskKind {
    type Err = String;

    /// A task by its name (`copy`, `reverse`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown task {s:?} (expected copy or reverse)"))
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Tokens of a prompt that are not filler or span: `<s> <|user|> TASK : [ ]
/// <|eot|> <|assistant|>`.
pub const PROMPT_OVERHEAD: usize = 8;

/// The distribution instances are drawn from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Tasks, drawn uniformly.
    pub tasks: Vec<TaskKind>,
    /// Shortest prompt, in tokens (generation prompt included).
    pub min_prompt: usize,
    /// Longest prompt, in tokens.
    pub max_prompt: usize,
    /// Shortest span.
    pub min_span: usize,
    /// Longest span (at most the 64 content words).
    pub max_span: usize,
}

impl Default for TaskSpec {
    /// The distribution of the shipped models: copy, prompts of 16..=200
    /// tokens, spans of 2..=8 words.
    fn default() -> Self {
        Self {
            tasks: vec![TaskKind::Copy],
            min_prompt: 16,
            max_prompt: 200,
            min_span: 2,
            max_span: 8,
        }
    }
}

impl TaskSpec {
    /// Check that the ranges are consistent.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |reason: String| Err(TrainError::TaskSpec { reason });
        if self.tasks.is_empty() {
            return bad("no task given (expected one or more of copy, reverse)".into());
        }
        if self.min_span == 0 || self.min_span > self.max_span || self.max_span > CONTENT.len() {
            return bad(format!(
                "span lengths {}..={} must satisfy 1 <= min <= max <= {}",
                self.min_span,
                self.max_span,
                CONTENT.len()
            ));
        }
        let need = PROMPT_OVERHEAD + self.max_span;
        if self.min_prompt < need || self.min_prompt > self.max_prompt {
            return bad(format!(
                "prompt lengths {}..={} must satisfy {need} <= min <= max \
                 ({PROMPT_OVERHEAD} fixed tokens + the longest span of {})",
                self.min_prompt, self.max_prompt, self.max_span
            ));
        }
        Ok(())
    }

    /// The longest answer, `<|eot|>` included.
    pub fn max_answer(&self) -> usize {
        self.max_span + 1
    }

    /// The longest training sequence (prompt + answer).
    pub fn max_sequence(&self) -> usize {
        self.max_prompt + self.max_answer()
    }
}

/// Which family of seeds an instance belongs to, so training batches and
/// held-out sets never share a random stream even with equal seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Training batches.
    Train,
    /// Validation during training.
    Validation,
    /// Held-out evaluation.
    Eval,
}

/// SplitMix64 finaliser: a well-mixed 64-bit function of its input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of instance `index` of `stream` under `seed`.
pub fn instance_seed(seed: u64, stream: Stream, index: u64) -> u64 {
    let tag = match stream {
        Stream::Train => 0x7472_6169_6e00_0000,
        Stream::Validation => 0x7661_6c69_6400_0000,
        Stream::Eval => 0x6576_616c_0000_0000,
    };
    mix(mix(mix(seed) ^ tag) ^ index)
}

/// One task instance, tokenised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The task.
    pub kind: TaskKind,
    /// The prompt ids, `<s>` first and `<|assistant|>` last.
    pub prompt: Vec<u32>,
    /// The answer ids, `<|eot|>` last.
    pub answer: Vec<u32>,
    /// The user message's text (what the chat template wraps).
    pub user_content: String,
}

impl Instance {
    /// Instance `index` of `stream` under `seed`, its prompt length drawn
    /// from the spec's range.
    pub fn generate(spec: &TaskSpec, seed: u64, stream: Stream, index: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(instance_seed(seed, stream, index));
        let len = rng.random_range(spec.min_prompt..=spec.max_prompt);
        Self::with_rng(spec, &mut rng, len)
    }

    /// An instance whose prompt has exactly `prompt_len` tokens (clamped to
    /// what the spec allows), drawn from `rng`.
    pub fn with_rng(spec: &TaskSpec, rng: &mut StdRng, prompt_len: usize) -> Self {
        let kind = spec.tasks[rng.random_range(0..spec.tasks.len())];
        let span_len = rng.random_range(spec.min_span..=spec.max_span);
        let span: Vec<u32> = sample(rng, CONTENT.len(), span_len)
            .into_iter()
            .map(|i| id::CONTENT0 + i as u32)
            .collect();
        let prompt_len = prompt_len.clamp(PROMPT_OVERHEAD + span_len, spec.max_prompt.max(1));
        let fill = prompt_len.saturating_sub(PROMPT_OVERHEAD + span_len);
        let before = rng.random_range(0..=fill);
        let mut filler = |n: usize| -> Vec<u32> {
            (0..n)
                .map(|_| id::FILLER0 + rng.random_range(0..FILLER.len()) as u32)
                .collect()
        };
        let (pre, post) = (filler(before), filler(fill - before));
        let mut content = vec![kind.word_id(), id::COLON];
        content.extend(&pre);
        content.push(id::OPEN);
        content.extend(&span);
        content.push(id::CLOSE);
        content.extend(&post);
        let mut prompt = vec![id::BOS, id::USER];
        prompt.extend(&content);
        prompt.extend([id::EOT, id::ASSISTANT]);
        let mut answer = span;
        if kind == TaskKind::Reverse {
            answer.reverse();
        }
        answer.push(id::EOT);
        Self {
            kind,
            prompt,
            answer,
            user_content: vocab::detokenize(&content),
        }
    }

    /// The decode start s: the position of `<|assistant|>`.
    pub fn decode_start(&self) -> usize {
        self.prompt.len() - 1
    }

    /// The answer as text, without `<|eot|>`.
    pub fn answer_content(&self) -> String {
        vocab::detokenize(&self.answer[..self.answer.len() - 1])
    }

    /// Prompt followed by answer: the teacher-forced training sequence.
    pub fn sequence(&self) -> Vec<u32> {
        let mut s = self.prompt.clone();
        s.extend(&self.answer);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_deterministic_and_well_formed() {
        let spec = TaskSpec {
            tasks: vec![TaskKind::Copy, TaskKind::Reverse],
            ..TaskSpec::default()
        };
        assert!(spec.validate().is_ok());
        for i in 0..200 {
            let a = Instance::generate(&spec, 5, Stream::Eval, i);
            assert_eq!(a, Instance::generate(&spec, 5, Stream::Eval, i));
            assert!(a.prompt.len() >= spec.min_prompt && a.prompt.len() <= spec.max_prompt);
            assert_eq!(a.prompt[0], id::BOS);
            assert_eq!(a.prompt[a.decode_start()], id::ASSISTANT);
            assert_eq!(a.answer.last(), Some(&id::EOT));
            let open = a.prompt.iter().position(|&t| t == id::OPEN);
            let close = a.prompt.iter().position(|&t| t == id::CLOSE);
            let (Some(open), Some(close)) = (open, close) else {
                panic!("no brackets in {:?}", a.prompt);
            };
            let mut span = a.prompt[open + 1..close].to_vec();
            if a.kind == TaskKind::Reverse {
                span.reverse();
            }
            assert_eq!(span, a.answer[..a.answer.len() - 1]);
        }
        assert_ne!(
            Instance::generate(&spec, 5, Stream::Eval, 0),
            Instance::generate(&spec, 5, Stream::Train, 0)
        );
    }

    #[test]
    fn bad_specs_are_named() {
        let spec = TaskSpec {
            min_prompt: 12,
            ..TaskSpec::default()
        };
        let err = spec.validate().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("prompt lengths")));
    }
}
