//! The host arithmetic the presses share, in f64 over the f32 cache:
//! dot products, softmax, kvpress's pooling, attention of a window of
//! queries over a layer's prompt keys, and the top positions of a score.

use rayon::prelude::*;

use crate::visibility::HostKeys;

/// `a · b` accumulated in f64 (four lanes, so that it vectorises).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..4 {
            acc[i] += f64::from(x[i]) * f64::from(y[i]);
        }
    }
    let tail: f64 = ra
        .iter()
        .zip(rb)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    acc.iter().sum::<f64>() + tail
}

/// The Euclidean norm of `a`.
pub(crate) fn norm(a: &[f32]) -> f64 {
    dot(a, a).sqrt()
}

/// Softmax of `v` in place.
pub(crate) fn softmax(v: &mut [f64]) {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    v.iter_mut().for_each(|x| *x /= sum);
}

/// torch's `avg_pool1d(x, kernel, padding=kernel // 2, stride=1)` for an
/// odd kernel: the mean over `kernel` positions centred on each, the
/// padding counted as zeros.
pub(crate) fn avg_pool(x: &[f64], kernel: usize) -> Vec<f64> {
    let half = kernel / 2;
    (0..x.len())
        .map(|j| {
            let (a, b) = (j.saturating_sub(half), (j + half + 1).min(x.len()));
            x[a..b].iter().sum::<f64>() / kernel as f64
        })
        .collect()
}

/// The key of K/V head `head` at index `i` of `keys`.
pub(crate) fn key<'a>(keys: &HostKeys<'a>, head: usize, i: usize) -> &'a [f32] {
    let n = keys.positions.len();
    let d = keys.head_dim;
    &keys.data[(head * n + i) * d..(head * n + i + 1) * d]
}

/// kvpress's `compute_window_attention`: the last `queries.len()` prompt
/// queries (after RoPE; one row of `heads * head_dim` values each, oldest
/// first) attend causally to every prompt key, scaled by `1 / sqrt(d)`;
/// the result is each query head's attention to the keys before the
/// window, averaged over the window's queries: `[heads][n - w]`.
pub(crate) fn window_attention(
    queries: &[&[f32]],
    keys: &HostKeys<'_>,
    heads: usize,
) -> Vec<Vec<f64>> {
    let (n, w, d) = (keys.positions.len(), queries.len(), keys.head_dim);
    let group = heads / keys.kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    // heads are independent: each runs on its own thread, the same sums
    (0..heads)
        .into_par_iter()
        .map(|h| {
            let g = h / group;
            let mut acc = vec![0f64; n - w];
            let mut logits = Vec::with_capacity(n);
            for (i, row) in queries.iter().enumerate() {
                let q = &row[h * d..(h + 1) * d];
                let last = n - w + i;
                logits.clear();
                logits.extend((0..=last).map(|j| dot(q, key(keys, g, j)) * scale));
                softmax(&mut logits);
                for (a, p) in acc.iter_mut().zip(&logits) {
                    *a += p / w as f64;
                }
            }
            acc
        })
        .collect()
}

/// Mean over each K/V head's group of query heads of `per_query_head`
/// ([heads][n] to [kv_heads][n]).
pub(crate) fn group_mean(per_query_head: &[Vec<f64>], kv_heads: usize) -> Vec<Vec<f64>> {
    let group = per_query_head.len() / kv_heads;
    (0..kv_heads)
        .map(|g| {
            let rows = &per_query_head[g * group..(g + 1) * group];
            (0..rows[0].len())
                .map(|j| rows.iter().map(|r| r[j]).sum::<f64>() / group as f64)
                .collect()
        })
        .collect()
}

/// The `n` highest of `scores` as a mask over its positions; equal scores
/// go to the earlier position (kvpress's `topk` leaves the choice to
/// torch; the presses' checks keep every forced position in, so that only
/// exactly equal scores of different positions could tie).
pub(crate) fn top(scores: &[f64], n: usize) -> Vec<bool> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut kept = vec![false; scores.len()];
    for &i in order.iter().take(n) {
        kept[i] = true;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_counts_the_padding_as_zeros() {
        let x = [1.0, 2.0, 3.0, 4.0];
        let p = avg_pool(&x, 3);
        assert_eq!(p, vec![1.0, 2.0, 3.0, 7.0 / 3.0]);
        assert_eq!(avg_pool(&x, 1), x.to_vec());
    }

    #[test]
    fn top_keeps_the_highest_and_breaks_ties_towards_earlier_positions() {
        assert_eq!(
            top(&[0.1, 0.5, 0.5, 0.2], 2),
            vec![false, true, true, false]
        );
        assert_eq!(top(&[1.0, 1.0, 1.0], 1), vec![true, false, false]);
        assert_eq!(top(&[f64::INFINITY, 0.0, 0.3], 2), vec![true, false, true]);
    }

    #[test]
    fn window_attention_is_causal_and_averages_the_window() {
        // one head, d = 1, keys 0..4: the last query reads all four keys,
        // the one before it the first three
        let data = [0.0f32, 1.0, 2.0, 3.0];
        let positions = [0, 1, 2, 3];
        let keys = HostKeys {
            kv_heads: 1,
            head_dim: 1,
            positions: &positions,
            data: &data,
        };
        let (q0, q1) = ([1.0f32], [1.0f32]);
        let out = window_attention(&[&q0, &q1], &keys, 1);
        let z3: f64 = (0..3).map(|j| (j as f64).exp()).sum();
        let z4: f64 = (0..4).map(|j| (j as f64).exp()).sum();
        for (j, got) in out[0].iter().enumerate() {
            let want = ((j as f64).exp() / z3 + (j as f64).exp() / z4) / 2.0;
            assert!((got - want).abs() < 1e-12, "{j}: {got} vs {want}");
        }
        assert_eq!(out[0].len(), 2);
    }
}
