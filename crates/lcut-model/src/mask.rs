//! Additive attention masks from positions: causal order, the model's sliding
//! window and the policy's visibility rule.

/// The part of a [queries x keys] additive mask that is not all zeros.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialMask {
    /// The first `visible_prefix` keys are visible to every query.
    pub visible_prefix: usize,
    /// The mask of the remaining keys, [queries x (keys - visible_prefix)],
    /// row-major, 0 or -inf.
    pub rest: Vec<f32>,
}

/// Which keys a query reads: `k <= q`, `q - k < window` and `rule(q, k)`;
/// `query_positions` ascending.
///
/// Returns `None` when every key is visible to every query (a decode step
/// over the cache adds nothing). Otherwise only the columns from the first
/// hidden key on are built on the host, so a prefill chunk deep into a long
/// prompt transfers [chunk x chunk], not [chunk x context].
pub fn additive_mask(
    query_positions: &[usize],
    key_positions: &[usize],
    window: Option<usize>,
    rule: impl Fn(usize, usize) -> bool,
) -> Option<PartialMask> {
    let visible = |q: usize, k: usize| k <= q && window.is_none_or(|w| q - k < w) && rule(q, k);
    // Causal order and the window are monotone in q, and every policy's rule
    // that holds for the first and the last query holds for those between,
    // so a key visible to both ends is visible to all.
    let (first_q, last_q) = (*query_positions.first()?, *query_positions.last()?);
    let first_hidden = key_positions
        .iter()
        .position(|&k| !(visible(first_q, k) && visible(last_q, k)))?;
    Some(mask_from(
        query_positions,
        key_positions,
        first_hidden,
        visible,
    ))
}

/// The whole [queries x keys] mask of a rule that need not be monotone in
/// the query (a reference run whose rows read different keys): no column
/// is assumed visible to every query.
pub fn exact_additive_mask(
    query_positions: &[usize],
    key_positions: &[usize],
    window: Option<usize>,
    rule: impl Fn(usize, usize) -> bool,
) -> PartialMask {
    let visible = |q: usize, k: usize| k <= q && window.is_none_or(|w| q - k < w) && rule(q, k);
    mask_from(query_positions, key_positions, 0, visible)
}

fn mask_from(
    query_positions: &[usize],
    key_positions: &[usize],
    first_hidden: usize,
    visible: impl Fn(usize, usize) -> bool,
) -> PartialMask {
    let keys = &key_positions[first_hidden..];
    let mut rest = Vec::with_capacity(query_positions.len() * keys.len());
    for &q in query_positions {
        rest.extend(keys.iter().map(|&k| {
            if visible(q, k) {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        }));
    }
    PartialMask {
        visible_prefix: first_hidden,
        rest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visible(m: &[f32]) -> Vec<u8> {
        m.iter().map(|&x| u8::from(x == 0.0)).collect()
    }

    #[test]
    fn causal_and_window() {
        let m = additive_mask(&[0, 1, 2, 3], &[0, 1, 2, 3], Some(2), |_, _| true).unwrap();
        assert_eq!(m.visible_prefix, 0);
        assert_eq!(
            visible(&m.rest),
            vec![1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
        );
    }

    #[test]
    fn decode_step_over_visible_keys_needs_no_mask() {
        assert!(additive_mask(&[9], &[0, 3, 9], None, |_, _| true).is_none());
        let m = additive_mask(&[9], &[0, 3, 9], None, |_, k| k != 3).unwrap();
        assert_eq!((m.visible_prefix, visible(&m.rest)), (1, vec![0, 1]));
    }

    #[test]
    fn a_late_prefill_chunk_builds_only_its_own_columns() {
        let keys: Vec<usize> = (0..1000).collect();
        let m = additive_mask(&[997, 998, 999], &keys, None, |_, _| true).unwrap();
        assert_eq!(m.visible_prefix, 998);
        assert_eq!(visible(&m.rest), vec![0, 0, 1, 0, 1, 1]);
    }
}
