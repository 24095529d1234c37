//! The project's suite for SmolLM2-135M-Instruct, written from a seed:
//! retrieval of a code hidden in filler at four lengths and three depths,
//! copying a sentence, lookup among a few pairs, two-way choices and
//! one-digit sums. Every kind draws from its own seeded stream. The same
//! items render in chat form (a question, for a chat template) or in
//! completion form (the question followed by an answer stem the model
//! continues, for a base model without a chat template).

use super::filler::filler;
use super::rng::Rng;
use super::{Scoring, SuiteItem};

/// Where the suite lives, relative to the repository root.
pub const SMOLLM2_SUITE: &str = "fixtures/suites/smollm2.jsonl";

/// The seed `fixtures/suites/smollm2.jsonl` is written from.
pub const SMOLLM2_SUITE_SEED: u64 = 13;

/// Retrieval lengths: label and filler words (about 1.3 tokens a word).
const LENGTHS: [(&str, usize); 4] = [("256", 150), ("512", 330), ("1k", 800), ("2k", 1650)];
/// Retrieval items per length and depth.
const PER_CELL: usize = 4;
/// Items of each short kind.
const PER_SHORT_KIND: usize = 40;

/// Where the suite in completion form lives, relative to the repository
/// root (the same items, for base models such as Gemma 3 270M).
pub const COMPLETION_SUITE: &str = "fixtures/suites/completion.jsonl";

/// How a suite's prompts are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    /// A question or instruction, for a model's chat template.
    #[default]
    Chat,
    /// The question followed by an answer stem (`Answer: The access code
    /// for the map room is`), for a model without a chat template: its
    /// continuation of the stem is the answer.
    Completion,
}

impl Form {
    /// The prompt of this form: `question` as it is in chat form, followed
    /// by `stem` (after `sep`) in completion form.
    fn render(self, question: String, sep: &str, stem: &str) -> String {
        match self {
            Self::Chat => question,
            Self::Completion => format!("{question}{sep}{stem}"),
        }
    }
}

/// The whole suite for `seed` in chat form, in a fixed order of kinds.
pub fn generate(seed: u64) -> Vec<SuiteItem> {
    generate_in(seed, Form::Chat)
}

/// The whole suite for `seed` in `form`: the same items (ids, answers,
/// facts) in either form.
pub fn generate_in(seed: u64, form: Form) -> Vec<SuiteItem> {
    let mut items = retrieval(&mut Rng::new(seed, 1), form);
    items.extend(copy(&mut Rng::new(seed, 2), form));
    items.extend(lookup(&mut Rng::new(seed, 3), form));
    items.extend(choice(&mut Rng::new(seed, 4), form));
    items.extend(arithmetic(&mut Rng::new(seed, 5), form));
    for it in &mut items {
        // completion form is run without a chat template even on a chat model
        it.completion = form == Form::Completion;
    }
    items
}

/// The suite as JSON Lines (one item a line, fields in a fixed order).
pub fn to_jsonl(items: &[SuiteItem]) -> String {
    let mut out = String::new();
    for item in items {
        // a struct of strings always serialises
        out.push_str(&serde_json::to_string(item).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// A short item (no variant, no system message).
fn item(id: String, kind: &str, prompt: String, answer: String, scoring: Scoring) -> SuiteItem {
    SuiteItem {
        id,
        kind: kind.into(),
        length: "short".into(),
        prompt,
        answer,
        scoring,
        ..SuiteItem::default()
    }
}

const PLACES: &[&str] = &[
    "storeroom door",
    "garden shed",
    "east gate",
    "boat house",
    "library archive",
    "server room",
    "bicycle locker",
    "tool cabinet",
    "wine cellar",
    "back office",
    "loading dock",
    "music room",
    "roof hatch",
    "staff kitchen",
    "map room",
    "print shop",
];

/// A 4-digit code sentence at the start, middle or end of filler prose.
fn retrieval(rng: &mut Rng, form: Form) -> Vec<SuiteItem> {
    let mut out = Vec::new();
    for (label, words) in LENGTHS {
        for depth in ["start", "middle", "end"] {
            for k in 0..PER_CELL {
                let place = *rng.pick(PLACES);
                let code = rng.range(1000, 9999).to_string();
                let mut paras = filler(rng, words);
                let fact = format!("The access code for the {place} is {code}.");
                let at = match depth {
                    "start" => 0,
                    "middle" => paras.len() / 2,
                    _ => paras.len(),
                };
                paras.insert(at, fact);
                let question = format!(
                    "Read the following text carefully, then answer the question at the end.\n\n\
                     {}\n\nQuestion: What is the access code for the {place}?",
                    paras.join("\n\n")
                );
                let stem = format!("Answer: The access code for the {place} is");
                let prompt = form.render(question, "\n", &stem);
                let mut it = item(
                    format!("retrieval-{label}-{depth}-{k:02}"),
                    "retrieval",
                    prompt,
                    code,
                    Scoring::Contains,
                );
                it.length = label.into();
                it.variant = Some(depth.into());
                out.push(it);
            }
        }
    }
    out
}

const PEOPLE: &[&str] = &[
    "farmer", "baker", "teacher", "sailor", "painter", "doctor", "driver", "singer", "gardener",
    "writer",
];
const ADJS: &[&str] = &[
    "quiet", "old", "young", "tall", "happy", "tired", "clever", "kind",
];
const VERBS: &[&str] = &[
    "walked past",
    "painted",
    "cleaned",
    "visited",
    "carried a box to",
    "looked at",
    "waited near",
    "opened",
];
const THINGS: &[&str] = &[
    "red barn",
    "small bridge",
    "blue door",
    "old mill",
    "green boat",
    "stone wall",
    "village shop",
    "wooden gate",
];
const TIMES: &[&str] = &[
    "every morning",
    "last winter",
    "after lunch",
    "on sunday",
    "before dawn",
    "in the rain",
];

/// Repeat a plain 8-12-word sentence.
fn copy(rng: &mut Rng, form: Form) -> Vec<SuiteItem> {
    (0..PER_SHORT_KIND)
        .map(|k| {
            let span = format!(
                "The {} {} {} the {} {}",
                rng.pick(ADJS),
                rng.pick(PEOPLE),
                rng.pick(VERBS),
                rng.pick(THINGS),
                rng.pick(TIMES)
            );
            let question = format!("Repeat this sentence exactly, word for word:\n\n{span}");
            let prompt = form.render(question, "\n\n", "Repeated sentence:");
            item(
                format!("copy-{k:02}"),
                "copy",
                prompt,
                span,
                Scoring::Contains,
            )
        })
        .collect()
}

const NAMES: &[&str] = &[
    "Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack", "Lena",
    "Marco",
];

/// The number paired with one name among three or four name-number
/// lines, the question pointing at the line (SmolLM2 mixes up the lines
/// of a bare list).
fn lookup(rng: &mut Rng, form: Form) -> Vec<SuiteItem> {
    (0..PER_SHORT_KIND)
        .map(|k| {
            let pairs = if k % 2 == 0 { 3 } else { 4 };
            let names = rng.distinct(NAMES.len(), pairs);
            let numbers = rng.distinct(90, pairs);
            let lines: Vec<String> = names
                .iter()
                .zip(&numbers)
                .map(|(&n, &v)| format!("{}: {}", NAMES[n], v + 10))
                .collect();
            let ask = NAMES[names[rng.below(pairs)]];
            let answer = names
                .iter()
                .zip(&numbers)
                .find(|(n, _)| NAMES[**n] == ask)
                .map_or(0, |(_, v)| v + 10);
            let question = format!(
                "Here are some people and their locker numbers.\n\n{}\n\n\
                 What is the locker number of {ask}? Look at the line that starts with {ask}.",
                lines.join("\n"),
            );
            let stem = format!("Answer: The locker number of {ask} is");
            let prompt = form.render(question, "\n", &stem);
            let mut it = item(
                format!("lookup-{k:02}"),
                "lookup",
                prompt,
                answer.to_string(),
                Scoring::Contains,
            );
            it.variant = Some(format!("{pairs} pairs"));
            it
        })
        .collect()
}

/// Category, members, and things that are not members.
const CATEGORIES: &[(&str, &[&str], &[&str])] = &[
    (
        "a fruit",
        &["apple", "banana", "orange", "pear", "grape"],
        &["hammer", "chair", "shoe", "brick", "spoon"],
    ),
    (
        "an animal",
        &["dog", "horse", "cat", "rabbit", "lion"],
        &["table", "window", "cup", "pencil", "lamp"],
    ),
    (
        "a colour",
        &["red", "blue", "green", "yellow", "purple"],
        &["bread", "river", "sock", "piano", "cloud"],
    ),
    (
        "a vehicle",
        &["car", "bus", "bicycle", "truck", "train"],
        &["carrot", "pillow", "book", "tree", "glove"],
    ),
    (
        "a drink",
        &["water", "milk", "tea", "coffee", "juice"],
        &["stone", "ladder", "shirt", "nail", "desk"],
    ),
    (
        "a musical instrument",
        &["guitar", "violin", "drum", "flute", "trumpet"],
        &["potato", "blanket", "fork", "mirror", "sand"],
    ),
];

/// A two-way choice: which of two words belongs to a category.
fn choice(rng: &mut Rng, form: Form) -> Vec<SuiteItem> {
    (0..PER_SHORT_KIND)
        .map(|k| {
            let (cat, yes, no) = *rng.pick(CATEGORIES);
            let right = rng.pick(yes).to_string();
            let wrong = rng.pick(no).to_string();
            let choices = if k % 2 == 0 {
                vec![right.clone(), wrong]
            } else {
                vec![wrong, right.clone()]
            };
            let question = format!(
                "Question: which word names {cat}, \"{}\" or \"{}\"?",
                choices[0], choices[1]
            );
            let stem = format!("Answer: The word that names {cat} is");
            let prompt = form.render(question, "\n", &stem);
            let mut it = item(
                format!("choice-{k:02}"),
                "choice",
                prompt,
                right,
                Scoring::Choice,
            );
            it.choices = choices;
            it
        })
        .collect()
}

/// The sum of two one-digit numbers (SmolLM2 cannot compare two numbers:
/// the comparison kind this replaced was at chance at full depth).
fn arithmetic(rng: &mut Rng, form: Form) -> Vec<SuiteItem> {
    (0..PER_SHORT_KIND)
        .map(|k| {
            let (a, b) = (rng.range(2, 9), rng.range(2, 9));
            let question = format!("What is {a} + {b}? Reply with just the number.");
            let prompt = form.render(question, "\n", &format!("Answer: {a} + {b} ="));
            item(
                format!("arithmetic-{k:02}"),
                "arithmetic",
                prompt,
                (a + b).to_string(),
                Scoring::Contains,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_suite_and_every_kind_present() {
        let a = generate(5);
        assert_eq!(to_jsonl(&a), to_jsonl(&generate(5)));
        assert_ne!(to_jsonl(&a), to_jsonl(&generate(6)));
        assert_eq!(a.len(), 48 + 4 * PER_SHORT_KIND);
        for kind in ["retrieval", "copy", "lookup", "choice", "arithmetic"] {
            assert!(a.iter().any(|i| i.kind == kind), "{kind}");
        }
        let mut ids: Vec<&str> = a.iter().map(|i| i.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), a.len());
    }

    #[test]
    fn answers_are_in_the_prompt_or_its_choices() {
        for it in generate(9) {
            match it.scoring {
                Scoring::Choice => assert!(it.choices.contains(&it.answer), "{}", it.id),
                _ if it.kind == "arithmetic" => assert!(it.answer.parse::<usize>().is_ok()),
                _ => assert!(it.prompt.contains(&it.answer), "{}", it.id),
            }
            // the answer is the only fact of its kind in a retrieval prompt
            if it.kind == "retrieval" {
                assert_eq!(it.prompt.matches(&it.answer).count(), 1, "{}", it.id);
            }
        }
    }

    #[test]
    fn completion_form_is_the_same_items_ending_in_a_stem() {
        let chat = generate(13);
        let completion = generate_in(13, Form::Completion);
        assert_eq!(chat.len(), completion.len());
        for (c, k) in chat.iter().zip(&completion) {
            assert_eq!(
                (&c.id, &c.answer, &c.choices),
                (&k.id, &k.answer, &k.choices)
            );
            let stem = k
                .prompt
                .strip_prefix(c.prompt.as_str())
                .expect("the question first");
            let last = stem.lines().last().unwrap_or_default();
            assert!(
                last.starts_with("Answer:") || last == "Repeated sentence:",
                "{}: {stem:?}",
                k.id
            );
            // the continuation carries its own leading space
            assert!(!k.prompt.ends_with(char::is_whitespace), "{}", k.id);
        }
    }

    #[test]
    fn written_suite_reads_back() {
        let items = generate(3);
        let back = super::super::parse_suite(&to_jsonl(&items), std::path::Path::new("x")).unwrap();
        assert_eq!(back, items);
    }
}
