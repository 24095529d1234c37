//! Repetition loops: a generation that ends in a repeated suffix, a short
//! span of tokens repeated back to back up to its last token (the paper's
//! repetition analysis: BoS anchoring suppresses such loops under SPEED).

/// The longest period counted as a loop, in tokens.
pub const LOOP_MAX_PERIOD: usize = 8;

/// The fewest back-to-back copies of the period that make a loop.
pub const LOOP_MIN_REPEATS: usize = 3;

/// How a sequence of tokens ends when it ends in a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedSuffix {
    /// Tokens in one copy of the repeated span (the shortest such span).
    pub period: usize,
    /// Back-to-back copies of it at the end of the sequence (whole copies).
    pub repeats: usize,
}

/// Whole copies of the last `period` tokens of `tokens` that end it back to
/// back (1 when the span before differs).
fn copies_at_end<T: PartialEq>(tokens: &[T], period: usize) -> usize {
    let n = tokens.len();
    let last = &tokens[n - period..];
    let mut copies = 1;
    while (copies + 1) * period <= n {
        let start = n - (copies + 1) * period;
        if tokens[start..start + period] != *last {
            break;
        }
        copies += 1;
    }
    copies
}

/// The loop `tokens` ends in: the shortest period `p` in
/// `1..=max_period` whose last `p` tokens are repeated at least
/// `min_repeats` times back to back at the end, with the number of copies;
/// `None` when no period does (or `min_repeats` is 0).
///
/// The shortest period is reported: `a a a a a a` is a period-1 loop of six
/// copies, not a period-2 loop of three.
pub fn repeated_suffix<T: PartialEq>(
    tokens: &[T],
    max_period: usize,
    min_repeats: usize,
) -> Option<RepeatedSuffix> {
    if min_repeats == 0 {
        return None;
    }
    (1..=max_period)
        .take_while(|&p| p * min_repeats <= tokens.len())
        .map(|period| RepeatedSuffix {
            period,
            repeats: copies_at_end(tokens, period),
        })
        .find(|s| s.repeats >= min_repeats)
}

/// The loop `tokens` ends in under the paper's rule (a period of 1 to
/// [`LOOP_MAX_PERIOD`] tokens repeated at least [`LOOP_MIN_REPEATS`] times).
pub fn ends_in_loop<T: PartialEq>(tokens: &[T]) -> Option<RepeatedSuffix> {
    repeated_suffix(tokens, LOOP_MAX_PERIOD, LOOP_MIN_REPEATS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<&str> {
        text.split_whitespace().collect()
    }

    #[test]
    fn the_shortest_period_and_its_copies() {
        let s = ends_in_loop(&ids("x a a a a a a")).unwrap();
        assert_eq!((s.period, s.repeats), (1, 6));
        let s = ends_in_loop(&ids("the cat sat on the mat on the mat on the mat")).unwrap();
        assert_eq!((s.period, s.repeats), (3, 3));
        let s = ends_in_loop(&ids("q a b c d e f g h a b c d e f g h a b c d e f g h")).unwrap();
        assert_eq!((s.period, s.repeats), (8, 3));
    }

    #[test]
    fn two_copies_or_a_long_period_is_no_loop() {
        assert_eq!(ends_in_loop(&ids("a b c a b c")), None);
        // period 9, three copies: longer than the rule's 8
        let nine = "a b c d e f g h i ".repeat(3);
        assert_eq!(ends_in_loop(&ids(&nine)), None);
        assert!(repeated_suffix(&ids(&nine), 9, 3).is_some());
        // repeats earlier in the text do not count: the loop must end it
        assert_eq!(ends_in_loop(&ids("a a a a b")), None);
        assert_eq!(ends_in_loop(&ids("the answer is 42 .")), None);
    }

    #[test]
    fn short_and_empty_sequences() {
        assert_eq!(ends_in_loop::<u32>(&[]), None);
        assert_eq!(ends_in_loop(&[7u32, 7]), None);
        assert_eq!(
            ends_in_loop(&[7u32, 7, 7]),
            Some(RepeatedSuffix {
                period: 1,
                repeats: 3
            })
        );
        assert_eq!(repeated_suffix(&[7u32, 7, 7], 8, 0), None);
    }

    #[test]
    fn a_partial_copy_before_the_loop_is_not_counted() {
        // "b c" then three whole copies of "a b c": three, not three and a bit
        let s = ends_in_loop(&ids("b c a b c a b c a b c")).unwrap();
        assert_eq!((s.period, s.repeats), (3, 3));
    }
}
