//! How a generation is scored against an item's answer: `exact`, `contains`
//! or `choice`, all on normalised text (lower case, whitespace runs made one
//! space, trailing punctuation dropped), or RULER's `string_match_all` and
//! `string_match_part` on the reference strings (a score in [0, 1]).

use serde::{Deserialize, Serialize};

/// A scoring rule, as written in a suite line's `scoring` field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scoring {
    /// The whole generation equals the answer.
    Exact,
    /// The answer appears in the generation as whole words.
    #[default]
    Contains,
    /// Of the item's choices, the one the generation names first is the answer.
    Choice,
    /// RULER's `string_match_all`: the share of the reference strings that
    /// occur in the generation (case-insensitive substrings).
    #[serde(rename = "string_match_all")]
    StringMatchAll,
    /// RULER's `string_match_part` (its QA tasks): 1 when any reference
    /// string occurs in the generation, else 0.
    #[serde(rename = "string_match_part")]
    StringMatchPart,
}

impl Scoring {
    /// The rule named `name` (`exact`, `contains`, `choice`), if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "exact" => Some(Self::Exact),
            "contains" => Some(Self::Contains),
            "choice" => Some(Self::Choice),
            "string_match_all" => Some(Self::StringMatchAll),
            "string_match_part" => Some(Self::StringMatchPart),
            _ => None,
        }
    }

    /// The rule's name as written in a suite.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Contains => "contains",
            Self::Choice => "choice",
            Self::StringMatchAll => "string_match_all",
            Self::StringMatchPart => "string_match_part",
        }
    }

    /// Whether the rule gives partial credit (a score in [0, 1] rather than
    /// right or wrong): `string_match_all`.
    pub fn is_graded(self) -> bool {
        self == Self::StringMatchAll
    }

    /// Whether the rule is one of RULER's string matches, which read the
    /// item's reference strings.
    pub fn is_string_match(self) -> bool {
        matches!(self, Self::StringMatchAll | Self::StringMatchPart)
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
/// options of a `choice` item (ignored by the other rules). A string-match
/// rule reads `answer` as its one reference string (see [`string_match`]
/// for several) and is right at a score of 1.
pub fn is_correct(rule: Scoring, answer: &str, choices: &[String], generation: &str) -> bool {
    let got = normalize(generation);
    let want = normalize(answer);
    match rule {
        Scoring::Exact => got == want,
        Scoring::Contains => !word_matches(&got, &want).is_empty(),
        Scoring::Choice => first_choice(&got, choices).is_some_and(|c| normalize(c) == want),
        Scoring::StringMatchAll | Scoring::StringMatchPart => {
            string_match(rule, &[answer.to_string()], generation) >= 1.0
        }
    }
}

/// RULER's score of a prediction against its reference strings, as kvpress
/// computes it: control characters (`\x00`-`\x1f`, newlines included) are
/// removed from the stripped prediction, then each reference is looked for
/// as a case-insensitive substring. `string_match_all`: the share of the
/// references found; `string_match_part`: 1 when any is found. Any other
/// rule scores 0 here (they are right or wrong, see [`is_correct`]).
pub fn string_match(rule: Scoring, references: &[String], prediction: &str) -> f64 {
    let pred: String = prediction
        .trim()
        .chars()
        .filter(|c| !('\u{0}'..='\u{1f}').contains(c))
        .collect::<String>()
        .trim()
        .to_lowercase();
    let found = references
        .iter()
        .filter(|r| pred.contains(&r.to_lowercase()))
        .count();
    match rule {
        Scoring::StringMatchAll if !references.is_empty() => found as f64 / references.len() as f64,
        Scoring::StringMatchPart => f64::from(u8::from(found > 0)),
        _ => 0.0,
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
    fn string_match_all_counts_the_share_of_references_found() {
        let refs = s(&["4721903", "8812345", "ALPHA-beta"]);
        let all = Scoring::StringMatchAll;
        // right: every reference, in any case, anywhere in the text
        let right = "The numbers are 8812345,\n4721903 and alpha-BETA.";
        assert_eq!(string_match(all, &refs, right), 1.0);
        // partly right: one of three
        let part = string_match(all, &refs, "It is 4721903.");
        assert!((part - 1.0 / 3.0).abs() < 1e-12, "{part}");
        // wrong
        assert_eq!(string_match(all, &refs, "I do not know."), 0.0);
        // control characters are removed, not made spaces (kvpress): a
        // reference broken by a newline is found again
        assert_eq!(string_match(all, &s(&["ab"]), "a\nb"), 1.0);
        // substrings count (RULER does not look for whole words)
        assert_eq!(string_match(all, &s(&["472"]), "4721903"), 1.0);
    }

    #[test]
    fn string_match_part_needs_any_one_reference() {
        let refs = s(&["Tobias Dunmore", "Dunmore"]);
        let part = Scoring::StringMatchPart;
        assert_eq!(string_match(part, &refs, "It was dunmore."), 1.0);
        assert_eq!(string_match(part, &refs, "Tobias"), 0.0);
        assert!(is_correct(part, "Penmor", &[], "penmorwick"));
        assert!(!is_correct(
            Scoring::StringMatchAll,
            "Penmor",
            &[],
            "Pen mor"
        ));
    }

    #[test]
    fn rule_names_round_trip() {
        for r in [
            Scoring::Exact,
            Scoring::Contains,
            Scoring::Choice,
            Scoring::StringMatchAll,
            Scoring::StringMatchPart,
        ] {
            assert_eq!(Scoring::parse(r.name()), Some(r));
        }
        assert_eq!(Scoring::parse("regex"), None);
    }
}
