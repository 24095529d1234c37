//! How a generation is scored against an item's answer: `exact`, `contains`
//! or `choice`, all on normalised text (lower case, whitespace runs made one
//! space, trailing punctuation dropped).

use serde::{Deserialize, Serialize};

/// A scoring rule, as written in a suite line's `scoring` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scoring {
    /// The whole generation equals the answer.
    Exact,
    /// The answer appears in the generation as whole words.
    Contains,
    /// Of the item's choices, the one the generation names first is the answer.
    Choice,
}

impl Scoring {
    /// The rule named `name` (`exact`, `contains`, `choice`), if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "exact" => Some(Self::Exact),
            "contains" => Some(Self::Contains),
            "choice" => Some(Self::Choice),
            _ => None,
        }
    }

    /// The rule's name as written in a suite.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Contains => "contains",
            Self::Choice => "choice",
        }
    }
}

/// Lower case, whitespace runs as one space, no leading or trailing
/// whitespace, no trailing punctuation (`.,;:!?` and closing quotes or
/// brackets).
pub fn normalize(text: &str) -> String {
    let lower = text.to_lowercase();
    let mut out = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    let trailing = |c: char| ".,;:!?\"')]}»”’".contains(c) || c.is_whitespace();
    while out.ends_with(trailing) {
        out.pop();
    }
    out
}

/// Byte offsets where `needle` occurs in `hay` as whole words: the
/// characters on either side (when any) are not letters or digits.
fn word_matches(hay: &str, needle: &str) -> Vec<usize> {
    if needle.is_empty() {
        return Vec::new();
    }
    let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
    hay.match_indices(needle)
        .map(|(at, _)| at)
        .filter(|&at| {
            boundary(hay[..at].chars().next_back())
                && boundary(hay[at + needle.len()..].chars().next())
        })
        .collect()
}

/// Whether `generation` answers `answer` under `rule`; `choices` are the
/// options of a `choice` item (ignored by the other rules).
pub fn is_correct(rule: Scoring, answer: &str, choices: &[String], generation: &str) -> bool {
    let got = normalize(generation);
    let want = normalize(answer);
    match rule {
        Scoring::Exact => got == want,
        Scoring::Contains => !word_matches(&got, &want).is_empty(),
        Scoring::Choice => first_choice(&got, choices).is_some_and(|c| normalize(c) == want),
    }
}

/// The choice named first in the normalised `generation` (the longest one
/// when two start at the same place).
fn first_choice<'a>(generation: &str, choices: &'a [String]) -> Option<&'a String> {
    choices
        .iter()
        .filter_map(|c| {
            let n = normalize(c);
            word_matches(generation, &n)
                .first()
                .map(|&at| (at, std::cmp::Reverse(n.len()), c))
        })
        .min_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
        .map(|(_, _, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn normalisation_drops_case_space_and_trailing_punctuation() {
        assert_eq!(normalize("  The Code\n is  6464.\" "), "the code is 6464");
        assert_eq!(normalize("Yes!?"), "yes");
        assert_eq!(normalize("a.b"), "a.b");
        assert_eq!(normalize("..."), "");
    }

    #[test]
    fn exact_needs_the_whole_generation() {
        assert!(is_correct(Scoring::Exact, "Paris", &[], " paris. "));
        assert!(!is_correct(Scoring::Exact, "Paris", &[], "It is Paris."));
    }

    #[test]
    fn contains_matches_whole_words_only() {
        assert!(is_correct(
            Scoring::Contains,
            "6464",
            &[],
            "The code is 6464."
        ));
        assert!(!is_correct(
            Scoring::Contains,
            "6464",
            &[],
            "The code is 64645."
        ));
        assert!(!is_correct(Scoring::Contains, "46", &[], "It is 2046"));
        assert!(is_correct(
            Scoring::Contains,
            "The quiet baker  walked home.",
            &[],
            "Sure: \"the quiet baker walked home.\""
        ));
        assert!(!is_correct(Scoring::Contains, "red", &[], "It is reddish"));
    }

    #[test]
    fn choice_takes_the_first_option_named() {
        let c = s(&["dog", "table"]);
        assert!(is_correct(Scoring::Choice, "dog", &c, "Dog."));
        assert!(is_correct(
            Scoring::Choice,
            "dog",
            &c,
            "A dog, not a table."
        ));
        assert!(!is_correct(
            Scoring::Choice,
            "dog",
            &c,
            "The table; a dog is not"
        ));
        assert!(!is_correct(Scoring::Choice, "dog", &c, "A"));
        let n = s(&["47", "472"]);
        assert!(is_correct(Scoring::Choice, "472", &n, "472 is larger"));
    }

    #[test]
    fn rule_names_round_trip() {
        for r in [Scoring::Exact, Scoring::Contains, Scoring::Choice] {
            assert_eq!(Scoring::parse(r.name()), Some(r));
        }
        assert_eq!(Scoring::parse("regex"), None);
    }
}
