//! Needle in a haystack (RULER's `niah_*`): special magic values hidden in
//! noise, essay or distractor-needle haystacks, one or several keys,
//! values and queries.

use super::super::rng::Rng;
use super::Parts;
use super::haystack::{
    NOISE, ValueKind, depths, essay_words, insert_at_depths, insert_at_fractions,
};

/// What the haystack is made of (RULER's `type_haystack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Haystack {
    /// RULER's noise line, repeated; the size counts lines.
    Noise,
    /// Filler prose; the size counts words.
    Essay,
    /// Needles of other keys (distractors); the size counts them.
    Needle,
}

/// One `niah_*` task's setting (RULER's `synthetic.yaml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Niah {
    /// The haystack.
    pub haystack: Haystack,
    /// What keys are.
    pub key: ValueKind,
    /// What values are.
    pub value: ValueKind,
    /// Keys hidden (at least `queries`).
    pub keys: usize,
    /// Values per key.
    pub values: usize,
    /// Keys asked for.
    pub queries: usize,
}

impl Niah {
    /// The smallest haystack.
    pub(crate) fn min_units(&self) -> usize {
        match self.haystack {
            Haystack::Essay => 20,
            _ => 1,
        }
    }

    /// The sample of `seed` with a haystack of `n` units.
    pub(crate) fn build(&self, seed: u64, n: usize) -> Parts {
        let mut rng = Rng::new(seed, 1);
        let num_keys = self.keys.max(self.queries);
        let mut keys = Vec::with_capacity(num_keys);
        let mut values: Vec<Vec<String>> = Vec::with_capacity(num_keys);
        let mut needles = Vec::new();
        let needle = |key: &str, value: &str| {
            format!(
                "One of the special magic {} for {key} is: {value}.",
                self.value.plural()
            )
        };
        for _ in 0..num_keys {
            let key = loop {
                let k = self.key.draw(&mut rng);
                if !keys.contains(&k) {
                    break k;
                }
            };
            let vals: Vec<String> = (0..self.values)
                .map(|_| self.value.draw(&mut rng))
                .collect();
            needles.extend(vals.iter().map(|v| needle(&key, v)));
            keys.push(key);
            values.push(vals);
        }
        rng.shuffle(&mut needles);
        let all_depths = depths();
        let needle_depths: Vec<usize> = rng
            .distinct(all_depths.len(), needles.len())
            .into_iter()
            .map(|i| all_depths[i])
            .collect();
        let fractions: Vec<f64> = needles.iter().map(|_| rng.unit()).collect();
        let asked = rng.distinct(num_keys, self.queries);
        let haystack = match self.haystack {
            Haystack::Essay => insert_at_depths(&essay_words(seed, n), &needles, &needle_depths),
            Haystack::Noise => {
                insert_at_fractions(vec![NOISE.to_string(); n], &needles, &fractions)
            }
            Haystack::Needle => {
                let mut other = Rng::new(seed, 2);
                let lines = (0..n)
                    .map(|_| {
                        loop {
                            let k = self.key.draw(&mut other);
                            let v = self.value.draw(&mut other);
                            if !keys.contains(&k) {
                                break needle(&k, &v);
                            }
                        }
                    })
                    .collect();
                insert_at_fractions(lines, &needles, &fractions)
            }
        };
        let queries: Vec<&str> = asked.iter().map(|&i| keys[i].as_str()).collect();
        let answers: Vec<String> = asked.iter().flat_map(|&i| values[i].clone()).collect();
        let query = match queries.as_slice() {
            [one] => one.to_string(),
            [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
            [] => String::new(),
        };
        // RULER's wording turns singular when one value is asked for
        let single = self.queries * self.values == 1;
        let plural = self.value.plural();
        let kind = if single {
            plural.trim_end_matches('s')
        } else {
            plural
        };
        let (some, are, are_all) = if single {
            ("A", "is", "is")
        } else {
            ("Some", "are", "are all")
        };
        Parts {
            context: format!(
                "{some} special magic {kind} {are} hidden within the following text. Make sure \
                 to memorize it. I will quiz you about the {kind} afterwards.\n{haystack}\n"
            ),
            question: format!(
                "What {are_all} the special magic {kind} for {query} mentioned in the provided text?"
            ),
            answer_prefix: format!(
                "The special magic {kind} for {query} mentioned in the provided text {are}"
            ),
            answers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SINGLE: Niah = Niah {
        haystack: Haystack::Noise,
        key: ValueKind::Words,
        value: ValueKind::Numbers,
        keys: 1,
        values: 1,
        queries: 1,
    };

    #[test]
    fn the_needle_is_in_the_haystack_and_the_question_asks_for_it() {
        let p = SINGLE.build(7, 30);
        assert_eq!(p.answers.len(), 1);
        assert_eq!(p.context.matches(p.answers[0].as_str()).count(), 1);
        assert!(p.context.starts_with("A special magic number is hidden"));
        assert_eq!(p.context.matches(NOISE).count(), 30);
        let key = p
            .question
            .split(" for ")
            .nth(1)
            .unwrap()
            .split(" mentioned")
            .next()
            .unwrap();
        assert!(
            p.context.contains(&format!(
                "One of the special magic numbers for {key} is: {}.",
                p.answers[0]
            )),
            "{}",
            p.context
        );
        assert!(
            p.question
                .starts_with("What is the special magic number for ")
        );
        assert!(
            p.answer_prefix
                .ends_with("mentioned in the provided text is")
        );
    }

    #[test]
    fn several_values_keys_and_queries() {
        let multivalue = Niah {
            haystack: Haystack::Essay,
            values: 4,
            ..SINGLE
        };
        let p = multivalue.build(1, 400);
        assert_eq!(p.answers.len(), 4);
        assert!(
            p.question
                .starts_with("What are all the special magic numbers for ")
        );
        for a in &p.answers {
            assert!(p.context.contains(a.as_str()), "{a}");
        }
        let multiquery = Niah {
            haystack: Haystack::Essay,
            queries: 4,
            ..SINGLE
        };
        let p = multiquery.build(2, 400);
        assert_eq!(p.answers.len(), 4);
        assert_eq!(p.question.matches(", ").count(), 3, "{}", p.question);
        assert!(p.question.contains(", and "));
        let distractors = Niah {
            haystack: Haystack::Needle,
            key: ValueKind::Uuids,
            value: ValueKind::Uuids,
            ..SINGLE
        };
        let p = distractors.build(3, 50);
        assert_eq!(
            p.context
                .matches("One of the special magic uuids for")
                .count(),
            51
        );
        assert_eq!(p.context.matches(p.answers[0].as_str()).count(), 1);
    }

    #[test]
    fn the_draws_do_not_depend_on_the_size() {
        for cfg in [
            SINGLE,
            Niah {
                haystack: Haystack::Essay,
                keys: 4,
                ..SINGLE
            },
        ] {
            let (a, b) = (cfg.build(5, 100), cfg.build(5, 300));
            assert_eq!(a.answers, b.answers);
            assert_eq!(a.question, b.question);
            assert!(b.context.len() > a.context.len());
        }
    }
}
