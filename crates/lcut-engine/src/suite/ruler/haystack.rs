//! The haystacks of the RULER-style tasks, each a pure function of a seed
//! and a size so that a task can be sized by search: RULER's repeated
//! `noise` sentences, an `essay` of lcut's own filler prose (RULER uses
//! Paul Graham's essays, which lcut does not ship), and the random values
//! a needle is made of.

use super::super::filler::PARAGRAPHS;
use super::super::rng::Rng;
use super::words::{ADJECTIVES, NOUNS};

/// RULER's noise haystack: one line, repeated.
pub(crate) const NOISE: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

/// RULER's needle depths: 40 points from 0 to 100 percent, rounded.
pub(crate) fn depths() -> Vec<usize> {
    (0..40)
        .map(|i| (i as f64 * 100.0 / 39.0).round() as usize)
        .collect()
}

/// The first `n` words of the essay for `seed`: the filler paragraphs in a
/// seeded order, reshuffled each time the pool runs out, so that a longer
/// essay starts with the shorter one.
pub(crate) fn essay_words(seed: u64, n: usize) -> Vec<&'static str> {
    let mut rng = Rng::new(seed, 0xe55a);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut order: Vec<usize> = (0..PARAGRAPHS.len()).collect();
        rng.shuffle(&mut order);
        for i in order {
            out.extend(PARAGRAPHS[i].split_whitespace());
        }
    }
    out.truncate(n);
    out
}

/// `text` split into sentences after `.`, `!` or `?` followed by a space
/// (the filler has no abbreviations).
pub(crate) fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut words = text.split(' ').peekable();
    while let Some(w) = words.next() {
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(w);
        if w.ends_with(['.', '!', '?']) || words.peek().is_none() {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// `needles` put between the sentences of `essay` (RULER's essay
/// haystack): needle i after sentence `floor(len * depth_i / 100)`, the
/// depths sorted; everything joined with spaces.
pub(crate) fn insert_at_depths(essay: &[&str], needles: &[String], depths: &[usize]) -> String {
    let sents = sentences(&essay.join(" "));
    let mut at: Vec<usize> = depths.iter().map(|d| sents.len() * d / 100).collect();
    at.sort_unstable();
    let mut parts: Vec<String> = Vec::with_capacity(sents.len() + needles.len() + 1);
    let mut last = 0;
    for (needle, &pos) in needles.iter().zip(&at) {
        parts.push(sents[last..pos].join(" "));
        parts.push(needle.clone());
        last = pos;
    }
    parts.push(sents[last..].join(" "));
    parts.retain(|p| !p.is_empty());
    parts.join(" ")
}

/// `lines` with each of `needles` inserted before line `floor(n * u_i)`
/// (RULER's line haystacks: noise and distractor needles), joined by
/// newlines.
pub(crate) fn insert_at_fractions(lines: Vec<String>, needles: &[String], at: &[f64]) -> String {
    let n = lines.len();
    let mut slots: Vec<(usize, usize)> = at
        .iter()
        .enumerate()
        .map(|(k, u)| (((n as f64) * u) as usize, k))
        .collect();
    slots.sort_unstable();
    let mut out = Vec::with_capacity(n + needles.len());
    let mut next = slots.iter().peekable();
    for (i, line) in lines.into_iter().enumerate() {
        while let Some(&&(pos, k)) = next.peek() {
            if pos > i {
                break;
            }
            out.push(needles[k].clone());
            next.next();
        }
        out.push(line);
    }
    out.extend(next.map(|&(_, k)| needles[k].clone()));
    out.join("\n")
}

/// What a needle's key or value is made of (RULER's `type_needle_k/v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueKind {
    /// A 7-digit number.
    Numbers,
    /// An `adjective-noun` pair.
    Words,
    /// A version-4 UUID.
    Uuids,
}

impl ValueKind {
    /// The plural noun the templates use (`numbers`, `words`, `uuids`).
    pub(crate) fn plural(self) -> &'static str {
        match self {
            ValueKind::Numbers => "numbers",
            ValueKind::Words => "words",
            ValueKind::Uuids => "uuids",
        }
    }

    /// A random value of this kind.
    pub(crate) fn draw(self, rng: &mut Rng) -> String {
        match self {
            ValueKind::Numbers => rng.range(1_000_000, 9_999_999).to_string(),
            ValueKind::Words => format!("{}-{}", rng.pick(ADJECTIVES), rng.pick(NOUNS)),
            ValueKind::Uuids => uuid4(rng),
        }
    }
}

/// A random version-4 UUID, lower-case hex in 8-4-4-4-12 groups.
fn uuid4(rng: &mut Rng) -> String {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&rng.next_u64().to_be_bytes());
    b[8..].copy_from_slice(&rng.next_u64().to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_essay_starts_with_the_shorter_one() {
        let short = essay_words(3, 500);
        let long = essay_words(3, 5000);
        assert_eq!(short.len(), 500);
        assert_eq!(long.len(), 5000);
        assert_eq!(&long[..500], &short[..]);
        assert_ne!(essay_words(4, 500), short);
    }

    #[test]
    fn needles_go_in_at_their_depths() {
        let essay: Vec<&str> = "A b. C d. E f. G h.".split(' ').collect();
        // the depths are sorted and taken by the needles in their order
        let text = insert_at_depths(&essay, &["N1.".into(), "N2.".into()], &[100, 0]);
        assert_eq!(text, "N1. A b. C d. E f. G h. N2.");
        let text = insert_at_depths(&essay, &["N.".into()], &[50]);
        assert_eq!(text, "A b. C d. N. E f. G h.");
        let lines = vec!["a".to_string(), "b".into(), "c".into()];
        let text = insert_at_fractions(lines, &["X".into(), "Y".into()], &[0.99, 0.0]);
        assert_eq!(text, "Y\na\nb\nX\nc");
        assert_eq!(depths().len(), 40);
        assert_eq!((depths()[0], depths()[39]), (0, 100));
    }

    #[test]
    fn values_have_their_kind_s_form() {
        let mut rng = Rng::new(1, 2);
        let n = ValueKind::Numbers.draw(&mut rng);
        assert!(n.len() == 7 && n.chars().all(|c| c.is_ascii_digit()), "{n}");
        let w = ValueKind::Words.draw(&mut rng);
        assert!(w.contains('-'), "{w}");
        let u = ValueKind::Uuids.draw(&mut rng);
        let groups: Vec<usize> = u.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{u}");
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}");
    }
}
