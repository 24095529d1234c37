//! KNorm (Devoto et al., arXiv 2406.11430) as kvpress's `KnormPress`
//! defines it: each K/V head keeps the positions whose keys (as cached,
//! after RoPE, which keeps norms) have the smallest L2 norm.

use super::math::{key, norm};
use crate::visibility::HostKeys;

/// Each K/V head's scores, `-|k|` per prompt position.
pub(super) fn scores(keys: &HostKeys<'_>) -> Vec<Vec<f64>> {
    let n = keys.positions.len();
    (0..keys.kv_heads)
        .map(|g| (0..n).map(|i| -norm(key(keys, g, i))).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_keys_score_higher() {
        let data = [3.0f32, 4.0, 0.0, 1.0, 1.0, 1.0, 6.0, 8.0];
        let positions = [0, 1, 2, 3];
        let keys = HostKeys {
            kv_heads: 2,
            head_dim: 2,
            positions: &positions[..2],
            data: &data,
        };
        let s = scores(&keys);
        assert_eq!(s[0], vec![-5.0, -1.0]);
        assert!((s[1][0] + 2f64.sqrt()).abs() < 1e-12 && s[1][1] == -10.0);
    }
}
