//! Variable tracking (RULER's `vt`): a chain of `VAR X = VAR Y`
//! assignments hidden among noise lines, after one worked example, and the
//! question which variables hold the chain's value.

use super::super::rng::Rng;
use super::Parts;
use super::haystack::{NOISE, insert_at_fractions};

const HEAD: &str =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

/// RULER's `vt` setting: one chain of four hops (five variables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VariableTracking {
    /// Assignments after the first (each names the previous variable).
    pub hops: usize,
    /// Noise lines of the worked example (RULER sizes it to 500 tokens).
    pub example_lines: usize,
}

impl VariableTracking {
    /// The sample of `seed` with `n` noise lines.
    pub(crate) fn build(&self, seed: u64, n: usize) -> Parts {
        let mut rng = Rng::new(seed, 1);
        let (vars, value, chain, at) = self.chain(&mut rng, 5);
        let mut ex = Rng::new(seed, 3);
        let (ex_vars, ex_value, ex_chain, ex_at) = self.chain(&mut ex, 3);
        let example = format!(
            "{HEAD}{}\n{}{} {}\n",
            insert_at_fractions(
                vec![NOISE.to_string(); self.example_lines],
                &ex_chain,
                &ex_at
            ),
            self.question(ex_value),
            self.answer_prefix(ex_value),
            ex_vars.join(" ")
        );
        let text = insert_at_fractions(vec![NOISE.to_string(); n], &chain, &at);
        Parts {
            context: format!("{example}\n{HEAD}{text}\n"),
            question: self.question(value),
            answer_prefix: self.answer_prefix(value),
            answers: vars,
        }
    }

    /// Variables of `letters` capitals, the chain's value, its lines in
    /// order and where each goes (sorted fractions of the noise).
    fn chain(&self, rng: &mut Rng, letters: usize) -> (Vec<String>, usize, Vec<String>, Vec<f64>) {
        let mut vars: Vec<String> = Vec::new();
        while vars.len() < self.hops + 1 {
            let v: String = (0..letters)
                .map(|_| char::from(b'A' + rng.below(26) as u8))
                .collect();
            if !vars.contains(&v) {
                vars.push(v);
            }
        }
        let value = rng.range(10000, 99999);
        let mut lines = vec![format!("VAR {} = {value}", vars[0])];
        lines.extend(
            vars.windows(2)
                .map(|w| format!("VAR {} = VAR {}", w[1], w[0])),
        );
        let mut at: Vec<f64> = lines.iter().map(|_| rng.unit()).collect();
        at.sort_by(f64::total_cmp);
        (vars, value, lines, at)
    }

    fn question(&self, value: usize) -> String {
        format!(
            "Question: Find all variables that are assigned the value {value} in the text above."
        )
    }

    fn answer_prefix(&self, value: usize) -> String {
        format!(
            "Answer: According to the chain(s) of variable assignment in the text above, {} \
             variables are assigned the value {value}, they are: ",
            self.hops + 1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_in_order_and_the_answers_are_its_variables() {
        let vt = VariableTracking {
            hops: 4,
            example_lines: 3,
        };
        let p = vt.build(4, 40);
        assert_eq!(p.answers.len(), 5);
        let main = p.context.rsplit(HEAD).next().unwrap();
        let value = p
            .question
            .split("value ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        let first = main
            .find(&format!("VAR {} = {value}", p.answers[0]))
            .unwrap();
        let mut last = first;
        for w in p.answers.windows(2) {
            let at = main.find(&format!("VAR {} = VAR {}", w[1], w[0])).unwrap();
            assert!(at > last, "the chain is out of order");
            last = at;
        }
        assert_eq!(main.matches(NOISE).count(), 40);
        // one worked example, with its own answer, before the task
        assert_eq!(p.context.matches(HEAD).count(), 2);
        assert!(p.context.contains("5 variables are assigned the value"));
        assert!(p.answer_prefix.ends_with("they are: "));
        assert_eq!(vt.build(4, 10).answers, p.answers);
    }
}
