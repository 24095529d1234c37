//! Frequent words extraction (RULER's `fwe`): coded six-letter words drawn
//! from a Zipf distribution (alpha 2) with the most frequent one made
//! `...` (noise); the answer is the next three.

use super::super::rng::Rng;
use super::Parts;

const QUESTION: &str = "Question: Do not provide any explanation. Please ignore the dots '....'. \
                        What are the three most frequently appeared words in the above coded text?";
const ANSWER_PREFIX: &str =
    "Answer: According to the coded text above, the three most frequently appeared words are:";

/// zeta(2) = pi^2 / 6.
const ZETA_2: f64 = std::f64::consts::PI * std::f64::consts::PI / 6.0;

/// RULER's `fwe` setting: a vocabulary of (target - new tokens) / 50 coded
/// words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrequentWords {
    /// Coded words in the vocabulary ('...' included).
    pub vocab: usize,
}

impl FrequentWords {
    /// RULER's vocabulary for a target of `target` tokens and `budget` new
    /// ones (at least 5 words: the noise and four ranked words).
    pub(crate) fn for_target(target: usize, budget: usize) -> Self {
        Self {
            vocab: (target.saturating_sub(budget) / 50).max(5),
        }
    }

    /// The smallest text: the fourth word comes at least once.
    pub(crate) fn min_units(&self) -> usize {
        (16.0 * ZETA_2).ceil() as usize
    }

    /// The sample of `seed` whose counts are drawn for `n` words (RULER's
    /// `num_words`: word k comes `floor(n k^-2 / zeta(2))` times).
    pub(crate) fn build(&self, seed: u64, n: usize) -> Parts {
        let mut rng = Rng::new(seed, 1);
        let mut vocab: Vec<String> = Vec::with_capacity(self.vocab);
        while vocab.len() < self.vocab {
            let w: String = (0..6)
                .map(|_| char::from(b'a' + rng.below(26) as u8))
                .collect();
            if !vocab.contains(&w) {
                vocab.push(w);
            }
        }
        vocab[0] = "...".into();
        let mut words: Vec<&str> = Vec::new();
        for (k, w) in vocab.iter().enumerate() {
            let count = (n as f64 * ((k + 1) as f64).powi(-2) / ZETA_2) as usize;
            words.extend(std::iter::repeat_n(w.as_str(), count));
        }
        Rng::new(seed, 2).shuffle(&mut words);
        Parts {
            context: format!(
                "Read the following coded text and track the frequency of each coded word. Find \
                 the three most frequently appeared coded words. {}\n",
                words.join(" ")
            ),
            question: QUESTION.into(),
            answer_prefix: ANSWER_PREFIX.into(),
            answers: vocab[1..4].to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_are_the_three_most_frequent_words_after_the_dots() {
        let fwe = FrequentWords::for_target(4096, 50);
        assert_eq!(fwe.vocab, 80);
        let p = fwe.build(3, 2000);
        let text = p.context.split("coded words. ").nth(1).unwrap();
        let count = |w: &str| text.split_whitespace().filter(|x| *x == w).count();
        let dots = count("...");
        let counts: Vec<usize> = p.answers.iter().map(|a| count(a)).collect();
        assert_eq!(dots, (2000.0 / ZETA_2) as usize);
        assert!(dots > counts[0] && counts[0] > counts[1] && counts[1] > counts[2]);
        // every other word comes less often than the third answer
        let others = text
            .split_whitespace()
            .filter(|w| *w != "..." && !p.answers.iter().any(|a| a == w));
        assert!(others.map(count).all(|c| c < counts[2]));
        assert_eq!(fwe.build(3, fwe.min_units()).answers, p.answers);
    }
}
