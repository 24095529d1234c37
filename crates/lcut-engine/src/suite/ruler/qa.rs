//! Question answering over documents (RULER's `qa_1` and `qa_2`). RULER
//! draws its documents and questions from SQuAD (`qa_1`) and HotpotQA
//! (`qa_2`), which lcut neither ships nor downloads: here the documents are
//! lcut's own, made-up towns and their founders, so the answers can only
//! come from the documents. `qa_1` asks one fact of one document among
//! distractors (as SQuAD's questions do); `qa_2` needs two documents, the
//! town's (who founded it) and the founder's (where they were born), as
//! HotpotQA's multi-hop questions do. RULER's template and scoring
//! (`string_match_part`) are kept.

use super::super::rng::Rng;
use super::Parts;
use super::words::{FIRST_NAMES, LAST_NAMES, PLACE_HEADS, PLACE_TAILS, PRODUCTS, TRADES};

const INSTRUCTION: &str = "Answer the question based on the given documents. Only give me the \
                           answer and do not output any other words.";

const RIVERS: &[&str] = &[
    "Alder", "Brenna", "Calde", "Dove", "Esk", "Frome", "Glaze", "Hale", "Isca", "Kennet", "Lune",
    "Meon", "Nadder", "Orrin", "Parret", "Rother", "Sence", "Tove", "Ure", "Wey",
];
const LANDMARKS: &[&str] = &[
    "stone bridge",
    "clock tower",
    "market cross",
    "water mill",
    "chapel",
    "grain barn",
    "guild hall",
    "lighthouse",
];
const VILLAGE_TAILS: &[&str] = &["by", "ton", "stead", "field", "hope", "well"];

/// One of `words`, drawn.
fn word(rng: &mut Rng, words: &[&'static str]) -> &'static str {
    words[rng.below(words.len())]
}

/// One made-up town, a pure function of the sample and its number.
struct Town {
    name: String,
    river: &'static str,
    founder: String,
    trade: &'static str,
    product: &'static str,
    landmark: &'static str,
    birthplace: String,
}

/// The towns of one sample: names and founders each drawn once, in a
/// seeded order (repeating after the last name).
struct Towns {
    seed: u64,
    names: Vec<usize>,
    people: Vec<usize>,
}

impl Towns {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed, 5);
        let names = rng.distinct(PLACE_HEADS.len() * PLACE_TAILS.len(), usize::MAX);
        let people = rng.distinct(FIRST_NAMES.len() * LAST_NAMES.len(), usize::MAX);
        Self {
            seed,
            names,
            people,
        }
    }

    fn town(&self, id: usize) -> Town {
        let id = id % self.names.len();
        let mut rng = Rng::new(self.seed, 100 + id as u64);
        let name = self.names[id];
        let person = self.people[id % self.people.len()];
        Town {
            name: format!(
                "{}{}",
                PLACE_HEADS[name / PLACE_TAILS.len()],
                PLACE_TAILS[name % PLACE_TAILS.len()]
            ),
            founder: format!(
                "{} {}",
                FIRST_NAMES[person / LAST_NAMES.len()],
                LAST_NAMES[person % LAST_NAMES.len()]
            ),
            river: word(&mut rng, RIVERS),
            trade: word(&mut rng, TRADES),
            product: word(&mut rng, PRODUCTS),
            landmark: word(&mut rng, LANDMARKS),
            birthplace: format!("{}{}", rng.pick(PLACE_HEADS), rng.pick(VILLAGE_TAILS)),
        }
    }
}

impl Town {
    fn document(&self) -> String {
        format!(
            "{} is a market town on the river {}. It was founded by {}, a {}, and is best known \
             for its {}. The old {} stands in the middle of the town, and a fair is held beside \
             it every spring.",
            self.name, self.river, self.founder, self.trade, self.product, self.landmark
        )
    }

    fn founder_document(&self) -> String {
        let first = self.founder.split(' ').next().unwrap_or_default();
        format!(
            "{} was a {} born in the village of {}. As a young {}, {first} travelled widely \
             before settling by the river {}, where {first} spent the rest of a long life.",
            self.founder, self.trade, self.birthplace, self.trade, self.river
        )
    }
}

/// RULER's `qa` setting: `hops` documents hold the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Qa {
    /// 1 (`qa_1`) or 2 (`qa_2`).
    pub hops: usize,
}

impl Qa {
    /// The smallest set: the documents that hold the answer.
    pub(crate) fn min_units(&self) -> usize {
        self.hops
    }

    /// The sample of `seed` with `n` documents.
    pub(crate) fn build(&self, seed: u64, n: usize) -> Parts {
        let towns = Towns::new(seed);
        let mut rng = Rng::new(seed, 1);
        let gold = towns.town(0);
        let (question, answer, gold_docs) = if self.hops == 1 {
            let (q, a) = match rng.below(3) {
                0 => (format!("Who founded {}?", gold.name), gold.founder.clone()),
                1 => (
                    format!("What is {} best known for?", gold.name),
                    gold.product.to_string(),
                ),
                _ => (
                    format!("On which river does {} lie?", gold.name),
                    gold.river.to_string(),
                ),
            };
            (q, a, vec![gold.document()])
        } else {
            (
                format!("In which village was the founder of {} born?", gold.name),
                gold.birthplace.clone(),
                vec![gold.document(), gold.founder_document()],
            )
        };
        let at: Vec<f64> = gold_docs.iter().map(|_| rng.unit()).collect();
        // distractors: other towns, and (for two hops) their founders
        let mut docs: Vec<String> = (1..)
            .map(|i| {
                let town = towns.town(if self.hops == 1 { i } else { i.div_ceil(2) });
                if self.hops == 2 && i % 2 == 0 {
                    town.founder_document()
                } else {
                    town.document()
                }
            })
            .take(n.saturating_sub(gold_docs.len()))
            .collect();
        for (doc, u) in gold_docs.into_iter().zip(at) {
            let pos = ((docs.len() + 1) as f64 * u) as usize;
            docs.insert(pos.min(docs.len()), doc);
        }
        let docs: Vec<String> = docs
            .iter()
            .enumerate()
            .map(|(i, d)| format!("Document {}:\n{d}", i + 1))
            .collect();
        Parts {
            context: format!(
                "{INSTRUCTION}\n\nThe following are given documents.\n\n{}\n\n",
                docs.join("\n\n")
            ),
            question: format!("{INSTRUCTION}\n\nQuestion: {question}"),
            answer_prefix: "Answer:".into(),
            answers: vec![answer],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hop_the_answer_is_in_the_gold_document() {
        let p = Qa { hops: 1 }.build(6, 12);
        assert_eq!(p.context.matches("Document ").count(), 12);
        assert!(p.context.contains(&p.answers[0]), "{}", p.answers[0]);
        let town = Towns::new(6).town(0).name;
        assert!(p.question.contains(&town), "{}", p.question);
        assert_eq!(
            p.context
                .matches(&format!("{town} is a market town"))
                .count(),
            1
        );
    }

    #[test]
    fn two_hops_need_the_town_and_its_founder() {
        let p = Qa { hops: 2 }.build(8, 10);
        assert_eq!(p.context.matches("Document ").count(), 10);
        let town = p
            .question
            .split("founder of ")
            .nth(1)
            .unwrap()
            .trim_end_matches(" born?");
        let founded = p
            .context
            .split(&format!("{town} is a market town"))
            .nth(1)
            .unwrap();
        let founder = founded
            .split("founded by ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap();
        assert!(p.context.contains(&format!("{founder} was a")));
        assert!(
            p.context
                .contains(&format!("born in the village of {}.", p.answers[0]))
        );
        // distractor founders are there too: the town's name is needed
        assert!(p.context.matches(" born in the village of ").count() >= 4);
        assert_eq!(Qa { hops: 2 }.build(8, 3).answers, p.answers);
    }
}
