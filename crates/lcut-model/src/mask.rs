//! Additive attention masks from positions: causal order, the model's sliding
//! window and the policy's visibility rule.

/// Which keys a query reads: `k <= q`, `q - k < window` and `rule(q, k)`.
///
/// Returns the additive mask [queries x keys] (0 or -inf), or `None` when
/// every key is visible to every query, so that the common decode step adds
/// nothing.
pub fn additive_mask(
    query_positions: &[usize],
    key_positions: &[usize],
    window: Option<usize>,
    rule: impl Fn(usize, usize) -> bool,
) -> Option<Vec<f32>> {
    let mut mask = Vec::with_capacity(query_positions.len() * key_positions.len());
    let mut any_hidden = false;
    for &q in query_positions {
        for &k in key_positions {
            let visible = k <= q && window.is_none_or(|w| q - k < w) && rule(q, k);
            any_hidden |= !visible;
            mask.push(if visible { 0.0 } else { f32::NEG_INFINITY });
        }
    }
    any_hidden.then_some(mask)
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
        assert_eq!(
            visible(&m),
            vec![1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
        );
    }

    #[test]
    fn decode_step_over_visible_keys_needs_no_mask() {
        assert!(additive_mask(&[9], &[0, 3, 9], None, |_, _| true).is_none());
        assert!(additive_mask(&[9], &[0, 3, 9], None, |_, k| k != 3).is_some());
    }
}
