//! SnapKV (Li et al., arXiv 2404.14469) as kvpress's `SnapKVPress`
//! defines it: the last `window` prompt queries (64) attend causally to the
//! prompt's keys (scaled by `1 / sqrt(d)`); each query head's attention to
//! the positions before the window is averaged over the window, pooled
//! over `kernel` positions (5; torch's `avg_pool1d`, zero padding
//! counted), and averaged over the query heads of each K/V head. Each K/V
//! head keeps the window and its highest-scoring earlier positions.

use super::PressParams;
use super::math::{avg_pool, group_mean, window_attention};
use crate::visibility::HostKeys;

/// Each K/V head's scores over the `n` prompt positions, from the window's
/// queries (after RoPE, oldest first); the window's own positions score
/// infinity (kvpress pads them with its maximum plus one).
pub(super) fn scores(
    p: &PressParams,
    keys: &HostKeys<'_>,
    heads: usize,
    window: &[&[f32]],
) -> Vec<Vec<f64>> {
    let pooled: Vec<Vec<f64>> = window_attention(window, keys, heads)
        .iter()
        .map(|s| avg_pool(s, p.kernel))
        .collect();
    group_mean(&pooled, keys.kv_heads)
        .into_iter()
        .map(|mut s| {
            s.resize(keys.positions.len(), f64::INFINITY);
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::PressName;
    use super::*;

    #[test]
    fn the_window_scores_highest_and_pooled_attention_ranks_the_rest() {
        // one K/V head of d = 1 read by two query heads; keys 0..6, a
        // window of the last two queries
        let p = PressParams {
            window: 2,
            kernel: 1,
            ..PressParams::new(PressName::SnapKv, 0.5)
        };
        let data = [0.0f32, 3.0, 0.0, 0.0, 1.0, 1.0];
        let positions = [0, 1, 2, 3, 4, 5];
        let keys = HostKeys {
            kv_heads: 1,
            head_dim: 1,
            positions: &positions,
            data: &data,
        };
        let q = [1.0f32, 1.0];
        let s = scores(&p, &keys, 2, &[&q, &q]);
        assert_eq!(s.len(), 1);
        assert!(s[0][4].is_infinite() && s[0][5].is_infinite());
        // position 1 has the largest key: the window reads it most
        assert!(s[0][1] > s[0][0] && s[0][0] == s[0][2] && s[0][2] == s[0][3]);
    }
}
