//! Common words extraction (RULER's `cwe`): a numbered list where ten
//! words come far more often than the rest, after one worked example;
//! the answer is the ten.

use super::super::rng::Rng;
use super::Parts;
use super::words::{ADJECTIVES, NOUNS, VERBS};

const HEAD: &str = "Below is a numbered list of words. In these words, some appear more often \
                    than others. Memorize the ones that appear most often.\n";
const QUESTION: &str = "Question: What are the 10 most common words in the above list?";
const ANSWER_PREFIX: &str = "Answer: The top 10 words that appear most often in the list are:";
/// Common words asked for.
const COMMON: usize = 10;

/// RULER's `cwe` setting, which depends on the length: below 4K tokens
/// the common words come 6 times and the rest once (the example: 20 words,
/// 3 and 1 times), from 4K on 30 and 3 times (the example: 40 words, 10
/// and 3 times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommonWords {
    /// Repeats of each common word, and of each other word.
    pub repeats: (usize, usize),
    /// The worked example's distinct words and repeats.
    pub example: (usize, usize, usize),
}

impl CommonWords {
    /// RULER's setting for a target of `target` tokens.
    pub(crate) fn for_target(target: usize) -> Self {
        if target < 4096 {
            Self {
                repeats: (6, 1),
                example: (20, 3, 1),
            }
        } else {
            Self {
                repeats: (30, 3),
                example: (40, 10, 3),
            }
        }
    }

    /// The smallest list: the common words and one other.
    pub(crate) fn min_units(&self) -> usize {
        COMMON + 1
    }

    /// The sample of `seed` with `n` distinct words in its list.
    pub(crate) fn build(&self, seed: u64, n: usize) -> Parts {
        let (ex_n, ex_common, ex_rest) = self.example;
        let vocab = vocabulary(seed, n + ex_n);
        let (words, example_words) = vocab.split_at(vocab.len() - ex_n);
        let mut rng = Rng::new(seed, 4);
        let example = numbered(&list(example_words, (ex_common, ex_rest), &mut rng));
        let example_answer = numbered(&example_words[..COMMON]);
        let text = numbered(&list(&words[..n], self.repeats, &mut rng));
        Parts {
            context: format!(
                "{HEAD}{example}\n{QUESTION} {ANSWER_PREFIX} {example_answer}\n{HEAD}{text}\n"
            ),
            question: QUESTION.into(),
            answer_prefix: ANSWER_PREFIX.into(),
            answers: words[..COMMON].to_vec(),
        }
    }
}

/// The first `COMMON` of `words` `repeats.0` times each and the others
/// `repeats.1` times, shuffled.
fn list(words: &[String], repeats: (usize, usize), rng: &mut Rng) -> Vec<String> {
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let times = if i < COMMON { repeats.0 } else { repeats.1 };
        out.extend(std::iter::repeat_n(w.clone(), times));
    }
    rng.shuffle(&mut out);
    out
}

/// `1. a 2. b ...`.
fn numbered(words: &[String]) -> String {
    words
        .iter()
        .enumerate()
        .map(|(i, w)| format!("{}. {w}", i + 1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `n` distinct words in the sample's order: lcut's adjectives, nouns and
/// verbs shuffled, then (past them) `adjective-noun` pairs shuffled; the
/// order does not depend on `n`.
fn vocabulary(seed: u64, n: usize) -> Vec<String> {
    let mut rng = Rng::new(seed, 5);
    let mut words: Vec<&str> = ADJECTIVES
        .iter()
        .chain(NOUNS)
        .chain(VERBS)
        .copied()
        .collect();
    words.sort_unstable();
    words.dedup();
    rng.shuffle(&mut words);
    let mut out: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    if n > out.len() {
        let mut pairs: Vec<String> = ADJECTIVES
            .iter()
            .flat_map(|a| NOUNS.iter().map(move |b| format!("{a}-{b}")))
            .collect();
        rng.shuffle(&mut pairs);
        out.extend(pairs);
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_words_come_most_often() {
        let cwe = CommonWords::for_target(4096);
        let p = cwe.build(2, 60);
        assert_eq!(p.answers.len(), 10);
        let list = p.context.rsplit(HEAD).next().unwrap().trim_end();
        for a in &p.answers {
            let n = list.split(' ').filter(|w| w == a).count();
            assert_eq!(n, 30, "{a}");
        }
        assert_eq!(
            list.split(' ').filter(|w| !w.ends_with('.')).count(),
            10 * 30 + 50 * 3
        );
        // the worked example's answer is in the context, the task's is not
        assert_eq!(p.context.matches(ANSWER_PREFIX).count(), 1);
        assert_eq!(CommonWords::for_target(2048).repeats, (6, 1));
        assert_eq!(cwe.build(2, 20).answers, p.answers);
        // past the single words, pairs keep the words distinct
        let big = vocabulary(1, 1000);
        let mut uniq = big.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 1000);
    }
}
