//! TOVA (Oren et al., arXiv 2401.06104) as kvpress's `TOVAPress` defines
//! it: the last prompt query's attention to the earlier positions
//! (kvpress's window attention of one query), averaged over every query
//! head, ranks the positions of the whole layer: every K/V head keeps the
//! same ones, the last position among them.

use super::math::window_attention;
use crate::visibility::HostKeys;

/// The layer's scores over the `n` prompt positions from the last prompt
/// query (after RoPE); the last position scores infinity.
pub(super) fn scores(keys: &HostKeys<'_>, heads: usize, last: &[f32]) -> Vec<f64> {
    let per_head = window_attention(&[last], keys, heads);
    let n = keys.positions.len();
    let mut s: Vec<f64> = (0..n - 1)
        .map(|j| per_head.iter().map(|h| h[j]).sum::<f64>() / heads as f64)
        .collect();
    s.push(f64::INFINITY);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_averaged_and_the_last_position_is_kept() {
        // two K/V heads of d = 1, one query head each; keys 0..3
        let data = [2.0f32, 0.0, 0.0, 0.0, 0.0, 2.0];
        let positions = [0, 1, 2];
        let keys = HostKeys {
            kv_heads: 2,
            head_dim: 1,
            positions: &positions,
            data: &data,
        };
        let s = scores(&keys, 2, &[1.0, 1.0]);
        assert_eq!(s.len(), 3);
        assert!(s[2].is_infinite());
        // head 0 reads position 0 most, head 1 position 2: their mean
        // favours position 0 over position 1
        assert!(s[0] > s[1]);
    }
}
